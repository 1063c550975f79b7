//! The store's lifecycle: opening (the worker lock, the layout, the sweep that rebuilds the
//! index, shared mode's ledger, the leaf directories), its background threads, and closing.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::io::Errno;

use super::evict::Evictor;
use super::fdcache::FdCache;
use super::periodic::Periodic;
use super::{
    Components, Inner, IoOptions, Publisher, STRIPES, Sharing, Store, StoreConfig, shared, sweep,
};
use crate::engine::IoEngine;
use crate::error::{Error, Result};
use crate::format::PAYLOAD_OFFSET;
use crate::index::Index;
use crate::index::policy::Policy;
use crate::key::WorkerId;
use crate::layout::{self, EntryName, FLOCK_FILE, LAYOUT_FILE, Layout};
use crate::ns::{BlockDir, io_err};
use crate::stats::Counters;

#[derive(Debug)]
pub(super) struct OpenGuard(pub(super) Arc<Inner>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The store's background threads.
#[derive(Debug)]
pub(super) struct Background {
    pub(super) evictor: Mutex<Option<Evictor>>,
    stats_writer: Mutex<Option<Periodic>>,
    /// Puts the worker lock's file back if it is removed ([`Inner::keep_lock`]).
    lock_keeper: Mutex<Option<Periodic>>,
    pub(super) stats_interval: std::time::Duration,
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
        let journal = match ns.open_journal(
            config.events && !read_only,
            !read_only,
            read_only || shared_mode,
            config.ledger_wait,
        ) {
            Ok(j) => j,
            Err(e) => {
                unlock(&ns);
                return Err(e);
            }
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
            journal,
            late_journal: std::sync::OnceLock::new(),
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
