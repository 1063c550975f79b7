//! Shared mode against exclusive mode, side by side in one run (docs/shared.md): puts with the
//! ledger and without, hits on blocks this store published against blocks another store
//! published (found in the tree), misses with and without the negative cache, and put
//! throughput with 1, 2 and 4 writers (each its own store on the worker).
//!
//! `cargo bench --bench shared`; `TIERKV_SHARED_DIRS=A[:B]` names the directories (default: a
//! temporary directory): with two (e.g. two nodes' mounts of one distributed filesystem), the
//! other store and half the writers use B. `TIERKV_SHARED_BS` (bytes, default 262144),
//! `TIERKV_SHARED_BLOCKS` (default 256) and `TIERKV_SHARED_ROUNDS` (default 5) size it. Rounds
//! interleave the variants; each figure is the median over rounds, each ratio the median of the
//! per-round ratios.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tierkv::{BlockHash, BlockKey, Lookup, Sharing, Store, StoreConfig, WorkerId};

fn env_or(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn hash(round: u64, i: u64) -> BlockHash {
    BlockHash::chain(None, &[round as u32, (i >> 32) as u32, i as u32, 0x5AA5])
}

fn cfg(sharing: Sharing) -> StoreConfig {
    StoreConfig::new()
        .with_sharing(sharing)
        .with_stats_interval(None)
        .with_layout(tierkv::Layout::new(1, 256).expect("layout"))
}

fn open(dir: &Path, c: StoreConfig) -> Store {
    Store::open(dir, WorkerId::new("0").expect("id"), c).expect("open")
}

/// Per-call latencies and the bytes moved in `wall`.
struct Sample {
    lat: Vec<Duration>,
    wall: Duration,
    bytes: u64,
}

impl Sample {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.lat.clone();
        v.sort_unstable();
        if v.is_empty() {
            return 0.0;
        }
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i].as_secs_f64() * 1e6
    }
    fn mbps(&self) -> f64 {
        self.bytes as f64 / self.wall.as_secs_f64().max(1e-9) / 1048576.0
    }
    fn per_sec(&self) -> f64 {
        self.lat.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

fn puts(store: &Store, keys: &[BlockKey], data: &[u8], batch: usize) -> Sample {
    let mut lat = Vec::new();
    let t = Instant::now();
    for c in keys.chunks(batch) {
        let items: Vec<(BlockKey, &[u8])> = c.iter().map(|k| (k.clone(), data)).collect();
        let s = Instant::now();
        for r in store.put_many(&items) {
            r.expect("put");
        }
        lat.push(s.elapsed());
    }
    Sample {
        lat,
        wall: t.elapsed(),
        bytes: (keys.len() * data.len()) as u64,
    }
}

/// Reads `keys` one get each; checks every hit's bytes against `data`.
fn gets(store: &Store, keys: &[BlockKey], data: &[u8], expect_hit: bool) -> Sample {
    let mut buf = vec![0u8; data.len()];
    let mut lat = Vec::with_capacity(keys.len());
    let t = Instant::now();
    let mut bytes = 0;
    for k in keys {
        let s = Instant::now();
        let r = store.get(k, &mut buf).expect("get");
        lat.push(s.elapsed());
        match r {
            Lookup::Hit(n) => {
                assert!(expect_hit, "a hit where a miss was expected");
                assert_eq!(&buf[..n], data, "wrong bytes");
                bytes += n as u64;
            }
            Lookup::Miss => assert!(!expect_hit, "a miss where a hit was expected"),
        }
    }
    Sample {
        lat,
        wall: t.elapsed(),
        bytes,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// One run of the bench: its settings, and each figure's value per round.
struct Run {
    a_dir: PathBuf,
    b_dir: PathBuf,
    bs: usize,
    n: u64,
    batch: usize,
    data: Vec<u8>,
    rows: Vec<(String, Vec<f64>)>,
}

impl Run {
    /// Records `v` as this round's value of the figure `name`.
    fn push(&mut self, name: &str, v: f64) {
        match self.rows.iter_mut().find(|(n, _)| n == name) {
            Some((_, vs)) => vs.push(v),
            None => self.rows.push((name.to_string(), vec![v])),
        }
    }

    /// One round: puts, hits and misses of exclusive and shared stores, then concurrent
    /// writers, each in directories of its own (removed after).
    fn round(&mut self, round: u64) {
        let sub = format!("shared-bench.{}.{round}", std::process::id());
        let (ra, rb) = (self.a_dir.join(&sub), self.b_dir.join(&sub));
        let ex_root = self.a_dir.join(format!("{sub}.exclusive"));
        std::fs::create_dir_all(&ra).expect("mkdir");
        self.puts_hits_misses(round, &ra, &rb, &ex_root);
        self.writers(round, &sub);
        let _ = std::fs::remove_dir_all(&ra);
        let _ = std::fs::remove_dir_all(&ex_root);
    }

    /// Puts (exclusive and shared, alternating which goes first), hits (published here or by
    /// another store) and misses (with and without the negative cache).
    fn puts_hits_misses(&mut self, round: u64, ra: &Path, rb: &Path, ex_root: &Path) {
        let n = self.n;
        let keys = |r: u64, s: &Store| -> Vec<BlockKey> {
            (0..n).map(|i| s.key(hash(r * 1000 + round, i))).collect()
        };
        // Puts: exclusive and shared, alternating which goes first.
        let ex = open(ex_root, cfg(Sharing::Exclusive));
        let a = open(ra, cfg(Sharing::Shared));
        let b = open(rb, cfg(Sharing::Shared));
        let (ka, ke) = (keys(1, &a), keys(1, &ex));
        let (pe, ps) = if round % 2 == 0 {
            let pe = puts(&ex, &ke, &self.data, self.batch);
            (pe, puts(&a, &ka, &self.data, self.batch))
        } else {
            let ps = puts(&a, &ka, &self.data, self.batch);
            (puts(&ex, &ke, &self.data, self.batch), ps)
        };
        self.push("put MiB/s, exclusive", pe.mbps());
        self.push("put MiB/s, shared (1 writer)", ps.mbps());
        self.push("put p50 us per batch, exclusive", pe.pct(0.5));
        self.push("put p50 us per batch, shared", ps.pct(0.5));
        self.push("put p99 us per batch, exclusive", pe.pct(0.99));
        self.push("put p99 us per batch, shared", ps.pct(0.99));
        self.push("ratio put shared/exclusive", ps.mbps() / pe.mbps());
        // Hits: a's own blocks (in its index) against blocks a published, read by b (found
        // in the tree). Both open each file for the first time.
        let (hl, hr) = if round % 2 == 0 {
            let hl = gets(&a, &ka, &self.data, true);
            (hl, gets(&b, &ka, &self.data, true))
        } else {
            let hr = gets(&b, &ka, &self.data, true);
            (gets(&a, &ka, &self.data, true), hr)
        };
        self.push("hit p50 us, published here", hl.pct(0.5));
        self.push("hit p50 us, published by another store", hr.pct(0.5));
        self.push("hit p99 us, published here", hl.pct(0.99));
        self.push("hit p99 us, published by another store", hr.pct(0.99));
        self.push("hit MiB/s, published here", hl.mbps());
        self.push("hit MiB/s, published by another store", hr.mbps());
        self.push("ratio hit MiB/s another/here", hr.mbps() / hl.mbps());
        // Misses: keys nobody put.
        let absent: Vec<BlockKey> = (0..self.n)
            .map(|i| b.key(hash(9_000_000 + round, i)))
            .collect();
        let me = gets(&ex, &absent, &self.data, false);
        let b0 = open(rb, cfg(Sharing::Shared).with_negative_ttl(Duration::ZERO));
        let m0 = gets(&b0, &absent, &self.data, false);
        let _ = gets(&b, &absent, &self.data, false); // remembered as absent
        let mn = gets(&b, &absent, &self.data, false);
        self.push("misses/s, exclusive (the index)", me.per_sec());
        self.push("misses/s, shared, no negative cache", m0.per_sec());
        self.push("misses/s, shared, negative cache hit", mn.per_sec());
        self.push("miss p50 us, shared, no negative cache", m0.pct(0.5));
        self.push("miss p99 us, shared, no negative cache", m0.pct(0.99));
        drop((ex, a, b, b0));
    }

    /// Writers: 1, 2 and 4 stores (alternating A and B) putting disjoint blocks at once.
    fn writers(&mut self, round: u64, sub: &str) {
        for w in [1usize, 2, 4] {
            let wsub = format!("{sub}.w{w}");
            let stores: Vec<Store> = (0..w)
                .map(|j| {
                    let d = if j % 2 == 0 { &self.a_dir } else { &self.b_dir }.join(&wsub);
                    std::fs::create_dir_all(&d).expect("mkdir");
                    open(&d, cfg(Sharing::Shared))
                })
                .collect();
            let per = self.n / w as u64;
            let t = Instant::now();
            std::thread::scope(|s| {
                for (j, st) in stores.iter().enumerate() {
                    let (data, batch) = (&self.data, self.batch);
                    s.spawn(move || {
                        let ks: Vec<BlockKey> = (0..per)
                            .map(|i| st.key(hash(50 + j as u64, round * 1_000_000 + i)))
                            .collect();
                        puts(st, &ks, data, batch)
                    });
                }
            });
            let secs = t.elapsed().as_secs_f64();
            self.push(
                &format!("put MiB/s, shared, {w} writers"),
                (per * w as u64) as f64 * self.bs as f64 / secs / 1048576.0,
            );
            drop(stores);
            let _ = std::fs::remove_dir_all(self.a_dir.join(&wsub));
            let _ = std::fs::remove_dir_all(self.b_dir.join(&wsub));
        }
    }

    /// The table: each figure's median over the rounds.
    fn print(self, rounds: u64) {
        println!("| figure | median of {rounds} rounds |");
        println!("| --- | ---: |");
        for (name, vs) in self.rows {
            let m = median(vs);
            let v = if name.starts_with("ratio") {
                format!("{m:.2}x")
            } else {
                format!("{m:.1}")
            };
            println!("| {name} | {v} |");
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; nothing else is parsed.
    let dirs: Vec<PathBuf> = std::env::var("TIERKV_SHARED_DIRS")
        .ok()
        .map(|s| s.split(':').map(PathBuf::from).collect())
        .unwrap_or_default();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a_dir, b_dir) = match dirs.as_slice() {
        [] => (tmp.path().to_path_buf(), tmp.path().to_path_buf()),
        [a] => (a.clone(), a.clone()),
        [a, b, ..] => (a.clone(), b.clone()),
    };
    let bs = env_or("TIERKV_SHARED_BS", 256 << 10) as usize;
    let n = env_or("TIERKV_SHARED_BLOCKS", 256);
    let rounds = env_or("TIERKV_SHARED_ROUNDS", 5);
    let batch = 16;
    println!(
        "shared bench: A={} B={} bs={bs} blocks={n} rounds={rounds} batch={batch}",
        a_dir.display(),
        b_dir.display()
    );
    let mut run = Run {
        a_dir,
        b_dir,
        bs,
        n,
        batch,
        data: (0..bs).map(|i| (i * 31 + 7) as u8).collect(),
        rows: Vec::new(),
    };
    for round in 0..rounds {
        run.round(round);
    }
    run.print(rounds);
}
