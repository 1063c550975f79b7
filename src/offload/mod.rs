//! Write-behind offload: the engine-facing write API.
//!
//! An inference engine must never wait on the disk. An [`Offloader`] sits in front of a
//! [`Store`]: the engine hands it the blocks it computed ([`Offloader::offer`], owned
//! buffers or a guard that keeps the engine's buffer alive, as a [`Payload`]) and returns at
//! once; a writer thread of the offloader's own (a std thread, never a tokio worker) hands
//! them to the store in batches, one [`Store::offer_many_vectored_after`] per chain batch, roots first.
//!
//! - Memory is bounded ([`OffloadConfig::max_bytes`], [`OffloadConfig::max_blocks`]: blocks
//!   queued or being written). When full, the newest offer is dropped and counted
//!   ([`WhenFull::DropNewest`], the default: a cache may lose a write, an engine must not
//!   stall), or the offer waits for room ([`WhenFull::Block`]).
//! - A block already stored, or already queued, is not written twice. A get of a block still
//!   queued is served from the queue ([`Offloader::get_many`]: a hit, counted in
//!   [`OffloadStats::served_from_queue`]).
//! - An admission filter ([`WriteFilter`]) runs before the queue.
//! - [`Offloader::flush`] waits for what was offered before it; [`Offloader::close`] writes
//!   or drops what is queued ([`OnClose`]), counted either way. A crash loses the queued
//!   blocks only: each write is the store's atomic put, so no partial block is ever published.
//! - Each offer can be tracked ([`Offloader::offer_tracked`]): one [`OfferOutcome`] per block,
//!   written, dropped with its [`DropReason`], or failed with its error.
//! - Counters ([`OffloadStats`]) are part of [`Store::stats`], so of `STATS.json`,
//!   `tierkv-stat --live` and its Prometheus output.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::key::{BlockHash, BlockKey, WorkerId};
use crate::store::{Lookup, Store, Stored};

pub mod filter;

pub(crate) use crate::stats::OffloadCounters;
pub use crate::stats::OffloadStats;
use crate::stats::{add, sub};
pub use filter::{Candidate, FilterKind, WriteFilter};

/// The bytes of one block offered for writing: owned by the offloader until the block is
/// written or dropped. Built from a `Vec<u8>` (no copy), from any guard that keeps the
/// engine's buffer alive and derefs to its bytes ([`Payload::new`]), or from a guard of
/// several buffers written as one payload, in order ([`Payload::vectored`]: a header and the
/// engine's buffer, say). The guard is dropped once the block is written or dropped: its
/// `Drop` is the engine's notice that the buffer may be reused. Cheap to clone.
#[derive(Clone)]
pub struct Payload {
    parts: Arc<dyn PayloadParts>,
    /// The parts' total length, summed once: the queue's accounting reads it per block.
    len: usize,
}

/// What a vectored [`Payload`] holds: the block's bytes in one or more parts, in payload
/// order (borrowed from buffers the value keeps alive).
pub trait PayloadParts: Send + Sync {
    /// The parts, in order; their concatenation is the block's payload.
    fn parts(&self) -> Vec<&[u8]>;
}

/// One buffer as a payload's only part.
struct OnePart<T>(T);

impl<T: AsRef<[u8]> + Send + Sync> PayloadParts for OnePart<T> {
    fn parts(&self) -> Vec<&[u8]> {
        vec![self.0.as_ref()]
    }
}

impl Payload {
    /// Wraps `bytes`: a buffer, or a guard of the engine's (e.g. a pinned host buffer that is
    /// returned to its pool when the guard drops, after the write).
    pub fn new<T: AsRef<[u8]> + Send + Sync + 'static>(bytes: T) -> Self {
        Payload::vectored(OnePart(bytes))
    }

    /// Wraps a guard of several buffers, written as one payload in the order of
    /// [`PayloadParts::parts`] (no copy).
    pub fn vectored<T: PayloadParts + 'static>(parts: T) -> Self {
        let len = parts.parts().iter().map(|p| p.len()).sum();
        Payload {
            parts: Arc::new(parts),
            len,
        }
    }

    /// The payload's parts, in order.
    pub fn parts(&self) -> Vec<&[u8]> {
        self.parts.parts()
    }

    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the payload into the front of `buf` (at least [`Payload::len`] bytes).
    fn copy_to(&self, buf: &mut [u8]) {
        let mut at = 0;
        for part in self.parts() {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.len())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        Payload::new(v)
    }
}

impl From<Arc<[u8]>> for Payload {
    fn from(v: Arc<[u8]>) -> Self {
        Payload::new(v)
    }
}

/// What an offer does when the queue is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenFull {
    /// Drop the newest offer (the blocks that do not fit, to the end of their chain), counted
    /// in [`OffloadStats::dropped_full`]. The engine's thread never waits for the disk.
    #[default]
    DropNewest,
    /// Wait for room (the engine's thread waits for the disk: for callers that prefer
    /// back-pressure to a lost write). A block larger than the whole bound is still dropped.
    Block,
}

/// What closing an offloader does with the blocks still queued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnClose {
    /// Write them, then close.
    #[default]
    Write,
    /// Drop them, counted in [`OffloadStats::dropped_closed`] (a batch already handed to the
    /// store finishes).
    Drop,
}

/// How an [`Offloader`] queues and writes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OffloadConfig {
    /// Payload bytes queued or being written, at most (default 512 MiB).
    pub max_bytes: u64,
    /// Blocks queued or being written, at most (default 4096).
    pub max_blocks: usize,
    /// When full: drop the newest offer (default) or wait.
    pub when_full: WhenFull,
    /// Blocks per store call, at most (default 64): a longer chain is split into batches, each
    /// continuing the one before.
    pub max_batch_blocks: usize,
    /// What dropping the offloader does with queued blocks (default: write them).
    pub on_close: OnClose,
    /// The admission filter (default: admit all).
    pub filter: FilterKind,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        OffloadConfig {
            max_bytes: 512 << 20,
            max_blocks: 4096,
            when_full: WhenFull::DropNewest,
            max_batch_blocks: 64,
            on_close: OnClose::Write,
            filter: FilterKind::All,
        }
    }
}

impl OffloadConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bounds the payload bytes in flight.
    pub fn with_max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Bounds the blocks in flight.
    pub fn with_max_blocks(mut self, blocks: usize) -> Self {
        self.max_blocks = blocks;
        self
    }

    /// Sets what a full queue does.
    pub fn with_when_full(mut self, when_full: WhenFull) -> Self {
        self.when_full = when_full;
        self
    }

    /// Sets the largest batch per store call (at least 1).
    pub fn with_max_batch_blocks(mut self, blocks: usize) -> Self {
        self.max_batch_blocks = blocks.max(1);
        self
    }

    /// Sets what dropping the offloader does with queued blocks.
    pub fn with_on_close(mut self, on_close: OnClose) -> Self {
        self.on_close = on_close;
        self
    }

    /// Uses a built-in admission filter ([`Offloader::with_filter`] takes any).
    pub fn with_filter(mut self, filter: FilterKind) -> Self {
        self.filter = filter;
        self
    }
}

/// Why an offered block was not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DropReason {
    /// The store holds it already (deduplicated: not a loss).
    AlreadyStored,
    /// An earlier offer queued it (deduplicated: not a loss; that offer's outcome tells).
    AlreadyQueued,
    /// The queue was full.
    Full,
    /// The admission filter declined it.
    Filtered,
    /// Its chain parent is neither stored nor queued (declined, dropped or invalid before it).
    NoParent,
    /// The store declined it (capacity, its policy's admission, the parent evicted meanwhile).
    NotAdmitted,
    /// Dropped at shutdown, or offered after it.
    Closed,
    /// The key belongs to another worker than the store's.
    InvalidKey,
}

impl DropReason {
    /// False for the deduplications ([`DropReason::AlreadyStored`],
    /// [`DropReason::AlreadyQueued`]): the block is (or will be) there all the same.
    pub fn is_loss(self) -> bool {
        !matches!(self, DropReason::AlreadyStored | DropReason::AlreadyQueued)
    }
}

/// What became of one offered block.
#[derive(Debug)]
#[non_exhaustive]
pub enum OfferOutcome {
    /// The store holds it.
    Written,
    /// Not written, for this reason.
    Dropped(DropReason),
    /// Its write failed (nothing partial was left behind).
    Failed(Error),
}

impl OfferOutcome {
    /// True for [`OfferOutcome::Written`].
    pub fn is_written(&self) -> bool {
        matches!(self, OfferOutcome::Written)
    }

    /// The reason, for a dropped block.
    pub fn drop_reason(&self) -> Option<DropReason> {
        match self {
            OfferOutcome::Dropped(r) => Some(*r),
            _ => None,
        }
    }
}

/// What one offer did at once, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Offered {
    /// Queued for writing.
    pub queued: usize,
    /// Already stored or queued: not queued again.
    pub deduped: usize,
    /// Dropped (full, filtered, no parent, closed, invalid key).
    pub dropped: usize,
}

#[derive(Debug)]
struct Slots {
    outcomes: Vec<Option<OfferOutcome>>,
    remaining: usize,
}

#[derive(Debug)]
struct Tracker {
    slots: Mutex<Slots>,
    done: Condvar,
}

impl Tracker {
    /// A tracker of `n` outcomes, none known yet.
    fn new(n: usize) -> Arc<Tracker> {
        Arc::new(Tracker {
            slots: Mutex::new(Slots {
                outcomes: (0..n).map(|_| None).collect(),
                remaining: n,
            }),
            done: Condvar::new(),
        })
    }

    fn set(&self, i: usize, o: OfferOutcome) {
        let mut s = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if s.outcomes[i].is_none() {
            s.remaining -= 1;
        }
        s.outcomes[i] = Some(o);
        if s.remaining == 0 {
            self.done.notify_all();
        }
    }
}

/// The outcomes of one tracked offer ([`Offloader::offer_tracked`]), one per block, known
/// once each block is written, dropped or failed.
#[derive(Debug)]
pub struct OfferCompletion(Arc<Tracker>);

impl OfferCompletion {
    /// True once every block's outcome is known.
    pub fn is_done(&self) -> bool {
        self.0
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remaining
            == 0
    }

    /// As [`OfferCompletion::wait`], for at most `timeout`: `Err(self)` if some outcome is still
    /// unknown then.
    pub fn wait_timeout(
        self,
        timeout: std::time::Duration,
    ) -> Result<Vec<OfferOutcome>, OfferCompletion> {
        let deadline = Instant::now() + timeout;
        {
            let mut s = self.0.slots.lock().unwrap_or_else(|e| e.into_inner());
            while s.remaining > 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    drop(s);
                    return Err(self);
                }
                s = self
                    .0
                    .done
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        Ok(self.wait())
    }

    /// Waits for every block's outcome; one per block, in the offer's order.
    pub fn wait(self) -> Vec<OfferOutcome> {
        let mut s = self.0.slots.lock().unwrap_or_else(|e| e.into_inner());
        while s.remaining > 0 {
            s = self.0.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.outcomes
            .drain(..)
            .map(|o| o.expect("every outcome is set"))
            .collect()
    }
}

/// One queued block.
struct Entry {
    key: BlockKey,
    data: Payload,
    track: Option<(Arc<Tracker>, usize)>,
}

/// Consecutive blocks of one chain, written in one store call.
struct Batch {
    parent: Option<BlockHash>,
    entries: Vec<Entry>,
    queued_at: Instant,
}

struct State {
    queue: VecDeque<Batch>,
    /// Blocks queued or being written, by hash: deduplication and gets from the queue.
    pending: HashMap<BlockHash, Payload>,
    blocks: usize,
    bytes: u64,
    filter: Box<dyn WriteFilter>,
    closing: bool,
    /// Batches queued, and batches finished (written, failed or dropped), since the start.
    enqueued: u64,
    finished: u64,
}

struct OffloadState {
    store: Store,
    cfg: OffloadConfig,
    state: Mutex<State>,
    /// Work queued, or closing.
    work: Condvar,
    /// A batch finished: room, and progress for `flush`.
    progress: Condvar,
    counters: Arc<OffloadCounters>,
}

impl OffloadState {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Write-behind offload in front of a [`Store`] (docs/engine-api.md says how it behaves).
///
/// ```
/// use tierkv::{OfferOutcome, OffloadConfig, Offloader};
/// use tierkv::{BlockHash, Store, StoreConfig, WorkerId};
///
/// let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path(), WorkerId::new("rank0")?, StoreConfig::default())?;
/// let offload = Offloader::new(store.clone(), OffloadConfig::default())?;
/// let tokens: Vec<u32> = (0..64).collect();
/// let keys: Vec<_> = BlockHash::chain_all(&tokens, 16).into_iter().map(|h| store.key(h)).collect();
/// // The engine's thread hands over its blocks and goes on at once.
/// let blocks = keys.iter().map(|k| (k.clone(), vec![7u8; 4096])).collect();
/// let done = offload.offer_tracked(None, blocks);
/// assert!(done.wait().iter().all(OfferOutcome::is_written));
/// assert_eq!(store.contains_prefix(&keys)?, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Offloader {
    shared: Arc<OffloadState>,
    writer: Option<crate::sys::Thread>,
}

impl fmt::Debug for Offloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Offloader")
            .field("store", &self.shared.store.dir())
            .field("config", &self.shared.cfg)
            .finish()
    }
}

impl Offloader {
    /// Starts an offloader (its writer thread) in front of `store`, with the filter that
    /// `config.filter` names. Its counters become part of `store.stats()`.
    pub fn new(store: Store, config: OffloadConfig) -> Result<Offloader> {
        let filter = config.filter.build();
        Self::with_filter(store, config, filter)
    }

    /// As [`Offloader::new`], with an admission filter built by the caller.
    pub fn with_filter(
        store: Store,
        config: OffloadConfig,
        filter: Box<dyn WriteFilter>,
    ) -> Result<Offloader> {
        if config.max_blocks == 0 || config.max_bytes == 0 {
            return Err(Error::Config(
                "offload: max_blocks and max_bytes must be positive".into(),
            ));
        }
        let counters = Arc::new(OffloadCounters::default());
        let _ = counters.filter.set(filter.name());
        store.attach_offload(counters.clone());
        let shared = Arc::new(OffloadState {
            store,
            cfg: OffloadConfig {
                max_batch_blocks: config.max_batch_blocks.max(1),
                ..config
            },
            state: Mutex::new(State {
                queue: VecDeque::new(),
                pending: HashMap::new(),
                blocks: 0,
                bytes: 0,
                filter,
                closing: false,
                enqueued: 0,
                finished: 0,
            }),
            work: Condvar::new(),
            progress: Condvar::new(),
            counters,
        });
        let s = shared.clone();
        let writer = crate::sys::Thread::spawn("tierkv-offload".into(), move || writer_loop(&s))
            .map_err(|e| Error::Io {
                path: shared.store.dir().to_path_buf(),
                source: std::io::Error::new(
                    e.kind(),
                    format!("could not start the offload thread: {e}"),
                ),
            })?;
        tracing::debug!(config = ?shared.cfg, "offloader started");
        Ok(Offloader {
            shared,
            writer: Some(writer),
        })
    }

    /// The store behind it.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Offers one chain's blocks, root first, after `parent` (the last block of the request's
    /// cached prefix; `None` when `blocks[0]` is a chain's root), and returns at once (unless
    /// [`WhenFull::Block`] and full). Blocks already stored or queued are skipped; the rest
    /// go through the filter and, room allowing, into the queue.
    pub fn offer<P: Into<Payload>>(
        &self,
        parent: Option<&BlockKey>,
        blocks: Vec<(BlockKey, P)>,
    ) -> Offered {
        self.offer_inner(parent, blocks, false).0
    }

    /// As [`Offloader::offer`], and the blocks' outcomes are tracked: the [`OfferCompletion`] gives
    /// one [`OfferOutcome`] per block, in order.
    pub fn offer_tracked<P: Into<Payload>>(
        &self,
        parent: Option<&BlockKey>,
        blocks: Vec<(BlockKey, P)>,
    ) -> OfferCompletion {
        let (_, c) = self.offer_inner(parent, blocks, true);
        c.expect("tracked")
    }

    /// Offers `blocks` after `parent` (see [`Offloader::offer`]); with `tracked`, their
    /// outcomes are tracked in the returned [`OfferCompletion`].
    fn offer_inner<P: Into<Payload>>(
        &self,
        parent: Option<&BlockKey>,
        blocks: Vec<(BlockKey, P)>,
        tracked: bool,
    ) -> (Offered, Option<OfferCompletion>) {
        let started = Instant::now();
        let sh = &*self.shared;
        let c = &*sh.counters;
        let n = blocks.len();
        let tracker = tracked.then(|| Tracker::new(n));
        let mut o = Offering::new(sh, tracker.as_ref(), parent);
        {
            let mut st = sh.lock();
            o.broken = o.broken_at_start(&st, parent);
            for (i, (key, data)) in blocks.into_iter().enumerate() {
                let data: Payload = data.into();
                let Some(chain_prev) = o.screen(&mut st, i, &key, &data) else {
                    continue;
                };
                // Room in the queue, or the reason there is none.
                let refused;
                (st, refused) = o.wait_for_room(st, &key.hash, data.len() as u64);
                if o.refuse(i, refused) {
                    continue;
                }
                o.enqueue(&mut st, i, key, data, chain_prev);
            }
            push_run(sh, &mut st, &mut o.run, o.run_parent);
        }
        add(&c.offered, n as u64);
        let offered = o.finish(c);
        c.offer_latency.record(started.elapsed());
        (offered, tracker.map(OfferCompletion))
    }

    /// Reads blocks as [`Store::get_many`] does, serving those still queued from the queue
    /// (a hit, counted in [`OffloadStats::served_from_queue`]) and the rest from the store.
    pub fn get_many<B: AsMut<[u8]>>(
        &self,
        keys: &[BlockKey],
        bufs: &mut [B],
    ) -> Vec<Result<Lookup>> {
        assert_eq!(keys.len(), bufs.len(), "one buffer per key");
        let queued: Vec<Option<Payload>> = {
            let st = self.shared.lock();
            keys.iter()
                .map(|k| {
                    (k.worker == *self.shared.store.worker())
                        .then(|| st.pending.get(&k.hash).cloned())
                        .flatten()
                })
                .collect()
        };
        let mut results: Vec<Option<Result<Lookup>>> = (0..keys.len()).map(|_| None).collect();
        let mut rest_keys = Vec::new();
        let mut rest_bufs: Vec<&mut [u8]> = Vec::new();
        let mut rest_at = Vec::new();
        for (i, (buf, q)) in bufs.iter_mut().zip(&queued).enumerate() {
            let buf = buf.as_mut();
            match q {
                Some(p) if p.len() > buf.len() => {
                    results[i] = Some(Err(Error::BufferTooSmall {
                        key: keys[i].to_string(),
                        need: p.len(),
                        have: buf.len(),
                    }));
                }
                Some(p) => {
                    p.copy_to(buf);
                    add(&self.shared.counters.served_from_queue, 1);
                    results[i] = Some(Ok(Lookup::Hit(p.len())));
                }
                None => {
                    rest_keys.push(keys[i].clone());
                    rest_bufs.push(buf);
                    rest_at.push(i);
                }
            }
        }
        if !rest_keys.is_empty() {
            let got = self.shared.store.get_many(&rest_keys, &mut rest_bufs);
            for (i, r) in rest_at.into_iter().zip(got) {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every key has a result"))
            .collect()
    }

    /// True while `key` is queued or being written.
    pub fn is_queued(&self, key: &BlockKey) -> bool {
        key.worker == *self.shared.store.worker()
            && self.shared.lock().pending.contains_key(&key.hash)
    }

    /// How many leading keys of a chain are stored or queued ([`Store::contains_prefix`],
    /// counting the queue).
    pub fn contains_prefix(&self, keys: &[BlockKey]) -> Result<usize> {
        for (i, k) in keys.iter().enumerate() {
            if self.is_queued(k) {
                continue;
            }
            let stored = self.shared.store.contains_many(std::slice::from_ref(k));
            match stored.into_iter().next() {
                Some(Ok(true)) => {}
                Some(Err(e)) => return Err(e),
                _ => return Ok(i),
            }
        }
        Ok(keys.len())
    }

    /// Waits until every block offered before this call is written, dropped or failed.
    pub fn flush(&self) {
        let sh = &*self.shared;
        let mut st = sh.lock();
        let target = st.enqueued;
        while st.finished < target {
            st = sh.progress.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A snapshot of the counters (also in [`Store::stats`]).
    pub fn stats(&self) -> OffloadStats {
        self.shared.counters.snapshot()
    }

    /// Closes: writes or drops what is queued (as `how` says), stops the writer thread, and
    /// returns the final counters. Offers made after (from clones of nothing: the offloader
    /// is gone) cannot happen; dropping the offloader closes it as
    /// [`OffloadConfig::on_close`] says.
    pub fn close(mut self, how: OnClose) -> OffloadStats {
        self.close_inner(how);
        self.stats()
    }

    fn close_inner(&mut self, how: OnClose) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        if !writer.ours() {
            // A process forked since the writer started: it does not run here, and what it
            // queued is the parent's to write.
            writer.join();
            return;
        }
        let sh = &*self.shared;
        let mut dropped: Vec<Entry> = Vec::new();
        {
            let mut st = sh.lock();
            st.closing = true;
            if how == OnClose::Drop {
                while let Some(b) = st.queue.pop_front() {
                    for e in &b.entries {
                        count_drop(&sh.counters, DropReason::Closed);
                        release(sh, &mut st, e);
                    }
                    st.finished += 1;
                    dropped.extend(b.entries);
                }
            }
            sh.work.notify_all();
            sh.progress.notify_all();
        }
        for e in dropped {
            if let Some((t, i)) = e.track {
                t.set(i, OfferOutcome::Dropped(DropReason::Closed));
            }
        }
        if !writer.join() {
            tracing::error!("the offload thread panicked");
        }
        let s = self.stats();
        tracing::debug!(
            written = s.written,
            dropped_closed = s.dropped_closed,
            "offloader closed"
        );
    }
}

impl Drop for Offloader {
    /// Closes as [`OffloadConfig::on_close`] says.
    fn drop(&mut self) {
        let how = self.shared.cfg.on_close;
        self.close_inner(how);
    }
}

/// One offer in progress, under the state lock: what it settled at once, and the run of
/// blocks it gathers into a batch.
struct Offering<'a> {
    sh: &'a OffloadState,
    worker: WorkerId,
    tracker: Option<&'a Arc<Tracker>>,
    /// Blocks settled at once (deduplicated or dropped): index and reason.
    now: Vec<(usize, DropReason)>,
    offered: Offered,
    /// Why the next block cannot be queued whatever it is (its chain is broken).
    broken: Option<DropReason>,
    /// The previous block of the chain.
    prev: Option<BlockHash>,
    /// Blocks gathered for the next batch, and the parent of its first.
    run: Vec<Entry>,
    run_parent: Option<BlockHash>,
}

impl<'a> Offering<'a> {
    /// An offer of blocks after `parent` to `sh`, tracked by `tracker` if any.
    fn new(
        sh: &'a OffloadState,
        tracker: Option<&'a Arc<Tracker>>,
        parent: Option<&BlockKey>,
    ) -> Self {
        let prev = parent.map(|p| p.hash);
        Offering {
            sh,
            worker: sh.store.worker().clone(),
            tracker,
            now: Vec::new(),
            offered: Offered::default(),
            broken: None,
            prev,
            run: Vec::new(),
            run_parent: prev,
        }
    }

    /// Why no block of the offer can be queued, whatever it is: closing, or a `parent` of
    /// another worker's or neither queued nor stored.
    fn broken_at_start(&self, st: &State, parent: Option<&BlockKey>) -> Option<DropReason> {
        match parent {
            _ if st.closing => Some(DropReason::Closed),
            Some(p) if p.worker != self.worker => Some(DropReason::InvalidKey),
            Some(p) if !st.pending.contains_key(&p.hash) && !self.sh.store.holds(&p.hash) => {
                Some(DropReason::NoParent)
            }
            _ => None,
        }
    }

    /// Settles block `i` at once if it is another worker's, already stored or queued, its
    /// chain is broken or the filter refuses it; `None` then. Else `Some` of its chain's
    /// previous block: it is to be queued.
    fn screen(
        &mut self,
        st: &mut State,
        i: usize,
        key: &BlockKey,
        data: &Payload,
    ) -> Option<Option<BlockHash>> {
        let sh = self.sh;
        if key.worker != self.worker {
            self.now.push((i, DropReason::InvalidKey));
            self.broken = self.broken.or(Some(DropReason::NoParent));
            self.prev = Some(key.hash);
            return None;
        }
        let h = key.hash;
        if let Some(r) = dedupe(sh, st, &h) {
            self.now.push((i, r));
            push_run(sh, st, &mut self.run, self.run_parent);
            if self.broken != Some(DropReason::Closed) {
                self.broken = None;
            }
            self.prev = Some(h);
            return None;
        }
        let admitted = st.filter.admit(&Candidate {
            hash: &h,
            parent: self.prev.as_ref(),
            position: i,
            bytes: data.len(),
        });
        let chain_prev = self.prev.replace(h);
        if let Some(r) = self.broken {
            let r = if admitted || r == DropReason::Closed {
                r
            } else {
                DropReason::Filtered
            };
            self.now.push((i, r));
            return None;
        }
        if !admitted {
            self.now.push((i, DropReason::Filtered));
            self.broken = Some(DropReason::NoParent);
            return None;
        }
        Some(chain_prev)
    }

    /// Waits, as configured, for room in the queue for a block `h` of `len` bytes; returns the
    /// lock and the reason there is none, if none.
    fn wait_for_room<'g>(
        &mut self,
        mut st: MutexGuard<'g, State>,
        h: &BlockHash,
        len: u64,
    ) -> (MutexGuard<'g, State>, Option<DropReason>) {
        let sh = self.sh;
        let refused = loop {
            if st.closing {
                break Some(DropReason::Closed);
            }
            let fits = st.blocks < sh.cfg.max_blocks && st.bytes + len <= sh.cfg.max_bytes;
            if fits {
                break None;
            }
            // Full; and if nothing is in flight, this block never fits.
            if sh.cfg.when_full == WhenFull::DropNewest || st.blocks == 0 {
                break Some(DropReason::Full);
            }
            // Blocking: what this offer queued so far goes first, then wait for room;
            // meanwhile another offer may have queued this block, or it was written.
            push_run(sh, &mut st, &mut self.run, self.run_parent);
            st = sh.progress.wait(st).unwrap_or_else(|e| e.into_inner());
            if let Some(r) = dedupe(sh, &st, h) {
                break Some(r);
            }
        };
        (st, refused)
    }

    /// Settles block `i` as `refused` says, if it was; a loss breaks the chain. True when it
    /// was refused.
    fn refuse(&mut self, i: usize, refused: Option<DropReason>) -> bool {
        let Some(r) = refused else {
            return false;
        };
        self.now.push((i, r));
        if r.is_loss() {
            self.broken = Some(r);
        }
        true
    }

    /// Queues block `i` (after `chain_prev` in its chain) in the run, and the run as a batch
    /// once it is full.
    fn enqueue(
        &mut self,
        st: &mut State,
        i: usize,
        key: BlockKey,
        data: Payload,
        chain_prev: Option<BlockHash>,
    ) {
        let (sh, c) = (self.sh, &*self.sh.counters);
        let len = data.len() as u64;
        if self.run.is_empty() {
            self.run_parent = chain_prev;
        }
        st.pending.insert(key.hash, data.clone());
        st.blocks += 1;
        st.bytes += len;
        add(&c.in_flight_blocks, 1);
        add(&c.in_flight_bytes, len);
        add(&c.queued, 1);
        add(&c.queued_bytes, len);
        self.offered.queued += 1;
        self.run.push(Entry {
            key,
            data,
            track: self.tracker.map(|t| (t.clone(), i)),
        });
        if self.run.len() >= sh.cfg.max_batch_blocks {
            push_run(sh, st, &mut self.run, self.run_parent);
        }
    }

    /// Counts the blocks settled at once and tells their outcomes; what the offer did.
    fn finish(mut self, c: &OffloadCounters) -> Offered {
        for &(i, r) in &self.now {
            count_drop(c, r);
            if r.is_loss() {
                self.offered.dropped += 1;
            } else {
                self.offered.deduped += 1;
            }
            if let Some(t) = self.tracker {
                t.set(i, OfferOutcome::Dropped(r));
            }
        }
        self.offered
    }
}

/// Why `h` is not queued again: stored already, or queued already.
fn dedupe(sh: &OffloadState, st: &State, h: &BlockHash) -> Option<DropReason> {
    if st.pending.contains_key(h) {
        Some(DropReason::AlreadyQueued)
    } else if sh.store.holds(h) {
        Some(DropReason::AlreadyStored)
    } else {
        None
    }
}

/// Queues the blocks gathered so far as one batch.
fn push_run(sh: &OffloadState, st: &mut State, run: &mut Vec<Entry>, parent: Option<BlockHash>) {
    if run.is_empty() {
        return;
    }
    st.queue.push_back(Batch {
        parent,
        entries: std::mem::take(run),
        queued_at: Instant::now(),
    });
    st.enqueued += 1;
    sh.work.notify_one();
}

/// Forgets a block that left the queue (written, failed or dropped): its room is free.
fn release(sh: &OffloadState, st: &mut State, e: &Entry) {
    st.pending.remove(&e.key.hash);
    let len = e.data.len() as u64;
    st.blocks -= 1;
    st.bytes -= len;
    sub(&sh.counters.in_flight_blocks, 1);
    sub(&sh.counters.in_flight_bytes, len);
}

fn count_drop(c: &OffloadCounters, r: DropReason) {
    let counter = match r {
        DropReason::AlreadyStored => &c.deduped_present,
        DropReason::AlreadyQueued => &c.deduped_queued,
        DropReason::Full => &c.dropped_full,
        DropReason::Filtered => &c.dropped_filtered,
        DropReason::NoParent => &c.dropped_no_parent,
        DropReason::NotAdmitted => &c.not_admitted,
        DropReason::Closed => &c.dropped_closed,
        DropReason::InvalidKey => &c.dropped_invalid,
    };
    add(counter, 1);
}

/// The writer thread: one batch at a time, in the order queued, so a chain's parent batch
/// is always written before its children.
fn writer_loop(sh: &OffloadState) {
    loop {
        let batch = {
            let mut st = sh.lock();
            loop {
                if let Some(b) = st.queue.pop_front() {
                    break b;
                }
                if st.closing {
                    return;
                }
                st = sh.work.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let waited = batch.queued_at.elapsed();
        for _ in &batch.entries {
            sh.counters.queue_wait.record(waited);
        }
        let parent = batch.parent.map(|h| sh.store.key(h));
        let parts: Vec<Vec<&[u8]>> = batch.entries.iter().map(|e| e.data.parts()).collect();
        let items: Vec<(BlockKey, &[&[u8]])> = batch
            .entries
            .iter()
            .zip(&parts)
            .map(|(e, p)| (e.key.clone(), p.as_slice()))
            .collect();
        let results = sh.store.offer_vectored_outcomes(parent.as_ref(), &items);
        drop(items);
        add(&sh.counters.batches, 1);
        let outcomes: Vec<OfferOutcome> = batch
            .entries
            .iter()
            .zip(results)
            .map(|(e, r)| match r {
                Ok(Stored::Written | Stored::Present) => OfferOutcome::Written,
                Ok(Stored::Declined) => OfferOutcome::Dropped(DropReason::NotAdmitted),
                Err(err) => {
                    tracing::warn!(key = %e.key, error = %err, "offloaded write failed");
                    OfferOutcome::Failed(err)
                }
            })
            .collect();
        // Counted before the batch finishes, so that after `flush` the counters add up.
        let c = &*sh.counters;
        for (e, o) in batch.entries.iter().zip(&outcomes) {
            match o {
                OfferOutcome::Written => {
                    add(&c.written, 1);
                    add(&c.written_bytes, e.data.len() as u64);
                }
                OfferOutcome::Dropped(r) => count_drop(c, *r),
                OfferOutcome::Failed(_) => add(&c.failed, 1),
            }
        }
        {
            let mut st = sh.lock();
            for e in &batch.entries {
                release(sh, &mut st, e);
            }
        }
        // The payloads go before the batch counts as finished, outside the lock: a guard's
        // drop (the engine's notice that its buffer may be reused) is over when `flush`
        // returns.
        let tracks: Vec<_> = batch.entries.into_iter().map(|e| e.track).collect();
        {
            let mut st = sh.lock();
            st.finished += 1;
            sh.progress.notify_all();
        }
        for (track, o) in tracks.into_iter().zip(outcomes) {
            if let Some((t, i)) = track {
                t.set(i, o);
            }
        }
    }
}
