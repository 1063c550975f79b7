//! tierkv-bench: a fio-style benchmark of the tierkv block store.
//!
//! Keys derive from the block index and the worker id, so a `--rw write` run and a later
//! `--rw read` run on the same `--dir` (separate processes) use the same blocks.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use std::sync::{Arc, Mutex};

use tierkv::buf::AlignedBuf;
use tierkv::engine::PosixQueue;
use tierkv::index::policy::{Belady, Oracle};
use tierkv::{
    BlockHash, BlockKey, Layout, Lookup, Parts, PolicyKind, Publish, Store, StoreConfig,
    StoreStats, VerifyMode, WorkerId,
};

#[path = "../common.rs"]
mod common;
mod metadata;
mod replay;
mod report;

use common::{BoxError, UsageError, parse_duration, parse_size};
use report::{RankResult, human_bytes, report};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Rw {
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Normal,
    Json,
}

/// A fio-style benchmark of the tierkv block store.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Cache root directory. Default: a fresh temporary directory, removed at exit.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the temporary directory (its path is printed).
    #[arg(long)]
    keep: bool,
    /// I/O pattern.
    #[arg(long, value_enum, default_value_t = Rw::Randread)]
    rw: Rw,
    /// Block size: bytes, or with a suffix (4k = 4KiB, 64KiB, 1MiB, 1m).
    #[arg(long, default_value = "64KiB", value_parser = parse_size)]
    bs: u64,
    /// Number of blocks.
    #[arg(long, default_value_t = 4096)]
    nblocks: u64,
    /// Working-set size (e.g. 1GiB): sets the number of blocks to SIZE / bs.
    #[arg(long, value_parser = parse_size, conflicts_with = "nblocks")]
    size: Option<u64>,
    /// Passes over the blocks (fio's `loops`).
    #[arg(long, default_value_t = 1)]
    loops: u64,
    /// Stop after this long (e.g. 15s, 2m), whatever the loops.
    #[arg(long, value_parser = parse_duration)]
    runtime: Option<Duration>,
    /// Stop after this many block operations in all.
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
    /// Blocks per store call (a batch of `get_many`/`put_many`).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    iodepth: usize,
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
    /// Directories per shard level: 16, 256 or 4096.
    #[arg(long, default_value_t = 256)]
    layout_fanout: u32,
    /// Open-file cache size (0 = open and close the file on every access).
    #[arg(long)]
    fd_cache: Option<usize>,
    /// Checksum verification on reads: always, never, on-open.
    #[arg(long, default_value = "on-open")]
    verify: VerifyMode,
    /// How puts publish files: rename (temp file + rename) or tmpfile (O_TMPFILE + linkat).
    #[arg(long, default_value = "rename")]
    publish: Publish,
    /// I/O engine: psync, io_uring, auto (io_uring where the kernel allows it), nixl.
    #[arg(long, default_value = "psync")]
    ioengine: tierkv::engine::EngineKind,
    /// Use O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// The engine's bound on I/Os in flight (the io_uring ring's depth; default 64). A batch
    /// larger than this streams through that many slots.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    queue_depth: Option<u32>,
    /// The nixl engine's POSIX queue: libaio (NIXL's default), uring, or posix-aio.
    #[arg(long)]
    nixl_posix_queue: Option<PosixQueue>,
    /// Capacity of the worker's block files on disk (e.g. 10GiB); evicts beyond it.
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Capacity in block files.
    #[arg(long)]
    capacity_blocks: Option<u64>,
    /// Eviction policy: lru, admit2, arc (default); belady (replay only: knows the trace).
    #[arg(long, default_value = "arc")]
    policy: String,
    /// The trace to replay (JSON lines with `hash_ids`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Reads: don't write missing blocks first (they count as misses).
    #[arg(long)]
    no_layout: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Normal)]
    output_format: OutputFormat,
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

/// Draws block indices from a Zipf distribution over `0..n` (rank 0 most likely), by
/// inverse transform on the cumulative weights `1 / (i + 1)^theta`.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, theta: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|i| {
                acc += 1.0 / ((i + 1) as f64).powf(theta);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> usize {
        let u = rng.f64();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// When every job stops: a deadline and an operation budget shared by all jobs.
struct Budget {
    deadline: Option<Instant>,
    ops_left: Option<std::sync::atomic::AtomicI64>,
    progress: indicatif::ProgressBar,
}

impl Budget {
    /// Takes up to `want` operations; 0 when the run is over.
    fn take(&self, want: usize) -> usize {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
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

/// The payload of block `index`: a pattern with the index stamped in front.
fn fill_block(buf: &mut [u8], index: u64) {
    let stamp = index.to_le_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&stamp[..n]);
}

/// One direction's figures, like fio's read and write sections.
struct Dir {
    ops: u64,
    bytes: u64,
    errors: u64,
    /// Latency per store call, in nanoseconds up to an hour.
    lat: Histogram<u64>,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            ops: 0,
            bytes: 0,
            errors: 0,
            lat: Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram"),
        }
    }

    fn merge(&mut self, o: &Dir) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.lat.add(&o.lat).expect("same bounds");
    }
}

/// What one job (or several, merged) did.
struct Run {
    read: Dir,
    write: Dir,
    hits: u64,
    misses: u64,
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
            elapsed: Duration::ZERO,
        }
    }

    /// Adds the figures of a job that ran at the same time.
    fn merge(&mut self, o: &Run) {
        self.read.merge(&o.read);
        self.write.merge(&o.write);
        self.hits += o.hits;
        self.misses += o.misses;
        self.elapsed = self.elapsed.max(o.elapsed);
    }

    fn ops(&self) -> u64 {
        self.read.ops + self.write.ops
    }
}

/// One worker (tensor-parallel rank): its store and its keys.
struct Rank {
    store: Store,
    keys: Vec<BlockKey>,
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => common::exit_for("tierkv-bench", &e),
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    let tmp;
    let root = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::Builder::new().prefix("tierkv-bench.").tempdir()?;
            if args.keep {
                tmp.keep()
            } else {
                tmp.path().to_path_buf()
            }
        }
    };
    let mut config = StoreConfig::new()
        .with_verify(args.verify)
        .with_direct_io(args.direct)
        .with_publish(args.publish)
        .with_engine(args.ioengine);
    if let Some(q) = args.queue_depth {
        config = config.with_queue_depth(q);
    }
    if let Some(q) = args.nixl_posix_queue {
        config = config.with_nixl_posix_queue(q);
    }
    if let Some(d) = args.layout_depth {
        config = config.with_layout(Layout::new(d, args.layout_fanout)?);
    }
    if let Some(n) = args.fd_cache {
        config = config.with_fd_cache(n);
    }
    let bs = usize::try_from(args.bs)?;
    config = config.with_max_block_size(bs.max(tierkv::store::DEFAULT_MAX_BLOCK_SIZE));
    if let Some(c) = args.capacity {
        config = config.with_capacity_bytes(c);
    }
    if let Some(c) = args.capacity_blocks {
        config = config.with_capacity_files(c);
    }
    if !args.layout_depths.is_empty() && args.rw != Rw::Metadata {
        return Err(UsageError("--layout-depths is for --rw metadata".into()).into());
    }
    if args.workers.is_some() && matches!(args.rw, Rw::Replay | Rw::Metadata) {
        return Err(UsageError(format!(
            "--workers is not for --rw {}: it runs one store",
            format!("{:?}", args.rw).to_lowercase()
        ))
        .into());
    }
    let mut parts = Parts::new();
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
    if args.rw == Rw::Replay {
        if args.numjobs > 1 {
            return Err(UsageError(
                "--rw replay runs one request stream: --numjobs must be 1".into(),
            )
            .into());
        }
        if args.trace.is_none() {
            return Err(UsageError("--rw replay needs --trace FILE".into()).into());
        }
        // Replay evicts exactly at the bound, so figures compare across policies.
        config = config.with_watermarks(1.0, 1.0);
    } else if args.trace.is_some() {
        return Err(UsageError("--trace is only for --rw replay".into()).into());
    }
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
    if args.rw == Rw::Metadata {
        return metadata::scale(args, &root, &config, bs, nblocks);
    }
    if args.rw == Rw::Replay {
        let store = Store::open_with(&root, args.worker.clone(), config, parts)?;
        let trace = args.trace.as_ref().expect("checked above");
        let r = replay::replay(&store, trace, bs, oracle.as_ref())?;
        return replay::report_replay(args, &store, &root, &r);
    }

    // Without --workers: one store. With --workers N: N stores (worker ids 0 to N-1) on one
    // root, all with the same block hashes (those of --worker, default 0, so rank 0 of a
    // --workers run and a plain run use the same blocks), as tensor-parallel ranks store
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
        let store = Store::open(&root, id.clone(), config.clone())?;
        let keys = (0..nblocks)
            .map(|i| store.key(block_hash(&namespace, i)))
            .collect();
        ranks.push(Rank { store, keys });
    }

    let reads = matches!(args.rw, Rw::Read | Rw::Randread | Rw::Randrw);
    for r in &ranks {
        if reads && !args.no_layout {
            lay_out(&r.store, &r.keys, bs)?;
        }
        if reads && args.invalidate {
            invalidate(&r.store, &r.keys)?;
        }
    }
    let progress = if args.progress == "auto" && std::io::stderr().is_terminal() {
        let per_rank = match args.rw {
            // Writes split the blocks between a rank's jobs.
            Rw::Write | Rw::Randwrite => args.loops.saturating_mul(nblocks),
            _ => args
                .loops
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
    let budget = Budget {
        deadline: args.runtime.map(|d| Instant::now() + d),
        ops_left: args
            .ops
            .map(|n| std::sync::atomic::AtomicI64::new(n.min(i64::MAX as u64) as i64)),
        progress,
    };
    let before: Vec<StoreStats> = ranks.iter().map(|r| r.store.stats()).collect();
    let jobs = parallel(ranks.len() * args.numjobs, |j| {
        let rank = &ranks[j / args.numjobs];
        let jr = j % args.numjobs;
        // Writes split the rank's blocks between its jobs; reads go over all of them.
        let n = rank.keys.len();
        let (a, b) = match args.rw {
            Rw::Write | Rw::Randwrite => (n * jr / args.numjobs, n * (jr + 1) / args.numjobs),
            _ => (0, n),
        };
        run_job(
            &rank.store,
            &rank.keys[a..b],
            a as u64,
            bs,
            args,
            j as u64,
            &budget,
        )
    });
    budget.progress.finish_and_clear();
    let results: Vec<RankResult> = ranks
        .iter()
        .zip(ids)
        .zip(before)
        .enumerate()
        .map(|(i, ((rank, worker), before))| {
            let mut run = Run::empty();
            for r in &jobs[i * args.numjobs..(i + 1) * args.numjobs] {
                run.merge(r);
            }
            RankResult {
                worker,
                run,
                before,
                after: rank.store.stats(),
            }
        })
        .collect();
    let engine = ranks[0].store.engine_name();
    let layout = ranks[0].store.layout();
    drop(ranks);
    report(args, engine, layout, &root, nblocks, &results)?;
    if args.keep && args.dir.is_none() {
        eprintln!("tierkv-bench: kept {}", root.display());
    }
    Ok(())
}

/// Writes the blocks that are missing (fio's "laying out IO file").
fn lay_out(store: &Store, keys: &[BlockKey], bs: usize) -> Result<(), BoxError> {
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
        fill_block(&mut data, i as u64);
        store.put(&keys[i], &data)?;
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
/// reads that follow come from the device.
fn invalidate(store: &Store, keys: &[BlockKey]) -> Result<(), BoxError> {
    for k in keys {
        let p = store.path_of(&k.hash);
        match std::fs::File::open(&p) {
            Ok(f) => rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
                .map_err(|e| format!("{}: {e}", p.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display()).into()),
        }
    }
    Ok(())
}

/// One job: batches of `--iodepth` blocks, read or written, until the loops, the runtime or
/// the operation budget run out. `keys[i]` is block `first + i` (contents follow the global
/// index, so a later read can check them).
#[allow(clippy::too_many_arguments)]
fn run_job(
    store: &Store,
    keys: &[BlockKey],
    first: u64,
    bs: usize,
    args: &Args,
    job: u64,
    budget: &Budget,
) -> Run {
    let mut run = Run::empty();
    if keys.is_empty() {
        // More writing jobs than blocks: nothing of its own to do.
        return run;
    }
    // Zipf over this job's keys (all of them for reads, its share for writes).
    let zipf = match args.random_distribution {
        Distribution::Zipf(theta) => Some(Zipf::new(keys.len(), theta)),
        Distribution::Random => None,
    };
    let zipf = zipf.as_ref();
    // Page-aligned, as engines' buffer pools are (and as fio's are): copies into misaligned
    // buffers run several times slower.
    let mut bufs: Vec<AlignedBuf> = (0..args.iodepth).map(|_| AlignedBuf::zeroed(bs)).collect();
    let mut datas: Vec<Vec<u8>> = (0..args.iodepth).map(|_| vec![0xA5u8; bs]).collect();
    let mut rng = fastrand::Rng::with_seed(0x7165_726b + job);
    let start = Instant::now();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    let mut batch_idx: Vec<usize> = Vec::with_capacity(args.iodepth);
    // With --runtime or --ops, passes repeat until that limit (fio's time_based); else
    // --loops passes. randrw draws keys instead of passing over them: loops x blocks ops.
    let limited = args.runtime.is_some() || args.ops.is_some();
    let passes = if limited { u64::MAX } else { args.loops.max(1) };
    let mut mixed_left = if limited {
        u64::MAX
    } else {
        args.loops.saturating_mul(keys.len() as u64)
    };
    'passes: for _ in 0..passes {
        let shuffle = matches!(args.rw, Rw::Randread | Rw::Randwrite);
        if shuffle && zipf.is_none() {
            rng.shuffle(&mut order);
        }
        let mut pos = 0usize;
        loop {
            // The next batch's block indices.
            batch_idx.clear();
            let want = match args.rw {
                Rw::Randrw => {
                    if mixed_left == 0 {
                        break 'passes;
                    }
                    args.iodepth.min(mixed_left.min(usize::MAX as u64) as usize)
                }
                _ => args.iodepth.min(keys.len() - pos),
            };
            if want == 0 {
                break;
            }
            let n = budget.take(want);
            if n == 0 {
                break 'passes;
            }
            for j in 0..n {
                batch_idx.push(match (args.rw, zipf) {
                    (Rw::Read | Rw::Write, _) => pos + j,
                    (_, Some(z)) => z.sample(&mut rng),
                    (Rw::Randrw, None) => rng.usize(..keys.len()),
                    _ => order[pos + j],
                });
            }
            pos += n;
            mixed_left = mixed_left.saturating_sub(n as u64);
            let write = match args.rw {
                Rw::Write | Rw::Randwrite => true,
                Rw::Randrw => rng.u8(0..100) >= args.rwmixread,
                _ => false,
            };
            let batch: Vec<BlockKey> = batch_idx.iter().map(|&i| keys[i].clone()).collect();
            let t = Instant::now();
            if write {
                for (d, &i) in datas.iter_mut().zip(&batch_idx) {
                    fill_block(d, first + i as u64);
                }
                let items: Vec<(BlockKey, &[u8])> = batch
                    .into_iter()
                    .zip(datas.iter().map(Vec::as_slice))
                    .collect();
                let res = store.put_many(&items);
                let w = &mut run.write;
                w.lat.saturating_record(t.elapsed().as_nanos() as u64);
                for r in res {
                    w.ops += 1;
                    match r {
                        Ok(()) => w.bytes += bs as u64,
                        Err(e) => {
                            w.errors += 1;
                            tracing::warn!(error = %e, "put failed");
                        }
                    }
                }
            } else {
                let res = store.get_many(&batch, &mut bufs[..n]);
                let rd = &mut run.read;
                rd.lat.saturating_record(t.elapsed().as_nanos() as u64);
                for r in res {
                    rd.ops += 1;
                    match r {
                        Ok(Lookup::Hit(len)) => {
                            run.hits += 1;
                            rd.bytes += len as u64;
                        }
                        Ok(Lookup::Miss) => run.misses += 1,
                        Err(e) => {
                            rd.errors += 1;
                            tracing::warn!(error = %e, "read failed");
                        }
                    }
                }
            }
            budget.progress.inc(n as u64);
        }
    }
    run.elapsed = start.elapsed();
    run
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
