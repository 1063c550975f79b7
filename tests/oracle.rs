//! The store against the independent reader and writer of docs/format.md (tests/common/oracle.rs):
//! files the document describes are read back byte for byte, each way the document calls a
//! file corrupt is a miss (and the file is removed and counted), and the oracle itself rejects
//! each of them (so it can fail).

mod common;

use common::*;
use tierkv::{Layout, Lookup, Store, StoreConfig, VerifyMode};

/// The fan-outs of the document and their hex characters per level.
const WIDTHS: [(u32, usize); 3] = [(16, 1), (256, 2), (4096, 3)];

fn config(depth: u8, fanout: u32) -> StoreConfig {
    StoreConfig::new()
        .with_layout(Layout::new(depth, fanout).unwrap())
        .with_verify(VerifyMode::Always)
        .with_fd_cache(0)
        .with_stats_interval(None)
}

/// Writes a worker directory the way docs/format.md describes it: `LAYOUT`, then each block
/// file at its path. Returns the paths.
fn plant(
    wdir: &std::path::Path,
    depth: u8,
    fanout: u32,
    width: usize,
    blocks: &[(String, Vec<u8>)],
) -> Vec<std::path::PathBuf> {
    std::fs::create_dir_all(wdir).unwrap();
    std::fs::write(
        wdir.join("LAYOUT"),
        format!("depth={depth}\nfanout={fanout}\n"),
    )
    .unwrap();
    blocks
        .iter()
        .map(|(hex, bytes)| {
            let p = oracle::block_path(wdir, hex, depth as usize, width);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect()
}

#[test]
fn the_store_reads_blocks_the_document_describes() {
    for (fanout, width) in WIDTHS {
        for depth in [0u8, 1, 2, 4] {
            let dir = tempfile::tempdir().unwrap();
            let wdir = dir.path().join("v1/w");
            let datas: Vec<Vec<u8>> = (0..8)
                .map(|i| payload(i, 3, 100 + i as usize * 1000))
                .collect();
            let files: Vec<(String, Vec<u8>)> = (0..8u64)
                .map(|i| {
                    let hex = hash(i).to_hex();
                    let bytes = oracle::encode_block(&hex, &datas[i as usize]);
                    (hex, bytes)
                })
                .collect();
            let paths = plant(&wdir, depth, fanout, width, &files);
            // No layout configured: the store adopts the planted LAYOUT.
            let cfg = StoreConfig::new()
                .with_verify(VerifyMode::Always)
                .with_stats_interval(None);
            let store = Store::open(dir.path(), worker("w"), cfg).unwrap();
            assert_eq!(store.layout(), Layout::new(depth, fanout).unwrap());
            assert_eq!(store.stats().blocks_at_open, 8, "{depth}x{fanout}");
            for i in 0..8u64 {
                let data = &datas[i as usize];
                let mut b = vec![0u8; data.len()];
                assert_eq!(
                    store.get(&store.key(hash(i)), &mut b).unwrap(),
                    Lookup::Hit(data.len()),
                    "depth {depth} fan-out {fanout}: {}",
                    paths[i as usize].display()
                );
                assert_eq!(&b, data);
            }
            // And what the store writes, the oracle reads: in place, byte for byte.
            for i in 8..16u64 {
                store
                    .put(&store.key(hash(i)), &payload(i, 1, 5000))
                    .unwrap();
            }
            assert_eq!(check_all_blocks(dir.path()), 16, "{depth}x{fanout}");
            for i in 8..16u64 {
                let hex = hash(i).to_hex();
                let p = oracle::block_path(&wdir, &hex, depth as usize, width);
                let bytes = std::fs::read(&p).unwrap();
                // Version 2, with this machine's boot id.
                assert_eq!(
                    bytes,
                    oracle::encode_block_v2(&hex, &payload(i, 1, 5000), oracle::this_boot()),
                    "{}",
                    p.display()
                );
            }
        }
    }
}

/// Sets the header check of `b` for its (changed) fields.
fn reseal(b: &mut [u8]) {
    let c = *blake3::hash(&b[0..120]).as_bytes();
    b[120..128].copy_from_slice(&c[..8]);
}

/// Every way docs/format.md calls a block file corrupt, each with a valid header check (so
/// only the field itself can reject it).
fn corruptions(hex: &str, data: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let good = oracle::encode_block(hex, data);
    let edit = |f: &dyn Fn(&mut Vec<u8>), seal: bool| {
        let mut b = good.clone();
        f(&mut b);
        if seal {
            reseal(&mut b);
        }
        b
    };
    let other = oracle::encode_block(&hash(999).to_hex(), data);
    let mut all = header_corruptions(&edit);
    all.extend(version_2_corruptions(&edit));
    all.extend(field_and_payload_corruptions(&edit, &other));
    all
}

/// A copy of the good block changed by the function, resealed or not.
type Edit<'a> = &'a dyn Fn(&dyn Fn(&mut Vec<u8>), bool) -> Vec<u8>;

/// The header's fixed fields of a version 1 file: magic, version, lengths, flags.
fn header_corruptions(edit: Edit<'_>) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("magic", edit(&|b| b[3] = b'x', true)),
        ("version", edit(&|b| b[8] = 3, true)),
        ("version 0", edit(&|b| b[8] = 0, true)),
        ("header length", edit(&|b| b[10] = 64, true)),
        ("header length high byte", edit(&|b| b[11] = 1, true)),
        ("flags without the checksum bit", edit(&|b| b[12] = 0, true)),
        ("flag bit 1 in a version 1 file", edit(&|b| b[12] = 3, true)),
    ]
}

/// The flags and fields of a version 2 file.
fn version_2_corruptions(edit: Edit<'_>) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "version 2, boot id bytes without flag bit 1",
            edit(
                &|b| {
                    b[8] = 2;
                    b[100] = 1;
                },
                true,
            ),
        ),
        (
            "version 2, unknown flag bit 2",
            edit(
                &|b| {
                    b[8] = 2;
                    b[12] = 7;
                },
                true,
            ),
        ),
        (
            "version 2, no checksum bit",
            edit(
                &|b| {
                    b[8] = 2;
                    b[12] = 2;
                },
                true,
            ),
        ),
        (
            "version 2, both checksum bits",
            edit(
                &|b| {
                    b[8] = 2;
                    b[12] = 5;
                },
                true,
            ),
        ),
        (
            "version 2, XXH3 with a checksum tail",
            edit(
                &|b| {
                    b[8] = 2;
                    b[12] = 4;
                    let x = xxhash_rust::xxh3::xxh3_128(&b[4096..]).to_le_bytes();
                    b[32..48].copy_from_slice(&x);
                    b[48..64].fill(0);
                    b[63] = 1;
                },
                true,
            ),
        ),
        (
            "version 2, XXH3 flag over a blake3 checksum",
            edit(
                &|b| {
                    b[8] = 2;
                    b[12] = 4;
                    b[48..64].fill(0);
                },
                true,
            ),
        ),
        (
            "version 2, reserved 112..120",
            edit(
                &|b| {
                    b[8] = 2;
                    b[12] = 3;
                    b[115] = 1;
                },
                true,
            ),
        ),
    ]
}

/// The other fields, the padding, the block hash, the checksum, the payload and the length.
fn field_and_payload_corruptions(edit: Edit<'_>, other: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("unknown high flag", edit(&|b| b[15] = 0x80, true)),
        ("payload offset", edit(&|b| b[17] = 0x20, true)),
        ("payload offset high byte", edit(&|b| b[19] = 1, true)),
        ("reserved 20..24", edit(&|b| b[22] = 1, true)),
        ("reserved 96..120", edit(&|b| b[100] = 1, true)),
        ("reserved 96..120, last byte", edit(&|b| b[119] = 1, true)),
        ("header check", edit(&|b| b[120] ^= 1, false)),
        ("payload length", edit(&|b| b[24] ^= 1, true)),
        ("padding, first byte", edit(&|b| b[128] = 1, true)),
        ("padding, last byte", edit(&|b| b[4095] = 0xff, true)),
        (
            "block hash of another block",
            edit(&|b| b[64..96].copy_from_slice(&other[64..96]), true),
        ),
        ("payload checksum", edit(&|b| b[40] ^= 0x10, true)),
        (
            "payload and checksum fields swapped",
            edit(
                &|b| {
                    let (sum, key) = (b[32..64].to_vec(), b[64..96].to_vec());
                    b[32..64].copy_from_slice(&key);
                    b[64..96].copy_from_slice(&sum);
                },
                true,
            ),
        ),
        (
            "payload byte",
            edit(&|b| *b.last_mut().unwrap() ^= 1, false),
        ),
        ("truncated", edit(&|b| b.truncate(b.len() - 1), false)),
        ("one byte longer", edit(&|b| b.push(0), false)),
        ("header only", edit(&|b| b.truncate(4096), false)),
    ]
}

#[test]
fn the_oracle_rejects_every_corruption_of_the_document() {
    let hex = hash(1).to_hex();
    let data = payload(1, 0, 3000);
    oracle::check_block_bytes(&oracle::encode_block(&hex, &data), &hex).unwrap();
    for (what, bytes) in corruptions(&hex, &data) {
        assert!(
            oracle::check_block_bytes(&bytes, &hex).is_err(),
            "the oracle took a file with a bad {what}"
        );
    }
}

#[test]
fn the_store_treats_every_corruption_as_a_miss() {
    let hex = hash(1).to_hex();
    let data = payload(1, 0, 3000);
    for (what, bytes) in corruptions(&hex, &data) {
        let dir = tempfile::tempdir().unwrap();
        let wdir = dir.path().join("v1/w");
        let p = plant(&wdir, 1, 256, 2, &[(hex.clone(), bytes)]).remove(0);
        let store = Store::open(dir.path(), worker("w"), config(1, 256)).unwrap();
        let k = store.key(hash(1));
        let mut b = vec![0u8; data.len() + 1];
        assert_eq!(
            store.get(&k, &mut b).unwrap(),
            Lookup::Miss,
            "a block file with a bad {what} was served"
        );
        assert!(!p.exists(), "the file with a bad {what} was not removed");
        assert_eq!(store.stats().corrupt, 1, "{what}");
    }
}

/// A torn block as a machine crash leaves it: the name and the header reached the disk, a page
/// of the payload did not (zeros). The file is full length with a valid header, so only the
/// payload checksum can tell.
fn torn(mut file: Vec<u8>) -> Vec<u8> {
    let at = 4096 + 4096;
    file[at..at + 4096].fill(0);
    file
}

/// A payload whose second page is not zeros (so tearing it changes it).
fn tearable(i: u64) -> Vec<u8> {
    let mut d = payload(i, 7, 3 * 4096);
    d[4096..8192].fill(0xC3);
    d
}

/// The crash that can tear a published block is a machine crash, and after one the machine
/// has a new boot id. Files from before this boot, whatever their version, are hashed on their
/// first open by the default mode (`on-open`) and by `after-reboot`, so a torn one is a miss,
/// removed and counted.
#[test]
fn the_default_mode_catches_a_block_torn_before_this_boot() {
    let hex = hash(1).to_hex();
    let data = tearable(1);
    let mut other_boot = oracle::this_boot();
    other_boot[0] ^= 0xFF;
    for (what, bytes) in [
        (
            "version 2 from another boot",
            oracle::encode_block_v2(&hex, &data, other_boot),
        ),
        ("version 2, blake3, from another boot", {
            let mut b = oracle::encode_block(&hex, &data);
            b[8] = 2;
            b[12] = 3;
            b[96..112].copy_from_slice(&other_boot);
            reseal(&mut b);
            b
        }),
        ("version 1 (no boot id)", oracle::encode_block(&hex, &data)),
        ("version 2 without a boot id", {
            let mut b = oracle::encode_block(&hex, &data);
            b[8] = 2;
            reseal(&mut b);
            b
        }),
    ] {
        oracle::check_block_bytes(&bytes, &hex).unwrap();
        assert!(oracle::check_block_bytes(&torn(bytes.clone()), &hex).is_err());
        for (damaged, expect, verify) in [
            (false, Lookup::Hit(data.len()), None),
            (true, Lookup::Miss, None),
            (
                false,
                Lookup::Hit(data.len()),
                Some(VerifyMode::AfterReboot),
            ),
            (true, Lookup::Miss, Some(VerifyMode::AfterReboot)),
        ] {
            let what = format!("{what}, {verify:?}");
            let dir = tempfile::tempdir().unwrap();
            let file = if damaged {
                torn(bytes.clone())
            } else {
                bytes.clone()
            };
            let p = plant(&dir.path().join("v1/w"), 1, 256, 2, &[(hex.clone(), file)]).remove(0);
            let mut cfg = StoreConfig::new().with_stats_interval(None);
            assert_eq!(cfg.verify, VerifyMode::OnOpen, "the default");
            if let Some(v) = verify {
                cfg = cfg.with_verify(v);
            }
            let store = Store::open(dir.path(), worker("w"), cfg).unwrap();
            let mut b = vec![0u8; data.len()];
            assert_eq!(
                store.get(&store.key(hash(1)), &mut b).unwrap(),
                expect,
                "{what}"
            );
            let s = store.stats();
            assert_eq!(
                s.checksums_skipped, 0,
                "{what}: a file from another boot is hashed"
            );
            assert_eq!(
                (s.corrupt, p.exists()),
                (damaged as u64, !damaged),
                "{what}"
            );
            if !damaged {
                assert_eq!(b, data);
            }
        }
    }
}

/// A block this machine wrote since its boot is trusted by `after-reboot`: its first read
/// hashes nothing (counted). `on-open` (the default) and `always` still hash it, so damage
/// done to it in place (not a crash: a foreign writer, the medium) is theirs to catch.
#[test]
fn blocks_written_since_this_boot_are_served_without_hashing() {
    let dir = tempfile::tempdir().unwrap();
    let data = tearable(2);
    let path = {
        let store = Store::open(dir.path(), worker("w"), config(1, 256)).unwrap();
        let k = store.key(hash(2));
        store.put(&k, &data).unwrap();
        store.path_of(&k.hash)
    };
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(oracle::writer_boot(&bytes), Some(oracle::this_boot()));
    // Fresh stores, each with a cold open-file cache: after-reboot skips the hash once per
    // open, the other modes do not.
    for (verify, skipped) in [
        (VerifyMode::AfterReboot, 1),
        (VerifyMode::OnOpen, 0),
        (VerifyMode::Always, 0),
    ] {
        let store = Store::open(
            dir.path(),
            worker("w"),
            config(1, 256).with_verify(verify).with_fd_cache(16),
        )
        .unwrap();
        let k = store.key(hash(2));
        let mut b = vec![0u8; data.len()];
        for _ in 0..3 {
            assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(data.len()));
            assert_eq!(b, data);
        }
        assert_eq!(store.stats().checksums_skipped, skipped, "{verify}");
    }
    // Damaged in place (which no crash does to a published file of this boot): on-open
    // catches it, after-reboot trusts it.
    std::fs::write(&path, torn(bytes)).unwrap();
    let open = |v| Store::open(dir.path(), worker("w"), config(1, 256).with_verify(v)).unwrap();
    let mut b = vec![0u8; data.len()];
    let trusting = open(VerifyMode::AfterReboot);
    assert_eq!(
        trusting.get(&trusting.key(hash(2)), &mut b).unwrap(),
        Lookup::Hit(data.len())
    );
    drop(trusting);
    let hashing = open(VerifyMode::OnOpen);
    assert_eq!(
        hashing.get(&hashing.key(hash(2)), &mut b).unwrap(),
        Lookup::Miss
    );
    assert_eq!(hashing.stats().corrupt, 1);
}

/// Eight bytes changed in place inside the payload of a block this machine wrote since its
/// boot (a stray writer, a buggy tool, a bad device: the file keeps its length and header) are
/// a miss in the default mode, counted as corrupt and removed, with each engine. The psync
/// engine hands the payload over as it lands and the store hashes it then
/// (`checksums_streamed`); io_uring does not, and the store hashes the buffer after. Payloads
/// of one piece and of several (`FEED_CHUNK` is 256 KiB), the change in the first and in a
/// later one.
#[test]
fn the_default_mode_misses_a_block_of_this_boot_changed_in_place() {
    use std::os::unix::fs::FileExt;
    let engines: [(&str, tierkv::engine::EngineKind, u64); 2] = [
        ("psync", tierkv::engine::EngineKind::Psync, 1),
        ("io_uring", tierkv::engine::EngineKind::IoUring, 0),
    ];
    for (name, kind, streams) in engines {
        for (len, at) in [
            (3 * 4096, 100),
            (600 * 1024 + 5, 10),
            (600 * 1024 + 5, 500 * 1024),
        ] {
            let what = format!("{name}, {len} bytes, changed at {at}");
            let dir = tempfile::tempdir().unwrap();
            let cfg = || StoreConfig::new().with_stats_interval(None);
            let datas: Vec<Vec<u8>> = (0..2).map(|i| payload(i, 3, len)).collect();
            let paths: Vec<_> = {
                let store = Store::open(dir.path(), worker("w"), cfg()).unwrap();
                (0..2u64)
                    .map(|i| {
                        let k = store.key(hash(i));
                        store.put(&k, &datas[i as usize]).unwrap();
                        store.path_of(&k.hash)
                    })
                    .collect()
            };
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&paths[1])
                .unwrap();
            f.write_all_at(b"\xde\xad\xbe\xef\xde\xad\xbe\xef", 4096 + at)
                .unwrap();
            drop(f);
            assert_eq!(
                std::fs::metadata(&paths[1]).unwrap().len(),
                4096 + len as u64
            );
            let engine = kind.build().expect("the engine");
            let store = Store::open_with_engine(dir.path(), worker("w"), cfg(), engine).unwrap();
            let mut b = vec![0u8; len];
            assert_eq!(
                store.get(&store.key(hash(0)), &mut b).unwrap(),
                Lookup::Hit(len),
                "{what}"
            );
            assert_eq!(b, datas[0], "{what}");
            assert_eq!(
                store.get(&store.key(hash(1)), &mut b).unwrap(),
                Lookup::Miss,
                "{what}: served a block changed in place"
            );
            let s = store.stats();
            assert_eq!((s.corrupt, s.checksums_skipped), (1, 0), "{what}");
            assert_eq!(s.checksums_streamed, 2 * streams, "{what}");
            assert!(paths[0].exists() && !paths[1].exists(), "{what}");
        }
    }
}
