//! tierkv-bench: a fio-style benchmark of the tierkv block store.
//!
//! Keys derive from the block index and the worker id, so a `--rw write` run and a later
//! `--rw read` run on the same `--dir` (separate processes) use the same blocks.

use std::io::Write;
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

use common::{BoxError, UsageError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Rw {
    /// Write every block, in index order.
    Write,
    /// Read every block, in index order.
    Read,
    /// Read every block once per loop, in a random order.
    Randread,
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
    /// Passes over the blocks (fio's `loops`).
    #[arg(long, default_value_t = 1)]
    loops: u64,
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
    let keys: Vec<BlockKey> = (0..args.nblocks)
        .map(|i| store.key(block_hash(worker.as_str(), i)))
        .collect();

    if args.rw != Rw::Write && !args.no_layout {
        lay_out(&store, &keys, bs)?;
    }
    let before = store.stats();
    let run = match args.rw {
        Rw::Write | Rw::Read | Rw::Randread => parallel(args.numjobs, |job| match args.rw {
            Rw::Write => {
                let (a, b) = (
                    keys.len() * job / args.numjobs,
                    keys.len() * (job + 1) / args.numjobs,
                );
                write(&store, &keys[a..b], a as u64, bs, args)
            }
            _ => read(&store, &keys, bs, args, job as u64),
        }),
        Rw::Replay => unreachable!("handled above"),
    };
    let after = store.stats();
    report(args, &store, &root, &run, &before, &after)?;
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
    let mut total = Run {
        ops: 0,
        hits: 0,
        misses: 0,
        errors: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        lat: Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram"),
    };
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

/// Writes `keys`, whose first is block `first` (so contents follow the global index).
fn write(store: &Store, keys: &[BlockKey], first: u64, bs: usize, args: &Args) -> Run {
    let mut lat = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram");
    let mut datas: Vec<Vec<u8>> = (0..args.iodepth).map(|_| vec![0xA5u8; bs]).collect();
    let (mut ops, mut errors) = (0u64, 0u64);
    let start = Instant::now();
    for _ in 0..args.loops {
        for (c, chunk) in keys.chunks(args.iodepth).enumerate() {
            let base = first + (c * args.iodepth) as u64;
            for (j, d) in datas.iter_mut().enumerate().take(chunk.len()) {
                fill_block(d, base + j as u64);
            }
            let items: Vec<(BlockKey, &[u8])> = chunk
                .iter()
                .cloned()
                .zip(datas.iter().map(Vec::as_slice))
                .collect();
            let t = Instant::now();
            let res = store.put_many(&items);
            lat.saturating_record(t.elapsed().as_nanos() as u64);
            for r in res {
                ops += 1;
                if let Err(e) = r {
                    errors += 1;
                    tracing::warn!(error = %e, "put failed");
                }
            }
        }
    }
    let elapsed = start.elapsed();
    Run {
        ops,
        hits: 0,
        misses: 0,
        errors,
        bytes: (ops - errors) * bs as u64,
        elapsed,
        lat,
    }
}

fn read(store: &Store, keys: &[BlockKey], bs: usize, args: &Args, job: u64) -> Run {
    let mut lat = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram");
    // Page-aligned, as engines' buffer pools are (and as fio's are): copies into misaligned
    // buffers run several times slower.
    let mut bufs: Vec<AlignedBuf> = (0..args.iodepth).map(|_| AlignedBuf::zeroed(bs)).collect();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    let mut rng = fastrand::Rng::with_seed(0x7165_726b + job);
    let (mut ops, mut hits, mut misses, mut errors, mut bytes) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut batch: Vec<BlockKey> = Vec::with_capacity(args.iodepth);
    let start = Instant::now();
    for _ in 0..args.loops {
        if args.rw == Rw::Randread {
            rng.shuffle(&mut order);
        }
        for chunk in order.chunks(args.iodepth) {
            batch.clear();
            batch.extend(chunk.iter().map(|&i| keys[i].clone()));
            let t = Instant::now();
            let res = store.get_many(&batch, &mut bufs[..chunk.len()]);
            lat.saturating_record(t.elapsed().as_nanos() as u64);
            for r in res {
                ops += 1;
                match r {
                    Ok(Lookup::Hit(n)) => {
                        hits += 1;
                        bytes += n as u64;
                    }
                    Ok(Lookup::Miss) => misses += 1,
                    Err(e) => {
                        errors += 1;
                        tracing::warn!(error = %e, "read failed");
                    }
                }
            }
        }
    }
    Run {
        ops,
        hits,
        misses,
        errors,
        bytes,
        elapsed: start.elapsed(),
        lat,
    }
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
    let direction = if args.rw == Rw::Write {
        "write"
    } else {
        "read"
    };
    match args.output_format {
        OutputFormat::Json => {
            let doc = json!({
                "rw": format!("{:?}", args.rw).to_lowercase(),
                "bs": args.bs,
                "nblocks": args.nblocks,
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
                args.nblocks,
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
            if direction == "read" {
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
