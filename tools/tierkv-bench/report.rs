//! fio-style reports of a run: per direction bandwidth, IOPS and latency percentiles, hits,
//! the open-file cache; the same fields as JSON for scripts.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};
use tierkv::{Layout, StoreStats, WorkerId};

use crate::common::BoxError;
use crate::{Args, Dir, Environment, OutputFormat, Phase, Run, Rw, interrupted};

/// What one worker's jobs did, with its store's counters before and after.
pub(crate) struct RankResult {
    pub(crate) worker: WorkerId,
    pub(crate) run: Run,
    pub(crate) before: StoreStats,
    pub(crate) after: StoreStats,
}

/// `1.5MiB`.
pub(crate) fn human_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", units[u])
}

/// `12.3k`.
pub(crate) fn human_count(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// Latency percentiles in microseconds.
fn lat_json(d: &Dir) -> Value {
    let l = &d.lat;
    let q = |p: f64| l.value_at_quantile(p) as f64 / 1e3;
    json!({"min": l.min() as f64 / 1e3, "mean": l.mean() / 1e3, "p50": q(0.5), "p90": q(0.9),
           "p99": q(0.99), "p99.9": q(0.999), "max": l.max() as f64 / 1e3})
}

/// fio's completion-latency percentiles, under fio's keys ("99.000000"), in nanoseconds.
const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// One direction's figures: ours, and fio's names where the concept matches (`iops`,
/// `bw_bytes`, `io_bytes`, `total_ios`, `clat_ns` with fio's percentile keys; the latency is
/// per store call, which is per I/O with `--batch 1`).
fn dir_json(d: &Dir, secs: f64) -> Value {
    let l = &d.lat;
    let percentile: serde_json::Map<String, Value> = FIO_PERCENTILES
        .iter()
        .map(|&p| (format!("{p:.6}"), json!(l.value_at_quantile(p / 100.0))))
        .collect();
    let (min, max, mean) = if l.is_empty() {
        (0, 0, 0.0)
    } else {
        (l.min(), l.max(), l.mean())
    };
    json!({
        "ops": d.ops,
        "bytes": d.bytes,
        "errors": d.errors,
        "first_error": d.first_error,
        "ops_per_sec": d.ops as f64 / secs,
        "bw_bytes_per_sec": d.bytes as f64 / secs,
        "lat_us": lat_json(d),
        "iops": d.ops as f64 / secs,
        "bw_bytes": d.bytes as f64 / secs,
        "io_bytes": d.bytes,
        "total_ios": d.ops,
        "runtime": (secs * 1e3).round(),
        "clat_ns": {"min": min, "max": max, "mean": mean, "N": l.len(), "percentile": percentile},
    })
}

fn dir_lines(
    out: &mut impl Write,
    name: &str,
    d: &Dir,
    secs: f64,
    batch: usize,
) -> std::io::Result<()> {
    let l = &d.lat;
    let q = |p: f64| l.value_at_quantile(p) as f64 / 1e3;
    writeln!(
        out,
        "  {name}: IOPS={}, BW={}/s, {} ops in {secs:.3}s{}",
        human_count(d.ops as f64 / secs),
        human_bytes(d.bytes as f64 / secs),
        d.ops,
        if d.errors > 0 {
            format!(
                ", {} errors (not counted as IOPS; first: {})",
                d.errors,
                d.first_error.as_deref().unwrap_or("?")
            )
        } else {
            String::new()
        },
    )?;
    // Microseconds, or milliseconds once calls take 10 ms (large blocks, large batches).
    let (unit, div) = if l.max() >= 10_000_000 {
        ("msec", 1e3)
    } else {
        ("usec", 1.0)
    };
    writeln!(
        out,
        "    lat per call of up to {batch} blocks ({unit}): min={:.1}, avg={:.1}, p50={:.1}, p90={:.1}, p99={:.1}, p99.9={:.1}, max={:.1}",
        l.min() as f64 / 1e3 / div,
        l.mean() / 1e3 / div,
        q(0.5) / div,
        q(0.9) / div,
        q(0.99) / div,
        q(0.999) / div,
        l.max() as f64 / 1e3 / div
    )
}

/// Prints the run of every worker and their sum.
pub(crate) fn report(
    args: &Args,
    engine: &str,
    layout: Layout,
    root: &Path,
    nblocks: u64,
    ranks: &[RankResult],
) -> Result<(), BoxError> {
    let r = PatternReport::new(args, engine, layout, root, nblocks, ranks);
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => {
            writeln!(out, "{}", serde_json::to_string_pretty(&r.json())?)?;
        }
        OutputFormat::Normal => r.text(&mut out)?,
    }
    Ok(())
}

/// A pattern run's report: what it ran with, and its figures summed over the ranks.
struct PatternReport<'a> {
    args: &'a Args,
    engine: &'a str,
    layout: Layout,
    root: &'a Path,
    nblocks: u64,
    ranks: &'a [RankResult],
    /// Every rank's figures, merged.
    run: Run,
    secs: f64,
    corrupt: u64,
    fd_hits: u64,
    fd_misses: u64,
    fd_evictions: u64,
    evictions: u64,
    not_admitted: u64,
    fd_capacity: u64,
    fd_ratio: f64,
}

impl<'a> PatternReport<'a> {
    /// Sums the ranks' figures and their stores' counters over the run.
    fn new(
        args: &'a Args,
        engine: &'a str,
        layout: Layout,
        root: &'a Path,
        nblocks: u64,
        ranks: &'a [RankResult],
    ) -> Self {
        let run = merged(ranks);
        let secs = run.elapsed.as_secs_f64().max(1e-9);
        let (fd_hits, fd_misses) = fd_cache(ranks);
        let fd_ratio = if fd_hits + fd_misses > 0 {
            fd_hits as f64 / (fd_hits + fd_misses) as f64
        } else {
            0.0
        };
        PatternReport {
            args,
            engine,
            layout,
            root,
            nblocks,
            ranks,
            run,
            secs,
            corrupt: delta(ranks, |s| s.corrupt),
            fd_hits,
            fd_misses,
            fd_evictions: delta(ranks, |s| s.fd_cache_evictions),
            evictions: delta(ranks, |s| s.evictions),
            not_admitted: delta(ranks, |s| s.not_admitted),
            fd_capacity: ranks[0].after.fd_cache_capacity,
            fd_ratio,
        }
    }

    /// The JSON report: the run's options, its sums and each worker's figures.
    fn json(&self) -> Value {
        let (args, run, secs, ranks) = (self.args, &self.run, self.secs, self.ranks);
        let ops = run.ops();
        let bytes = run.read.bytes + run.write.bytes;
        let mut all = Dir::new();
        all.merge(&run.read);
        all.merge(&run.write);
        json!({
            "rw": format!("{:?}", args.rw).to_lowercase(),
            "bs": args.bs,
            "nblocks": self.nblocks,
            "loops": loops_json(args),
            "runtime_s": args.runtime.map(|d| d.as_secs_f64()),
            "ramp_time_s": args.ramp_time.map(|d| d.as_secs_f64()),
            "iodepth": iodepth(args),
            "batch": args.batch,
            "numjobs": args.numjobs,
            "interrupted": interrupted(),
            "worker": ranks[0].worker.as_str(),
            "nworkers": ranks.len(),
            "engine": self.engine,
            "layout": {"depth": self.layout.depth, "fanout": self.layout.fanout},
            "fd_cache_capacity": self.fd_capacity,
            "verify": args.verify.to_string(),
            "direct": args.direct,
            "dir": self.root.display().to_string(),
            "ops": ops,
            "elapsed_s": secs,
            "ops_per_sec": ops as f64 / secs,
            "bw_bytes_per_sec": bytes as f64 / secs,
            "bytes": bytes,
            "hits": run.hits,
            "misses": run.misses,
            "errors": run.read.errors + run.write.errors,
            "verify_data": args.verify_data,
            "verify_errors": run.verify_errors,
            "corrupt": self.corrupt,
            "evictions": self.evictions,
            "not_admitted": self.not_admitted,
            "read": dir_json(&run.read, secs),
            "write": dir_json(&run.write, secs),
            "fd_cache": {"hits": self.fd_hits, "misses": self.fd_misses,
                         "hit_ratio": self.fd_ratio, "evictions": self.fd_evictions},
            "lat_us": lat_json(&all),
            "workers": self.workers_json(),
            // Worker 0's counters (each worker's are in `workers`).
            "store": ranks[0].after,
        })
    }

    /// Each worker's figures, for the JSON report.
    fn workers_json(&self) -> Vec<Value> {
        self.ranks
            .iter()
            .map(|r| {
                let s = r.run.elapsed.as_secs_f64().max(1e-9);
                json!({
                    "worker": r.worker.as_str(),
                    "ops": r.run.ops(),
                    "ops_per_sec": r.run.ops() as f64 / s,
                    "hits": r.run.hits,
                    "misses": r.run.misses,
                    "errors": r.run.read.errors + r.run.write.errors,
                    "read": dir_json(&r.run.read, s),
                    "write": dir_json(&r.run.write, s),
                    "store": r.after,
                })
            })
            .collect()
    }

    /// The text report: a header, the directions the pattern ran, hits, the open-file cache,
    /// puts, and each worker where there are several.
    fn text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let (args, run, secs) = (self.args, &self.run, self.secs);
        self.header(out)?;
        let reads = matches!(args.rw, Rw::Read | Rw::Randread | Rw::Randrw);
        let writes = matches!(args.rw, Rw::Write | Rw::Randwrite | Rw::Randrw);
        if reads {
            dir_lines(out, "read", &run.read, secs, args.batch)?;
        }
        if writes {
            dir_lines(out, "write", &run.write, secs, args.batch)?;
        }
        if reads {
            writeln!(
                out,
                "  hits={} misses={} corrupt={} read-errors={} bytes-read={}{}",
                run.hits,
                run.misses,
                self.corrupt,
                run.read.errors,
                run.read.bytes,
                if args.verify_data {
                    format!(" verify-errors={}", run.verify_errors)
                } else {
                    String::new()
                }
            )?;
            writeln!(
                out,
                "  fd-cache: hits={} misses={} hit-ratio={:.3} evictions={}",
                self.fd_hits, self.fd_misses, self.fd_ratio, self.fd_evictions
            )?;
        }
        if writes {
            writeln!(
                out,
                "  puts={} put-errors={} bytes-written={} evictions={} not-admitted={}",
                run.write.ops, run.write.errors, run.write.bytes, self.evictions, self.not_admitted
            )?;
        }
        if interrupted() {
            writeln!(
                out,
                "  interrupted: partial result (the run stopped at the signal)"
            )?;
        }
        self.worker_lines(out)
    }

    /// The text report's first line: the run's options.
    fn header(&self, out: &mut impl Write) -> std::io::Result<()> {
        let args = self.args;
        writeln!(
            out,
            "tierkv-bench: rw={} bs={} nblocks={} {} iodepth={} batch={} numjobs={}{} engine={} layout=({}) fd-cache={} verify={}{}",
            format!("{:?}", args.rw).to_lowercase(),
            human_bytes(args.bs as f64),
            self.nblocks,
            passes_text(args),
            iodepth(args),
            args.batch,
            args.numjobs,
            if self.ranks.len() > 1 {
                format!(" workers={}", self.ranks.len())
            } else {
                String::new()
            },
            self.engine,
            self.layout,
            self.fd_capacity,
            args.verify,
            if args.direct { " direct" } else { "" },
        )
    }

    /// A line per worker, where there are several.
    fn worker_lines(&self, out: &mut impl Write) -> std::io::Result<()> {
        if self.ranks.len() > 1 {
            for r in self.ranks {
                let s = r.run.elapsed.as_secs_f64().max(1e-9);
                writeln!(
                    out,
                    "  worker {}: IOPS={}, hits={} misses={} errors={}",
                    r.worker,
                    human_count(r.run.ops() as f64 / s),
                    r.run.hits,
                    r.run.misses,
                    r.run.read.errors + r.run.write.errors
                )?;
            }
        }
        Ok(())
    }
}

/// The header's passes: `loops=N`, or the limit that ends the run instead.
fn passes_text(args: &Args) -> String {
    match (args.runtime, args.ops) {
        (Some(d), _) => match args.ramp_time {
            Some(r) => format!(
                "ramp_time={}s runtime={}s",
                r.as_secs_f64(),
                d.as_secs_f64()
            ),
            None => format!("runtime={}s", d.as_secs_f64()),
        },
        (None, Some(n)) => format!("ops={n}"),
        (None, None) => format!("loops={}", args.loops()),
    }
}

/// `loops` in JSON: null when --runtime or --ops ends the run instead.
fn loops_json(args: &Args) -> Value {
    if args.runtime.is_some() || args.ops.is_some() {
        Value::Null
    } else {
        json!(args.loops())
    }
}

/// The in-flight depth the engine ran with (`--iodepth`, else the engine's default; 1 for
/// psync, which does one I/O at a time).
fn iodepth(args: &Args) -> u32 {
    match args.ioengine {
        tierkv::engine::EngineKind::Psync => 1,
        _ => args.iodepth.unwrap_or(tierkv::engine::DEFAULT_QUEUE_DEPTH),
    }
}

/// Sums phase figures over ranks.
fn merged(ranks: &[RankResult]) -> Run {
    let mut run = Run::empty();
    for r in ranks {
        run.merge(&r.run);
    }
    run
}

/// A store counter's growth over a phase, all ranks.
fn delta(ranks: &[RankResult], f: fn(&StoreStats) -> u64) -> u64 {
    ranks
        .iter()
        .map(|r| f(&r.after).saturating_sub(f(&r.before)))
        .sum()
}

/// The open-file cache's hits and misses over a phase, all ranks.
fn fd_cache(ranks: &[RankResult]) -> (u64, u64) {
    (
        delta(ranks, |s| s.fd_cache_hits),
        delta(ranks, |s| s.fd_cache_misses),
    )
}

/// `1.2GiB/s`.
fn rate(d: &Dir, secs: f64) -> String {
    format!("{}/s", human_bytes(d.bytes as f64 / secs))
}

/// The main job's report: each phase (write, read, hot read) with its line, the filesystem,
/// whether reads came from the page cache, and a summary.
pub(crate) fn report_main(
    args: &Args,
    engine: &str,
    layout: Layout,
    root: &Path,
    nblocks: u64,
    phases: &[Phase],
    env: &Environment,
) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    let nranks = phases[0].ranks.len();
    let r = MainReport {
        args,
        engine,
        layout,
        root,
        nblocks,
        phases,
        env,
        nranks,
        total: args.bs as f64 * nblocks as f64 * nranks as f64,
    };
    let summary = r.summary();
    match args.output_format {
        OutputFormat::Json => {
            writeln!(out, "{}", serde_json::to_string_pretty(&r.json(summary))?)?;
        }
        OutputFormat::Normal => r.text(&mut out, &summary)?,
    }
    Ok(())
}

/// The main job's report: what it ran with, on what, and its phases.
struct MainReport<'a> {
    args: &'a Args,
    engine: &'a str,
    layout: Layout,
    root: &'a Path,
    nblocks: u64,
    phases: &'a [Phase],
    env: &'a Environment,
    nranks: usize,
    /// The bytes of every rank's blocks.
    total: f64,
}

impl MainReport<'_> {
    /// Where the first read came from, in words, for the text report.
    fn page_cache_text(&self) -> String {
        if self.args.direct {
            return "O_DIRECT: reads bypassed the page cache (they met the device)".to_string();
        }
        match self.env.page_cache_resident {
            Some(f) if f >= 0.99 => format!(
                "{:.0}% of the sampled blocks' bytes were in the page cache before the first \
                 read: reads came from memory, not the device (--invalidate or --direct to \
                 read the device)",
                f * 100.0
            ),
            Some(f) if f <= 0.01 => format!(
                "{:.0}% of the sampled blocks' bytes were in the page cache before the first \
                 read: the first read met the device",
                f * 100.0
            ),
            Some(f) => format!(
                "{:.0}% of the sampled blocks' bytes were in the page cache before the first \
                 read: reads came partly from memory",
                f * 100.0
            ),
            None => "unknown (this filesystem cannot tell what is cached)".to_string(),
        }
    }

    /// Where the first read came from, for the summary.
    fn first_read_from(&self) -> &'static str {
        if self.args.direct {
            return "the device (O_DIRECT)";
        }
        match self.env.page_cache_resident {
            Some(f) if f >= 0.99 => "the page cache",
            Some(f) if f <= 0.01 => "the device",
            Some(_) => "partly the page cache",
            None => "the page cache or the device (unknown)",
        }
    }

    /// One sentence: what each phase did, on which filesystem, from where.
    fn summary(&self) -> String {
        let phase_of = |name: &str| self.phases.iter().find(|p| p.name == name);
        let mut parts = Vec::new();
        if let Some(p) = phase_of("write") {
            let r = merged(&p.ranks);
            parts.push(format!(
                "wrote {} blocks of {} ({}) at {}",
                r.write.ops,
                human_bytes(self.args.bs as f64),
                human_bytes(self.total),
                rate(&r.write, r.elapsed.as_secs_f64().max(1e-9))
            ));
        }
        if let Some(p) = phase_of("read") {
            let r = merged(&p.ranks);
            parts.push(format!(
                "read them back at {}",
                rate(&r.read, r.elapsed.as_secs_f64().max(1e-9))
            ));
        }
        if let Some(p) = phase_of("hot_read") {
            let r = merged(&p.ranks);
            let (h, m) = fd_cache(&p.ranks);
            parts.push(format!(
                "re-read them at {} with {:.0}% of opens saved by the open-file cache",
                rate(&r.read, r.elapsed.as_secs_f64().max(1e-9)),
                100.0 * h as f64 / (h + m).max(1) as f64
            ));
        }
        format!(
            "{}; on {}, the first read from {}{}",
            parts.join(", "),
            self.env.filesystem,
            self.first_read_from(),
            if interrupted() {
                " (interrupted: partial)"
            } else {
                ""
            }
        )
    }

    /// Each phase's figures, by name, for the JSON report.
    fn phases_json(&self) -> serde_json::Map<String, Value> {
        let mut ph = serde_json::Map::new();
        for p in self.phases {
            let r = merged(&p.ranks);
            let secs = r.elapsed.as_secs_f64().max(1e-9);
            let (h, m) = fd_cache(&p.ranks);
            ph.insert(
                p.name.to_string(),
                json!({
                    "elapsed_s": secs,
                    "read": dir_json(&r.read, secs),
                    "write": dir_json(&r.write, secs),
                    "hits": r.hits,
                    "misses": r.misses,
                    "verify_errors": r.verify_errors,
                    "fd_cache": {"hits": h, "misses": m},
                }),
            );
        }
        ph
    }

    /// The JSON report: the options, each phase, the sums over the phases and the summary.
    fn json(&self, summary: String) -> Value {
        let (args, phases, layout) = (self.args, self.phases, self.layout);
        let ph = self.phases_json();
        let mut all = Run::empty();
        for p in phases {
            all.merge(&merged(&p.ranks));
        }
        let secs: f64 = phases
            .iter()
            .map(|p| merged(&p.ranks).elapsed.as_secs_f64())
            .sum::<f64>()
            .max(1e-9);
        let (h, m) = phases
            .iter()
            .map(|p| fd_cache(&p.ranks))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        let last = &phases[phases.len() - 1].ranks[0];
        json!({
            "rw": "main",
            "bs": args.bs,
            "nblocks": self.nblocks,
            "loops": args.loops(),
            "iodepth": iodepth(args),
            "batch": args.batch,
            "numjobs": args.numjobs,
            "nworkers": self.nranks,
            "engine": self.engine,
            "layout": {"depth": layout.depth, "fanout": layout.fanout},
            "verify": args.verify.to_string(),
            "direct": args.direct,
            "dir": self.root.display().to_string(),
            "filesystem": self.env.filesystem,
            "page_cache_resident": self.env.page_cache_resident,
            "interrupted": interrupted(),
            "phases": ph,
            "ops": all.ops(),
            "elapsed_s": secs,
            "ops_per_sec": all.ops() as f64 / secs,
            "hits": all.hits,
            "misses": all.misses,
            "errors": all.errors(),
            "verify_data": args.verify_data,
            "verify_errors": all.verify_errors,
            "corrupt": phases.iter().map(|p| delta(&p.ranks, |s| s.corrupt)).sum::<u64>(),
            "fd_cache": {"hits": h, "misses": m},
            "store": last.after,
            "summary": summary,
        })
    }

    /// The text report: a header, each phase's lines, the filesystem, the page cache and the
    /// summary.
    fn text(&self, out: &mut impl Write, summary: &str) -> std::io::Result<()> {
        let (args, root) = (self.args, self.root);
        self.header(out)?;
        if self.nranks > 1 {
            writeln!(
                out,
                "  {} workers (tensor-parallel ranks), figures summed",
                self.nranks
            )?;
        }
        for p in self.phases {
            let r = merged(&p.ranks);
            let secs = r.elapsed.as_secs_f64().max(1e-9);
            let (label, d) = match p.name {
                "write" => ("write", &r.write),
                "read" => ("read", &r.read),
                _ => ("hot read", &r.read),
            };
            writeln!(out, "  {label} ({}):", p.what)?;
            dir_lines(out, &format!("  {label}"), d, secs, args.batch)?;
            if p.name != "write" {
                let (h, m) = fd_cache(&p.ranks);
                writeln!(
                    out,
                    "      hits={} misses={} fd-cache: hits={h} misses={m} (a miss opens the file)",
                    r.hits, r.misses
                )?;
            }
        }
        writeln!(
            out,
            "  filesystem: {} ({})",
            self.env.filesystem,
            root.display()
        )?;
        writeln!(out, "  page cache: {}", self.page_cache_text())?;
        if interrupted() {
            writeln!(
                out,
                "  interrupted: partial result (the run stopped at the signal)"
            )?;
        }
        writeln!(out, "summary: {summary}")
    }

    /// The text report's first line: the working set, where it is, and the options.
    fn header(&self, out: &mut impl Write) -> std::io::Result<()> {
        let args = self.args;
        writeln!(
            out,
            "tierkv-bench: the main job: {} blocks of {} ({}){} in {} ({}); engine={} iodepth={} batch={} numjobs={} layout=({}) verify={}{}",
            self.nblocks,
            human_bytes(args.bs as f64),
            human_bytes(self.total),
            if args.bs == 2 << 20 {
                ", each one 16-token block of an 8B Llama's KV"
            } else {
                ""
            },
            self.root.display(),
            self.env.filesystem,
            self.engine,
            iodepth(args),
            args.batch,
            args.numjobs,
            self.layout,
            args.verify,
            if args.direct { " direct" } else { "" },
        )
    }
}
