//! The worker lock: `flock` on the worker directory and on [`FLOCK_FILE`], kept in place
//! while the store runs, and who holds it (`.lock`).

use super::*;

/// How often a store checks that its worker lock's file is still in place
/// ([`BlockDir::keep_lock`]).
pub const LOCK_KEEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// How long an opener waits for a missing lock file to be put back by a holder before it
/// creates one: 20 of the holder's checks ([`LOCK_KEEP_INTERVAL`]). 1.5 s was too short
/// on a loaded machine: on GlusterFS with the 2 vCPUs busy with builds, a holder twice took
/// longer to put the file back and another node's store opened the worker (the holder then
/// found its lock lost and wrote nothing more: safe, but not the exclusion the lock file is
/// for; `shared_dfs::a_removed_lock_file_does_not_let_another_node_open_an_exclusive_worker`).
/// Only an open that finds the file missing in a tree that has a `LAYOUT` waits.
pub const LOCK_FILE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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

impl BlockDir {
    /// Tries to take the worker lock: `flock(LOCK_EX | LOCK_NB)` on the worker directory
    /// itself, which cannot be unlinked or replaced behind the holder's back, and on the
    /// regular file `FLOCK_FILE` in it (created if missing, never rewritten): a distributed
    /// filesystem may keep directory locks to one client (GlusterFS does) while it honours
    /// file locks across clients. False if another open descriptor holds either.
    pub fn try_lock(&self) -> rustix::io::Result<bool> {
        self.flock_both(FlockOperation::NonBlockingLockExclusive)
    }

    /// Tries to take the worker lock shared (`flock(LOCK_SH | LOCK_NB)` on the directory and
    /// on `FLOCK_FILE`), as stores in shared mode do: they exclude an exclusive store, not
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
    /// `FLOCK_FILE`, and puts one back if not. A distributed filesystem that keeps
    /// directory locks to one client (GlusterFS) excludes other nodes through that file
    /// alone: once it is removed (or renamed over), another node's store creates a new one
    /// and locks it. So a new file is made under a temp name, locked with `op`, and linked as
    /// `FLOCK_FILE`; if another store made one first, that one is locked instead. Run by
    /// the store every `LOCK_KEEP_INTERVAL`.
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

    /// Releases the worker lock.
    pub fn unlock(&self) -> rustix::io::Result<()> {
        if let Some(fd) = &*self.lock_file.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
        }
        rustix::fs::flock(&self.fd, FlockOperation::Unlock)
    }

    /// True if some other descriptor holds the worker lock exclusively (an exclusive store
    /// is running), checked with shared locks (on the directory and on `FLOCK_FILE`) that
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ns::tests::*;

    /// `keep_lock`: a held lock file stays; a removed one is put back,
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
}
