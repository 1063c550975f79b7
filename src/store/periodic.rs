//! A store's periodic background threads (the live counters' writer, the worker lock's
//! keeper): each runs one job every interval, holding only a weak reference to the store, and
//! stops when dropped or when the store is gone.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

#[cfg(doc)]
use super::Inner;
use crate::sys::Thread;

#[derive(Debug, Default)]
struct Signal {
    stop: Mutex<bool>,
    cv: Condvar,
}

/// A thread that runs a job on the store every interval.
#[derive(Debug)]
pub(super) struct Periodic {
    signal: Arc<Signal>,
    thread: Option<Thread>,
}

impl Periodic {
    /// Starts thread `name`, which runs `job` on the store (an [`Inner`]; anything, in
    /// tests) every `interval` (the first time one interval from now) until it is dropped or
    /// the store is gone.
    pub fn spawn<T: Send + Sync + 'static>(
        name: &str,
        store: Weak<T>,
        interval: Duration,
        job: impl Fn(&T) + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let signal = Arc::new(Signal::default());
        let sig = signal.clone();
        let thread = Thread::spawn(name.into(), move || {
            loop {
                {
                    let stop = sig.stop.lock().unwrap_or_else(|e| e.into_inner());
                    let (stop, _) = sig
                        .cv
                        .wait_timeout(stop, interval)
                        .unwrap_or_else(|e| e.into_inner());
                    if *stop {
                        return;
                    }
                }
                let Some(inner) = store.upgrade() else { return };
                job(&inner);
            }
        })?;
        Ok(Periodic {
            signal,
            thread: Some(thread),
        })
    }
}

impl Drop for Periodic {
    /// Stops the thread and waits for a job in progress to finish. In a process forked
    /// since the thread started, there is no thread: nothing to stop or wait for (and its
    /// signal's lock may have been held at the fork).
    fn drop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        if t.ours() {
            *self.signal.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.signal.cv.notify_one();
        }
        t.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    #[derive(Default)]
    struct Jobs {
        started: AtomicBool,
        done: AtomicU64,
    }

    /// Dropping a `Periodic` stops its thread, after the job in progress: no job runs or
    /// finishes after the drop returns, though the store lives on.
    #[test]
    fn dropping_it_waits_for_the_job_in_progress_and_stops_the_thread() {
        let jobs = Arc::new(Jobs::default());
        let p = Periodic::spawn(
            "test",
            Arc::downgrade(&jobs),
            Duration::from_millis(5),
            |j| {
                j.started.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(50));
                j.done.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        while !jobs.started.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(p);
        let at_drop = jobs.done.load(Ordering::SeqCst);
        assert!(at_drop >= 1, "the job in progress was not waited for");
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(
            jobs.done.load(Ordering::SeqCst),
            at_drop,
            "a job ran after the drop"
        );
    }

    /// The thread ends by itself once the store is gone.
    #[test]
    fn it_ends_when_the_store_is_gone() {
        let jobs = Arc::new(Jobs::default());
        let p = Periodic::spawn(
            "test",
            Arc::downgrade(&jobs),
            Duration::from_millis(5),
            |j| {
                j.done.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        drop(jobs);
        std::thread::sleep(Duration::from_millis(30));
        assert!(p.thread.as_ref().is_some_and(Thread::is_finished));
    }
}
