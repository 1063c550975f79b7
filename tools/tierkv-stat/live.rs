//! `--live` and `--watch`: the counters that running stores publish in `STATS.json`, as text,
//! JSON or Prometheus metrics; with `--watch`, refreshed every interval, with rates.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

use tierkv::OffloadStats;
use tierkv::StoreStats;
use tierkv::inspect::LiveStats;
use tierkv::inspect::STATS_FILE;

use super::{
    Args, Format, MetricRows, Printable, escape_label, human, live_fresh, now_ms, read_all_live,
};
use crate::common::BoxError;

/// Prints the live counters of the workers' stores; with `--watch`, again every interval
/// (until `--iterations`), with the rates since the last.
pub(super) fn live(args: &Args, vdir: &Path, workers: &[String]) -> Result<ExitCode, BoxError> {
    let mut prev: BTreeMap<String, (LiveStats, u64)> = BTreeMap::new();
    let mut n = 0u64;
    loop {
        let snaps = snapshots(vdir, workers);
        if snaps.is_empty() && args.watch.is_none() {
            return Err(format!("no live counters under {} (is a store running? it writes {STATS_FILE} every second)", vdir.display()).into());
        }
        let mut out = std::io::stdout().lock();
        if args.watch.is_some() && args.format == Format::Text && std::io::stdout().is_terminal() {
            write!(out, "\x1b[H\x1b[2J")?;
        }
        match args.format {
            Format::Json => {
                let doc: BTreeMap<&String, &LiveStats> =
                    snaps.iter().map(|(w, l)| (w, l)).collect();
                writeln!(out, "{}", serde_json::to_string(&doc)?)?;
            }
            Format::Prometheus => print_prometheus(&mut out, &snaps)?,
            Format::Text => {
                let mut out = Printable(&mut out);
                for (w, l) in &snaps {
                    print_store(&mut out, w, l, prev.get(w).map(|(p, _)| p))?;
                }
            }
        }
        out.flush()?;
        drop(out);
        for (w, l) in snaps {
            prev.insert(w, (l, now_ms()));
        }
        n += 1;
        match args.watch {
            Some(every) if args.iterations.is_none_or(|max| n < max) => std::thread::sleep(every),
            _ => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// The stores' counters now, one entry per store: the worker's id, or for each shared store
/// `<worker>/<host>:<pid>`.
fn snapshots(vdir: &Path, workers: &[String]) -> Vec<(String, LiveStats)> {
    workers
        .iter()
        .flat_map(|w| {
            read_all_live(vdir, w).into_iter().map(move |(file, l)| {
                let key = if file == STATS_FILE {
                    w.clone()
                } else {
                    format!("{w}/{}:{}", l.host, l.pid)
                };
                (key, l)
            })
        })
        .collect()
}

/// The stores' counters as Prometheus metrics, each with its stores' values.
fn print_prometheus(out: &mut impl Write, snaps: &[(String, LiveStats)]) -> std::io::Result<()> {
    let mut by_metric: MetricRows<'_> = BTreeMap::new();
    for (w, l) in snaps {
        for (name, help, counter, v) in live_metrics(l) {
            by_metric
                .entry(name)
                .or_insert((help, counter, Vec::new()))
                .2
                .push((w.as_str(), v));
        }
    }
    for (name, (help, counter, vals)) in by_metric {
        writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            if counter { "counter" } else { "gauge" }
        )?;
        for (w, v) in vals {
            writeln!(out, "{name}{{worker=\"{}\"}} {v}", escape_label(w))?;
        }
    }
    Ok(())
}

/// One store's counters as text; with `prev`, its counters at the last refresh, the rates.
fn print_store(
    out: &mut impl Write,
    w: &str,
    l: &LiveStats,
    prev: Option<&LiveStats>,
) -> std::io::Result<()> {
    let s = &l.stats;
    let state = if live_fresh(l) {
        "running"
    } else if l.open {
        "stale (not updated)"
    } else {
        "closed"
    };
    writeln!(
        out,
        "worker {w}: {state}, pid {}, policy {}, engine {}, {}",
        l.pid, l.policy, l.engine, l.sharing
    )?;
    if let (Some(b), Some(f)) = (s.shared_bytes, s.shared_files) {
        writeln!(
            out,
            "  shared: ledger {} in {f} files; tree lookups {} (hits {}), negative-cache answers {}, published by others {}",
            human(b),
            s.tree_lookups,
            s.tree_hits,
            s.negative_hits,
            s.published_by_others
        )?;
    }
    print_store_counters(out, s)?;
    if let Some(o) = &s.offload {
        print_offload(out, o)?;
    }
    if let Some(p) = prev {
        print_rates(out, l, p)?;
    }
    Ok(())
}

/// A store's lookups, usage, open-file cache, errors and latencies.
fn print_store_counters(out: &mut impl Write, s: &StoreStats) -> std::io::Result<()> {
    let lookups = s.hits + s.misses;
    writeln!(
        out,
        "  hits {} misses {} (hit ratio {:.3}), read {}, written {}, puts {}",
        s.hits,
        s.misses,
        if lookups > 0 {
            s.hits as f64 / lookups as f64
        } else {
            0.0
        },
        human(s.bytes_read),
        human(s.bytes_written),
        s.puts
    )?;
    let cap = s
        .capacity_bytes
        .map(human)
        .or(s.capacity_files.map(|f| format!("{f} files")))
        .unwrap_or_else(|| "unbounded".into());
    writeln!(
        out,
        "  usage {} in {} files, capacity {cap}; evictions {} (files reused {}), not admitted {}",
        human(s.used_bytes),
        s.used_files,
        s.evictions,
        s.reused_files,
        s.not_admitted
    )?;
    writeln!(
        out,
        "  fd cache {}/{}: hits {} misses {} evictions {}; corrupt {}; errors: no space {}, io {}, emfile {}, input {}",
        s.fd_cache_len,
        s.fd_cache_capacity,
        s.fd_cache_hits,
        s.fd_cache_misses,
        s.fd_cache_evictions,
        s.corrupt,
        s.errors.no_space,
        s.errors.io,
        s.errors.too_many_open_files,
        s.errors.invalid_input
    )?;
    writeln!(
        out,
        "  get_many latency us: mean {:.1} p50 {:.1} p99 {:.1} max {:.1}; put_many: mean {:.1} p50 {:.1} p99 {:.1} max {:.1}",
        us(s.get_latency.mean_ns),
        us(s.get_latency.p50_ns),
        us(s.get_latency.p99_ns),
        us(s.get_latency.max_ns),
        us(s.put_latency.mean_ns),
        us(s.put_latency.p50_ns),
        us(s.put_latency.p99_ns),
        us(s.put_latency.max_ns)
    )
}

/// The write-behind offloader's counters and latencies.
fn print_offload(out: &mut impl Write, o: &OffloadStats) -> std::io::Result<()> {
    writeln!(
        out,
        "  offload ({}): offered {} queued {} written {} ({}); in flight {} ({}); deduped {} stored + {} queued; dropped: full {} filtered {} no parent {} closed {}; not admitted {} failed {}; served from queue {}",
        o.filter,
        o.offered,
        o.queued,
        o.written,
        human(o.written_bytes),
        o.in_flight_blocks,
        human(o.in_flight_bytes),
        o.deduped_present,
        o.deduped_queued,
        o.dropped_full,
        o.dropped_filtered,
        o.dropped_no_parent,
        o.dropped_closed,
        o.not_admitted,
        o.failed,
        o.served_from_queue
    )?;
    writeln!(
        out,
        "  offload queue wait us: p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}; offer call us: p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}",
        us(o.queue_wait.p50_ns),
        us(o.queue_wait.p99_ns),
        us(o.queue_wait.p999_ns),
        us(o.queue_wait.max_ns),
        us(o.offer_latency.p50_ns),
        us(o.offer_latency.p99_ns),
        us(o.offer_latency.p999_ns),
        us(o.offer_latency.max_ns)
    )
}

/// The rates per second between the counters `p` of the last refresh and `l`'s.
fn print_rates(out: &mut impl Write, l: &LiveStats, p: &LiveStats) -> std::io::Result<()> {
    let s = &l.stats;
    let dt = (l.updated_unix_ms.saturating_sub(p.updated_unix_ms) as f64 / 1000.0).max(1e-3);
    let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
    writeln!(
        out,
        "  rates/s: hits {:.0} misses {:.0} read {}/s written {}/s puts {:.0} evictions {:.0}",
        rate(s.hits, p.stats.hits),
        rate(s.misses, p.stats.misses),
        human(rate(s.bytes_read, p.stats.bytes_read) as u64),
        human(rate(s.bytes_written, p.stats.bytes_written) as u64),
        rate(s.puts, p.stats.puts),
        rate(s.evictions, p.stats.evictions)
    )
}

/// Nanoseconds in microseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A metric of a store's live counters: (name, help, counter?, value).
type LiveMetric = (&'static str, &'static str, bool, f64);

/// A counter: (name, help, value).
type Counter = (&'static str, &'static str, u64);

/// The metrics of a store's live counters, in order: (name, help, counter?, value).
fn live_metrics(l: &LiveStats) -> Vec<LiveMetric> {
    let s = &l.stats;
    let mut m: Vec<LiveMetric> = store_counters(s)
        .into_iter()
        .map(|(name, help, v)| (name, help, true, v as f64))
        .collect();
    m.extend(store_gauges(l));
    // The write-behind offloader, when one runs in front of the store.
    if let Some(o) = &s.offload {
        for (name, help, v) in offload_counters(o) {
            m.push((name, help, true, v as f64));
        }
        m.extend(offload_gauges(o));
    }
    // An unbounded store has no capacity gauge (a 0 would read as a full store).
    if let Some(c) = s.capacity_bytes {
        m.push(("tierkv_capacity_bytes", "Byte capacity.", false, c as f64));
    }
    if let Some(c) = s.capacity_files {
        m.push(("tierkv_capacity_files", "File capacity.", false, c as f64));
    }
    m
}

/// The store's counters: lookups, bytes, puts, evictions, the open-file cache, errors.
fn store_counters(s: &StoreStats) -> [Counter; 15] {
    [
        (
            "tierkv_hits_total",
            "Lookups that returned a block.",
            s.hits,
        ),
        (
            "tierkv_misses_total",
            "Lookups that found no block.",
            s.misses,
        ),
        (
            "tierkv_read_bytes_total",
            "Payload bytes returned by hits.",
            s.bytes_read,
        ),
        (
            "tierkv_written_bytes_total",
            "Payload bytes of published puts.",
            s.bytes_written,
        ),
        ("tierkv_puts_total", "Blocks published.", s.puts),
        ("tierkv_evictions_total", "Blocks evicted.", s.evictions),
        (
            "tierkv_not_admitted_total",
            "Puts declined by admission control.",
            s.not_admitted,
        ),
        (
            "tierkv_corrupt_total",
            "Corrupt block files found by reads.",
            s.corrupt,
        ),
        (
            "tierkv_fd_cache_hits_total",
            "Reads through a cached descriptor.",
            s.fd_cache_hits,
        ),
        (
            "tierkv_fd_cache_misses_total",
            "Reads that opened the file.",
            s.fd_cache_misses,
        ),
        (
            "tierkv_fd_cache_evictions_total",
            "Descriptors evicted from the open-file cache.",
            s.fd_cache_evictions,
        ),
        (
            "tierkv_errors_no_space_total",
            "NoSpace errors returned.",
            s.errors.no_space,
        ),
        (
            "tierkv_errors_io_total",
            "I/O errors returned.",
            s.errors.io,
        ),
        (
            "tierkv_errors_too_many_open_files_total",
            "EMFILE errors returned.",
            s.errors.too_many_open_files,
        ),
        (
            "tierkv_errors_invalid_input_total",
            "Invalid keys, sizes and buffers.",
            s.errors.invalid_input,
        ),
    ]
}

/// The store's gauges: usage, latency, and whether it is up.
fn store_gauges(l: &LiveStats) -> [LiveMetric; 5] {
    let s = &l.stats;
    [
        (
            "tierkv_used_bytes",
            "On-disk bytes of the block files.",
            false,
            s.used_bytes as f64,
        ),
        (
            "tierkv_used_files",
            "Block files held.",
            false,
            s.used_files as f64,
        ),
        (
            "tierkv_get_latency_p99_seconds",
            "99th percentile of get_many latency.",
            false,
            s.get_latency.p99_ns as f64 / 1e9,
        ),
        (
            "tierkv_put_latency_p99_seconds",
            "99th percentile of put_many latency.",
            false,
            s.put_latency.p99_ns as f64 / 1e9,
        ),
        (
            "tierkv_up",
            "1 if the store is open and publishing.",
            false,
            if live_fresh(l) { 1.0 } else { 0.0 },
        ),
    ]
}

/// The write-behind offloader's counters.
fn offload_counters(o: &OffloadStats) -> [Counter; 13] {
    [
        (
            "tierkv_offload_offered_total",
            "Blocks offered to the write-behind offloader.",
            o.offered,
        ),
        (
            "tierkv_offload_queued_total",
            "Blocks queued for writing.",
            o.queued,
        ),
        (
            "tierkv_offload_written_total",
            "Queued blocks the store holds after their batch.",
            o.written,
        ),
        (
            "tierkv_offload_written_bytes_total",
            "Payload bytes of written blocks.",
            o.written_bytes,
        ),
        (
            "tierkv_offload_not_admitted_total",
            "Queued blocks the store declined.",
            o.not_admitted,
        ),
        (
            "tierkv_offload_failed_total",
            "Queued blocks whose write failed.",
            o.failed,
        ),
        (
            "tierkv_offload_deduped_present_total",
            "Offered blocks already stored.",
            o.deduped_present,
        ),
        (
            "tierkv_offload_deduped_queued_total",
            "Offered blocks already queued.",
            o.deduped_queued,
        ),
        (
            "tierkv_offload_dropped_full_total",
            "Offered blocks dropped: queue full.",
            o.dropped_full,
        ),
        (
            "tierkv_offload_dropped_filtered_total",
            "Offered blocks dropped by the admission filter.",
            o.dropped_filtered,
        ),
        (
            "tierkv_offload_dropped_no_parent_total",
            "Offered blocks dropped: chain parent missing.",
            o.dropped_no_parent,
        ),
        (
            "tierkv_offload_dropped_closed_total",
            "Blocks dropped at shutdown.",
            o.dropped_closed,
        ),
        (
            "tierkv_offload_served_from_queue_total",
            "Gets served from the queue.",
            o.served_from_queue,
        ),
    ]
}

/// The write-behind offloader's gauges: what is in flight, and its latencies.
fn offload_gauges(o: &OffloadStats) -> [LiveMetric; 4] {
    [
        (
            "tierkv_offload_in_flight_blocks",
            "Blocks queued or being written.",
            false,
            o.in_flight_blocks as f64,
        ),
        (
            "tierkv_offload_in_flight_bytes",
            "Payload bytes queued or being written.",
            false,
            o.in_flight_bytes as f64,
        ),
        (
            "tierkv_offload_queue_wait_p99_seconds",
            "99th percentile of the time a block waits in the write-behind queue.",
            false,
            o.queue_wait.p99_ns as f64 / 1e9,
        ),
        (
            "tierkv_offload_offer_latency_p99_seconds",
            "99th percentile of the engine thread's time in an offer call.",
            false,
            o.offer_latency.p99_ns as f64 / 1e9,
        ),
    ]
}
