//! fio-style reports of a run: per direction bandwidth, IOPS and latency percentiles, hits,
//! the open-file cache; the same fields as JSON for scripts.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};
use tierkv::{Layout, StoreStats, WorkerId};

use crate::common::BoxError;
use crate::{Args, Dir, OutputFormat, Run, Rw};

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

fn dir_json(d: &Dir, secs: f64) -> Value {
    json!({
        "ops": d.ops,
        "bytes": d.bytes,
        "errors": d.errors,
        "ops_per_sec": d.ops as f64 / secs,
        "bw_bytes_per_sec": d.bytes as f64 / secs,
        "lat_us": lat_json(d),
    })
}

fn dir_lines(out: &mut impl Write, name: &str, d: &Dir, secs: f64) -> std::io::Result<()> {
    let l = &d.lat;
    let q = |p: f64| l.value_at_quantile(p) as f64 / 1e3;
    writeln!(
        out,
        "  {name}: IOPS={}, BW={}/s, {} ops in {secs:.3}s",
        human_count(d.ops as f64 / secs),
        human_bytes(d.bytes as f64 / secs),
        d.ops,
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
    let mut run = Run::empty();
    for r in ranks {
        run.merge(&r.run);
    }
    let delta = |f: fn(&StoreStats) -> u64| -> u64 {
        ranks
            .iter()
            .map(|r| f(&r.after).saturating_sub(f(&r.before)))
            .sum()
    };
    let secs = run.elapsed.as_secs_f64().max(1e-9);
    let ops = run.ops();
    let bytes = run.read.bytes + run.write.bytes;
    let errors = run.read.errors + run.write.errors;
    let corrupt = delta(|s| s.corrupt);
    let fd_hits = delta(|s| s.fd_cache_hits);
    let fd_misses = delta(|s| s.fd_cache_misses);
    let fd_evictions = delta(|s| s.fd_cache_evictions);
    let evictions = delta(|s| s.evictions);
    let not_admitted = delta(|s| s.not_admitted);
    let fd_capacity = ranks[0].after.fd_cache_capacity;
    let fd_ratio = if fd_hits + fd_misses > 0 {
        fd_hits as f64 / (fd_hits + fd_misses) as f64
    } else {
        0.0
    };
    let mut all = Dir::new();
    all.merge(&run.read);
    all.merge(&run.write);
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => {
            let workers: Vec<Value> = ranks
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
                .collect();
            let doc = json!({
                "rw": format!("{:?}", args.rw).to_lowercase(),
                "bs": args.bs,
                "nblocks": nblocks,
                "loops": args.loops,
                "iodepth": args.iodepth,
                "numjobs": args.numjobs,
                "worker": ranks[0].worker.as_str(),
                "nworkers": ranks.len(),
                "engine": engine,
                "layout": {"depth": layout.depth, "fanout": layout.fanout},
                "fd_cache_capacity": fd_capacity,
                "verify": args.verify.to_string(),
                "direct": args.direct,
                "dir": root.display().to_string(),
                "ops": ops,
                "elapsed_s": secs,
                "ops_per_sec": ops as f64 / secs,
                "bw_bytes_per_sec": bytes as f64 / secs,
                "bytes": bytes,
                "hits": run.hits,
                "misses": run.misses,
                "errors": errors,
                "corrupt": corrupt,
                "evictions": evictions,
                "not_admitted": not_admitted,
                "read": dir_json(&run.read, secs),
                "write": dir_json(&run.write, secs),
                "fd_cache": {"hits": fd_hits, "misses": fd_misses, "hit_ratio": fd_ratio,
                             "evictions": fd_evictions},
                "lat_us": lat_json(&all),
                "workers": workers,
                // Worker 0's counters (each worker's are in `workers`).
                "store": ranks[0].after,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        OutputFormat::Normal => {
            writeln!(
                out,
                "tierkv-bench: rw={} bs={} nblocks={} loops={} iodepth={} numjobs={}{} engine={engine} layout=({layout}) fd-cache={fd_capacity} verify={}{}",
                format!("{:?}", args.rw).to_lowercase(),
                human_bytes(args.bs as f64),
                nblocks,
                args.loops,
                args.iodepth,
                args.numjobs,
                if ranks.len() > 1 {
                    format!(" workers={}", ranks.len())
                } else {
                    String::new()
                },
                args.verify,
                if args.direct { " direct" } else { "" },
            )?;
            let reads = matches!(args.rw, Rw::Read | Rw::Randread | Rw::Randrw);
            let writes = matches!(args.rw, Rw::Write | Rw::Randwrite | Rw::Randrw);
            if reads {
                dir_lines(&mut out, "read", &run.read, secs)?;
            }
            if writes {
                dir_lines(&mut out, "write", &run.write, secs)?;
            }
            if reads {
                writeln!(
                    out,
                    "  hits={} misses={} corrupt={corrupt} read-errors={} bytes-read={}",
                    run.hits, run.misses, run.read.errors, run.read.bytes
                )?;
                writeln!(
                    out,
                    "  fd-cache: hits={fd_hits} misses={fd_misses} hit-ratio={fd_ratio:.3} evictions={fd_evictions}"
                )?;
            }
            if writes {
                writeln!(
                    out,
                    "  puts={} put-errors={} bytes-written={} evictions={evictions} not-admitted={not_admitted}",
                    run.write.ops - run.write.errors,
                    run.write.errors,
                    run.write.bytes
                )?;
            }
            if ranks.len() > 1 {
                for r in ranks {
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
        }
    }
    Ok(())
}
