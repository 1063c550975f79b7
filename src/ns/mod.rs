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
//! errno of their choice, as `FaultyEngine` does for data I/O.

mod control;
mod fault;
mod journal;
mod lease;
mod ledger;
mod lock;
mod mount;
mod node;
mod publish;
pub mod walk;

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

pub use fault::{NsFaults, NsOp};
pub use journal::{
    BlockEvent, EventCause, EventKind, EventsRead, JOURNAL_CAPACITY, Journal, JournalGuard,
};
pub use lease::{PagesDropped, drop_pages};
pub use ledger::{Ledger, LedgerGuard};
pub use lock::{LOCK_KEEP_INTERVAL, LockKept};
pub use mount::{Filesystem, filesystem};
pub use node::{boot_id, host_name, node_id, pid_alive};
pub(crate) use publish::{CreateError, CreateHooks, Created, Published, Publisher, TempFile};

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

    /// How many files of `file_bytes` bytes the filesystem of the worker directory has room
    /// for now: its free space for unprivileged users over `file_bytes`, or its free inodes
    /// where those are fewer (`fstatvfs`; `None` if it fails or reports no size, as some
    /// FUSE filesystems do).
    pub fn room_in_files(&self, file_bytes: u64) -> Option<u64> {
        let st = rustix::fs::fstatvfs(&self.fd).ok()?;
        if st.f_blocks == 0 {
            return None;
        }
        let bytes = st.f_bavail.saturating_mul(st.f_frsize);
        let files = bytes / file_bytes.max(1);
        // Filesystems without an inode table (btrfs, XFS's dynamic inodes) report 0 or a huge
        // count: only a positive one bounds.
        Some(if st.f_favail > 0 {
            files.min(st.f_favail)
        } else {
            files
        })
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
pub(crate) mod tests {
    use super::*;

    pub(super) fn bd() -> (tempfile::TempDir, BlockDir) {
        let t = tempfile::tempdir().unwrap();
        let d = BlockDir::open(t.path(), "w", true).unwrap();
        (t, d)
    }

    /// Whether another open file description holds an exclusive or shared flock on `path`.
    pub(super) fn flocked_elsewhere(path: &Path) -> bool {
        let f = std::fs::File::open(path).unwrap();
        matches!(
            rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive),
            Err(Errno::WOULDBLOCK)
        )
    }

    #[test]
    fn a_file_reopened_for_cufile_is_the_same_inode_without_the_refused_flags() {
        let (_t, d) = bd();
        std::fs::write(d.path().join("f"), b"block").unwrap();
        // A read as the store opens one: O_NOFOLLOW, and O_NONBLOCK left set here.
        let fd = d
            .open_raw(
                "f",
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
                Mode::empty(),
            )
            .unwrap();
        assert!(
            rustix::fs::fcntl_getfl(&fd)
                .unwrap()
                .intersects(crate::sys::CUFILE_REFUSED_FLAGS)
        );
        let again = crate::sys::reopen_plain(fd.as_fd()).unwrap();
        let flags = rustix::fs::fcntl_getfl(&again).unwrap();
        assert!(
            !flags.intersects(crate::sys::CUFILE_REFUSED_FLAGS),
            "{flags:?}"
        );
        assert_eq!(flags & OFlags::RWMODE, OFlags::RDONLY);
        assert_eq!(
            Inode::of(&rustix::fs::fstat(&again).unwrap()),
            Inode::of(&rustix::fs::fstat(&fd).unwrap())
        );
        // The access mode is kept: a read-only file stays read-only.
        assert_eq!(rustix::io::write(&again, b"x").unwrap_err(), Errno::BADF);
        // An O_TMPFILE inode (a put before it is published) is reopened read-write, and
        // writes through the new descriptor land in it.
        let parent = d.parent("").unwrap();
        let tmp = d
            .tmpfile_in(&parent, OFlags::RDWR, Mode::from_raw_mode(0o644))
            .unwrap();
        assert!(
            rustix::fs::fcntl_getfl(&tmp)
                .unwrap()
                .intersects(crate::sys::CUFILE_REFUSED_FLAGS)
        );
        let w = crate::sys::reopen_plain(tmp.as_fd()).unwrap();
        assert!(
            !rustix::fs::fcntl_getfl(&w)
                .unwrap()
                .intersects(crate::sys::CUFILE_REFUSED_FLAGS)
        );
        rustix::io::pwrite(&w, b"payload", 0).unwrap();
        let mut back = [0u8; 7];
        rustix::io::pread(&tmp, &mut back, 0).unwrap();
        assert_eq!(&back, b"payload");
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
