//! `--rw offload`: the engine thread's time per offer through the write-behind offloader
//! while the writer keeps the disk saturated, and the sustained write throughput, side by
//! side with plain `put_many` of the same blocks (docs/engine-api.md).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;
use tierkv::{BlockHash, BlockKey, Store, StoreConfig, WorkerId};
use tierkv::{OffloadConfig, OffloadStats, Offloader, OnClose, Payload};

use crate::common::BoxError;
use crate::{Args, OutputFormat, human_bytes};

fn hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram")
}

fn pct(h: &Histogram<u64>) -> serde_json::Value {
    json!({
        "count": h.len(),
        "p50_ns": h.value_at_quantile(0.5),
        "p99_ns": h.value_at_quantile(0.99),
        "p99.9_ns": h.value_at_quantile(0.999),
        "max_ns": h.max(),
    })
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

/// The chain of `batch` keys number `chain` (distinct per phase by `salt`).
fn chain(store: &Store, salt: u32, chain: u64, batch: usize) -> Vec<BlockKey> {
    let mut parent: Option<BlockHash> = None;
    (0..batch)
        .map(|j| {
            let h = BlockHash::chain(
                parent.as_ref(),
                &[salt, chain as u32, (chain >> 32) as u32, j as u32],
            );
            parent = Some(h);
            store.key(h)
        })
        .collect()
}

/// `--rw offload`: plain `put_many` of the blocks, then the same number written through the
/// offloader, and the two side by side.
pub(crate) fn offload(
    args: &Args,
    config: &StoreConfig,
    root: &Path,
    bs: usize,
    nblocks: u64,
) -> Result<(), BoxError> {
    let batch = args.batch.max(1);
    let chains = nblocks.div_ceil(batch as u64);
    // The engine's buffers: a few, reused (a guard of each goes with every offer: no copy).
    let pool: Vec<Arc<[u8]>> = (0..8u8)
        .map(|i| Arc::from(vec![0x5A ^ i; bs].into_boxed_slice()))
        .collect();
    let put = put_many_phase(root, config, &pool, chains, batch)?;
    let off = offload_phase(args, root, config, &pool, chains * batch as u64, batch)?;
    let c = Comparison {
        args,
        bs,
        batch,
        blocks: chains * batch as u64,
        put,
        off,
    };
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&c.json())?)?,
        OutputFormat::Normal => c.text(&mut out)?,
    }
    Ok(())
}

/// Phase 1's figures: the engine thread's time per `put_many` call, and the throughput.
struct PutPhase {
    lat: Histogram<u64>,
    secs: f64,
    bytes: u64,
}

/// Phase 2's figures: the engine thread's time per offer (queued, or dropped with the queue
/// full), and the throughput the writer sustained.
struct OffloadPhase {
    queued_lat: Histogram<u64>,
    dropped_lat: Histogram<u64>,
    secs: f64,
    offers: u64,
    stats: OffloadStats,
}

/// 1. Plain put_many: the engine thread does the writes itself, `chains` chains of `batch`
///    blocks.
fn put_many_phase(
    root: &Path,
    config: &StoreConfig,
    pool: &[Arc<[u8]>],
    chains: u64,
    batch: usize,
) -> Result<PutPhase, BoxError> {
    let store = Store::open(root, WorkerId::new("plain")?, config.clone())?;
    let mut put_lat = hist();
    let started = Instant::now();
    for c in 0..chains {
        let keys = chain(&store, 1, c, batch);
        let items: Vec<(BlockKey, &[u8])> = keys
            .iter()
            .enumerate()
            .map(|(j, k)| (k.clone(), &pool[j % pool.len()][..]))
            .collect();
        let t = Instant::now();
        for r in store.put_many(&items) {
            r?;
        }
        put_lat.record(t.elapsed().as_nanos().max(1) as u64)?;
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = store.stats().bytes_written;
    drop(store);
    Ok(PutPhase {
        lat: put_lat,
        secs,
        bytes,
    })
}

/// 2. Through the offloader: the engine thread offers chain after chain of `batch` blocks,
///    never waiting; the writer keeps the disk busy (the queue stays full, the newest offers
///    dropped) until `want` blocks (as many as in phase 1) are written.
fn offload_phase(
    args: &Args,
    root: &Path,
    config: &StoreConfig,
    pool: &[Arc<[u8]>],
    want: u64,
    batch: usize,
) -> Result<OffloadPhase, BoxError> {
    let store = Store::open(root, WorkerId::new("offload")?, config.clone())?;
    let mut cfg = OffloadConfig::new();
    if let Some(q) = args.offload_queue {
        cfg = cfg.with_max_bytes(q);
    }
    let off = Offloader::new(store.clone(), cfg)?;
    let mut queued_lat = hist();
    let mut dropped_lat = hist();
    let started = Instant::now();
    let mut c = 0u64;
    let mut offers = 0u64;
    while off.stats().written < want {
        let keys = chain(&store, 2, c, batch);
        c += 1;
        let blocks: Vec<(BlockKey, Payload)> = keys
            .into_iter()
            .enumerate()
            .map(|(j, k)| (k, Payload::from(pool[j % pool.len()].clone())))
            .collect();
        let t = Instant::now();
        let got = off.offer(None, blocks);
        let ns = t.elapsed().as_nanos().max(1) as u64;
        offers += 1;
        if got.queued > 0 {
            queued_lat.record(ns)?;
        } else {
            dropped_lat.record(ns)?;
        }
        // An engine computes between offers; here the next offer follows at once, but not
        // so fast that the loop starves the writer of the CPU on a small machine.
        if got.queued == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let stats = off.close(OnClose::Drop);
    drop(store);
    Ok(OffloadPhase {
        queued_lat,
        dropped_lat,
        secs,
        offers,
        stats,
    })
}

/// The two phases side by side, for the report.
struct Comparison<'a> {
    args: &'a Args,
    bs: usize,
    batch: usize,
    /// Blocks written in each phase.
    blocks: u64,
    put: PutPhase,
    off: OffloadPhase,
}

impl Comparison<'_> {
    /// Phase 1's throughput, bytes per second.
    fn put_bw(&self) -> f64 {
        self.put.bytes as f64 / self.put.secs.max(1e-9)
    }

    /// Phase 2's throughput, bytes per second.
    fn off_bw(&self) -> f64 {
        self.off.stats.written_bytes as f64 / self.off.secs.max(1e-9)
    }

    /// The JSON report.
    fn json(&self) -> serde_json::Value {
        let (put, off, batch) = (&self.put, &self.off, self.batch);
        let (put_bw, off_bw) = (self.put_bw(), self.off_bw());
        json!({
            "rw": "offload",
            "bs": self.bs,
            "batch": batch,
            "blocks": self.blocks,
            "direct": self.args.direct,
            "put_many": {
                "bw_bytes": put_bw,
                "elapsed_s": put.secs,
                "call_latency": pct(&put.lat),
                "per_block_p99_ns": put.lat.value_at_quantile(0.99) / batch as u64,
            },
            "offload": {
                "bw_bytes": off_bw,
                "elapsed_s": off.secs,
                "offers": off.offers,
                "offer_latency_queued": pct(&off.queued_lat),
                "offer_latency_dropped": pct(&off.dropped_lat),
                "stats": off.stats,
            },
            "bw_ratio_offload_to_put_many": off_bw / put_bw.max(1e-9),
        })
    }

    /// The text report.
    fn text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let (put_lat, off, s) = (&self.put.lat, &self.off, &self.off.stats);
        let (put_bw, off_bw) = (self.put_bw(), self.off_bw());
        let (queued_lat, dropped_lat) = (&off.queued_lat, &off.dropped_lat);
        writeln!(
            out,
            "tierkv-bench: rw=offload bs={} batch={} blocks={} direct={}",
            human_bytes(self.bs as f64),
            self.batch,
            self.blocks,
            self.args.direct
        )?;
        writeln!(
            out,
            "  put_many (engine thread writes): {}/s; engine thread per call us p50={:.1} p99={:.1} p99.9={:.1} max={:.1}",
            human_bytes(put_bw),
            us(put_lat, 0.5),
            us(put_lat, 0.99),
            us(put_lat, 0.999),
            put_lat.max() as f64 / 1e3
        )?;
        writeln!(
            out,
            "  offload (write-behind): {}/s sustained ({:.2}x put_many); {} offers, {} queued, {} dropped full",
            human_bytes(off_bw),
            off_bw / put_bw.max(1e-9),
            off.offers,
            queued_lat.len(),
            dropped_lat.len()
        )?;
        writeln!(
            out,
            "  engine thread per offer (queued) us p50={:.1} p99={:.1} p99.9={:.1} max={:.1}; (dropped) p50={:.1} p99={:.1} p99.9={:.1}",
            us(queued_lat, 0.5),
            us(queued_lat, 0.99),
            us(queued_lat, 0.999),
            queued_lat.max() as f64 / 1e3,
            us(dropped_lat, 0.5),
            us(dropped_lat, 0.99),
            us(dropped_lat, 0.999)
        )?;
        writeln!(
            out,
            "  queue wait us p50={:.0} p99={:.0}; written {} blocks, dropped {} full, {} at close",
            s.queue_wait.p50_ns as f64 / 1e3,
            s.queue_wait.p99_ns as f64 / 1e3,
            s.written,
            s.dropped_full,
            s.dropped_closed
        )
    }
}
