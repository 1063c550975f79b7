//! The put/get semantics of the store, one test each.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use tierkv::{Error, Layout, Lookup, Publish, Store, VerifyMode};

#[test]
fn round_trip_batches_and_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "rank0");
    let ks = keys(&store, 6);
    let sizes = [0usize, 1, 4095, 4096, 4097, 300_000];
    let datas: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| payload(i as u64, 0, n))
        .collect();
    let items = items(&ks, &datas);
    for r in store.put_many(&items) {
        r.unwrap();
    }
    let mut bufs = vec![vec![0u8; 300_000]; 6];
    let res = store.get_many(&ks, &mut bufs);
    for (i, r) in res.into_iter().enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit(sizes[i]));
        assert_eq!(&bufs[i][..sizes[i]], &datas[i][..]);
    }
    // Prefix: present, present, absent, present -> 2.
    let absent = store.key(hash(99));
    let chain = vec![ks[0].clone(), ks[1].clone(), absent.clone(), ks[2].clone()];
    assert_eq!(store.contains_prefix(&chain).unwrap(), 2);
    let c: Vec<bool> = store
        .contains_many(&chain)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(c, vec![true, true, false, true]);
    // Remove.
    let r: Vec<bool> = store
        .remove_many(&[ks[1].clone(), absent])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(r, vec![true, false]);
    assert_eq!(store.contains_prefix(&ks).unwrap(), 1);
    assert_eq!(store.get(&ks[1], &mut bufs[0]).unwrap(), Lookup::Miss);
    let s = store.stats();
    assert_eq!((s.hits, s.misses, s.puts, s.removes), (6, 1, 6, 1));
    assert_eq!(s.bytes_read, sizes.iter().sum::<usize>() as u64);
}

#[test]
fn every_layout_round_trips_and_paths_follow_the_scheme() {
    for (depth, fanout) in [
        (0u8, 256u32),
        (1, 16),
        (1, 256),
        (2, 256),
        (1, 4096),
        (3, 16),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(depth, fanout).unwrap();
        let store =
            Store::open(dir.path(), worker("w"), common::cfg().with_layout(layout)).unwrap();
        let ks = keys(&store, 50);
        for (i, k) in ks.iter().enumerate() {
            store.put(k, &payload(i as u64, 1, 1000)).unwrap();
        }
        // docs/format.md: fan-out 16, 256, 4096 take 1, 2, 3 hex characters per level.
        let w = match fanout {
            16 => 1,
            256 => 2,
            _ => 3,
        };
        for (i, k) in ks.iter().enumerate() {
            let hex = k.hash.to_hex();
            let expect =
                oracle::block_path(&dir.path().join("v1").join("w"), &hex, depth as usize, w);
            assert_eq!(
                expect
                    .strip_prefix(dir.path())
                    .unwrap()
                    .components()
                    .count(),
                3 + depth as usize
            );

            assert_eq!(store.path_of(&k.hash), expect);
            assert!(expect.is_file(), "{}", expect.display());
            let mut b = vec![0u8; 1000];
            assert_eq!(store.get(k, &mut b).unwrap(), Lookup::Hit(1000));
            assert_eq!(b, payload(i as u64, 1, 1000));
        }
        assert_eq!(check_all_blocks(store.dir()), 50);
        let layout_file = std::fs::read_to_string(store.dir().join("LAYOUT")).unwrap();
        assert_eq!(layout_file, format!("depth={depth}\nfanout={fanout}\n"));
    }
}

#[test]
fn modes_are_0644_and_0755_under_the_umask() {
    for publish in [Publish::Tmpfile, Publish::Rename] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = common::cfg()
            .with_layout(Layout::new(2, 256).unwrap())
            .with_publish(publish);
        check_modes(&Store::open(dir.path(), worker("w"), cfg).unwrap());
    }
}

fn check_modes(store: &Store) {
    let k = store.key(hash(1));
    store.put(&k, b"abc").unwrap();
    // Replacing takes another path (a named link, then rename).
    store.put(&k, b"abcd").unwrap();
    let mask = umask();
    let p = store.path_of(&k.hash);
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o644 & !mask
    );
    let leaf = p.parent().unwrap();
    assert_eq!(
        std::fs::metadata(leaf).unwrap().permissions().mode() & 0o777,
        0o755 & !mask
    );
    assert_eq!(
        std::fs::metadata(leaf.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755 & !mask
    );
}

#[test]
fn missing_file_is_a_miss_even_after_it_was_cached() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let k = store.key(hash(7));
    let mut b = vec![0u8; 100];
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Miss);
    store.put(&k, &[9u8; 100]).unwrap();
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(100));
    assert_eq!(store.stats().fd_cache_len, 1, "the descriptor is cached");
    // Deleted behind the store's back between two calls.
    std::fs::remove_file(store.path_of(&k.hash)).unwrap();
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Miss);
    assert!(
        !store.contains_many(std::slice::from_ref(&k))[0]
            .as_ref()
            .unwrap()
    );
    // A whole shard directory removed behind its back: still a miss, and puts recreate it.
    std::fs::remove_dir_all(store.path_of(&k.hash).parent().unwrap()).unwrap();
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Miss);
    store.put(&k, &[1u8; 10]).unwrap();
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(10));
}

#[test]
fn replaced_behind_our_back_reads_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let (k1, k2) = (store.key(hash(1)), store.key(hash(2)));
    store.put(&k1, &[1u8; 64]).unwrap();
    let mut b = vec![0u8; 64];
    store.get(&k1, &mut b).unwrap(); // cached
    // Another writer replaces the file (rename over it) with a valid block for the same key.
    let other = tempfile::tempdir().unwrap();
    let s2 = open(other.path(), "w");
    s2.put(&k2, &[0u8; 1]).unwrap();
    s2.put(&s2.key(k1.hash), &[2u8; 64]).unwrap();
    std::fs::rename(s2.path_of(&k1.hash), store.path_of(&k1.hash)).unwrap();
    assert_eq!(store.get(&k1, &mut b).unwrap(), Lookup::Hit(64));
    assert_eq!(b, vec![2u8; 64]);
}

fn corrupt_case(mutate: impl FnOnce(&std::path::Path), verify: VerifyMode) -> (Lookup, bool, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), common::cfg().with_verify(verify)).unwrap();
    let k = store.key(hash(3));
    store.put(&k, &payload(3, 0, 10_000)).unwrap();
    let p = store.path_of(&k.hash);
    mutate(&p);
    let mut b = vec![0u8; 20_000];
    let r = store.get(&k, &mut b).unwrap();
    (r, p.exists(), store.stats().corrupt)
}

#[test]
fn corrupt_files_are_misses_removed_and_counted() {
    use std::io::{Seek, SeekFrom, Write};
    let flip = |off: u64| {
        move |p: &std::path::Path| {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .unwrap();
            let mut byte = [0u8];
            f.seek(SeekFrom::Start(off)).unwrap();
            std::io::Read::read_exact(&mut f, &mut byte).unwrap();
            f.seek(SeekFrom::Start(off)).unwrap();
            f.write_all(&[byte[0] ^ 0x40]).unwrap();
        }
    };
    // Bad magic.
    assert_eq!(
        corrupt_case(flip(0), VerifyMode::OnOpen),
        (Lookup::Miss, false, 1)
    );
    // Payload checksum mismatch (verified on open, and always).
    assert_eq!(
        corrupt_case(flip(4096 + 5000), VerifyMode::OnOpen),
        (Lookup::Miss, false, 1)
    );
    assert_eq!(
        corrupt_case(flip(4096 + 5000), VerifyMode::Always),
        (Lookup::Miss, false, 1)
    );
    // With verification off, a flipped payload bit is not detected (documented).
    assert_eq!(
        corrupt_case(flip(4096 + 5000), VerifyMode::Never),
        (Lookup::Hit(10_000), true, 0)
    );
    // Truncated (a torn write), and appended to.
    let truncate = |p: &std::path::Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(4096 + 9000)
            .unwrap()
    };
    assert_eq!(
        corrupt_case(truncate, VerifyMode::Never),
        (Lookup::Miss, false, 1)
    );
    let append = |p: &std::path::Path| {
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        f.write_all(b"x").unwrap();
    };
    assert_eq!(
        corrupt_case(append, VerifyMode::Never),
        (Lookup::Miss, false, 1)
    );
    // Header only, no payload; empty file; random bytes.
    let header_only = |p: &std::path::Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(100)
            .unwrap()
    };
    assert_eq!(
        corrupt_case(header_only, VerifyMode::OnOpen),
        (Lookup::Miss, false, 1)
    );
    let garbage = |p: &std::path::Path| std::fs::write(p, vec![0x5Au8; 14_096]).unwrap();
    assert_eq!(
        corrupt_case(garbage, VerifyMode::OnOpen),
        (Lookup::Miss, false, 1)
    );
}

#[test]
fn a_block_under_another_blocks_name_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let (a, b) = (store.key(hash(1)), store.key(hash(2)));
    store.put(&a, &[1u8; 10]).unwrap();
    std::fs::create_dir_all(store.path_of(&b.hash).parent().unwrap()).unwrap();
    std::fs::copy(store.path_of(&a.hash), store.path_of(&b.hash)).unwrap();
    let mut buf = [0u8; 10];
    if is_shared() {
        // Shared, the index is a cache of the tree: the file is read, found corrupt, removed.
        assert_eq!(store.get(&b, &mut buf).unwrap(), Lookup::Miss);
        assert_eq!(store.stats().corrupt, 1);
        assert!(!store.path_of(&b.hash).exists(), "removed");
        assert_eq!(store.get(&a, &mut buf).unwrap(), Lookup::Hit(10));
        return;
    }
    // Made behind the store's back: the index does not know it, so it is a miss unread.
    assert_eq!(store.get(&b, &mut buf).unwrap(), Lookup::Miss);
    assert_eq!(store.stats().corrupt, 0);
    // After a restart the scan indexes it by its name; the first read finds it corrupt.
    drop(store);
    let store = open(dir.path(), "w");
    assert_eq!(store.stats().blocks_at_open, 2);
    assert_eq!(store.get(&b, &mut buf).unwrap(), Lookup::Miss);
    assert_eq!(store.stats().corrupt, 1);
    assert!(!store.path_of(&b.hash).exists(), "removed");
    assert_eq!(store.get(&a, &mut buf).unwrap(), Lookup::Hit(10));
}

#[test]
fn foreign_files_are_left_alone_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("w"),
        common::cfg().with_layout(Layout::new(1, 256).unwrap()),
    )
    .unwrap();
    let k = store.key(hash(1));
    store.put(&k, b"data").unwrap();
    let leaf = store.path_of(&k.hash).parent().unwrap().to_path_buf();
    let wdir = store.dir().to_path_buf();
    drop(store);
    let foreign = [
        leaf.join("notes.txt"),
        leaf.join(k.hash.to_hex().to_uppercase()),
        wdir.join("README"),
        wdir.join("zz").join("x"),
    ];
    std::fs::create_dir_all(wdir.join("zz")).unwrap();
    for f in &foreign {
        std::fs::write(f, b"not ours").unwrap();
    }
    std::os::unix::fs::symlink("/etc/passwd", leaf.join("link")).unwrap();
    let store = open(dir.path(), "w");
    let s = store.stats();
    // notes.txt, upper-case name, README, the directory zz (not a shard name), the symlink.
    assert_eq!(s.foreign, 5, "{s:?}");
    assert_eq!(s.blocks_at_open, 1);
    for f in &foreign {
        assert!(f.exists(), "{} was touched", f.display());
    }
    assert!(leaf.join("link").symlink_metadata().is_ok());
    let mut b = [0u8; 4];
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(4));
}

#[test]
fn symlinks_are_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    // A valid block file outside the tree, for the same key.
    let other = open(outside.path(), "w");
    let k = other.key(hash(5));
    other.put(&k, &[5u8; 50]).unwrap();
    let target = other.path_of(&k.hash);

    let store = Store::open(
        dir.path(),
        worker("w"),
        common::cfg().with_layout(Layout::new(1, 256).unwrap()),
    )
    .unwrap();
    let p = store.path_of(&k.hash);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &p).unwrap();
    let mut b = [0u8; 50];
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Miss);
    assert!(target.exists(), "the symlink target is untouched");
    assert!(
        p.symlink_metadata().unwrap().file_type().is_symlink(),
        "the symlink is left alone"
    );
    assert!(
        !store.contains_many(std::slice::from_ref(&k))[0]
            .as_ref()
            .unwrap()
    );

    // A symlinked shard directory is not followed either.
    let k2 = other.key(hash(6));
    other.put(&k2, &[6u8; 50]).unwrap();
    let shard = store.path_of(&k2.hash).parent().unwrap().to_path_buf();
    if shard.exists() {
        std::fs::remove_dir_all(&shard).unwrap();
    }
    std::os::unix::fs::symlink(other.path_of(&k2.hash).parent().unwrap(), &shard).unwrap();
    assert_eq!(store.get(&k2, &mut b).unwrap(), Lookup::Miss);
    // A put through a symlinked shard fails cleanly instead of writing outside the tree.
    assert!(store.put(&k2, &[7u8; 50]).is_err());
    let mut ob = [0u8; 50];
    assert_eq!(other.get(&k2, &mut ob).unwrap(), Lookup::Hit(50));
    assert_eq!(ob, [6u8; 50]);
}

#[test]
fn overwrite_is_atomic_for_concurrent_readers() {
    for publish in [Publish::Tmpfile, Publish::Rename] {
        overwrite_under_readers(publish);
    }
}

fn overwrite_under_readers(publish: Publish) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("w"),
        common::cfg()
            .with_verify(VerifyMode::Never)
            .with_publish(publish),
    )
    .unwrap();
    let k = store.key(hash(42));
    const LEN: usize = 256 * 1024;
    store.put(&k, &vec![0u8; LEN]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Readers that have read once: the puts start only when both are reading (on 2 cores a
    // thread may otherwise not run before 200 quick puts are over).
    let reading = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, k, stop, reading) =
                (store.clone(), k.clone(), stop.clone(), reading.clone());
            std::thread::spawn(move || {
                let mut b = vec![0u8; LEN];
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match store.get(&k, &mut b).unwrap() {
                        Lookup::Hit(n) => {
                            assert_eq!(n, LEN);
                            let first = b[0];
                            assert!(b.iter().all(|&x| x == first), "mixed old and new bytes");
                            reads += 1;
                            if reads == 1 {
                                reading.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Lookup::Miss => panic!("an overwritten key must never miss"),
                    }
                }
                reads
            })
        })
        .collect();
    while reading.load(Ordering::Relaxed) < 2 {
        std::thread::yield_now();
    }
    for v in 1..=200u32 {
        store.put(&k, &vec![v as u8; LEN]).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let mut b = vec![0u8; LEN];
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(LEN));
    // Shared, a present block is never rewritten (its key names its content).
    let last = if is_shared() { 0 } else { 200 };
    assert!(b.iter().all(|&x| x == last));
}

#[test]
fn replace_and_remove_invalidate_the_cached_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let k = store.key(hash(1));
    let mut b = [0u8; 8];
    store.put(&k, b"version1").unwrap();
    store.get(&k, &mut b).unwrap();
    store.put(&k, b"version2").unwrap();
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(8));
    // Shared, the present block stays (no replacement).
    assert_eq!(
        &b,
        if is_shared() {
            b"version1"
        } else {
            b"version2"
        }
    );
    assert!(
        store.remove_many(std::slice::from_ref(&k))[0]
            .as_ref()
            .unwrap()
    );
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Miss);
    assert_eq!(store.stats().fd_cache_len, 0);
}

#[test]
fn oversized_blocks_are_rejected_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("w"),
        common::cfg().with_max_block_size(1000),
    )
    .unwrap();
    let (ok, big) = (store.key(hash(1)), store.key(hash(2)));
    let res = store.put_many(&[
        (ok.clone(), vec![1u8; 1000]),
        (big.clone(), vec![2u8; 1001]),
    ]);
    assert!(res[0].is_ok());
    match &res[1] {
        Err(Error::TooLarge {
            len: 1001,
            max: 1000,
            key,
        }) => assert!(key.contains(&big.hash.to_hex())),
        other => panic!("{other:?}"),
    }
    assert!(!store.path_of(&big.hash).exists());
    assert!(temp_files_under(store.dir()).is_empty());
    assert_eq!(store.stats().put_errors, 1);
}

#[test]
fn keys_of_another_worker_and_small_buffers_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "rank0");
    let foreign_key = tierkv::BlockKey::new(worker("rank1"), hash(1));
    let e = store.put(&foreign_key, b"x").unwrap_err();
    assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
    assert!(e.to_string().contains("rank1"));
    assert!(store.get(&foreign_key, &mut [0u8; 1]).is_err());
    assert!(store.contains_prefix(&[foreign_key]).is_err());
    assert!(!dir.path().join("v1").join("rank1").exists());

    let k = store.key(hash(2));
    store.put(&k, &[1u8; 100]).unwrap();
    for _ in 0..2 {
        // Fresh open, then cached descriptor: both report the size, neither removes the file.
        match store.get(&k, &mut [0u8; 99]) {
            Err(Error::BufferTooSmall {
                need: 100,
                have: 99,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let mut b = [0u8; 100];
        assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(100));
    }
    assert_eq!(store.stats().corrupt, 0);
    // Mismatched batch.
    assert!(
        store
            .get_many(&[k.clone(), k], &mut [[0u8; 1]])
            .iter()
            .all(Result::is_err)
    );
}

#[test]
fn one_store_per_worker_and_workers_share_a_root() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), "rank0");
    match Store::open(dir.path(), worker("rank0"), common::cfg()) {
        // Shared stores share a worker (tools/tests/shared.rs).
        Ok(_) if is_shared() => {}
        Err(Error::WorkerBusy { path, .. }) => assert!(path.ends_with("v1/rank0")),
        other => panic!("{other:?}"),
    }
    let b = open(dir.path(), "rank1");
    let h = hash(1);
    a.put(&a.key(h), b"from rank 0").unwrap();
    b.put(&b.key(h), b"from rank 1!").unwrap();
    let mut buf = [0u8; 12];
    assert_eq!(a.get(&a.key(h), &mut buf).unwrap(), Lookup::Hit(11));
    assert_eq!(&buf[..11], b"from rank 0");
    assert_eq!(b.get(&b.key(h), &mut buf).unwrap(), Lookup::Hit(12));
    drop(a);
    let a = open(dir.path(), "rank0");
    assert_eq!(a.get(&a.key(h), &mut buf).unwrap(), Lookup::Hit(11));
}

#[test]
fn layout_is_recorded_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let l2 = Layout::new(2, 16).unwrap();
    let s = Store::open(dir.path(), worker("w"), common::cfg().with_layout(l2)).unwrap();
    let k = s.key(hash(1));
    s.put(&k, b"x").unwrap();
    drop(s);
    // Default config adopts the recorded layout; the block still hits.
    let s = open(dir.path(), "w");
    assert_eq!(s.layout(), l2);
    assert_eq!(s.get(&k, &mut [0u8; 1]).unwrap(), Lookup::Hit(1));
    drop(s);
    match Store::open(
        dir.path(),
        worker("w"),
        common::cfg().with_layout(Layout::new(1, 256).unwrap()),
    ) {
        Err(Error::LayoutMismatch { .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_small_store_has_its_leaves_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let small = || common::cfg().with_capacity_files(10_000);
    let s = Store::open(dir.path(), worker("w"), small()).unwrap();
    // A bounded store of up to 524,288 files gets 256 leaves, all made when it opens: no put of
    // a fresh tree pays for a directory.
    assert_eq!(s.layout(), Layout::new(1, 256).unwrap());
    for leaf in s.layout().leaf_dirs() {
        assert!(s.dir().join(&leaf).is_dir(), "{leaf} missing after open");
    }
    // A put whose leaf was removed behind the store's back still succeeds: it makes it.
    let k = s.key(hash(1));
    let leaf = s.layout().rel_path(&k.hash).dir().to_string();
    std::fs::remove_dir(s.dir().join(&leaf)).unwrap();
    s.put(&k, b"x").unwrap();
    assert_eq!(s.get(&k, &mut [0u8; 1]).unwrap(), Lookup::Hit(1));
    // A leaf removed while the store is closed is back after the next open.
    let other = s.layout().rel_path(&hash(2)).dir().to_string();
    let w = s.dir().to_path_buf();
    drop(s);
    if other != leaf {
        std::fs::remove_dir(w.join(&other)).unwrap();
    }
    let s = Store::open(dir.path(), worker("w"), small()).unwrap();
    assert!(w.join(&other).is_dir());
    assert_eq!(s.get(&k, &mut [0u8; 1]).unwrap(), Lookup::Hit(1));
    drop(s);

    // A store of more files keeps the deep tree, whose leaves its puts make.
    let big = || common::cfg().with_capacity_files(10_000_000);
    let s = Store::open(dir.path(), worker("big"), big()).unwrap();
    assert_eq!(s.layout(), Layout::default());
    let entries = |p: &std::path::Path| std::fs::read_dir(p).unwrap().count();
    let before = entries(s.dir());
    s.put(&s.key(hash(1)), b"y").unwrap();
    assert_eq!(
        entries(s.dir()),
        before + 1,
        "one level-1 directory made by the put"
    );
    drop(s);
    // A recorded layout is kept whatever the capacity says now: never re-laid.
    let s = Store::open(dir.path(), worker("big"), small()).unwrap();
    assert_eq!(s.layout(), Layout::default());
    assert_eq!(
        s.get(&s.key(hash(1)), &mut [0u8; 1]).unwrap(),
        Lookup::Hit(1)
    );
    drop(s);
    let s = Store::open(dir.path(), worker("w"), big()).unwrap();
    assert_eq!(s.layout(), Layout::new(1, 256).unwrap());
    drop(s);

    // Unbounded: sized by the room the filesystem has for blocks of 256 KiB.
    let s = Store::open(dir.path(), worker("u"), common::cfg()).unwrap();
    let room = tierkv::testing::BlockDir::open(dir.path(), "u", false)
        .unwrap()
        .room_in_files(tierkv::testing::TYPICAL_BLOCK_BYTES + 4096);
    assert_eq!(
        s.layout(),
        Layout::for_files(room),
        "room for {room:?} files"
    );
}

#[test]
fn stale_temp_files_are_swept_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), "w");
    let k = s.key(hash(1));
    s.put(&k, b"x").unwrap();
    let leaf = s.path_of(&k.hash).parent().unwrap().to_path_buf();
    drop(s);
    let stale = leaf.join(format!(".tmp.{}.999999.0", hash(2).to_hex()));
    std::fs::write(&stale, b"half a block").unwrap();
    let s = open(dir.path(), "w");
    assert!(!stale.exists());
    assert_eq!(s.stats().temp_swept, 1);
    assert_eq!(s.get(&k, &mut [0u8; 1]).unwrap(), Lookup::Hit(1));
}

#[test]
fn direct_io_and_sync_writes_round_trip() {
    // O_DIRECT needs a filesystem that supports it (tmpfs does not): use the target dir.
    let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tempfile::tempdir_in(base).unwrap();
    let cfg = common::cfg().with_direct_io(true).with_sync_writes(true);
    let store = Store::open(dir.path(), worker("w"), cfg).unwrap();
    let sizes = [0usize, 1, 4096, 5000, 65536, 100_001];
    let ks = keys(&store, sizes.len() as u64);
    for (i, (k, &n)) in ks.iter().zip(&sizes).enumerate() {
        store.put(k, &payload(i as u64, 3, n)).unwrap();
    }
    assert_eq!(check_all_blocks(store.dir()), sizes.len());
    for _pass in 0..2 {
        for (i, (k, &n)) in ks.iter().zip(&sizes).enumerate() {
            let mut b = vec![0u8; 100_001];
            assert_eq!(store.get(k, &mut b).unwrap(), Lookup::Hit(n));
            assert_eq!(&b[..n], &payload(i as u64, 3, n)[..]);
        }
    }
    // Files written with O_DIRECT are readable without it, and vice versa.
    drop(store);
    let plain = open(dir.path(), "w");
    let mut b = vec![0u8; 100_001];
    assert_eq!(plain.get(&ks[5], &mut b).unwrap(), Lookup::Hit(100_001));
    assert_eq!(plain.stats().corrupt, 0);
}

#[test]
fn stats_count_fd_cache_use() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), common::cfg().with_fd_cache(4)).unwrap();
    let ks = keys(&store, 8);
    for k in &ks {
        store.put(k, b"abcd").unwrap();
    }
    let mut b = [0u8; 4];
    for k in &ks[..4] {
        store.get(k, &mut b).unwrap();
        store.get(k, &mut b).unwrap();
    }
    let s = store.stats();
    assert_eq!(
        (
            s.fd_cache_hits,
            s.fd_cache_misses,
            s.fd_cache_len,
            s.fd_cache_capacity
        ),
        (4, 4, 4, 4)
    );
    for k in &ks[4..] {
        store.get(k, &mut b).unwrap();
    }
    let s = store.stats();
    assert_eq!((s.fd_cache_evictions, s.fd_cache_len), (4, 4));
    // The most recent four are the ones cached.
    for k in &ks[4..] {
        store.get(k, &mut b).unwrap();
    }
    assert_eq!(store.stats().fd_cache_hits, 8);
    // Disabled cache: every read opens.
    drop(store);
    let store = Store::open(dir.path(), worker("w"), common::cfg().with_fd_cache(0)).unwrap();
    store.get(&ks[0], &mut b).unwrap();
    store.get(&ks[0], &mut b).unwrap();
    let s = store.stats();
    assert_eq!(
        (s.fd_cache_hits, s.fd_cache_misses, s.fd_cache_len),
        (0, 2, 0)
    );
}

/// Keys and buffers that do not pair up fail every key of the batch (and read nothing).
#[test]
fn a_batch_with_more_keys_than_buffers_fails_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let ks = keys(&store, 3);
    for (i, k) in ks.iter().enumerate() {
        store.put(k, &payload(i as u64, 0, 100)).unwrap();
    }
    let mut a = vec![0u8; 100];
    let mut b = vec![0u8; 100];
    let res = store.get_many(&ks, &mut [&mut a[..], &mut b[..]]);
    assert_eq!(res.len(), 3);
    for r in res {
        assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    }
    assert_eq!((a, b), (vec![0u8; 100], vec![0u8; 100]), "nothing was read");
}

/// A cached descriptor whose file changed length in place (not replaced: the same inode; here
/// it grew, so the payload's bytes are still all there) is corrupt: a miss, and the file is
/// removed.
#[test]
fn a_cached_file_resized_in_place_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let k = store.key(hash(1));
    store.put(&k, &payload(1, 0, 10_000)).unwrap();
    let mut b = vec![0u8; 10_000];
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(10_000));
    let p = store.path_of(&k.hash);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096 + 10_000 + 100)
        .unwrap();
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Miss);
    assert_eq!(store.stats().corrupt, 1);
    assert!(!p.exists());
}

/// With `verify: always`, reads through a cached descriptor hash the payload too, and a
/// block that verifies is served every time.
#[test]
fn verify_always_serves_a_good_cached_block_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("w"),
        common::cfg().with_verify(VerifyMode::Always),
    )
    .unwrap();
    let k = store.key(hash(1));
    store.put(&k, &payload(1, 0, 5000)).unwrap();
    let mut b = vec![0u8; 5000];
    for _ in 0..3 {
        assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(5000));
        assert_eq!(b, payload(1, 0, 5000));
    }
    let s = store.stats();
    assert_eq!((s.fd_cache_hits, s.corrupt), (2, 0));
}

/// A stats interval under 1 ms (one that rounds to nothing: Python's `stats_interval=1e-300`)
/// is refused at open instead of rewriting STATS.json in a busy loop.
#[test]
fn a_stats_interval_under_a_millisecond_is_refused() {
    let root = tempfile::tempdir().unwrap();
    for tiny in [
        std::time::Duration::ZERO,
        std::time::Duration::from_micros(999),
    ] {
        match tierkv::Store::open(
            root.path(),
            worker("0"),
            cfg().with_stats_interval(Some(tiny)),
        ) {
            Err(tierkv::Error::Config(msg)) => assert!(msg.contains("stats interval"), "{msg}"),
            other => panic!("{tiny:?}: {other:?}"),
        }
    }
    let ok = cfg().with_stats_interval(Some(tierkv::MIN_STATS_INTERVAL));
    drop(tierkv::Store::open(root.path(), worker("0"), ok).unwrap());
}

/// An offer under a parent that is another worker's key is refused item by item (the
/// contiguous and the vectored offer alike), and nothing is stored.
#[test]
fn an_offer_under_another_workers_parent_is_an_invalid_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let other = open(dir.path(), "other");
    let parent = other.key(hash(1));
    let ks = keys(&store, 2);
    let data = vec![b"a".to_vec(), b"b".to_vec()];
    let res = store.offer_many_after(Some(&parent), &items(&ks, &data));
    let parts: [&[u8]; 2] = [b"x", b"y"];
    let vectored: Vec<(tierkv::BlockKey, &[&[u8]])> =
        ks.iter().map(|k| (k.clone(), &parts[..])).collect();
    let res_v = store.offer_many_vectored_after(Some(&parent), &vectored);
    for r in res.iter().chain(&res_v) {
        match r {
            Err(Error::InvalidKey { reason }) => assert!(reason.contains("other"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(store.contains_prefix(&ks).unwrap(), 0);
    // Under a stored parent of its own: one result per item, stored from the parts.
    let root = store.key(hash(100));
    store.put(&root, b"r").unwrap();
    let res_v = store.offer_many_vectored_after(Some(&root), &vectored);
    assert!(
        res_v.len() == 2 && res_v.iter().all(Result::is_ok),
        "{res_v:?}"
    );
    assert_eq!(store.contains_prefix(&ks).unwrap(), 2);
    let mut b = [0u8; 2];
    assert_eq!(store.get(&ks[1], &mut b).unwrap(), Lookup::Hit(2));
    assert_eq!(&b, b"xy");
}

/// A shared store of worker `w` under `root` and a read-only shared store of it (an engine's
/// workers and its scheduler) remembering absent keys for `negative_ttl`.
fn writer_and_reader(root: &std::path::Path, negative_ttl: std::time::Duration) -> (Store, Store) {
    let shared = tierkv::StoreConfig::new()
        .with_sharing(tierkv::Sharing::Shared)
        .with_stats_interval(None);
    let writer = Store::open(root, worker("w"), shared.clone()).unwrap();
    let reader = Store::open(
        root,
        worker("w"),
        shared.with_read_only(true).with_negative_ttl(negative_ttl),
    )
    .unwrap();
    (writer, reader)
}

#[test]
fn a_read_only_shared_store_sees_blocks_put_after_it_opened() {
    // An engine's scheduler looks its prefixes up in a read-only store of
    // the tree its workers write; it must see what they stored after it opened.
    let dir = tempfile::tempdir().unwrap();
    let (writer, reader) = writer_and_reader(dir.path(), std::time::Duration::ZERO);
    let ks = chain_keys(&writer, 5, 3);
    assert_eq!(reader.contains_prefix(&ks).unwrap(), 0);
    let data = [payload(1, 0, 64), payload(2, 0, 64), payload(3, 0, 64)];
    for r in writer.put_many(&items(&ks, &data)) {
        r.unwrap();
    }
    assert_eq!(reader.contains_prefix(&ks).unwrap(), 3);
    let mut buf = vec![0u8; 64];
    assert_eq!(reader.get(&ks[2], &mut buf).unwrap(), Lookup::Hit(64));
    assert_eq!(buf, data[2]);
}

/// `clear()` empties a worker through the store, never around it. Two
/// shared stores on one worker (two ranks of an MLA model, two replicas): one clears, and the
/// other's blocks go too (it finds them missing, never an error); the directories and control
/// files stay, so both keep storing and each finds what the other puts after. A read-only
/// store refuses to clear.
#[test]
fn clear_empties_a_worker_and_every_store_on_it_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let shared = tierkv::StoreConfig::new()
        .with_sharing(tierkv::Sharing::Shared)
        .with_negative_ttl(std::time::Duration::ZERO)
        .with_stats_interval(None);
    let a = Store::open(dir.path(), worker("w"), shared.clone()).unwrap();
    let b = Store::open(dir.path(), worker("w"), shared.clone()).unwrap();
    let old = chain_keys(&a, 1, 3);
    let (mine, theirs) = (&old[..2], &old[2..]);
    let data: Vec<Vec<u8>> = (0..3).map(|i| payload(i, 0, 64)).collect();
    for r in a.put_many(&items(mine, &data[..2])) {
        r.unwrap();
    }
    for r in b.put_many(&items(theirs, &data[2..])) {
        r.unwrap();
    }
    let before: Vec<_> = std::fs::read_dir(a.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.len() > 2 && !n.to_string_lossy().starts_with("STATS"))
        .collect();
    assert_eq!(
        a.clear().unwrap(),
        3,
        "its own blocks and the other store's"
    );
    assert!(
        files_under(a.dir())
            .iter()
            .all(|p| p.file_name().is_some_and(|n| n.len() != 64)),
        "a block file is left"
    );
    let mut buf = vec![0u8; 64];
    for k in &old {
        assert_eq!(a.get(k, &mut buf).unwrap(), Lookup::Miss);
        assert_eq!(b.get(k, &mut buf).unwrap(), Lookup::Miss);
    }
    let after: Vec<_> = std::fs::read_dir(a.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.len() > 2 && !n.to_string_lossy().starts_with("STATS"))
        .collect();
    assert_eq!(before, after, "control files stay");
    let new = chain_keys(&a, 50, 2);
    for r in b.put_many(&items(&new, &data[..2])) {
        r.unwrap();
    }
    assert_eq!(a.contains_prefix(&new).unwrap(), 2);
    assert_eq!(a.get(&new[1], &mut buf).unwrap(), Lookup::Hit(64));
    assert_eq!(buf, data[1]);
    assert_eq!(b.clear().unwrap(), 2);
    assert_eq!(a.contains_prefix(&new).unwrap(), 0);
    let reader = Store::open(dir.path(), worker("w"), shared.with_read_only(true)).unwrap();
    assert!(matches!(
        reader.clear(),
        Err(tierkv::Error::ReadOnly { .. })
    ));
}

/// A pinned block is never this store's victim until unpinned
/// (as many times as pinned); an absent key is not pinned. `discard_many` removes exactly the
/// keys named, where `remove_many` takes the rest of the chain.
#[test]
fn pins_hold_until_released_and_discard_removes_only_what_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("w"),
        tierkv::StoreConfig::new()
            .with_capacity_files(2)
            .with_policy(tierkv::PolicyKind::Lru),
    )
    .unwrap();
    let ks = keys(&store, 8);
    let put = |i: usize| {
        store
            .put_many(&[(ks[i].clone(), payload(i as u64, 0, 64))])
            .pop()
            .unwrap()
            .unwrap()
    };
    let held = |i: usize| {
        store.contains_many(&ks[i..=i])[0]
            .as_ref()
            .copied()
            .unwrap()
    };
    put(0);
    put(1);
    let pinned: Vec<bool> = store
        .pin_many(&[ks[0].clone(), ks[0].clone(), ks[7].clone()])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(pinned, [true, true, false]);
    put(2);
    put(3);
    assert!(
        held(0) && !held(1) && !held(2),
        "the pinned block is the oldest"
    );
    store.unpin_many(&ks[0..1]).unwrap();
    put(4);
    assert!(held(0), "still pinned once");
    store.unpin_many(&ks[0..1]).unwrap();
    put(5);
    assert!(!held(0), "unpinned, the oldest goes");

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let chain = chain_keys(&store, 1, 4);
    let data: Vec<Vec<u8>> = (0..4).map(|i| payload(i, 0, 64)).collect();
    for r in store.put_many(&items(&chain, &data)) {
        r.unwrap();
    }
    assert!(store.discard_many(&chain[1..2])[0].as_ref().unwrap());
    let have: Vec<bool> = store
        .contains_many(&chain)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(have, [true, false, true, true]);
    let mut buf = vec![0u8; 64];
    assert_eq!(store.get(&chain[3], &mut buf).unwrap(), Lookup::Hit(64));
    assert_eq!(buf, data[3]);
    assert!(store.remove_many(&chain[2..3])[0].as_ref().unwrap());
    assert!(
        !store.contains_many(&chain[3..])[0].as_ref().unwrap(),
        "the chain's rest goes"
    );
}

/// An engine's scheduler asks for every waiting request's prefix at
/// every step. `lookup_prefix` answers from memory (a block once found is present without a
/// system call; an absent one is remembered for the negative time), and `recheck_many` makes
/// it look again: after the engine saved a block, or a load found one missing.
#[test]
fn lookups_answer_from_memory_until_told_to_look_again() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, reader) = writer_and_reader(dir.path(), std::time::Duration::from_secs(600));
    let ks = chain_keys(&writer, 9, 4);
    let data: Vec<Vec<u8>> = (0..4).map(|i| payload(i, 0, 64)).collect();
    for r in writer.put_many(&items(&ks[..2], &data[..2])) {
        r.unwrap();
    }
    assert_eq!(
        reader.known_many(&ks),
        [false; 4],
        "nothing known before a lookup"
    );
    assert_eq!(reader.lookup_prefix(&ks).unwrap(), 2);
    assert_eq!(reader.known_many(&ks), [true, true, false, false]);
    let asked = reader.stats().tree_lookups;
    for r in writer.put_many(&items(&ks[2..], &data[2..])) {
        r.unwrap();
    }
    // From memory: the blocks found, then the one remembered absent; the tree is not asked.
    std::fs::remove_file(reader.path_of(&ks[1].hash)).unwrap();
    for _ in 0..3 {
        assert_eq!(reader.lookup_prefix(&ks).unwrap(), 2);
        let each: Vec<bool> = reader
            .lookup_many(&ks[..3])
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(each, [true, true, false]);
    }
    assert_eq!(
        reader.stats().tree_lookups,
        asked,
        "a lookup asked the tree"
    );
    // Told: the saved block is found, the deleted one forgotten.
    reader.recheck_many(&ks[2..3]).unwrap();
    assert_eq!(reader.lookup_prefix(&ks[2..]).unwrap(), 2);
    reader.recheck_many(&ks[1..2]).unwrap();
    assert_eq!(reader.lookup_prefix(&ks).unwrap(), 1);
}

/// The chain links that removal follows: a root with descendants offered below a new parent
/// is hung from it (removing the parent removes the whole chain), a block that has a parent
/// keeps it (removing another chain's block does not take it), a key put twice in one batch
/// holds the later item, and a repeated key offered after a declined parent counts as not
/// admitted, each time.
#[test]
fn chains_link_once_and_a_declined_repeat_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), "w");
    let ks = keys(&store, 8);
    let (a, b, c, x) = (&ks[0], &ks[1], &ks[2], &ks[3]);
    let put = |chain: &[&tierkv::BlockKey]| {
        let items: Vec<_> = chain
            .iter()
            .map(|k| ((*k).clone(), vec![1u8; 64]))
            .collect();
        for r in store.offer_many(&items) {
            r.unwrap();
        }
    };
    let held = |k: &tierkv::BlockKey| {
        store.contains_many(std::slice::from_ref(k))[0]
            .as_ref()
            .copied()
            .unwrap()
    };
    put(&[b, c]); // b a root with a child
    put(&[a, b]); // b hung below the new root a
    put(&[x, b]); // b has a parent: not moved below x
    assert!(
        store.remove_many(std::slice::from_ref(x))[0]
            .as_ref()
            .unwrap()
    );
    assert!(
        held(b) && held(c),
        "removing x took the chain it never held"
    );
    assert!(
        store.remove_many(std::slice::from_ref(a))[0]
            .as_ref()
            .unwrap()
    );
    assert!(
        !held(b) && !held(c),
        "removing a left the chain hung below it"
    );

    // A key put twice in one batch: the later item replaces the earlier, as a put of a present
    // key does; in shared mode, where a present block is never rewritten, the first stays.
    for r in store.put_many(&[
        (ks[5].clone(), vec![1u8; 64]),
        (ks[5].clone(), vec![2u8; 64]),
    ]) {
        r.unwrap();
    }
    let mut buf = vec![0u8; 64];
    assert_eq!(store.get(&ks[5], &mut buf).unwrap(), Lookup::Hit(64));
    let want = if is_shared() { 1u8 } else { 2u8 };
    assert_eq!(buf, vec![want; 64], "the wrong item of a repeated key won");

    let before = store.stats().not_admitted;
    let absent = &ks[7];
    for r in store.offer_many_after(
        Some(absent),
        &[(ks[4].clone(), vec![1u8; 8]), (ks[4].clone(), vec![1u8; 8])],
    ) {
        r.unwrap();
    }
    assert_eq!(store.stats().not_admitted - before, 2);
}

/// `clear()` also forgets what the index held of files gone behind its back (an exclusive
/// store answers lookups from its index alone), and a store's close writes its last counters,
/// marked closed.
#[test]
fn clear_forgets_stale_entries_and_close_marks_the_stats_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("w"),
        tierkv::StoreConfig::new().with_stats_interval(Some(std::time::Duration::from_secs(3600))),
    )
    .unwrap();
    let ks = keys(&store, 2);
    for r in store.put_many(&items(&ks, &[payload(0, 0, 64), payload(1, 0, 64)])) {
        r.unwrap();
    }
    std::fs::remove_file(store.path_of(&ks[0].hash)).unwrap();
    assert_eq!(store.known_many(&ks), [true, true]);
    assert_eq!(store.clear().unwrap(), 1, "one file was left to remove");
    assert_eq!(store.known_many(&ks), [false, false]);
    let stats = store.dir().join("STATS.json");
    drop(store);
    let text = std::fs::read_to_string(&stats).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["open"], false, "{text}");
}
