//! Reusing an evicted file: taking it under a write lease, and dropping its cached pages
//! before a new block is written into it.

use super::*;

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

impl BlockDir {
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
    // A method of the namespace layer, though it needs only the descriptor: every file
    // operation goes through a `BlockDir`.
    #[allow(clippy::unused_self)]
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
    #[allow(clippy::unused_self)]
    pub fn release_lease(&self, fd: BorrowedFd<'_>) -> rustix::io::Result<()> {
        fcntl_int(fd, libc::F_SETLEASE, libc::F_UNLCK as libc::c_int).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
