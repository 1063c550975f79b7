//! tierkv-stat against trees with known contents, and against a running store.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const STAT: &str = env!("CARGO_BIN_EXE_tierkv-stat");
const BENCH: &str = env!("CARGO_BIN_EXE_tierkv-bench");

/// Every path in the tree; for files also size, mtime and atime (to show a scan changes
/// nothing). Directory access times are left out: listing a directory moves them.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, i64, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
                out.insert(e.path(), (0, m.mtime(), 0, 0));
            } else {
                out.insert(e.path(), (m.size(), m.mtime(), m.atime(), m.atime_nsec()));
            }
        }
    }
    out
}

fn stat_json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(STAT)
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v)
}

struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    flipped: PathBuf,
    truncated: PathBuf,
    temp: PathBuf,
    good_bytes_a: u64,
}

/// Worker a: 10 blocks of 1,000 bytes and 5 of 10,000; one of them with a flipped payload
/// byte, one truncated; plus a temp file, a foreign file and a symlink. Worker b: 3 blocks.
fn build_tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cache");
    let a = open(&root, "a");
    let ks = keys(&a, 15);
    for (i, k) in ks.iter().enumerate() {
        let len = if i < 10 { 1000 } else { 10_000 };
        a.put(k, &payload(i as u64, 0, len)).unwrap();
    }
    let b = open(&root, "b");
    for k in keys(&b, 3) {
        b.put(&k, &payload(7, 1, 500)).unwrap();
    }
    let flipped = a.path_of(&ks[11].hash);
    let truncated = a.path_of(&ks[12].hash);
    let leaf = a.path_of(&ks[0].hash).parent().unwrap().to_path_buf();
    drop((a, b));
    let mut bytes = std::fs::read(&flipped).unwrap();
    bytes[4096 + 17] ^= 0xFF;
    std::fs::write(&flipped, bytes).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap()
        .set_len(5000)
        .unwrap();
    let temp = leaf.join(format!(".tmp.{}.4242.7", hash(99).to_hex()));
    std::fs::write(&temp, b"half").unwrap();
    std::fs::write(leaf.join("notes.txt"), b"not ours").unwrap();
    std::os::unix::fs::symlink("/etc/hostname", leaf.join("link")).unwrap();
    let good_bytes_a = files_under(&root.join("v1/a"))
        .into_iter()
        .filter(|p| {
            tierkv::BlockHash::from_hex(p.file_name().unwrap().to_str().unwrap()).is_ok()
                && *p != truncated
        })
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum();
    Tree {
        _dir: dir,
        root,
        flipped,
        truncated,
        temp,
        good_bytes_a,
    }
}

#[test]
fn reports_exact_figures_and_changes_nothing() {
    let t = build_tree();
    let before = snapshot(&t.root);
    let (code, r) = stat_json(&[t.root.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(
        snapshot(&t.root),
        before,
        "a scan must not modify the tree, not even file access times"
    );
    assert_eq!(r["format_version"], 1);
    assert_eq!(r["files"], 14 + 3);
    assert_eq!(r["temp"], 1);
    assert_eq!(r["foreign"], 1);
    assert_eq!(r["symlinks"], 1);
    assert_eq!(r["bad_header"], 1);
    let a = &r["workers"]["a"];
    assert_eq!(a["files"], 14);
    assert_eq!(a["bytes"], t.good_bytes_a);
    assert_eq!(a["payload_bytes"], 10 * 1000 + 4 * 10_000);
    assert_eq!(a["bad_header"][0], t.truncated.to_str().unwrap());
    let laid = std::fs::read_to_string(t.root.join("v1/a/LAYOUT")).unwrap();
    let laid = tierkv::Layout::from_file_text(&laid).unwrap();
    assert_eq!(a["layout"], laid.to_string());
    let sizes: Vec<(String, u64)> = a["block_sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["bucket"].as_str().unwrap().to_string(),
                b["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sizes,
        vec![
            ("<=4KiB".into(), 10),
            ("<=8KiB".into(), 0),
            ("<=16KiB".into(), 4)
        ]
    );
    assert_eq!(a["ages"][0]["bucket"], "<1m");
    assert_eq!(a["ages"][0]["count"], 14);
    let sb = &a["shard_balance"];
    let leaves = sb["leaf_dirs"].as_u64().unwrap();
    if laid.leaf_dirs().is_empty() {
        assert!((1..=15).contains(&leaves));
    } else {
        // A small tree's leaves are all made when the store opens.
        assert_eq!(leaves, laid.leaves());
    }
    let hist_total: u64 = sb["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(hist_total, leaves);
    assert_eq!(r["workers"]["b"]["files"], 3);
    // One worker only.
    let (_, r) = stat_json(&[t.root.to_str().unwrap(), "--worker", "b"]);
    assert_eq!(r["files"], 3);
    assert!(r["workers"].get("a").is_none());
    // Text output names the problems.
    let out = Command::new(STAT).arg(&t.root).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("worker a: 14 files"), "{text}");
    assert!(text.contains(t.truncated.to_str().unwrap()), "{text}");
    // No checksum was checked: the corrupt count is not known, not 0.
    assert!(
        text.contains("bad header 1, corrupt not verified"),
        "{text}"
    );
    assert!(!text.contains("corrupt 0"), "{text}");
    // Warnings to a file (not a terminal) carry no colour codes.
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("bad block file"), "{err}");
    assert!(!err.contains('\x1b'), "colour codes in {err:?}");
}

#[test]
fn verify_finds_corrupt_blocks_and_repair_removes_them() {
    let t = build_tree();
    let (code, r) = stat_json(&[t.root.to_str().unwrap(), "--verify"]);
    assert_eq!(code, Some(1), "corrupt files make --verify fail");
    assert_eq!(r["corrupt"], 1);
    assert_eq!(r["workers"]["a"]["corrupt"][0], t.flipped.to_str().unwrap());
    assert_eq!(r["workers"]["a"]["files"], 13);
    assert!(
        t.flipped.exists() && t.temp.exists(),
        "--verify alone changes nothing"
    );
    let out = Command::new(STAT)
        .arg(&t.root)
        .arg("--verify")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("bad header 1, corrupt 1"), "{text}");

    let (code, r) = stat_json(&[t.root.to_str().unwrap(), "--verify", "--repair"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        r["workers"]["a"]["removed"], 3,
        "corrupt, truncated and the stale temp file"
    );
    assert!(!t.flipped.exists() && !t.truncated.exists() && !t.temp.exists());
    let (code, r) = stat_json(&[t.root.to_str().unwrap(), "--verify"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (
            r["corrupt"].as_u64(),
            r["bad_header"].as_u64(),
            r["temp"].as_u64()
        ),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(
        (r["foreign"].as_u64(), r["symlinks"].as_u64()),
        (Some(1), Some(1)),
        "not ours: left alone"
    );
    // The store agrees: every remaining block reads back.
    let a = open(&t.root, "a");
    assert_eq!(a.stats().blocks_at_open, 13);
}

#[test]
fn live_counters_of_a_running_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut child = Command::new(BENCH)
        .args([
            "--dir",
            d,
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--nblocks",
            "200",
            "--loops",
            "100000000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _child = KillOnDrop(child_take(&mut child));
    // Wait for the first snapshot with hits.
    let mut hits = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(100));
        let out = Command::new(STAT)
            .args([d, "--live", "--json"])
            .output()
            .unwrap();
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            assert_eq!(v["0"]["open"], true);
            hits = v["0"]["stats"]["hits"].as_u64().unwrap_or(0);
            if hits > 0 {
                break;
            }
        }
    }
    assert!(hits > 0, "the running store published its counters");

    let out = Command::new(STAT)
        .args([d, "--live", "--format", "prometheus"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("# TYPE tierkv_hits_total counter"), "{text}");
    assert!(text.contains("tierkv_up{worker=\"0\"} 1"), "{text}");
    // The store is unbounded: no capacity gauge (0 would read as a full store).
    assert!(!text.contains("tierkv_capacity_"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("tierkv_hits_total{worker=\"0\"}"))
        .unwrap();
    assert!(
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0
    );

    let out = Command::new(STAT)
        .args([d, "--watch", "1s", "--iterations", "3"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("worker 0: running").count(), 3, "{text}");
    assert!(text.contains("rates/s: hits"), "{text}");
}

fn child_take(c: &mut std::process::Child) -> std::process::Child {
    // Move the child out (Command::spawn gives it by value; keep the borrow checker simple).
    std::mem::replace(c, Command::new("true").spawn().unwrap())
}

#[test]
fn bad_usage_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec![dir.path().to_str().unwrap().to_string()],
        vec!["/nonexistent/tierkv".into()],
        vec![
            dir.path().to_str().unwrap().into(),
            "--watch".into(),
            "soon".into(),
        ],
        vec![
            dir.path().to_str().unwrap().into(),
            "--live".into(),
            "--verify".into(),
        ],
    ] {
        let out = Command::new(STAT).args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn live_counters_include_the_offloader() {
    use tierkv::{DropReason, OffloadConfig, Offloader};
    let dir = tempfile::tempdir().unwrap();
    let store =
        tierkv::Store::open(dir.path(), worker("0"), tierkv::StoreConfig::default()).unwrap();
    let off = Offloader::new(store.clone(), OffloadConfig::new().with_max_blocks(1000)).unwrap();
    let keys = chain_keys(&store, 7, 5);
    let blocks: Vec<_> = keys.iter().map(|k| (k.clone(), vec![3u8; 4096])).collect();
    off.offer(None, blocks.clone());
    off.flush();
    let again = off.offer_tracked(None, blocks).wait();
    assert!(
        again
            .iter()
            .all(|o| o.drop_reason() == Some(DropReason::AlreadyStored))
    );
    drop(off);
    drop(store); // the last STATS.json, with the offloader's final counters
    let d = dir.path().to_str().unwrap();
    let out = Command::new(STAT).args([d, "--live"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("offload (all): offered 10 queued 5 written 5"),
        "{text}"
    );
    assert!(text.contains("deduped 5 stored + 0 queued"), "{text}");
    assert!(text.contains("offload queue wait us: p50"), "{text}");
    let out = Command::new(STAT)
        .args([d, "--live", "--format", "prometheus"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("# TYPE tierkv_offload_written_total counter"),
        "{text}"
    );
    assert!(
        text.contains("tierkv_offload_written_total{worker=\"0\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("tierkv_offload_deduped_present_total{worker=\"0\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("tierkv_offload_in_flight_blocks{worker=\"0\"} 0"),
        "{text}"
    );
    let out = Command::new(STAT)
        .args([d, "--live", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["0"]["stats"]["offload"]["written"], 5);
    assert_eq!(v["0"]["stats"]["offload"]["filter"], "all");
}

/// A block file under a writer's lease (a store reusing it: `StoreConfig::with_reuse_evicted`)
/// is as good as gone to a scan: tierkv-stat's non-blocking open meets `EAGAIN`, and the scan
/// goes on without an error.
#[test]
fn a_file_under_a_reusing_writers_lease_is_skipped_as_gone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cache");
    let store = tierkv::Store::open(
        &root,
        tierkv::WorkerId::new("a").unwrap(),
        tierkv::StoreConfig::new().with_stats_interval(None),
    )
    .unwrap();
    let ks: Vec<_> = (0..3u32)
        .map(|i| store.key(tierkv::BlockHash::chain(None, &[i, 7])))
        .collect();
    for k in &ks {
        store.put(k, &[5u8; 1000]).unwrap();
    }
    let rel = store
        .path_of(&ks[0].hash)
        .strip_prefix(store.dir())
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    drop(store);
    let ns = tierkv::testing::BlockDir::open(&root, "a", false).unwrap();
    let tierkv::testing::Opened::File(fd, _) =
        ns.open_file(&rel, rustix::fs::OFlags::RDWR).unwrap()
    else {
        panic!("{rel}: not a regular file");
    };
    assert!(ns.take_lease(std::os::fd::AsFd::as_fd(&fd)).unwrap());
    let (code, r) = stat_json(&[root.to_str().unwrap()]);
    ns.release_lease(std::os::fd::AsFd::as_fd(&fd)).unwrap();
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["workers"]["a"]["files"], 2, "{r}");
}

/// Names taken from a STATS file reach the terminal as text: an escape sequence in the policy
/// or host is written as `\u{1b}`, never as the control character.
#[test]
fn live_text_output_escapes_control_characters_from_stats_files() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        tierkv::Store::open(dir.path(), worker("0"), tierkv::StoreConfig::default()).unwrap();
    drop(store); // writes the final STATS.json
    let stats = dir.path().join("v1/0/STATS.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    v["policy"] = "lru\u{1b}[2J\u{1b}]0;owned\u{7}\r".into();
    std::fs::write(&stats, serde_json::to_vec(&v).unwrap()).unwrap();
    let d = dir.path().to_str().unwrap();
    let out = Command::new(STAT).args([d, "--live"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'),
        "{text:?}"
    );
    assert!(text.contains("policy lru\\u{1b}[2J"), "{text}");
}

/// Repair removes the stats file of a shared store that is gone, as a store's open-time sweep
/// does (one walker, one rule), and keeps that of a live one.
#[test]
fn repair_removes_the_stats_file_of_a_shared_store_that_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), "a"));
    let node = tierkv::testing::node_id();
    let mut exited = Command::new("true").spawn().unwrap();
    let dead_pid = exited.id();
    exited.wait().unwrap();
    let worker = dir.path().join("v1/a");
    let dead = worker.join(tierkv::testing::instance_stats_name(node, dead_pid));
    let live = worker.join(tierkv::testing::instance_stats_name(
        node,
        std::process::id(),
    ));
    for f in [&dead, &live] {
        std::fs::write(f, "{}").unwrap();
    }
    let root = dir.path().to_str().unwrap();
    let (code, _) = stat_json(&[root, "--sharing", "shared"]);
    assert_eq!(code, Some(0));
    assert!(dead.exists(), "without --repair nothing is removed");
    let (code, r) = stat_json(&[root, "--repair", "--sharing", "shared"]);
    assert_eq!(code, Some(0), "{r}");
    assert!(!dead.exists(), "the gone store's stats file stays: {r}");
    assert!(live.exists(), "a live store's stats file was removed");
    assert_eq!(r["workers"]["a"]["removed"], 1, "{r}");
}

/// A repair tells the worker's event journal the blocks it removes (docs/events.md: cause 6,
/// "repair"), so that a router tailing it forgets them; a worker without a journal gets none.
#[test]
fn repair_tells_the_event_journal_what_it_removed() {
    let t = build_tree();
    // Worker a gets a journal: a store opened with events makes it.
    let a = tierkv::Store::open(&t.root, worker("a"), quiet().with_events(true)).unwrap();
    drop(a);
    let (code, r) = stat_json(&[t.root.to_str().unwrap(), "--repair"]);
    assert_eq!(code, Some(0), "{r}");
    let (next, _, records) = common::oracle::read_journal(&t.root.join("v1/a/EVENTS"));
    let told: Vec<(u8, u8, String)> = records
        .iter()
        .map(|r| (r.kind, r.cause, r.hex.clone()))
        .collect();
    let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
    let mut want = vec![(2, 6, name(&t.flipped)), (2, 6, name(&t.truncated))];
    let mut got = told.clone();
    want.sort();
    got.sort();
    assert_eq!(
        (next, got),
        (2, want),
        "the two bad blocks, and not the temp file"
    );
    assert!(!t.root.join("v1/b/EVENTS").exists());
}
