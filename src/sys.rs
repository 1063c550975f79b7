//! The bottom layer: the system-call loops that every other layer shares, the kinds of file
//! the tree can hold, the reopening of a descriptor for cuFile, and the background threads
//! that know the process that started them. It imports nothing from the crate, so the
//! namespace layer (`ns`), the I/O engines and the tools use one copy of each loop
//! (docs/design.md, "Layers").

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::BorrowedFd;

use rustix::fs::{FileType, Stat};
use rustix::io::Errno;

/// An `io::Error` of an errno.
pub fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Reads at `offset` until `bufs` are full or the file ends (`preadv`, retried on `EINTR` and
/// short reads); returns the bytes read, short only at the end of the file.
pub fn read_full(
    fd: BorrowedFd<'_>,
    offset: u64,
    bufs: &mut [IoSliceMut<'_>],
) -> io::Result<usize> {
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0usize;
    let mut rest: &mut [IoSliceMut<'_>] = bufs;
    while done < want {
        match rustix::io::preadv(fd, rest, offset + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                IoSliceMut::advance_slices(&mut rest, n);
            }
            // Interrupted before a byte moved: again.
            Err(Errno::INTR) => {}
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(done)
}

/// As [`read_full`], handing every byte read to `feed` in file order as it lands: one buffer
/// at a time, in `preadv`s of at most `chunk` bytes, each fed before the next is read (so the
/// caller sees each piece while it is still in the CPU's cache). A read of at most `chunk`
/// bytes in all is one `read_full`, fed after.
pub fn read_full_feeding(
    fd: BorrowedFd<'_>,
    offset: u64,
    bufs: &mut [IoSliceMut<'_>],
    chunk: usize,
    feed: &mut dyn FnMut(&[u8]),
) -> io::Result<usize> {
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    if want <= chunk {
        // `read_full` advances the slices it is given: fresh ones over the same buffers, so
        // that `bufs` still start where the bytes landed.
        let mut fresh: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let n = read_full(fd, offset, &mut fresh)?;
        drop(fresh);
        let mut left = n;
        for b in bufs.iter() {
            let k = left.min(b.len());
            feed(&b[..k]);
            left -= k;
        }
        return Ok(n);
    }
    let mut done = 0usize;
    for b in bufs.iter_mut() {
        for piece in b.chunks_mut(chunk.max(1)) {
            let want = piece.len();
            let n = read_full(fd, offset + done as u64, &mut [IoSliceMut::new(piece)])?;
            feed(&piece[..n]);
            done += n;
            if n < want {
                // The end of the file.
                return Ok(done);
            }
        }
    }
    Ok(done)
}

/// Writes every byte of `bufs` at `offset` (`pwritev`, retried on `EINTR` and short writes)
/// or fails; a write of 0 bytes is `WriteZero`.
pub fn write_full(fd: BorrowedFd<'_>, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<usize> {
    let want: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0usize;
    let mut rest: &mut [IoSlice<'_>] = bufs;
    while done < want {
        match rustix::io::pwritev(fd, rest, offset + done as u64) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                done += n;
                IoSlice::advance_slices(&mut rest, n);
            }
            // Interrupted before a byte moved: again.
            Err(Errno::INTR) => {}
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(done)
}

/// The type of a directory entry or file, as the namespace layer reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A FIFO, character or block device, socket, or unknown type.
    Special,
}

impl FileKind {
    /// The kind of a file type.
    pub fn of(ft: FileType) -> FileKind {
        match ft {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            _ => FileKind::Special,
        }
    }

    /// The kind of a `stat` result.
    pub fn of_stat(st: &Stat) -> FileKind {
        FileKind::of(FileType::from_raw_mode(st.st_mode))
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::File => "regular file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Special => "FIFO, device or socket",
        })
    }
}

/// The status flags a descriptor handed to cuFile (NIXL's GDS backends) must not carry:
/// `cuFileHandleRegister` refuses them with `CU_FILE_INVALID_FILE_OPEN_FLAG` (seen with
/// libcufile 1.14 on an H200, 2026-12-04). Every block file the store opens carries
/// `O_NOFOLLOW`; reads are opened `O_NONBLOCK` first, and puts may be `O_TMPFILE` inodes.
#[cfg(any(test, feature = "nixl"))]
pub const CUFILE_REFUSED_FLAGS: rustix::fs::OFlags = rustix::fs::OFlags::NOFOLLOW
    .union(rustix::fs::OFlags::NONBLOCK)
    .union(rustix::fs::OFlags::TMPFILE)
    .union(rustix::fs::OFlags::APPEND);

/// The open file behind `fd`, opened again through its `/proc/self/fd` entry with `fd`'s
/// access mode and `O_DIRECT` and no other status flag (see [`CUFILE_REFUSED_FLAGS`]). The
/// entry names the very file `fd` has open (an unlinked or `O_TMPFILE` inode too), so no path
/// in the tree is resolved again; the new descriptor is checked to be the same inode, so a
/// `/proc` that is not procfs cannot hand over another file (`EXDEV`).
#[cfg(any(test, feature = "nixl"))]
pub fn reopen_plain(fd: BorrowedFd<'_>) -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::OFlags;
    let flags = rustix::fs::fcntl_getfl(fd)?;
    let keep = flags & (OFlags::RWMODE | OFlags::DIRECT);
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    let again = rustix::fs::openat(
        rustix::fs::CWD,
        link.as_str(),
        keep | OFlags::CLOEXEC | OFlags::NOCTTY,
        rustix::fs::Mode::empty(),
    )?;
    let (a, b) = (rustix::fs::fstat(fd)?, rustix::fs::fstat(&again)?);
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Err(Errno::XDEV);
    }
    Ok(again)
}

/// A background thread of this process, stopped by [`Thread::join`]: in the process that
/// started it, joined; in a process forked from it since, forgotten. A child of `fork` has only
/// the thread that forked, so joining a handle it inherited would wait on a thread that does
/// not exist (the standard library panics there: "threads should not terminate unexpectedly").
#[derive(Debug)]
pub struct Thread {
    handle: std::thread::JoinHandle<()>,
    pid: u32,
}

impl Thread {
    /// Starts thread `name` running `f`.
    pub fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> io::Result<Thread> {
        let handle = std::thread::Builder::new().name(name).spawn(f)?;
        Ok(Thread {
            handle,
            pid: std::process::id(),
        })
    }

    /// Whether this process started the thread (false in a process forked since).
    pub fn ours(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Whether the thread has ended (in a fork: always, it does not run there).
    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        !self.ours() || self.handle.is_finished()
    }

    /// Waits for the thread to end; false if it panicked. A handle in a process forked since
    /// the thread started, or the calling thread's own, returns true at once.
    pub fn join(self) -> bool {
        if !self.ours() || self.handle.thread().id() == std::thread::current().id() {
            return true;
        }
        self.handle.join().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn file_kinds_of_real_files_and_their_names() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let kind = |p: &std::path::Path| FileKind::of_stat(&rustix::fs::lstat(p).unwrap());
        assert_eq!(kind(&f), FileKind::File);
        assert_eq!(kind(d.path()), FileKind::Dir);
        assert_eq!(kind(&l), FileKind::Symlink);
        assert_eq!(kind(std::path::Path::new("/dev/null")), FileKind::Special);
        let names: Vec<String> = [
            FileKind::File,
            FileKind::Dir,
            FileKind::Symlink,
            FileKind::Special,
        ]
        .iter()
        .map(|k| k.to_string())
        .collect();
        assert_eq!(
            names,
            [
                "regular file",
                "directory",
                "symlink",
                "FIFO, device or socket"
            ]
        );
    }

    #[test]
    fn loops_cross_buffers_and_stop_at_the_end() {
        let mut f = tempfile::tempfile().unwrap();
        let (a, b) = (vec![1u8; 5000], vec![2u8; 3000]);
        let n = write_full(f.as_fd(), 10, &mut [IoSlice::new(&a), IoSlice::new(&b)]).unwrap();
        assert_eq!(n, 8000);
        f.flush().unwrap();
        let (mut x, mut y) = (vec![0u8; 4000], vec![0u8; 6000]);
        let n = read_full(
            f.as_fd(),
            10,
            &mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)],
        )
        .unwrap();
        assert_eq!(n, 8000, "short only at the end of the file");
        assert!(x.iter().all(|&v| v == 1));
        assert!(y[..1000].iter().all(|&v| v == 1) && y[1000..4000].iter().all(|&v| v == 2));
        assert!(y[4000..].iter().all(|&v| v == 0));
    }

    /// Every byte read reaches the feed once, in file order, in pieces of at most the chunk
    /// after each lands (the chunk limited per buffer); a read of at most one chunk is fed
    /// after it, buffer by buffer; a short file stops both where it ends.
    #[test]
    fn feeding_reads_hand_over_every_byte_in_order_in_chunks() {
        let f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        write_full(f.as_fd(), 0, &mut [IoSlice::new(&data)]).unwrap();
        for (chunk, lens, want_pieces) in [
            // 3 buffers of 4+5000+6000 bytes from offset 3: 9997 bytes in the file.
            (
                1000usize,
                [4usize, 5000, 6000],
                vec![4, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 993],
            ),
            (20_000, [4, 5000, 6000], vec![4, 5000, 4993]),
            (4, [4, 5000, 6000], vec![4, 4, 4]),
        ] {
            let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
            let mut fed: Vec<u8> = Vec::new();
            let mut pieces: Vec<usize> = Vec::new();
            let mut slices: Vec<IoSliceMut<'_>> =
                bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let n = read_full_feeding(f.as_fd(), 3, &mut slices, chunk, &mut |b: &[u8]| {
                fed.extend_from_slice(b);
                pieces.push(b.len());
            })
            .unwrap();
            drop(slices);
            assert_eq!(n, 9997, "chunk {chunk}");
            assert_eq!(fed, data[3..], "chunk {chunk}");
            if chunk == 4 {
                assert_eq!(&pieces[..3], &want_pieces[..], "chunk {chunk}");
                assert!(pieces.iter().all(|&p| p <= 4), "chunk {chunk}");
            } else {
                assert_eq!(pieces, want_pieces, "chunk {chunk}");
            }
            let read: Vec<u8> = bufs.concat();
            assert_eq!(&read[..9997], &data[3..], "chunk {chunk}");
        }
    }
}
