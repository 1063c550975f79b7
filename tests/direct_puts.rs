//! Large puts write with `O_DIRECT` (`StoreConfig::direct_puts_from`, 2 MiB by default): their
//! bytes reach the disk without new page-cache memory, which is what a buffered write of that
//! size pays for on this project's machines (docs/benchmarks.md, "Direct puts"); small puts
//! stay buffered; a filesystem that refuses `O_DIRECT` gets buffered puts. Every block reads
//! back byte-exact and passes the independent format oracle.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use rustix::io::Errno;
use tierkv::testing::{NsFaults, NsOp};
use tierkv::{Lookup, Publish, Store, StoreConfig};

const BIG: usize = 2 << 20;
const SMALL: usize = 64 << 10;

/// A directory on a disk-backed filesystem: on tmpfs every file is page cache, so what a put
/// leaves there says nothing.
fn disk_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in("/var/tmp").expect("a temp dir in /var/tmp");
    let fs = rustix::fs::statfs(dir.path()).expect("statfs /var/tmp");
    assert_ne!(
        fs.f_type as i64,
        libc::TMPFS_MAGIC,
        "/var/tmp is a tmpfs: these tests need a disk-backed filesystem there"
    );
    dir
}

/// The pages of `path` in the page cache, and its pages in all.
fn resident(path: &Path) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let pages = len.div_ceil(page);
    // SAFETY: a fresh shared read-only mapping of an open file, never dereferenced (only
    // mincore reads the kernel's view of it) and unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "mmap {}", path.display());
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page.
    let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
    // SAFETY: the mapping made above, of `len` bytes, no longer used.
    unsafe { libc::munmap(map, len) };
    assert_eq!(rc, 0, "mincore {}", path.display());
    (vec.iter().filter(|b| *b & 1 == 1).count(), pages)
}

fn open(dir: &Path, cfg: StoreConfig) -> Store {
    Store::open(dir, worker("w"), cfg.with_stats_interval(None)).unwrap()
}

/// Puts `data` under `hash(i)` and reads it back byte-exact.
fn put_and_check(store: &Store, i: u64, data: &[u8]) {
    store.put(&store.key(hash(i)), data).unwrap();
    check(store, i, data);
}

/// Reads `hash(i)` back: `data`, byte for byte.
fn check(store: &Store, i: u64, data: &[u8]) {
    let mut buf = vec![0u8; data.len()];
    let got = store.get(&store.key(hash(i)), &mut buf).unwrap();
    assert_eq!(got, Lookup::Hit(data.len()), "block {i}");
    assert!(buf == data, "block {i} read back other bytes");
}

/// Puts `data` under `hash(i)` and says how much of its file is in the page cache (before
/// anything reads it).
fn put_resident(store: &Store, i: u64, data: &[u8]) -> (usize, usize) {
    store.put(&store.key(hash(i)), data).unwrap();
    resident(&store.path_of(&hash(i)))
}

#[test]
fn large_puts_leave_no_new_page_cache_and_small_ones_stay_buffered() {
    let dir = disk_dir();
    let store = open(dir.path(), StoreConfig::new());
    let big = payload(1, 0, BIG);
    let small = payload(2, 0, SMALL);
    let (res, pages) = put_resident(&store, 1, &big);
    assert_eq!(
        res, 0,
        "a 2 MiB put left {res} of {pages} pages in the page cache"
    );
    let (res, pages) = put_resident(&store, 2, &small);
    assert_eq!(res, pages, "a 64 KiB put is buffered");
    // A payload from an aligned buffer (an engine's pool) is written from the caller's memory.
    let mut aligned = tierkv::AlignedBuf::zeroed(BIG);
    aligned.copy_from_slice(&payload(3, 0, BIG));
    let (res, _) = put_resident(&store, 3, &aligned);
    assert_eq!(res, 0, "an aligned 2 MiB put");
    // Just below the default threshold: buffered; at it: direct.
    let (res, pages) = put_resident(&store, 4, &payload(4, 0, BIG - 4096));
    assert_eq!(res, pages, "2 MiB - 4 KiB is buffered");
    let (res, _) = put_resident(&store, 5, &payload(5, 0, BIG));
    assert_eq!(res, 0, "2 MiB is direct");
    // An odd length (not a multiple of 4 KiB) still goes direct, through the bounce buffer.
    let odd = payload(6, 0, BIG + 1000);
    let (res, _) = put_resident(&store, 6, &odd);
    assert_eq!(res, 0, "an odd-length 2 MiB put");
    for (i, data) in [(1, &big[..]), (2, &small), (3, &aligned), (6, &odd)] {
        check(&store, i, data);
    }
    assert_eq!(check_all_blocks(dir.path()), 6);
    // Turned off: a 2 MiB put is buffered like any other.
    let dir = disk_dir();
    let store = open(dir.path(), StoreConfig::new().with_direct_puts_from(None));
    let (res, pages) = put_resident(&store, 1, &big);
    assert_eq!(res, pages, "with direct puts off, a 2 MiB put is buffered");
    put_and_check(&store, 1, &big);
}

/// A full store writes new blocks into evicted blocks' files (opened without `O_DIRECT`):
/// a large one is switched to `O_DIRECT` for its write.
#[test]
fn a_reused_evicted_file_takes_a_large_put_directly() {
    let dir = disk_dir();
    let store = open(dir.path(), StoreConfig::new().with_capacity_files(2));
    for i in 0..2 {
        put_and_check(&store, i, &payload(i, 0, BIG));
    }
    let data = payload(9, 0, BIG);
    let (res, pages) = put_resident(&store, 9, &data);
    assert_eq!(store.stats().reused_files, 1, "the third put reused a file");
    assert_eq!(
        res, 0,
        "a reused file's 2 MiB put left {res} of {pages} pages"
    );
    check(&store, 9, &data);
    assert_eq!(check_all_blocks(dir.path()), 2);
}

/// A filesystem that refuses `O_DIRECT` (EINVAL when the file is created) gets buffered puts:
/// the put that met the refusal succeeds, and the next ones do not ask again. Both ways of
/// publishing.
#[test]
fn a_filesystem_refusing_o_direct_gets_buffered_puts() {
    for publish in [Publish::Rename, Publish::Tmpfile] {
        let dir = disk_dir();
        let faults = Arc::new(NsFaults::new());
        let cfg = StoreConfig::new().with_publish(publish);
        let store = open_with_ns_faults(dir.path(), cfg, &faults);
        faults.fail(NsOp::Create, Errno::INVAL, 0, 1);
        let big = payload(1, 0, BIG);
        put_and_check(&store, 1, &big);
        assert_eq!(faults.injected(), 1, "{publish:?}");
        let (res, pages) = put_resident(&store, 2, &payload(2, 0, BIG));
        assert_eq!(
            res, pages,
            "{publish:?}: puts are buffered after the refusal"
        );
        assert!(temp_files_under(dir.path()).is_empty(), "{publish:?}");
        assert_eq!(check_all_blocks(dir.path()), 2, "{publish:?}");
    }
    // EINVAL from O_TMPFILE with O_DIRECT and again without: the filesystem has no O_TMPFILE,
    // and the named temp file still takes O_DIRECT.
    let dir = disk_dir();
    let faults = Arc::new(NsFaults::new());
    let cfg = StoreConfig::new().with_publish(Publish::Tmpfile);
    let store = open_with_ns_faults(dir.path(), cfg, &faults);
    faults.fail(NsOp::Create, Errno::INVAL, 0, 2);
    let big = payload(1, 0, BIG);
    let (res, pages) = put_resident(&store, 1, &big);
    assert_eq!(faults.injected(), 2);
    assert_eq!(
        res, 0,
        "O_DIRECT blamed for O_TMPFILE: {res} of {pages} pages cached"
    );
    check(&store, 1, &big);
    // EINVAL on every create: the put fails, naming its path, and leaves nothing.
    let dir = disk_dir();
    let faults = Arc::new(NsFaults::new());
    let store = open_with_ns_faults(dir.path(), StoreConfig::new(), &faults);
    faults.fail(NsOp::Create, Errno::INVAL, 0, u64::MAX);
    match store.put(&store.key(hash(1)), &payload(1, 0, BIG)) {
        Err(tierkv::Error::Io { path, source }) => {
            assert_eq!(source.raw_os_error(), Some(Errno::INVAL.raw_os_error()));
            assert!(path.starts_with(dir.path()), "{path:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(temp_files_under(dir.path()).is_empty());
    assert_eq!(check_all_blocks(dir.path()), 0);
}

/// A real filesystem that refuses `O_DIRECT` (ramfs: the open fails with EINVAL after
/// `O_CREAT` made the file): a large put succeeds buffered, the named file the refused open
/// left is removed, and nothing but the blocks stays in the tree. Both ways of publishing.
#[test]
fn large_puts_on_ramfs_are_buffered_and_leave_nothing_behind() {
    for publish in [Publish::Rename, Publish::Tmpfile] {
        let Some(fs) = Tmpfs::mount_ramfs("a filesystem that refuses O_DIRECT") else {
            return;
        };
        let store = open(fs.path(), StoreConfig::new().with_publish(publish));
        for i in 0..3 {
            put_and_check(&store, i, &payload(i, 0, BIG));
        }
        let files = files_under(fs.path());
        assert!(
            temp_files_under(fs.path()).is_empty(),
            "{publish:?}: {files:?}"
        );
        assert_eq!(check_all_blocks(fs.path()), 3, "{publish:?}: {files:?}");
    }
}
