//! Publishing a block file: the temp file a put writes (an anonymous `O_TMPFILE` inode where
//! the filesystem has them, else a named temp file in the block's directory) and its
//! publication under the block's name (`linkat`, through `/proc/self/fd` without
//! CAP_DAC_READ_SEARCH, or `rename`; never replacing a block in shared mode), with the
//! fallbacks each filesystem needs, learnt once and kept.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::{BlockDir, Parent};

/// How a put's file was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Published {
    /// Under the block's name.
    Ours,
    /// Not: another store (shared mode) published the block first; the temp file is gone.
    Theirs,
}

/// A temp file a put created ([`Publisher::create`]).
#[derive(Debug)]
pub(crate) struct Created {
    /// Opened read-write (a payload written from GPU memory is read back for its checksum).
    pub fd: OwnedFd,
    /// An `O_TMPFILE` inode, with no name until it is published.
    pub anonymous: bool,
}

/// Why [`Publisher::create`] failed: the errno, and whether it was the named temp file's
/// (else the anonymous inode's, which errors name by the block's path).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CreateError {
    /// What the filesystem said.
    pub errno: Errno,
    /// The named temp file's creation failed.
    pub named: bool,
}

/// A put's temp file, as [`Publisher::publish`] publishes it.
pub(crate) struct TempFile<'p, 'a> {
    /// The block's directory.
    pub parent: &'p Parent<'a>,
    /// The temp name: the file's name until published, or the name an anonymous inode takes
    /// when it replaces an existing block.
    pub name: &'p str,
    /// The file, written.
    pub fd: &'p OwnedFd,
    /// An `O_TMPFILE` inode.
    pub anonymous: bool,
}

/// How the store retries an open that met the open-file limit (shrinking its descriptor
/// cache in between).
pub(crate) type RetryOpen<'a> =
    &'a dyn Fn(&mut dyn FnMut() -> rustix::io::Result<OwnedFd>) -> rustix::io::Result<OwnedFd>;

/// What the store lends [`Publisher::create`].
pub(crate) struct CreateHooks<'a> {
    /// Every open goes through it.
    pub retry: RetryOpen<'a>,
    /// Called when the filesystem refuses `O_DIRECT` for a put that chose it by size alone.
    pub direct_refused: &'a dyn Fn(),
}

/// What the filesystem turned out to support, learnt by the puts of one store.
#[derive(Debug)]
pub(crate) struct Publisher {
    /// `O_TMPFILE` works (until it is refused once).
    tmpfile: AtomicBool,
    /// `linkat(AT_EMPTY_PATH)` works (until it is refused for want of CAP_DAC_READ_SEARCH).
    link_empty_path: AtomicBool,
}

impl Publisher {
    /// Puts try `O_TMPFILE` first if `tmpfile`, else named temp files.
    pub(crate) fn new(tmpfile: bool) -> Self {
        Publisher {
            tmpfile: AtomicBool::new(tmpfile),
            link_empty_path: AtomicBool::new(true),
        }
    }

    /// Creates the file a put writes in `parent`: an anonymous `O_TMPFILE` inode where the
    /// filesystem supports it (nothing is left behind by a crash, and publishing is one
    /// `linkat`), else the named temp file `temp_name`. Opened read-write, with `direct`
    /// (`O_DIRECT` or nothing). With `by_size` (`O_DIRECT` was chosen by the payload's size
    /// alone, not configured), an `EINVAL` is tried again buffered to tell which flag the
    /// filesystem refuses: if it is `O_DIRECT`, `direct` is cleared and `hooks.direct_refused` is
    /// called. Every open goes through `hooks.retry` (the store's retry on EMFILE).
    pub(crate) fn create(
        &self,
        ns: &BlockDir,
        parent: &Parent<'_>,
        temp_name: &str,
        direct: &mut OFlags,
        by_size: bool,
        hooks: CreateHooks<'_>,
    ) -> Result<Created, CreateError> {
        let CreateHooks {
            retry,
            direct_refused,
        } = hooks;
        let mode = Mode::from_raw_mode(super::FILE_MODE);
        // An O_TMPFILE refused with EINVAL while O_DIRECT was asked by size: tried again
        // buffered, to tell which flag the filesystem refuses.
        let mut buffered_retry = false;
        loop {
            if self.tmpfile.load(Ordering::Relaxed) {
                match retry(&mut || ns.tmpfile_in(parent, OFlags::RDWR | *direct, mode)) {
                    Ok(fd) => {
                        if buffered_retry {
                            direct_refused();
                        }
                        return Ok(Created {
                            fd,
                            anonymous: true,
                        });
                    }
                    Err(Errno::INVAL) if by_size && !direct.is_empty() => {
                        *direct = OFlags::empty();
                        buffered_retry = true;
                        continue;
                    }
                    Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                        tracing::info!(
                            "the filesystem has no O_TMPFILE: puts use named temp files"
                        );
                        self.tmpfile.store(false, Ordering::Relaxed);
                        if buffered_retry {
                            // O_TMPFILE's refusal, not O_DIRECT's: the named file takes it.
                            *direct = OFlags::DIRECT;
                        }
                        continue;
                    }
                    Err(errno) => {
                        return Err(CreateError {
                            errno,
                            named: false,
                        });
                    }
                }
            }
            return match retry(&mut || {
                ns.create_in(parent, temp_name, OFlags::RDWR | *direct, mode)
            }) {
                Ok(fd) => Ok(Created {
                    fd,
                    anonymous: false,
                }),
                Err(Errno::INVAL) if by_size && !direct.is_empty() => {
                    // O_DIRECT is refused after O_CREAT made the file: our temp name goes.
                    let _ = ns.unlink_in(parent, temp_name, None);
                    direct_refused();
                    *direct = OFlags::empty();
                    continue;
                }
                Err(errno) => Err(CreateError { errno, named: true }),
            };
        }
    }

    /// Gives an anonymous inode the name `name` in `parent`: `linkat` with `AT_EMPTY_PATH`
    /// (needs CAP_DAC_READ_SEARCH), else through `/proc/self/fd`. Fails with EEXIST if the
    /// name exists.
    fn link_anonymous(
        &self,
        ns: &BlockDir,
        fd: &OwnedFd,
        parent: &Parent<'_>,
        name: &str,
    ) -> rustix::io::Result<()> {
        if self.link_empty_path.load(Ordering::Relaxed) {
            match ns.link_in(fd.as_fd(), parent, name, false) {
                // Without CAP_DAC_READ_SEARCH: link through /proc instead, from now on
                // (unless that fails the same way: then the directory itself is missing).
                Err(e @ (Errno::NOENT | Errno::PERM)) => {
                    let r = ns.link_in(fd.as_fd(), parent, name, true);
                    if !matches!(r, Err(Errno::NOENT | Errno::PERM)) {
                        self.link_empty_path.store(false, Ordering::Relaxed);
                        return r;
                    }
                    return Err(e);
                }
                r => return r,
            }
        }
        ns.link_in(fd.as_fd(), parent, name, true)
    }

    /// Publishes a fully written temp file under the block's name `name`, atomically
    /// replacing any existing block; with `noreplace` (shared mode) never replacing one:
    /// another store's block under the name stays, and this file goes
    /// ([`Published::Theirs`]). `discard` unlinks the named temp file where publishing
    /// leaves it behind (linked under the block's name, or not published).
    pub(crate) fn publish(
        &self,
        ns: &BlockDir,
        temp: &TempFile<'_, '_>,
        name: &str,
        noreplace: bool,
        discard: &dyn Fn(),
    ) -> rustix::io::Result<Published> {
        let parent = temp.parent;
        if !temp.anonymous {
            if !noreplace {
                return ns
                    .rename_in(parent, temp.name, name)
                    .map(|()| Published::Ours);
            }
            let mut tries = 0;
            return loop {
                match ns.publish_noreplace_in(parent, temp.name, name) {
                    Ok(true) => break Ok(Published::Ours),
                    Ok(false) => {
                        // Linked: the temp name goes.
                        discard();
                        break Ok(Published::Ours);
                    }
                    Err(Errno::EXIST) => {
                        discard();
                        break Ok(Published::Theirs);
                    }
                    // A distributed filesystem may answer a link that races another
                    // client's publication of the same name with ENOENT or ESTALE: if the
                    // name is there now, that client won; else try once more.
                    Err(e @ (Errno::NOENT | Errno::STALE)) => {
                        if ns.stat_in(parent, name).is_ok() {
                            discard();
                            break Ok(Published::Theirs);
                        }
                        if tries > 0 {
                            break Err(e);
                        }
                        tries += 1;
                    }
                    Err(e) => break Err(e),
                }
            };
        }
        match self.link_anonymous(ns, temp.fd, parent, name) {
            Err(Errno::EXIST) if noreplace => Ok(Published::Theirs),
            Err(Errno::EXIST) => {
                // Replacing a block: name the inode, then rename over the old one.
                self.link_anonymous(ns, temp.fd, parent, temp.name)?;
                ns.rename_in(parent, temp.name, name)
                    .inspect_err(|_| {
                        let _ = ns.unlink_in(parent, temp.name, None);
                    })
                    .map(|()| Published::Ours)
            }
            r => r.map(|()| Published::Ours),
        }
    }
}
