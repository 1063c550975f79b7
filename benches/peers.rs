//! The same put-then-random-get workload through tierkv and through cacache (a
//! content-addressed file cache with a sharded layout), side by side: 64 KiB and 256 KiB
//! blocks, 1,000 of each, random gets of hot blocks. docs/benchmarks.md has the figures.
//!
//! foyer's disk cache (log-structured, its own device file) is the other peer the issue names;
//! it is not measured here yet.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierkv::buf::AlignedBuf;
use tierkv::{BlockHash, Lookup, Store, StoreConfig, WorkerId};

const BLOCKS: u64 = 1000;

fn name(i: u64) -> String {
    format!("block-{i}")
}

fn peers(c: &mut Criterion) {
    for size in [64 * 1024usize, 256 * 1024] {
        let data = vec![0x5Au8; size];
        let mut g = c.benchmark_group(format!("peer_get_{}KiB", size / 1024));
        g.throughput(Throughput::Bytes(size as u64));
        g.sample_size(30);

        // tierkv
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            WorkerId::new("bench").unwrap(),
            StoreConfig::default(),
        )
        .unwrap();
        let keys: Vec<_> = (0..BLOCKS)
            .map(|i| store.key(BlockHash::chain(None, &[i as u32])))
            .collect();
        for k in &keys {
            store.put(k, &data).unwrap();
        }
        let mut buf = AlignedBuf::zeroed(size);
        let mut i = 0u64;
        g.bench_function(BenchmarkId::from_parameter("tierkv"), |b| {
            b.iter(|| {
                i = (i * 7919 + 13) % BLOCKS;
                assert_eq!(
                    store.get(&keys[i as usize], &mut buf).unwrap(),
                    Lookup::Hit(size)
                );
                black_box(&buf);
            })
        });

        // cacache: key -> index entry -> content file (verified by its integrity hash).
        let cdir = tempfile::tempdir().unwrap();
        for j in 0..BLOCKS {
            cacache::write_sync(cdir.path(), name(j), &data).unwrap();
        }
        let mut j = 0u64;
        g.bench_function(BenchmarkId::from_parameter("cacache"), |b| {
            b.iter(|| {
                j = (j * 7919 + 13) % BLOCKS;
                let v = cacache::read_sync(cdir.path(), name(j)).unwrap();
                assert_eq!(v.len(), size);
                black_box(v);
            })
        });
        g.finish();

        let mut g = c.benchmark_group(format!("peer_put_{}KiB", size / 1024));
        g.throughput(Throughput::Bytes(size as u64));
        g.sample_size(20);
        let mut n = 0u32;
        g.bench_function(BenchmarkId::from_parameter("tierkv"), |b| {
            b.iter(|| {
                n += 1;
                store
                    .put(&store.key(BlockHash::chain(None, &[u32::MAX - n])), &data)
                    .unwrap();
            })
        });
        let mut m = 0u64;
        g.bench_function(BenchmarkId::from_parameter("cacache"), |b| {
            b.iter(|| {
                m += 1;
                cacache::write_sync(cdir.path(), format!("new-{m}"), &data).unwrap();
            })
        });
        g.finish();
    }
}

criterion_group!(benches, peers);
criterion_main!(benches);
