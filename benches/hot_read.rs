//! Micro-benchmarks of the hot paths: key to path, header encode/decode, and a get of a hot
//! block through the open-file cache vs the naive mode (flat directory, open+read+close per
//! access), at 4 KiB, 64 KiB and 256 KiB, side by side in one run.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierkv::format::Header;
use tierkv::{BlockHash, Layout, Lookup, Store, StoreConfig, VerifyMode, WorkerId};

const BLOCKS: u64 = 256;

fn hashes() -> Vec<BlockHash> {
    (0..BLOCKS)
        .map(|i| BlockHash::chain(None, &[i as u32]))
        .collect()
}

fn open(dir: &std::path::Path, depth: u8, fd_cache: usize) -> Store {
    let cfg = StoreConfig::new()
        .with_layout(Layout::new(depth, 256).unwrap())
        .with_fd_cache(fd_cache)
        .with_verify(VerifyMode::OnOpen);
    Store::open(dir, WorkerId::new("bench").unwrap(), cfg).unwrap()
}

fn paths_and_headers(c: &mut Criterion) {
    let h = BlockHash::chain(None, &[1, 2, 3]);
    let layout = Layout::new(2, 256).unwrap();
    c.bench_function("key_to_path_depth2", |b| {
        b.iter(|| black_box(layout.rel_path(black_box(&h))))
    });
    let header = Header::for_payload(h, &[7u8; 64], None);
    let bytes = header.encode();
    c.bench_function("header_encode", |b| {
        b.iter(|| black_box(black_box(&header).encode()))
    });
    c.bench_function("header_decode", |b| {
        b.iter(|| black_box(Header::decode(black_box(&bytes))))
    });
    let payload = vec![3u8; 64 * 1024];
    let header = Header::for_payload(h, &payload, None);
    let mut g = c.benchmark_group("payload_verify");
    g.throughput(Throughput::Bytes(payload.len() as u64));
    g.bench_function("64KiB", |b| {
        b.iter(|| black_box(header.verify(black_box(&payload))))
    });
    g.finish();
    // blake3 on one thread against blake3's rayon (every core) per payload size: where the
    // threads win is `format::PARALLEL_HASH_MIN`.
    for size in [64usize << 10, 256 << 10, 2 << 20, 8 << 20, 32 << 20] {
        let payload = vec![3u8; size];
        let mut g = c.benchmark_group(format!("blake3_{}KiB", size >> 10));
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function("one_thread", |b| {
            b.iter(|| black_box(blake3::hash(black_box(&payload))))
        });
        g.bench_function("rayon", |b| {
            b.iter(|| {
                black_box(
                    blake3::Hasher::new()
                        .update_rayon(black_box(&payload))
                        .finalize(),
                )
            })
        });
        g.finish();
    }
}

fn hot_get(c: &mut Criterion) {
    let hs = hashes();
    for size in [4 * 1024usize, 64 * 1024, 256 * 1024] {
        let mut g = c.benchmark_group(format!("hot_get_{}KiB", size / 1024));
        g.throughput(Throughput::Elements(1));
        for (name, depth, fd_cache) in [("cached", 1u8, 4096usize), ("naive", 0, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path(), depth, fd_cache);
            let data = vec![0x5Au8; size];
            for h in &hs {
                store.put(&store.key(*h), &data).unwrap();
            }
            let keys: Vec<_> = hs.iter().map(|h| store.key(*h)).collect();
            let mut buf = vec![0u8; size];
            let mut i = 0usize;
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| {
                    i = (i + 97) % keys.len();
                    let r = store.get(&keys[i], &mut buf).unwrap();
                    assert_eq!(r, Lookup::Hit(size));
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, paths_and_headers, hot_get);
criterion_main!(benches);
