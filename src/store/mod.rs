//! The store: one worker's blocks under a root directory.
//!
//! `read.rs` is the get path, `write.rs` the put path, `evict.rs` capacity enforcement;
//! `fdcache.rs` the open-file cache, `sweep.rs` the scan that rebuilds the index on open.

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
use crate::layout::{self, EntryName, FLOCK_FILE, LAYOUT_FILE, Layout};
use crate::ns::{BlockDir, FileKind, NsFaults, Opened, Unlinked};

mod async_api;
mod config;
mod device;
mod evict;
mod fdcache;
mod periodic;
mod read;
mod scatter;
mod shared;
mod split;
mod statsfile;
pub mod sweep;
mod write;

pub use crate::stats::{ErrorCounts, LatencySummary, StoreStats};
pub use config::{
    DEFAULT_DIRECT_PUTS_FROM, DEFAULT_MAX_BLOCK_SIZE, DEFAULT_READ_THREADS, DEFAULT_TEMP_LEASE,
    MIN_STATS_INTERVAL, PARALLEL_READ_MIN, Publish, Sharing, StoreConfig, VerifyMode,
};
pub use statsfile::LiveStats;

use crate::stats::Counters;
use evict::Evictor;
use fdcache::FdCache;
use periodic::Periodic;

pub use crate::ns::FILE_MODE;

/// Attempts to open a file when the open-file limit is hit, shrinking the cache in between.
const EMFILE_RETRIES: usize = 16;
/// Stripes of the per-key lock that orders publication against eviction and removal.
const STRIPES: usize = 64;

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
struct OpenGuard(Arc<Inner>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.close();
    }
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
    tmpfile: AtomicBool,
    link_empty_path: AtomicBool,
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
            tmpfile: AtomicBool::new(config.publish == Publish::Tmpfile),
            link_empty_path: AtomicBool::new(true),
            reuse: AtomicBool::new(reuse),
            direct_puts: AtomicBool::new(true),
        }
    }
}

/// The store's background threads.
#[derive(Debug)]
struct Background {
    evictor: Mutex<Option<Evictor>>,
    stats_writer: Mutex<Option<Periodic>>,
    /// Puts the worker lock's file back if it is removed ([`Inner::keep_lock`]).
    lock_keeper: Mutex<Option<Periodic>>,
    stats_interval: std::time::Duration,
}

impl Background {
    /// No thread started yet; live stats every `stats_interval`, if any.
    fn new(stats_interval: Option<std::time::Duration>) -> Self {
        Background {
            evictor: Mutex::new(None),
            stats_writer: Mutex::new(None),
            lock_keeper: Mutex::new(None),
            stats_interval: stats_interval.unwrap_or_default(),
        }
    }
}

/// Takes a background thread's handle out of its slot (dropping it stops the thread).
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Puts a background thread's handle in its slot.
fn put<T>(slot: &Mutex<Option<T>>, handle: T) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
}

impl Inner {
    /// Checks that the worker lock's file is still the one this store locked, and puts one
    /// back if it was removed ([`BlockDir::keep_lock`]); run every
    /// [`crate::ns::LOCK_KEEP_INTERVAL`]. Lost to another store, puts fail from then on.
    fn keep_lock(&self) {
        let op = match self.opts.sharing {
            Sharing::Exclusive => rustix::fs::FlockOperation::NonBlockingLockExclusive,
            Sharing::Shared => rustix::fs::FlockOperation::NonBlockingLockShared,
        };
        let path = || self.ns.full(FLOCK_FILE);
        match self.ns.keep_lock(op) {
            Ok(crate::ns::LockKept::Held) => {}
            Ok(crate::ns::LockKept::Restored) => tracing::warn!(path = %path().display(),
                "the worker lock's file was removed or replaced: put back, and locked"),
            Ok(_) => {
                // Said once; puts fail from now on.
                if self.lock_lost.swap(true, Ordering::Relaxed) {
                    return;
                }
                tracing::error!(path = %path().display(), holder = %self.ns.holder(),
                    "the worker lock's file was removed and another store locked a new one: this store writes nothing from now on");
            }
            Err(e) => tracing::debug!(path = %path().display(), error = %e,
                "could not check the worker lock's file"),
        }
    }

    /// Stops the background threads (waiting for work in progress), publishes the final
    /// counters and releases the worker lock.
    fn close(&self) {
        if std::process::id() != self.pid {
            // A child of `fork`: the worker lock (an `flock` its descriptor shares with the
            // opener's), the ledger and the stats file are the opener's, and the threads do
            // not run here (dropped with the store, they are not waited for). Nothing to do.
            tracing::debug!(dir = %self.ns.path().display(), "store closed in a forked process");
            return;
        }
        drop(take(&self.threads.lock_keeper));
        drop(take(&self.threads.evictor));
        let writer = take(&self.threads.stats_writer);
        if let Some(sh) = &self.shared {
            if let Err(e) = sh.flush() {
                tracing::warn!(error = %e, "could not write the usage ledger");
            }
        }
        if writer.is_some() {
            drop(writer);
            match &self.shared {
                // The last snapshot, marked closed.
                None => self.write_live_stats(false, self.threads.stats_interval),
                // One file per shared store: it goes with the store.
                Some(sh) => {
                    let _ = self.ns.unlink_file(&sh.stats_name, None);
                }
            }
        }
        if !self.opts.read_only {
            if let Err(e) = self.ns.unlock() {
                tracing::warn!(error = %e, "could not release the worker lock");
            }
        }
    }

    /// Brings a store just built to life: starts its background threads, evicts down to the
    /// capacity, writes the first stats, makes a shared store's worker lock shared (`alone`:
    /// it was taken exclusive) and starts the lock's keeper.
    fn start(
        inner: &Arc<Inner>,
        limits: crate::index::Limits,
        reuse: bool,
        stats_interval: Option<std::time::Duration>,
        alone: bool,
    ) -> Result<()> {
        let read_only = inner.opts.read_only;
        let shared_mode = inner.opts.sharing == Sharing::Shared && !read_only;
        // The background threads; a failure to start one fails the open (the lock is released
        // as `inner` drops).
        let thread_err = |e: std::io::Error| Error::Io {
            path: inner.ns.path().to_path_buf(),
            source: std::io::Error::new(e.kind(), format!("could not start a store thread: {e}")),
        };
        // With reuse, every eviction is inline, where the put takes the victim's file: an evictor
        // unlinking ahead of the puts would leave nothing to reuse.
        if !read_only && !shared_mode && !reuse && limits.is_bounded() && limits.high < 1.0 {
            let ev = Evictor::spawn(Arc::downgrade(inner)).map_err(thread_err)?;
            put(&inner.threads.evictor, ev);
        }
        if let Some(i) = stats_interval {
            let w = Periodic::spawn("tierkv-stats", Arc::downgrade(inner), i, move |inner| {
                inner.write_live_stats(true, i)
            })
            .map_err(thread_err)?;
            put(&inner.threads.stats_writer, w);
        }
        // Enforce the capacity on what the tree already holds.
        if !read_only {
            let victims = inner.index.evict_to_bound();
            if !victims.is_empty() {
                tracing::info!(count = victims.len(), "evicting down to the capacity");
                inner.unlink_victims(victims);
            }
        }
        if stats_interval.is_some() {
            inner.write_live_stats(true, inner.threads.stats_interval);
        }
        if shared_mode && alone {
            // Others may join now. flock converts a lock by dropping it first: a store that
            // took the worker meanwhile is waited for, as at any shared open.
            match lock_shared_waiting(&inner.ns) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Error::WorkerBusy {
                        path: inner.ns.path().to_path_buf(),
                        holder: inner.ns.holder(),
                    });
                }
                Err(e) => return Err(Error::from_io(inner.ns.path(), io_err(e))),
            }
        }
        if !read_only {
            let k = Periodic::spawn(
                "tierkv-lock",
                Arc::downgrade(inner),
                crate::ns::LOCK_KEEP_INTERVAL,
                Inner::keep_lock,
            )
            .map_err(|e| Error::from_io(inner.ns.path(), e))?;
            put(&inner.threads.lock_keeper, k);
        }
        Ok(())
    }
}

use crate::ns::io_err;

/// A read-only filesystem met while opening for writing: say how to open it for reading.
fn read_only_hint(e: Error) -> Error {
    match e {
        Error::Io { path, source } if source.raw_os_error() == Some(Errno::ROFS.raw_os_error()) => {
            Error::Config(format!(
                "{} is on a read-only filesystem: open it with \
                 StoreConfig::with_read_only(true) to serve reads",
                path.display()
            ))
        }
        e => e,
    }
}

/// Sweeps the tree of `ns` (temp files as `config` and `alone` say), logs and counts what it
/// found, and rebuilds the index from its blocks: the sweep's report (entries oldest first),
/// the counters, the index.
fn rebuild_index(
    ns: &BlockDir,
    layout: Layout,
    config: &StoreConfig,
    policy: Box<dyn Policy>,
    alone: bool,
) -> (sweep::SweepReport, Counters, Index) {
    let read_only = config.read_only;
    let shared_mode = config.sharing == Sharing::Shared && !read_only;
    let started = std::time::Instant::now();
    let temps = if config.keep_temp_files || read_only {
        sweep::TempRule::Keep
    } else if shared_mode && !alone {
        sweep::TempRule::OwnerGone {
            lease: config.temp_lease,
        }
    } else {
        sweep::TempRule::All
    };
    let mut report = sweep::sweep_with(ns, layout, temps, true);
    let scan_ms = started.elapsed().as_millis() as u64;
    for (p, e) in &report.errors {
        tracing::warn!(path = %p.display(), error = %e, "could not scan part of the tree");
    }
    if report.temp > 0 {
        tracing::info!(
            count = report.temp,
            "removed temp files of an unfinished put"
        );
    }
    if report.foreign + report.symlinks + report.misplaced > 0 {
        tracing::warn!(
            foreign = report.foreign,
            symlinks = report.symlinks,
            misplaced = report.misplaced,
            "files that are not blocks of this store are in the tree; left alone"
        );
    }
    let counters = Counters::default();
    Counters::add(&counters.temp_swept, report.temp);
    Counters::add(
        &counters.foreign,
        report.foreign + report.symlinks + report.misplaced,
    );
    Counters::add(&counters.blocks_at_open, report.blocks);

    // The index, oldest block first, so the policy's recency order is the files'.
    let limits = config.limits();
    // Shared, the capacity is the tree's: the ledger decides when the index evicts.
    let index = Index::with_enforcement(limits, policy, !shared_mode);
    report
        .entries
        .sort_unstable_by_key(|e| (e.recency_ns, e.hash));
    index.load_many(report.entries.iter().map(|e| (e.hash, e.bytes)));
    tracing::debug!(
        blocks = report.blocks,
        scan_ms,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "index rebuilt"
    );
    (report, counters, index)
}

/// Shared mode's usage ledger of `ns`, set from the sweep's `report`: kept if another store
/// keeps it (less the dead writers' temp files swept), else reset to what the scan found.
fn open_ledger(
    ns: &BlockDir,
    limits: crate::index::Limits,
    config: &StoreConfig,
    report: &sweep::SweepReport,
    alone: bool,
) -> Result<shared::SharedTier> {
    shared::SharedTier::new(ns, limits, config.temp_lease, config.ledger_wait).and_then(|sh| {
        let found = shared::Usage {
            bytes: report.entries.iter().map(|e| e.bytes).sum(),
            files: report.entries.len() as u64,
        };
        match sh.read()? {
            // Another store keeps it: the temp files of dead writers swept here
            // were reserved (a live writer's put returns its own).
            Some(_) if !alone => sh.freed(report.temp_dead_bytes, report.temp_dead),
            // Alone (or no valid record): the tree is what the scan found.
            _ => sh.reset(found)?,
        }
        sh.flush()?;
        Ok(sh)
    })
}

/// Whether the store in `ns` reuses evicted files.
fn reuse_evicted(
    ns: &BlockDir,
    config: &StoreConfig,
    shared_mode: bool,
    limits: crate::index::Limits,
) -> bool {
    // Evicted files are reused where something is evicted by this store alone and the
    // filesystem grants the write leases that keep other readers safe; else they are
    // unlinked, and the background evictor runs.
    config.reuse_evicted
        && !config.read_only
        && !shared_mode
        && limits.is_bounded()
        && match ns.leases_granted() {
            Ok(granted) => granted,
            Err(e) => {
                tracing::info!(path = %ns.path().display(), error = %e,
                    "no write leases here: evicted files are unlinked, not reused");
                false
            }
        }
}

impl Store {
    /// Opens (creating if needed) the store of `worker` under `root`, with `config`.
    ///
    /// Creates `<root>/v1/<worker>/`, records or checks the layout, takes the worker lock,
    /// sweeps temp files left by a crashed predecessor, rebuilds the index from the files
    /// (recency from their access and modification times), and evicts down to the capacity.
    pub fn open(root: impl AsRef<Path>, worker: WorkerId, config: StoreConfig) -> Result<Store> {
        Self::open_with(root, worker, config, Components::new())
    }

    /// As [`Store::open`], with an engine built by the caller (e.g. a
    /// `FaultyEngine`).
    pub fn open_with_engine(
        root: impl AsRef<Path>,
        worker: WorkerId,
        config: StoreConfig,
        engine: Arc<dyn IoEngine>,
    ) -> Result<Store> {
        Self::open_with(root, worker, config, Components::new().with_engine(engine))
    }

    /// As [`Store::open`], with parts built by the caller.
    #[tracing::instrument(skip(root, config, parts), fields(root = %root.as_ref().display()))]
    pub fn open_with(
        root: impl AsRef<Path>,
        worker: WorkerId,
        config: StoreConfig,
        parts: Components,
    ) -> Result<Store> {
        config.validate()?;
        let engine = match parts.engine {
            Some(e) => e,
            None => config.engine.build_with(&config.engine_options)?,
        };
        let policy = parts.policy.unwrap_or_else(|| config.policy.build());
        let read_only = config.read_only;
        let ns =
            BlockDir::open_with_faults(root.as_ref(), worker.as_str(), !read_only, parts.ns_faults)
                .map_err(read_only_hint)?;
        let dir = ns.path().to_path_buf();
        // Shared: alone if the exclusive lock is free (no store holds the worker, on any node
        // that honours flock): then the tree's temp files are all abandoned and the ledger is
        // set from the scan; the lock becomes shared once the store is open.
        let mut alone = true;
        if !read_only {
            let got = match config.sharing {
                Sharing::Exclusive => ns.try_lock(),
                Sharing::Shared => ns.try_lock().and_then(|ex| {
                    alone = ex;
                    if ex {
                        Ok(true)
                    } else {
                        lock_shared_waiting(&ns)
                    }
                }),
            };
            match got {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Error::WorkerBusy {
                        path: dir,
                        holder: ns.holder(),
                    });
                }
                // The directory's own flock does not fail: the lock file did.
                Err(e) => return Err(Error::from_io(ns.full(FLOCK_FILE), io_err(e))),
            }
            if let Err(e) = ns.record_holder(config.sharing == Sharing::Shared) {
                let _ = ns.unlock();
                return Err(read_only_hint(e));
            }
        }
        Self::open_locked(ns, worker, &config, engine, policy, alone)
    }

    /// Opens the store in `ns` once the worker lock is held (unless read-only; `alone`: no
    /// other store held the worker): the layout, the sweep and the index, shared mode's
    /// ledger, the background threads. A failure before the store exists releases the lock.
    fn open_locked(
        ns: BlockDir,
        worker: WorkerId,
        config: &StoreConfig,
        engine: Arc<dyn IoEngine>,
        policy: Box<dyn Policy>,
        alone: bool,
    ) -> Result<Store> {
        let read_only = config.read_only;
        let shared_mode = config.sharing == Sharing::Shared && !read_only;
        let unlock = |ns: &BlockDir| {
            if !read_only {
                let _ = ns.unlock();
            }
        };
        let layout = match resolve_layout(&ns, config) {
            Ok(l) => l,
            Err(e) => {
                unlock(&ns);
                return Err(e);
            }
        };
        let (report, counters, index) = rebuild_index(&ns, layout, config, policy, alone);
        let limits = config.limits();
        let shared = if shared_mode {
            match open_ledger(&ns, limits, config, &report, alone) {
                Ok(sh) => Some(sh),
                Err(e) => {
                    unlock(&ns);
                    return Err(e);
                }
            }
        } else {
            None
        };
        // After the control files and the ledger: the leaves are an optimisation, never what
        // takes a small filesystem's last inodes from them.
        if !read_only {
            make_leaves(&ns, layout);
        }
        let fd_cap = config.fd_cache_capacity();
        if fd_cap > 0 {
            // Room for the cache's descriptors beside what the process holds already.
            ns.reserve_descriptor_slots(fd_cap + 1024);
        }
        tracing::debug!(worker = %worker, %layout, fd_cache = fd_cap, engine = engine.name(), "store open");
        let stats_interval = config.stats_interval.filter(|_| !read_only);
        let reuse = reuse_evicted(&ns, config, shared_mode, limits);
        let inner = Arc::new(Inner {
            worker,
            layout,
            ns,
            engine,
            shared,
            tree: (config.sharing == Sharing::Shared)
                .then(|| shared::Negative::new(config.negative_ttl)),
            fds: FdCache::new(fd_cap),
            index,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            bufs: crate::buf::BufPool::new(64 << 20),
            opts: IoOptions::of(config),
            publish: Publisher::new(config, reuse),
            threads: Background::new(stats_interval),
            counters,
            boot: crate::ns::boot_id(),
            offload: Mutex::new(None),
            lock_lost: AtomicBool::new(false),
            pid: std::process::id(),
        });
        Inner::start(&inner, limits, reuse, stats_interval, alone)?;
        Ok(Store {
            _open: Arc::new(OpenGuard(inner.clone())),
            inner,
        })
    }

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
        self.inner.put_with_retry(items, true, None)
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
        self.inner.put_with_retry(&gathered, true, None)
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
    fn refuse_bad_parent(&self, parent: Option<&BlockKey>, n: usize) -> Option<Vec<Result<()>>> {
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
        self.inner.put_with_retry(items, false, None)
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
        self.inner
            .put_with_retry(items, false, parent.map(|p| p.hash))
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

/// How long a shared store waits for another shared store that holds the worker lock
/// exclusively while it opens (it scans the tree alone: on a large tree over a distributed
/// filesystem, that takes a while).
const SHARED_OPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
/// How long a lock holder may take to record itself before its record is believed.
const HOLDER_RECORD_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes the worker lock shared. While it is held exclusively by a shared store that is
/// opening (its `.lock` record says `mode=shared`), waits for it, up to [`SHARED_OPEN_WAIT`];
/// an exclusive store's lock fails at once (after [`HOLDER_RECORD_GRACE`] for a record that
/// may be stale).
fn lock_shared_waiting(ns: &BlockDir) -> rustix::io::Result<bool> {
    let start = std::time::Instant::now();
    loop {
        if ns.try_lock_shared()? {
            return Ok(true);
        }
        let shared_holder = ns.holder_is_shared();
        let waited = start.elapsed();
        if waited > SHARED_OPEN_WAIT || (!shared_holder && waited > HOLDER_RECORD_GRACE) {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Reads the layout recorded in the worker directory, or records the configured one there
/// (else one chosen from the store's size: [`Layout::for_files`] of the capacity, or of what
/// the filesystem has room for when unbounded). A directory that holds anything but control
/// files and has no `LAYOUT` is refused: its files were laid out by someone else, and
/// adopting a default would make every block foreign.
fn resolve_layout(ns: &BlockDir, config: &StoreConfig) -> Result<Layout> {
    let (wanted, read_only) = (config.layout, config.read_only);
    let path = ns.full(LAYOUT_FILE);
    match ns.read_control(LAYOUT_FILE)? {
        Some(bytes) => {
            let found = std::str::from_utf8(&bytes)
                .ok()
                .and_then(Layout::from_file_text)
                .ok_or_else(|| Error::Corrupt {
                    path: path.clone(),
                    reason: crate::error::CorruptReason::ControlFile(
                        "not a layout file (expected depth=D and fanout=F lines)".into(),
                    ),
                })?;
            match wanted {
                Some(w) if w != found => Err(Error::LayoutMismatch {
                    path,
                    found: found.to_string(),
                    configured: w.to_string(),
                }),
                _ => Ok(found),
            }
        }
        None => {
            let l = wanted.unwrap_or_else(|| {
                let file = layout::TYPICAL_BLOCK_BYTES + PAYLOAD_OFFSET;
                Layout::for_files(config.expected_files().or_else(|| ns.room_in_files(file)))
            });
            let others = ns
                .read_dir("")
                .map_err(|e| Error::from_io(ns.path(), io_err(e)))?
                .into_iter()
                .filter(|e| {
                    !matches!(
                        Layout::classify(e.name_str()),
                        EntryName::Meta | EntryName::ControlTemp
                    )
                })
                .count();
            if others > 0 {
                return Err(Error::LayoutMismatch {
                    path,
                    found: format!("no layout file but {others} other entries"),
                    configured: l.to_string(),
                });
            }
            if !read_only {
                ns.write_control(LAYOUT_FILE, l.to_file_text().as_bytes())?;
            }
            Ok(l)
        }
    }
}

/// Creates the leaf directories of a tree of at most [`layout::EAGER_LEAVES_MAX`] leaves that
/// are missing, through the namespace layer (each level opened `O_NOFOLLOW`: an entry in a
/// leaf's place that is not a directory, a symlink included, is left alone and logged, and
/// the puts into it fail as before). Best effort: a put still creates a missing leaf itself,
/// so a failure here (ENOSPC, EACCES, a leaf removed later) only costs that put a `mkdir`.
fn make_leaves(ns: &BlockDir, layout: Layout) {
    let leaves = layout.leaf_dirs();
    if leaves.is_empty() || !room_for_leaves(ns, leaves.len()) {
        return;
    }
    // One level: the worker directory's listing says which exist (one `getdents` on a
    // reopen instead of 256 `mkdir`s).
    let present: std::collections::HashSet<String> = if layout.depth == 1 {
        ns.read_dir("")
            .map(|es| es.iter().map(|e| e.name_str().to_string()).collect())
            .unwrap_or_default()
    } else {
        std::collections::HashSet::new()
    };
    let started = std::time::Instant::now();
    let mut made = 0usize;
    for dir in leaves.iter().filter(|d| !present.contains(d.as_str())) {
        match ns.make_dirs(dir) {
            Ok(()) => made += 1,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                tracing::warn!(path = %ns.full(dir).display(),
                    "not a directory (a symlink?) where a leaf directory belongs: left alone");
            }
            Err(e) => {
                tracing::info!(path = %ns.full(dir).display(), error = %e,
                    "could not create the leaf directories ahead: puts create them");
                break;
            }
        }
    }
    tracing::debug!(made, elapsed = ?started.elapsed(), "leaf directories created at open");
}

/// True if the worker's filesystem has inodes to spare for `leaves` directories made ahead:
/// at least four times as many free as the leaves take, and 1,024 more (a filesystem that
/// reports no inode count, such as some FUSE ones, has room). Else puts make their leaves.
fn room_for_leaves(ns: &BlockDir, leaves: usize) -> bool {
    match rustix::fs::fstatvfs(ns.fd()) {
        Ok(st) if st.f_files > 0 => st.f_favail >= leaves as u64 * 4 + 1024,
        Ok(_) => true,
        Err(_) => false,
    }
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

    /// A put that failed part way: keeps the chain's present blocks a prefix of it, and if
    /// the first block it could not store met ENOSPC below the capacity, makes room and
    /// writes the chain from that block on once more, block by block in chain order (so
    /// that the retry's own failures are the chain's tail), until one is not stored. The
    /// blocks it removed and did not write again are counted as not admitted (their results
    /// stay `Ok`).
    fn recover_partial_put<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        replace: bool,
        after: Option<BlockHash>,
        results: &mut [Result<()>],
    ) {
        let (gap, cut) = self.cut_after_gap(items, results);
        let Some(g) = gap else { return };
        // The last item offered again (the gap itself when there is no retry): the index
        // counts what it declines of those, and their errors are theirs.
        let mut last_offered = g;
        if matches!(results[g], Err(Error::NoSpace { .. }))
            && (self.room_for_retry(items, g, after) || !cut.is_empty())
        {
            Counters::add(&self.counters.nospace_retries, 1);
            for i in g..items.len() {
                last_offered = i;
                let anchor = i.checked_sub(1).map(|p| items[p].0.hash).or(after);
                let r = self.put_batch(items, &[i], replace, anchor).pop();
                results[i] = r.unwrap_or(Ok(()));
                if results[i].is_err() || !self.contains(&items[i].0).unwrap_or(false) {
                    break;
                }
            }
        }
        let lost = cut
            .iter()
            .filter(|&&i| i > last_offered && results[i].is_ok())
            .count();
        if lost > 0 {
            self.index.count_not_admitted(lost as u64);
        }
    }

    /// Evicts other blocks (never this batch's, as the index never does for it, nor the
    /// prefix it hangs from) to make room for the chain from item `g` on; whether any went.
    fn room_for_retry<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        g: usize,
        after: Option<BlockHash>,
    ) -> bool {
        let need: u64 = items[g..]
            .iter()
            .map(|(_, d)| write::disk_estimate(write::Source::len(d)))
            .sum();
        let floor = self.index.counts().bytes / 100;
        let keep: Vec<BlockHash> = items.iter().map(|(k, _)| k.hash).chain(after).collect();
        let victims = self.index.evict_bytes(need.max(floor), &keep);
        if victims.is_empty() {
            return false;
        }
        self.unlink_victims(victims);
        true
    }

    /// The first item that is not stored (failed, declined, or not present), and the blocks
    /// after it that were stored and are now removed: no prefix lookup could reach them
    /// (removing a block removes its descendants with it, so they are found first).
    fn cut_after_gap<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        results: &[Result<()>],
    ) -> (Option<usize>, Vec<usize>) {
        let stored = |i: usize| results[i].is_ok() && self.contains(&items[i].0).unwrap_or(false);
        let Some(gap) = (0..items.len()).find(|&i| !stored(i)) else {
            return (None, Vec::new());
        };
        let cut: Vec<usize> = (gap + 1..items.len()).filter(|&i| stored(i)).collect();
        for &i in &cut {
            if let Err(e) = self.remove(&items[i].0, true) {
                tracing::warn!(error = %e, "put: a block after a gap in its chain could not be removed");
            }
        }
        if !cut.is_empty() {
            tracing::debug!(
                cut = cut.len(),
                gap,
                "put: blocks after a gap in their chain removed"
            );
        }
        (Some(gap), cut)
    }

    /// A put batch, then, if part of it failed, its recovery ([`Inner::recover_partial_put`]:
    /// the chain kept a prefix, and after ENOSPC below the capacity, eviction and a retry).
    fn put_with_retry<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        replace: bool,
        after: Option<BlockHash>,
    ) -> Vec<Result<()>> {
        if self.opts.read_only {
            return items
                .iter()
                .map(|_| {
                    Err(Error::ReadOnly {
                        path: self.ns.path().to_path_buf(),
                        op: "put",
                    })
                })
                .collect();
        }
        if self.lock_lost.load(Ordering::Relaxed) {
            let holder = self.ns.holder();
            return items
                .iter()
                .map(|_| {
                    Err(Error::WorkerBusy {
                        path: self.ns.path().to_path_buf(),
                        holder: holder.clone(),
                    })
                })
                .collect();
        }
        // Shared: a present block is never rewritten (another store may be reading it, and
        // its key names its content).
        let replace = replace && self.shared.is_none();
        let started = std::time::Instant::now();
        // A batch larger than the open-file budget runs as consecutive sub-batches, each
        // hung from the last block of the one before (a gap there cuts the rest, as in one
        // batch), so that a batch of any size stays under the open-file limit.
        let all: Vec<usize> = (0..items.len()).collect();
        let mut results = Vec::with_capacity(items.len());
        for chunk in all.chunks(config::batch_files()) {
            let anchor = chunk[0].checked_sub(1).map(|p| items[p].0.hash).or(after);
            results.extend(self.put_batch(items, chunk, replace, anchor));
        }
        if results.iter().any(Result::is_err) {
            self.recover_partial_put(items, replace, after, &mut results);
        }
        let errors = results.iter().filter(|r| r.is_err()).count();
        Counters::add(&self.counters.put_errors, errors as u64);
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            self.counters.error(e);
        }
        self.counters.put_latency.record(started.elapsed());
        if self.index.over_high() {
            if let Some(ev) = &*self
                .threads
                .evictor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
            {
                ev.wake();
            }
        }
        results
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
    /// put that published it meanwhile keeps its entry.
    fn forget_if_missing(&self, hash: &BlockHash, rel: &layout::RelPath) {
        let _stripe = self.lock_stripe(self.stripe_of(hash));
        if let Err(Errno::NOENT | Errno::NOTDIR) = self.ns.stat(rel.as_str()) {
            self.index.forget(hash);
        }
    }

    /// A block file this store removed (shared mode: the ledger counts it no more).
    fn freed(&self, bytes: u64) {
        if let Some(sh) = &self.shared {
            sh.freed(bytes, 1);
        }
    }

    /// Shared mode: scans the tree (at most every `shared::RESCAN_INTERVAL`) so the index
    /// knows the blocks other stores put (as the oldest, by their files' times) and forgets
    /// those gone; abandoned temp files are swept on the way. True if the scan ran. `forced`:
    /// even if one ran less than that interval ago.
    pub(super) fn learn_tree(&self, forced: bool) -> bool {
        let Some(sh) = &self.shared else {
            return false;
        };
        if !sh.may_rescan() && !forced {
            return false;
        }
        let mut report = sweep::sweep_with(
            &self.ns,
            self.layout,
            sweep::TempRule::OwnerGone {
                lease: sh.temp_lease,
            },
            true,
        );
        sh.freed(report.temp_dead_bytes, report.temp_dead);
        report
            .entries
            .sort_unstable_by_key(|e| (e.recency_ns, e.hash));
        let found: std::collections::HashSet<BlockHash> =
            report.entries.iter().map(|e| e.hash).collect();
        let mut learned = 0;
        for e in &report.entries {
            if !self.index.contains(&e.hash) {
                self.index.load(e.hash, e.bytes);
                learned += 1;
            }
        }
        let stale = self.index.forget_absent(&found);
        tracing::debug!(
            learned,
            stale,
            "scanned the shared tree for blocks of other stores"
        );
        true
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
            let _stripe = self.lock_stripe(self.stripe_of(key));
            let r = self.ns.unlink_file_sized(rel.as_str(), None);
            self.fds.invalidate(key);
            match r {
                Ok((Unlinked::Removed, bytes)) => {
                    Counters::add(&self.counters.removes, 1);
                    self.freed(bytes);
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
