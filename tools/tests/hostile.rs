//! The hostile-tree suite: every guarantee of the README against symlinks, FIFOs, devices,
//! unreadable entries, read-only mounts, racing repair, tiny disks, inode exhaustion and
//! tiny fd limits. Each test is named for what it shows.
//! Paths: `R` = the cache root, `W` = `R/v1/<worker>`.
//!
//! Nothing outside the tree may change, nothing valid may be removed, nothing may hang, every
//! error names its path.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use tierkv::engine::{IoEngine, IoRequest, PsyncEngine};
use tierkv::testing::BlockDir;
use tierkv::testing::{NsFaults, NsOp};
use tierkv::{BlockKey, Components, Error, Layout, Lookup, PolicyKind, Store, StoreConfig};

const STAT: &str = env!("CARGO_BIN_EXE_tierkv-stat");

fn wdir(root: &Path, w: &str) -> PathBuf {
    root.join("v1").join(w)
}

/// Runs a command, killing it (and failing) if it runs over `secs`.
fn run_within(mut cmd: Command, secs: u64) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{cmd:?} hung for {secs} s");
        }
    }
}

fn stat_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(STAT);
    c.args(args).env("RUST_LOG", "warn");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Worker "0" of `root` with `faults` injected into its namespace layer.
fn open_faulty(root: &Path, cfg: StoreConfig, faults: &Arc<NsFaults>) -> tierkv::Result<Store> {
    Store::open_with(
        root,
        worker("0"),
        cfg,
        Components::new().with_ns_faults(faults.clone()),
    )
}

/// A file outside every tree, with known contents.
fn outside(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn is_regular(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

// ---- 1-5: writes and deletes outside the tree ----

#[test]
fn stats_temp_symlinks_never_write_outside() {
    let root = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let target = outside(out.path(), "target", b"keep");
    let w = wdir(root.path(), "0");
    std::fs::create_dir_all(&w).unwrap();
    // The old fixed temp name, the live file itself, and the next control temp names.
    std::os::unix::fs::symlink(&target, w.join(".STATS.json.tmp")).unwrap();
    std::os::unix::fs::symlink(&target, w.join("STATS.json")).unwrap();
    let pid = std::process::id();
    // A shared store writes its own stats file, STATS.<node>.<pid>.json.
    let node = format!("{:016x}", tierkv::testing::node_id());
    let stats = if is_shared() {
        format!("STATS.{node}.{pid}.json")
    } else {
        "STATS.json".to_string()
    };
    std::os::unix::fs::symlink(&target, w.join(&stats)).ok();
    for seq in 0..64 {
        for name in [
            format!(".tmp.{stats}.{pid}.{seq}"),
            format!(".tmp.{stats}.{node}.{pid}.{seq}"),
        ] {
            std::os::unix::fs::symlink(&target, w.join(name)).unwrap();
        }
    }
    let store = Store::open(
        root.path(),
        worker("0"),
        common::cfg().with_stats_interval(Some(Duration::from_millis(5))),
    )
    .unwrap();
    fill(&store, 10, 1000);
    std::thread::sleep(Duration::from_millis(50));
    if is_shared() {
        // Replaced by the store's own file while it runs (it is removed at close).
        assert!(is_regular(&w.join(&stats)), "{stats} replaced by a file");
    }
    drop(store);
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"keep",
        "outside file written"
    );
    if is_shared() {
        assert!(
            !w.join(&stats).exists(),
            "a shared store's stats file goes at close"
        );
        return;
    }
    assert!(
        is_regular(&w.join("STATS.json")),
        "STATS.json replaced by a file"
    );
    assert!(
        std::fs::read_to_string(w.join("STATS.json"))
            .unwrap()
            .contains("\"worker\"")
    );
}

#[test]
fn layout_temp_symlinks_never_truncate_outside() {
    let root = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let target = outside(out.path(), "target", b"keep");
    let w = wdir(root.path(), "0");
    std::fs::create_dir_all(&w).unwrap();
    let pid = std::process::id();
    std::os::unix::fs::symlink(&target, w.join(format!(".tmp.layout.{pid}"))).unwrap();
    for seq in 0..64 {
        std::os::unix::fs::symlink(&target, w.join(format!(".tmp.LAYOUT.{pid}.{seq}"))).unwrap();
    }
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    fill(&store, 3, 100);
    let laid = store.layout();
    drop(store);
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert!(
        is_regular(&w.join("LAYOUT")),
        "LAYOUT is a file, not a symlink"
    );
    assert_eq!(
        std::fs::read_to_string(w.join("LAYOUT")).unwrap(),
        laid.to_file_text()
    );
}

#[test]
fn shard_dir_symlinks_never_unlink_outside() {
    let root = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let cfg = quiet()
        .with_layout(Layout::new(1, 16).unwrap())
        .with_capacity_files(40)
        .with_watermarks(1.0, 1.0);
    let store = Store::open(root.path(), worker("0"), cfg).unwrap();
    let ks = fill(&store, 30, 100);
    // Every shard directory moved outside, a symlink to it left in its place.
    let w = store.dir().to_path_buf();
    let mut moved = 0;
    for e in std::fs::read_dir(&w).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            let name = e.file_name();
            let dest = out.path().join(&name);
            std::fs::rename(e.path(), &dest).unwrap();
            std::os::unix::fs::symlink(&dest, e.path()).unwrap();
            moved += 1;
        }
    }
    assert!(moved > 1);
    let before = files_under(out.path()).len();
    assert_eq!(before, 30);
    // remove_many, then puts that force eviction of the 30 blocks the index still holds.
    for r in store.remove_many(&ks) {
        let _ = r;
    }
    let more: Vec<BlockKey> = (100..200).map(|i| store.key(hash(i))).collect();
    for (i, k) in more.iter().enumerate() {
        let _ = store.put(k, &payload(i as u64, 1, 100));
    }
    drop(store);
    assert_eq!(
        files_under(out.path()).len(),
        before,
        "files outside the tree were unlinked"
    );
    // The moved shard directories, read as a depth-1 fan-out-16 tree without control files.
    let moved = oracle::read_with_layout(out.path(), 1, 1);
    moved.assert_clean(out.path());
    assert_eq!(moved.blocks.len(), 30, "and are unchanged");
}

#[test]
fn a_symlink_planted_as_a_leaf_is_never_followed() {
    let root = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    // A small store: its 256 leaves are made when it opens.
    let cfg = || quiet().with_capacity_files(1000);
    let s = Store::open(root.path(), worker("0"), cfg()).unwrap();
    assert_eq!(s.layout(), Layout::new(1, 256).unwrap());
    let k = s.key(hash(7));
    let leaf = s.layout().rel_path(&k.hash).dir().to_string();
    let w = s.dir().to_path_buf();
    drop(s);
    // A leaf replaced by a symlink to a directory outside; another one removed.
    std::fs::remove_dir(w.join(&leaf)).unwrap();
    std::os::unix::fs::symlink(out.path(), w.join(&leaf)).unwrap();
    let gone = if leaf == "00" { "01" } else { "00" };
    std::fs::remove_dir(w.join(gone)).unwrap();
    let s = Store::open(root.path(), worker("0"), cfg()).unwrap();
    assert!(w.join(gone).is_dir(), "the missing leaf is made at open");
    assert!(
        std::fs::symlink_metadata(w.join(&leaf))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the symlink is left alone"
    );
    // A put into the symlinked leaf is refused, never written through it.
    assert!(s.put(&k, b"x").is_err());
    assert_eq!(s.get(&k, &mut [0u8; 1]).unwrap(), Lookup::Miss);
    drop(s);
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

#[test]
fn control_and_directory_symlinks_are_refused() {
    let out = tempfile::tempdir().unwrap();
    let secret = outside(out.path(), "secret", b"root:x:0:0:secret-line\n");
    let good = outside(out.path(), "layout", b"depth=0\nfanout=16\n");
    for (target, what) in [(&secret, "a foreign file"), (&good, "a valid layout")] {
        let root = tempfile::tempdir().unwrap();
        let w = wdir(root.path(), "0");
        std::fs::create_dir_all(&w).unwrap();
        std::os::unix::fs::symlink(target, w.join("LAYOUT")).unwrap();
        let e = Store::open(root.path(), worker("0"), quiet()).expect_err(what);
        let msg = e.to_string();
        assert!(msg.contains("LAYOUT"), "{what}: names the path: {msg}");
        assert!(!msg.contains("secret"), "{what}: quotes the file: {msg}");
    }
    assert_eq!(std::fs::read(&good).unwrap(), b"depth=0\nfanout=16\n");

    // A tree elsewhere, reached through a `v1` symlink or a worker-directory symlink.
    let elsewhere = tempfile::tempdir().unwrap();
    let s = Store::open(elsewhere.path(), worker("0"), quiet()).unwrap();
    fill(&s, 5, 100);
    drop(s);
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("v1"), root.path().join("v1")).unwrap();
    assert!(Store::open(root.path(), worker("0"), quiet()).is_err());
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap()]), 30);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("5 block files"), "{}", text(&o));

    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("v1")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("v1/0"), root.path().join("v1/evil")).unwrap();
    assert!(Store::open(root.path(), worker("evil"), quiet()).is_err());
    let o = run_within(
        stat_cmd(&[root.path().to_str().unwrap(), "--worker", "evil"]),
        30,
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let o = run_within(
        stat_cmd(&[root.path().to_str().unwrap(), "--repair", "--json"]),
        30,
    );
    assert!(!text(&o).contains("evil"), "{}", text(&o));
    assert_eq!(
        check_all_blocks(elsewhere.path()),
        5,
        "nothing changed there"
    );
}

#[test]
fn fifos_and_devices_are_never_read_nor_removed() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let ks = fill(&store, 3, 1000);
    // A FIFO under a block's name: a miss at once, the FIFO left alone.
    let p0 = store.path_of(&ks[0].hash);
    std::fs::remove_file(&p0).unwrap();
    mkfifo(&p0);
    let s2 = store.clone();
    let k0 = ks[0].clone();
    let r = within(10, "get of a FIFO", move || {
        s2.get(&k0, &mut vec![0u8; 1000]).map_err(|e| e.to_string())
    });
    assert_eq!(r, Ok(Lookup::Miss));
    assert!(
        std::fs::symlink_metadata(&p0)
            .unwrap()
            .file_type()
            .is_fifo_like()
    );
    // Removing that key leaves the FIFO alone; so do the sweep at open and repair, for a
    // FIFO named like a temp file.
    let _ = store.remove_many(std::slice::from_ref(&ks[0]));
    assert!(
        std::fs::symlink_metadata(&p0).is_ok(),
        "FIFO unlinked by remove"
    );
    let temp_fifo = p0.with_file_name(format!(".tmp.{}.1.1", ks[0].hash.to_hex()));
    mkfifo(&temp_fifo);
    // A character device under a block's name (root only: mknod).
    if privileged("a character device in the tree") {
        let p1 = store.path_of(&ks[1].hash);
        std::fs::remove_file(&p1).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p1,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o644),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
        assert_eq!(
            store.get(&ks[1], &mut vec![0u8; 1000]).unwrap(),
            Lookup::Miss
        );
        assert!(
            std::fs::symlink_metadata(&p1).is_ok(),
            "device node unlinked"
        );
    }
    let w = store.dir().to_path_buf();
    drop(store);
    drop(Store::open(root.path(), worker("0"), quiet()).unwrap());
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--repair"]), 30);
    assert!(
        std::fs::symlink_metadata(&temp_fifo).is_ok(),
        "FIFO swept: {}",
        text(&o)
    );
    assert!(
        std::fs::symlink_metadata(&p0).is_ok(),
        "FIFO repaired: {}",
        text(&o)
    );
    // FIFOs at STATS.json and LAYOUT: neither the store nor tierkv-stat hangs.
    mkfifo(w.join("STATS.json"));
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--live"]), 30);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let rp = root.path().to_path_buf();
    within(10, "Store::open with a FIFO at STATS.json", move || {
        Store::open(&rp, worker("0"), common::cfg()).map(drop)
    })
    .unwrap();
    std::fs::remove_file(w.join("LAYOUT")).unwrap();
    mkfifo(w.join("LAYOUT"));
    let rp = root.path().to_path_buf();
    let e = within(10, "Store::open with a FIFO at LAYOUT", move || {
        Store::open(&rp, worker("0"), quiet())
            .map(drop)
            .map_err(|e| e.to_string())
    });
    assert!(e.unwrap_err().contains("LAYOUT"));
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap()]), 30);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("LAYOUT"), "{}", text(&o));
}

/// Makes a FIFO at `path`.
fn mkfifo(path: impl AsRef<Path>) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path.as_ref(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}

impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_fifo()
    }
}

// ---- 6-10: tierkv-stat --repair removes only what it read and judged bad ----

fn tree_of(n: u64, len: usize) -> (tempfile::TempDir, Vec<BlockKey>) {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let ks = fill(&store, n, len);
    drop(store);
    (root, ks)
}

#[test]
fn repair_under_a_tiny_fd_limit_removes_nothing() {
    let (root, _) = tree_of(500, 64);
    let mut cmd = stat_cmd(&[root.path().to_str().unwrap(), "--repair"]);
    // SAFETY: setrlimit is async-signal-safe; the closure touches no shared state.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 5,
                rlim_max: 5,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = run_within(cmd, 60);
    assert_ne!(
        o.status.code(),
        Some(0),
        "errors must fail the run: {}",
        text(&o)
    );
    assert_eq!(
        check_all_blocks(root.path()),
        500,
        "valid blocks removed: {}",
        text(&o)
    );
}

/// Runs tierkv-stat as `nobody` (root only).
fn stat_as_nobody(args: &[&str]) -> Output {
    let mut cmd = stat_cmd(args);
    // SAFETY: setgid/setuid are async-signal-safe; the closure touches no shared state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run_within(cmd, 60)
}

#[test]
fn repair_as_non_owner_removes_nothing() {
    if !privileged("running tierkv-stat as another user") {
        return;
    }
    let (root, ks) = tree_of(20, 64);
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = Store::open(root.path(), worker("0"), quiet())
        .unwrap()
        .path_of(&ks[3].hash);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    let o = stat_as_nobody(&[root.path().to_str().unwrap(), "--repair"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(p.exists(), "an unreadable valid block was removed");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(check_all_blocks(root.path()), 20);
}

#[test]
fn repair_never_races_a_running_store() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let ks = fill(&store, 50, 2000);
    // A writer replaces blocks the whole time (new files renamed over the old).
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let writer = {
        let (store, ks, stop, errors) = (store.clone(), ks.clone(), stop.clone(), errors.clone());
        std::thread::spawn(move || {
            let mut v = 1u8;
            while !stop.load(Ordering::Relaxed) {
                let datas: Vec<Vec<u8>> =
                    (0..ks.len()).map(|i| payload(i as u64, v, 2000)).collect();
                let items = items(&ks, &datas);
                for r in store.put_many(&items) {
                    if r.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                v = v.wrapping_add(1);
            }
        })
    };
    for _ in 0..10 {
        let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--repair"]), 60);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("in use"), "{}", text(&o));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    let w = store.dir().to_path_buf();
    drop(store);
    assert_eq!(
        check_all_blocks(&w),
        50,
        "every block is still there and whole"
    );

    // Repair holds the worker lock for its whole scan: a store cannot open meanwhile.
    let ns = BlockDir::open(root.path(), "0", false).unwrap();
    assert!(ns.try_lock().unwrap());
    match Store::open(root.path(), worker("0"), quiet()) {
        Err(Error::WorkerBusy { .. }) => {}
        other => panic!("{other:?}"),
    }
    ns.unlock().unwrap();
    // And repair racing stores that open, put and close: no put ever fails.
    let rp = root.path().to_path_buf();
    let stop = Arc::new(AtomicBool::new(false));
    let repairs = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = run_within(stat_cmd(&[rp.to_str().unwrap(), "--repair"]), 60);
                n += 1;
            }
            n
        })
    };
    let mut opened = 0;
    for round in 0..40u64 {
        let store = match Store::open(root.path(), worker("0"), quiet()) {
            Ok(s) => s,
            Err(Error::WorkerBusy { .. }) => continue,
            Err(e) => panic!("{e}"),
        };
        opened += 1;
        let more: Vec<BlockKey> = (0..20)
            .map(|i| store.key(hash(1000 + round * 20 + i)))
            .collect();
        let datas: Vec<Vec<u8>> = (0..20).map(|i| payload(i, 0, 5000)).collect();
        let items = items(&more, &datas);
        for r in store.put_many(&items) {
            r.unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(repairs.join().unwrap() > 0);
    assert!(opened > 0);
    check_all_blocks(root.path());
}

#[test]
fn repair_verifies_payloads() {
    let (root, ks) = tree_of(10, 5000);
    let p = Store::open(root.path(), worker("0"), quiet())
        .unwrap()
        .path_of(&ks[4].hash);
    let mut bytes = std::fs::read(&p).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(&p, &bytes).unwrap();
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--repair"]), 60);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !p.exists(),
        "the corrupt block was not removed: {}",
        text(&o)
    );
    assert_eq!(check_all_blocks(root.path()), 9);
}

#[test]
fn repair_on_a_read_only_mount_fails_loudly() {
    let Some(fs) = Tmpfs::mount("16m", "a read-only mount") else {
        return;
    };
    let store = Store::open(fs.path(), worker("0"), quiet()).unwrap();
    let ks = fill(&store, 5, 3000);
    let p = store.path_of(&ks[2].hash);
    drop(store);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[5000] ^= 1;
    std::fs::write(&p, &bytes).unwrap();
    fs.remount(true);
    let o = run_within(
        stat_cmd(&[fs.path().to_str().unwrap(), "--verify", "--repair"]),
        60,
    );
    fs.remount(false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let name = p.file_name().unwrap().to_str().unwrap();
    assert!(
        text(&o).contains(name),
        "names the file it could not remove: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("could not remove"),
        "says it could not: {}",
        text(&o)
    );
    assert!(p.exists());
}

// ---- 11-13: the capacity bound and eviction order ----

#[test]
fn chains_keep_their_roots() {
    for policy in [
        PolicyKind::Lru,
        PolicyKind::Admit2,
        PolicyKind::Arc,
        PolicyKind::Adaptive,
    ] {
        let root = tempfile::tempdir().unwrap();
        let cfg = quiet()
            .with_capacity_bytes(50 * (4096 + 65_536))
            .with_watermarks(1.0, 1.0)
            .with_policy(policy);
        let store = Store::open(root.path(), worker("0"), cfg).unwrap();
        let chains: Vec<Vec<BlockKey>> = (0..3).map(|c| chain_keys(&store, c, 30)).collect();
        let data = vec![7u8; 65_536];
        for _ in 0..2 {
            for c in &chains {
                let items: Vec<_> = c.iter().map(|k| (k.clone(), data.as_slice())).collect();
                for r in store.offer_many(&items) {
                    r.unwrap();
                }
                assert!(prefix_closed(&store, &chains), "{policy}");
            }
        }
        let s = store.stats();
        assert!(
            s.used_bytes <= 50 * (4096 + 65_536),
            "{policy}: {}",
            s.used_bytes
        );
        // No block that can never be hit holds space: what is present is reachable.
        let present: u64 = chains
            .iter()
            .map(|c| store.contains_prefix(c).unwrap() as u64)
            .sum();
        assert_eq!(present, s.used_files, "{policy}");
    }
}

mod prefix_property {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// Offer chain `c` from block `from` on (after its cached prefix).
        Offer(usize, usize),
        /// Read chain `c`'s cached prefix.
        Get(usize),
        /// Remove block `i` of chain `c`.
        Remove(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6usize, 0..12usize).prop_map(|(c, f)| Op::Offer(c, f)),
            (0..6usize).prop_map(Op::Get),
            (0..6usize, 0..12usize).prop_map(|(c, i)| Op::Remove(c, i)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn present_set_is_prefix_closed(ops in proptest::collection::vec(op(), 1..40), p in 0..4usize) {
            let policy = [PolicyKind::Lru, PolicyKind::Admit2, PolicyKind::Arc, PolicyKind::Adaptive][p];
            let root = tempfile::tempdir().unwrap();
            let cfg = quiet().with_capacity_files(20).with_watermarks(1.0, 1.0).with_policy(policy);
            let store = Store::open(root.path(), worker("0"), cfg).unwrap();
            let chains: Vec<Vec<BlockKey>> = (0..6).map(|c| chain_keys(&store, c as u32, 12)).collect();
            for op in ops {
                match op {
                    Op::Offer(c, from) => {
                        let n = store.contains_prefix(&chains[c]).unwrap().min(from);
                        let items: Vec<_> = chains[c][n..].iter().map(|k| (k.clone(), [c as u8; 64])).collect();
                        let parent = n.checked_sub(1).map(|i| &chains[c][i]);
                        for r in store.offer_many_after(parent, &items) {
                            r.unwrap();
                        }
                    }
                    Op::Get(c) => {
                        let n = store.contains_prefix(&chains[c]).unwrap();
                        let mut bufs = vec![vec![0u8; 64]; n];
                        for r in store.get_many(&chains[c][..n], &mut bufs) {
                            prop_assert!(r.unwrap().is_hit());
                        }
                    }
                    Op::Remove(c, i) => {
                        store.remove_many(&chains[c][i..=i])[0].as_ref().unwrap();
                    }
                }
                prop_assert!(prefix_closed(&store, &chains), "{policy}");
                prop_assert!(store.stats().used_files <= 20);
            }
        }
    }
}

#[test]
fn deleting_the_lock_file_does_not_unlock() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    std::fs::remove_file(store.dir().join(".lock")).unwrap();
    if is_shared() {
        // Shared stores share the worker; an exclusive one is still kept out.
        drop(Store::open(root.path(), worker("0"), quiet()).unwrap());
        let exclusive = quiet().with_sharing(tierkv::Sharing::Exclusive);
        assert!(matches!(
            Store::open(root.path(), worker("0"), exclusive),
            Err(Error::WorkerBusy { .. })
        ));
        return;
    }
    match Store::open(root.path(), worker("0"), quiet()) {
        Err(Error::WorkerBusy { holder, .. }) => {
            assert!(
                holder.contains("holder unknown") || holder.contains("pid"),
                "{holder}"
            )
        }
        other => panic!("a second store opened the same worker: {other:?}"),
    }
    drop(store);
    // With the lock file in place, the error names the holder.
    let _store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    match Store::open(root.path(), worker("0"), quiet()) {
        Err(e @ Error::WorkerBusy { .. }) => {
            assert!(
                e.to_string()
                    .contains(&format!("pid {}", std::process::id())),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// On GlusterFS the directory's flock holds only on one client, so the lock
/// file alone keeps other nodes out, and `rm FLOCK` let another node's store open the
/// worker. The holder puts a removed (or replaced) lock file back within a few checks of
/// `ns::LOCK_KEEP_INTERVAL`, locked, so the next opener anywhere is refused by it.
#[test]
fn a_removed_lock_file_is_put_back_locked() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let flock = store.dir().join("FLOCK");
    let locked_by_other = |p: &std::path::Path| {
        let f = std::fs::File::open(p).unwrap();
        matches!(
            rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK)
        )
    };
    assert!(locked_by_other(&flock));
    for round in 0..2 {
        if round == 0 {
            std::fs::remove_file(&flock).unwrap();
        } else {
            // Replaced by a new, unlocked file.
            let planted = store.dir().join("planted");
            std::fs::write(&planted, b"").unwrap();
            std::fs::rename(&planted, &flock).unwrap();
        }
        let start = std::time::Instant::now();
        while !(flock.exists() && locked_by_other(&flock)) {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "round {round}: the lock file was not put back, locked"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert!(
        temp_files_under(root.path()).is_empty(),
        "the lock file's temp name is gone"
    );
    // The store still writes (it holds the worker).
    let k = store.key(hash(1));
    store.put(&k, &payload(1, 0, 4096)).unwrap();
}

// ---- 14-20: limits, sizes and errors ----

#[test]
fn mkdir_and_inode_exhaustion_are_nospace() {
    // Injected: mkdir of a shard directory fails with ENOSPC.
    let root = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    faults.fail(NsOp::Mkdir, rustix::io::Errno::NOSPC, 0, 1000);
    let store = open_faulty(root.path(), quiet(), &faults).unwrap();
    match store.put(&store.key(hash(1)), b"x") {
        Err(Error::NoSpace { path, .. }) => assert!(path.starts_with(store.dir())),
        other => panic!("{other:?}"),
    }
    assert!(faults.injected() > 0);
    drop(store);
    // Real: a tmpfs with 200 inodes and 500 blocks to write.
    let Some(fs) = Tmpfs::mount_with("size=64m,nr_inodes=200", "inode exhaustion") else {
        return;
    };
    let store = Store::open(fs.path(), worker("0"), quiet()).unwrap();
    let ks = keys(&store, 500);
    let mut nospace = 0;
    for (i, k) in ks.iter().enumerate() {
        match store.put(k, &payload(i as u64, 0, 100)) {
            Ok(()) => {}
            Err(Error::NoSpace { .. }) => nospace += 1,
            Err(e) => panic!("inode exhaustion must be NoSpace, got {e}"),
        }
    }
    assert!(nospace > 0);
    assert!(temp_files_under(store.dir()).is_empty());
}

#[test]
fn claimed_lengths_are_checked_before_use() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let k = store.key(hash(9));
    let p = store.path_of(&k.hash);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let mut h = tierkv::format::Header::for_payload(k.hash, &[0u8; 100], None);
    h.payload_len = 1 << 40;
    let mut file = h.encode().to_vec();
    file.resize(4096 + 100, 0);
    std::fs::write(&p, &file).unwrap();
    drop(store);
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    assert_eq!(
        store.get(&k, &mut [0u8; 100]).unwrap(),
        Lookup::Miss,
        "a corrupt miss, not an error"
    );
    assert_eq!(store.stats().corrupt, 1);
    drop(store);
    std::fs::write(&p, &file).unwrap();
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--verify"]), 60);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("bad"), "{}", text(&o));
}

#[test]
fn first_open_failures_a_missing_layout_and_misplaced_blocks() {
    // ENOSPC when the first open renames its control files: nothing is left behind but the
    // empty file the worker lock is held on (FLOCK: removing it could let a store that opened
    // it meanwhile lock a file nobody else sees).
    let root = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    faults.fail(NsOp::Rename, rustix::io::Errno::NOSPC, 0, 1000);
    let r = open_faulty(root.path(), quiet(), &faults);
    assert!(matches!(r, Err(Error::NoSpace { .. })), "{r:?}");
    let w = wdir(root.path(), "0");
    let left: Vec<_> = std::fs::read_dir(&w)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "FLOCK")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(std::fs::metadata(w.join("FLOCK")).unwrap().len(), 0);

    // A tree of blocks whose LAYOUT went missing is refused, not re-laid out.
    let (root, ks) = tree_of(20, 100);
    let laid = std::fs::read_to_string(wdir(root.path(), "0").join("LAYOUT")).unwrap();
    std::fs::remove_file(wdir(root.path(), "0").join("LAYOUT")).unwrap();
    match Store::open(root.path(), worker("0"), quiet()) {
        Err(Error::LayoutMismatch { .. }) => {}
        other => panic!("{other:?}"),
    }
    std::fs::write(wdir(root.path(), "0").join("LAYOUT"), laid).unwrap();

    // A valid block in the wrong shard directory: a miss, counted, removed by repair.
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let p = store.path_of(&ks[0].hash);
    let depth = store.layout().depth;
    drop(store);
    let wrong = wdir(root.path(), "0").join("zz-not-a-shard");
    let _ = wrong;
    let other_shard = {
        let first = p
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let d = if first == "00" { "01" } else { "00" };
        (0..depth).fold(wdir(root.path(), "0"), |w, _| w.join(d))
    };
    std::fs::create_dir_all(&other_shard).unwrap();
    let moved = other_shard.join(p.file_name().unwrap());
    std::fs::rename(&p, &moved).unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    assert_eq!(store.get(&ks[0], &mut [0u8; 100]).unwrap(), Lookup::Miss);
    assert!(store.stats().foreign >= 1);
    drop(store);
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--json"]), 60);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["misplaced"], 1, "{}", text(&o));
    let o = run_within(stat_cmd(&[root.path().to_str().unwrap(), "--repair"]), 60);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!moved.exists());
    assert_eq!(check_all_blocks(root.path()), 19);
}

#[test]
fn a_read_only_tree_serves_reads() {
    // A store that only reads, beside the one that writes (no lock taken).
    let root = tempfile::tempdir().unwrap();
    let writer = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let ks = fill(&writer, 5, 3000);
    let reader = Store::open(root.path(), worker("0"), quiet().with_read_only(true)).unwrap();
    assert!(reader.is_read_only());
    assert!(reader.get(&ks[1], &mut vec![0u8; 3000]).unwrap().is_hit());
    match reader.put(&ks[0], b"x") {
        Err(Error::ReadOnly { path, .. }) => assert_eq!(path, writer.dir()),
        other => panic!("{other:?}"),
    }
    drop((writer, reader));
    // A tree on a read-only mount.
    let Some(fs) = Tmpfs::mount("16m", "a read-only mount") else {
        return;
    };
    let store = Store::open(fs.path(), worker("0"), quiet()).unwrap();
    let ks = fill(&store, 5, 3000);
    drop(store);
    fs.remount(true);
    let r = Store::open(fs.path(), worker("0"), quiet());
    let ro = Store::open(fs.path(), worker("0"), common::cfg().with_read_only(true));
    let hit = ro
        .as_ref()
        .map(|s| s.get(&ks[2], &mut vec![0u8; 3000]).unwrap().is_hit())
        .map_err(|e| e.to_string());
    let put = ro
        .as_ref()
        .map(|s| s.put(&ks[0], b"x").is_err())
        .map_err(|e| e.to_string());
    drop(ro);
    fs.remount(false);
    match r {
        Err(e) => assert!(e.to_string().contains("read_only"), "{e}"),
        Ok(_) => panic!("a writable store opened on a read-only mount"),
    }
    assert!(hit.unwrap());
    assert!(put.unwrap());
}

#[test]
fn stat_as_non_owner_names_errors_and_keeps_atimes() {
    if !privileged("running tierkv-stat as another user") {
        return;
    }
    let (root, ks) = tree_of(30, 100);
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
    let shard = store.path_of(&ks[0].hash).parent().unwrap().to_path_buf();
    drop(store);
    // Access times a day before the modification times: any read would move them.
    let files: Vec<PathBuf> = files_under(root.path())
        .into_iter()
        .filter(|p| p.file_name().unwrap().len() == 64)
        .collect();
    for f in &files {
        let m = std::fs::metadata(f).unwrap();
        let t = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: m.mtime() - 86_400,
                tv_nsec: 0,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: m.mtime(),
                tv_nsec: m.mtime_nsec(),
            },
        };
        rustix::fs::utimensat(rustix::fs::CWD, f, &t, rustix::fs::AtFlags::empty()).unwrap();
    }
    let atimes = |fs: &[PathBuf]| -> Vec<i64> {
        fs.iter()
            .map(|f| std::fs::metadata(f).unwrap().atime())
            .collect()
    };
    let before = atimes(&files);
    std::fs::set_permissions(&shard, std::fs::Permissions::from_mode(0o000)).unwrap();
    let o = stat_as_nobody(&[root.path().to_str().unwrap()]);
    std::fs::set_permissions(&shard, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(shard.to_str().unwrap()),
        "names the unreadable dir: {}",
        text(&o)
    );
    assert_eq!(atimes(&files), before, "a scan moved access times");
    // As the owner, a plain and a verifying scan keep them too.
    for args in [vec![], vec!["--verify"]] {
        let mut a = vec![root.path().to_str().unwrap()];
        a.extend(args);
        let o = run_within(stat_cmd(&a), 60);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    assert_eq!(atimes(&files), before, "a scan moved access times");
}

/// An engine that loses the last result of every batch.
#[derive(Debug)]
struct Lossy(PsyncEngine);

impl IoEngine for Lossy {
    fn name(&self) -> &'static str {
        "lossy"
    }
    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<std::io::Result<usize>> {
        let mut r = self.0.submit(batch);
        r.pop();
        r
    }
}

#[test]
fn errors_keep_their_sources_and_short_engine_answers_fail_cleanly() {
    // NoSpace keeps its source.
    let root = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    let store = open_faulty(root.path(), quiet(), &faults).unwrap();
    faults.fail(NsOp::Create, rustix::io::Errno::NOSPC, 0, 1);
    let e = store.put(&store.key(hash(1)), b"x").unwrap_err();
    assert!(matches!(e, Error::NoSpace { .. }), "{e}");
    assert!(std::error::Error::source(&e).is_some(), "{e:?}");
    drop(store);
    // An engine that returns fewer results than requests: errors, no panic, nothing left.
    let root = tempfile::tempdir().unwrap();
    let store = Store::open_with_engine(
        root.path(),
        worker("0"),
        quiet().with_capacity_files(100),
        Arc::new(Lossy(PsyncEngine::new())),
    )
    .unwrap();
    let ks = keys(&store, 4);
    let datas: Vec<Vec<u8>> = (0..4).map(|i| payload(i, 0, 1000)).collect();
    let items = items(&ks, &datas);
    let res = store.put_many(&items);
    assert_eq!(res.len(), 4);
    assert!(res.iter().all(|r| r.is_err()), "{res:?}");
    assert!(temp_files_under(store.dir()).is_empty());
    assert_eq!(store.stats().used_files, 0, "reservations released");
    let mut bufs = vec![vec![0u8; 1000]; 4];
    assert_eq!(store.get_many(&ks, &mut bufs).len(), 4);
}

#[test]
fn ns_faults_surface_as_errors_that_name_their_path() {
    let root = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    let store = open_faulty(root.path(), quiet().with_fd_cache(0), &faults).unwrap();
    let ks = fill(&store, 4, 1000);
    let mut buf = vec![0u8; 1000];
    // EMFILE on open: the open-file cache shrinks and the open is retried.
    faults.fail(NsOp::Open, rustix::io::Errno::MFILE, 0, 2);
    assert!(store.get(&ks[0], &mut buf).unwrap().is_hit());
    // EIO on open: an error naming the block's path, the block kept.
    faults.fail(NsOp::Open, rustix::io::Errno::IO, 0, 1);
    match store.get(&ks[1], &mut buf) {
        Err(Error::Io { path, .. }) => assert_eq!(path, store.path_of(&ks[1].hash)),
        other => panic!("{other:?}"),
    }
    assert!(store.get(&ks[1], &mut buf).unwrap().is_hit());
    // EACCES on unlink: remove_many fails naming the path; the block stays readable.
    faults.fail(NsOp::Unlink, rustix::io::Errno::ACCESS, 0, 1);
    match &store.remove_many(&ks[2..3])[0] {
        Err(Error::Io { path, source }) => {
            assert_eq!(path, &store.path_of(&ks[2].hash));
            assert_eq!(source.raw_os_error(), Some(libc::EACCES));
        }
        other => panic!("{other:?}"),
    }
    assert!(store.get(&ks[2], &mut buf).unwrap().is_hit());
    // EIO on rename: the put fails, its temp file is gone, the old block is kept. (Shared,
    // a present block is never rewritten: the put of a new one fails, and it stays absent.)
    faults.fail(NsOp::Rename, rustix::io::Errno::IO, 0, 1);
    if is_shared() {
        let fresh = store.key(hash(1000));
        assert!(matches!(
            store.put(&fresh, &payload(1000, 0, 1000)),
            Err(Error::Io { .. })
        ));
        assert!(temp_files_under(store.dir()).is_empty());
        assert_eq!(store.get(&fresh, &mut buf).unwrap(), Lookup::Miss);
    }
    assert!(
        matches!(
            store.put(&ks[3], &payload(3, 9, 1000)),
            Err(Error::Io { .. })
        ) || is_shared()
    );
    assert!(temp_files_under(store.dir()).is_empty());
    assert!(store.get(&ks[3], &mut buf).unwrap().is_hit());
    assert_eq!(buf, payload(3, 0, 1000));
    assert!(faults.injected() >= 5);
}
