//! tierkv-bench: a fio-style benchmark of the tierkv block store.
//!
//! Keys derive from the block index and the worker id, so a `--rw write` run and a later
//! `--rw read` run on the same `--dir` (separate processes) use the same blocks.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::json;
use std::sync::{Arc, Mutex};

use tierkv::buf::AlignedBuf;
use tierkv::index::policy::{Belady, Oracle, belady::NEVER};
use tierkv::{
    BlockHash, BlockKey, Layout, Lookup, Parts, PolicyKind, Publish, Store, StoreConfig,
    VerifyMode, WorkerId,
};

#[path = "../common.rs"]
mod common;

use common::{BoxError, UsageError, parse_duration};

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
    /// measure cold reads.
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
    /// Shard directory levels (0 = one flat directory). Default: the tree's, else 2.
    #[arg(long)]
    layout_depth: Option<u8>,
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
    /// I/O engine: psync, io_uring, auto (io_uring where the kernel allows it).
    #[arg(long, default_value = "psync")]
    ioengine: tierkv::engine::EngineKind,
    /// Use O_DIRECT.
    #[arg(long)]
    direct: bool,
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

/// Parses `4096`, `4k`, `64KiB`, `1MiB`, `1m`, `2GiB` (fio's convention: k = 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "bad size unit in {s:?}; use k, KiB, m, MiB, g, GiB"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
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

struct Run {
    ops: u64,
    hits: u64,
    misses: u64,
    errors: u64,
    bytes: u64,
    elapsed: Duration,
    lat: Histogram<u64>,
}

impl Run {
    /// Nothing done yet; latencies in nanoseconds up to an hour.
    fn empty() -> Run {
        Run {
            ops: 0,
            hits: 0,
            misses: 0,
            errors: 0,
            bytes: 0,
            elapsed: Duration::ZERO,
            lat: Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram"),
        }
    }
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
    let worker = args.worker.clone();
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
    let store = Store::open_with(&root, worker.clone(), config, parts)?;
    if args.rw == Rw::Replay {
        let trace = args.trace.as_ref().expect("checked above");
        let r = replay(&store, trace, bs, oracle.as_ref())?;
        return report_replay(args, &store, &root, &r);
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
    let keys: Vec<BlockKey> = (0..nblocks)
        .map(|i| store.key(block_hash(worker.as_str(), i)))
        .collect();

    let reads = matches!(args.rw, Rw::Read | Rw::Randread | Rw::Randrw);
    if reads && !args.no_layout {
        lay_out(&store, &keys, bs)?;
    }
    if reads && args.invalidate {
        invalidate(&store, &keys)?;
    }
    let progress = if args.progress == "auto" && std::io::stderr().is_terminal() {
        let total = args.ops.unwrap_or(
            args.loops
                .saturating_mul(nblocks)
                .saturating_mul(args.numjobs as u64),
        );
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
    let zipf = match args.random_distribution {
        Distribution::Zipf(theta) => Some(Zipf::new(keys.len(), theta)),
        Distribution::Random => None,
    };
    let before = store.stats();
    let run = parallel(args.numjobs, |job| {
        // Writes split the blocks between the jobs; reads go over all of them.
        let (a, b) = match args.rw {
            Rw::Write | Rw::Randwrite => (
                keys.len() * job / args.numjobs,
                keys.len() * (job + 1) / args.numjobs,
            ),
            _ => (0, keys.len()),
        };
        run_job(
            &store,
            &keys[a..b],
            a as u64,
            bs,
            args,
            job as u64,
            &budget,
            zipf.as_ref(),
        )
    });
    budget.progress.finish_and_clear();
    let after = store.stats();
    report(args, &store, &root, nblocks, &run, &before, &after)?;
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
        "tierkv-bench: laying out {} blocks of {bs} bytes",
        missing.len()
    );
    let mut data = vec![0xA5u8; bs];
    for &i in &missing {
        fill_block(&mut data, i as u64);
        store.put(&keys[i], &data)?;
    }
    Ok(())
}

/// Runs `job` on `n` threads at once and merges their results.
fn parallel(n: usize, job: impl Fn(usize) -> Run + Sync) -> Run {
    let runs: Vec<Run> = std::thread::scope(|s| {
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
    });
    let mut total = Run::empty();
    for r in runs {
        total.ops += r.ops;
        total.hits += r.hits;
        total.misses += r.misses;
        total.errors += r.errors;
        total.bytes += r.bytes;
        total.elapsed = total.elapsed.max(r.elapsed);
        total.lat.add(&r.lat).expect("same bounds");
    }
    total
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
    zipf: Option<&Zipf>,
) -> Run {
    // Page-aligned, as engines' buffer pools are (and as fio's are): copies into misaligned
    // buffers run several times slower.
    let mut bufs: Vec<AlignedBuf> = (0..args.iodepth).map(|_| AlignedBuf::zeroed(bs)).collect();
    let mut datas: Vec<Vec<u8>> = (0..args.iodepth).map(|_| vec![0xA5u8; bs]).collect();
    let mut rng = fastrand::Rng::with_seed(0x7165_726b + job);
    let mut run = Run::empty();
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
                run.lat.saturating_record(t.elapsed().as_nanos() as u64);
                for r in res {
                    run.ops += 1;
                    match r {
                        Ok(()) => run.bytes += bs as u64,
                        Err(e) => {
                            run.errors += 1;
                            tracing::warn!(error = %e, "put failed");
                        }
                    }
                }
            } else {
                let res = store.get_many(&batch, &mut bufs[..n]);
                run.lat.saturating_record(t.elapsed().as_nanos() as u64);
                for r in res {
                    run.ops += 1;
                    match r {
                        Ok(Lookup::Hit(len)) => {
                            run.hits += 1;
                            run.bytes += len as u64;
                        }
                        Ok(Lookup::Miss) => run.misses += 1,
                        Err(e) => {
                            run.errors += 1;
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

fn human_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", units[u])
}

fn human_count(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

fn report(
    args: &Args,
    store: &Store,
    root: &std::path::Path,
    nblocks: u64,
    run: &Run,
    before: &tierkv::StoreStats,
    after: &tierkv::StoreStats,
) -> Result<(), BoxError> {
    let secs = run.elapsed.as_secs_f64().max(1e-9);
    let ops_per_sec = run.ops as f64 / secs;
    let bw = run.bytes as f64 / secs;
    let corrupt = after.corrupt - before.corrupt;
    let fd_hits = after.fd_cache_hits - before.fd_cache_hits;
    let fd_misses = after.fd_cache_misses - before.fd_cache_misses;
    let fd_ratio = if fd_hits + fd_misses > 0 {
        fd_hits as f64 / (fd_hits + fd_misses) as f64
    } else {
        0.0
    };
    let l = &run.lat;
    let q = |p: f64| l.value_at_quantile(p) as f64 / 1e3;
    let mut out = std::io::stdout().lock();
    let direction = match args.rw {
        Rw::Write | Rw::Randwrite => "write",
        Rw::Randrw => "rw",
        _ => "read",
    };
    match args.output_format {
        OutputFormat::Json => {
            let doc = json!({
                "rw": format!("{:?}", args.rw).to_lowercase(),
                "bs": args.bs,
                "nblocks": nblocks,
                "loops": args.loops,
                "iodepth": args.iodepth,
                "numjobs": args.numjobs,
                "worker": args.worker.as_str(),
                "engine": store.engine_name(),
                "layout": {"depth": store.layout().depth, "fanout": store.layout().fanout},
                "fd_cache_capacity": after.fd_cache_capacity,
                "verify": args.verify.to_string(),
                "direct": args.direct,
                "dir": root.display().to_string(),
                "ops": run.ops,
                "elapsed_s": secs,
                "ops_per_sec": ops_per_sec,
                "bw_bytes_per_sec": bw,
                "bytes": run.bytes,
                "hits": run.hits,
                "misses": run.misses,
                "errors": run.errors,
                "corrupt": corrupt,
                "fd_cache": {"hits": fd_hits, "misses": fd_misses, "hit_ratio": fd_ratio,
                             "evictions": after.fd_cache_evictions - before.fd_cache_evictions},
                "lat_us": {"min": l.min() as f64 / 1e3, "mean": l.mean() / 1e3, "p50": q(0.5),
                           "p90": q(0.9), "p99": q(0.99), "p99.9": q(0.999), "max": l.max() as f64 / 1e3},
                "store": after,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        OutputFormat::Normal => {
            writeln!(
                out,
                "tierkv-bench: rw={:?} bs={} nblocks={} loops={} iodepth={} numjobs={} engine={} layout=({}) fd-cache={} verify={}{}",
                args.rw,
                human_bytes(args.bs as f64),
                nblocks,
                args.loops,
                args.iodepth,
                args.numjobs,
                store.engine_name(),
                store.layout(),
                after.fd_cache_capacity,
                args.verify,
                if args.direct { " direct" } else { "" },
            )?;
            writeln!(
                out,
                "  {direction}: IOPS={}, BW={}/s, {} ops in {:.3}s",
                human_count(ops_per_sec),
                human_bytes(bw),
                run.ops,
                secs
            )?;
            writeln!(
                out,
                "    lat per call (usec): min={:.1}, avg={:.1}, p50={:.1}, p90={:.1}, p99={:.1}, p99.9={:.1}, max={:.1}",
                l.min() as f64 / 1e3,
                l.mean() / 1e3,
                q(0.5),
                q(0.9),
                q(0.99),
                q(0.999),
                l.max() as f64 / 1e3
            )?;
            if direction != "write" {
                writeln!(
                    out,
                    "  hits={} misses={} corrupt={} errors={} bytes={}",
                    run.hits, run.misses, corrupt, run.errors, run.bytes
                )?;
                writeln!(
                    out,
                    "  fd-cache: hits={fd_hits} misses={fd_misses} hit-ratio={fd_ratio:.3} evictions={}",
                    after.fd_cache_evictions - before.fd_cache_evictions
                )?;
            } else {
                writeln!(
                    out,
                    "  puts={} errors={} bytes={}",
                    run.ops - run.errors,
                    run.errors,
                    run.bytes
                )?;
            }
        }
    }
    Ok(())
}

struct ReplayRun {
    requests: u64,
    refs: u64,
    hits: u64,
    read_misses: u64,
    errors: u64,
    elapsed: Duration,
}

/// The store key of a trace's hash id.
fn trace_hash(id: u64) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(b"tierkv-trace.v1");
    h.update(&id.to_le_bytes());
    BlockHash(*h.finalize().as_bytes())
}

fn load_trace(path: &std::path::Path) -> Result<Vec<Vec<u64>>, BoxError> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
        let ids = v["hash_ids"]
            .as_array()
            .ok_or_else(|| format!("{}:{}: no hash_ids array", path.display(), n + 1))?
            .iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    format!("{}:{}: hash id is not an integer", path.display(), n + 1)
                })
            })
            .collect::<Result<Vec<u64>, _>>()?;
        out.push(ids);
    }
    Ok(out)
}

/// Per request: hits = longest present prefix (read for real, every block verified), then
/// the rest is offered in one batch (absent blocks stored, present ones touched).
fn replay(
    store: &Store,
    trace: &std::path::Path,
    bs: usize,
    oracle: Option<&Arc<Mutex<Oracle>>>,
) -> Result<ReplayRun, BoxError> {
    let reqs = load_trace(trace)?;
    // Next use of each reference position, for the Belady oracle.
    let flat: Vec<u64> = reqs.iter().flatten().copied().collect();
    let mut next = vec![NEVER; flat.len()];
    let mut last: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for (i, id) in flat.iter().enumerate().rev() {
        next[i] = last.get(id).copied().unwrap_or(NEVER);
        last.insert(*id, i as u64);
    }
    let longest = reqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut bufs: Vec<Vec<u8>> = (0..longest).map(|_| vec![0u8; bs]).collect();
    let mut data = vec![0xA5u8; bs];
    let mut run = ReplayRun {
        requests: 0,
        refs: 0,
        hits: 0,
        read_misses: 0,
        errors: 0,
        elapsed: Duration::ZERO,
    };
    let start = Instant::now();
    let mut pos = 0usize;
    for r in &reqs {
        if let Some(o) = oracle {
            let mut o = o.lock().unwrap_or_else(|e| e.into_inner());
            for (j, id) in r.iter().enumerate() {
                o.set(trace_hash(*id), next[pos + j]);
            }
        }
        pos += r.len();
        let keys: Vec<BlockKey> = r.iter().map(|&id| store.key(trace_hash(id))).collect();
        let n = store.contains_prefix(&keys)?;
        run.requests += 1;
        run.refs += r.len() as u64;
        run.hits += n as u64;
        for res in store.get_many(&keys[..n], &mut bufs[..n]) {
            match res {
                Ok(Lookup::Hit(_)) => {}
                Ok(Lookup::Miss) => run.read_misses += 1,
                Err(e) => {
                    run.errors += 1;
                    tracing::warn!(error = %e, "replay read failed");
                }
            }
        }
        let items: Vec<(BlockKey, Vec<u8>)> = keys[n..]
            .iter()
            .zip(&r[n..])
            .map(|(k, id)| {
                fill_block(&mut data, *id);
                (k.clone(), data.clone())
            })
            .collect();
        for res in store.offer_many(&items) {
            if let Err(e) = res {
                run.errors += 1;
                tracing::warn!(error = %e, "replay put failed");
            }
        }
    }
    run.elapsed = start.elapsed();
    Ok(run)
}

fn report_replay(
    args: &Args,
    store: &Store,
    root: &std::path::Path,
    r: &ReplayRun,
) -> Result<(), BoxError> {
    let s = store.stats();
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let hit_ratio = if r.refs > 0 {
        r.hits as f64 / r.refs as f64
    } else {
        0.0
    };
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => {
            let doc = json!({
                "rw": "replay",
                "trace": args.trace.as_ref().map(|p| p.display().to_string()),
                "policy": store.policy_name(),
                "bs": args.bs,
                "capacity_bytes": s.capacity_bytes,
                "capacity_blocks": s.capacity_files,
                "requests": r.requests,
                "refs": r.refs,
                "hits": r.hits,
                "hit_ratio": hit_ratio,
                "read_misses": r.read_misses,
                "errors": r.errors,
                "bytes_written": s.bytes_written,
                "bytes_read": s.bytes_read,
                "evictions": s.evictions,
                "not_admitted": s.not_admitted,
                "elapsed_s": secs,
                "requests_per_sec": r.requests as f64 / secs,
                "blocks_per_sec": r.refs as f64 / secs,
                "dir": root.display().to_string(),
                "store": s,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        OutputFormat::Normal => {
            writeln!(
                out,
                "tierkv-bench: rw=replay policy={} bs={} capacity={} engine={}",
                store.policy_name(),
                human_bytes(args.bs as f64),
                match (s.capacity_files, s.capacity_bytes) {
                    (Some(f), _) => format!("{f} blocks"),
                    (None, Some(b)) => human_bytes(b as f64),
                    (None, None) => "unbounded".into(),
                },
                store.engine_name()
            )?;
            writeln!(
                out,
                "  replay: {} requests, {} block references in {:.2}s ({:.0} requests/s, {:.0} blocks/s)",
                r.requests,
                r.refs,
                secs,
                r.requests as f64 / secs,
                r.refs as f64 / secs
            )?;
            writeln!(
                out,
                "  hit ratio={hit_ratio:.4} hits={} read-misses={} errors={}",
                r.hits, r.read_misses, r.errors
            )?;
            writeln!(
                out,
                "  written={} read={} evictions={} not-admitted={}",
                human_bytes(s.bytes_written as f64),
                human_bytes(s.bytes_read as f64),
                s.evictions,
                s.not_admitted
            )?;
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
