//! Store configuration.

use std::fmt;
use std::str::FromStr;

use crate::engine::{EngineKind, EngineOptions, PosixQueue};
use crate::error::{Error, Result};
use crate::index::Limits;
use crate::index::policy::PolicyKind;
use crate::layout::Layout;

/// When payload checksums are verified on reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyMode {
    /// Every read hashes the payload.
    Always,
    /// Never (a torn or bit-rotted file is served as it is).
    Never,
    /// The first read through each newly opened descriptor verifies; later reads through the
    /// same cached descriptor trust it. Block files are immutable once published, so this
    /// catches every torn file a crash can leave, bit rot, and a file changed in place (by a
    /// stray writer, a tool, the device) at the next open, at the cost of one hash per open:
    /// with the psync engine each piece is hashed as it lands, while it is still in the CPU's
    /// cache. The default (docs/benchmarks.md has the measured cost of each mode).
    #[default]
    OnOpen,
    /// As [`VerifyMode::OnOpen`], but a file whose header says it was written on this machine
    /// since its current boot (format version 2) is trusted without hashing: only a machine
    /// crash tears a published file, and a machine crash means a new boot. Files written
    /// before this boot (or by a version 1 writer, or on another machine) are verified on
    /// their first open, so every torn file a crash can leave is still caught
    /// (docs/format.md#which-crashes-need-the-checksum has the argument). A file of this boot
    /// changed in place is served as it is.
    AfterReboot,
}

impl FromStr for VerifyMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "always" => Ok(VerifyMode::Always),
            "never" => Ok(VerifyMode::Never),
            "on-open" | "once" => Ok(VerifyMode::OnOpen),
            "after-reboot" => Ok(VerifyMode::AfterReboot),
            _ => Err(Error::Config(format!(
                "unknown verify mode {s:?}; use after-reboot, always, never or on-open"
            ))),
        }
    }
}

impl fmt::Display for VerifyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VerifyMode::Always => "always",
            VerifyMode::Never => "never",
            VerifyMode::OnOpen => "on-open",
            VerifyMode::AfterReboot => "after-reboot",
        })
    }
}

/// How a put publishes its file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Publish {
    /// A named temp file in the block's directory, renamed into place. The default: it
    /// measured as fast as or faster than `Tmpfile` here (docs/benchmarks.md).
    #[default]
    Rename,
    /// An anonymous `O_TMPFILE` inode linked into place (`linkat`), where the filesystem
    /// supports it (else `Rename`). A crash leaves no temp file at all. Replacing an existing
    /// block links a temp name and renames it over.
    Tmpfile,
}

impl FromStr for Publish {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tmpfile" => Ok(Publish::Tmpfile),
            "rename" => Ok(Publish::Rename),
            _ => Err(Error::Config(format!(
                "unknown publish mode {s:?}; use rename or tmpfile"
            ))),
        }
    }
}

impl fmt::Display for Publish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Publish::Rename => "rename",
            Publish::Tmpfile => "tmpfile",
        })
    }
}

/// Whether a store owns its worker directory alone or shares it with other stores (other
/// processes, on this node or on other nodes that mount the same filesystem): docs/shared.md.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// One store per worker directory (an exclusive `flock` on it): the index is the tree's
    /// owner, so a key it does not hold is a miss without a system call. The default, for a
    /// private local tree: it is the faster mode (docs/shared.md).
    #[default]
    Exclusive,
    /// Many stores on one worker directory (each holds a shared `flock` on it). The index is
    /// a cache of the tree: a key it does not hold is looked up in the tree (negative answers
    /// are kept for [`StoreConfig::negative_ttl`]); puts never replace a present block (keys
    /// are content addresses: the first file published wins); the capacity is one for the
    /// tree, kept in the `USAGE` ledger file under a lock; temp files carry their owner's
    /// node and pid, and a sweep removes only those whose owner is gone. A read-only store in
    /// this mode looks up the tree the same way (it sees the blocks that writers put after it
    /// opened), and has no ledger.
    Shared,
}

impl FromStr for Sharing {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "exclusive" => Ok(Sharing::Exclusive),
            "shared" => Ok(Sharing::Shared),
            _ => Err(Error::Config(format!(
                "unknown sharing mode {s:?}; use exclusive or shared"
            ))),
        }
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharing::Exclusive => "exclusive",
            Sharing::Shared => "shared",
        })
    }
}

/// How long a shared store remembers that a key was absent from the tree (default 1 s): a
/// block another store publishes is a hit here at most this long after it appears.
pub const DEFAULT_NEGATIVE_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// The default [`StoreConfig::read_threads`]: two, the calling thread and one more (measured on
/// two cores: a prefix load of 2 MiB blocks with every payload hashed goes from 0.79x to
/// 1.5x of a plain single-threaded open, read and close; docs/benchmarks.md).
pub const DEFAULT_READ_THREADS: usize = 2;
/// The default [`StoreConfig::direct_puts_from`]: puts of blocks of 2 MiB or more write with
/// `O_DIRECT`. On this project's VMs (ext4, virtio disk; `tools/direct-put-probe.py`), new
/// files of 2 MiB and more were written 2.6-5.7x faster with `O_DIRECT` than buffered (the new
/// page-cache memory is what a buffered write of that size pays for here), while below it
/// buffered writes won in most runs (1 MiB: 0.39x and 0.60x of buffered in two runs, 5.4x in a
/// third; 256 KiB 0.43-0.52x; 64 KiB 0.37-0.39x): docs/benchmarks.md, "Direct puts".
pub const DEFAULT_DIRECT_PUTS_FROM: usize = 2 << 20;

/// The fewest bytes of host reads in one batch that are split between read threads: below it
/// a thread's start (tens of microseconds) costs more than it saves.
pub const PARALLEL_READ_MIN: usize = 4 << 20;

/// How old a temp file of another node must be before a shared store's sweep removes it
/// (default 10 minutes; a temp file of this node goes as soon as its process is gone).
pub const DEFAULT_TEMP_LEASE: std::time::Duration = std::time::Duration::from_secs(600);

/// The shortest interval at which a store rewrites its live counters
/// ([`StoreConfig::stats_interval`]); a shorter one is refused at open.
pub const MIN_STATS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// How long a shared store waits for the usage ledger's lock by default
/// ([`StoreConfig::ledger_wait`]).
pub const DEFAULT_LEDGER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Default largest block: 256 MiB.
pub const DEFAULT_MAX_BLOCK_SIZE: usize = 256 << 20;
/// Largest default open-file cache.
pub const DEFAULT_FD_CACHE_MAX: usize = 4096;

/// The smallest block file on disk: the 4 KiB header page and one 4 KiB page of payload. A
/// byte capacity below it is refused when a store opens.
pub const MIN_BLOCK_FILE_BYTES: u64 = 8192;

/// How a [`Store`](crate::Store) is opened. `StoreConfig::default()` suits most callers; each
/// `with_*` setter documents its default.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoreConfig {
    /// The shard tree. `None` (default): the layout recorded in the tree, or for a new tree
    /// [`Layout::for_files`] of the store's size ([`StoreConfig::expected_files`]; unbounded:
    /// the files the filesystem's free space and inodes hold at creation). `Some`: must match
    /// a recorded layout.
    pub layout: Option<Layout>,
    /// Open-file cache capacity. `None` (default): a quarter of the soft `RLIMIT_NOFILE`, at
    /// most 4096. `Some(0)` opens and closes a file per access.
    pub fd_cache: Option<usize>,
    /// Largest accepted block payload (default 256 MiB).
    pub max_block_size: Option<usize>,
    /// When checksums are verified (default [`VerifyMode::OnOpen`]).
    pub verify: VerifyMode,
    /// Threads a large get runs its reads on (default [`DEFAULT_READ_THREADS`]): a batch of
    /// at least [`PARALLEL_READ_MIN`] bytes of host reads, on an engine whose
    /// [`IoEngine::concurrent_submits`](crate::engine::IoEngine::concurrent_submits) is true,
    /// is split between the calling thread and `read_threads - 1` scoped threads, each reading
    /// (and, with the psync engine, hashing) its share. 1: every read on the calling thread.
    pub read_threads: usize,
    /// Use `O_DIRECT` for block I/O, through aligned bounce buffers (default off).
    pub direct_io: bool,
    /// Puts of host payloads of at least this many bytes write their files with `O_DIRECT`
    /// (default [`DEFAULT_DIRECT_PUTS_FROM`]; `None`: only with [`Self::direct_io`]), from the
    /// caller's memory where it is page-aligned, else through an aligned bounce buffer. Reads
    /// stay buffered: the first read of such a block comes from the disk, later ones from the
    /// page cache. A filesystem that refuses `O_DIRECT` (EINVAL) gets buffered puts from then
    /// on.
    pub direct_puts_from: Option<usize>,
    /// `fdatasync` each block before publishing it and `fsync` its directory after (default
    /// off: a crash may lose recent blocks, never serve a torn one).
    pub sync_writes: bool,
    /// The I/O engine (default psync).
    pub engine: EngineKind,
    /// The engine's settings (queue depth, NIXL's queue and library).
    pub engine_options: EngineOptions,
    /// How puts publish files (default [`Publish::Rename`]).
    pub publish: Publish,
    /// Largest total of on-disk bytes of the worker's block files (headers included, as
    /// `du` counts them). `None` (default): unbounded.
    pub capacity_bytes: Option<u64>,
    /// Largest number of block files. `None` (default): unbounded.
    pub capacity_files: Option<u64>,
    /// The eviction policy (default [`PolicyKind::Arc`]).
    pub policy: PolicyKind,
    /// Background eviction starts above this fraction of the capacity (default 0.95) and
    /// stops at `low_watermark` (default 0.90). `1.0` for both evicts only inline, exactly
    /// at the bound (what trace replay uses). Only an exclusive store that unlinks what it
    /// evicts runs background eviction: with [`StoreConfig::reuse_evicted`] in effect (the
    /// default where the filesystem grants leases) every eviction is inline and the
    /// watermarks do nothing.
    pub high_watermark: f64,
    /// See `high_watermark`.
    pub low_watermark: f64,
    /// How often the live counters are written to `STATS.json` in the worker directory, for
    /// `tierkv-stat --live` (default every second; `None`: never).
    pub stats_interval: Option<std::time::Duration>,
    /// Leave temp files of crashed stores in place when opening (default off: they are
    /// removed; the worker lock guarantees no live store owns them).
    pub keep_temp_files: bool,
    /// Open the tree read-only (default off): for a replica that only reads a tree another
    /// store writes, or a tree on a read-only mount. Takes no worker lock, creates, sweeps,
    /// evicts and removes nothing, writes no `STATS.json`; puts fail with
    /// [`Error::ReadOnly`]. The index holds the blocks present when the store opened; with
    /// [`Sharing::Shared`], a key it does not hold is looked up in the tree, so blocks put
    /// since are found too.
    pub read_only: bool,
    /// Alone or shared with other stores (default [`Sharing::Exclusive`]).
    pub sharing: Sharing,
    /// Shared mode: how long an absent key is remembered as absent (default
    /// `DEFAULT_NEGATIVE_TTL`; zero: every miss asks the tree).
    pub negative_ttl: std::time::Duration,
    /// Shared mode: the age after which another node's temp files are taken as abandoned
    /// (default [`DEFAULT_TEMP_LEASE`]).
    pub temp_lease: std::time::Duration,
    /// Shared mode: how long to wait for the usage ledger's lock (default
    /// `DEFAULT_LEDGER_WAIT`). Every holder keeps it for one short update; one that does
    /// not let go (a store stopped with `SIGSTOP` while it held it) makes what needs the
    /// ledger fail past this wait, with an error naming it: an open, a put's reservation,
    /// the flush of its corrections.
    pub ledger_wait: std::time::Duration,
    /// Reuse the files of blocks a put evicts for the blocks it writes (default on): the
    /// victim is renamed to a temp name, overwritten and published under the new block's
    /// name, instead of being unlinked while a new file is created (a full store then puts
    /// as fast as an empty one; docs/benchmarks.md). Only in exclusive mode, only for files
    /// no descriptor anywhere on the machine holds open (checked with a write lease). When
    /// the store opens it takes and releases a lease on an anonymous file: a filesystem that
    /// grants none (NFS, FUSE, `fs.leases-enable = 0`) or has no `O_TMPFILE` turns reuse
    /// off, and files are unlinked as without it. With reuse in effect the background
    /// evictor does not run and the watermarks do nothing: every eviction happens in the put
    /// that needs the room, exactly at the bound. See docs/design.md.
    pub reuse_evicted: bool,
    /// Keep the worker's event journal (default off): every block stored and removed under
    /// the worker directory, by any store of any process or node, in one order, for a
    /// cache-aware router's publisher to tail ([`Store::events_since`](crate::Store::events_since),
    /// docs/events.md). The journal is made if missing. Once a worker has one, every store
    /// that opens it for writing writes to it, whatever this says; removing the `EVENTS` file
    /// turns it off for stores opened after. Each put batch and each eviction batch then
    /// takes the journal's lock while it publishes or unlinks, and appends its events.
    pub events: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            layout: None,
            fd_cache: None,
            max_block_size: None,
            verify: VerifyMode::default(),
            read_threads: DEFAULT_READ_THREADS,
            direct_io: false,
            direct_puts_from: Some(DEFAULT_DIRECT_PUTS_FROM),
            sync_writes: false,
            engine: EngineKind::default(),
            engine_options: EngineOptions::default(),
            publish: Publish::default(),
            capacity_bytes: None,
            capacity_files: None,
            policy: PolicyKind::default(),
            high_watermark: 0.95,
            low_watermark: 0.90,
            stats_interval: Some(std::time::Duration::from_secs(1)),
            keep_temp_files: false,
            read_only: false,
            sharing: Sharing::default(),
            negative_ttl: DEFAULT_NEGATIVE_TTL,
            temp_lease: DEFAULT_TEMP_LEASE,
            ledger_wait: DEFAULT_LEDGER_WAIT,
            reuse_evicted: true,
            events: false,
        }
    }
}

impl StoreConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the shard tree layout (default: recorded in the tree, else chosen from the
    /// store's size for a new tree: [`Layout::for_files`]).
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = Some(layout);
        self
    }

    /// Sets the open-file cache capacity (default: `RLIMIT_NOFILE` / 4, at most 4096; 0
    /// disables it).
    pub fn with_fd_cache(mut self, capacity: usize) -> Self {
        self.fd_cache = Some(capacity);
        self
    }

    /// Sets the largest accepted block (default 256 MiB).
    pub fn with_max_block_size(mut self, bytes: usize) -> Self {
        self.max_block_size = Some(bytes);
        self
    }

    /// Sets the threads a large get reads on (default [`DEFAULT_READ_THREADS`]; 0 is taken as
    /// 1; see [`StoreConfig::read_threads`]).
    pub fn with_read_threads(mut self, threads: usize) -> Self {
        self.read_threads = threads.max(1);
        self
    }

    /// Sets when checksums are verified (default on-open).
    pub fn with_verify(mut self, verify: VerifyMode) -> Self {
        self.verify = verify;
        self
    }

    /// Turns `O_DIRECT` on or off (default off).
    pub fn with_direct_io(mut self, on: bool) -> Self {
        self.direct_io = on;
        self
    }

    /// Sets the payload size from which puts write with `O_DIRECT` (`None`: never, unless
    /// [`Self::with_direct_io`]); see [`Self::direct_puts_from`].
    pub fn with_direct_puts_from(mut self, bytes: Option<usize>) -> Self {
        self.direct_puts_from = bytes;
        self
    }

    /// Turns the reuse of evicted files on or off (default on; see
    /// [`StoreConfig::reuse_evicted`]).
    pub fn with_reuse_evicted(mut self, on: bool) -> Self {
        self.reuse_evicted = on;
        self
    }

    /// Turns durable writes on or off (default off).
    pub fn with_sync_writes(mut self, on: bool) -> Self {
        self.sync_writes = on;
        self
    }

    /// Chooses how puts publish files (default: temp file + rename).
    pub fn with_publish(mut self, publish: Publish) -> Self {
        self.publish = publish;
        self
    }

    /// Chooses the I/O engine (default psync).
    pub fn with_engine(mut self, engine: EngineKind) -> Self {
        self.engine = engine;
        self
    }

    /// Bounds the I/Os an engine keeps in flight per submitting thread (io_uring's ring
    /// depth; default [`crate::engine::DEFAULT_QUEUE_DEPTH`]).
    pub fn with_queue_depth(mut self, depth: u32) -> Self {
        self.engine_options.queue_depth = depth;
        self
    }

    /// Chooses the queue of NIXL's POSIX backend (nixl engine only).
    pub fn with_nixl_posix_queue(mut self, queue: PosixQueue) -> Self {
        self.engine_options.nixl_posix_queue = queue;
        self
    }

    /// Keeps up to `n` GPU buffer registrations between transfers (nixl engine only; default
    /// 0). Only for GPU buffers that stay allocated while the store is open, such as an
    /// engine's KV pool: they are dropped when the store closes (to free such memory sooner,
    /// build the engine and call its `forget_gpu_registrations`). See
    /// `NixlConfig::gpu_registrations_kept` (feature `nixl`).
    pub fn with_nixl_gpu_registrations_kept(mut self, n: usize) -> Self {
        self.engine_options.nixl_gpu_registrations_kept = n;
        self
    }

    /// Bounds the worker's block files to `bytes` on disk (default unbounded).
    pub fn with_capacity_bytes(mut self, bytes: u64) -> Self {
        self.capacity_bytes = Some(bytes);
        self
    }

    /// Bounds the number of block files (default unbounded).
    pub fn with_capacity_files(mut self, files: u64) -> Self {
        self.capacity_files = Some(files);
        self
    }

    /// Chooses the eviction policy (default arc).
    pub fn with_policy(mut self, policy: PolicyKind) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the eviction watermarks as fractions of the capacity (default 0.95 and 0.90; see
    /// [`StoreConfig::high_watermark`] for when they apply).
    pub fn with_watermarks(mut self, high: f64, low: f64) -> Self {
        self.high_watermark = high;
        self.low_watermark = low;
        self
    }

    /// Opens the tree read-only (see [`StoreConfig::read_only`]).
    pub fn with_read_only(mut self, on: bool) -> Self {
        self.read_only = on;
        self
    }

    /// Shares the worker directory with other stores, or owns it alone (see [`Sharing`]).
    pub fn with_sharing(mut self, sharing: Sharing) -> Self {
        self.sharing = sharing;
        self
    }

    /// Shared mode: how long a key found absent in the tree is taken as absent.
    pub fn with_negative_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.negative_ttl = ttl;
        self
    }

    /// Shared mode: the age after which another node's temp files are swept.
    pub fn with_temp_lease(mut self, lease: std::time::Duration) -> Self {
        self.temp_lease = lease;
        self
    }

    /// Shared mode: how long to wait for the usage ledger's lock before failing.
    pub fn with_ledger_wait(mut self, wait: std::time::Duration) -> Self {
        self.ledger_wait = wait;
        self
    }

    /// Sets [`StoreConfig::events`].
    pub fn with_events(mut self, on: bool) -> Self {
        self.events = on;
        self
    }

    /// Sets how often live counters are published (`None`: never; default every second).
    pub fn with_stats_interval(mut self, interval: Option<std::time::Duration>) -> Self {
        self.stats_interval = interval;
        self
    }

    /// The capacity bounds and watermarks.
    pub fn limits(&self) -> Limits {
        Limits {
            max_bytes: self.capacity_bytes,
            max_files: self.capacity_files,
            high: self.high_watermark,
            low: self.low_watermark,
        }
    }

    /// The most block files the configured capacity holds: the file capacity, or the byte
    /// capacity over [`TYPICAL_BLOCK_BYTES`](crate::layout::TYPICAL_BLOCK_BYTES) (the smaller
    /// when both are set); `None` when unbounded. What a new worker's layout is chosen from
    /// ([`Layout::for_files`]).
    pub fn expected_files(&self) -> Option<u64> {
        let by_bytes = self
            .capacity_bytes
            .map(|b| b.div_ceil(crate::layout::TYPICAL_BLOCK_BYTES));
        match (self.capacity_files, by_bytes) {
            (Some(f), Some(b)) => Some(f.min(b)),
            (f, b) => f.or(b),
        }
    }

    /// The effective maximum block size.
    pub fn max_block_size(&self) -> usize {
        self.max_block_size.unwrap_or(DEFAULT_MAX_BLOCK_SIZE)
    }

    /// The effective open-file cache capacity for the current `RLIMIT_NOFILE`.
    pub fn fd_cache_capacity(&self) -> usize {
        self.fd_cache
            .unwrap_or_else(|| quarter_of_the_file_limit().min(DEFAULT_FD_CACHE_MAX))
    }
}

/// How many blocks one batch of I/O holds files open for at once: a quarter of the soft
/// `RLIMIT_NOFILE` (read at each call: engines raise it after a store opens), at least 8 and
/// at most [`DEFAULT_FD_CACHE_MAX`]. Gets and puts larger than this run as consecutive
/// sub-batches, so that with the open-file cache (a quarter by default) a batch of any size
/// stays under the limit.
pub(crate) fn batch_files() -> usize {
    quarter_of_the_file_limit().clamp(8, DEFAULT_FD_CACHE_MAX)
}

/// A quarter of this process's soft `RLIMIT_NOFILE` now (of 2^20 when it is unlimited).
fn quarter_of_the_file_limit() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    (soft / 4) as usize
}

impl StoreConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(l) = &self.layout {
            l.validate()?;
        }
        if !(self.low_watermark > 0.0
            && self.low_watermark <= self.high_watermark
            && self.high_watermark <= 1.0)
        {
            return Err(Error::Config(format!(
                "watermarks must satisfy 0 < low <= high <= 1, got low {} high {}",
                self.low_watermark, self.high_watermark
            )));
        }
        if let Some(b) = self.capacity_bytes {
            if b < MIN_BLOCK_FILE_BYTES {
                return Err(Error::Config(format!(
                    "capacity of {b} bytes is smaller than the smallest block file ({MIN_BLOCK_FILE_BYTES} \
                     bytes: a 4 KiB header and one 4 KiB page of payload)"
                )));
            }
        }
        if self.capacity_files == Some(0) {
            return Err(Error::Config(
                "a capacity of 0 block files holds nothing; leave it unset for no bound".into(),
            ));
        }
        if self.max_block_size() as u64 > (1u64 << 40) {
            return Err(Error::Config("max_block_size above 1 TiB".into()));
        }
        if self.stats_interval.is_some_and(|i| i < MIN_STATS_INTERVAL) {
            return Err(Error::Config(format!(
                "a stats interval under {MIN_STATS_INTERVAL:?} rewrites STATS.json in a busy loop, got {:?}; None turns the file off",
                self.stats_interval.unwrap_or_default()
            )));
        }
        Ok(())
    }
}
