//! `--rw metadata`: how the store's file tree scales with the number of blocks, per shard
//! depth. Each depth gets a fresh tree under the run directory; per phase, the rate in files
//! per second:
//!
//! - create: `put_many` of every block (the jobs split the blocks);
//! - rebuild: closing the store and opening it again (the index is rebuilt from the tree);
//! - lookup: `contains_many` of every block in random order (a path resolution each);
//! - read: `get_many` of every block in random order (open+read+close with `--fd-cache 0`,
//!   the default here);
//! - cold read (`--invalidate`, root only): the same after dropping the kernel's page,
//!   dentry and inode caches.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use tierkv::AlignedBuf;
use tierkv::{BlockKey, Layout, Lookup, Store, StoreConfig};

use crate::common::{BoxError, UsageError};
use crate::report::{human_bytes, human_count};
use crate::{Args, OutputFormat, block_hash, fill_block, parallel};

/// Successes and failures of one phase.
#[derive(Default)]
struct Tally {
    ok: u64,
    missing: u64,
    errors: u64,
}

impl Tally {
    /// Checks that a phase visited every block exactly once.
    fn visited(self, phase: &str, n: u64) -> Result<Tally, BoxError> {
        let seen = self.ok + self.missing + self.errors;
        if seen != n {
            return Err(format!("{phase}: {seen} blocks visited, not {n}").into());
        }
        Ok(self)
    }

    fn add(&mut self, o: &Tally) {
        self.ok += o.ok;
        self.missing += o.missing;
        self.errors += o.errors;
    }
}

/// One depth's figures.
struct DepthRow {
    layout: Layout,
    create: Duration,
    rebuild: Duration,
    rebuilt_blocks: u64,
    lookup: Duration,
    read: Duration,
    cold_read: Option<Duration>,
    bad: Tally,
}

/// Runs the metadata phases for every requested depth and prints the table.
pub(crate) fn scale(
    args: &Args,
    root: &Path,
    config: &StoreConfig,
    bs: usize,
    nblocks: u64,
) -> Result<(), BoxError> {
    let depths = match (&args.layout_depths, args.layout_depth) {
        (d, _) if !d.is_empty() => d.clone(),
        (_, Some(d)) => vec![d],
        _ => vec![0, 1, 2],
    };
    let mut rows = Vec::with_capacity(depths.len());
    for &depth in &depths {
        if crate::interrupted() {
            break;
        }
        let layout = Layout::new(depth, args.fanout())?;
        let dir = root.join(format!("depth{depth}-{}", args.fanout()));
        if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
            return Err(UsageError(format!(
                "{} is not empty: --rw metadata measures fresh trees",
                dir.display()
            ))
            .into());
        }
        let config = config
            .clone()
            .with_layout(layout)
            .with_fd_cache(args.fd_cache.unwrap_or(0));
        let row = one_depth(args, &dir, config, layout, bs, nblocks);
        if !args.keep {
            // Remove the tree even when a phase failed.
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove the tree");
            }
        }
        rows.push(row?);
    }
    print_rows(args, root, bs, nblocks, &rows)?;
    let bad = rows.iter().fold(Tally::default(), |mut t, r| {
        t.add(&r.bad);
        t
    });
    if bad.missing + bad.errors > 0 {
        return Err(format!(
            "{} blocks missing and {} errors: the rates above are not valid",
            bad.missing, bad.errors
        )
        .into());
    }
    Ok(())
}

/// One depth's phases on a fresh tree in `dir`: create, rebuild, lookup, read and (with
/// `--invalidate`) cold read.
fn one_depth(
    args: &Args,
    dir: &Path,
    config: StoreConfig,
    layout: Layout,
    bs: usize,
    nblocks: u64,
) -> Result<DepthRow, BoxError> {
    let keys_of = |store: &Store| -> Vec<BlockKey> {
        (0..nblocks)
            .map(|i| store.key(block_hash(args.worker.as_str(), i)))
            .collect()
    };
    let mut bad = Tally::default();

    let store = Store::open(dir, args.worker.clone(), config.clone())?;
    let keys = keys_of(&store);
    let phases = Phases {
        args,
        keys: &keys,
        bs,
    };
    let (create, t) = phases.create(&store);
    bad.add(&Tally {
        ok: 0,
        ..t.visited("create", nblocks)?
    });
    drop(store);

    let start = Instant::now();
    let store = Store::open(dir, args.worker.clone(), config)?;
    let rebuild = start.elapsed();
    let rebuilt_blocks = store.stats().blocks_at_open;

    let (lookup, t) = phases.lookup(&store);
    bad.add(&Tally {
        ok: 0,
        ..t.visited("lookup", nblocks)?
    });
    let (read, t) = phases.read(&store, 1000);
    bad.add(&Tally {
        ok: 0,
        ..t.visited("read", nblocks)?
    });
    let cold_read = if args.invalidate {
        drop_caches()?;
        let (d, t) = phases.read(&store, 2000);
        bad.add(&Tally {
            ok: 0,
            ..t.visited("cold read", nblocks)?
        });
        Some(d)
    } else {
        None
    };
    Ok(DepthRow {
        layout,
        create,
        rebuild,
        rebuilt_blocks,
        lookup,
        read,
        cold_read,
        bad,
    })
}

/// The timed phases of one depth, each on `--numjobs` threads over every block.
struct Phases<'a> {
    args: &'a Args,
    keys: &'a [BlockKey],
    bs: usize,
}

impl Phases<'_> {
    /// `put_many` of every block, the jobs splitting them.
    fn create(&self, store: &Store) -> (Duration, Tally) {
        let (args, keys, bs) = (self.args, self.keys, self.bs);
        let jobs = args.numjobs;
        timed(jobs, |j| {
            let (a, b) = split(keys.len(), j, jobs);
            let mut tally = Tally::default();
            let mut datas: Vec<Vec<u8>> = (0..args.batch).map(|_| vec![0x5Au8; bs]).collect();
            for (c, chunk) in keys[a..b].chunks(args.batch).enumerate() {
                if crate::interrupted() {
                    break;
                }
                let first = (a + c * args.batch) as u64;
                for (i, d) in datas.iter_mut().enumerate().take(chunk.len()) {
                    fill_block(d, &chunk[i].hash, first + i as u64, 1);
                }
                let items: Vec<(BlockKey, &[u8])> = chunk
                    .iter()
                    .cloned()
                    .zip(datas.iter().map(Vec::as_slice))
                    .collect();
                for r in store.put_many(&items) {
                    match r {
                        Ok(()) => tally.ok += 1,
                        Err(e) => {
                            tally.errors += 1;
                            tracing::warn!(error = %e, "put failed");
                        }
                    }
                }
            }
            tally
        })
    }

    /// `contains_many` of every block in random order.
    fn lookup(&self, store: &Store) -> (Duration, Tally) {
        let (args, keys) = (self.args, self.keys);
        let jobs = args.numjobs;
        timed(jobs, |j| {
            let mut tally = Tally::default();
            let order = shuffled(keys.len(), 0);
            let (a, b) = split(order.len(), j, jobs);
            for chunk in order[a..b].chunks(args.batch) {
                if crate::interrupted() {
                    break;
                }
                let batch: Vec<BlockKey> = chunk.iter().map(|&i| keys[i].clone()).collect();
                for r in store.contains_many(&batch) {
                    match r {
                        Ok(true) => tally.ok += 1,
                        Ok(false) => tally.missing += 1,
                        Err(e) => {
                            tally.errors += 1;
                            tracing::warn!(error = %e, "lookup failed");
                        }
                    }
                }
            }
            tally
        })
    }

    /// `get_many` of every block in a random order drawn from `seed`.
    fn read(&self, store: &Store, seed: usize) -> (Duration, Tally) {
        let (args, keys, bs) = (self.args, self.keys, self.bs);
        let jobs = args.numjobs;
        timed(jobs, |j| {
            let mut tally = Tally::default();
            let mut bufs: Vec<AlignedBuf> =
                (0..args.batch).map(|_| AlignedBuf::zeroed(bs)).collect();
            let order = shuffled(keys.len(), seed);
            let (a, b) = split(order.len(), j, jobs);
            for chunk in order[a..b].chunks(args.batch) {
                if crate::interrupted() {
                    break;
                }
                if crate::interrupted() {
                    break;
                }
                let batch: Vec<BlockKey> = chunk.iter().map(|&i| keys[i].clone()).collect();
                for r in store.get_many(&batch, &mut bufs[..batch.len()]) {
                    match r {
                        Ok(Lookup::Hit(_)) => tally.ok += 1,
                        Ok(Lookup::Miss) => tally.missing += 1,
                        Err(e) => {
                            tally.errors += 1;
                            tracing::warn!(error = %e, "read failed");
                        }
                    }
                }
            }
            tally
        })
    }
}

/// Job `j` of `n`'s share of `len` items.
fn split(len: usize, j: usize, n: usize) -> (usize, usize) {
    (len * j / n, len * (j + 1) / n)
}

/// `0..len` in a random order seeded by `seed`: every job draws the same order and takes its
/// share of it, so that each block is visited once.
fn shuffled(len: usize, seed: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..len).collect();
    fastrand::Rng::with_seed(0x6d65_7461 + seed as u64).shuffle(&mut v);
    v
}

/// Runs `job` on `n` threads; the wall time and the summed tallies.
fn timed(n: usize, job: impl Fn(usize) -> Tally + Sync) -> (Duration, Tally) {
    let start = Instant::now();
    let tallies = parallel(n, job);
    let took = start.elapsed();
    let mut total = Tally::default();
    for t in &tallies {
        total.add(t);
    }
    (took, total)
}

/// Drops the page cache and the dentry and inode caches (needs root).
fn drop_caches() -> Result<(), BoxError> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        UsageError(format!(
            "--invalidate in --rw metadata drops the kernel's caches through \
             /proc/sys/vm/drop_caches and needs root: {e}"
        ))
    })?;
    Ok(())
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn print_rows(
    args: &Args,
    root: &Path,
    bs: usize,
    nblocks: u64,
    rows: &[DepthRow],
) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    match args.output_format {
        OutputFormat::Json => {
            let depths: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!({
                        "depth": r.layout.depth,
                        "fanout": r.layout.fanout,
                        "create_per_sec": rate(nblocks, r.create),
                        "rebuild_per_sec": rate(r.rebuilt_blocks, r.rebuild),
                        "rebuilt_blocks": r.rebuilt_blocks,
                        "lookup_per_sec": rate(nblocks, r.lookup),
                        "read_per_sec": rate(nblocks, r.read),
                        "cold_read_per_sec": r.cold_read.map(|d| rate(nblocks, d)),
                        "create_s": r.create.as_secs_f64(),
                        "rebuild_s": r.rebuild.as_secs_f64(),
                        "lookup_s": r.lookup.as_secs_f64(),
                        "read_s": r.read.as_secs_f64(),
                        "cold_read_s": r.cold_read.map(|d| d.as_secs_f64()),
                        "missing": r.bad.missing,
                        "errors": r.bad.errors,
                    })
                })
                .collect();
            let doc = json!({
                "rw": "metadata",
                "bs": bs,
                "nblocks": nblocks,
                "numjobs": args.numjobs,
                "batch": args.batch,
                "fd_cache": args.fd_cache.unwrap_or(0),
                "dir": root.display().to_string(),
                "depths": depths,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
        OutputFormat::Normal => {
            writeln!(
                out,
                "tierkv-bench: rw=metadata bs={} nblocks={nblocks} numjobs={} batch={} fd-cache={}",
                human_bytes(bs as f64),
                args.numjobs,
                args.batch,
                args.fd_cache.unwrap_or(0),
            )?;
            writeln!(
                out,
                "  files/s:  layout                create   rebuild    lookup      read  cold read"
            )?;
            for r in rows {
                writeln!(
                    out,
                    "  {:<28} {:>9} {:>9} {:>9} {:>9} {:>10}",
                    r.layout.to_string(),
                    human_count(rate(nblocks, r.create)),
                    human_count(rate(r.rebuilt_blocks, r.rebuild)),
                    human_count(rate(nblocks, r.lookup)),
                    human_count(rate(nblocks, r.read)),
                    r.cold_read
                        .map(|d| human_count(rate(nblocks, d)))
                        .unwrap_or_else(|| "-".into()),
                )?;
                if r.bad.missing + r.bad.errors > 0 {
                    writeln!(
                        out,
                        "    {} missing, {} errors",
                        r.bad.missing, r.bad.errors
                    )?;
                }
            }
        }
    }
    Ok(())
}
