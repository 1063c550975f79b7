//! The namespace layer's fault-injecting twin: makes chosen operations fail with a chosen
//! errno, so tests can drive every error path of the store and the tools.

use std::sync::Mutex;

use rustix::io::Errno;

/// The operations of [`BlockDir`](super::BlockDir) that faults can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NsOp {
    /// Any path resolution that opens a file or directory.
    Open,
    /// Creating a file (`O_CREAT | O_EXCL` or `O_TMPFILE`).
    Create,
    /// Creating a directory.
    Mkdir,
    /// A rename.
    Rename,
    /// A hard link (publishing an `O_TMPFILE` inode).
    Link,
    /// An unlink.
    Unlink,
    /// A `stat`.
    Stat,
    /// A directory listing.
    ReadDir,
    /// Taking the worker lock.
    Lock,
    /// Asking whether a file is open elsewhere (a write lease), before reusing it.
    Lease,
}

#[derive(Debug)]
struct Rule {
    op: NsOp,
    errno: Errno,
    /// Matching calls still to pass before the rule fires.
    skip: u64,
    /// Failures still to inject.
    times: u64,
}

/// A set of injected faults; shared by a [`BlockDir`](super::BlockDir) and the test that
/// made it.
#[derive(Debug, Default)]
pub struct NsFaults {
    rules: Mutex<Vec<Rule>>,
    injected: Mutex<u64>,
}

impl NsFaults {
    /// No faults yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// After `skip` more calls of `op` pass, fails the next `times` of them with `errno`.
    pub fn fail(&self, op: NsOp, errno: Errno, skip: u64, times: u64) {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Rule {
                op,
                errno,
                skip,
                times,
            });
    }

    /// Drops every rule not yet spent.
    pub fn clear(&self) {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        *self.injected.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the layer before each operation.
    pub(super) fn check(&self, op: NsOp) -> rustix::io::Result<()> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        for r in rules.iter_mut().filter(|r| r.op == op && r.times > 0) {
            if r.skip > 0 {
                r.skip -= 1;
                continue;
            }
            r.times -= 1;
            *self.injected.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            return Err(r.errno);
        }
        Ok(())
    }
}
