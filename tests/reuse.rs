//! Reusing evicted files (`StoreConfig::with_reuse_evicted`): a put that evicts writes its
//! block into the victim's file, which no descriptor anywhere may hold; readers never get
//! another block's bytes.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use rustix::io::Errno;
use tierkv::engine::{EngineKind, IoEngine, IoRequest};
use tierkv::testing::{NsFaults, NsOp};
use tierkv::{BlockKey, Components, Lookup, PolicyKind, Store, StoreConfig};

const LEN: usize = 64 * 1024;

/// A store bounded at `files` blocks that reuses what it evicts. The watermarks stay at
/// their defaults: with reuse no background evictor runs (it would unlink the files the
/// puts are to reuse), which `a_full_store_writes_new_blocks_into_the_files_it_evicts`
/// shows by every eviction reusing its file.
fn reusing(files: u64) -> StoreConfig {
    StoreConfig::new()
        .with_capacity_files(files)
        .with_reuse_evicted(true)
        .with_stats_interval(None)
}

/// The block files (not temp files) under `dir`.
fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| tierkv::BlockHash::from_hex(p.file_name().unwrap().to_str().unwrap()).is_ok())
        .collect()
}

/// The inode numbers of the block files under `dir`.
fn block_inodes(dir: &Path) -> BTreeSet<u64> {
    block_files(dir)
        .into_iter()
        .map(|p| std::fs::symlink_metadata(p).unwrap().ino())
        .collect()
}

/// `O_PATH` descriptors on the block files under `dir`: they keep the inodes alive (an
/// unlinked one cannot hand its number on) and do not count as open for a lease.
fn path_descriptors(dir: &Path) -> Vec<std::os::fd::OwnedFd> {
    block_files(dir)
        .into_iter()
        .map(|p| rustix::fs::open(&p, rustix::fs::OFlags::PATH, rustix::fs::Mode::empty()).unwrap())
        .collect()
}

/// Puts `keys[i]` with `payload(first + i, 0, len(i))`, one batch.
fn put_batch(store: &Store, keys: &[BlockKey], first: u64, len: impl Fn(usize) -> usize) {
    let datas: Vec<Vec<u8>> = (0..keys.len())
        .map(|i| payload(first + i as u64, 0, len(i)))
        .collect();
    for r in store.put_many(&items(keys, &datas)) {
        r.unwrap();
    }
}

/// Asserts that `key` holds exactly `want`.
fn assert_holds(store: &Store, key: &BlockKey, want: &[u8]) {
    let mut buf = vec![0u8; 4 * LEN];
    match store.get(key, &mut buf).unwrap() {
        Lookup::Hit(n) => assert!(
            buf[..n] == *want,
            "{key}: other bytes than its put's ({n} bytes read, {} put; first difference at {:?})",
            want.len(),
            buf[..n].iter().zip(want).position(|(a, b)| a != b)
        ),
        Lookup::Miss => panic!("{key}: a miss"),
    }
}

#[test]
fn a_full_store_writes_new_blocks_into_the_files_it_evicts() {
    for direct in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::open(dir.path(), worker("0"), reusing(8).with_direct_io(direct)).unwrap();
        let ks = keys(&store, 32);
        put_batch(&store, &ks[..8], 0, |_| LEN + 1000);
        let before = block_inodes(store.dir());
        assert_eq!(before.len(), 8);
        // O_PATH descriptors keep the inodes (an unlinked one could not hand its number on)
        // and do not count as open for a lease: each must be linked again at the end.
        let paths = path_descriptors(store.dir());
        // Two batches of 8 new blocks, each evicting all 8: shorter (within the same 4 KiB
        // page: the room reserved for them holds the old file) and longer than the files
        // they reuse. A reused file is cut to its block's length, or grows.
        put_batch(&store, &ks[8..16], 8, |i| LEN + 500 + i);
        for (i, k) in ks[8..16].iter().enumerate() {
            assert_holds(&store, k, &payload(8 + i as u64, 0, LEN + 500 + i));
        }
        assert_eq!(check_all_blocks(dir.path()), 8, "direct {direct}");
        put_batch(&store, &ks[16..24], 16, |i| 2 * LEN + 3 * i);
        let s = store.stats();
        assert_eq!(s.evictions, 16, "direct {direct}: {s:?}");
        assert_eq!(
            s.reused_files, 16,
            "direct {direct}: every eviction reused its file"
        );
        // The same files, holding the new blocks.
        assert_eq!(block_inodes(store.dir()), before, "direct {direct}");
        for fd in &paths {
            let st = rustix::fs::fstat(fd).unwrap();
            assert_eq!(
                st.st_nlink, 1,
                "direct {direct}: an evicted file was unlinked, not reused"
            );
        }
        for (i, k) in ks[16..24].iter().enumerate() {
            assert_holds(&store, k, &payload(16 + i as u64, 0, 2 * LEN + 3 * i));
        }
        for k in &ks[..16] {
            let mut buf = vec![0u8; 4 * LEN];
            assert_eq!(
                store.get(k, &mut buf).unwrap(),
                Lookup::Miss,
                "{k} was evicted"
            );
        }
        // Blocks smaller than the files they evict by a page or more: an evicted file is
        // larger than the room reserved for them, and the bound holds at every instant, so
        // those files are unlinked.
        put_batch(&store, &ks[24..], 24, |_| LEN / 2);
        let s = store.stats();
        assert_eq!((s.evictions, s.reused_files), (24, 16), "direct {direct}");
        for (i, k) in ks[24..].iter().enumerate() {
            assert_holds(&store, k, &payload(24 + i as u64, 0, LEN / 2));
        }
        assert!(temp_files_under(dir.path()).is_empty());
        drop(store);
        // The independent reader of docs/format.md: every file exactly one whole block.
        assert_eq!(check_all_blocks(dir.path()), 8, "direct {direct}");
    }
}

#[test]
fn a_file_open_elsewhere_is_unlinked_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    // LRU: every put below is stored and evicts one file. The default may turn a put of a
    // four-file store away once its shadows have told little apart (a vote near a tie),
    // which would leave one file fewer to reuse; that is admission, not what this tests.
    let store = Store::open(
        dir.path(),
        worker("0"),
        reusing(4).with_policy(PolicyKind::Lru),
    )
    .unwrap();
    let ks = keys(&store, 12);
    put_batch(&store, &ks[..4], 0, |_| LEN);
    let before = block_inodes(store.dir());
    // Another reader's descriptors on every block file.
    let mut held: Vec<(std::fs::File, Vec<u8>)> = block_files(store.dir())
        .into_iter()
        .map(|p| (std::fs::File::open(&p).unwrap(), std::fs::read(&p).unwrap()))
        .collect();
    assert_eq!(held.len(), 4);
    put_batch(&store, &ks[4..8], 4, |_| LEN);
    let s = store.stats();
    assert_eq!(s.evictions, 4);
    assert_eq!(s.reused_files, 0, "files held open must not be reused");
    assert!(block_inodes(store.dir()).is_disjoint(&before));
    // Each reader still reads its whole old file.
    for (f, old) in &mut held {
        let mut now = Vec::new();
        f.read_to_end(&mut now).unwrap();
        assert!(now == *old, "a held file changed under its reader");
    }
    for (i, k) in ks[4..8].iter().enumerate() {
        assert_holds(&store, k, &payload(4 + i as u64, 0, LEN));
    }
    // Once the readers are gone, reuse goes on.
    drop(held);
    put_batch(&store, &ks[8..], 8, |_| LEN);
    assert_eq!(store.stats().reused_files, 4);
    assert!(temp_files_under(dir.path()).is_empty());
    drop(store);
    assert_eq!(check_all_blocks(dir.path()), 4);
}

/// A block file with another name (a hard link: a `cp -al` snapshot of the cache, or planted)
/// is never rewritten: the other name keeps its bytes.
#[test]
fn a_file_with_another_hard_link_is_unlinked_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir_in(dir.path().parent().unwrap()).unwrap();
    let store = Store::open(dir.path(), worker("0"), reusing(4)).unwrap();
    let ks = keys(&store, 8);
    put_batch(&store, &ks[..4], 0, |_| LEN);
    let mut links = Vec::new();
    for (i, p) in block_files(store.dir()).into_iter().enumerate() {
        let link = outside.path().join(format!("snapshot-{i}"));
        std::fs::hard_link(&p, &link).unwrap();
        links.push((link, std::fs::read(&p).unwrap()));
    }
    put_batch(&store, &ks[4..], 4, |_| LEN);
    let s = store.stats();
    assert_eq!((s.evictions, s.reused_files), (4, 0));
    for (link, old) in &links {
        assert!(
            std::fs::read(link).unwrap() == *old,
            "{}: rewritten",
            link.display()
        );
    }
    for (i, k) in ks[4..].iter().enumerate() {
        assert_holds(&store, k, &payload(4 + i as u64, 0, LEN));
    }
    assert!(temp_files_under(dir.path()).is_empty());
}

#[test]
fn a_file_others_may_write_or_of_another_owner_is_unlinked_not_reused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("0"), reusing(4)).unwrap();
    let ks = keys(&store, 8);
    put_batch(&store, &ks[..4], 0, |_| LEN);
    let files = block_files(store.dir());
    // Root may give a file away (the owner part needs it); everyone may loosen a mode.
    let chowned = privileged("chown a block file to another user");
    if chowned {
        std::os::unix::fs::chown(&files[2], Some(12345), Some(12345)).unwrap();
    }
    std::fs::set_permissions(&files[0], std::fs::Permissions::from_mode(0o6666)).unwrap();
    std::fs::set_permissions(&files[1], std::fs::Permissions::from_mode(0o666)).unwrap();
    put_batch(&store, &ks[4..], 4, |_| LEN);
    let s = store.stats();
    let foreign = 2 + u64::from(chowned);
    assert_eq!((s.evictions, s.reused_files), (4, 4 - foreign));
    let me = rustix::process::geteuid().as_raw();
    for p in block_files(store.dir()) {
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.uid(), me, "{}: owned by {}", p.display(), m.uid());
        assert_eq!(
            m.mode() & 0o7777,
            0o644,
            "{}: mode {:o}",
            p.display(),
            m.mode()
        );
    }
    for (i, k) in ks[4..].iter().enumerate() {
        assert_holds(&store, k, &payload(4 + i as u64, 0, LEN));
    }
    assert!(temp_files_under(dir.path()).is_empty());
}

/// A pipe of at least `bytes`, and the bytes of `file` spliced into it (the pipe then holds
/// the file's page-cache pages, not copies), read back after `then` runs.
fn spliced_then(file: &Path, then: impl FnOnce()) -> Vec<u8> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let len = std::fs::metadata(file).unwrap().len() as usize;
    let mut fds = [0; 2];
    // SAFETY: `fds` is an array of two ints, which pipe2 fills.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 returned two new descriptors that nothing else owns.
    let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETPIPE_SZ takes an integer.
    let size = unsafe { libc::fcntl(tx.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    assert!(size as usize >= len, "pipe of {size} bytes for {len}");
    {
        let f = std::fs::File::open(file).unwrap();
        let mut off: libc::loff_t = 0;
        while (off as usize) < len {
            // SAFETY: both descriptors are open; `off` is a valid loff_t the call updates.
            let n = unsafe {
                libc::splice(
                    f.as_raw_fd(),
                    &mut off,
                    tx.as_raw_fd(),
                    std::ptr::null_mut(),
                    len - off as usize,
                    0,
                )
            };
            assert!(n > 0, "splice: {}", std::io::Error::last_os_error());
        }
    }
    then();
    drop(tx);
    let mut out = Vec::new();
    std::fs::File::from(rx).read_to_end(&mut out).unwrap();
    out
}

/// Bytes a reader took out with `splice` (or `sendfile`, `vmsplice` of a mapping: page
/// references the kernel does not report as opens) before closing its descriptor stay the
/// old block's when the store reuses the file: a buffered store empties the file before its
/// write, so the new block goes into new pages; an `O_DIRECT` write never goes into cached
/// pages.
#[test]
fn bytes_spliced_out_of_a_reused_file_stay_the_old_blocks() {
    // The temp dir's filesystem (ext4 here: pages dropped by FALLOC_FL_ZERO_RANGE), and a
    // tmpfs (no ZERO_RANGE: FALLOC_FL_PUNCH_HOLE).
    let tmpfs = Tmpfs::mount("64m", "a reused file on tmpfs");
    let local = tempfile::tempdir().unwrap();
    // Synced puts leave the victims' pages clean: dropped with POSIX_FADV_DONTNEED, but not
    // the ones the pipe holds.
    let mut runs: Vec<(&Path, bool, bool)> = vec![
        (local.path(), false, false),
        (local.path(), false, true),
        (local.path(), true, false),
    ];
    if let Some(t) = &tmpfs {
        runs.push((t.path(), false, false));
    }
    for (i, (root, direct, synced)) in runs.into_iter().enumerate() {
        let dir = tempfile::tempdir_in(root).unwrap();
        let store = Store::open(
            dir.path(),
            worker(&i.to_string()),
            reusing(4).with_direct_io(direct).with_sync_writes(synced),
        )
        .unwrap();
        let ks = keys(&store, 8);
        put_batch(&store, &ks[..4], 0, |_| LEN);
        let victim = store.path_of(&ks[0].hash);
        let old = std::fs::read(&victim).unwrap();
        let piped = spliced_then(&victim, || {
            put_batch(&store, &ks[4..], 4, |_| LEN);
            assert_eq!(store.stats().reused_files, 4, "direct {direct}");
        });
        assert!(
            piped == old,
            "{}, direct {direct}, synced {synced}: the pipe delivered other bytes than the evicted block's (first difference at {:?})",
            root.display(),
            piped.iter().zip(&old).position(|(a, b)| a != b)
        );
        for (i, k) in ks[4..].iter().enumerate() {
            assert_holds(&store, k, &payload(4 + i as u64, 0, LEN));
        }
    }
}

/// Puts 12 blocks into `reusing(4)` opened with `faults` and returns the store's stats; the
/// last four blocks read back whole and no temp file is left.
fn twelve_into_four(faults: &Arc<NsFaults>) -> tierkv::StoreStats {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_with(
        dir.path(),
        worker("0"),
        reusing(4).with_watermarks(1.0, 1.0),
        Components::new().with_ns_faults(faults.clone()),
    )
    .unwrap();
    let ks = keys(&store, 12);
    put_batch(&store, &ks[..4], 0, |_| LEN);
    put_batch(&store, &ks[4..8], 4, |_| LEN);
    put_batch(&store, &ks[8..], 8, |_| LEN);
    for (i, k) in ks[8..].iter().enumerate() {
        assert_holds(&store, k, &payload(8 + i as u64, 0, LEN));
    }
    assert!(temp_files_under(dir.path()).is_empty());
    let s = store.stats();
    drop(store);
    assert_eq!(check_all_blocks(dir.path()), 4);
    s
}

/// Where the filesystem grants no leases the store finds out when it opens (it takes and
/// releases one on an anonymous file) and unlinks what it evicts; a filesystem that stops
/// granting them later (the first refusal) stops reuse for the store's life; a file it may
/// not lease (another owner's: EACCES) is only unlinked, and reuse goes on.
#[test]
fn without_leases_evicted_files_are_unlinked() {
    // As a filesystem without leases answers (FUSE, NFS, `fs.leases-enable = 0`): the
    // open's probe is refused, and no eviction asks again.
    let faults = Arc::new(NsFaults::new());
    faults.fail(NsOp::Lease, Errno::INVAL, 0, u64::MAX);
    let s = twelve_into_four(&faults);
    assert_eq!((s.evictions, s.reused_files), (8, 0));
    assert_eq!(faults.injected(), 1);
    // The probe passes, the first eviction's lease is refused: asked once more, never again.
    let faults = Arc::new(NsFaults::new());
    faults.fail(NsOp::Lease, Errno::INVAL, 1, u64::MAX);
    let s = twelve_into_four(&faults);
    assert_eq!((s.evictions, s.reused_files), (8, 0));
    assert_eq!(faults.injected(), 1);
    // One file that may not be leased: that one is unlinked, the other seven reused.
    let faults = Arc::new(NsFaults::new());
    faults.fail(NsOp::Lease, Errno::ACCESS, 1, 1);
    let s = twelve_into_four(&faults);
    assert_eq!((s.evictions, s.reused_files), (8, 7));
    assert_eq!(faults.injected(), 1);
}

/// Reuse replaces the background evictor only where it is in effect: a store whose open
/// found no leases runs the evictor (down to the low watermark); a reusing one evicts only
/// in the put that needs the room.
#[test]
fn without_leases_the_background_evictor_runs() {
    let faults = Arc::new(NsFaults::new());
    faults.fail(NsOp::Lease, Errno::INVAL, 0, u64::MAX);
    let open = |dir: &Path, faults: Arc<NsFaults>| {
        // Default watermarks, 0.95 and 0.90: the evictor starts at 19 of 20 blocks and
        // evicts down to 18.
        Store::open_with(
            dir,
            worker("0"),
            reusing(20),
            Components::new().with_ns_faults(faults),
        )
        .unwrap()
    };
    let a = tempfile::tempdir().unwrap();
    let store = open(a.path(), faults);
    let ks = keys(&store, 20);
    put_batch(&store, &ks, 0, |_| LEN);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while store.stats().used_files > 18 {
        assert!(std::time::Instant::now() < deadline, "{:?}", store.stats());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(store.stats().reused_files, 0);
    // With leases, the same 20 blocks stay: nothing evicts ahead of the puts.
    let b = tempfile::tempdir().unwrap();
    let store = open(b.path(), Arc::new(NsFaults::new()));
    let ks = keys(&store, 21);
    put_batch(&store, &ks[..20], 0, |_| LEN);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(store.stats().used_files, 20);
    put_batch(&store, &ks[20..], 20, |_| LEN);
    let s = store.stats();
    assert_eq!((s.used_files, s.evictions, s.reused_files), (20, 1, 1));
}

#[test]
fn an_evicted_name_holding_a_symlink_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("victim");
    std::fs::write(&target, b"not the store's").unwrap();
    let store = Store::open(dir.path(), worker("0"), reusing(4)).unwrap();
    let ks = keys(&store, 8);
    put_batch(&store, &ks[..4], 0, |_| LEN);
    let names = block_files(store.dir());
    for p in &names {
        std::fs::remove_file(p).unwrap();
        std::os::unix::fs::symlink(&target, p).unwrap();
    }
    put_batch(&store, &ks[4..], 4, |_| LEN);
    assert_eq!(store.stats().reused_files, 0);
    assert_eq!(std::fs::read(&target).unwrap(), b"not the store's");
    for p in &names {
        assert!(
            std::fs::symlink_metadata(p)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
    for (i, k) in ks[4..].iter().enumerate() {
        assert_holds(&store, k, &payload(4 + i as u64, 0, LEN));
    }
}

/// Readers in other stores (read-only, opening a file per access, so their opens race the
/// renames and leases) while a full store reuses every file it evicts: every hit is the
/// whole block its key was put with.
#[test]
fn readers_racing_reuse_never_get_another_blocks_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Store::open(dir.path(), worker("0"), reusing(16)).unwrap();
    const ROUNDS: u64 = 150;
    const BATCH: u64 = 8;
    let keys_all = keys(&writer, ROUNDS * BATCH);
    let done = AtomicBool::new(false);
    let hits = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut buf = vec![0u8; LEN];
                while !done.load(Ordering::Relaxed) {
                    // A fresh read-only store knows the blocks present now.
                    let cfg = StoreConfig::new()
                        .with_read_only(true)
                        .with_fd_cache(0)
                        .with_stats_interval(None);
                    let reader = Store::open(dir.path(), worker("0"), cfg).unwrap();
                    for _ in 0..4 {
                        for (i, k) in keys_all.iter().enumerate() {
                            if let Lookup::Hit(n) = reader.get(k, &mut buf).unwrap() {
                                assert!(
                                    buf[..n] == payload(i as u64, 0, LEN),
                                    "{k}: a reader got other bytes than its block's"
                                );
                                hits.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        // The readers stop when the writer ends, whether it returns or panics.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _done = Done(&done);
        for r in 0..ROUNDS {
            let at = (r * BATCH) as usize;
            put_batch(
                &writer,
                &keys_all[at..at + BATCH as usize],
                r * BATCH,
                |_| LEN,
            );
        }
    });
    let s = writer.stats();
    assert!(hits.load(Ordering::Relaxed) > 0, "the readers read nothing");
    assert!(s.reused_files > 0, "nothing was reused: {s:?}");
    assert_eq!(s.evictions, ROUNDS * BATCH - 16);
    drop(writer);
    assert_eq!(check_all_blocks(dir.path()), 16);
}

/// An engine that, at the first write it is armed for, opens the file being written from
/// another thread (as a reader racing the reuse would: the file is reachable only under its
/// temp name) and lets the write start only after that open has had time to finish.
#[derive(Debug)]
struct OpenDuringWrite {
    inner: Arc<dyn IoEngine>,
    dir: std::path::PathBuf,
    armed: AtomicBool,
    /// How long the write waits for the open.
    wait: std::time::Duration,
    /// Whether the open was still waiting when the write started; what it read, once done.
    seen: Mutex<Option<(bool, std::thread::JoinHandle<Vec<u8>>)>>,
}

impl IoEngine for OpenDuringWrite {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<std::io::Result<usize>> {
        self.inner.submit(batch)
    }
    fn submit_stream(
        &self,
        stream: &mut dyn Iterator<Item = IoRequest<'_>>,
    ) -> Vec<std::io::Result<usize>> {
        let mut out = Vec::new();
        for r in stream {
            if self.armed.swap(false, Ordering::Relaxed) {
                let temps = temp_files_under(&self.dir);
                assert_eq!(temps.len(), 1, "the reused file, under its temp name");
                let path = temps[0].clone();
                let opener = std::thread::spawn(move || {
                    let mut bytes = Vec::new();
                    std::fs::File::open(&path)
                        .unwrap()
                        .read_to_end(&mut bytes)
                        .unwrap();
                    bytes
                });
                std::thread::sleep(self.wait);
                *self.seen.lock().unwrap() = Some((!opener.is_finished(), opener));
            }
            out.extend(self.inner.submit(&mut [r]));
        }
        out
    }
}

/// An `open` of a file being reused waits until the new block is in it, then reads that
/// whole block: never the evicted bytes, never a mix.
#[test]
fn an_open_racing_the_reuse_waits_for_the_whole_new_block() {
    let _sysctl = LEASE_BREAK_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(OpenDuringWrite {
        inner: EngineKind::Psync.build().unwrap(),
        dir: dir.path().to_path_buf(),
        armed: AtomicBool::new(false),
        wait: std::time::Duration::from_millis(300),
        seen: Mutex::new(None),
    });
    let store =
        Store::open_with_engine(dir.path(), worker("0"), reusing(1), engine.clone()).unwrap();
    let ks = keys(&store, 2);
    // The new block is shorter than the old one (within its page): the file is cut after
    // the write, and the lease must hold until then.
    store.put(&ks[0], &payload(0, 0, LEN + 1000)).unwrap();
    engine.armed.store(true, Ordering::Relaxed);
    store.put(&ks[1], &payload(1, 0, LEN + 500)).unwrap();
    assert_eq!(store.stats().reused_files, 1);
    let (waited, opener) = engine
        .seen
        .lock()
        .unwrap()
        .take()
        .expect("the engine was armed");
    assert!(
        waited,
        "an open of the reused file did not wait for the put's write"
    );
    let read = opener.join().unwrap();
    let file = std::fs::read(store.path_of(&ks[1].hash)).unwrap();
    assert!(
        read == file,
        "the racing open read other bytes than the new block's file"
    );
    assert_holds(&store, &ks[1], &payload(1, 0, LEN + 500));
}

/// Held by the tests whose opens wait on a lease, so that the one that shortens the kernel's
/// lease-break time does not let theirs through.
static LEASE_BREAK_TIME: Mutex<()> = Mutex::new(());

/// `/proc/sys/fs/lease-break-time` set to `secs` while it lives, then put back.
struct LeaseBreakTime(String);

impl LeaseBreakTime {
    const PATH: &str = "/proc/sys/fs/lease-break-time";
    fn set(secs: u32) -> Self {
        let old = std::fs::read_to_string(Self::PATH).unwrap();
        std::fs::write(Self::PATH, secs.to_string()).unwrap();
        Self(old)
    }
}

impl Drop for LeaseBreakTime {
    fn drop(&mut self) {
        std::fs::write(Self::PATH, self.0.trim()).unwrap();
    }
}

/// A put during whose write the kernel let a waiting `open` through (the lease-break time
/// passed: a slow disk, a large block) fails and publishes nothing: the process that opened
/// the file may have read a mix of both blocks, and holds it.
#[test]
fn a_put_whose_lease_was_broken_fails_and_publishes_nothing() {
    if !privileged("set fs.lease-break-time") {
        return;
    }
    let _sysctl = LEASE_BREAK_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for direct in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(OpenDuringWrite {
            inner: EngineKind::Psync.build().unwrap(),
            dir: dir.path().to_path_buf(),
            armed: AtomicBool::new(false),
            wait: std::time::Duration::from_millis(1500),
            seen: Mutex::new(None),
        });
        let cfg = reusing(1).with_direct_io(direct);
        let store = Store::open_with_engine(dir.path(), worker("0"), cfg, engine.clone()).unwrap();
        let ks = keys(&store, 3);
        store.put(&ks[0], &payload(0, 0, LEN)).unwrap();
        let err = {
            let _short = LeaseBreakTime::set(1);
            engine.armed.store(true, Ordering::Relaxed);
            store.put(&ks[1], &payload(1, 0, LEN)).unwrap_err()
        };
        let (waited, opener) = engine.seen.lock().unwrap().take().expect("armed");
        assert!(
            !waited,
            "direct {direct}: the kernel did not let the open through"
        );
        opener.join().unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("broken during the put") && msg.contains(dir.path().to_str().unwrap()),
            "direct {direct}: {msg}"
        );
        let mut buf = vec![0u8; 2 * LEN];
        for k in &ks[..2] {
            assert_eq!(store.get(k, &mut buf).unwrap(), Lookup::Miss, "{k}");
        }
        assert!(temp_files_under(dir.path()).is_empty());
        assert!(block_files(store.dir()).is_empty());
        assert_eq!(store.stats().reused_files, 0);
        // The store goes on, reusing again.
        store.put(&ks[2], &payload(2, 0, LEN)).unwrap();
        assert_holds(&store, &ks[2], &payload(2, 0, LEN));
    }
}

/// A reader's non-blocking open that meets a writer's lease (`EAGAIN`: the name it resolved
/// is being reused) is a miss, not an error.
#[test]
fn an_open_refused_by_a_lease_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    let store = Store::open_with(
        dir.path(),
        worker("0"),
        StoreConfig::new()
            .with_fd_cache(0)
            .with_stats_interval(None),
        Components::new().with_ns_faults(faults.clone()),
    )
    .unwrap();
    let ks = keys(&store, 1);
    store.put(&ks[0], &payload(0, 0, LEN)).unwrap();
    faults.fail(NsOp::Open, Errno::AGAIN, 0, u64::MAX);
    let mut buf = vec![0u8; LEN];
    assert_eq!(store.get(&ks[0], &mut buf).unwrap(), Lookup::Miss);
    faults.clear();
    assert_holds(&store, &ks[0], &payload(0, 0, LEN));
}

/// Shared mode never reuses: another node may have the old name cached (docs/shared.md).
#[test]
fn shared_stores_unlink_what_they_evict() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = reusing(4).with_sharing(tierkv::Sharing::Shared);
    let store = Store::open(dir.path(), worker("0"), cfg).unwrap();
    let ks = keys(&store, 8);
    put_batch(&store, &ks[..4], 0, |_| LEN);
    put_batch(&store, &ks[4..], 4, |_| LEN);
    let s = store.stats();
    assert!(s.evictions >= 4, "{s:?}");
    // (Inode numbers say nothing here: ext4 hands an unlinked file's number to the next.)
    assert_eq!(s.reused_files, 0);
    for (i, k) in ks[4..].iter().enumerate() {
        assert_holds(&store, k, &payload(4 + i as u64, 0, LEN));
    }
}

/// On by default; a store told not to reuse unlinks what it evicts.
#[test]
fn reuse_is_on_by_default_and_off_when_asked() {
    for reuse in [None, Some(false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::new()
            .with_capacity_files(4)
            .with_watermarks(1.0, 1.0)
            .with_stats_interval(None);
        if let Some(on) = reuse {
            cfg = cfg.with_reuse_evicted(on);
        }
        let store = Store::open(dir.path(), worker("0"), cfg).unwrap();
        let ks = keys(&store, 8);
        put_batch(&store, &ks[..4], 0, |_| LEN);
        let paths = path_descriptors(store.dir());
        put_batch(&store, &ks[4..], 4, |_| LEN);
        let s = store.stats();
        let kept = paths
            .iter()
            .filter(|fd| rustix::fs::fstat(fd).unwrap().st_nlink > 0)
            .count();
        if reuse.is_none() {
            assert_eq!((s.evictions, s.reused_files, kept), (4, 4, 4), "default");
        } else {
            assert_eq!((s.evictions, s.reused_files, kept), (4, 0, 0), "off");
        }
    }
}
