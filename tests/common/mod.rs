//! Helpers shared by the behaviour tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tierkv::{BlockHash, BlockKey, Store, StoreConfig, WorkerId};

pub mod oracle;

pub fn worker(id: &str) -> WorkerId {
    WorkerId::new(id).unwrap()
}

pub fn hash(i: u64) -> BlockHash {
    BlockHash::chain(None, &[i as u32, (i >> 32) as u32, 0xC0FFEE])
}

pub fn keys(store: &Store, n: u64) -> Vec<BlockKey> {
    (0..n).map(|i| store.key(hash(i))).collect()
}

/// Deterministic block contents that differ per key and per version.
pub fn payload(i: u64, version: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| {
            (j as u64)
                .wrapping_mul(31)
                .wrapping_add(i * 7 + version as u64) as u8
        })
        .collect()
}

/// Pairs keys with their payloads, as `put_many` and `offer_many` take them.
pub fn items<'a>(keys: &[BlockKey], datas: &'a [Vec<u8>]) -> Vec<(BlockKey, &'a [u8])> {
    assert_eq!(keys.len(), datas.len(), "a payload per key");
    keys.iter()
        .cloned()
        .zip(datas.iter().map(Vec::as_slice))
        .collect()
}

/// The store configuration of the behaviour suites: the defaults, in the sharing mode that
/// `TIERKV_TEST_SHARING` names (`shared` or `exclusive`, the default), so tools/test.sh runs
/// the hostile-tree and semantics suites against a shared tree too.
pub fn cfg() -> StoreConfig {
    StoreConfig::new().with_sharing(sharing())
}

/// The sharing mode the suites run in (see [`cfg`]).
pub fn sharing() -> tierkv::Sharing {
    match std::env::var("TIERKV_TEST_SHARING").as_deref() {
        Ok("shared") => tierkv::Sharing::Shared,
        Ok("exclusive") | Err(_) => tierkv::Sharing::Exclusive,
        Ok(other) => panic!("TIERKV_TEST_SHARING={other:?}: use shared or exclusive"),
    }
}

/// True when the suites run against a shared tree.
pub fn is_shared() -> bool {
    sharing() == tierkv::Sharing::Shared
}

pub fn open(root: &Path, w: &str) -> Store {
    Store::open(root, worker(w), cfg()).unwrap()
}

/// Every regular file under `dir`, recursively (symlinks not followed).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

pub fn temp_files_under(dir: &Path) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(".tmp.")
        })
        .collect()
}

/// Checks the tree under `dir` (a cache root or a worker directory) with the independent
/// reader of docs/format.md ([`oracle`]): every block file byte by byte and in its own shard
/// directory; panics on a bad or misplaced block and on any name the document does not
/// explain (temp and control files are fine). Returns the number of block files.
pub fn check_all_blocks(dir: &Path) -> usize {
    oracle::check_tree(dir)
}

/// Kills (and reaps) a child process when dropped: a test that fails while its child runs
/// leaves no orphan behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `f` on a thread of its own and returns what it returns; fails the test if `f` has not
/// returned after `secs` (it hung: the stuck thread is left behind), and with `f`'s own panic
/// if it panicked.
pub fn within<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(t.join().expect_err("no value and no panic"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung for {secs} s"),
    }
}

/// Records that the running test skips (all or part of itself): prints `SKIPPED <test>
/// (<binary>): <reason>` and appends that line to `target/test-skips.txt`, which
/// tools/test.sh prints (and clears) so that no skip goes unseen.
pub fn skip(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let line = format!(
        "SKIPPED {} ({}): {reason}",
        thread.name().unwrap_or("?"),
        env!("CARGO_CRATE_NAME")
    );
    eprintln!("{line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-skips.txt");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

/// The process umask, read without changing it.
pub fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
    u32::from_str_radix(line.split_whitespace().nth(1).unwrap(), 8).unwrap()
}

/// A tmpfs of `size` (e.g. "2m") mounted on a fresh temp dir, unmounted on drop. `None` when
/// mounting is not permitted (not root): the caller skips, unless CI requires the test
/// (TIERKV_REQUIRE_PRIVILEGED_TESTS), where this panics instead.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str, why: &str) -> Option<Tmpfs> {
        Self::mount_with(&format!("size={size}"), why)
    }

    /// As [`Tmpfs::mount`], with mount options (e.g. `size=8m,nr_inodes=200`).
    pub fn mount_with(opts: &str, why: &str) -> Option<Tmpfs> {
        Self::mount_fs("tmpfs", opts, why)
    }

    /// A ramfs instead (no size limit; it refuses `O_DIRECT`, which tmpfs takes since Linux
    /// 6.6), unmounted on drop like a tmpfs.
    pub fn mount_ramfs(why: &str) -> Option<Tmpfs> {
        Self::mount_fs("ramfs", "mode=0755", why)
    }

    fn mount_fs(fstype: &str, opts: &str, why: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", fstype, "-o", opts, "tierkv-test"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(Tmpfs { dir });
        }
        let msg = format!("cannot mount a {fstype} (needs root) for {why}");
        assert!(
            std::env::var_os("TIERKV_REQUIRE_PRIVILEGED_TESTS").is_none(),
            "{msg}"
        );
        skip(&msg);
        None
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Tmpfs {
    /// Remounts read-only (`true`) or read-write.
    pub fn remount(&self, read_only: bool) {
        let opt = if read_only {
            "remount,ro"
        } else {
            "remount,rw"
        };
        let ok = std::process::Command::new("mount")
            .args(["-o", opt])
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount -o {opt} {}", self.dir.path().display());
    }
}

/// True when this process may do what root may (mknod, setuid, mount). When not, the
/// caller skips, unless CI requires the test (TIERKV_REQUIRE_PRIVILEGED_TESTS): then this
/// panics.
pub fn privileged(why: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let msg = format!("needs root for {why}");
    assert!(
        std::env::var_os("TIERKV_REQUIRE_PRIVILEGED_TESTS").is_none(),
        "{msg}"
    );
    skip(&msg);
    false
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// A store of `cfg` (no STATS.json) whose namespace layer fails what `faults` says.
pub fn open_with_ns_faults(
    dir: &Path,
    cfg: StoreConfig,
    faults: &std::sync::Arc<tierkv::testing::NsFaults>,
) -> Store {
    Store::open_with(
        dir,
        worker("0"),
        cfg.with_stats_interval(None),
        tierkv::Components::new().with_ns_faults(faults.clone()),
    )
    .unwrap()
}

/// A store config that writes no STATS.json.
pub fn quiet() -> StoreConfig {
    cfg().with_stats_interval(None)
}

/// Stores `n` blocks of `len` bytes one put each (no chain between them).
pub fn fill(store: &Store, n: u64, len: usize) -> Vec<BlockKey> {
    let ks = keys(store, n);
    for (i, k) in ks.iter().enumerate() {
        store.put(k, &payload(i as u64, 0, len)).unwrap();
    }
    ks
}

/// True if, per chain, the present blocks are a prefix of it.
pub fn prefix_closed(store: &Store, chains: &[Vec<BlockKey>]) -> bool {
    chains.iter().all(|c| {
        let present: Vec<bool> = store
            .contains_many(c)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let n = present.iter().take_while(|p| **p).count();
        present[n..].iter().all(|p| !p)
    })
}

/// The keys of a chain of `n` blocks over tokens derived from `seed`.
pub fn chain_keys(store: &Store, seed: u32, n: usize) -> Vec<BlockKey> {
    let tokens: Vec<u32> = (0..n as u32 * 4)
        .map(|t| t.wrapping_mul(7) ^ seed)
        .collect();
    tierkv::BlockHash::chain_all(&tokens, 4)
        .into_iter()
        .map(|h| store.key(h))
        .collect()
}
