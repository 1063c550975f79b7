//! tierkv-bench: a fio-style benchmark of the tierkv block store.
//!
//! Plain (`--rw main`, the default) it runs the main job: write the blocks, read them once,
//! hot-read them through the open-file cache, and report each phase, the filesystem and
//! whether reads came from the page cache. Keys derive from the block index and the worker id,
//! so a `--rw write` run and a later `--rw read` run on the same `--dir` (separate processes)
//! use the same blocks. SIGINT/SIGTERM stop the run: the partial result is printed, the
//! temporary directory removed, and the exit status is 130.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use std::sync::{Arc, Mutex};

use tierkv::engine::PosixQueue;
use tierkv::{Belady, Oracle};
use tierkv::{
    BlockHash, BlockKey, Components, Layout, PolicyKind, Publish, Store, StoreConfig, VerifyMode,
    WorkerId,
};

#[path = "../common.rs"]
mod common;
mod instances;
mod job;
mod metadata;
mod offload;
mod replay;
mod report;
mod verify;

use common::{BoxError, UsageError, parse_duration, parse_size};
use report::{RankResult, human_bytes, report};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Rw {
    /// The main job: write every block, read every block once in a random order (each file
    /// opened), then hot-read them `--loops` - 1 more times (the open-file cache); each phase
    /// is reported, with the filesystem and whether reads came from the page cache.
    Main,
    /// Write every block, in index order.
    Write,
    /// Read every block, in index order.
    Read,
    /// Read every block once per loop, in a random order.
    Randread,
    /// Write every block once per loop, in a random order.
    Randwrite,
    /// Random reads and writes mixed per batch (`--rwmixread`), keys drawn with replacement.
    Randrw,
    /// Replay a Mooncake-format trace (`--trace`) through the store: per request, read the
    /// longest present prefix, then offer the rest (stored or touched).
    Replay,
    /// Metadata scale: per shard depth (`--layout-depths`), create `--nblocks` blocks in a
    /// fresh tree, reopen it (index rebuild), look every block up and read every block with
    /// open+read+close (`--fd-cache 0` unless given); rates per phase.
    Metadata,
    /// Write-behind: the engine thread's time per offer through the offloader while its
    /// writer saturates the disk, and the sustained throughput, against plain put_many of
    /// `--nblocks` blocks in chains of `--batch`.
    Offload,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Normal,
    Json,
}

/// A fio-style benchmark of the tierkv block store.
#[derive(Parser, Debug)]
#[command(version, long_about = None)]
struct Args {
    /// Cache root directory. Default: a fresh temporary directory, removed at exit.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the temporary directory (its path is printed).
    #[arg(long)]
    keep: bool,
    /// I/O pattern (fio's `--rw`; `main`: the main job).
    #[arg(long, value_enum, default_value_t = Rw::Main)]
    rw: Rw,
    /// Block size (fio's `--blocksize`): bytes, or with a suffix (4k = 4KiB, 64KiB, 2MiB, 1m).
    /// The default, 2 MiB, is one 16-token block of an 8B Llama (32 layers x K and V x 8 KV
    /// heads x 128 dims x 2 bytes x 16 tokens).
    #[arg(long, alias = "blocksize", default_value = "2MiB", value_parser = parse_size)]
    bs: u64,
    /// Number of blocks.
    #[arg(long, default_value_t = 256)]
    nblocks: u64,
    /// Working-set size (fio's `--size`, e.g. 1GiB): sets the number of blocks to SIZE / bs.
    #[arg(long, value_parser = parse_size, conflicts_with = "nblocks")]
    size: Option<u64>,
    /// Passes over the blocks (fio's `loops`). Default 1; the main job 4 (one read pass, then
    /// 3 hot-read passes).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    loops: Option<u64>,
    /// Stop after this long (fio's `--runtime`, e.g. 15s, 2m), whatever the loops; the main
    /// job: its hot-read phase.
    #[arg(long, value_parser = parse_duration)]
    runtime: Option<Duration>,
    /// Run this long before the figures start (fio's `--ramp_time`, e.g. 1s): the run lasts
    /// ramp + runtime, and the throughput, operations, hits, misses and latencies cover the
    /// runtime only (a read run's first pass opens and checks every file: this leaves it out).
    /// Errors and verify errors count from the start, as do the store's own counters and the
    /// operations an `--ops` budget allows. The main job ramps its hot-read phase (its text
    /// report does not say so); replay and metadata take none.
    #[arg(long = "ramp-time", alias = "ramp_time", value_parser = parse_duration, requires = "runtime")]
    ramp_time: Option<Duration>,
    /// Stop after this many block operations in all (the main job: of its hot-read phase).
    #[arg(long)]
    ops: Option<u64>,
    /// randrw: percentage of batches that read.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,
    /// How random keys are drawn: random (every block once per loop, uniform for randrw) or
    /// zipf:THETA (skewed, with replacement; THETA > 0, e.g. zipf:1.1).
    #[arg(long = "random_distribution", alias = "random-distribution", default_value = "random", value_parser = parse_distribution)]
    random_distribution: Distribution,
    /// Reads: drop the working set from the page cache first (posix_fadvise DONTNEED), to
    /// measure cold reads. --rw metadata: a second read pass after dropping the kernel's
    /// page, dentry and inode caches (root only).
    #[arg(long)]
    invalidate: bool,
    /// A progress bar on stderr: auto (when stderr is a terminal) or never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "never"])]
    progress: String,
    /// I/Os in flight (fio's iodepth): the engine's queue depth, which the store keeps full
    /// while a batch streams through it (io_uring's ring, nixl's requests; default 64). psync
    /// does one I/O at a time whatever the depth, as fio's psync does. `--queue-depth` is
    /// the same option.
    #[arg(long, alias = "queue-depth", value_parser = clap::value_parser!(u32).range(1..=4096))]
    iodepth: Option<u32>,
    /// Blocks per store call (`get_many`/`put_many`: one request's chain of blocks, the
    /// engine's request size). Latency figures are per call.
    #[arg(long, default_value_t = DEFAULT_BATCH, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 20))]
    batch: usize,
    /// Threads running the job at once on one store (fio's numjobs): reads each go over all
    /// blocks in their own order; writes split the blocks between them.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    numjobs: usize,
    /// Worker id (tensor-parallel rank).
    #[arg(long, default_value = "0")]
    worker: WorkerId,
    /// Tensor-parallel ranks: N stores (worker ids 0 to N-1) on one root, each with the same
    /// block hashes and its own --numjobs threads.
    #[arg(long, conflicts_with = "worker", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    workers: Option<usize>,
    /// Shard directory levels (0 = one flat directory). Default: the tree's, else 2.
    #[arg(long)]
    layout_depth: Option<u8>,
    /// --rw metadata: the shard depths to compare, comma-separated (default 0,1,2).
    #[arg(long, value_delimiter = ',', conflicts_with = "layout_depth")]
    layout_depths: Vec<u8>,
    /// Directories per shard level: 16, 256 or 4096 (default 256); with --layout-depth or
    /// --layout-depths.
    #[arg(long)]
    layout_fanout: Option<u32>,
    /// Open-file cache size (0 = open and close the file on every access).
    #[arg(long)]
    fd_cache: Option<usize>,
    /// Checksum verification on reads: on-open (the default: the first read through each opened file), after-reboot (as on-open, trusting files this machine wrote since its boot), always, never.
    #[arg(long, default_value = "on-open")]
    verify: VerifyMode,
    /// Threads one large get_many reads on (the store's read_threads; default 2, 1 = the
    /// calling thread only).
    #[arg(long, default_value_t = tierkv::DEFAULT_READ_THREADS)]
    read_threads: usize,
    /// How puts publish files: rename (temp file + rename) or tmpfile (O_TMPFILE + linkat).
    #[arg(long, default_value = "rename")]
    publish: Publish,
    /// I/O engine: psync, io_uring, auto (io_uring where the kernel allows it), nixl.
    #[arg(long, default_value = "psync")]
    ioengine: tierkv::engine::EngineKind,
    /// Use O_DIRECT (fio's `--direct`, also as `--direct=1`; `--direct=0` is off).
    #[arg(long, num_args = 0..=1, default_value = "0", default_missing_value = "1",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    direct: bool,
    /// Puts of blocks of at least this size write with O_DIRECT, reads stay buffered
    /// (tierkv's default: 2m; 0: never, unless --direct).
    #[arg(long, value_parser = parse_size)]
    direct_puts_from: Option<u64>,
    /// The nixl engine's POSIX queue: libaio (NIXL's default), uring, or posix-aio.
    #[arg(long)]
    nixl_posix_queue: Option<PosixQueue>,
    /// Capacity of the worker's block files on disk (e.g. 10GiB); evicts beyond it.
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Capacity in block files.
    #[arg(long)]
    capacity_blocks: Option<u64>,
    /// Eviction watermarks HIGH,LOW as fractions of the capacity (the store's default
    /// 0.95,0.90: a background thread evicts from HIGH down to LOW; 1,1 evicts only inline,
    /// exactly at the bound). Only with `--reuse-evicted false`, or where reuse is off.
    #[arg(long, value_parser = parse_watermarks)]
    watermarks: Option<(f64, f64)>,
    /// Write the blocks a put evicts for into the evicted files: true (the store's default,
    /// `reuse_evicted`: where the filesystem grants write leases, evictions are made inline
    /// by puts and the watermarks do nothing) or false (evicted files are unlinked, the
    /// background evictor runs). A bare `--reuse-evicted` is true.
    #[arg(long, value_name = "BOOL", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    reuse_evicted: bool,
    /// Keep the worker's event journal (`StoreConfig::events`, docs/events.md): every put and
    /// eviction batch appends its events under the journal's lock.
    #[arg(long)]
    events: bool,
    /// Eviction policy: adaptive (default), lru, admit2, arc; belady (replay only: knows the
    /// trace).
    #[arg(long, default_value = "adaptive")]
    policy: String,
    /// The trace to replay (JSON lines with `hash_ids`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replay only: write through the write-behind offloader with this admission filter,
    /// `all` or `second-offer[:WINDOW]` (a block is written on its second offer within
    /// WINDOW offered blocks); each request's offer is flushed before the next request.
    #[arg(long)]
    write_filter: Option<tierkv::FilterKind>,
    /// `--rw offload`: the offloader's bound on bytes in flight (default 512MiB).
    #[arg(long, value_parser = parse_size)]
    offload_queue: Option<u64>,
    /// Reads: don't write missing blocks first (they count as misses).
    #[arg(long)]
    no_layout: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Normal)]
    output_format: OutputFormat,
    /// Compare every byte of every hit with the payload its key and write generation give
    /// (fio's --verify): a torn, stale or swapped block is a verify error, logged with its
    /// path, and fails the run. Off by default (it costs a comparison per byte read).
    #[arg(long)]
    verify_data: bool,
    /// Block i of the run is block i + N of the worker's key space: a run with
    /// `--key-offset N` after one with N blocks writes new blocks, not replacements (a full
    /// store then evicts on every put).
    #[arg(long, default_value_t = 0, conflicts_with = "verify_data")]
    key_offset: u64,
    /// fdatasync each block file before it is published, and its directory after (fio's
    /// `--fdatasync=1`; the store's `sync_writes`).
    #[arg(long)]
    sync_writes: bool,
    /// How the store holds its worker directory: exclusive (alone; the default) or shared
    /// (with other stores, other processes or nodes: docs/shared.md). Shared, every block's
    /// payload is its key's alone (no write generations: a put never replaces a block).
    #[arg(long, default_value = "exclusive")]
    sharing: tierkv::Sharing,
    /// Shared mode: how long a key found absent in the tree counts as absent (e.g. 1s, 0s).
    #[arg(long, value_parser = parse_duration)]
    negative_ttl: Option<Duration>,
    /// Runs N processes of this job at once on one worker directory, in shared mode (each
    /// with --sharing shared): reads go over every block, writes split the blocks between
    /// them. Reports each instance and the totals (`hits`, `errors`, `verify_errors`).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    instances: Option<usize>,
    /// One instance of an --instances run: I/N (set by the parent process).
    #[arg(long, hide = true, value_parser = instances::parse_instance)]
    instance: Option<(usize, usize)>,
    /// An --instances child starts its job at this time (ms since the epoch), so the
    /// instances overlap.
    #[arg(long, hide = true)]
    start_at_ms: Option<u64>,
}

/// Blocks per store call unless `--batch` says otherwise: one request's worth of 16-token
/// blocks (1,024 tokens).
const DEFAULT_BATCH: usize = 64;

impl Args {
    /// Directories per shard level.
    fn fanout(&self) -> u32 {
        self.layout_fanout.unwrap_or(256)
    }

    /// Passes over the blocks.
    fn loops(&self) -> u64 {
        self.loops
            .unwrap_or(if self.rw == Rw::Main { 4 } else { 1 })
    }
}

/// Set by SIGINT or SIGTERM: the run stops, reports what it did and exits 130.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The temporary directory of this run (removed by the signal handler's last resort).
static TEMP_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Exit status after SIGINT/SIGTERM (128 + SIGINT, as a shell reports it).
const EXIT_INTERRUPTED: u8 = 130;

/// Seconds the run has to stop by itself after a signal before the handler removes the
/// temporary directory and exits.
const STOP_GRACE: Duration = Duration::from_secs(10);

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// SIGINT/SIGTERM: the first asks the run to stop (it reports and cleans up); a second one,
/// or a run that has not stopped within [`STOP_GRACE`], removes the temporary directory and
/// exits at once.
fn install_signal_handler() -> Result<(), BoxError> {
    ctrlc::set_handler(|| {
        let last_resort = || {
            if let Some(root) = TEMP_ROOT.get() {
                let _ = std::fs::remove_dir_all(root);
            }
            eprintln!("tierkv-bench: interrupted");
            std::process::exit(EXIT_INTERRUPTED.into());
        };
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            last_resort();
        }
        eprintln!("tierkv-bench: interrupted: stopping (the partial result follows)");
        std::thread::spawn(move || {
            std::thread::sleep(STOP_GRACE);
            last_resort();
        });
    })
    .map_err(|e| format!("cannot handle SIGINT/SIGTERM: {e}").into())
}

/// How keys are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Distribution {
    Random,
    Zipf(f64),
}

fn parse_distribution(s: &str) -> Result<Distribution, String> {
    match s.split_once(':') {
        None if s == "random" => Ok(Distribution::Random),
        Some(("zipf", t)) => match t.parse::<f64>() {
            Ok(theta) if theta > 0.0 && theta.is_finite() => Ok(Distribution::Zipf(theta)),
            _ => Err(format!(
                "bad zipf theta {t:?}: a positive number, e.g. zipf:1.1"
            )),
        },
        _ => Err(format!(
            "unknown distribution {s:?}; use random or zipf:THETA"
        )),
    }
}

/// When every job stops: a deadline and an operation budget shared by all jobs.
struct Budget {
    deadline: Option<Instant>,
    /// When the figures start (`--ramp-time`): a job resets its timed figures at the first
    /// batch after it.
    ramp_end: Option<Instant>,
    ops_left: Option<std::sync::atomic::AtomicI64>,
    progress: indicatif::ProgressBar,
}

impl Budget {
    /// No limit but the loops (and a signal).
    fn unlimited() -> Budget {
        Budget {
            deadline: None,
            ramp_end: None,
            ops_left: None,
            progress: indicatif::ProgressBar::hidden(),
        }
    }

    /// Takes up to `want` operations; 0 when the run is over.
    fn take(&self, want: usize) -> usize {
        if interrupted() || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        match &self.ops_left {
            None => want,
            Some(left) => {
                let before = left.fetch_sub(want as i64, std::sync::atomic::Ordering::Relaxed);
                before.clamp(0, want as i64) as usize
            }
        }
    }
}

/// The hash of block `index` of `worker`.
fn block_hash(worker: &str, index: u64) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(b"tierkv-bench.v1");
    h.update(worker.as_bytes());
    h.update(&[0]);
    h.update(&index.to_le_bytes());
    BlockHash(*h.finalize().as_bytes())
}

/// The payload of block `index` (hash `hash`) at write generation `generation`: stamps on
/// [`verify::FILL`] bytes (see the verify module).
fn fill_block(buf: &mut [u8], hash: &BlockHash, index: u64, generation: u64) {
    verify::fill(buf, hash, index, generation);
}

/// One direction's figures, like fio's read and write sections.
struct Dir {
    /// Operations that succeeded (a miss is a successful read); failed ones are `errors`.
    ops: u64,
    bytes: u64,
    errors: u64,
    /// The first failure's message.
    first_error: Option<String>,
    /// Latency per store call, in nanoseconds up to an hour.
    lat: Histogram<u64>,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            ops: 0,
            bytes: 0,
            errors: 0,
            first_error: None,
            lat: Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram"),
        }
    }

    /// Empty timed figures (operations, bytes, latencies) that keep `d`'s errors: the start
    /// of the figures after `--ramp-time`.
    fn restart(d: &Dir) -> Dir {
        Dir {
            errors: d.errors,
            first_error: d.first_error.clone(),
            ..Dir::new()
        }
    }

    fn merge(&mut self, o: &Dir) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
        self.lat.add(&o.lat).expect("same bounds");
    }

    /// Counts a failed operation.
    fn error(&mut self, e: &tierkv::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

/// What one job (or several, merged) did.
struct Run {
    read: Dir,
    write: Dir,
    hits: u64,
    misses: u64,
    /// Hits whose bytes were not the block's (`--verify-data`).
    verify_errors: u64,
    elapsed: Duration,
}

impl Run {
    /// Nothing done yet.
    fn empty() -> Run {
        Run {
            read: Dir::new(),
            write: Dir::new(),
            hits: 0,
            misses: 0,
            verify_errors: 0,
            elapsed: Duration::ZERO,
        }
    }

    /// Adds the figures of a job that ran at the same time.
    fn merge(&mut self, o: &Run) {
        self.read.merge(&o.read);
        self.write.merge(&o.write);
        self.hits += o.hits;
        self.misses += o.misses;
        self.verify_errors += o.verify_errors;
        self.elapsed = self.elapsed.max(o.elapsed);
    }

    fn ops(&self) -> u64 {
        self.read.ops + self.write.ops
    }

    fn errors(&self) -> u64 {
        self.read.errors + self.write.errors
    }
}

/// One worker (tensor-parallel rank): its store and its keys.
struct Rank {
    store: Store,
    keys: Vec<BlockKey>,
    /// The write generation of each block.
    gens: verify::Gens,
}

/// `HIGH,LOW`: two fractions of the capacity, 0 < LOW <= HIGH <= 1.
fn parse_watermarks(s: &str) -> Result<(f64, f64), String> {
    let (h, l) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected HIGH,LOW (e.g. 0.95,0.90)"))?;
    let f = |v: &str| {
        v.trim()
            .parse::<f64>()
            .map_err(|e| format!("{v:?} in {s:?}: {e}"))
    };
    let (h, l) = (f(h)?, f(l)?);
    if !(l > 0.0 && l <= h && h <= 1.0) {
        return Err(format!("{s:?}: need 0 < LOW <= HIGH <= 1"));
    }
    Ok((h, l))
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    if let Err(e) = install_signal_handler() {
        return common::exit_for("tierkv-bench", &e);
    }
    match run(&args) {
        Ok(()) if interrupted() => ExitCode::from(EXIT_INTERRUPTED),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if interrupted() => {
            eprintln!("tierkv-bench: {e}");
            ExitCode::from(EXIT_INTERRUPTED)
        }
        Err(e) => common::exit_for("tierkv-bench", &e),
    }
}

/// What one phase of a run is: its pattern and passes.
#[derive(Clone, Copy)]
struct Spec {
    rw: Rw,
    /// Passes over the blocks (ignored when `limited`).
    loops: u64,
    /// Passes repeat until the runtime or the operation budget runs out (fio's time_based).
    limited: bool,
}

/// The figures of one phase of the main job (or of the whole run otherwise).
pub(crate) struct Phase {
    /// `write`, `read`, `hot_read`, or the run's pattern.
    pub(crate) name: &'static str,
    /// What it is, for the text report.
    pub(crate) what: String,
    pub(crate) ranks: Vec<RankResult>,
}

/// Checks option combinations that clap cannot express; usage errors (exit 2).
fn check_usage(args: &Args) -> Result<(), UsageError> {
    if args.layout_fanout.is_some() && args.layout_depth.is_none() && args.rw != Rw::Metadata {
        return Err(UsageError(
            "--layout-fanout needs --layout-depth (a new tree's shard levels; an existing \
             tree keeps its own layout)"
                .into(),
        ));
    }
    if !args.layout_depths.is_empty() && args.rw != Rw::Metadata {
        return Err(UsageError("--layout-depths is for --rw metadata".into()));
    }
    if args.workers.is_some() && matches!(args.rw, Rw::Replay | Rw::Metadata) {
        return Err(UsageError(format!(
            "--workers is not for --rw {}: it runs one store",
            format!("{:?}", args.rw).to_lowercase()
        )));
    }
    if args.ramp_time.is_some() && matches!(args.rw, Rw::Replay | Rw::Metadata) {
        return Err(UsageError(format!(
            "--ramp-time is for the block-I/O patterns, not --rw {}",
            format!("{:?}", args.rw).to_lowercase()
        )));
    }
    if args.rw == Rw::Main && args.no_layout {
        return Err(UsageError(
            "--no-layout is for --rw read/randread/randrw: the main job writes its blocks".into(),
        ));
    }
    Ok(())
}

/// The cache root of a run: `--dir`, or a fresh temporary directory (removed when the guard
/// drops, and by the signal handler's last resort; kept with `--keep`).
fn run_root(args: &Args) -> Result<(PathBuf, Option<tempfile::TempDir>), BoxError> {
    if let Some(d) = &args.dir {
        return Ok((d.clone(), None));
    }
    let tmp = tempfile::Builder::new().prefix("tierkv-bench.").tempdir()?;
    if args.keep {
        return Ok((tmp.keep(), None));
    }
    let _ = TEMP_ROOT.set(tmp.path().to_path_buf());
    Ok((tmp.path().to_path_buf(), Some(tmp)))
}

/// The whole run: options checked, the working set and the stores set up, the job run and
/// reported, and its failures turned into the exit status.
fn run(args: &Args) -> Result<(), BoxError> {
    check_usage(args)?;
    if let Some(n) = args.instances {
        return instances::run_instances(args, n);
    }
    let (bs, nblocks) = working_set(args)?;
    let (root, _tmp) = run_root(args)?;
    let config = store_config(args, bs)?;
    let (config, parts, oracle) = policy(args, config)?;
    let config = check_replay(args, config)?;
    match args.rw {
        Rw::Metadata => return metadata::scale(args, &root, &config, bs, nblocks),
        Rw::Offload => return offload::offload(args, &config, &root, bs, nblocks),
        Rw::Replay => return run_replay(args, &root, config, parts, oracle.as_ref(), bs),
        _ => {}
    }
    let bench = Bench::open(args, &root, &config, bs, nblocks)?;
    bench.prepare()?;
    instances::wait_for_start(args);
    let phases = if args.rw == Rw::Main {
        bench.main_job()?
    } else {
        bench.pattern()?
    };
    if args.keep && args.dir.is_none() {
        eprintln!("tierkv-bench: kept {}", root.display());
    }
    if interrupted() {
        return Ok(());
    }
    check_failures(&phases)
}

/// The block size and the number of blocks (`--bs`, `--nblocks` or `--size`), within the
/// bench's limits and, but for a replay (its trace sets its needs), the memory there is.
fn working_set(args: &Args) -> Result<(usize, u64), BoxError> {
    let bs = usize::try_from(args.bs)?;
    let nblocks = match args.size {
        Some(size) if bs == 0 || size < bs as u64 => {
            return Err(UsageError(format!(
                "--size {size} is smaller than one block of --bs {bs}"
            ))
            .into());
        }
        Some(size) => size / bs as u64,
        None => args.nblocks,
    };
    if nblocks == 0 {
        return Err(UsageError("the working set has no blocks".into()).into());
    }
    if bs > MAX_BS {
        return Err(UsageError(format!(
            "--bs {} is over the largest block this bench runs, {} (the store's limit is 1 TiB, \
             the bench holds --batch blocks per job in memory)",
            human_bytes(bs as f64),
            human_bytes(MAX_BS as f64)
        ))
        .into());
    }
    let nranks = args.workers.unwrap_or(1);
    if !matches!(args.rw, Rw::Replay) {
        check_memory(&memory_need(args, bs, nblocks, nranks))?;
    }
    Ok((bs, nblocks))
}

/// The stores' configuration from the options (the policy aside: [`policy`]).
fn store_config(args: &Args, bs: usize) -> Result<StoreConfig, BoxError> {
    let mut config = StoreConfig::new()
        .with_verify(args.verify)
        .with_read_threads(args.read_threads)
        .with_direct_io(args.direct)
        .with_sync_writes(args.sync_writes)
        .with_publish(args.publish)
        .with_engine(args.ioengine);
    if let Some(b) = args.direct_puts_from {
        config = config.with_direct_puts_from((b > 0).then_some(b as usize));
    }
    if let Some(q) = args.iodepth {
        config = config.with_queue_depth(q);
    }
    config = config.with_sharing(args.sharing);
    if let Some(t) = args.negative_ttl {
        config = config.with_negative_ttl(t);
    }
    if let Some(q) = args.nixl_posix_queue {
        config = config.with_nixl_posix_queue(q);
    }
    if let Some(d) = args.layout_depth {
        config = config.with_layout(Layout::new(d, args.fanout())?);
    }
    if let Some(n) = args.fd_cache {
        config = config.with_fd_cache(n);
    }
    config = config.with_max_block_size(bs.max(tierkv::DEFAULT_MAX_BLOCK_SIZE));
    if let Some(c) = args.capacity {
        config = config.with_capacity_bytes(c);
    }
    if let Some(c) = args.capacity_blocks {
        config = config.with_capacity_files(c);
    }
    if let Some((high, low)) = args.watermarks {
        config = config.with_watermarks(high, low);
    }
    Ok(config
        .with_reuse_evicted(args.reuse_evicted)
        .with_events(args.events))
}

/// The Belady oracle a replay feeds the trace's future to.
type SharedOracle = Arc<Mutex<Oracle>>;

/// `--policy`: a policy of the configuration, or (belady, replay only) a part of the store,
/// with the oracle that the replay keeps up to date.
fn policy(
    args: &Args,
    mut config: StoreConfig,
) -> Result<(StoreConfig, Components, Option<SharedOracle>), BoxError> {
    let mut parts = Components::new();
    let mut oracle = None;
    if args.policy == "belady" {
        if args.rw != Rw::Replay {
            return Err(UsageError(
                "--policy belady needs --rw replay (it reads the future from the trace)".into(),
            )
            .into());
        }
        let o = Arc::new(Mutex::new(Oracle::default()));
        parts = parts.with_policy(Box::new(Belady::new(o.clone())));
        oracle = Some(o);
    } else {
        config = config.with_policy(
            args.policy
                .parse::<PolicyKind>()
                .map_err(|e| UsageError(e.to_string()))?,
        );
    }
    Ok((config, parts, oracle))
}

/// The options of `--rw replay` (one stream, a trace), there and nowhere else; a replay's
/// configuration.
fn check_replay(args: &Args, config: StoreConfig) -> Result<StoreConfig, BoxError> {
    if args.rw != Rw::Replay {
        if args.trace.is_some() || args.write_filter.is_some() {
            return Err(
                UsageError("--trace and --write-filter are only for --rw replay".into()).into(),
            );
        }
        return Ok(config);
    }
    if args.numjobs > 1 {
        return Err(
            UsageError("--rw replay runs one request stream: --numjobs must be 1".into()).into(),
        );
    }
    if args.trace.is_none() {
        return Err(UsageError("--rw replay needs --trace FILE".into()).into());
    }
    // Replay evicts exactly at the bound, so figures compare across policies.
    Ok(config.with_watermarks(1.0, 1.0))
}

/// `--rw replay`: the trace through one store, and its report.
fn run_replay(
    args: &Args,
    root: &Path,
    config: StoreConfig,
    parts: Components,
    oracle: Option<&SharedOracle>,
    bs: usize,
) -> Result<(), BoxError> {
    let store = Store::open_with(root, args.worker.clone(), config, parts)?;
    let trace = args.trace.as_ref().expect("checked above");
    let r = replay::replay(
        &store,
        trace,
        bs,
        oracle,
        args.verify_data,
        args.write_filter,
    )?;
    replay::report_replay(args, &store, root, &r)
}

/// A block-I/O run (the main job or one pattern): its stores and keys, and what each of its
/// phases needs.
struct Bench<'a> {
    args: &'a Args,
    root: &'a Path,
    bs: usize,
    nblocks: u64,
    ranks: Vec<Rank>,
    /// The worker id of each rank.
    ids: Vec<WorkerId>,
}

impl<'a> Bench<'a> {
    /// Opens the store of every rank and derives its keys.
    fn open(
        args: &'a Args,
        root: &'a Path,
        config: &StoreConfig,
        bs: usize,
        nblocks: u64,
    ) -> Result<Bench<'a>, BoxError> {
        // Without --workers: one store. With --workers N: N stores (worker ids 0 to N-1) on
        // one root, all with the same block hashes (those of --worker, default 0, so rank 0 of
        // a --workers run and a plain run use the same blocks), as tensor-parallel ranks store
        // their shards of one block.
        let namespace = args.worker.as_str().to_owned();
        let ids = match args.workers {
            None => vec![args.worker.clone()],
            Some(n) => (0..n)
                .map(|r| WorkerId::new(&r.to_string()))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let mut ranks = Vec::with_capacity(ids.len());
        for id in &ids {
            let store = Store::open(root, id.clone(), config.clone())?;
            let mut keys = Vec::new();
            keys.try_reserve_exact(usize::try_from(nblocks)?)
                .map_err(|_| UsageError(format!("no memory for the keys of {nblocks} blocks")))?;
            keys.extend(
                (0..nblocks).map(|i| store.key(block_hash(&namespace, i + args.key_offset))),
            );
            let gens = if args.sharing == tierkv::Sharing::Shared {
                verify::Gens::content_addressed(keys.len())
            } else {
                verify::Gens::new(root, id.as_str(), keys.len(), args.verify_data)
            };
            ranks.push(Rank { store, keys, gens });
        }
        Ok(Bench {
            args,
            root,
            bs,
            nblocks,
            ranks,
            ids,
        })
    }

    /// Before a read pattern: checks the block size of `--dir`, lays out the missing blocks
    /// and (`--invalidate`) drops them from the page cache.
    fn prepare(&self) -> Result<(), BoxError> {
        let args = self.args;
        let reads = matches!(args.rw, Rw::Read | Rw::Randread | Rw::Randrw);
        for r in &self.ranks {
            if reads {
                check_block_size(&r.store, &r.keys, self.bs, args.dir.as_deref())?;
            }
            if reads && !args.no_layout {
                lay_out(&r.store, &r.keys, &r.gens, self.bs)?;
            }
            if reads && args.invalidate {
                invalidate(&r.store, &r.keys)?;
            }
        }
        Ok(())
    }

    /// Runs one phase on every rank.
    fn phase(&self, spec: Spec, budget: &Budget) -> Vec<RankResult> {
        job::run_phase(&self.ranks, &self.ids, self.bs, self.args, spec, budget)
    }

    /// The main job: write every block, read each once, hot-read them; reported phase by
    /// phase.
    fn main_job(self) -> Result<Vec<Phase>, BoxError> {
        let args = self.args;
        let limited = args.runtime.is_some() || args.ops.is_some();
        let loops = args.loops();
        let mut phases = vec![Phase {
            name: "write",
            what: "every block once".into(),
            ranks: self.phase(
                Spec {
                    rw: Rw::Write,
                    loops: 1,
                    limited: false,
                },
                &Budget::unlimited(),
            ),
        }];
        let mut resident = None;
        if !interrupted() {
            if args.invalidate {
                for r in &self.ranks {
                    invalidate(&r.store, &r.keys)?;
                }
            }
            resident = page_cache_resident(&self.ranks[0].store, &self.ranks[0].keys, self.bs);
            phases.push(Phase {
                name: "read",
                what: "every block once, random order: opens every file".into(),
                ranks: self.phase(
                    Spec {
                        rw: Rw::Randread,
                        loops: 1,
                        limited: false,
                    },
                    &Budget::unlimited(),
                ),
            });
        }
        if !interrupted() && (loops > 1 || limited) {
            phases.push(self.hot_read(loops, limited));
        }
        let env = Environment {
            filesystem: filesystem_name(self.root),
            page_cache_resident: resident,
        };
        let (root, nblocks) = (self.root, self.nblocks);
        let (engine, layout) = self.close()?;
        report::report_main(args, engine, layout, root, nblocks, &phases, &env)?;
        Ok(phases)
    }

    /// The main job's hot-read phase: the passes after the first read, through the open-file
    /// cache, until `--loops`, `--runtime` or `--ops`.
    fn hot_read(&self, loops: u64, limited: bool) -> Phase {
        let budget = budget(
            self.args,
            &self.ranks,
            Rw::Randread,
            loops - 1,
            self.nblocks,
        );
        let what = if limited {
            "passes until --runtime/--ops, through the open-file cache".to_string()
        } else {
            format!("{} more passes, through the open-file cache", loops - 1)
        };
        let phase = Phase {
            name: "hot_read",
            what,
            ranks: self.phase(
                Spec {
                    rw: Rw::Randread,
                    loops: loops - 1,
                    limited,
                },
                &budget,
            ),
        };
        budget.progress.finish_and_clear();
        phase
    }

    /// One pattern (`--rw` other than main) as a single phase, reported.
    fn pattern(self) -> Result<Vec<Phase>, BoxError> {
        let args = self.args;
        let limited = args.runtime.is_some() || args.ops.is_some();
        let loops = args.loops();
        let budget = budget(args, &self.ranks, args.rw, loops, self.nblocks);
        let spec = Spec {
            rw: args.rw,
            loops,
            limited,
        };
        let results = self.phase(spec, &budget);
        budget.progress.finish_and_clear();
        let (root, nblocks) = (self.root, self.nblocks);
        let (engine, layout) = self.close()?;
        report(args, engine, layout, root, nblocks, &results)?;
        Ok(vec![Phase {
            name: "run",
            what: String::new(),
            ranks: results,
        }])
    }

    /// Keeps (or forgets) the write generations and closes the stores, before the report;
    /// the engine and layout they ran with.
    fn close(self) -> Result<(&'static str, Layout), BoxError> {
        keep_generations(self.args, &self.ranks)?;
        let engine = self.ranks[0].store.engine_name();
        let layout = self.ranks[0].store.layout();
        drop(self.ranks);
        Ok((engine, layout))
    }
}

/// The exit status of a run that was not interrupted: failed operations and blocks that read
/// back wrong are errors.
fn check_failures(phases: &[Phase]) -> Result<(), BoxError> {
    // Failed operations are errors, not IOPS: a run with any exits 1.
    let (mut errors, mut ok, mut verify_errors) = (0, 0, 0);
    let mut first = None;
    for r in phases.iter().flat_map(|p| &p.ranks) {
        verify_errors += r.run.verify_errors;
        errors += r.run.errors();
        ok += r.run.ops();
        for d in [&r.run.read, &r.run.write] {
            if first.is_none() {
                first.clone_from(&d.first_error);
            }
        }
    }
    if verify_errors > 0 {
        return Err(format!(
            "--verify-data: {verify_errors} blocks read back with bytes that were not theirs \
             (see the log for their paths)"
        )
        .into());
    }
    if errors > 0 {
        return Err(format!(
            "{errors} of {} operations failed (first: {})",
            errors + ok,
            first.unwrap_or_default()
        )
        .into());
    }
    Ok(())
}

/// Saves the blocks' write generations for a later `--verify-data` run, or (a run that wrote
/// without tracking them) forgets the saved ones.
fn keep_generations(args: &Args, ranks: &[Rank]) -> Result<(), BoxError> {
    for r in ranks {
        if args.verify_data {
            r.gens.save()?;
        } else if r.store.stats().puts > 0 {
            r.gens.forget()?;
        }
    }
    Ok(())
}

/// The largest `--bs`: a block the bench holds `--batch` of per job (the store's own limit
/// is 1 TiB).
const MAX_BS: usize = 16 << 30;

/// Bytes a run will hold in memory, and what for.
struct MemoryNeed {
    bytes: u128,
    what: String,
}

/// The memory a run of these options allocates: block buffers per job, keys and orders per
/// block (an estimate; the store's index adds its own).
fn memory_need(args: &Args, bs: usize, nblocks: u64, nranks: usize) -> MemoryNeed {
    let jobs = (nranks * args.numjobs) as u128;
    let both = matches!(args.rw, Rw::Randrw) as u128 + 1;
    let buffers = jobs * args.batch as u128 * bs as u128 * both;
    // Per block: its key per rank, its slot in each job's order, a Zipf weight, the index.
    let per_block = (std::mem::size_of::<BlockKey>() as u128 + 128) * nranks as u128 + 16 * jobs;
    let blocks = nblocks as u128 * per_block;
    MemoryNeed {
        bytes: buffers + blocks,
        what: format!(
            "{jobs} job(s) x --batch {} x --bs {} of buffers ({}) and {nblocks} blocks' keys \
             and index ({})",
            args.batch,
            human_bytes(bs as f64),
            human_bytes(buffers as f64),
            human_bytes(blocks as f64)
        ),
    }
}

/// The memory this process may still take: the least of MemAvailable, the address-space
/// limit (RLIMIT_AS) and the cgroup's memory.max headroom; with what bounds it.
fn memory_limit() -> Option<(u128, &'static str)> {
    let mut best: Option<(u128, &'static str)> = None;
    let mut consider = |v: u128, what: &'static str| {
        if best.is_none_or(|(b, _)| v < b) {
            best = Some((v, what));
        }
    };
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u128>().ok())
    });
    if let Some(kb) = available {
        consider(kb * 1024, "MemAvailable in /proc/meminfo");
    }
    if let Some(cur) = rustix::process::getrlimit(rustix::process::Resource::As).current {
        consider(
            cur as u128,
            "the address-space limit (RLIMIT_AS, ulimit -v)",
        );
    }
    let cg = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|v| v.trim().parse::<u128>().ok())
    };
    if let (Some(max), Some(cur)) = (cg("memory.max"), cg("memory.current")) {
        consider(max.saturating_sub(cur), "the cgroup's memory.max");
    }
    best
}

/// Refuses a run whose buffers exceed the memory it can have (a usage error, not an
/// allocation abort).
fn check_memory(need: &MemoryNeed) -> Result<(), UsageError> {
    match memory_limit() {
        Some((limit, what)) if need.bytes > limit => Err(UsageError(format!(
            "this run needs about {} of memory ({}), more than {what} allows ({}): lower --bs, \
             --batch, --numjobs or --nblocks",
            human_bytes(need.bytes as f64),
            need.what,
            human_bytes(limit as f64)
        ))),
        _ => Ok(()),
    }
}

/// A read of a `--dir` written with another `--bs` would read other-sized blocks under this
/// run's label: refused, naming the size found.
fn check_block_size(
    store: &Store,
    keys: &[BlockKey],
    bs: usize,
    dir: Option<&Path>,
) -> Result<(), BoxError> {
    let Some(dir) = dir else { return Ok(()) };
    let present = store.contains_many(&keys[..keys.len().min(64)]);
    let Some(i) = present.iter().position(|p| matches!(p, Ok(true))) else {
        return Ok(());
    };
    let path = store.path_of(&keys[i].hash);
    let mut head = [0u8; tierkv::format::HEADER_LEN];
    let f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    rustix::io::pread(&f, &mut head, 0).map_err(|e| format!("{}: {e}", path.display()))?;
    let Ok(h) = tierkv::format::Header::decode(&head) else {
        return Ok(()); // a bad block is the store's to count as a miss
    };
    if h.payload_len != bs as u64 {
        return Err(UsageError(format!(
            "--dir {} holds blocks of {} bytes for worker {} (block {i}), this run's --bs is {} \
             ({bs} bytes): use --bs {} or another --dir",
            dir.display(),
            h.payload_len,
            store.worker(),
            human_bytes(bs as f64),
            h.payload_len
        ))
        .into());
    }
    Ok(())
}

/// Where the blocks are and whether reads met the device: for the main job's report.
pub(crate) struct Environment {
    /// The filesystem the root is on (statfs's f_type), e.g. ext4, tmpfs, xfs.
    pub(crate) filesystem: String,
    /// The fraction of the sampled blocks' bytes in the page cache before the first read;
    /// None where it cannot be told.
    pub(crate) page_cache_resident: Option<f64>,
}

/// The name of the filesystem holding `path`, from statfs's f_type.
fn filesystem_name(path: &Path) -> String {
    let Ok(s) = rustix::fs::statfs(path) else {
        return "unknown".into();
    };
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let magic = s.f_type as i64 as u32;
    match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0x6573_5546 => "fuse",
        0x8584_58F6 => "ramfs",
        0xFE53_4D42 | 0xFF53_4D42 => "cifs",
        0x00C3_6400 => "ceph",
        0x0BD0_0BD0 => "lustre",
        0x0102_1997 => "9p",
        other => return format!("unknown (f_type {other:#x})"),
    }
    .into()
}

/// The fraction of up to 32 sampled blocks' payload bytes in the page cache, by reads that
/// may not wait for the device (`preadv2` with `RWF_NOWAIT`: they return what is cached and
/// bring nothing in). None where the filesystem does not support such reads or with
/// O_DIRECT (the cache is bypassed).
fn page_cache_resident(store: &Store, keys: &[BlockKey], bs: usize) -> Option<f64> {
    let step = keys.len().div_ceil(32).max(1);
    let mut buf = vec![0u8; bs];
    let (mut cached, mut total) = (0u64, 0u64);
    for k in keys.iter().step_by(step) {
        let f = std::fs::File::open(store.path_of(&k.hash)).ok()?;
        let mut off = 0usize;
        while off < bs {
            let mut slice = [std::io::IoSliceMut::new(&mut buf[off..])];
            match rustix::io::preadv2(
                &f,
                &mut slice,
                tierkv::format::PAYLOAD_OFFSET + off as u64,
                rustix::io::ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) => break,
                Ok(n) => off += n,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(_) => return None,
            }
        }
        cached += off as u64;
        total += bs as u64;
    }
    (total > 0).then(|| cached as f64 / total as f64)
}

/// A run's budget: its deadline and operation count, and a progress bar.
fn budget(args: &Args, ranks: &[Rank], rw: Rw, loops: u64, nblocks: u64) -> Budget {
    let progress = if args.progress == "auto" && std::io::stderr().is_terminal() {
        let per_rank = match rw {
            // Writes split the blocks between a rank's jobs.
            Rw::Write | Rw::Randwrite => loops.saturating_mul(nblocks),
            _ => loops
                .saturating_mul(nblocks)
                .saturating_mul(args.numjobs as u64),
        };
        let total = args
            .ops
            .unwrap_or(per_rank.saturating_mul(ranks.len() as u64));
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {pos}/{len} ops {per_sec} [{elapsed_precise}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let now = Instant::now();
    let ramp_end = args.ramp_time.map(|r| now + r);
    Budget {
        deadline: args.runtime.map(|d| ramp_end.unwrap_or(now) + d),
        ramp_end,
        ops_left: args
            .ops
            .map(|n| std::sync::atomic::AtomicI64::new(n.min(i64::MAX as u64) as i64)),
        progress,
    }
}

/// Writes the blocks that are missing (fio's "laying out IO file").
fn lay_out(
    store: &Store,
    keys: &[BlockKey],
    gens: &verify::Gens,
    bs: usize,
) -> Result<(), BoxError> {
    let present = store.contains_many(keys);
    let missing: Vec<usize> = present
        .iter()
        .enumerate()
        .filter(|(_, p)| !matches!(p, Ok(true)))
        .map(|(i, _)| i)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "tierkv-bench: laying out {} blocks of {bs} bytes for worker {}",
        missing.len(),
        store.worker()
    );
    let mut data = vec![0xA5u8; bs];
    for &i in &missing {
        if interrupted() {
            return Err("interrupted while laying out the blocks".into());
        }
        let g = gens.next(i);
        fill_block(&mut data, &keys[i].hash, i as u64, g);
        store.put(&keys[i], &data)?;
        gens.commit(i, g);
    }
    Ok(())
}

/// Runs `job` on `n` threads at once; their results in job order.
fn parallel<T: Send>(n: usize, job: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|j| {
                let job = &job;
                s.spawn(move || job(j))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench job panicked"))
            .collect()
    })
}

/// Drops the working set's blocks from the page cache (posix_fadvise DONTNEED), so that the
/// reads that follow come from the device. Each file is synced first: DONTNEED leaves dirty
/// pages (blocks just written) in the cache.
fn invalidate(store: &Store, keys: &[BlockKey]) -> Result<(), BoxError> {
    for k in keys {
        let p = store.path_of(&k.hash);
        match std::fs::File::open(&p) {
            Ok(f) => f
                .sync_data()
                .map_err(BoxError::from)
                .and_then(|()| {
                    Ok(rustix::fs::fadvise(
                        &f,
                        0,
                        None,
                        rustix::fs::Advice::DontNeed,
                    )?)
                })
                .map_err(|e| format!("{}: {e}", p.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display()).into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("4q").is_err());
        assert!(parse_size("").is_err());
    }
}
