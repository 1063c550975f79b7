//! The jobs of a block-I/O phase: each a thread with its share of a rank's blocks, drawing
//! batches of them in the phase's pattern, reading or writing them, and timing each call.

use std::time::Instant;

use tierkv::AlignedBuf;
use tierkv::{BlockKey, Lookup, Store, StoreStats, WorkerId};

use crate::report::RankResult;
use crate::{Args, Budget, Dir, Distribution, Rank, Run, Rw, Spec, fill_block, parallel, verify};

/// Runs one phase on every rank (`--numjobs` threads each) and gathers each rank's figures.
pub(crate) fn run_phase(
    ranks: &[Rank],
    ids: &[WorkerId],
    bs: usize,
    args: &Args,
    spec: Spec,
    budget: &Budget,
) -> Vec<RankResult> {
    let before: Vec<StoreStats> = ranks.iter().map(|r| r.store.stats()).collect();
    let jobs = parallel(ranks.len() * args.numjobs, |j| {
        let rank = &ranks[j / args.numjobs];
        let jr = j % args.numjobs;
        // Writes split the rank's blocks between its jobs (and an --instances run's
        // instances); reads go over all of them.
        let n = rank.keys.len();
        let (inst, ninst) = args.instance.unwrap_or((0, 1));
        let (w, nw) = (inst * args.numjobs + jr, ninst * args.numjobs);
        let (a, b) = match spec.rw {
            Rw::Write | Rw::Randwrite => (n * w / nw, n * (w + 1) / nw),
            _ => (0, n),
        };
        let job = Job {
            store: &rank.store,
            keys: &rank.keys[a..b],
            gens: &rank.gens,
            first: a as u64,
            bs,
            args,
            spec,
            budget,
        };
        job.run(j as u64)
    });
    ranks
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
                worker: worker.clone(),
                run,
                before,
                after: rank.store.stats(),
            }
        })
        .collect()
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

/// One job's share of a phase: batches of `--batch` blocks of its store, read or written,
/// until the loops, the runtime or the operation budget run out (or a signal).
struct Job<'a> {
    store: &'a Store,
    /// `keys[i]` is block `first + i` (contents follow the global index, so a later read can
    /// check them).
    keys: &'a [BlockKey],
    gens: &'a verify::Gens,
    first: u64,
    bs: usize,
    args: &'a Args,
    spec: Spec,
    budget: &'a Budget,
}

/// Where a job is in its passes: its random draws, its place in the pass and the batch drawn.
struct Cursor {
    rng: fastrand::Rng,
    zipf: Option<Zipf>,
    /// The blocks in this pass's order.
    order: Vec<usize>,
    /// The next position in `order`.
    pos: usize,
    /// randrw: the operations left (it draws keys instead of passing over them).
    mixed_left: u64,
    /// The next batch's block indices.
    batch_idx: Vec<usize>,
}

/// What follows in a job's passes.
enum Next {
    /// A batch of this many blocks, drawn into the cursor.
    Batch(usize),
    /// The end of this pass.
    PassEnd,
    /// The end of the job: its operations, its budget.
    Stop,
}

/// `n` block buffers of `bs` bytes filled with `byte`.
fn buffers(n: usize, bs: usize, byte: u8) -> Vec<AlignedBuf> {
    (0..n)
        .map(|_| {
            let mut b = AlignedBuf::zeroed(bs);
            b.fill(byte);
            b
        })
        .collect()
}

impl Job<'_> {
    /// Runs the job (number `job` of the phase, which seeds its draws) and returns its
    /// figures.
    fn run(&self, job: u64) -> Run {
        let mut run = Run::empty();
        if self.keys.is_empty() {
            // More writing jobs than blocks: nothing of its own to do.
            return run;
        }
        let args = self.args;
        let rw = self.spec.rw;
        // Zipf over this job's keys (all of them for reads, its share for writes).
        let zipf = match args.random_distribution {
            Distribution::Zipf(theta) => Some(Zipf::new(self.keys.len(), theta)),
            Distribution::Random => None,
        };
        // Page-aligned, as engines' buffer pools are (and as fio's are): copies into misaligned
        // buffers run several times slower.
        // Only the buffers of the directions this job runs (checked against memory up front).
        let (reads, writes) = match rw {
            Rw::Write | Rw::Randwrite => (0, args.batch),
            Rw::Randrw => (args.batch, args.batch),
            _ => (args.batch, 0),
        };
        // Resident before the clock starts, as an engine's preallocated KV pool is: a fresh
        // buffer's page faults would otherwise be timed as part of the first reads.
        let mut bufs = buffers(reads, self.bs, 0xFF);
        let mut datas = buffers(writes, self.bs, 0xA5);
        let mut start = Instant::now();
        // Until the ramp is over (`--ramp-time`): then the figures restart, once.
        let mut ramp_end = self.budget.ramp_end;
        let mut c = self.cursor(job, zipf);
        // With --runtime or --ops, passes repeat until that limit (fio's time_based); else
        // --loops passes.
        let passes = if self.spec.limited {
            u64::MAX
        } else {
            self.spec.loops.max(1)
        };
        'passes: for _ in 0..passes {
            self.start_pass(&mut c);
            loop {
                let n = match self.next_batch(&mut c) {
                    Next::Batch(n) => n,
                    Next::PassEnd => break,
                    Next::Stop => break 'passes,
                };
                let write = match rw {
                    Rw::Write | Rw::Randwrite => true,
                    Rw::Randrw => c.rng.u8(0..100) >= args.rwmixread,
                    _ => false,
                };
                let batch: Vec<BlockKey> =
                    c.batch_idx.iter().map(|&i| self.keys[i].clone()).collect();
                let t = Instant::now();
                if ramp_end.is_some_and(|r| t >= r) {
                    // The ramp is over: the timed figures start here (errors stay).
                    ramp_end = None;
                    run.read = Dir::restart(&run.read);
                    run.write = Dir::restart(&run.write);
                    run.hits = 0;
                    run.misses = 0;
                    start = t;
                }
                if write {
                    self.write_batch(&mut run.write, &mut datas, &c.batch_idx, batch, t);
                } else {
                    self.read_batch(&mut run, &mut bufs[..n], &c.batch_idx, &batch, t);
                }
                self.budget.progress.inc(n as u64);
            }
        }
        run.elapsed = start.elapsed();
        run
    }

    /// The job's cursor before its first pass: its random draws seeded by the job and the
    /// instance, with `zipf` where keys follow a Zipf distribution.
    fn cursor(&self, job: u64, zipf: Option<Zipf>) -> Cursor {
        let (args, n) = (self.args, self.keys.len());
        let instance = args.instance.map_or(0, |(i, _)| i as u64);
        let spec = self.spec;
        Cursor {
            rng: fastrand::Rng::with_seed(0x7165_726b + job + (instance << 32)),
            zipf,
            order: (0..n).collect(),
            pos: 0,
            // randrw: loops x blocks ops.
            mixed_left: if spec.limited {
                u64::MAX
            } else {
                spec.loops.saturating_mul(n as u64)
            },
            batch_idx: Vec::with_capacity(args.batch),
        }
    }

    /// A new pass: randread and randwrite shuffle the blocks (unless keys follow a Zipf
    /// distribution).
    fn start_pass(&self, c: &mut Cursor) {
        let shuffle = matches!(self.spec.rw, Rw::Randread | Rw::Randwrite);
        if shuffle && c.zipf.is_none() {
            c.rng.shuffle(&mut c.order);
        }
        c.pos = 0;
    }

    /// Draws the next batch's block indices into the cursor, as many as the budget allows.
    fn next_batch(&self, c: &mut Cursor) -> Next {
        let (rw, batch, keys) = (self.spec.rw, self.args.batch, self.keys);
        c.batch_idx.clear();
        let want = match rw {
            Rw::Randrw => {
                if c.mixed_left == 0 {
                    return Next::Stop;
                }
                batch.min(c.mixed_left.min(usize::MAX as u64) as usize)
            }
            _ => batch.min(keys.len() - c.pos),
        };
        if want == 0 {
            return Next::PassEnd;
        }
        let n = self.budget.take(want);
        if n == 0 {
            return Next::Stop;
        }
        for j in 0..n {
            let i = match (rw, &c.zipf) {
                (Rw::Read | Rw::Write, _) => c.pos + j,
                (_, Some(z)) => z.sample(&mut c.rng),
                (Rw::Randrw, None) => c.rng.usize(..keys.len()),
                _ => c.order[c.pos + j],
            };
            c.batch_idx.push(i);
        }
        c.pos += n;
        c.mixed_left = c.mixed_left.saturating_sub(n as u64);
        Next::Batch(n)
    }

    /// Writes a batch (blocks `idx` of the job, keys `batch`) from `datas`, each block at its
    /// next write generation; timed from `t`.
    fn write_batch(
        &self,
        w: &mut Dir,
        datas: &mut [AlignedBuf],
        idx: &[usize],
        batch: Vec<BlockKey>,
        t: Instant,
    ) {
        let (first, gens, keys) = (self.first, self.gens, self.keys);
        let batch_gens: Vec<u64> = idx.iter().map(|&i| gens.next(first as usize + i)).collect();
        for ((d, &i), &g) in datas.iter_mut().zip(idx).zip(&batch_gens) {
            fill_block(d, &keys[i].hash, first + i as u64, g);
        }
        let items: Vec<(BlockKey, &[u8])> = batch
            .into_iter()
            .zip(datas.iter().map(|d| &d[..]))
            .collect();
        let res = self.store.put_many(&items);
        w.lat.saturating_record(t.elapsed().as_nanos() as u64);
        for ((r, &i), &g) in res.into_iter().zip(idx).zip(&batch_gens) {
            match r {
                Ok(()) => {
                    gens.commit(first as usize + i, g);
                    w.ops += 1;
                    w.bytes += self.bs as u64;
                }
                Err(e) => {
                    if w.errors == 0 {
                        tracing::warn!(error = %e, "put failed");
                    }
                    w.error(&e);
                }
            }
        }
    }

    /// Reads a batch (blocks `idx` of the job, keys `batch`) into `bufs`, counting hits and
    /// misses (`--verify-data`: checking each hit's bytes); timed from `t`.
    fn read_batch(
        &self,
        run: &mut Run,
        bufs: &mut [AlignedBuf],
        idx: &[usize],
        batch: &[BlockKey],
        t: Instant,
    ) {
        let floors: Vec<u64> = if self.args.verify_data {
            idx.iter()
                .map(|&i| self.gens.floor(self.first as usize + i))
                .collect()
        } else {
            Vec::new()
        };
        let res = self.store.get_many(batch, bufs);
        let rd = &mut run.read;
        rd.lat.saturating_record(t.elapsed().as_nanos() as u64);
        for (j, r) in res.into_iter().enumerate() {
            match r {
                Ok(Lookup::Hit(len)) => {
                    rd.ops += 1;
                    run.hits += 1;
                    rd.bytes += len as u64;
                    if self.args.verify_data
                        && !self.holds_its_block(&bufs[j], len, idx[j], floors[j])
                    {
                        run.verify_errors += 1;
                    }
                }
                Ok(Lookup::Miss) => {
                    rd.ops += 1;
                    run.misses += 1;
                }
                Err(e) => {
                    if rd.errors == 0 {
                        tracing::warn!(error = %e, "read failed");
                    }
                    rd.error(&e);
                }
            }
        }
    }

    /// `--verify-data`: whether the `len` bytes read into `buf` for block `i` of the job are
    /// its own, at a write generation from `floor` on; a verify error is logged with the
    /// file's path.
    fn holds_its_block(&self, buf: &[u8], len: usize, i: usize, floor: u64) -> bool {
        let bs = self.bs;
        let k = &self.keys[i];
        let i = self.first as usize + i;
        let checked = if len == bs {
            verify::check(&buf[..len], &k.hash, i as u64).and_then(|g| self.gens.check(i, floor, g))
        } else {
            Err(format!("{len} bytes, not {bs}"))
        };
        if let Err(why) = &checked {
            tracing::error!(
                path = %self.store.path_of(&k.hash).display(),
                block = i,
                "verify-data: {why}"
            );
        }
        checked.is_ok()
    }
}
