//! [`EventTail`]: a store's event journal followed on a thread of its own, so that an engine's
//! scheduler takes what was appended without reading the disk.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::Store;
use crate::ns::BlockEvent;
use crate::sys::Thread;
use crate::{Error, Result};

/// Events held for the taker at most: past this many untaken, the oldest are dropped and the
/// taker is told it missed some (as when the journal's ring goes round: it checks what it
/// told against the store). A journal ring's worth.
pub const TAIL_MAX_HELD: usize = crate::ns::JOURNAL_CAPACITY as usize;

/// Events read per look at the journal.
const READ_BATCH: usize = 4096;

#[derive(Default)]
struct Held {
    events: Vec<BlockEvent>,
    missed: bool,
    stop: bool,
}

struct Shared {
    held: Mutex<Held>,
    /// Wakes the thread early to stop.
    wake: Condvar,
}

impl Shared {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Follows a store's event journal (docs/events.md) from where it ends when started: a thread
/// reads what is appended, looking again every `interval` while nothing is; [`take`] returns
/// the events read since the last call, in journal order, and whether some were missed since
/// (the ring went round, or more than [`TAIL_MAX_HELD`] waited untaken: the taker then checks
/// what it told against the store). It reads the journal the store opened: one made again
/// later is not followed (docs/events.md: a consumer that must see that follows the tree with
/// `inspect`). A journal that cannot be read is logged and tried again; the follower never
/// stops on its own. Dropping it (or [`close`]) stops and joins the thread.
///
/// [`take`]: EventTail::take
/// [`close`]: EventTail::close
pub struct EventTail {
    shared: Arc<Shared>,
    thread: Option<Thread>,
}

impl std::fmt::Debug for EventTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventTail").finish_non_exhaustive()
    }
}

impl EventTail {
    /// Starts following `store`'s journal from its end now.
    pub fn start(store: Store, interval: Duration) -> Result<EventTail> {
        let end = store.events_end()?;
        let shared = Arc::new(Shared {
            held: Mutex::new(Held::default()),
            wake: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        let dir = store.dir().to_path_buf();
        let thread = Thread::spawn("tierkv-events".into(), move || {
            follow(&store, &s, end.next, interval)
        })
        .map_err(|e| Error::Io {
            path: dir,
            source: std::io::Error::new(
                e.kind(),
                format!("could not start the event journal's follower: {e}"),
            ),
        })?;
        Ok(EventTail {
            shared,
            thread: Some(thread),
        })
    }

    /// The events read since the last call, in journal order, and whether some were missed.
    pub fn take(&self) -> (Vec<BlockEvent>, bool) {
        let mut held = self.shared.held();
        let missed = std::mem::take(&mut held.missed);
        (std::mem::take(&mut held.events), missed)
    }

    /// Stops the thread and waits for it.
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.held().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            // In a process forked since, the thread does not run there: nothing to wait for.
            t.join();
        }
    }
}

impl Drop for EventTail {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: reads from `next` until told to stop. (The store reads the journal it opened,
/// so its identity never changes under the follower: only the ring going round is missed.)
fn follow(store: &Store, shared: &Shared, mut next: u64, interval: Duration) {
    // Whether the last read found events: then read again at once, else after `interval`
    // (the journal was at its end when the follower started, so it waits first).
    let mut got = false;
    loop {
        if !got {
            let held = shared.held();
            // Nothing new: look again after `interval`, or at once when told to stop.
            let (h, _) = shared
                .wake
                .wait_timeout_while(held, interval, |h| !h.stop)
                .unwrap_or_else(|e| e.into_inner());
            if h.stop {
                return;
            }
        }
        let read = match store.events_since(next, READ_BATCH) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!("tierkv event journal: {e}");
                None
            }
        };
        let mut held = shared.held();
        if held.stop {
            return;
        }
        got = read.as_ref().is_some_and(|r| !r.events.is_empty());
        if let Some(r) = read {
            held.missed |= r.missed > 0;
            held.events.extend(r.events);
            let over = held.events.len().saturating_sub(TAIL_MAX_HELD);
            if over > 0 {
                held.events.drain(..over);
                held.missed = true;
            }
            next = r.next;
        }
    }
}
