//! The machinery both completion queues of the crate share ([`crate::Completions`] over a
//! store's batch calls, [`crate::Transfers`] between an engine's KV memory and a store): jobs
//! queued in submission order, named threads that run them one at a time each, finished jobs
//! collected by polling, by blocking, or through an eventfd readable while any wait.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use crate::error::{Error, Result};
use crate::sys::Thread;

/// Jobs not yet started, oldest first, with their ids, and whether the runner is closing (its
/// threads then finish what is queued and stop).
struct Queue<J> {
    jobs: VecDeque<(u64, J)>,
    closing: bool,
}

/// The state the submitters, the threads and the collector share.
struct RunnerState<C, J, D> {
    /// What every job runs against (a store; a store and a memory).
    ctx: C,
    /// Runs job `id` against the context: what the collector gets.
    run: fn(&C, u64, J) -> D,
    jobs: Mutex<Queue<J>>,
    /// Signalled when a job is queued or the runner closes.
    queued: Condvar,
    /// Finished jobs not yet collected.
    done: Mutex<Vec<D>>,
    /// Counts finished jobs since the last collection: readable while any are waiting.
    event: OwnedFd,
    /// Jobs submitted and not yet collected.
    pending: AtomicU64,
    next_id: AtomicU64,
}

/// Jobs `J` run against a context `C` on threads of their own, each giving a `D`.
pub(crate) struct Runner<C: Send + Sync + 'static, J: Send + 'static, D: Send + 'static> {
    shared: Arc<RunnerState<C, J, D>>,
    threads: Vec<Thread>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<C: Send + Sync + 'static, J: Send + 'static, D: Send + 'static> Runner<C, J, D> {
    /// A runner of `threads` threads (at least one) named `<name>-N`; `eventfd_path` names
    /// what an eventfd failure is reported against.
    pub fn new(
        ctx: C,
        run: fn(&C, u64, J) -> D,
        threads: usize,
        name: &str,
        eventfd_path: &std::path::Path,
    ) -> Result<Self> {
        let event = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| Error::from_io(eventfd_path, crate::ns::io_err(e)))?;
        let mut out = Runner {
            shared: Arc::new(RunnerState {
                ctx,
                run,
                jobs: Mutex::new(Queue {
                    jobs: VecDeque::new(),
                    closing: false,
                }),
                queued: Condvar::new(),
                done: Mutex::new(Vec::new()),
                event,
                pending: AtomicU64::new(0),
                next_id: AtomicU64::new(1),
            }),
            threads: Vec::new(),
        };
        for n in 0..threads.max(1) {
            let s = out.shared.clone();
            let spawned = Thread::spawn(format!("{name}-{n}"), move || s.work());
            match spawned {
                Ok(h) => out.threads.push(h),
                // Dropping `out` stops the threads already started.
                Err(e) => return Err(Error::from_io(format!("{name} thread"), e)),
            }
        }
        Ok(out)
    }

    /// What the jobs run against.
    pub fn ctx(&self) -> &C {
        &self.shared.ctx
    }

    /// How many threads run the jobs.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Queues `job`; returns its id at once.
    pub fn submit(&self, job: J) -> u64 {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        lock(&self.shared.jobs).jobs.push_back((id, job));
        self.shared.queued.notify_one();
        id
    }

    /// The finished jobs not yet collected, without waiting.
    pub fn drain(&self) -> Vec<D> {
        // The count first, then the list: a job that finishes in between is in the list and
        // leaves the count readable, so a poller wakes once more for nothing, never misses one.
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&self.shared.event, &mut count);
        let done = std::mem::take(&mut *lock(&self.shared.done));
        self.shared
            .pending
            .fetch_sub(done.len() as u64, Ordering::AcqRel);
        done
    }

    /// Waits until at least one job has finished or `timeout` has passed (`None`: no limit,
    /// but returns at once when none is pending), and collects what finished.
    pub fn wait(&self, timeout: Option<Duration>) -> Vec<D> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let done = self.drain();
            if !done.is_empty() || self.pending() == 0 {
                return done;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return done;
            }
            let ts = left.map(|l| rustix::time::Timespec {
                tv_sec: l.as_secs() as i64,
                tv_nsec: i64::from(l.subsec_nanos()),
            });
            let mut fds = [PollFd::new(&self.shared.event, PollFlags::IN)];
            match rustix::event::poll(&mut fds, ts.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => panic!("poll of a completion eventfd failed: {e}"),
            }
        }
    }

    /// An eventfd that is readable while finished jobs wait to be collected.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.event.as_fd()
    }

    /// Jobs submitted and not yet collected (queued, running or finished).
    pub fn pending(&self) -> u64 {
        self.shared.pending.load(Ordering::Acquire)
    }

    /// Lets the threads finish what is queued, and waits for them. In a process forked since
    /// the runner started, its threads do not run: what is queued stays queued, and nothing
    /// is waited for (nor locked: a lock may have been held at the fork).
    pub fn stop(&mut self) {
        if self.threads.iter().any(Thread::ours) {
            lock(&self.shared.jobs).closing = true;
            self.shared.queued.notify_all();
        }
        for t in self.threads.drain(..) {
            t.join();
        }
    }
}

impl<C: Send + Sync + 'static, J: Send + 'static, D: Send + 'static> Drop for Runner<C, J, D> {
    fn drop(&mut self) {
        // Jobs still queued run first (the threads stop once the queue is empty), so no
        // submitted job is lost. After `stop`, the threads are gone already.
        self.stop();
    }
}

impl<C, J, D> RunnerState<C, J, D> {
    /// A thread's loop: the oldest queued job, run, until the runner closes.
    fn work(&self) {
        loop {
            let (id, job) = {
                let mut q = lock(&self.jobs);
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break j;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.queued.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            let done = (self.run)(&self.ctx, id, job);
            lock(&self.done).push(done);
            let _ = rustix::io::write(&self.event, &1u64.to_ne_bytes());
        }
    }
}
