//! Shared mode on one node (docs/shared.md): many stores on one worker directory, in one
//! process and in several (tierkv-bench `--instances`), with content verification, SIGKILL
//! and a shared capacity sampled by tierkv-stat while they run. The same scenarios across two
//! nodes of a real distributed filesystem are tests/shared_dfs.rs.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{check_all_blocks, hash, payload, temp_files_under, worker};
use tierkv::{Error, Lookup, Sharing, Store, StoreConfig};

const BENCH: &str = env!("CARGO_BIN_EXE_tierkv-bench");
const STAT: &str = env!("CARGO_BIN_EXE_tierkv-stat");

fn shared() -> StoreConfig {
    StoreConfig::new()
        .with_sharing(Sharing::Shared)
        .with_stats_interval(None)
}

fn open_shared(root: &Path, cfg: StoreConfig) -> Store {
    Store::open(root, worker("0"), cfg).unwrap()
}

fn get(store: &Store, i: u64, len: usize) -> Lookup {
    let mut buf = vec![0u8; len];
    let r = store.get(&store.key(hash(i)), &mut buf).unwrap();
    if let Lookup::Hit(n) = r {
        assert_eq!(buf[..n], payload(i, 0, len)[..], "block {i}: wrong bytes");
    }
    r
}

/// The worker directory's usage ledger: (bytes, files).
fn ledger(root: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(root.join("v1/0/USAGE")).unwrap();
    let field = |k: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("bytes"), field("files"))
}

/// Bytes (`st_blocks`) and count of the block files under the worker, read from the tree.
fn usage_on_disk(root: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut b = 0;
    let mut n = 0;
    for p in common::files_under(&root.join("v1/0")) {
        let name = p.file_name().unwrap().to_str().unwrap();
        if name.len() == 64 {
            b += std::fs::metadata(&p).unwrap().blocks() * 512;
            n += 1;
        }
    }
    (b, n)
}

#[test]
fn a_block_put_by_one_store_is_a_hit_for_another() {
    let root = tempfile::tempdir().unwrap();
    let a = open_shared(root.path(), shared());
    let b = open_shared(root.path(), shared());
    let len = 10_000;
    for i in 0..200 {
        a.put(&a.key(hash(i)), &payload(i, 0, len)).unwrap();
    }
    for i in 0..200 {
        assert_eq!(get(&b, i, len), Lookup::Hit(len), "block {i}");
    }
    let keys: Vec<_> = (0..210).map(|i| b.key(hash(i))).collect();
    assert_eq!(b.contains_prefix(&keys).unwrap(), 200);
    let s = b.stats();
    assert_eq!(s.tree_hits, 200, "found in the tree, not in b's index");
    assert_eq!(s.hits, 200);
    // Once learned, a block is served from b's index (no new tree lookup).
    let before = b.stats().tree_lookups;
    assert_eq!(get(&b, 7, len), Lookup::Hit(len));
    assert_eq!(b.stats().tree_lookups, before);
    drop((a, b));
    assert_eq!(check_all_blocks(root.path()), 200);
}

#[test]
fn exclusive_and_shared_stores_exclude_each_other() {
    let root = tempfile::tempdir().unwrap();
    let s = open_shared(root.path(), shared());
    let e = Store::open(
        root.path(),
        worker("0"),
        StoreConfig::new().with_stats_interval(None),
    )
    .unwrap_err();
    match e {
        Error::WorkerBusy { holder, .. } => {
            assert!(holder.contains("shared mode"), "{holder}")
        }
        e => panic!("an exclusive open beside a shared store: {e}"),
    }
    drop(s);
    let x = Store::open(
        root.path(),
        worker("0"),
        StoreConfig::new().with_stats_interval(None),
    )
    .unwrap();
    let t = Instant::now();
    let e = Store::open(root.path(), worker("0"), shared()).unwrap_err();
    assert!(matches!(e, Error::WorkerBusy { .. }), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "a shared open beside an exclusive store fails, it does not wait out the shared-open wait"
    );
    drop(x);
}

#[test]
fn racing_puts_of_one_key_leave_one_complete_file() {
    let root = tempfile::tempdir().unwrap();
    let stores: Vec<Store> = (0..3).map(|_| open_shared(root.path(), shared())).collect();
    let len = 64 << 10;
    let n = 40u64;
    std::thread::scope(|s| {
        for st in &stores {
            for t in 0..3u64 {
                s.spawn(move || {
                    for r in 0..3u64 {
                        for i in 0..n {
                            let i = (i + t * 7 + r * 13) % n;
                            st.put(&st.key(hash(i)), &payload(i, 0, len)).unwrap();
                            assert_ne!(get(st, i, len), Lookup::Miss, "just put");
                        }
                    }
                });
            }
        }
    });
    let others: u64 = stores.iter().map(|s| s.stats().published_by_others).sum();
    assert!(others > 0, "the same keys were put by three stores at once");
    for i in 0..n {
        for s in &stores {
            assert_eq!(get(s, i, len), Lookup::Hit(len));
        }
    }
    drop(stores);
    assert_eq!(
        check_all_blocks(root.path()),
        n as usize,
        "one file per key"
    );
    assert!(temp_files_under(root.path()).is_empty());
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
}

#[test]
fn negative_answers_last_at_most_the_negative_ttl() {
    let root = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(600);
    let a = open_shared(root.path(), shared());
    let b = open_shared(root.path(), shared().with_negative_ttl(ttl));
    let c = open_shared(root.path(), shared().with_negative_ttl(Duration::ZERO));
    let len = 5000;
    assert_eq!(get(&b, 1, len), Lookup::Miss);
    assert_eq!(get(&c, 1, len), Lookup::Miss);
    let asked = b.stats().tree_lookups;
    let t = Instant::now();
    a.put(&a.key(hash(1)), &payload(1, 0, len)).unwrap();
    // Without negative caching the new block is a hit at once.
    assert_eq!(get(&c, 1, len), Lookup::Hit(len));
    // b remembers the miss, without asking the tree again...
    let early = get(&b, 1, len);
    if t.elapsed() < ttl {
        assert_eq!(early, Lookup::Miss, "within the negative TTL");
        assert_eq!(b.stats().tree_lookups, asked);
        assert!(b.stats().negative_hits >= 1);
    }
    // ...and no longer than the TTL.
    std::thread::sleep(ttl.saturating_sub(t.elapsed()) + Duration::from_millis(20));
    assert_eq!(get(&b, 1, len), Lookup::Hit(len));
    assert_eq!(b.stats().tree_lookups, asked + 1);
}

#[test]
fn a_block_removed_by_another_store_is_a_miss_never_an_error() {
    let root = tempfile::tempdir().unwrap();
    let a = open_shared(root.path(), shared());
    let b = open_shared(root.path(), shared());
    let len = 20_000;
    for i in 0..20 {
        a.put(&a.key(hash(i)), &payload(i, 0, len)).unwrap();
        // b opens the file and keeps its descriptor in its open-file cache.
        assert_eq!(get(&b, i, len), Lookup::Hit(len));
    }
    for i in 0..20 {
        let removed = a.remove_many(&[a.key(hash(i))]);
        assert!(matches!(removed[..], [Ok(true)]), "{removed:?}");
        assert_eq!(get(&b, i, len), Lookup::Miss, "block {i}: gone, so a miss");
    }
    assert_eq!(b.stats().read_errors, 0);
    drop((a, b));
    assert_eq!(
        ledger(root.path()),
        (0, 0),
        "removed blocks leave the ledger"
    );
}

#[test]
fn the_ledger_counts_what_the_stores_hold_and_a_lone_opener_recounts_it() {
    let root = tempfile::tempdir().unwrap();
    let len = 30_000;
    {
        let a = open_shared(root.path(), shared());
        let b = open_shared(root.path(), shared());
        for i in 0..30 {
            let s = if i % 2 == 0 { &a } else { &b };
            s.put(&s.key(hash(i)), &payload(i, 0, len)).unwrap();
        }
        // Both put these: one file each, counted once.
        for i in 0..10 {
            a.put(&a.key(hash(i)), &payload(i, 0, len)).unwrap();
            b.put(&b.key(hash(i)), &payload(i, 0, len)).unwrap();
        }
    }
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
    assert_eq!(usage_on_disk(root.path()).1, 30);
    // A ledger that lies (a crash between a reservation and its correction, a hand edit) is
    // recounted by the next store that finds itself alone on the worker.
    std::fs::write(root.path().join("v1/0/USAGE"), "bytes=1\nfiles=999\n").unwrap();
    drop(open_shared(root.path(), shared()));
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
}

#[test]
fn a_shared_capacity_holds_across_stores_in_one_process() {
    let root = tempfile::tempdir().unwrap();
    let len = 16 << 10;
    let cap_files = 40u64;
    let cfg = shared().with_capacity_files(cap_files);
    let stores: Vec<Store> = (0..3)
        .map(|_| open_shared(root.path(), cfg.clone()))
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut max_seen = 0;
    std::thread::scope(|s| {
        for (k, st) in stores.iter().enumerate() {
            let stop = &stop;
            s.spawn(move || {
                let mut i = k as u64 * 1_000_000;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Chains of 4 blocks of this store's own.
                    let keys: Vec<_> = (i..i + 4).map(|j| st.key(hash(j))).collect();
                    let datas: Vec<_> = (i..i + 4).map(|j| payload(j, 0, len)).collect();
                    for r in st.put_many(&common::items(&keys, &datas)) {
                        r.unwrap();
                    }
                    assert_eq!(get(st, i, len), Lookup::Hit(len), "its own new chain");
                    i += 4;
                }
            });
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            let (_, files) = ledger(root.path());
            assert!(files <= cap_files, "the ledger holds {files} > {cap_files}");
            let on_disk = common::files_under(&root.path().join("v1/0"))
                .iter()
                .filter(|p| {
                    let n = p.file_name().unwrap().to_str().unwrap();
                    n.len() == 64 || n.starts_with(".tmp.")
                })
                .count() as u64;
            max_seen = max_seen.max(on_disk);
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // A listing is not a snapshot: a file made after one name was read and one removed
    // before may both count. Each store has at most one batch (4 files) in flight.
    assert!(
        max_seen <= cap_files + 3 * 4,
        "{max_seen} block and temp files seen, capacity {cap_files}"
    );
    for s in &stores {
        assert!(s.stats().evictions > 0, "each store evicted to make room");
    }
    drop(stores);
    let (_, files) = usage_on_disk(root.path());
    assert!(files <= cap_files);
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
}

/// A temp file name of the block `hash(i)` owned by `pid` on `node`.
fn temp_name(i: u64, node: &str, pid: u32) -> String {
    format!(".tmp.{}.{node}.{pid}.0", hash(i).to_hex())
}

fn plant(root: &Path, i: u64, name: &str, age: Duration) -> std::path::PathBuf {
    // The layout the store recorded (a new store's depends on its size).
    let text = std::fs::read_to_string(root.join("v1/0/LAYOUT")).unwrap();
    let store_layout = tierkv::Layout::from_file_text(&text).unwrap();
    let rel = store_layout.rel_path(&hash(i));
    let dir = root.join("v1/0").join(rel.dir());
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(4096).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
    p
}

#[test]
fn temp_files_are_swept_only_when_their_owner_is_gone() {
    let root = tempfile::tempdir().unwrap();
    let me = format!("{:016x}", tierkv::testing::node_id());
    let other = if me == "00000000000000aa" {
        "00000000000000bb".to_string()
    } else {
        "00000000000000aa".to_string()
    };
    // A process that is gone, and one that is alive.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let mut alive = Command::new("sleep").arg("60").spawn().unwrap();
    let hour = Duration::from_secs(3600);
    let first = open_shared(root.path(), shared());
    for i in 10..14 {
        first
            .put(&first.key(hash(i)), &payload(i, 0, 4096))
            .unwrap();
    }
    assert_eq!(first.stats().shared_files, Some(4));
    let lease = Duration::from_secs(600);
    let gone_here = plant(root.path(), 1, &temp_name(1, &me, dead_pid), Duration::ZERO);
    let alive_here = plant(
        root.path(),
        2,
        &temp_name(2, &me, alive.id()),
        Duration::ZERO,
    );
    let fresh_there = plant(root.path(), 3, &temp_name(3, &other, 1), Duration::ZERO);
    let old_there = plant(root.path(), 4, &temp_name(4, &other, 1), hour);
    let old_alive_here = plant(root.path(), 5, &temp_name(5, &me, alive.id()), hour);
    // Another store opens beside `first`: it sweeps only what is abandoned.
    let second = open_shared(root.path(), shared().with_temp_lease(lease));
    assert!(
        !gone_here.exists(),
        "this node's temp file of a dead process"
    );
    assert!(
        alive_here.exists(),
        "this node's temp file of a live process stays"
    );
    assert!(fresh_there.exists(), "another node's fresh temp file stays");
    assert!(
        !old_there.exists(),
        "another node's temp file past the lease"
    );
    // A live process of this node may be stopped or slow: its file stays at any age.
    assert!(
        old_alive_here.exists(),
        "this node's temp file of a live process stays past the lease"
    );
    assert_eq!(second.stats().temp_swept, 2);
    // The ledger gets back the room of the dead writer's file alone (the test planted it
    // unreserved: one less than the 4 blocks). A writer of another node may be alive (its
    // failed put returns its own reservation), so its aged file's room is not returned.
    assert_eq!(second.stats().shared_files, Some(3));
    // tierkv-stat --repair beside running shared stores follows the same rule.
    let dead_again = plant(root.path(), 6, &temp_name(6, &me, dead_pid), Duration::ZERO);
    let out = Command::new(STAT)
        .args(["--repair", "--sharing", "shared"])
        .arg(root.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dead_again.exists() && alive_here.exists() && fresh_there.exists());
    // An exclusive repair refuses a worker that shared stores use.
    let out = Command::new(STAT)
        .arg("--repair")
        .arg(root.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(alive_here.exists());
    drop((first, second));
    // Alone on the worker, a store knows every temp file is abandoned.
    drop(open_shared(root.path(), shared()));
    assert!(!alive_here.exists() && !fresh_there.exists());
    alive.kill().unwrap();
    alive.wait().unwrap();
}

/// Runs `tierkv-bench --instances N` with `args`, checking every byte read; its JSON.
fn instances(root: &Path, n: usize, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BENCH)
        .arg("--dir")
        .arg(root)
        .args([
            "--instances",
            &n.to_string(),
            "--verify-data",
            "--output-format",
            "json",
        ])
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "tierkv-bench --instances failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn processes_share_a_worker_with_every_byte_checked() {
    let root = tempfile::tempdir().unwrap();
    // Three processes write one third of the blocks each, then all read all of them.
    let doc = instances(
        root.path(),
        3,
        &["--rw", "write", "--bs", "64k", "--nblocks", "300"],
    );
    assert_eq!(doc["totals"]["errors"], 0);
    let doc = instances(
        root.path(),
        3,
        &[
            "--rw",
            "read",
            "--bs",
            "64k",
            "--nblocks",
            "300",
            "--no-layout",
        ],
    );
    let t = &doc["totals"];
    assert_eq!(t["hits"], 900, "{t}");
    assert_eq!(t["misses"], 0);
    assert_eq!(t["errors"], 0);
    assert_eq!(t["verify_errors"], 0);
    // Then they all read and write at once (the same keys: racing puts) for a while.
    let doc = instances(
        root.path(),
        3,
        &[
            "--rw",
            "randrw",
            "--bs",
            "64k",
            "--nblocks",
            "400",
            "--runtime",
            "3s",
            "--no-layout",
        ],
    );
    let t = &doc["totals"];
    assert_eq!(t["errors"], 0, "{t}");
    assert_eq!(t["verify_errors"], 0);
    assert!(t["hits"].as_u64().unwrap() > 0);
    assert!(t["published_by_others"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(check_all_blocks(root.path()), 400);
}

#[test]
fn a_capacity_shared_by_three_processes_holds_while_they_run() {
    let root = tempfile::tempdir().unwrap();
    let cap = 60u64;
    let mut bench = Command::new(BENCH)
        .arg("--dir")
        .arg(root.path())
        .args([
            "--instances",
            "3",
            "--verify-data",
            "--output-format",
            "json",
        ])
        .args([
            "--rw",
            "randrw",
            "--bs",
            "16k",
            "--nblocks",
            "600",
            "--batch",
            "4",
        ])
        .args([
            "--capacity-blocks",
            &cap.to_string(),
            "--runtime",
            "6s",
            "--no-layout",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Sample with tierkv-stat while they run.
    let mut samples = 0;
    let mut max_files = 0;
    let mut saw_all = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) && bench.try_wait().unwrap().is_none() {
        let out = Command::new(STAT)
            .arg("--json")
            .arg(root.path())
            .output()
            .unwrap();
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            let w = &doc["workers"]["0"];
            if let Some(l) = w["ledger"]["files"].as_u64() {
                assert!(l <= cap, "ledger {l} > capacity {cap}");
                let seen = w["files"].as_u64().unwrap() + w["temp"].as_u64().unwrap();
                max_files = max_files.max(seen);
                samples += 1;
            }
            // tierkv-stat names the mode and the three running stores (host, pid).
            let running: Vec<&serde_json::Value> = w["instances"]
                .as_array()
                .map(|v| v.iter().filter(|i| i["live"] == true).collect())
                .unwrap_or_default();
            if running.len() == 3 {
                assert_eq!(w["sharing"], "shared", "{w}");
                assert!(running.iter().all(|i| i["sharing"] == "shared"
                    && i["pid"].as_u64().is_some()
                    && !i["host"].as_str().unwrap().is_empty()));
                saw_all += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        saw_all > 0,
        "tierkv-stat never listed the three running stores"
    );
    let out = bench.wait_with_output().unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(samples >= 5, "{samples} samples");
    // A scan is not a snapshot (see a_shared_capacity_holds_across_stores_in_one_process):
    // at most one batch of 4 per instance beyond the bound.
    assert!(
        max_files <= cap + 3 * 4,
        "{max_files} files and temp files, capacity {cap}"
    );
    let t = &doc["totals"];
    assert_eq!(t["errors"], 0, "{t}");
    assert_eq!(t["verify_errors"], 0);
    for i in doc["instances"].as_array().unwrap() {
        assert!(
            i["result"]["hits"].as_u64().unwrap() > 0,
            "every instance hits: {i}"
        );
    }
    assert!(usage_on_disk(root.path()).1 <= cap);
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
}

#[test]
fn sigkill_of_a_shared_writer_never_exposes_a_partial_block() {
    let root = tempfile::tempdir().unwrap();
    let reader = open_shared(root.path(), shared());
    // This store's own temp file, as of a put in flight: never swept while it runs.
    let mine = plant(
        root.path(),
        9_999,
        &temp_name(
            9_999,
            &format!("{:016x}", tierkv::testing::node_id()),
            std::process::id(),
        ),
        Duration::ZERO,
    );
    let mut rng = 0x9e37_79b9u64;
    for round in 0..6 {
        let mut w = Command::new(BENCH)
            .arg("--dir")
            .arg(root.path())
            .args(["--sharing", "shared", "--rw", "randwrite", "--bs", "256k"])
            .args([
                "--nblocks",
                "200",
                "--runtime",
                "30s",
                "--batch",
                "8",
                "--progress",
                "never",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(300 + rng % 700));
        // The reader, meanwhile: every block it finds is whole.
        let keys: Vec<_> = (0..200).map(|i| reader.key(bench_hash(i))).collect();
        let mut bufs = vec![vec![0u8; 256 << 10]; keys.len()];
        for r in reader.get_many(&keys, &mut bufs) {
            r.unwrap();
        }
        w.kill().unwrap();
        w.wait().unwrap();
        assert_eq!(
            reader.stats().corrupt,
            0,
            "round {round}: a torn block was read"
        );
    }
    // The killed writers' temp files (a dead process of this node) go at the next open;
    // the running store's stays.
    drop(open_shared(root.path(), shared()));
    let left: Vec<_> = temp_files_under(root.path());
    assert_eq!(
        left,
        vec![mine.clone()],
        "only the live store's temp file is left"
    );
    check_all_blocks(root.path());
    drop(reader);
}

/// The hash tierkv-bench gives its block `i` of worker 0.
fn bench_hash(i: u64) -> tierkv::BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(b"tierkv-bench.v1");
    h.update(b"0");
    h.update(&[0]);
    h.update(&i.to_le_bytes());
    tierkv::BlockHash(*h.finalize().as_bytes())
}

#[test]
fn what_the_shared_capacity_cannot_hold_is_declined_at_the_chain_tail() {
    let root = tempfile::tempdir().unwrap();
    let len = 8 << 10;
    let cfg = shared().with_capacity_files(10);
    let a = open_shared(root.path(), cfg.clone());
    let b = open_shared(root.path(), cfg);
    let chain = |s: &Store, seed: u32, n: usize| common::chain_keys(s, seed, n);
    let put = |s: &Store, keys: &[tierkv::BlockKey]| {
        let datas: Vec<_> = (0..keys.len()).map(|i| vec![i as u8; len]).collect();
        for r in s.put_many(&common::items(keys, &datas)) {
            r.unwrap();
        }
    };
    for i in 0..6 {
        a.put(&a.key(hash(i)), &payload(i, 0, len)).unwrap();
    }
    // b's index does not know a's blocks: it scans the tree for them and evicts them.
    let c1 = chain(&b, 1, 10);
    put(&b, &c1);
    assert_eq!(b.contains_prefix(&c1).unwrap(), 10);
    assert_eq!(ledger(root.path()).1, 10);
    // a makes room the same way (its first scan), evicting 6 of b's blocks.
    let c2 = chain(&a, 2, 6);
    put(&a, &c2);
    assert_eq!(ledger(root.path()).1, 10);
    // b evicts the 4 it still has; its next scan is not due for 30 s, and the 6 blocks of a
    // are not in its index: 4 of its 8 fit, the chain's tail is declined.
    let declined = b.stats().not_admitted;
    let c3 = chain(&b, 3, 8);
    put(&b, &c3);
    assert_eq!(
        b.contains_prefix(&c3).unwrap(),
        4,
        "the chain's first 4 blocks"
    );
    assert_eq!(b.stats().not_admitted - declined, 4, "its last 4 declined");
    assert_eq!(ledger(root.path()).1, 10, "never over the capacity");
    drop((a, b));
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
}

#[test]
fn shared_control_files_that_are_symlinks_or_fifos_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("target");
    std::fs::write(&target, b"keep").unwrap();
    for name in ["USAGE", "FLOCK"] {
        for kind in ["symlink", "fifo"] {
            let root = tempfile::tempdir().unwrap();
            let w = root.path().join("v1/0");
            std::fs::create_dir_all(&w).unwrap();
            let p = w.join(name);
            if kind == "symlink" {
                std::os::unix::fs::symlink(&target, &p).unwrap();
            } else {
                assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
            }
            // Never followed, never opened for data, nothing hangs: the open fails naming it.
            let e = Store::open(root.path(), worker("0"), shared()).unwrap_err();
            assert!(e.to_string().contains(name), "{name} as a {kind}: {e}");
            assert_eq!(std::fs::read(&target).unwrap(), b"keep");
            assert!(
                std::fs::symlink_metadata(&p).is_ok(),
                "{name} left in place"
            );
        }
    }
}

/// The ledger is checked against the tree it counts, not believed.
/// Rewritten to zero under two running stores (write access to the tree is enough), it let
/// the tree grow to 400 block files for a 256-file capacity; rewritten to the largest count,
/// every later put was declined and every block evicted. Now both are healed by a recount at
/// the next reservation: the bound holds, puts are admitted, and no block is evicted for a
/// count the tree never had.
#[test]
fn a_ledger_talked_down_or_up_under_running_stores_heals() {
    let root = tempfile::tempdir().unwrap();
    let cap = 64u64;
    // LRU: a block put once is admitted (the default policy may decline it).
    let cfg = shared()
        .with_capacity_files(cap)
        .with_policy(tierkv::PolicyKind::Lru);
    let stores = [
        open_shared(root.path(), cfg.clone()),
        open_shared(root.path(), cfg),
    ];
    let put = |i: u64| {
        let s = &stores[i as usize % 2];
        s.put(&s.key(hash(i)), &payload(i, 0, 4096)).unwrap();
    };
    (0..cap).for_each(put);
    assert_eq!(usage_on_disk(root.path()).1, cap);
    let usage = root.path().join("v1/0/USAGE");

    std::fs::write(&usage, format!("bytes={:020}\nfiles={:020}\n", 0, 0)).unwrap();
    for i in cap..cap + 100 {
        put(i);
        let files = usage_on_disk(root.path()).1;
        assert!(
            files <= cap,
            "{files} block files after put {i}, capacity {cap}"
        );
    }

    std::fs::write(&usage, format!("bytes={}\nfiles={}\n", u64::MAX, u64::MAX)).unwrap();
    let before = usage_on_disk(root.path()).1;
    for i in 1000..1010 {
        put(i);
        assert_eq!(
            get(&stores[i as usize % 2], i, 4096),
            Lookup::Hit(4096),
            "put {i}"
        );
    }
    let after = usage_on_disk(root.path()).1;
    assert!(
        after >= before,
        "{before} blocks before, {after} after ten puts"
    );
    assert!(after <= cap);
    assert!(stores.iter().all(|s| s.stats().not_admitted == 0));
    drop(stores);
    assert_eq!(ledger(root.path()), usage_on_disk(root.path()));
}

/// A store that holds the usage ledger's lock and does not let go (stopped with `SIGSTOP`:
/// here, the lock taken through another open file and kept) makes other shared stores' opens
/// and puts fail once the ledger wait has passed, with an error naming the ledger, instead of
/// waiting for ever; they work again once the lock is let go.
#[test]
fn a_ledger_lock_that_is_never_let_go_fails_opens_and_puts_after_the_wait() {
    let root = tempfile::tempdir().unwrap();
    let wait = Duration::from_millis(300);
    let cfg = move || shared().with_ledger_wait(wait);
    let store = open_shared(root.path(), cfg());
    store
        .put(&store.key(hash(0)), &payload(0, 0, 4096))
        .unwrap();
    let usage = root.path().join("v1/0/USAGE");
    let holder = std::fs::File::open(&usage).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let started = std::time::Instant::now();
    // In a thread, so that a wait without a bound fails this test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let r = root.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(Store::open(&r, worker("0"), cfg()).map(drop));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the open still waits for the ledger after 20 s")
        .unwrap_err();
    let waited = started.elapsed();
    let msg = err.to_string();
    assert!(
        msg.contains(usage.to_str().unwrap()) && msg.contains("not let go"),
        "{msg}"
    );
    assert!(waited >= wait, "failed after {waited:?}, before the wait");
    assert!(
        waited < wait + Duration::from_secs(5),
        "failed after {waited:?}, not after the configured wait"
    );
    let err = store
        .put(&store.key(hash(1)), &payload(1, 0, 4096))
        .unwrap_err();
    assert!(err.to_string().contains(usage.to_str().unwrap()), "{err}");
    // Reads need no ledger.
    assert_eq!(get(&store, 0, 4096), Lookup::Hit(4096));
    // Let go: both work again.
    drop(holder);
    let second = open_shared(root.path(), cfg());
    store
        .put(&store.key(hash(1)), &payload(1, 0, 4096))
        .unwrap();
    assert_eq!(get(&second, 1, 4096), Lookup::Hit(4096));
}
