//! A completion queue over a [`Store`]: batches are submitted without waiting and their
//! results collected later, by polling ([`Completions::drain`]), by blocking
//! ([`Completions::wait`]), or by waiting for an eventfd ([`Completions::event_fd`]) to become
//! readable in the caller's own event loop.
//!
//! This is the shape the engines' plugin interfaces share: LMCache's `native_plugin` L2
//! adapter (`submit_batch_get/set/exists`, `event_fd`, `drain_completions`), vLLM's
//! `SecondaryTierManager` (`submit_store`, `submit_load`, `get_finished_jobs`) and SGLang's
//! prefetch and backup threads. A submission never blocks on the disk: it queues the batch
//! and returns its id; `threads` named threads (`tierkv-cq-N`) run the batches through the
//! store's own batch calls, one at a time each, and hand every buffer back with its results
//! (the `BufResult` shape of io_uring APIs), so no buffer is copied and none is dropped while
//! a batch still writes into it.
//!
//! Ordering: batches start in submission order; with more than one thread they may complete
//! in any order (each completion carries its id). A store error is a result of its batch, as
//! from the store's own calls; a batch whose call panicked completes with every result an
//! [`Error::Io`] naming the store and the panic, so a caller waiting on it is never left
//! waiting. Closing (or dropping) the queue runs every batch already submitted first.

mod runner;

pub(crate) use runner::Runner;

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::BlockKey;
use crate::store::{Lookup, Store};

/// One batch, as submitted.
enum Job<B> {
    Get(Vec<BlockKey>, Vec<B>),
    Set(Vec<(BlockKey, B)>),
    Exists(Vec<BlockKey>),
    Prefix(Vec<BlockKey>),
    /// The keys, and whether the blocks after them go too.
    Remove(Vec<BlockKey>, bool),
}

/// What a finished batch gives back: its results, one per key in order, and the buffers it
/// was given.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome<B> {
    /// A [`Completions::submit_get`]: each block's lookup, and the buffers (a hit's bytes are
    /// at the start of its buffer).
    Get {
        /// One per key.
        results: Vec<Result<Lookup>>,
        /// The buffers, in the keys' order.
        bufs: Vec<B>,
    },
    /// A [`Completions::submit_set`]: each block's put, and the items (their buffers may be
    /// reused).
    Set {
        /// One per item.
        results: Vec<Result<()>>,
        /// The items, in their order.
        items: Vec<(BlockKey, B)>,
    },
    /// A [`Completions::submit_exists`]: whether each block is stored.
    Exists {
        /// One per key.
        results: Vec<Result<bool>>,
    },
    /// A [`Completions::submit_prefix`]: how many of the keys' leading blocks are stored.
    Prefix {
        /// The length of the stored prefix.
        result: Result<usize>,
    },
    /// A [`Completions::submit_remove`] or [`Completions::submit_discard`]: whether each block
    /// was removed (`false`: absent).
    Remove {
        /// One per key.
        results: Vec<Result<bool>>,
    },
}

/// A finished batch.
#[derive(Debug)]
pub struct Completion<B> {
    /// The id its submission returned.
    pub id: u64,
    /// Its results and buffers.
    pub outcome: Outcome<B>,
}

/// A completion queue over a store (see the module docs).
pub struct Completions<B: Send + 'static = Vec<u8>> {
    runner: Runner<Store, Job<B>, Completion<B>>,
}

impl<B> std::fmt::Debug for Completions<B>
where
    B: AsRef<[u8]> + AsMut<[u8]> + Send + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions")
            .field("threads", &self.runner.threads())
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

impl<B> Completions<B>
where
    B: AsRef<[u8]> + AsMut<[u8]> + Send + 'static,
{
    /// A queue over `store` whose batches run on `threads` threads (at least 1).
    pub fn new(store: Store, threads: usize) -> Result<Self> {
        let dir = store.dir().to_path_buf();
        let run = |store: &Store, id: u64, job: Job<B>| Completion {
            id,
            outcome: job.run(store),
        };
        Ok(Completions {
            runner: Runner::new(store, run, threads, "tierkv-cq", &dir)?,
        })
    }

    /// The store the batches run on.
    pub fn store(&self) -> &Store {
        self.runner.ctx()
    }

    /// Queues a get of `keys` into `bufs` (one each, as [`Store::get_many`]); returns its id.
    pub fn submit_get(&self, keys: Vec<BlockKey>, bufs: Vec<B>) -> u64 {
        self.submit(Job::Get(keys, bufs))
    }

    /// Queues a put of `items` (as [`Store::put_many`]); returns its id.
    pub fn submit_set(&self, items: Vec<(BlockKey, B)>) -> u64 {
        self.submit(Job::Set(items))
    }

    /// Queues a lookup of which of `keys` are stored (as [`Store::contains_many`]).
    pub fn submit_exists(&self, keys: Vec<BlockKey>) -> u64 {
        self.submit(Job::Exists(keys))
    }

    /// Queues a lookup of how many of `keys`' leading blocks are stored (as
    /// [`Store::contains_prefix`]).
    pub fn submit_prefix(&self, keys: Vec<BlockKey>) -> u64 {
        self.submit(Job::Prefix(keys))
    }

    /// Queues a removal of `keys` (as [`Store::remove_many`]: within their chains, the blocks
    /// after them go too); returns its id.
    pub fn submit_remove(&self, keys: Vec<BlockKey>) -> u64 {
        self.submit(Job::Remove(keys, true))
    }

    /// Queues a removal of exactly `keys` (as [`Store::discard_many`]: the blocks after them
    /// stay); returns its id. It finishes as an [`Outcome::Remove`].
    pub fn submit_discard(&self, keys: Vec<BlockKey>) -> u64 {
        self.submit(Job::Remove(keys, false))
    }

    fn submit(&self, job: Job<B>) -> u64 {
        self.runner.submit(job)
    }

    /// The finished batches not yet collected, without waiting (none if none finished).
    pub fn drain(&self) -> Vec<Completion<B>> {
        self.runner.drain()
    }

    /// Waits until at least one batch has finished, or `timeout` has passed (`None`: no
    /// limit, but returns at once when no batch is pending), and collects what finished.
    pub fn wait(&self, timeout: Option<Duration>) -> Vec<Completion<B>> {
        self.runner.wait(timeout)
    }

    /// An eventfd that is readable while finished batches wait to be collected: for the
    /// caller's `poll`/`epoll`. Collect with [`Completions::drain`], which resets it.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.runner.event_fd()
    }

    /// Batches submitted and not yet collected (queued, running or finished).
    pub fn pending(&self) -> u64 {
        self.runner.pending()
    }

    /// Runs every batch already submitted, stops the threads, and returns what finished and
    /// was not collected.
    pub fn close(mut self) -> Vec<Completion<B>> {
        // Closing (or dropping) runs every batch already submitted first: the runner's
        // threads stop once the queue is empty.
        self.runner.stop();
        self.runner.drain()
    }
}

impl<B> Job<B>
where
    B: AsRef<[u8]> + AsMut<[u8]> + Send + 'static,
{
    /// Runs the batch through the store's batch call; a panic there fails every result.
    fn run(self, store: &Store) -> Outcome<B> {
        match self {
            Job::Get(keys, mut bufs) => {
                let r = guarded(store, keys.len(), || store.get_many(&keys, &mut bufs));
                Outcome::Get { results: r, bufs }
            }
            Job::Set(items) => {
                let results = guarded(store, items.len(), || {
                    let view: Vec<(BlockKey, &[u8])> =
                        items.iter().map(|(k, b)| (k.clone(), b.as_ref())).collect();
                    store.put_many(&view)
                });
                Outcome::Set { results, items }
            }
            Job::Exists(keys) => Outcome::Exists {
                results: guarded(store, keys.len(), || store.contains_many(&keys)),
            },
            Job::Remove(keys, descendants) => Outcome::Remove {
                results: guarded(store, keys.len(), || {
                    if descendants {
                        store.remove_many(&keys)
                    } else {
                        store.discard_many(&keys)
                    }
                }),
            },
            Job::Prefix(keys) => Outcome::Prefix {
                result: guarded(store, 1, || vec![store.contains_prefix(&keys)])
                    .pop()
                    .expect("one result"),
            },
        }
    }
}

/// `call`'s results, or `n` errors naming the store and the panic if it panicked.
pub(crate) fn guarded<T>(
    store: &Store,
    n: usize,
    call: impl FnOnce() -> Vec<Result<T>>,
) -> Vec<Result<T>> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            (0..n)
                .map(|_| {
                    let e =
                        std::io::Error::other(format!("the batch's store call panicked: {what}"));
                    Err(Error::from_io(store.dir(), e))
                })
                .collect()
        }
    }
}
