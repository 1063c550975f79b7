//! A store's periodic background threads (the live counters' writer, the worker lock's
//! keeper): each runs one job every interval, holding only a weak reference to the store, and
//! stops when dropped or when the store is gone.

use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Inner;

#[derive(Debug, Default)]
struct Signal {
    stop: Mutex<bool>,
    cv: Condvar,
}

/// A thread that runs a job on the store every interval.
#[derive(Debug)]
pub(super) struct Periodic {
    signal: Arc<Signal>,
    thread: Option<JoinHandle<()>>,
}

impl Periodic {
    /// Starts thread `name`, which runs `job` on the store every `interval` (the first time
    /// one interval from now) until it is dropped or the store is gone.
    pub fn spawn(
        name: &str,
        store: Weak<Inner>,
        interval: Duration,
        job: impl Fn(&Inner) + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let signal = Arc::new(Signal::default());
        let sig = signal.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
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
    /// Stops the thread and waits for a job in progress to finish.
    fn drop(&mut self) {
        *self.signal.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.signal.cv.notify_one();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
