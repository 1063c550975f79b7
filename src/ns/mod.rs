//! The namespace layer: every file operation of the library and its tools, relative to one
//! worker directory's descriptor, and never through a symlink.
//!
//! A [`BlockDir`] owns the descriptor of `<root>/v1/<worker>`, opened component by component
//! with `O_NOFOLLOW | O_DIRECTORY` (so neither `v1` nor the worker directory may be a symlink;
//! the root itself is the caller's path). Every other operation names a path *relative* to it
//! and resolves it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`,
//! or, on kernels without `openat2`, by a walk that opens each directory with
//! `O_NOFOLLOW | O_DIRECTORY`. So:
//!
//! - a symlink anywhere on a path (a shard directory, a block name, a control file) is refused
//!   (`ELOOP`), never followed;
//! - data files are opened with `O_NONBLOCK` and checked with `fstat`: a FIFO, device or
//!   socket under a block's name is [`Opened::NotRegular`], never read (so it cannot hang a
//!   read) and never removed;
//! - names are unlinked through their parent directory's descriptor, only if they name a
//!   regular file, and only if it is still the inode that was judged (dev + ino), when the
//!   caller judged one ([`BlockDir::unlink_file`]);
//! - control files (`LAYOUT`, `STATS.json`, `.lock`) are read with a size bound and written to
//!   an `O_EXCL` temp name that is then renamed into place ([`BlockDir::write_control`]).
//!
//! [`NsFaults`] is the layer's fault-injecting twin: tests make any operation fail with an
//! errno of their choice, as [`FaultyEngine`](crate::engine::FaultyEngine) does for data I/O.

mod fault;

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

pub use fault::{NsFaults, NsOp};

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::layout::{FLOCK_FILE, LOCK_FILE, TEMP_PREFIX, USAGE_FILE};

/// Mode of directories the layer creates, as passed to `mkdir` (the umask applies).
pub const DIR_MODE: u32 = 0o755;
/// Mode of files the layer creates, as passed to `open` (the umask applies).
pub const FILE_MODE: u32 = 0o644;
/// The largest control file the layer reads (`LAYOUT`, `STATS.json`, `.lock`).
pub const MAX_CONTROL_LEN: usize = 1 << 20;

/// What a data open found under a name.
#[derive(Debug)]
pub enum Opened {
    /// A regular file, with its `fstat`.
    File(OwnedFd, Box<Stat>),
    /// Something else (FIFO, device, socket, directory): not opened for data, never removed.
    NotRegular(FileKind),
}

pub use crate::sys::FileKind;

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The name (bytes; not always UTF-8).
    pub name: OsString,
    /// Its type, from the listing or (where the filesystem does not say) an `fstatat` that
    /// does not follow symlinks.
    pub kind: FileKind,
}

impl Entry {
    /// The name as UTF-8, or `""` when it is not (such a name is never one of ours).
    pub fn name_str(&self) -> &str {
        self.name.to_str().unwrap_or("")
    }
}

/// The outcome of [`BlockDir::unlink_file`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlinked {
    /// The name was removed.
    Removed,
    /// Nothing had the name.
    Missing,
    /// The name was left alone: it is not a regular file, or no longer the inode judged.
    Refused,
}

/// The identity of an inode: the file a caller judged, for [`BlockDir::unlink_file`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl Inode {
    /// The identity of a `stat` result.
    pub fn of(st: &Stat) -> Inode {
        Inode {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// The open usage ledger of a shared worker ([`BlockDir::open_ledger`]): a small file read
/// and rewritten in place while its `flock` is held.
#[derive(Debug)]
pub struct Ledger {
    fd: OwnedFd,
    path: PathBuf,
    /// Opened `O_DIRECT`: reads and writes are whole aligned [`LEDGER_LEN`] blocks.
    direct: bool,
    /// Threads of this process: `flock` on one open file does not exclude them.
    local: std::sync::Mutex<()>,
    /// How long [`Ledger::lock`] waits for another holder.
    wait: std::time::Duration,
}

/// A held ledger lock; released when dropped.
#[derive(Debug)]
pub struct LedgerGuard<'a> {
    ledger: &'a Ledger,
    _local: std::sync::MutexGuard<'a, ()>,
}

impl Ledger {
    /// The ledger's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the ledger's exclusive lock. Every holder keeps it for one short update, so
    /// this polls (`LOCK_NB`, backing off from 1 to 20 ms) for at most the ledger's wait: a
    /// holder that does not let go (stopped with `SIGSTOP`, or hung on a dead filesystem)
    /// makes it fail with `TimedOut`, naming the ledger, instead of waiting for ever.
    pub fn lock(&self) -> Result<LedgerGuard<'_>> {
        let local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(1);
        loop {
            match rustix::fs::flock(&self.fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    return Ok(LedgerGuard {
                        ledger: self,
                        _local: local,
                    });
                }
                Err(Errno::INTR) => {}
                Err(Errno::WOULDBLOCK) if started.elapsed() < self.wait => {
                    std::thread::sleep(pause);
                    pause = pause
                        .saturating_mul(2)
                        .min(std::time::Duration::from_millis(20));
                }
                Err(Errno::WOULDBLOCK) => {
                    let msg = format!(
                        "another store has held the usage ledger's lock for {:?} and not let go (stopped, or hung)",
                        self.wait
                    );
                    let e = std::io::Error::new(std::io::ErrorKind::TimedOut, msg);
                    return Err(Error::from_io(&self.path, e));
                }
                Err(e) => return Err(Error::from_io(&self.path, io_err(e))),
            }
        }
    }
}

/// How often a store checks that its worker lock's file is still in place
/// ([`BlockDir::keep_lock`]).
pub const LOCK_KEEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// How long an opener waits for a missing lock file to be put back by a holder before it
/// creates one: several of the holder's checks ([`LOCK_KEEP_INTERVAL`]).
pub const LOCK_FILE_GRACE: std::time::Duration = std::time::Duration::from_millis(1500);

/// What [`BlockDir::keep_lock`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockKept {
    /// The lock file is in place.
    Held,
    /// It was gone or replaced: a new one is in place, and locked by this store.
    Restored,
    /// It was gone, and another store has locked the one made since: the worker is no longer
    /// this store's alone.
    Lost,
}

/// The ledger file's length: one 4 KiB block (the record, then NUL bytes), so it can be read
/// and written `O_DIRECT`.
pub const LEDGER_LEN: usize = 4096;

impl LedgerGuard<'_> {
    /// The ledger's record: its bytes up to the first NUL (at most [`LEDGER_LEN`]).
    pub fn read(&self) -> Result<Vec<u8>> {
        let mut buf = crate::buf::AlignedBuf::zeroed(LEDGER_LEN);
        let mut n = 0;
        loop {
            match rustix::io::pread(&self.ledger.fd, &mut buf[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => {
                    n += k;
                    // O_DIRECT reads whole blocks: one read is the file.
                    if n == LEDGER_LEN || self.ledger.direct {
                        break;
                    }
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(Error::from_io(&self.ledger.path, io_err(e))),
            }
        }
        let end = buf[..n].iter().position(|&b| b == 0).unwrap_or(n);
        Ok(buf[..end].to_vec())
    }

    /// Rewrites the ledger with the record `bytes` (at most [`LEDGER_LEN`]), padded with NULs
    /// to one block, in place, and `fdatasync`s it so the next holder on any client reads it.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        let path = &self.ledger.path;
        if bytes.len() > LEDGER_LEN {
            return Err(Error::Config(format!(
                "{}: a ledger record of {} bytes",
                path.display(),
                bytes.len()
            )));
        }
        let mut buf = crate::buf::AlignedBuf::zeroed(LEDGER_LEN);
        buf[..bytes.len()].copy_from_slice(bytes);
        let fd = self.ledger.fd.as_fd();
        let n = crate::sys::write_full(fd, 0, &mut [std::io::IoSlice::new(&buf)])
            .map_err(|e| Error::from_io(path, e))?;
        if n != LEDGER_LEN {
            return Err(Error::from_io(path, std::io::ErrorKind::WriteZero.into()));
        }
        rustix::fs::fdatasync(fd).map_err(|e| Error::from_io(path, io_err(e)))
    }
}

impl Drop for LedgerGuard<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.ledger.fd, FlockOperation::Unlock);
    }
}

/// A parent directory of a name: the worker directory itself or a shard directory opened
/// beneath it.
#[derive(Debug)]
pub enum Parent<'a> {
    /// The worker directory.
    Top(BorrowedFd<'a>),
    /// A shard directory.
    Sub(OwnedFd),
}

impl AsFd for Parent<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Parent::Top(fd) => *fd,
            Parent::Sub(fd) => fd.as_fd(),
        }
    }
}

/// The `errno` as a `std::io::Error`.
pub fn io_err(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

/// One worker directory and every file operation beneath it. See the module docs.
#[derive(Debug)]
pub struct BlockDir {
    fd: OwnedFd,
    path: PathBuf,
    has_openat2: AtomicBool,
    has_noreplace: AtomicBool,
    faults: Option<Arc<NsFaults>>,
    seq: AtomicU64,
    /// The open [`FLOCK_FILE`], once the worker lock was taken.
    lock_file: std::sync::Mutex<Option<OwnedFd>>,
}

/// This node's identity in names of temp and stats files: 64 bits of the blake3 hash of the
/// host name, the kernel's boot id and the pid namespace. Processes with equal ids see each
/// other's pids (so a temp file's owner can be checked with `kill(pid, 0)`); a reboot, another
/// host or another pid namespace (a container) is another node. Where the boot id or the pid
/// namespace cannot be read (no /proc, or another /proc mounted over it), this process is a
/// node of its own ([`node_id_of`]).
pub fn node_id() -> u64 {
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let boot_id = std::fs::read("/proc/sys/kernel/random/boot_id").ok();
        let pid_ns = std::fs::read_link("/proc/self/ns/pid")
            .ok()
            .map(|p| p.into_os_string().into_encoded_bytes());
        node_id_of(&host_name(), boot_id.as_deref(), pid_ns.as_deref())
    })
}

/// The node id of a process on host `host` whose boot id and pid namespace link read as
/// given. Without either, processes of two pid namespaces (two containers, `unshare -p` with
/// a tmpfs over /proc) could share an id and take each other's live pids for dead ones (or a
/// reboot could keep the id, and a dead writer's pid pass for a live one): the id then also
/// hashes 16 random bytes drawn for this call, so that no other process has it.
pub fn node_id_of(host: &str, boot_id: Option<&[u8]>, pid_ns: Option<&[u8]>) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(host.as_bytes());
    h.update(b"\0");
    match (boot_id, pid_ns) {
        (Some(b), Some(p)) if !b.is_empty() && !p.is_empty() => {
            h.update(b);
            h.update(b"\0");
            h.update(p);
        }
        _ => {
            h.update(b"\0alone\0");
            h.update(&process_nonce());
        }
    }
    let b = h.finalize();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// 16 random bytes: two hashes of std's `RandomState`, whose keys come from the operating
/// system's random source (and differ for each `RandomState` made).
fn process_nonce() -> [u8; 16] {
    use std::hash::BuildHasher;
    let mut n = [0u8; 16];
    n[..8].copy_from_slice(&std::hash::RandomState::new().hash_one(0u8).to_le_bytes());
    n[8..].copy_from_slice(&std::hash::RandomState::new().hash_one(1u8).to_le_bytes());
    n
}

/// Makes sure that nothing written to `fd`'s file (of `len` bytes, under the caller's write
/// lease) goes into a page-cache page that something may still reference without an open
/// descriptor: a pipe filled by `splice`, a socket by `sendfile`. Such a page stays in the
/// file's cache for as long as it is referenced (reclaim cannot take it), so:
/// 1. no dirty page (`cachestat`): `POSIX_FADV_DONTNEED` drops the clean ones nothing
///    references; if then none is cached, the file is kept, and the write fills new pages
///    into the blocks it has;
/// 2. otherwise (dirty pages, pages something holds, or no `cachestat`): `ftruncate` to 0,
///    which takes every folio out of the file (a held one keeps its bytes, detached; a dirty
///    one is discarded unwritten) and frees the blocks. Nothing short of the whole file will
///    do: a large folio cut in its middle (a truncate to a page boundary, a hole punched in
///    one page) is zeroed in place, under whoever holds it. ext4 and XFS start writing back
///    what is written next when the file is closed (`auto_da_alloc`, their truncate-then-
///    rewrite heuristics), which is slower than keeping the file.
///
/// Returns which of these it took.
pub fn drop_pages(fd: BorrowedFd<'_>, len: u64) -> rustix::io::Result<PagesDropped> {
    if let Some((_, 0)) = cachestat(fd, len) {
        let advice = rustix::fs::Advice::DontNeed;
        rustix::fs::fadvise(fd, 0, std::num::NonZeroU64::new(len), advice)?;
        if let Some((0, _)) = cachestat(fd, len) {
            return Ok(PagesDropped::Clean);
        }
    }
    rustix::fs::ftruncate(fd, 0).map(|()| PagesDropped::Truncated)
}

/// What [`drop_pages`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PagesDropped {
    /// Its cached pages, if any, were clean and referenced by nothing: dropped, and the file
    /// kept as it was.
    Clean,
    /// Some were dirty or held (or the kernel has no `cachestat`): the file was truncated
    /// to 0.
    Truncated,
}

/// `(cached pages, dirty pages)` of the first `len` bytes of `fd`'s file (`cachestat(2)`,
/// Linux 6.5); `None` where the kernel has no such call.
fn cachestat(fd: BorrowedFd<'_>, len: u64) -> Option<(u64, u64)> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The syscall's number in the table every architecture shares since 6.5.
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len };
    let mut cs = Cachestat::default();
    // SAFETY: both pointers are to live values of the layouts the kernel reads and writes
    // (struct cachestat_range, struct cachestat), and the descriptor is open for the call.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &range as *const Range,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    // (Pages under writeback are not dirty and stay cached through `DONTNEED`: such a file
    // is truncated, as one with dirty pages is.)
    (r == 0).then_some((cs.nr_cache, cs.nr_dirty))
}

/// True if a process `pid` exists on this node (`kill(pid, 0)`: alive unless `ESRCH`).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let rc = unsafe { libc::kill(p, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Splits `rel` into its directory part and its last component.
pub fn split(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

/// `dir/name`, or `name` when `dir` is the worker directory (`""`).
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Opens (creating with `create`) the directory `name` in `parent`, refusing a symlink.
fn child_dir(parent: BorrowedFd<'_>, name: &str, create: bool) -> rustix::io::Result<OwnedFd> {
    if create {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::openat(parent, name, dir_flags(), Mode::empty())
}

impl BlockDir {
    /// Opens `<root>/v1/<worker>` (creating the missing directories with `create`), each
    /// component with `O_NOFOLLOW | O_DIRECTORY`: a `v1` or worker directory that is a
    /// symlink is refused with `ELOOP`.
    pub fn open(root: &Path, worker: &str, create: bool) -> Result<BlockDir> {
        Self::open_with_faults(root, worker, create, None)
    }

    /// As [`BlockDir::open`], with injected faults.
    pub fn open_with_faults(
        root: &Path,
        worker: &str,
        create: bool,
        faults: Option<Arc<NsFaults>>,
    ) -> Result<BlockDir> {
        let vname = format!("v{FORMAT_VERSION}");
        let vpath = root.join(&vname);
        let wpath = vpath.join(worker);
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(root)
                .map_err(|e| Error::from_io(root, e))?;
        }
        let rootfd = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::from_io(root, io_err(e)))?;
        let vfd = child_dir(rootfd.as_fd(), &vname, create)
            .map_err(|e| Error::from_io(&vpath, io_err(e)))?;
        let fd = child_dir(vfd.as_fd(), worker, create)
            .map_err(|e| Error::from_io(&wpath, io_err(e)))?;
        // Temp names of control files start from an unpredictable number, so names planted
        // in advance (e.g. symlinks for the next pids) do not block writes.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ (&fd as *const OwnedFd as u64).rotate_left(32);
        Ok(BlockDir {
            fd,
            path: wpath,
            has_openat2: AtomicBool::new(true),
            has_noreplace: AtomicBool::new(true),
            faults,
            seq: AtomicU64::new(seed % 1_000_000_000_000),
            lock_file: std::sync::Mutex::new(None),
        })
    }

    /// The worker directory's path (for messages; never used to resolve a name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The full path of `rel`, for messages.
    pub fn full(&self, rel: &str) -> PathBuf {
        if rel.is_empty() || rel == "." {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    /// The worker directory's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn check(&self, op: NsOp) -> rustix::io::Result<()> {
        match &self.faults {
            Some(f) => f.check(op),
            None => Ok(()),
        }
    }

    /// Resolves and opens `rel` beneath the worker directory with `flags`, never following a
    /// symlink (see the module docs). `""` or `"."` is the worker directory itself.
    pub fn open_raw(&self, rel: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
        self.check(NsOp::Open)?;
        let rel = if rel.is_empty() { "." } else { rel };
        let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        if self.has_openat2.load(Ordering::Relaxed) {
            match rustix::fs::openat2(
                &self.fd,
                rel,
                flags,
                mode,
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ) {
                Err(Errno::NOSYS) => self.has_openat2.store(false, Ordering::Relaxed),
                r => return r,
            }
        }
        self.walk_open(rel, flags, mode)
    }

    /// The `openat2`-less resolution: each directory component with `O_NOFOLLOW |
    /// O_DIRECTORY`, then the last one with `flags` (which carry `O_NOFOLLOW`).
    fn walk_open(&self, rel: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
        if rel == "." {
            return rustix::fs::openat(&self.fd, ".", flags, mode);
        }
        let (dir, name) = split(rel);
        let parent = self.walk_dir(dir)?;
        rustix::fs::openat(parent.as_fd(), name, flags, mode)
    }

    fn walk_dir(&self, dir: &str) -> rustix::io::Result<Parent<'_>> {
        let mut cur = Parent::Top(self.fd.as_fd());
        for comp in dir.split('/').filter(|c| !c.is_empty()) {
            if comp == "." || comp == ".." {
                return Err(Errno::XDEV); // as RESOLVE_BENEATH would
            }
            let next = match rustix::fs::openat(cur.as_fd(), comp, dir_flags(), Mode::empty()) {
                Err(Errno::NOTDIR) => {
                    let st = rustix::fs::statat(cur.as_fd(), comp, AtFlags::SYMLINK_NOFOLLOW);
                    return Err(match st {
                        Ok(st) if FileKind::of_stat(&st) == FileKind::Symlink => Errno::LOOP,
                        _ => Errno::NOTDIR,
                    });
                }
                r => r?,
            };
            cur = Parent::Sub(next);
        }
        Ok(cur)
    }

    /// The directory `dir` (relative; `""` = the worker directory), for operations on names
    /// in it.
    pub fn parent(&self, dir: &str) -> rustix::io::Result<Parent<'_>> {
        if dir.is_empty() || dir == "." {
            return Ok(Parent::Top(self.fd.as_fd()));
        }
        match self.open_raw(dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()) {
            Ok(fd) => Ok(Parent::Sub(fd)),
            // `O_DIRECTORY | O_NOFOLLOW` on a symlink says ENOTDIR: say what it is.
            Err(Errno::NOTDIR) => {
                let is_link = self
                    .open_raw(dir, OFlags::PATH, Mode::empty())
                    .and_then(|fd| rustix::fs::fstat(&fd))
                    .is_ok_and(|st| FileKind::of_stat(&st) == FileKind::Symlink);
                Err(if is_link { Errno::LOOP } else { Errno::NOTDIR })
            }
            Err(e) => Err(e),
        }
    }

    /// Opens `rel` for data with `flags` (access mode and e.g. `O_DIRECT`), only if it is a
    /// regular file: it is opened `O_NONBLOCK` (a FIFO cannot hang the open), checked with
    /// `fstat`, and `O_NONBLOCK` is cleared again for a regular file.
    pub fn open_file(&self, rel: &str, flags: OFlags) -> rustix::io::Result<Opened> {
        let fd = self.open_raw(
            rel,
            flags | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        regular_only(fd, flags)
    }

    /// `stat` of `rel` without following a symlink anywhere on its path.
    pub fn stat(&self, rel: &str) -> rustix::io::Result<Stat> {
        let (dir, name) = split(rel);
        let parent = self.parent(dir)?;
        self.check(NsOp::Stat)?;
        rustix::fs::statat(parent.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW)
    }

    /// Creates the directories of `dir` (e.g. `ab/cd`) that are missing, level by level, each
    /// opened with `O_NOFOLLOW` before the next is made in it. Errors keep their errno
    /// (`ENOSPC`, `EDQUOT`, `EACCES`, ...).
    pub fn make_dirs(&self, dir: &str) -> rustix::io::Result<()> {
        let mut cur = Parent::Top(self.fd.as_fd());
        for comp in dir.split('/').filter(|c| !c.is_empty()) {
            self.check(NsOp::Mkdir)?;
            cur = Parent::Sub(child_dir(cur.as_fd(), comp, true)?);
        }
        Ok(())
    }

    /// Creates `name` in `parent` with `O_CREAT | O_EXCL | O_NOFOLLOW` and `flags`.
    pub fn create_in(
        &self,
        parent: &Parent<'_>,
        name: &str,
        flags: OFlags,
        mode: Mode,
    ) -> rustix::io::Result<OwnedFd> {
        self.check(NsOp::Create)?;
        rustix::fs::openat(
            parent.as_fd(),
            name,
            flags | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        )
    }

    /// An anonymous `O_TMPFILE` inode in `parent`.
    pub fn tmpfile_in(
        &self,
        parent: &Parent<'_>,
        flags: OFlags,
        mode: Mode,
    ) -> rustix::io::Result<OwnedFd> {
        self.check(NsOp::Create)?;
        rustix::fs::openat(
            parent.as_fd(),
            ".",
            flags | OFlags::TMPFILE | OFlags::CLOEXEC,
            mode,
        )
    }

    /// Renames `from` to `to`, both names in `parent` (atomically replacing `to`).
    pub fn rename_in(&self, parent: &Parent<'_>, from: &str, to: &str) -> rustix::io::Result<()> {
        self.check(NsOp::Rename)?;
        rustix::fs::renameat(parent.as_fd(), from, parent.as_fd(), to)
    }

    /// Moves the regular file `from` in `from_parent` to the fresh name `to` in `to_parent`
    /// and opens it there with `flags` (not following a symlink, never blocking on a FIFO):
    /// how an evicted block's file is taken for reuse. `Ok(None)` if `from` is missing or is
    /// not a regular file, which stays where it is. A file that cannot be opened once renamed
    /// is unlinked (its error returned).
    pub fn take_file(
        &self,
        from_parent: &Parent<'_>,
        from: &str,
        to_parent: &Parent<'_>,
        to: &str,
        flags: OFlags,
    ) -> rustix::io::Result<Option<(OwnedFd, Stat)>> {
        let judged = match rustix::fs::statat(from_parent.as_fd(), from, AtFlags::SYMLINK_NOFOLLOW)
        {
            Ok(st) if FileKind::of_stat(&st) == FileKind::File => st,
            Ok(_) | Err(Errno::NOENT | Errno::STALE) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.check(NsOp::Rename)?;
        // `to` is a fresh temp name (node, pid and sequence number): nothing is replaced.
        match rustix::fs::renameat(from_parent.as_fd(), from, to_parent.as_fd(), to) {
            Ok(()) => {}
            Err(Errno::NOENT | Errno::STALE) => return Ok(None),
            Err(e) => return Err(e),
        }
        match self.open_file_in(to_parent, to, flags) {
            Ok(Opened::File(fd, st)) => Ok(Some((fd, *st))),
            // Swapped for something else between the stat and the rename: put it back.
            Ok(Opened::NotRegular(_)) => {
                let _ = rustix::fs::renameat(to_parent.as_fd(), to, from_parent.as_fd(), from);
                Ok(None)
            }
            // The evicted file cannot be opened (EMFILE, its mode): it goes, as it would
            // have without reuse, rather than stay under a temp name uncounted.
            Err(e) => {
                let _ = self.unlink_in(to_parent, to, Some(Inode::of(&judged)));
                Err(e)
            }
        }
    }

    /// Takes a write lease on `fd` (opened for writing) if it is the only open file
    /// description of its inode on this machine: no other descriptor, in this process or any
    /// other, reads, writes or maps the file (the kernel grants `F_SETLEASE` with `F_WRLCK`
    /// only then). False if one does. While the lease is held, an `open` of the file by
    /// anyone else waits until it is released ([`BlockDir::release_lease`], or the
    /// descriptor's close). The lease's break signal is set to `SIGURG`, ignored by default,
    /// so that such an open cannot deliver `SIGIO`, whose default action ends the process.
    /// Errors are the filesystem's: no leases over NFS or FUSE, `fs.leases-enable = 0`, a
    /// file of another owner without `CAP_LEASE`.
    pub fn take_lease(&self, fd: BorrowedFd<'_>) -> rustix::io::Result<bool> {
        self.check(NsOp::Lease)?;
        fcntl_int(fd, F_SETSIG, libc::SIGURG)?;
        match fcntl_int(fd, libc::F_SETLEASE, libc::F_WRLCK as libc::c_int) {
            Ok(_) => Ok(true),
            Err(Errno::AGAIN) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether this filesystem grants write leases ([`BlockDir::take_lease`]) to this
    /// process: takes and releases one on a new anonymous (`O_TMPFILE`) file in the worker
    /// directory, which leaves no name behind whatever happens. `Ok(false)` if the lease was
    /// refused as held elsewhere (it cannot be, the file being new). The error is why no
    /// lease or no such file could be had: the filesystem's answer where it has no leases or
    /// no `O_TMPFILE` (NFS, FUSE, `fs.leases-enable = 0`).
    pub fn leases_granted(&self) -> rustix::io::Result<bool> {
        // Not through `tmpfile_in`: this file is no put's, and injected create faults are.
        let fd = rustix::fs::openat(
            self.fd.as_fd(),
            ".",
            OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let granted = self.take_lease(fd.as_fd())?;
        if granted {
            self.release_lease(fd.as_fd())?;
        }
        Ok(granted)
    }

    /// Whether no other open of `fd`'s file can have got through the write lease
    /// [`BlockDir::take_lease`] took at `taken`: the lease is still whole, or an open has
    /// started to break it and still waits. The kernel lets such an open through once
    /// `/proc/sys/fs/lease-break-time` has passed since the break began (after `taken`),
    /// downgrading or removing the lease, and a lease being broken reads the same either
    /// way (`F_GETLEASE` gives the type it goes to); so a broken lease counts as kept only
    /// while less than half that time has passed since `taken`. An unreadable break time
    /// counts as none.
    pub fn lease_kept(
        &self,
        fd: BorrowedFd<'_>,
        taken: std::time::Instant,
    ) -> rustix::io::Result<bool> {
        if fcntl_int(fd, libc::F_GETLEASE, 0)? == libc::F_WRLCK as libc::c_int {
            return Ok(true);
        }
        let break_time = std::fs::read_to_string("/proc/sys/fs/lease-break-time")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or(std::time::Duration::ZERO, std::time::Duration::from_secs);
        Ok(taken.elapsed() < break_time / 2)
    }

    /// Releases a lease [`BlockDir::take_lease`] took: opens waiting on it go on.
    pub fn release_lease(&self, fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
        fcntl_int(fd, libc::F_SETLEASE, libc::F_UNLCK as libc::c_int).map(drop)
    }

    /// Links the anonymous inode `fd` as `name` in `parent`: `linkat` with `AT_EMPTY_PATH`
    /// (`proc: false`; needs CAP_DAC_READ_SEARCH) or through `/proc/self/fd` (`proc: true`).
    pub fn link_in(
        &self,
        fd: BorrowedFd<'_>,
        parent: &Parent<'_>,
        name: &str,
        proc: bool,
    ) -> rustix::io::Result<()> {
        self.check(NsOp::Link)?;
        if !proc {
            return rustix::fs::linkat(fd, "", parent.as_fd(), name, AtFlags::EMPTY_PATH);
        }
        use std::os::fd::AsRawFd;
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::linkat(
            rustix::fs::CWD,
            proc_path.as_str(),
            parent.as_fd(),
            name,
            AtFlags::SYMLINK_FOLLOW,
        )
    }

    /// Unlinks `name` in `parent` if it is a regular file and, when `judged` is given, still
    /// the inode that was judged (checked on the same parent descriptor just before).
    pub fn unlink_in(
        &self,
        parent: &Parent<'_>,
        name: &str,
        judged: Option<Inode>,
    ) -> rustix::io::Result<Unlinked> {
        self.unlink_in_sized(parent, name, judged).map(|(u, _)| u)
    }

    /// As [`BlockDir::unlink_in`], with the bytes the removed file took on disk
    /// (`st_blocks * 512` of the `fstatat` just before the unlink; 0 unless removed): what a
    /// shared store's usage ledger gives back.
    pub fn unlink_in_sized(
        &self,
        parent: &Parent<'_>,
        name: &str,
        judged: Option<Inode>,
    ) -> rustix::io::Result<(Unlinked, u64)> {
        let st = match rustix::fs::statat(parent.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT | Errno::STALE) => return Ok((Unlinked::Missing, 0)),
            Err(e) => return Err(e),
        };
        if FileKind::of_stat(&st) != FileKind::File || judged.is_some_and(|j| j != Inode::of(&st)) {
            return Ok((Unlinked::Refused, 0));
        }
        self.check(NsOp::Unlink)?;
        match rustix::fs::unlinkat(parent.as_fd(), name, AtFlags::empty()) {
            Ok(()) => Ok((Unlinked::Removed, st.st_blocks as u64 * 512)),
            Err(Errno::NOENT | Errno::STALE) => Ok((Unlinked::Missing, 0)),
            Err(e) => Err(e),
        }
    }

    /// Unlinks the regular file `rel` (see [`BlockDir::unlink_in`]). A missing directory on
    /// the way is [`Unlinked::Missing`]; a symlink on the way is [`Unlinked::Refused`].
    pub fn unlink_file(&self, rel: &str, judged: Option<Inode>) -> rustix::io::Result<Unlinked> {
        self.unlink_file_sized(rel, judged).map(|(u, _)| u)
    }

    /// As [`BlockDir::unlink_file`], with the bytes the removed file took (see
    /// [`BlockDir::unlink_in_sized`]).
    pub fn unlink_file_sized(
        &self,
        rel: &str,
        judged: Option<Inode>,
    ) -> rustix::io::Result<(Unlinked, u64)> {
        let (dir, name) = split(rel);
        let parent = match self.parent(dir) {
            Ok(p) => p,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::STALE) => return Ok((Unlinked::Missing, 0)),
            Err(Errno::LOOP | Errno::XDEV) => return Ok((Unlinked::Refused, 0)),
            Err(e) => return Err(e),
        };
        self.unlink_in_sized(&parent, name, judged)
    }

    /// Links the name `from` as `to` in `parent`, failing with `EEXIST` if `to` exists: how
    /// a shared store publishes a named temp file without replacing a block another store
    /// published first (`renameat2(RENAME_NOREPLACE)` where the filesystem has it, else
    /// `linkat` and the caller unlinks `from`). True if `from` is gone (renamed).
    pub fn publish_noreplace_in(
        &self,
        parent: &Parent<'_>,
        from: &str,
        to: &str,
    ) -> rustix::io::Result<bool> {
        if self.has_noreplace.load(Ordering::Relaxed) {
            self.check(NsOp::Rename)?;
            match rustix::fs::renameat_with(
                parent.as_fd(),
                from,
                parent.as_fd(),
                to,
                rustix::fs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => return Ok(true),
                Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                    self.has_noreplace.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.check(NsOp::Link)?;
        rustix::fs::linkat(parent.as_fd(), from, parent.as_fd(), to, AtFlags::empty())?;
        Ok(false)
    }

    /// Lists the directory `dir` (relative; `""` = the worker directory), without `.` and
    /// `..`. Entry types come from the listing, or from `fstatat` without following symlinks.
    pub fn read_dir(&self, dir: &str) -> rustix::io::Result<Vec<Entry>> {
        self.check(NsOp::ReadDir)?;
        let fd = self.open_raw(dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        list(fd)
    }

    /// Opens the directory `dir` and lists it: its descriptor (for operations on the names
    /// listed) and its entries.
    pub fn list(&self, dir: &str) -> rustix::io::Result<(Parent<'_>, Vec<Entry>)> {
        let parent = self.parent(dir)?;
        let entries = self.read_dir_in(&parent)?;
        Ok((parent, entries))
    }

    /// Lists `parent` (see [`BlockDir::read_dir`]).
    pub fn read_dir_in(&self, parent: &Parent<'_>) -> rustix::io::Result<Vec<Entry>> {
        self.check(NsOp::ReadDir)?;
        let fd = rustix::fs::openat(parent.as_fd(), ".", dir_flags(), Mode::empty())?;
        list(fd)
    }

    /// `stat` of `name` in `parent`, not following a symlink.
    pub fn stat_in(&self, parent: &Parent<'_>, name: &str) -> rustix::io::Result<Stat> {
        self.check(NsOp::Stat)?;
        rustix::fs::statat(parent.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW)
    }

    /// Opens `name` in `parent` for data, as [`BlockDir::open_file`] does.
    pub fn open_file_in(
        &self,
        parent: &Parent<'_>,
        name: &str,
        flags: OFlags,
    ) -> rustix::io::Result<Opened> {
        self.check(NsOp::Open)?;
        let fd = rustix::fs::openat(
            parent.as_fd(),
            name,
            flags | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        regular_only(fd, flags)
    }

    /// Tries to take the worker lock: `flock(LOCK_EX | LOCK_NB)` on the worker directory
    /// itself, which cannot be unlinked or replaced behind the holder's back, and on the
    /// regular file [`FLOCK_FILE`] in it (created if missing, never rewritten): a distributed
    /// filesystem may keep directory locks to one client (GlusterFS does) while it honours
    /// file locks across clients. False if another open descriptor holds either.
    pub fn try_lock(&self) -> rustix::io::Result<bool> {
        self.flock_both(FlockOperation::NonBlockingLockExclusive)
    }

    /// Tries to take the worker lock shared (`flock(LOCK_SH | LOCK_NB)` on the directory and
    /// on [`FLOCK_FILE`]), as stores in shared mode do: they exclude an exclusive store, not
    /// each other. False if an exclusive lock is held. A held exclusive lock is converted.
    pub fn try_lock_shared(&self) -> rustix::io::Result<bool> {
        self.flock_both(FlockOperation::NonBlockingLockShared)
    }

    fn flock_both(&self, op: FlockOperation) -> rustix::io::Result<bool> {
        self.check(NsOp::Lock)?;
        match rustix::fs::flock(&self.fd, op) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e),
        }
        let mut lf = self.lock_file.lock().unwrap_or_else(|e| e.into_inner());
        if lf.is_none() {
            match self.open_lock_file() {
                Ok(fd) => *lf = Some(fd),
                Err(e) => {
                    let _ = rustix::fs::flock(&self.fd, FlockOperation::Unlock);
                    return Err(e);
                }
            }
        }
        let fd = lf.as_ref().expect("opened above");
        match rustix::fs::flock(fd, op) {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = rustix::fs::flock(&self.fd, FlockOperation::Unlock);
                if e == Errno::WOULDBLOCK {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Opens (creating) [`FLOCK_FILE`], a regular file: a symlink or FIFO there is `ELOOP` /
    /// refused. Missing in a worker that has a `LAYOUT` (removed behind a holder's back, or a
    /// tree of a version before it), it is waited for up to [`LOCK_FILE_GRACE`] first: a
    /// store holding the worker puts it back within [`LOCK_KEEP_INTERVAL`]
    /// ([`BlockDir::keep_lock`]), and its lock then refuses this one.
    fn open_lock_file(&self) -> rustix::io::Result<OwnedFd> {
        let top = Parent::Top(self.fd.as_fd());
        let mut first = self.open_file(FLOCK_FILE, OFlags::RDONLY);
        if matches!(first, Err(Errno::NOENT)) && self.stat(crate::layout::LAYOUT_FILE).is_ok() {
            let start = std::time::Instant::now();
            while matches!(first, Err(Errno::NOENT)) && start.elapsed() < LOCK_FILE_GRACE {
                std::thread::sleep(std::time::Duration::from_millis(50));
                first = self.open_file(FLOCK_FILE, OFlags::RDONLY);
            }
        }
        let fd = match first {
            Err(Errno::NOENT) => match self.create_in(
                &top,
                FLOCK_FILE,
                OFlags::RDONLY,
                Mode::from_raw_mode(FILE_MODE),
            ) {
                Ok(fd) => return Ok(fd),
                Err(Errno::EXIST) => self.open_file(FLOCK_FILE, OFlags::RDONLY)?,
                Err(e) => return Err(e),
            },
            r => r?,
        };
        match fd {
            Opened::File(fd, _) => Ok(fd),
            Opened::NotRegular(_) => Err(Errno::INVAL),
        }
    }

    /// Checks that the lock file this store holds its worker lock on (taken with `op`, as
    /// [`BlockDir::try_lock`] or [`BlockDir::try_lock_shared`] did) is still the file named
    /// [`FLOCK_FILE`], and puts one back if not. A distributed filesystem that keeps
    /// directory locks to one client (GlusterFS) excludes other nodes through that file
    /// alone: once it is removed (or renamed over), another node's store creates a new one
    /// and locks it. So a new file is made under a temp name, locked with `op`, and linked as
    /// [`FLOCK_FILE`]; if another store made one first, that one is locked instead. Run by
    /// the store every [`LOCK_KEEP_INTERVAL`].
    pub fn keep_lock(&self, op: FlockOperation) -> rustix::io::Result<LockKept> {
        let mut lf = self.lock_file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = lf.as_ref() else {
            return Ok(LockKept::Held);
        };
        let mine = Inode::of(&rustix::fs::fstat(held)?);
        match rustix::fs::statat(self.fd.as_fd(), FLOCK_FILE, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if Inode::of(&st) == mine => return Ok(LockKept::Held),
            Ok(_) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
        let top = Parent::Top(self.fd.as_fd());
        let temp = self.temp_name(FLOCK_FILE);
        let fd = self.create_in(&top, &temp, OFlags::RDONLY, Mode::from_raw_mode(FILE_MODE))?;
        // Published as a shared store publishes a block: never over a name another store made.
        let published = rustix::fs::flock(&fd, op)
            .and_then(|()| self.publish_noreplace_in(&top, &temp, FLOCK_FILE));
        if !matches!(published, Ok(true)) {
            let _ = self.unlink_in(&top, &temp, None);
        }
        let fd = match published {
            Ok(_) => fd,
            // Another store made one first (an opener about to lock it, or one that has):
            // whoever locks it first holds the worker.
            Err(Errno::EXIST) => match self.open_file(FLOCK_FILE, OFlags::RDONLY)? {
                Opened::File(other, _) => match rustix::fs::flock(&other, op) {
                    Ok(()) => other,
                    Err(Errno::WOULDBLOCK) => return Ok(LockKept::Lost),
                    Err(e) => return Err(e),
                },
                Opened::NotRegular(_) => return Err(Errno::INVAL),
            },
            Err(e) => return Err(e),
        };
        *lf = Some(fd);
        Ok(LockKept::Restored)
    }

    /// Opens (creating it if missing) the shared worker's usage ledger [`USAGE_FILE`], a
    /// regular file beneath the worker directory (a symlink or FIFO there is refused), whose
    /// lock waits at most `wait` ([`Ledger::lock`]).
    ///
    /// It is opened `O_DIRECT` where the filesystem allows it: no page cache of this client
    /// (nor a distributed filesystem's client caches) may serve another client's older record
    /// (GlusterFS's did, until it was; docs/shared.md).
    pub fn open_ledger(&self, wait: std::time::Duration) -> Result<Ledger> {
        let path = self.full(USAGE_FILE);
        let open = |flags: OFlags| match self.open_file(USAGE_FILE, flags) {
            Err(Errno::NOENT) => {
                let top = Parent::Top(self.fd.as_fd());
                match self.create_in(&top, USAGE_FILE, flags, Mode::from_raw_mode(FILE_MODE)) {
                    Ok(fd) => regular_only(fd, flags),
                    // Created by another store meanwhile.
                    Err(Errno::EXIST) => self.open_file(USAGE_FILE, flags),
                    Err(e) => Err(e),
                }
            }
            r => r,
        };
        let (fd, direct) = match open(OFlags::RDWR | OFlags::DIRECT) {
            Err(Errno::INVAL | Errno::OPNOTSUPP) => (open(OFlags::RDWR), false),
            r => (r, true),
        };
        match fd {
            Ok(Opened::File(fd, _)) => Ok(Ledger {
                fd,
                path,
                direct,
                local: std::sync::Mutex::new(()),
                wait,
            }),
            Ok(Opened::NotRegular(kind)) => Err(Error::Corrupt {
                path,
                reason: crate::error::CorruptReason::NotRegular(kind),
            }),
            Err(Errno::LOOP) => Err(Error::Corrupt {
                path,
                reason: crate::error::CorruptReason::NotRegular(FileKind::Symlink),
            }),
            Err(e) => Err(Error::from_io(path, io_err(e))),
        }
    }

    /// Records this process as the lock's holder in `.lock` (`pid=` and `host=` lines), for
    /// the next opener's `WorkerBusy` and for tierkv-stat.
    ///
    /// A store in shared mode adds `mode=shared` (the record names the last shared store to
    /// open; each shared store also has its own stats file).
    pub fn record_holder(&self, shared: bool) -> Result<()> {
        let mode = if shared { "mode=shared\n" } else { "" };
        let who = format!(
            "pid={}\nhost={}\nnode={:016x}\n{mode}",
            std::process::id(),
            host_name(),
            node_id()
        );
        self.write_control(LOCK_FILE, who.as_bytes())
    }

    /// Who holds the worker lock, as `.lock` says: `pid N on HOST`, or `holder unknown`.
    pub fn holder(&self) -> String {
        self.read_control(LOCK_FILE).ok().flatten().map_or_else(
            || "holder unknown".into(),
            |t| lock_holder(&String::from_utf8_lossy(&t)),
        )
    }

    /// True if `.lock` names stores in shared mode (`mode=shared`, [`BlockDir::record_holder`]).
    pub fn holder_is_shared(&self) -> bool {
        self.read_control(LOCK_FILE)
            .ok()
            .flatten()
            .is_some_and(|t| lock_field(&String::from_utf8_lossy(&t), "mode") == Some("shared"))
    }

    /// Grows this process's descriptor table now to hold at least `slots` descriptors (capped
    /// below the soft `RLIMIT_NOFILE`), so that filling the open-file cache later never grows
    /// it. The kernel grows the table by doubling it when a new descriptor does not fit, and in
    /// a process with more than one thread each growth waits for an RCU grace period: 10-20 ms
    /// on this VM, once per doubling, inside whichever get opened that descriptor. A duplicate
    /// of the worker directory's descriptor at the lowest free number from `slots - 1` grows
    /// the table once (tables never shrink); it is closed at once. Best effort: a failure only
    /// leaves the growth to later.
    pub fn reserve_descriptor_slots(&self, slots: usize) {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let top = (slots as u64)
            .min(soft.saturating_sub(1))
            .min(i32::MAX as u64);
        if top < 64 {
            return;
        }
        match rustix::io::fcntl_dupfd_cloexec(&self.fd, (top - 1) as i32) {
            Ok(fd) => drop(fd),
            Err(e) => {
                tracing::debug!(slots = top, error = %e, "could not grow the descriptor table ahead")
            }
        }
    }

    /// Releases the worker lock.
    pub fn unlock(&self) -> rustix::io::Result<()> {
        if let Some(fd) = &*self.lock_file.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
        }
        rustix::fs::flock(&self.fd, FlockOperation::Unlock)
    }

    /// True if some other descriptor holds the worker lock exclusively (an exclusive store
    /// is running), checked with shared locks (on the directory and on [`FLOCK_FILE`]) that
    /// are released at once. Stores in shared mode are seen by their stats files instead.
    pub fn is_locked_by_other(&self) -> rustix::io::Result<bool> {
        let probe = self.open_raw(".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        match rustix::fs::flock(&probe, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Ok(true),
            Err(e) => return Err(e),
        }
        let file = match self.open_file(FLOCK_FILE, OFlags::RDONLY) {
            Ok(Opened::File(fd, _)) => fd,
            // No lock file (a tree of an earlier version), or not ours: the directory said.
            Ok(Opened::NotRegular(_)) | Err(Errno::NOENT | Errno::LOOP) => return Ok(false),
            Err(e) => return Err(e),
        };
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => Ok(false),
            Err(Errno::WOULDBLOCK) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Reads the control file `name` of the worker directory: `None` if it does not exist.
    /// Refuses a symlink, a non-regular file (a FIFO cannot hang the read) and a file over
    /// [`MAX_CONTROL_LEN`]; errors name the path and never quote the contents.
    pub fn read_control(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let path = self.full(name);
        let fd = match self.open_file(name, OFlags::RDONLY | OFlags::NOATIME) {
            Err(Errno::PERM) => self.open_file(name, OFlags::RDONLY),
            r => r,
        };
        let fd = match fd {
            Ok(Opened::File(fd, st)) => {
                if st.st_size as u64 > MAX_CONTROL_LEN as u64 {
                    return Err(Error::Corrupt {
                        path,
                        reason: crate::error::CorruptReason::ControlFile(format!(
                            "{} bytes, over the {MAX_CONTROL_LEN} a control file may have",
                            st.st_size
                        )),
                    });
                }
                fd
            }
            Ok(Opened::NotRegular(kind)) => {
                return Err(Error::Corrupt {
                    path,
                    reason: crate::error::CorruptReason::NotRegular(kind),
                });
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => {
                return Err(Error::Corrupt {
                    path,
                    reason: crate::error::CorruptReason::NotRegular(FileKind::Symlink),
                });
            }
            Err(e) => return Err(Error::from_io(path, io_err(e))),
        };
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match rustix::io::read(&fd, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.len() > MAX_CONTROL_LEN {
                        return Err(Error::Corrupt {
                            path,
                            reason: crate::error::CorruptReason::ControlFile(
                                "grew over the size a control file may have".into(),
                            ),
                        });
                    }
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(Error::from_io(path, io_err(e))),
            }
        }
        Ok(Some(out))
    }

    /// A temp name for `stem` (a block's file name or a control file's):
    /// `.tmp.<stem>.<node>.<pid>.<seq>`. The sequence is this directory handle's, starting at
    /// an unpredictable number, so two stores of one process (one node, one pid) differ.
    pub fn temp_name(&self, stem: &str) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!(
            "{TEMP_PREFIX}{stem}.{:016x}.{}.{seq}",
            node_id(),
            std::process::id()
        )
    }

    /// The temp name a control file is written under: `.tmp.<name>.<node>.<pid>.<seq>`.
    pub fn control_temp_name(&self, name: &str) -> String {
        self.temp_name(name)
    }

    /// Writes the control file `name` atomically: a new `O_EXCL | O_NOFOLLOW` temp file
    /// ([`BlockDir::control_temp_name`]), then `rename` over `name` (a symlink at `name` is
    /// replaced, never followed). The temp file is unlinked on any failure.
    pub fn write_control(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let top = Parent::Top(self.fd.as_fd());
        let mut tries = 0;
        let (tmp, fd) = loop {
            let tmp = self.control_temp_name(name);
            match self.create_in(&top, &tmp, OFlags::WRONLY, Mode::from_raw_mode(FILE_MODE)) {
                Ok(fd) => break (tmp, fd),
                // Something already has the name (left by a crash, or planted): another name.
                Err(Errno::EXIST) if tries < 16 => tries += 1,
                Err(e) => return Err(Error::from_io(self.full(&tmp), io_err(e))),
            }
        };
        let written = crate::sys::write_full(fd.as_fd(), 0, &mut [std::io::IoSlice::new(bytes)])
            .and_then(|n| {
                if n == bytes.len() {
                    Ok(())
                } else {
                    Err(std::io::ErrorKind::WriteZero.into())
                }
            })
            .map_err(|e| Error::from_io(self.full(&tmp), e))
            .and_then(|()| {
                self.rename_in(&top, &tmp, name)
                    .map_err(|e| Error::from_io(self.full(name), io_err(e)))
            });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        written
    }
}

/// `F_SETSIG` (<fcntl.h>, Linux): the signal a lease break or `O_ASYNC` sends. The libc
/// crate names it only for some targets; its value is 10 on every Linux architecture.
const F_SETSIG: libc::c_int = 10;

/// `fcntl(fd, cmd, arg)` for the commands that take an integer (`F_SETSIG`, `F_SETLEASE`),
/// which rustix does not wrap.
fn fcntl_int(
    fd: BorrowedFd<'_>,
    cmd: libc::c_int,
    arg: libc::c_int,
) -> rustix::io::Result<libc::c_int> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the length of the borrow; these commands take an
    // integer argument (F_GETLEASE ignores it) and read or write no memory of the caller's.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, arg) };
    if r < 0 {
        Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
    } else {
        Ok(r)
    }
}

/// `fd` as an [`Opened`]: a regular file with `O_NONBLOCK` cleared (unless `flags` asked for
/// it), or the kind of what it is.
fn regular_only(fd: OwnedFd, flags: OFlags) -> rustix::io::Result<Opened> {
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileKind::of_stat(&st);
    if kind != FileKind::File {
        return Ok(Opened::NotRegular(kind));
    }
    if !flags.contains(OFlags::NONBLOCK) {
        let fl = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK)?;
    }
    Ok(Opened::File(fd, Box::new(st)))
}

/// The value of the `key=value` line `k` of a `.lock` record (trimmed, 1 to 256 bytes).
fn lock_field<'a>(text: &'a str, k: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 256)
}

/// Who holds a worker lock, from the `.lock` file's text (`pid=N` and `host=H` lines).
fn lock_holder(text: &str) -> String {
    let field = |k: &str| lock_field(text, k);
    let who = match (field("pid"), field("host")) {
        (Some(p), Some(h)) => format!("pid {p} on {h}"),
        (Some(p), None) => format!("pid {p}"),
        _ => "holder unknown".into(),
    };
    if field("mode") == Some("shared") {
        format!("stores in shared mode (the last to open: {who})")
    } else {
        who
    }
}

/// The host name (`gethostname`), for messages and lock records.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for `buf.len()` bytes; gethostname writes at most that many and
    // we read only up to the first NUL within the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Lists the directory open at `fd`.
fn list(fd: OwnedFd) -> rustix::io::Result<Vec<Entry>> {
    // The descriptor is fresh (its position at the start) and this listing's own, so the
    // stream reads it directly (`Dir::read_from` would open the directory once more).
    let mut dir = rustix::fs::Dir::new(fd)?;
    let mut out = Vec::new();
    while let Some(e) = dir.read() {
        let e = e?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let kind = match e.file_type() {
            FileType::Unknown => {
                match rustix::fs::statat(dir.fd()?, e.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileKind::of_stat(&st),
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(e),
                }
            }
            t => FileKind::of(t),
        };
        out.push(Entry {
            name: OsString::from_vec(name.to_vec()),
            kind,
        });
    }
    Ok(out)
}

/// Where the kernel gives the id of its current boot: a random UUID drawn at every boot, the
/// same for every process and container on this kernel.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// This machine's boot id (16 bytes of [`BOOT_ID_PATH`]), read once per process; `None` where
/// it cannot be read or parsed (then every file counts as written before this boot).
pub fn boot_id() -> Option<[u8; 16]> {
    static BOOT: std::sync::OnceLock<Option<[u8; 16]>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string(BOOT_ID_PATH).ok()?;
        parse_boot_id(&text)
    })
}

/// Parses the kernel's text form of a boot id (`8-4-4-4-12` hex digits and a newline).
pub fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.trim().bytes().filter(|&c| c != b'-').collect();
    if hex.len() != 32 || text.trim().len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// The worker directories under `<root>/v1` (real directories with valid worker names; a
/// symlink there is never one), sorted; `v1` itself is opened with `O_NOFOLLOW`.
pub fn list_workers(root: &Path) -> Result<Vec<String>> {
    let vname = format!("v{FORMAT_VERSION}");
    let vpath = root.join(&vname);
    let rootfd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::from_io(root, io_err(e)))?;
    let vfd =
        child_dir(rootfd.as_fd(), &vname, false).map_err(|e| Error::from_io(&vpath, io_err(e)))?;
    let mut out: Vec<String> = list(vfd)
        .map_err(|e| Error::from_io(&vpath, io_err(e)))?
        .into_iter()
        .filter(|e| e.kind == FileKind::Dir)
        .filter_map(|e| e.name.into_string().ok())
        .filter(|n| crate::key::WorkerId::new(n).is_ok())
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bd() -> (tempfile::TempDir, BlockDir) {
        let t = tempfile::tempdir().unwrap();
        let d = BlockDir::open(t.path(), "w", true).unwrap();
        (t, d)
    }

    /// Whether another open file description holds an exclusive or shared flock on `path`.
    fn flocked_elsewhere(path: &Path) -> bool {
        let f = std::fs::File::open(path).unwrap();
        matches!(
            rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive),
            Err(Errno::WOULDBLOCK)
        )
    }

    /// The ledger's lock waits for another holder at most its wait, then fails naming the
    /// ledger (issue 27 item 9); once the holder lets go it is taken again.
    #[test]
    fn the_ledger_lock_waits_at_most_its_wait() {
        let (t, d) = bd();
        let wait = std::time::Duration::from_millis(200);
        let ledger = d.open_ledger(wait).unwrap();
        drop(ledger.lock().unwrap());
        let holder = std::fs::File::open(t.path().join("v1/w").join(USAGE_FILE)).unwrap();
        rustix::fs::flock(&holder, FlockOperation::LockExclusive).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let r = ledger.lock().map(drop).map_err(|e| e.to_string());
            let _ = tx.send((r, start.elapsed()));
            ledger
        });
        let (r, waited) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the lock still waits after 10 s");
        let msg = r.unwrap_err();
        assert!(
            msg.contains(USAGE_FILE) && msg.contains("not let go"),
            "{msg}"
        );
        assert!(waited >= wait && waited < wait * 10, "{waited:?}");
        let ledger = waiter.join().unwrap();
        // Let go in 100 ms: the next lock waits for it and gets it.
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(holder);
        });
        assert!(ledger.lock().is_ok());
        release.join().unwrap();
    }

    /// `keep_lock` (issue 27 item 8): a held lock file stays; a removed one is put back,
    /// locked; one replaced by a file another store holds is lost.
    #[test]
    fn a_removed_lock_file_is_put_back_and_a_taken_one_is_lost() {
        let (t, d) = bd();
        let op = FlockOperation::NonBlockingLockExclusive;
        assert!(d.try_lock().unwrap());
        let flock = t.path().join("v1/w").join(FLOCK_FILE);
        assert_eq!(d.keep_lock(op).unwrap(), LockKept::Held);
        std::fs::remove_file(&flock).unwrap();
        assert_eq!(d.keep_lock(op).unwrap(), LockKept::Restored);
        assert!(flock.exists() && flocked_elsewhere(&flock));
        assert_eq!(d.keep_lock(op).unwrap(), LockKept::Held);
        let names: Vec<_> = std::fs::read_dir(t.path().join("v1/w"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(TEMP_PREFIX)),
            "{names:?}"
        );
        // Another store's file, locked by it, under the name.
        let planted = t.path().join("v1/w/planted");
        std::fs::write(&planted, b"").unwrap();
        let theirs = std::fs::File::open(&planted).unwrap();
        rustix::fs::flock(&theirs, op).unwrap();
        std::fs::rename(&planted, &flock).unwrap();
        assert_eq!(d.keep_lock(op).unwrap(), LockKept::Lost);
        // Replaced by a file nobody holds: it is locked by this store.
        drop(theirs);
        assert_eq!(d.keep_lock(op).unwrap(), LockKept::Restored);
        assert!(flocked_elsewhere(&flock));
    }

    /// An opener that finds the lock file missing in a worker with a `LAYOUT` waits for the
    /// holder to put it back (here a thread, 300 ms later), and is refused by its lock.
    #[test]
    fn an_opener_waits_for_a_missing_lock_file_to_come_back() {
        let (t, d) = bd();
        d.write_control(crate::layout::LAYOUT_FILE, b"x").unwrap();
        let flock = t.path().join("v1/w").join(FLOCK_FILE);
        let _ = std::fs::remove_file(&flock);
        let holder = {
            let flock = flock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                let f = std::fs::File::create(&flock).unwrap();
                rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).unwrap();
                std::thread::sleep(std::time::Duration::from_secs(3));
                f
            })
        };
        let opener = BlockDir::open(t.path(), "w", false).unwrap();
        let start = std::time::Instant::now();
        assert!(
            !opener.try_lock().unwrap(),
            "the opener took a lock file of its own"
        );
        // It waited for the lock file to come back, not for the whole grace.
        assert!(start.elapsed() < std::time::Duration::from_millis(1200));
        drop(holder.join().unwrap());
        // Without a LAYOUT (a new worker), no wait: the lock file is made at once.
        let (t2, d2) = bd();
        let _ = std::fs::remove_file(t2.path().join("v1/w").join(FLOCK_FILE));
        let start = std::time::Instant::now();
        assert!(d2.try_lock().unwrap());
        assert!(start.elapsed() < std::time::Duration::from_millis(300));
    }

    /// Where /proc answers, the node id is the hash of the host, the boot id and the pid
    /// namespace (the same in every process of this node and namespace).
    #[test]
    fn the_node_id_hashes_what_proc_says() {
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap();
        let ns = std::fs::read_link("/proc/self/ns/pid")
            .unwrap()
            .into_os_string()
            .into_encoded_bytes();
        assert_eq!(node_id(), node_id_of(&host_name(), Some(&boot), Some(&ns)));
    }

    /// `drop_pages` keeps only a file none of whose pages is dirty or held: clean cached
    /// pages are dropped (the file kept); dirty ones, or one a pipe holds, truncate it.
    #[test]
    fn drop_pages_keeps_a_clean_file_and_truncates_a_dirty_or_held_one() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let t = tempfile::tempdir().unwrap();
        let len: u64 = 256 << 10;
        let file = |name: &str, sync: bool| {
            let mut f = std::fs::File::options()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(t.path().join(name))
                .unwrap();
            f.write_all(&vec![7u8; len as usize]).unwrap();
            if sync {
                f.sync_all().unwrap();
            }
            f
        };
        let size = |f: &std::fs::File| f.metadata().unwrap().len();
        let clean = file("clean", true);
        let Some((cached, dirty)) = cachestat(clean.as_fd(), len) else {
            panic!("no cachestat(2): a kernel before 6.5");
        };
        assert!(cached > 0 && dirty == 0, "{cached} {dirty}");
        assert_eq!(drop_pages(clean.as_fd(), len).unwrap(), PagesDropped::Clean);
        assert_eq!(cachestat(clean.as_fd(), len), Some((0, 0)));
        assert_eq!(size(&clean), len);
        let dirty = file("dirty", false);
        assert!(cachestat(dirty.as_fd(), len).is_some_and(|(_, d)| d > 0));
        assert_eq!(
            drop_pages(dirty.as_fd(), len).unwrap(),
            PagesDropped::Truncated
        );
        assert_eq!(size(&dirty), 0);
        // A clean file one of whose pages a pipe holds.
        let held = file("held", true);
        let mut fds = [0; 2];
        // SAFETY: `fds` is an array of two ints, which pipe2 fills.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let mut off: libc::loff_t = 0;
        // SAFETY: both descriptors are open; `off` is a valid loff_t the call updates.
        let n = unsafe {
            libc::splice(
                held.as_raw_fd(),
                &mut off,
                fds[1],
                std::ptr::null_mut(),
                4096,
                0,
            )
        };
        assert_eq!(n, 4096);
        assert_eq!(
            drop_pages(held.as_fd(), len).unwrap(),
            PagesDropped::Truncated
        );
        // SAFETY: the two descriptors pipe2 made, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    /// Issue 27 item 7: two stores in `unshare -mpf` namespaces with a tmpfs over /proc read
    /// no boot id and no pid namespace, and shared one node id.
    #[test]
    fn without_a_boot_id_or_a_pid_namespace_each_process_is_its_own_node() {
        let (boot, ns) = (&b"0f1e2d3c-4b5a"[..], &b"pid:[4026531836]"[..]);
        // Both known: the same node for every process that reads them.
        assert_eq!(
            node_id_of("h", Some(boot), Some(ns)),
            node_id_of("h", Some(boot), Some(ns))
        );
        assert_ne!(
            node_id_of("h", Some(boot), Some(ns)),
            node_id_of("h", Some(boot), Some(b"pid:[4026532000]"))
        );
        assert_ne!(
            node_id_of("h", Some(boot), Some(ns)),
            node_id_of("g", Some(boot), Some(ns))
        );
        // Either missing (or empty): never the id of another process.
        for (b, p) in [
            (None, Some(ns)),
            (Some(boot), None),
            (None, None),
            (Some(&b""[..]), Some(ns)),
        ] {
            assert_ne!(node_id_of("h", b, p), node_id_of("h", b, p), "{b:?} {p:?}");
        }
    }

    #[test]
    fn boot_ids_parse_from_the_kernels_text() {
        let id = parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n").unwrap();
        assert_eq!(id[0], 0x0f);
        assert_eq!(id[15], 0xf0);
        assert_eq!(parse_boot_id("0f1e2d3c4b5a69788796a5b4c3d2e1f0"), None);
        assert_eq!(parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fz"), None);
        assert_eq!(parse_boot_id(""), None);
        // This machine's, read twice, is the same.
        let here = boot_id().expect("a Linux kernel gives its boot id");
        assert_eq!(Some(here), boot_id());
        assert_ne!(here, [0; 16]);
    }

    #[test]
    fn symlinks_are_refused_at_every_level() {
        let (t, d) = bd();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("f"), b"outside").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("ab")).unwrap();
        assert_eq!(
            d.open_file("ab/f", OFlags::RDONLY).unwrap_err(),
            Errno::LOOP
        );
        assert_ne!(d.unlink_file("ab/f", None).unwrap(), Unlinked::Removed);
        assert_eq!(d.stat("ab/f").unwrap_err(), Errno::LOOP);
        assert!(d.make_dirs("ab/cd").is_err());
        assert!(outside.path().join("f").exists());
        // The walk used without openat2 refuses the same.
        d.has_openat2.store(false, Ordering::Relaxed);
        assert_eq!(
            d.open_file("ab/f", OFlags::RDONLY).unwrap_err(),
            Errno::LOOP
        );
        // A worker directory that is a symlink is refused.
        std::os::unix::fs::symlink(outside.path(), t.path().join("v1/evil")).unwrap();
        assert!(BlockDir::open(t.path(), "evil", false).is_err());
        assert_eq!(list_workers(t.path()).unwrap(), vec!["w".to_string()]);
    }

    #[test]
    fn fifos_are_not_opened_for_data_nor_unlinked() {
        let (_t, d) = bd();
        rustix::fs::mknodat(d.fd(), "p", FileType::Fifo, Mode::from_raw_mode(0o644), 0).unwrap();
        assert!(matches!(
            d.open_file("p", OFlags::RDONLY).unwrap(),
            Opened::NotRegular(FileKind::Special)
        ));
        assert_eq!(d.unlink_file("p", None).unwrap(), Unlinked::Refused);
        assert!(d.read_control("p").is_err());
        assert!(d.path().join("p").exists());
    }

    #[test]
    fn unlink_checks_the_judged_inode() {
        let (_t, d) = bd();
        d.write_control("x", b"1").unwrap();
        let judged = Inode::of(&d.stat("x").unwrap());
        d.write_control("x", b"2").unwrap(); // replaced by a new inode
        assert_eq!(d.unlink_file("x", Some(judged)).unwrap(), Unlinked::Refused);
        let now = Inode::of(&d.stat("x").unwrap());
        assert_eq!(d.unlink_file("x", Some(now)).unwrap(), Unlinked::Removed);
        assert_eq!(d.unlink_file("x", None).unwrap(), Unlinked::Missing);
    }

    #[test]
    fn control_files_replace_symlinks_and_leave_no_temp() {
        let (_t, d) = bd();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), b"keep").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("STATS.json")).unwrap();
        assert!(d.read_control("STATS.json").is_err());
        d.write_control("STATS.json", b"{}").unwrap();
        assert_eq!(std::fs::read(outside.path()).unwrap(), b"keep");
        assert_eq!(d.read_control("STATS.json").unwrap().unwrap(), b"{}");
        let names: Vec<String> = d
            .read_dir("")
            .unwrap()
            .into_iter()
            .map(|e| e.name_str().to_string())
            .collect();
        assert_eq!(names, vec!["STATS.json".to_string()]);
        // A failing rename leaves no temp file behind.
        let f = Arc::new(NsFaults::new());
        f.fail(NsOp::Rename, Errno::NOSPC, 0, 1);
        let d2 = BlockDir::open_with_faults(_t.path(), "w", false, Some(f)).unwrap();
        assert!(matches!(
            d2.write_control("LAYOUT", b"x"),
            Err(Error::NoSpace { .. })
        ));
        assert_eq!(d.read_dir("").unwrap().len(), 1);
    }

    #[test]
    fn make_dirs_keeps_the_errno() {
        let (_t, d) = bd();
        let f = Arc::new(NsFaults::new());
        f.fail(NsOp::Mkdir, Errno::NOSPC, 1, 1);
        let d2 = BlockDir::open_with_faults(_t.path(), "w", false, Some(f)).unwrap();
        assert_eq!(d2.make_dirs("ab/cd"), Err(Errno::NOSPC));
        assert!(d.stat("ab").is_ok() && d.stat("ab/cd").is_err());
        assert_eq!(d2.make_dirs("ab/cd"), Ok(()));
    }
}
