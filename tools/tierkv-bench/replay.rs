//! `--rw replay`: a Mooncake-format trace through the store.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tierkv::Oracle;
use tierkv::{BlockHash, BlockKey, Lookup, Store, StoreStats};
use tierkv::{FilterKind, OffloadConfig, Offloader, OnClose};

use crate::common::{BoxError, UsageError};
use crate::{Args, OutputFormat, fill_block, human_bytes};

pub(crate) struct ReplayRun {
    requests: u64,
    refs: u64,
    hits: u64,
    read_misses: u64,
    errors: u64,
    /// Hits whose bytes were not the block's (`--verify-data`).
    verify_errors: u64,
    elapsed: Duration,
    /// When the replay started and ended, milliseconds since the epoch (so runs in several
    /// processes can be shown to overlap).
    started_unix_ms: u64,
    ended_unix_ms: u64,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The store key of a trace's hash id.
fn trace_hash(id: u64) -> BlockHash {
    let mut h = blake3::Hasher::new();
    h.update(b"tierkv-trace.v1");
    h.update(&id.to_le_bytes());
    BlockHash(*h.finalize().as_bytes())
}

fn load_trace(path: &std::path::Path) -> Result<Vec<Vec<u64>>, BoxError> {
    let text = read_trace(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.trim().is_empty() {
        return Err(UsageError(format!(
            "{}: the trace holds no requests (an empty file, or a FIFO no writer has open)",
            path.display()
        ))
        .into());
    }
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

/// The text of the trace at `path`. Opened without blocking, so that a FIFO no writer has open
/// reads as empty instead of waiting for one for ever; a pipe with a writer (`--trace
/// <(zcat trace.gz)`) is then read to its end as a file is.
fn read_trace(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let flags = rustix::fs::fcntl_getfl(&f)?;
    rustix::fs::fcntl_setfl(&f, flags - rustix::fs::OFlags::NONBLOCK)?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok(text)
}

/// Per request: hits = longest present prefix (read for real, every block verified), then
/// the rest is offered in one batch (absent blocks stored, present ones touched); with a
/// write filter, through an [`Offloader`] (flushed before the next request, so the figures
/// are the filter's, not the queue's timing).
pub(crate) fn replay(
    store: &Store,
    trace: &std::path::Path,
    bs: usize,
    oracle: Option<&Arc<Mutex<Oracle>>>,
    verify_data: bool,
    write_filter: Option<FilterKind>,
) -> Result<ReplayRun, BoxError> {
    let offload = write_filter
        .map(|f| Offloader::new(store.clone(), OffloadConfig::new().with_filter(f)))
        .transpose()?;
    let reqs = load_trace(trace)?;
    let next = next_uses(&reqs);
    let longest = reqs.iter().map(Vec::len).max().unwrap_or(0);
    // The longest request's blocks are held at once: a usage error past the memory there is.
    crate::check_memory(&crate::MemoryNeed {
        bytes: (longest as u128 + 1) * bs as u128,
        what: format!(
            "the trace's longest request, {longest} blocks of --bs {}",
            human_bytes(bs as f64)
        ),
    })?;
    let mut rp = Replayer {
        store,
        offload,
        bs,
        verify_data,
        bufs: (0..longest).map(|_| vec![0u8; bs]).collect(),
        data: vec![0xA5u8; bs],
    };
    let mut run = ReplayRun {
        requests: 0,
        refs: 0,
        hits: 0,
        read_misses: 0,
        errors: 0,
        verify_errors: 0,
        elapsed: Duration::ZERO,
        started_unix_ms: unix_ms(),
        ended_unix_ms: 0,
    };
    let start = Instant::now();
    let mut pos = 0usize;
    for r in &reqs {
        if crate::interrupted() {
            break;
        }
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
        rp.read_prefix(&keys[..n], &r[..n], &mut run);
        rp.offer_rest(&keys, r, n, &mut run);
    }
    if let Some(off) = rp.offload {
        let s = off.close(OnClose::Write);
        run.errors += s.failed;
    }
    run.elapsed = start.elapsed();
    run.ended_unix_ms = unix_ms();
    Ok(run)
}

/// The next use of each reference position of the trace (its position in the trace's
/// references, or [`Oracle::NEVER`]), for the Belady oracle.
fn next_uses(reqs: &[Vec<u64>]) -> Vec<u64> {
    let flat: Vec<u64> = reqs.iter().flatten().copied().collect();
    let mut next = vec![Oracle::NEVER; flat.len()];
    let mut last: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for (i, id) in flat.iter().enumerate().rev() {
        next[i] = last.get(id).copied().unwrap_or(Oracle::NEVER);
        last.insert(*id, i as u64);
    }
    next
}

/// What a replay reads and writes with: the store, the offloader (with a write filter), the
/// options and the buffers.
struct Replayer<'a> {
    store: &'a Store,
    offload: Option<Offloader>,
    bs: usize,
    verify_data: bool,
    /// As many as the longest request has blocks.
    bufs: Vec<Vec<u8>>,
    /// The payload of a block to write.
    data: Vec<u8>,
}

impl Replayer<'_> {
    /// Reads a request's present prefix (`keys`, of trace ids `ids`), counting misses and
    /// errors (`--verify-data`: checking every hit's bytes).
    fn read_prefix(&mut self, keys: &[BlockKey], ids: &[u64], run: &mut ReplayRun) {
        let (store, bs) = (self.store, self.bs);
        let n = keys.len();
        let bufs = &mut self.bufs[..n];
        for (j, res) in store.get_many(keys, bufs).into_iter().enumerate() {
            match res {
                Ok(Lookup::Hit(len)) if self.verify_data => {
                    // Written once per trace id (generation 1), or by an earlier replay.
                    let checked = if len == bs {
                        crate::verify::check(&bufs[j][..len], &keys[j].hash, ids[j]).map(|_| ())
                    } else {
                        Err(format!("{len} bytes, not {bs}"))
                    };
                    if let Err(why) = checked {
                        run.verify_errors += 1;
                        tracing::error!(
                            path = %store.path_of(&keys[j].hash).display(),
                            block = ids[j],
                            "verify-data: {why}"
                        );
                    }
                }
                Ok(Lookup::Hit(_)) => {}
                Ok(Lookup::Miss) => run.read_misses += 1,
                Err(e) => {
                    run.errors += 1;
                    tracing::warn!(error = %e, "replay read failed");
                }
            }
        }
    }

    /// Offers the blocks of a request (`keys`, of trace ids `ids`) after its present prefix
    /// of `n`, in one batch: to the store, or through the offloader (flushed).
    fn offer_rest(&mut self, keys: &[BlockKey], ids: &[u64], n: usize, run: &mut ReplayRun) {
        let data = &mut self.data;
        let items: Vec<(BlockKey, Vec<u8>)> = keys[n..]
            .iter()
            .zip(&ids[n..])
            .map(|(k, id)| {
                fill_block(data, &k.hash, *id, 1);
                (k.clone(), data.clone())
            })
            .collect();
        let parent = n.checked_sub(1).map(|i| &keys[i]);
        if let Some(off) = &self.offload {
            off.offer(parent, items);
            off.flush();
            return;
        }
        for res in self.store.offer_many_after(parent, &items) {
            if let Err(e) = res {
                run.errors += 1;
                tracing::warn!(error = %e, "replay put failed");
            }
        }
    }
}

impl ReplayRun {
    /// The replay's time, seconds (never 0).
    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The fraction of the block references that hit.
    fn hit_ratio(&self) -> f64 {
        if self.refs > 0 {
            self.hits as f64 / self.refs as f64
        } else {
            0.0
        }
    }
}

/// Prints the replay's report; fails where `--verify-data` found blocks that were not theirs.
pub(crate) fn report_replay(
    args: &Args,
    store: &Store,
    root: &std::path::Path,
    r: &ReplayRun,
) -> Result<(), BoxError> {
    let s = store.stats();
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => {
            let doc = replay_json(args, store, root, r, &s);
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        OutputFormat::Normal => replay_text(&mut out, args, store, r, &s)?,
    }
    if r.verify_errors > 0 {
        return Err(format!(
            "--verify-data: {} blocks read back with bytes that were not theirs (see the log \
             for their paths)",
            r.verify_errors
        )
        .into());
    }
    Ok(())
}

/// The JSON report of a replay, with the store's counters `s`.
fn replay_json(
    args: &Args,
    store: &Store,
    root: &std::path::Path,
    r: &ReplayRun,
    s: &StoreStats,
) -> serde_json::Value {
    let secs = r.secs();
    json!({
        "rw": "replay",
        "trace": args.trace.as_ref().map(|p| p.display().to_string()),
        "policy": store.policy_name(),
        "bs": args.bs,
        "capacity_bytes": s.capacity_bytes,
        "capacity_blocks": s.capacity_files,
        "requests": r.requests,
        "refs": r.refs,
        "hits": r.hits,
        "hit_ratio": r.hit_ratio(),
        "read_misses": r.read_misses,
        "errors": r.errors,
        "verify_errors": r.verify_errors,
        "bytes_written": s.bytes_written,
        "bytes_read": s.bytes_read,
        "evictions": s.evictions,
        "not_admitted": s.not_admitted,
        "write_filter": s.offload.as_ref().map(|o| o.filter.clone()),
        "offload": s.offload,
        "elapsed_s": secs,
        "started_unix_ms": r.started_unix_ms,
        "ended_unix_ms": r.ended_unix_ms,
        "requests_per_sec": r.requests as f64 / secs,
        "blocks_per_sec": r.refs as f64 / secs,
        "dir": root.display().to_string(),
        "store": s,
    })
}

/// The text report of a replay, with the store's counters `s`.
fn replay_text(
    out: &mut impl Write,
    args: &Args,
    store: &Store,
    r: &ReplayRun,
    s: &StoreStats,
) -> std::io::Result<()> {
    let secs = r.secs();
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
        "  hit ratio={:.4} hits={} read-misses={} errors={} verify-errors={}",
        r.hit_ratio(),
        r.hits,
        r.read_misses,
        r.errors,
        r.verify_errors
    )?;
    writeln!(
        out,
        "  written={} read={} evictions={} not-admitted={}",
        human_bytes(s.bytes_written as f64),
        human_bytes(s.bytes_read as f64),
        s.evictions,
        s.not_admitted
    )?;
    if let Some(o) = &s.offload {
        writeln!(
            out,
            "  write filter={}: offered={} written={} filtered={} deduped={}",
            o.filter,
            o.offered,
            o.written,
            o.dropped_filtered,
            o.deduped_present + o.deduped_queued
        )?;
    }
    Ok(())
}
