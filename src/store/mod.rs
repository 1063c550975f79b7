//! The store: one worker's blocks under a root directory.
//!
//! This file is the API and the state every path shares. `open.rs` is the lifecycle (open,
//! background threads, close); `read.rs` the get path; `put.rs` a put call and its retry,
//! `write.rs` the batch it runs (validation, admission, writes, publication), `reuse.rs` the
//! reuse of evicted files; `evict.rs` capacity enforcement; `shared.rs` shared mode's ledger;
//! `fdcache.rs` the open-file cache; `sweep.rs` the scan that rebuilds the index on open.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::engine::IoEngine;
use crate::error::{Error, Result};
use crate::format::PAYLOAD_OFFSET;
use crate::index::Index;
use crate::index::policy::Policy;
use crate::key::{BlockHash, BlockKey, WorkerId};
use crate::layout::{self, Layout};
use crate::ns::{
    BlockDir, EventCause, EventKind, FileKind, JournalGuard, NsFaults, Opened, Unlinked,
};

mod async_api;
mod config;
mod device;
mod evict;
mod fdcache;
mod open;
mod periodic;
mod put;
mod read;
mod reuse;
mod scatter;
mod shared;
mod split;
mod statsfile;
pub mod sweep;
mod tail;
mod write;

pub use crate::stats::{ErrorCounts, LatencySummary, StoreStats};
pub use config::{
    DEFAULT_DIRECT_PUTS_FROM, DEFAULT_MAX_BLOCK_SIZE, DEFAULT_READ_THREADS, DEFAULT_TEMP_LEASE,
    MIN_STATS_INTERVAL, PARALLEL_READ_MIN, Publish, Sharing, StoreConfig, VerifyMode,
};
pub use statsfile::LiveStats;
pub use tail::{EventTail, TAIL_MAX_HELD};

use crate::stats::Counters;
use fdcache::FdCache;
use open::{Background, OpenGuard};

/// Attempts to open a file when the open-file limit is hit, shrinking the cache in between.
const EMFILE_RETRIES: usize = 16;
/// Stripes of the per-key lock that orders publication against eviction and removal.
const STRIPES: usize = 64;

/// What a put did with one block that did not fail: the store tells a block it wrote from
/// one it declined (the public calls flatten both to `Ok(())`), so that the offloader needs
/// no second lookup, which a concurrent eviction could answer differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Written and published by this put.
    Written,
    /// Present already: touched (an offer), or published first by another store of the tree.
    Present,
    /// Not stored: declined by the policy's admission, or no room under the capacity, or its
    /// chain's parent is not stored (counted in `StoreStats::not_admitted`).
    Declined,
}

impl Stored {
    /// What an offer the index did not reserve room for stored: a touched block is present,
    /// anything else declined.
    pub(crate) fn of_offer(offer: crate::index::Offer) -> Self {
        match offer {
            crate::index::Offer::Touched => Stored::Present,
            _ => Stored::Declined,
        }
    }
}

/// The public form of put results: `Ok(())` whether stored or declined.
fn flatten(results: Vec<Result<Stored>>) -> Vec<Result<()>> {
    results.into_iter().map(|r| r.map(|_| ())).collect()
}

/// The outcome of reading one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The block was found, verified as configured, and copied to the front of the buffer.
    Hit(usize),
    /// No valid block under this key (absent, evicted, deleted, or corrupt and removed).
    Miss,
}

impl Lookup {
    /// True for a hit.
    pub fn is_hit(&self) -> bool {
        matches!(self, Lookup::Hit(_))
    }

    /// The block length for a hit.
    pub fn hit_len(&self) -> Option<usize> {
        match self {
            Lookup::Hit(n) => Some(*n),
            Lookup::Miss => None,
        }
    }
}

/// Components of a store that a caller may build itself instead of naming them in
/// [`StoreConfig`].
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Components {
    /// The I/O engine (default: `config.engine`).
    pub engine: Option<Arc<dyn IoEngine>>,
    /// The eviction policy (default: `config.policy`), e.g. the replay-only Belady policy.
    pub policy: Option<Box<dyn Policy>>,
    /// Faults injected into the namespace layer (tests).
    pub ns_faults: Option<Arc<NsFaults>>,
}

impl Components {
    /// No custom parts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses `engine`.
    pub fn with_engine(mut self, engine: Arc<dyn IoEngine>) -> Self {
        self.engine = Some(engine);
        self
    }

    /// Uses `policy`.
    pub fn with_policy(mut self, policy: Box<dyn Policy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Makes the namespace layer's operations fail as `faults` says.
    pub fn with_ns_faults(mut self, faults: Arc<NsFaults>) -> Self {
        self.ns_faults = Some(faults);
        self
    }
}

/// One worker's block store under a root directory. Cheap to clone (clones share the store);
/// safe to use from many threads at once.
///
/// Opening takes an exclusive lock on the worker's directory, so two stores (in one process or
/// several) never own the same worker; stores of different workers share a root freely.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Inner>,
    /// Dropped with the last handle: closes the store (stops its threads, publishes the final
    /// counters, releases the worker lock) even while a background thread briefly holds
    /// `inner`, so the worker can be reopened at once.
    _open: Arc<OpenGuard>,
}

#[derive(Debug)]
struct Inner {
    worker: WorkerId,
    layout: Layout,
    /// Every file operation goes through it.
    ns: BlockDir,
    /// Every data transfer goes through it.
    engine: Arc<dyn IoEngine>,
    /// Shared mode's ledger (`None`: exclusive, or read-only).
    shared: Option<shared::SharedTier>,
    /// The worker's event journal, if it had one at open (read-only: read, never written).
    journal: Option<crate::ns::Journal>,
    /// The journal made after this store opened, found by a reader ([`Inner::reader_journal`]).
    late_journal: std::sync::OnceLock<crate::ns::Journal>,
    /// A store of a shared tree (writable or read-only): its remembered "absent" answers. Its
    /// presence means that a key the index does not hold is asked of the tree (`None`: the
    /// index is all there is, as in an exclusive store).
    tree: Option<shared::Negative>,
    /// Open descriptors of block files.
    fds: FdCache,
    /// What is stored, capacity, chains, the policy.
    index: Index,
    /// Orders a key's publication against its eviction and removal.
    stripes: Box<[Mutex<()>]>,
    /// Aligned bounce buffers for O_DIRECT, reused.
    bufs: std::sync::Arc<crate::buf::BufPool>,
    opts: IoOptions,
    publish: Publisher,
    threads: Background,
    counters: Counters,
    /// This machine's boot id, written into every block header and compared with the one
    /// read from each file ([`VerifyMode::AfterReboot`]).
    boot: Option<[u8; 16]>,
    /// The counters of the offloader in front of this store (the latest one attached), part
    /// of its stats.
    offload: Mutex<Option<Arc<crate::stats::OffloadCounters>>>,
    /// The worker lock's file was removed and another store locked the one made since
    /// ([`crate::ns::LockKept::Lost`]): puts fail from then on.
    lock_lost: AtomicBool,
    /// The process that opened the store: in one forked from it since, closing leaves the
    /// tree, the worker lock, the ledger and the stats file to the opener.
    pid: u32,
}

/// How the store reads and writes, fixed when it opens.
#[derive(Clone, Copy, Debug)]
struct IoOptions {
    verify: VerifyMode,
    direct: bool,
    /// Puts of at least this many host bytes write with `O_DIRECT`.
    direct_puts_from: Option<usize>,
    sync_writes: bool,
    max_block: usize,
    /// Threads a large get's reads are split between ([`StoreConfig::read_threads`]).
    read_threads: usize,
    /// Read-only: no worker lock is held, nothing is written.
    read_only: bool,
    /// Exclusive or shared.
    sharing: Sharing,
}

impl IoOptions {
    /// The options `config` sets.
    fn of(config: &StoreConfig) -> Self {
        IoOptions {
            verify: config.verify,
            direct: config.direct_io,
            direct_puts_from: config.direct_puts_from,
            sync_writes: config.sync_writes,
            max_block: config.max_block_size(),
            read_threads: config.read_threads.max(1),
            read_only: config.read_only,
            sharing: config.sharing,
        }
    }
}

/// How puts publish: what the filesystem turned out to support.
#[derive(Debug)]
struct Publisher {
    /// Temp files and their publication, as the filesystem supports them.
    files: crate::ns::Publisher,
    /// Evicted files are reused (configured, exclusive, and the filesystem grants leases).
    reuse: AtomicBool,
    /// Puts of [`StoreConfig::direct_puts_from`] bytes or more write with `O_DIRECT`: true
    /// until the filesystem refuses it.
    direct_puts: AtomicBool,
}

impl Publisher {
    /// How a store of `config` publishes at first (`reuse`: evicted files are reused).
    fn new(config: &StoreConfig, reuse: bool) -> Self {
        Publisher {
            files: crate::ns::Publisher::new(config.publish == Publish::Tmpfile),
            reuse: AtomicBool::new(reuse),
            direct_puts: AtomicBool::new(true),
        }
    }
}

use crate::ns::io_err;

impl Store {
    /// The worker this store serves.
    pub fn worker(&self) -> &WorkerId {
        &self.inner.worker
    }

    /// The worker's directory (`<root>/v1/<worker>`).
    pub fn dir(&self) -> &Path {
        self.inner.ns.path()
    }

    /// True if the store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.opts.read_only
    }

    /// The layout in use.
    pub fn layout(&self) -> Layout {
        self.inner.layout
    }

    /// The I/O engine's name.
    pub fn engine_name(&self) -> &'static str {
        self.inner.engine.name()
    }

    /// The eviction policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.inner.index.policy_name()
    }

    /// The key of `hash` for this store's worker.
    pub fn key(&self, hash: BlockHash) -> BlockKey {
        BlockKey::new(self.inner.worker.clone(), hash)
    }

    /// The path a block is (or would be) stored at.
    pub fn path_of(&self, hash: &BlockHash) -> PathBuf {
        self.inner
            .ns
            .full(self.inner.layout.rel_path(hash).as_str())
    }

    /// The worker's events from `from` on (at most `max`), in order, from its event journal
    /// ([`StoreConfig::events`], docs/events.md): every block stored and removed by any store
    /// of the worker, in this process or another, on this node or another. Empty (its
    /// `journal_id` 0) while the worker has no journal (one made after this store opened is
    /// read, though this store writes only to one it found at open).
    pub fn events_since(&self, from: u64, max: usize) -> Result<crate::ns::EventsRead> {
        match self.inner.reader_journal() {
            Some(j) => j.read_since(from, max),
            None => Ok(crate::ns::EventsRead::default()),
        }
    }

    /// Where the worker's event journal ends now (its `next` and `journal_id`, no events), to
    /// tail it from here: see [`Store::events_since`].
    pub fn events_end(&self) -> Result<crate::ns::EventsRead> {
        match self.inner.reader_journal() {
            Some(j) => j.end(),
            None => Ok(crate::ns::EventsRead::default()),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StoreStats {
        self.inner.snapshot()
    }

    /// True if the index holds `hash` (published; no system call): how an
    /// [`Offloader`](crate::offload::Offloader) deduplicates and tells a written block from a
    /// declined one.
    pub(crate) fn holds(&self, hash: &BlockHash) -> bool {
        self.inner.index.contains(hash)
    }

    /// Makes `counters` part of this store's stats (and `STATS.json`).
    pub(crate) fn attach_offload(&self, counters: Arc<crate::stats::OffloadCounters>) {
        *self.inner.offload.lock().unwrap_or_else(|e| e.into_inner()) = Some(counters);
    }

    /// Stores one block. See [`Store::put_many`].
    pub fn put(&self, key: &BlockKey, data: &[u8]) -> Result<()> {
        self.put_many(&[(key.clone(), data)])
            .pop()
            .expect("one result per item")
    }

    /// Reads one block into `buf`. See [`Store::get_many`].
    pub fn get(&self, key: &BlockKey, buf: &mut [u8]) -> Result<Lookup> {
        self.get_many(std::slice::from_ref(key), &mut [buf])
            .pop()
            .expect("one result per key")
    }

    /// Stores a batch of blocks (a request's chain, root first); one result per item, in order.
    ///
    /// Each block is written to a temp file in its final directory and published atomically
    /// (`rename`, or `linkat` of an `O_TMPFILE` inode), so readers see the old block or the new
    /// one, never a mix, and a failure at any point removes the temp file: no partial block is
    /// ever visible. An invalid key or a block over the maximum size is rejected before
    /// anything is written. An existing key is replaced.
    ///
    /// The batch is one chain: each item's chain parent is the item before it (the first
    /// item is a root; see [`Store::offer_many_after`] for a chain's continuation). The
    /// present set stays prefix-closed: a block is stored only while its parent is, so
    /// eviction cuts chains from the tail and removing a block removes its descendants.
    ///
    /// With a capacity, room for each block is reserved (by evicting chain tails) before it
    /// is written, so block files plus temp files never exceed the bound; what does not fit
    /// (from the first such block to the end of the chain) is not stored: its result is
    /// `Ok` and it is counted in `StoreStats::not_admitted`, as is a block a policy with
    /// admission control declines. ENOSPC below the capacity evicts and retries once.
    #[must_use = "each item has its own result: a put can fail"]
    pub fn put_many<D: AsRef<[u8]>>(&self, items: &[(BlockKey, D)]) -> Vec<Result<()>> {
        flatten(self.inner.put_with_retry(items, true, None))
    }

    /// As [`Store::put_many`], for blocks whose payload is held in several host buffers (an
    /// MHA page's K and V regions, which are not contiguous): each block's parts are written
    /// in their order as one payload, from the caller's buffers, without copying them
    /// together (with `O_DIRECT`, only when every part's address and length are page-aligned;
    /// else through one aligned bounce buffer). [`Store::get_many_vectored`] reads it back
    /// into parts; [`Store::get_many`] into one buffer.
    #[must_use = "each item has its own result: a put can fail"]
    pub fn put_many_vectored(&self, items: &[(BlockKey, &[&[u8]])]) -> Vec<Result<()>> {
        let gathered: Vec<(BlockKey, write::Gather<'_>)> = items
            .iter()
            .map(|(k, parts)| (k.clone(), write::Gather(parts)))
            .collect();
        flatten(self.inner.put_with_retry(&gathered, true, None))
    }

    /// As [`Store::offer_many_after`], for blocks held in several host buffers (as
    /// [`Store::put_many_vectored`]): the call an engine with MHA pages (K and V regions)
    /// makes after computing a request's blocks. Present blocks are only marked as used;
    /// `parent` is the last block of the cached prefix, and if it is no longer stored,
    /// nothing is (every result `Ok`, counted as not admitted).
    #[must_use = "each item has its own result: a put can fail"]
    pub fn offer_many_vectored_after(
        &self,
        parent: Option<&BlockKey>,
        items: &[(BlockKey, &[&[u8]])],
    ) -> Vec<Result<()>> {
        flatten(self.offer_vectored_outcomes(parent, items))
    }

    /// As [`Store::offer_many_vectored_after`], telling what became of each block that did
    /// not fail: how the [`Offloader`](crate::offload::Offloader) tells a written block from
    /// a declined one.
    pub(crate) fn offer_vectored_outcomes(
        &self,
        parent: Option<&BlockKey>,
        items: &[(BlockKey, &[&[u8]])],
    ) -> Vec<Result<Stored>> {
        if let Some(refused) = self.refuse_bad_parent(parent, items.len()) {
            return refused;
        }
        let gathered: Vec<(BlockKey, write::Gather<'_>)> = items
            .iter()
            .map(|(k, parts)| (k.clone(), write::Gather(parts)))
            .collect();
        self.inner
            .put_with_retry(&gathered, false, parent.map(|p| p.hash))
    }

    /// An offer under a `parent` whose key is invalid: the same error for each of its `n`
    /// items; `None` when the parent is fine (or absent).
    fn refuse_bad_parent<T>(&self, parent: Option<&BlockKey>, n: usize) -> Option<Vec<Result<T>>> {
        let msg = self.inner.check_key(parent?).err()?.to_string();
        Some(
            (0..n)
                .map(|_| Err(Error::invalid_key(msg.clone())))
                .collect(),
        )
    }

    /// Offers a request's blocks (root first), the call an engine makes once it has computed
    /// them: absent blocks are stored as by [`Store::put_many`] (subject to admission),
    /// present ones are only marked as used, in one batch so that the policy sees the chain
    /// in order. Block hashes name their content, so a present block is never rewritten.
    #[must_use = "each item has its own result: a put can fail"]
    pub fn offer_many<D: AsRef<[u8]>>(&self, items: &[(BlockKey, D)]) -> Vec<Result<()>> {
        flatten(self.inner.put_with_retry(items, false, None))
    }

    /// As [`Store::offer_many`], for the blocks after a request's cached prefix: `parent` is
    /// the last block of that prefix (the chain parent of `items[0]`). If `parent` is no
    /// longer stored, nothing is (the blocks could never be reached): every result is `Ok`
    /// and counted as not admitted.
    #[must_use = "each item has its own result: a put can fail"]
    pub fn offer_many_after<D: AsRef<[u8]>>(
        &self,
        parent: Option<&BlockKey>,
        items: &[(BlockKey, D)],
    ) -> Vec<Result<()>> {
        if let Some(refused) = self.refuse_bad_parent(parent, items.len()) {
            return refused;
        }
        flatten(
            self.inner
                .put_with_retry(items, false, parent.map(|p| p.hash)),
        )
    }

    /// Reads a batch of blocks (a request's chain, root first), each into the front of its
    /// buffer; one result per key, in order: `Hit(len)`, `Miss`, or an error (invalid key,
    /// buffer too small, I/O error). Bytes of a buffer past its block are unspecified (with
    /// `O_DIRECT` and a page-aligned buffer the read goes straight into it, in whole 4 KiB
    /// blocks).
    ///
    /// A key the index does not hold is a miss without a system call. A missing file is a
    /// miss, never an error, even if it was deleted behind the store's back after being read
    /// before. A corrupt file (bad header, wrong length, checksum mismatch when verified) is a
    /// miss too; it is removed, counted and logged. Blocks being read are pinned: eviction
    /// skips them until the batch ends.
    pub fn get_many<B: AsMut<[u8]>>(
        &self,
        keys: &[BlockKey],
        bufs: &mut [B],
    ) -> Vec<Result<Lookup>> {
        let started = std::time::Instant::now();
        let results = self.inner.get_batch(keys, bufs);
        self.inner.record_get(started, &results);
        results
    }

    /// As [`Store::get_many`], into several host buffers a block (an MHA page's K and V
    /// regions): the payload fills each block's parts in their order, and `Hit(len)` gives
    /// its length; the parts together must hold it (else [`Error::BufferTooSmall`]). With
    /// `O_DIRECT` the read goes straight into the parts when each starts page-aligned and
    /// every part but the last is a whole number of pages; else through a bounce buffer.
    pub fn get_many_vectored(
        &self,
        keys: &[BlockKey],
        bufs: &mut [&mut [&mut [u8]]],
    ) -> Vec<Result<Lookup>> {
        let started = std::time::Instant::now();
        let results = self.inner.get_batch_vectored(keys, bufs);
        self.inner.record_get(started, &results);
        results
    }

    /// Marks blocks as used (in chain order) without reading them, e.g. when an engine reuses
    /// a prefix it still holds in a faster tier. Keys that are not stored are ignored.
    pub fn touch_many(&self, keys: &[BlockKey]) -> Result<()> {
        let mut hashes = Vec::with_capacity(keys.len());
        for k in keys {
            self.inner.check_key(k)?;
            hashes.push(k.hash);
        }
        self.inner.index.record_hits(&hashes);
        Ok(())
    }

    /// Whether each key has a block file. Cheap: the index, then a cached descriptor or one
    /// `stat`; the contents are checked only when read, so a later `get` of a corrupt file may
    /// still miss.
    pub fn contains_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.inner.contains(k)).collect()
    }

    /// How many leading keys of a block chain are present: the question an engine asks for a
    /// request's prefix. Stops at the first absent key.
    pub fn contains_prefix(&self, keys: &[BlockKey]) -> Result<usize> {
        leading(keys, |k| self.inner.contains(k))
    }

    /// How many leading keys of a block chain are stored, answered from what this store
    /// remembers: a key its index holds is present without a system call (a block deleted
    /// behind its back is found missing when read, and [`Store::recheck_many`] forgets it); a
    /// key it lacks is looked up in the tree of a shared store (one `stat`, then remembered:
    /// present in the index, or absent for the negative time to live). The question an
    /// engine's scheduler asks for every waiting request at every step. Stops at the first
    /// absent key.
    pub fn lookup_prefix(&self, keys: &[BlockKey]) -> Result<usize> {
        leading(keys, |k| self.inner.lookup(k))
    }

    /// Whether each key is stored, answered as [`Store::lookup_prefix`] answers (from memory;
    /// in shared mode a key the index lacks is asked of the tree once per negative time to
    /// live), for keys that are not one chain.
    pub fn lookup_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.inner.lookup(k)).collect()
    }

    /// Whether this store's index holds each key: no system call, ever (what it stored, or
    /// found in the tree; a key of another worker is not held). For a caller that must not
    /// touch the filesystem on its thread and asks elsewhere about the rest.
    pub fn known_many(&self, keys: &[BlockKey]) -> Vec<bool> {
        keys.iter().map(|k| self.indexed(k)).collect()
    }

    /// Makes this store look again at `keys` in the tree at their next lookup, forgetting
    /// what it remembers of them: a key its index holds is checked now (one `stat`: forgotten
    /// if its file is gone, as after a load that found it missing or corrupt); a key it
    /// remembers as absent is forgotten as such (another store just saved it).
    pub fn recheck_many(&self, keys: &[BlockKey]) -> Result<()> {
        for k in keys {
            self.inner.check_key(k)?;
            if self.inner.index.contains(&k.hash) {
                self.inner
                    .forget_if_missing(&k.hash, &self.inner.layout.rel_path(&k.hash));
            } else if let Some(neg) = &self.inner.tree {
                neg.present(&k.hash);
            }
        }
        Ok(())
    }

    /// Whether the index holds `key` (no system call): what this store knows it has stored.
    pub(crate) fn indexed(&self, key: &BlockKey) -> bool {
        key.worker == self.inner.worker && self.inner.index.contains(&key.hash)
    }

    /// Removes blocks; one result per key: `true` if a block was removed, `false` if absent.
    pub fn remove_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.inner.remove(k, true)).collect()
    }

    /// Removes exactly these blocks; one result per key: `true` if a block was removed,
    /// `false` if absent. Unlike [`Store::remove_many`], the blocks hung after them stay,
    /// detached (each a chain's root from then on), for a caller whose keys name independent
    /// objects (LMCache's `remove` and its L2 `delete` of one key).
    pub fn discard_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.inner.remove(k, false)).collect()
    }

    /// Pins blocks: while pinned (until as many [`Store::unpin_many`] calls name it), this
    /// store never evicts a block, so a lookup's answer still holds when its blocks are read
    /// (LMCache's `contains(pin=True)` then retrieve). Per key, whether it is stored and now
    /// pinned (an absent key is not pinned). An explicit removal still removes a pinned
    /// block, and in shared mode another store on the tree may still evict it (it is then a
    /// miss, never an error). Pins live as long as the store.
    pub fn pin_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter()
            .map(|k| {
                // Looked up first: in shared mode the tree's block joins the index.
                Ok(self.inner.contains(k)? && self.inner.index.pin_present(&[&k.hash])[0])
            })
            .collect()
    }

    /// Releases one pin of each key ([`Store::pin_many`]); keys not pinned are ignored.
    pub fn unpin_many(&self, keys: &[BlockKey]) -> Result<()> {
        for k in keys {
            self.inner.check_key(k)?;
        }
        self.inner.index.unpin(keys.iter().map(|k| &k.hash));
        Ok(())
    }

    /// Removes every block of this worker: those the index holds and those the tree holds
    /// (another store's, in shared mode), each as [`Store::remove_many`] removes one (through
    /// the namespace layer, counted in the shared ledger). Nothing else goes: the worker's
    /// directories, its lock and control files stay, so other stores open on the worker (other
    /// ranks and replicas) go on working, finding those blocks missing; what is put after
    /// (here or by them) is kept. Returns how many block files were removed. A store opened
    /// read-only refuses ([`Error::ReadOnly`]).
    pub fn clear(&self) -> Result<u64> {
        let inner = &self.inner;
        if inner.opts.read_only {
            return Err(Error::ReadOnly {
                path: inner.ns.path().to_path_buf(),
                op: "clear",
            });
        }
        let report = sweep::sweep_with(&inner.ns, inner.layout, sweep::TempRule::Keep, true);
        let mut hashes: std::collections::HashSet<BlockHash> = inner.index.hashes();
        hashes.extend(report.entries.iter().map(|e| e.hash));
        let mut removed = 0;
        for hash in &hashes {
            removed += u64::from(inner.unlink_block(hash)?);
        }
        for hash in &hashes {
            // Every descendant is in `hashes`: what a removal orphans was unlinked above.
            inner.unlink_victims(inner.index.remove(hash));
        }
        tracing::info!(dir = %inner.ns.path().display(), removed, "cleared");
        Ok(removed)
    }
}

/// How many leading keys `present` says yes to (it is asked up to the first no).
fn leading(keys: &[BlockKey], present: impl Fn(&BlockKey) -> Result<bool>) -> Result<usize> {
    for (i, k) in keys.iter().enumerate() {
        if !present(k)? {
            return Ok(i);
        }
    }
    Ok(keys.len())
}

impl Inner {
    /// Records a get call's latency and its errors by kind.
    fn record_get(&self, started: std::time::Instant, results: &[Result<Lookup>]) {
        self.counters.get_latency.record(started.elapsed());
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            self.counters.error(e);
        }
    }

    fn check_key(&self, key: &BlockKey) -> Result<()> {
        if key.worker != self.worker {
            return Err(Error::invalid_key(format!(
                "key {key} belongs to worker {:?}; this store serves {:?}",
                key.worker.as_str(),
                self.worker.as_str()
            )));
        }
        Ok(())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.ns.full(rel)
    }

    /// One request through the engine (every data transfer goes through it).
    fn engine_one(&self, req: crate::engine::IoRequest<'_>) -> std::io::Result<usize> {
        crate::engine::submit_checked(self.engine.as_ref(), &mut [req])
            .pop()
            .unwrap_or_else(|| Err(std::io::Error::other("engine returned no result")))
    }

    /// Runs a namespace operation that opens a descriptor; on EMFILE/ENFILE the open-file
    /// cache shrinks and the operation is retried.
    fn retry_emfile<T>(
        &self,
        mut op: impl FnMut() -> rustix::io::Result<T>,
    ) -> rustix::io::Result<T> {
        let mut tries = 0;
        loop {
            match op() {
                Err(Errno::MFILE | Errno::NFILE) if tries < EMFILE_RETRIES => {
                    tries += 1;
                    if self.fds.shrink() == 0 && tries > 2 {
                        return op();
                    }
                }
                r => return r,
            }
        }
    }

    /// Opens the block file `rel` for data (regular files only; see [`BlockDir::open_file`]),
    /// retrying on EMFILE.
    ///
    /// `ESTALE` (a distributed filesystem's name that another node replaced or removed) is
    /// retried once.
    fn open_block(&self, rel: &str, flags: OFlags) -> rustix::io::Result<Opened> {
        match self.retry_emfile(|| self.ns.open_file(rel, flags)) {
            Err(Errno::STALE) => self.retry_emfile(|| self.ns.open_file(rel, flags)),
            r => r,
        }
    }

    fn read_flags(&self) -> OFlags {
        OFlags::RDONLY | self.direct_flag()
    }

    /// A snapshot of the counters.
    fn snapshot(&self) -> StoreStats {
        let c = &self.counters;
        let g = Counters::get;
        let ix = self.index.counts();
        let limits = self.index.limits();
        StoreStats {
            hits: g(&c.hits),
            misses: g(&c.misses),
            bytes_read: g(&c.bytes_read),
            bytes_written: g(&c.bytes_written),
            puts: g(&c.puts),
            put_errors: g(&c.put_errors),
            read_errors: g(&c.read_errors),
            removes: g(&c.removes),
            corrupt: g(&c.corrupt),
            checksums_skipped: g(&c.checksums_skipped),
            checksums_streamed: g(&c.checksums_streamed),
            split_reads: g(&c.split_reads),
            foreign: g(&c.foreign),
            temp_swept: g(&c.temp_swept),
            syncs: g(&c.syncs),
            dir_syncs: g(&c.dir_syncs),
            blocks_at_open: g(&c.blocks_at_open),
            fd_cache_hits: g(&c.fd_hits),
            fd_cache_misses: g(&c.fd_misses),
            fd_cache_evictions: self.fds.counters.evictions.load(Ordering::Relaxed) as u64,
            fd_cache_shrinks: self.fds.counters.shrinks.load(Ordering::Relaxed) as u64,
            fd_cache_len: self.fds.len() as u64,
            fd_cache_capacity: self.fds.capacity() as u64,
            used_bytes: ix.bytes,
            used_files: ix.files,
            capacity_bytes: limits.max_bytes,
            capacity_files: limits.max_files,
            evictions: ix.evictions,
            evicted_bytes: ix.evicted_bytes,
            not_admitted: ix.not_admitted,
            nospace_retries: g(&c.nospace_retries),
            tree_lookups: g(&c.tree_lookups),
            tree_hits: g(&c.tree_hits),
            negative_hits: g(&c.negative_hits),
            published_by_others: g(&c.published_by_others),
            reused_files: g(&c.reused_files),
            shared_bytes: self.shared.as_ref().map(|s| s.last_usage().bytes),
            shared_files: self.shared.as_ref().map(|s| s.last_usage().files),
            errors: c.errors(),
            get_latency: c.get_latency.summary(),
            put_latency: c.put_latency.summary(),
            offload: self
                .offload
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|o| o.snapshot()),
        }
    }

    /// Forgets a block found missing, under its stripe lock and after looking again, so a
    /// put that published it meanwhile keeps its entry; told to the journal. True if
    /// forgotten.
    fn forget_if_missing(&self, hash: &BlockHash, rel: &layout::RelPath) -> bool {
        let mut journal = self.journal_lock();
        let _stripe = self.lock_stripe(self.stripe_of(hash));
        if let Err(Errno::NOENT | Errno::NOTDIR) = self.ns.stat(rel.as_str()) {
            if self.index.forget(hash) {
                if let Some(j) = &mut journal {
                    j.record(EventKind::Removed, EventCause::Missing, *hash);
                }
                return true;
            }
        }
        false
    }

    /// A block file this store removed (shared mode: the ledger counts it no more).
    fn freed(&self, bytes: u64) {
        if let Some(sh) = &self.shared {
            sh.freed(bytes, 1);
        }
    }

    /// The journal to read events from: the one found at open, else one made since (looked
    /// for at each call until found).
    fn reader_journal(&self) -> Option<&crate::ns::Journal> {
        if let Some(j) = self.journal.as_ref().or_else(|| self.late_journal.get()) {
            return Some(j);
        }
        let wait = std::time::Duration::from_secs(1);
        let j = self.ns.open_journal(false, false, true, wait).ok()??;
        let _ = self.late_journal.set(j);
        self.late_journal.get()
    }

    /// The event journal's lock, if the worker has a journal this store writes: held while
    /// the events recorded in it happen (files published or unlinked), so that they reach
    /// the journal in the order they happened on disk; appended when it drops. Taken before
    /// any stripe lock. A lock that cannot be taken (held past the ledger's wait) is logged,
    /// and that batch's events are not journaled (consumers resync; docs/events.md).
    fn journal_lock(&self) -> Option<JournalGuard<'_>> {
        if self.opts.read_only {
            return None;
        }
        match self.journal.as_ref()?.lock() {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!(error = %e, "the event journal's lock: this batch's events are not journaled");
                None
            }
        }
    }

    fn stripe_of(&self, hash: &BlockHash) -> usize {
        hash.0[30] as usize % self.stripes.len()
    }

    fn lock_stripe(&self, stripe: usize) -> MutexGuard<'_, ()> {
        self.stripes[stripe]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// As [`Store::lookup_prefix`] asks of one key.
    fn lookup(&self, key: &BlockKey) -> Result<bool> {
        self.check_key(key)?;
        if self.index.contains(&key.hash) {
            return Ok(true);
        }
        self.unindexed_in_tree(key)
    }

    /// A key the index does not hold: in the tree of a shared store, unless remembered absent
    /// (one `stat`); never, for an exclusive one (its index is the tree's).
    fn unindexed_in_tree(&self, key: &BlockKey) -> Result<bool> {
        if !self.ask_tree(&key.hash) {
            return Ok(false);
        }
        self.contains_in_tree(key)
    }

    fn contains(&self, key: &BlockKey) -> Result<bool> {
        self.check_key(key)?;
        if !self.index.contains(&key.hash) {
            return self.unindexed_in_tree(key);
        }
        if let Some(block) = self.fds.get(&key.hash) {
            if rustix::fs::fstat(&block.fd).is_ok_and(|st| st.st_nlink > 0) {
                return Ok(true);
            }
            self.fds.invalidate_if(&key.hash, &block);
        }
        let rel = self.layout.rel_path(&key.hash);
        match self.ns.stat(rel.as_str()) {
            Ok(st) => {
                Ok(FileKind::of_stat(&st) == FileKind::File && st.st_size as u64 >= PAYLOAD_OFFSET)
            }
            Err(Errno::NOENT | Errno::NOTDIR) => {
                // Deleted behind the store's back.
                self.forget_if_missing(&key.hash, &rel);
                Ok(false)
            }
            // A symlink on the way: not followed, not ours.
            Err(Errno::LOOP | Errno::XDEV) => Ok(false),
            Err(e) => Err(Error::from_io(self.path(rel.as_str()), io_err(e))),
        }
    }

    /// Shared mode: whether the tree has a block file for a key the index does not hold (one
    /// `stat`); a found block joins the index, an absent one is remembered as absent.
    fn contains_in_tree(&self, key: &BlockKey) -> Result<bool> {
        let rel = self.layout.rel_path(&key.hash);
        match self.ns.stat(rel.as_str()) {
            Ok(st)
                if FileKind::of_stat(&st) == FileKind::File
                    && st.st_size as u64 >= PAYLOAD_OFFSET =>
            {
                Counters::add(&self.counters.tree_hits, 1);
                self.index.load(key.hash, st.st_blocks as u64 * 512);
                Ok(true)
            }
            Ok(_) | Err(Errno::LOOP | Errno::XDEV) => Ok(false),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::STALE) => {
                if let Some(neg) = &self.tree {
                    neg.absent(key.hash);
                }
                Ok(false)
            }
            Err(e) => Err(Error::from_io(self.path(rel.as_str()), io_err(e))),
        }
    }

    /// Removes a block; with `descendants`, the blocks after it in its chain too (they can no
    /// longer be reached), else they stay, detached.
    fn remove(&self, key: &BlockKey, descendants: bool) -> Result<bool> {
        self.check_key(key)?;
        if self.opts.read_only {
            return Err(Error::ReadOnly {
                path: self.ns.path().to_path_buf(),
                op: "remove",
            });
        }
        let removed = self.unlink_block(&key.hash)?;
        if descendants {
            let orphans = self.index.remove(&key.hash);
            self.unlink_victims(orphans);
        } else {
            self.index.forget(&key.hash);
        }
        Ok(removed)
    }

    /// Unlinks block `hash`'s file (counted, and freed in a shared ledger); true if it was
    /// there. The index is the caller's to update.
    fn unlink_block(&self, hash: &BlockHash) -> Result<bool> {
        let rel = self.layout.rel_path(hash);
        let key = hash;
        Ok({
            let mut journal = self.journal_lock();
            let _stripe = self.lock_stripe(self.stripe_of(key));
            let r = self.ns.unlink_file_sized(rel.as_str(), None);
            self.fds.invalidate(key);
            match r {
                Ok((Unlinked::Removed, bytes)) => {
                    Counters::add(&self.counters.removes, 1);
                    self.freed(bytes);
                    if let Some(j) = &mut journal {
                        j.record(EventKind::Removed, EventCause::Removed, *hash);
                    }
                    true
                }
                Ok((Unlinked::Missing, _)) => false,
                Ok((Unlinked::Refused, _)) => {
                    tracing::warn!(path = %self.path(rel.as_str()).display(), "not a regular file of this store: left alone");
                    false
                }
                Err(e) => return Err(Error::from_io(self.path(rel.as_str()), io_err(e))),
            }
        })
    }
}
