//! Capacity enforcement: unlinking victims, and the background evictor that keeps usage
//! between the watermarks so that puts rarely evict inline.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use super::Inner;

/// Blocks the background evictor takes from the index before unlinking them.
const EVICT_STEP: usize = 16;
/// Victims whose files could not be unlinked, tried again by each later unlinking call.
const RETRY_STUCK: usize = 16;
use crate::index::Victim;
use crate::ns::{EventCause, EventKind, JournalGuard, Unlinked};

#[derive(Debug, Default)]
struct Signal {
    /// (work requested, shut down)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

/// The background eviction thread of a store with a capacity.
#[derive(Debug)]
pub(super) struct Evictor {
    signal: Arc<Signal>,
    thread: Option<crate::sys::Thread>,
}

impl Evictor {
    /// Starts the thread. It holds only a weak reference: it ends when the store is dropped.
    pub fn spawn(store: Weak<Inner>) -> std::io::Result<Evictor> {
        let signal = Arc::new(Signal::default());
        let sig = signal.clone();
        let thread = crate::sys::Thread::spawn("tierkv-evict".into(), move || run(store, sig))?;
        Ok(Evictor {
            signal,
            thread: Some(thread),
        })
    }

    /// Asks the thread to evict down to the low watermark.
    pub fn wake(&self) {
        let mut st = self.signal.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = true;
        self.signal.cv.notify_one();
    }
}

impl Drop for Evictor {
    /// Stops the thread and waits for an eviction in progress to finish (in a process forked
    /// since, where the thread does not run, neither).
    fn drop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        if t.ours() {
            let mut st = self.signal.state.lock().unwrap_or_else(|e| e.into_inner());
            st.1 = true;
            self.signal.cv.notify_one();
        }
        t.join();
    }
}

fn run(store: Weak<Inner>, signal: Arc<Signal>) {
    loop {
        {
            let mut st = signal.state.lock().unwrap_or_else(|e| e.into_inner());
            while !st.0 && !st.1 {
                st = signal
                    .cv
                    .wait_timeout(st, Duration::from_secs(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                if store.strong_count() == 0 {
                    return;
                }
            }
            if st.1 {
                return;
            }
            st.0 = false;
        }
        let Some(inner) = store.upgrade() else { return };
        if inner.index.over_high() {
            // A few victims at a time, unlinked before the next are chosen: evicted blocks
            // still on disk count against the bound, so puts never see much of that.
            let mut count = 0;
            loop {
                let victims = inner.index.evict_to_low(EVICT_STEP);
                if victims.is_empty() {
                    break;
                }
                count += victims.len();
                inner.unlink_victims(victims);
            }
            tracing::debug!(count, "background eviction");
        }
    }
}

impl Inner {
    /// Unlinks the files of blocks the index has given up, and tries again up to
    /// [`RETRY_STUCK`] whose files could not be unlinked before. A key published again since
    /// it was chosen is left alone (checked under its stripe lock).
    /// Each victim stops counting against the bound (`Index::drained`) once its file is gone;
    /// one whose unlink fails stays counted (`Index::stuck`). True if any did: the put that
    /// counted on that room declines what no longer fits (`Inner::shed_over_bound`).
    pub(super) fn unlink_victims(&self, victims: Vec<Victim>) -> bool {
        let mut journal = self.journal_lock();
        let mut stuck = Vec::new();
        for v in victims {
            if let Err((path, e)) = self.unlink_victim(&v, &mut journal) {
                tracing::warn!(path = %path.display(), error = %e,
                    "could not unlink an evicted block: it counts against the capacity until it can be");
                stuck.push(v);
            }
        }
        for v in self.index.take_stuck(RETRY_STUCK) {
            if let Err((path, e)) = self.unlink_victim(&v, &mut journal) {
                tracing::debug!(path = %path.display(), error = %e,
                    "still cannot unlink an evicted block");
                stuck.push(v);
            }
        }
        let any = !stuck.is_empty();
        self.index.stuck(stuck);
        any
    }

    /// Unlinks victim `v`'s file under its stripe lock (unless its key was published again)
    /// and marks it drained; the path and error if the unlink failed (it is not drained).
    /// Its removal is recorded in `journal`.
    fn unlink_victim(
        &self,
        v: &Victim,
        journal: &mut Option<JournalGuard<'_>>,
    ) -> Result<(), (std::path::PathBuf, rustix::io::Errno)> {
        let _stripe = self.lock_stripe(self.stripe_of(&v.hash));
        if self.index.contains(&v.hash) {
            // Published again: the file is the new block's; the old one was renamed over.
            self.index.drained(std::slice::from_ref(v));
            return Ok(());
        }
        self.fds.invalidate(&v.hash);
        let rel = self.layout.rel_path(&v.hash);
        match self.ns.unlink_file_sized(rel.as_str(), None) {
            Ok((Unlinked::Removed, bytes)) => {
                self.freed(bytes);
                if let Some(j) = journal {
                    j.record(EventKind::Removed, EventCause::Evicted, v.hash);
                }
            }
            Ok((Unlinked::Missing, _)) => {
                // Gone before its eviction (removed by hand, or by another store, which told
                // it then: a removal may be told twice).
                if let Some(j) = journal {
                    j.record(EventKind::Removed, EventCause::Missing, v.hash);
                }
            }
            Ok((Unlinked::Refused, _)) => tracing::warn!(
                path = %self.path(rel.as_str()).display(),
                "an evicted block's name holds something else: left alone"
            ),
            Err(e) => return Err((self.path(rel.as_str()), e)),
        }
        self.index.drained(std::slice::from_ref(v));
        Ok(())
    }
}
