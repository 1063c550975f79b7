//! The usage ledger of a shared worker ([`USAGE_FILE`]): a small file read and rewritten in
//! place under its `flock`.

use super::*;

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
        flock_waiting(&self.fd, &self.path, self.wait, "the usage ledger")?;
        Ok(LedgerGuard {
            ledger: self,
            _local: local,
        })
    }
}

/// Takes the exclusive `flock` of `fd` (the file at `path`, called `what` in messages), which
/// every holder keeps for one short update: polls (`LOCK_NB`, backing off from 1 to 20 ms)
/// for at most `wait`, so that a holder that does not let go (stopped with `SIGSTOP`, or hung
/// on a dead filesystem) makes it fail with `TimedOut`, naming the file, instead of waiting
/// for ever.
pub(super) fn flock_waiting(
    fd: &OwnedFd,
    path: &Path,
    wait: std::time::Duration,
    what: &str,
) -> Result<()> {
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => {}
            Err(Errno::WOULDBLOCK) if started.elapsed() < wait => {
                std::thread::sleep(pause);
                pause = pause
                    .saturating_mul(2)
                    .min(std::time::Duration::from_millis(20));
            }
            Err(Errno::WOULDBLOCK) => {
                let msg = format!(
                    "another store has held {what}'s lock for {wait:?} and not let go (stopped, or hung)"
                );
                let e = std::io::Error::new(std::io::ErrorKind::TimedOut, msg);
                return Err(Error::from_io(path, e));
            }
            Err(e) => return Err(Error::from_io(path, io_err(e))),
        }
    }
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

impl BlockDir {
    /// Opens (creating it if missing) the shared worker's usage ledger (`USAGE`), a
    /// regular file beneath the worker directory (a symlink or FIFO there is refused), whose
    /// lock waits at most `wait` (`Ledger::lock`).
    ///
    /// It is opened `O_DIRECT` where the filesystem allows it: no page cache of this client
    /// (nor a distributed filesystem's client caches) may serve another client's older record
    /// (GlusterFS's did, until it was; docs/shared.md).
    pub fn open_ledger(&self, wait: std::time::Duration) -> Result<Ledger> {
        let path = self.full(USAGE_FILE);
        match self.open_shared_file(USAGE_FILE, true, OFlags::RDWR, true)? {
            Some((fd, direct)) => Ok(Ledger {
                fd,
                path,
                direct,
                local: std::sync::Mutex::new(()),
                wait,
            }),
            // Made, then removed before it was opened again.
            None => Err(Error::from_io(path, io_err(Errno::NOENT))),
        }
    }

    /// Opens the file `name` of the worker directory that its stores share (the usage
    /// ledger, the event journal) with `access`: a regular file (a symlink or FIFO there is
    /// refused, naming it), made if missing and `create` (made by another store meanwhile is
    /// fine); `None` if it is missing and not to be made. With `direct`, `O_DIRECT` where
    /// the filesystem allows it: the second value says whether it is.
    pub(crate) fn open_shared_file(
        &self,
        name: &str,
        create: bool,
        access: OFlags,
        direct: bool,
    ) -> Result<Option<(OwnedFd, bool)>> {
        let path = self.full(name);
        let open = |flags: OFlags| match self.open_file(name, flags) {
            Err(Errno::NOENT) if create => {
                let top = Parent::Top(self.fd.as_fd());
                match self.create_in(&top, name, flags, Mode::from_raw_mode(FILE_MODE)) {
                    Ok(fd) => regular_only(fd, flags),
                    // Made by another store meanwhile.
                    Err(Errno::EXIST) => self.open_file(name, flags),
                    Err(e) => Err(e),
                }
            }
            r => r,
        };
        let (fd, direct) = if direct {
            match open(access | OFlags::DIRECT) {
                Err(Errno::INVAL | Errno::OPNOTSUPP) => (open(access), false),
                r => (r, true),
            }
        } else {
            (open(access), false)
        };
        match fd {
            Ok(Opened::File(fd, _)) => Ok(Some((fd, direct))),
            Err(Errno::NOENT) => Ok(None),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ns::tests::*;

    /// The ledger's lock waits for another holder at most its wait, then fails naming the
    /// ledger; once the holder lets go it is taken again.
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
}
