//! The same put-then-random-get workload through tierkv and two peers, side by side:
//! cacache (a content-addressed file cache with a sharded layout: an index entry and a content
//! file per key) and foyer (a hybrid cache whose disk tier packs entries into 16 MiB blocks of
//! large device files, here with its memory tier off so every get reads the disk), and the
//! seed's naive mode (tierkv with one flat directory, open + read + close per access, no
//! checksum). 64 KiB and 256 KiB blocks, 1,000 of each, and 2 MiB blocks (a 16-token block of
//! an 8B Llama), 200 of them; gets of random hot blocks one at a time; puts in batches of 16
//! that return once the bytes are in the filesystem. docs/benchmarks.md has the figures.

use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    HybridCachePolicy, RecoverMode,
};
use tierkv::AlignedBuf;
use tierkv::{BlockHash, Layout, Lookup, Store, StoreConfig, VerifyMode, WorkerId};

/// Blocks per size: 1,000 of 64 and 256 KiB, 200 of 2 MiB (400 MiB per peer).
fn blocks_of(size: usize) -> u64 {
    if size >= 1 << 20 { 200 } else { 1000 }
}
/// Blocks per put batch.
const BATCH: usize = 16;
/// foyer's disk block (the unit it packs entries into and evicts).
const FOYER_BLOCK: usize = 16 * 1024 * 1024;

fn name(i: u64) -> String {
    format!("block-{i}")
}

/// A foyer cache on files in `dir`, disk only: entries are written on insertion and never kept
/// in memory (the filter admits none), so a get reads the device.
async fn foyer_open(dir: &Path, capacity: usize) -> HybridCache<u64, Vec<u8>> {
    let device = FsDeviceBuilder::new(dir)
        .with_capacity(capacity)
        .build()
        .expect("foyer device");
    HybridCacheBuilder::new()
        .with_policy(HybridCachePolicy::WriteOnInsertion)
        .with_flush_on_close(false)
        .memory(1)
        .with_shards(1)
        .with_filter(|_: &u64, _: &Vec<u8>| false)
        .storage()
        .with_engine_config(BlockEngineConfig::new(device).with_block_size(FOYER_BLOCK))
        .with_recover_mode(RecoverMode::None)
        .build()
        .await
        .expect("foyer cache")
}

/// Inserts `keys` and waits until foyer has written them. foyer drops inserts beyond its
/// flush buffers without an error, so batches stay well under a block; callers check.
async fn foyer_put(
    cache: &HybridCache<u64, Vec<u8>>,
    keys: impl Iterator<Item = u64>,
    data: &[u8],
) {
    let per_wait = (FOYER_BLOCK / 2 / (data.len() + 4096)).max(1);
    let mut pending = 0;
    for k in keys {
        drop(cache.insert(k, data.to_vec()));
        pending += 1;
        if pending == per_wait {
            cache.storage().wait().await;
            pending = 0;
        }
    }
    cache.storage().wait().await;
}

/// The four stores of one block size, each filled with `blocks_of(size)` blocks.
struct Peers {
    size: usize,
    blocks: u64,
    data: Vec<u8>,
    store: Store,
    keys: Vec<tierkv::BlockKey>,
    naive: Store,
    /// tierkv's default store with buffered puts (`with_direct_puts_from(None)`), empty: the
    /// put rows only.
    buffered: Store,
    nkeys: Vec<tierkv::BlockKey>,
    cdir: tempfile::TempDir,
    foyer: HybridCache<u64, Vec<u8>>,
    _dirs: [tempfile::TempDir; 4],
}

impl Peers {
    /// tierkv (the default store), the seed's naive mode, cacache and foyer, filled.
    fn fill(rt: &tokio::runtime::Runtime, size: usize) -> Peers {
        let blocks = blocks_of(size);
        let data = vec![0x5Au8; size];
        // tierkv
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            WorkerId::new("bench").unwrap(),
            StoreConfig::default(),
        )
        .unwrap();
        let keys: Vec<_> = (0..blocks)
            .map(|i| store.key(BlockHash::chain(None, &[i as u32])))
            .collect();
        for k in &keys {
            store.put(k, &data).unwrap();
        }
        // tierkv with buffered puts (before direct puts), for the put rows.
        let bdir = tempfile::tempdir().unwrap();
        let buffered = Store::open(
            bdir.path(),
            WorkerId::new("bench").unwrap(),
            StoreConfig::default().with_direct_puts_from(None),
        )
        .unwrap();
        // The seed's naive mode: one flat directory, open + read + close per get, no checksum.
        let ndir = tempfile::tempdir().unwrap();
        let naive = Store::open(
            ndir.path(),
            WorkerId::new("bench").unwrap(),
            StoreConfig::default()
                .with_layout(Layout::new(0, 256).unwrap())
                .with_fd_cache(0)
                .with_verify(VerifyMode::Never)
                .with_direct_puts_from(None),
        )
        .unwrap();
        let nkeys: Vec<_> = (0..blocks)
            .map(|i| naive.key(BlockHash::chain(None, &[i as u32])))
            .collect();
        for k in &nkeys {
            naive.put(k, &data).unwrap();
        }
        // cacache: key -> index entry -> content file (verified by its integrity hash).
        let cdir = tempfile::tempdir().unwrap();
        for j in 0..blocks {
            cacache::write_sync(cdir.path(), name(j), &data).unwrap();
        }
        // foyer: key -> in-memory index -> one aligned read from a device file (checksummed).
        let fdir = tempfile::tempdir().unwrap();
        let capacity = (blocks as usize * (size + 4096) * 4).max(64 * FOYER_BLOCK);
        let foyer = rt.block_on(foyer_open(fdir.path(), capacity));
        rt.block_on(foyer_put(&foyer, 0..blocks, &data));
        for k in 0..blocks {
            let e = rt.block_on(foyer.get(&k)).unwrap();
            assert!(e.is_some(), "foyer lost block {k} while filling");
        }
        Peers {
            size,
            blocks,
            data,
            store,
            keys,
            naive,
            nkeys,
            buffered,
            cdir,
            foyer,
            _dirs: [dir, ndir, fdir, bdir],
        }
    }
}

/// Gets of one block at a time, spread over the blocks, from each peer.
fn bench_gets(c: &mut Criterion, rt: &tokio::runtime::Runtime, p: &Peers) {
    let Peers {
        size,
        blocks,
        store,
        keys,
        naive,
        nkeys,
        cdir,
        foyer,
        ..
    } = p;
    let (size, blocks) = (*size, *blocks);
    let mut g = c.benchmark_group(format!("peer_get_{}KiB", size / 1024));
    g.throughput(Throughput::Bytes(size as u64));
    g.sample_size(30);
    let mut buf = AlignedBuf::zeroed(size);
    for (name, st, ks) in [("tierkv", store, keys), ("naive", naive, nkeys)] {
        let mut i = 0u64;
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                i = (i * 7919 + 13) % blocks;
                assert_eq!(
                    st.get(&ks[i as usize], &mut buf).unwrap(),
                    Lookup::Hit(size)
                );
                black_box(&buf);
            })
        });
    }

    let mut j = 0u64;
    g.bench_function(BenchmarkId::from_parameter("cacache"), |b| {
        b.iter(|| {
            j = (j * 7919 + 13) % blocks;
            let v = cacache::read_sync(cdir.path(), name(j)).unwrap();
            assert_eq!(v.len(), size);
            black_box(v);
        })
    });

    let mut f = 0u64;
    g.bench_function(BenchmarkId::from_parameter("foyer"), |b| {
        b.iter(|| {
            f = (f * 7919 + 13) % blocks;
            let e = rt.block_on(foyer.get(&f)).unwrap().expect("foyer miss");
            assert_eq!(e.value().len(), size);
            black_box(e);
        })
    });
    g.finish();
}

/// Writes back every dirty page before a put measurement, so a peer measured after the setup
/// (gigabytes of puts) or after another peer does not pay for their writeback.
fn settle() {
    rustix::fs::sync();
}

/// Puts of batches of [`BATCH`] new blocks into each peer, each from a written-back page
/// cache.
fn bench_puts(c: &mut Criterion, rt: &tokio::runtime::Runtime, p: &Peers) {
    let Peers {
        size,
        blocks,
        data,
        store,
        naive,
        buffered,
        cdir,
        foyer,
        ..
    } = p;
    let size = *size;
    let mut g = c.benchmark_group(format!("peer_put_{}KiB_x{BATCH}", size / 1024));
    g.throughput(Throughput::Bytes((size * BATCH) as u64));
    g.sample_size(20);
    for (name, st) in [
        ("tierkv", store),
        ("tierkv-buffered", buffered),
        ("naive", naive),
    ] {
        let mut n = 0u32;
        settle();
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                let items: Vec<_> = (0..BATCH)
                    .map(|_| {
                        n += 1;
                        (
                            st.key(BlockHash::chain(None, &[u32::MAX - n])),
                            data.as_slice(),
                        )
                    })
                    .collect();
                for r in st.put_many(&items) {
                    r.unwrap();
                }
            })
        });
    }
    let mut m = 0u64;
    settle();
    g.bench_function(BenchmarkId::from_parameter("cacache"), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                m += 1;
                cacache::write_sync(cdir.path(), format!("new-{m}"), data).unwrap();
            }
        })
    });
    let mut k = *blocks;
    settle();
    g.bench_function(BenchmarkId::from_parameter("foyer"), |b| {
        b.iter(|| {
            rt.block_on(foyer_put(foyer, k..k + BATCH as u64, data));
            k += BATCH as u64;
        })
    });
    g.finish();
}

fn peers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    for size in [64 * 1024usize, 256 * 1024, 2 << 20] {
        let p = Peers::fill(&rt, size);
        bench_gets(c, &rt, &p);
        bench_puts(c, &rt, &p);
        rt.block_on(p.foyer.close()).unwrap();
    }
}

criterion_group!(benches, peers);
criterion_main!(benches);
