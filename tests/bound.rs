//! The capacity bound at every instant, measured from outside the store: a tmpfs whose
//! `statvfs` counts its inodes and pages at one instant, sampled as fast as a thread can while
//! the store works. In its own test binary: a test that spawns a process while this one runs
//! would lend the child copies of the store's descriptors for the moment between fork and
//! exec, and a file unlinked then lives on (and is counted) until the child execs.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use tierkv::engine::{EngineKind, IoEngine, IoRequest};
use tierkv::{Error, Layout, Store, StoreConfig};

/// Samples the filesystem at `path` (statvfs: each sample is one instant) as fast as it can
/// until `stop`, and returns the most inodes and bytes in use above the first sample.
fn sampler(path: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64)> {
    let used = move |p: &Path| {
        let v = rustix::fs::statvfs(p).unwrap();
        (v.f_files - v.f_ffree, (v.f_blocks - v.f_bfree) * v.f_frsize)
    };
    let base = used(&path);
    std::thread::spawn(move || {
        let (mut files, mut bytes) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let (f, b) = used(&path);
            files = files.max(f.saturating_sub(base.0));
            bytes = bytes.max(b.saturating_sub(base.1));
        }
        (files, bytes)
    })
}

#[test]
fn the_bound_is_never_exceeded() {
    let root = tempfile::tempdir().unwrap();
    capacities_that_hold_no_block_are_refused(root.path());
    a_block_larger_than_the_capacity_is_not_stored(root.path());
    // The bound at every instant: a tmpfs (statvfs counts its inodes and pages exactly, at
    // one instant), a flat tree (no shard directories to count), no STATS.json.
    let Some(fs) = Tmpfs::mount("256m", "counting files and bytes at one instant") else {
        return;
    };
    // Evicted files unlinked (reuse has its own part, the last).
    let flat = quiet()
        .with_layout(Layout::new(0, 256).unwrap())
        .with_watermarks(1.0, 1.0)
        .with_reuse_evicted(false);
    let cap = 4u64 << 20;
    a_file_bound_holds_at_every_instant(fs.path(), &flat);
    the_background_evictor_keeps_the_bound_beside_two_writers(fs.path());
    a_byte_bound_holds_as_every_block_grows_16x(fs.path(), &flat, cap);
    a_byte_bound_holds_with_evicted_files_reused(fs.path(), cap);
}

/// A capacity that holds no block is refused at open.
fn capacities_that_hold_no_block_are_refused(root: &Path) {
    for cfg in [
        quiet().with_capacity_files(0),
        quiet().with_capacity_bytes(4096),
    ] {
        match Store::open(root, worker("1"), cfg) {
            Err(Error::Config(msg)) => assert!(msg.contains("capacity"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}

/// A block larger than the capacity is not stored (and not an error).
fn a_block_larger_than_the_capacity_is_not_stored(root: &Path) {
    let store = Store::open(root, worker("2"), quiet().with_capacity_bytes(64 << 10)).unwrap();
    let k = store.key(hash(1));
    store.put(&k, &vec![1u8; 1 << 20]).unwrap();
    assert!(
        !store.contains_many(std::slice::from_ref(&k))[0]
            .as_ref()
            .unwrap()
    );
    assert_eq!(store.stats().not_admitted, 1);
    assert!(
        files_under(store.dir())
            .iter()
            .all(|p| p.file_name().unwrap().len() != 64)
    );
}

/// A file-count bound, one chain of 200 blocks, then unrelated single puts (worker 0).
fn a_file_bound_holds_at_every_instant(fs: &Path, flat: &StoreConfig) {
    let store = Store::open(fs, worker("0"), flat.clone().with_capacity_files(10)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sample = sampler(fs.to_path_buf(), stop.clone());
    let chain = chain_keys(&store, 1, 200);
    let data = vec![1u8; 65_536];
    let items: Vec<_> = chain.iter().map(|k| (k.clone(), data.as_slice())).collect();
    for r in store.offer_many(&items) {
        r.unwrap();
    }
    assert_eq!(
        store.stats().not_admitted,
        190,
        "the chain's tail was not admitted"
    );
    assert_eq!(
        store.contains_prefix(&chain).unwrap(),
        10,
        "its first 10 were"
    );
    for i in 0..60 {
        store.put(&store.key(hash(5000 + i)), &data).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (max_files, _) = sample.join().unwrap();
    assert!(
        max_files <= 10,
        "{max_files} files at one instant, bound 10"
    );
    assert!(store.stats().used_files <= 10);
    assert!(prefix_closed(&store, std::slice::from_ref(&chain)));
    drop(store);
}

/// The background evictor (default watermarks) beside two writers: blocks it evicted count
/// until their files are gone, so the bound holds while it unlinks them too (worker 2).
fn the_background_evictor_keeps_the_bound_beside_two_writers(fs: &Path) {
    let store = Store::open(
        fs,
        worker("2"),
        quiet()
            .with_layout(Layout::new(0, 256).unwrap())
            .with_capacity_files(20)
            .with_reuse_evicted(false),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sample = sampler(fs.to_path_buf(), stop.clone());
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let data = vec![3u8; 16_384];
                for i in 0..300 {
                    store
                        .put(&store.key(hash(10_000 * (t + 1) + i)), &data)
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (max_files, _) = sample.join().unwrap();
    assert!(
        max_files <= 20,
        "{max_files} files at one instant, bound 20"
    );
    assert!(store.stats().evictions >= 580);
    drop(store);
}

/// A byte bound, and every block replaced by one 16x its size (worker 1).
fn a_byte_bound_holds_as_every_block_grows_16x(fs: &Path, flat: &StoreConfig, cap: u64) {
    let store = Store::open(fs, worker("1"), flat.clone().with_capacity_bytes(cap)).unwrap();
    let ks = fill(&store, 40, 65_536);
    let stop = Arc::new(AtomicBool::new(false));
    let sample = sampler(fs.to_path_buf(), stop.clone());
    let big = vec![2u8; 1 << 20];
    for k in &ks {
        store.put(k, &big).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (_, max_bytes) = sample.join().unwrap();
    // The sampler's base already holds worker 0's 10 blocks and worker 1's 40 small ones.
    let base_1 = 40 * (4096 + 65_536);
    assert!(
        max_bytes + base_1 <= cap,
        "{} bytes of worker 1 at one instant, bound {cap}",
        max_bytes + base_1
    );
    assert!(store.stats().used_bytes <= cap);
    drop(store);
}

/// A byte bound with evicted files reused, blocks of mixed sizes: a reused file keeps its old
/// size until the put has written and cut it, so only a file that fits in the room reserved
/// for the new block is reused (worker 3).
fn a_byte_bound_holds_with_evicted_files_reused(fs: &Path, cap: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let sample = sampler(fs.to_path_buf(), stop.clone());
    let reusing = quiet()
        .with_layout(Layout::new(0, 256).unwrap())
        .with_capacity_bytes(cap)
        .with_reuse_evicted(true);
    // Writes that take a while, so that the sampler sees the moment between a file's
    // reuse and its put's write.
    #[derive(Debug)]
    struct Slow(Arc<dyn IoEngine>);
    impl IoEngine for Slow {
        fn name(&self) -> &'static str {
            self.0.name()
        }
        fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<std::io::Result<usize>> {
            std::thread::sleep(std::time::Duration::from_millis(2));
            self.0.submit(batch)
        }
    }
    let slow = Arc::new(Slow(EngineKind::Psync.build().unwrap()));
    let store = Store::open_with_engine(fs, worker("3"), reusing, slow).unwrap();
    // Batches of five sizes, in turning orders: within a batch the room of one block's
    // victim goes to another block.
    let sizes = [1 << 20, 65_536, 300_000, (1 << 20) + 5000, 4096];
    for b in 0..40u64 {
        let datas: Vec<Vec<u8>> = (0..5)
            .map(|j| vec![4u8; sizes[(b as usize + j * 2) % sizes.len()]])
            .collect();
        let ks: Vec<_> = (0..5)
            .map(|j| store.key(hash(50_000 + b * 5 + j)))
            .collect();
        for r in store.put_many(&common::items(&ks, &datas)) {
            r.unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (_, max_bytes) = sample.join().unwrap();
    assert!(
        max_bytes <= cap,
        "{max_bytes} bytes of worker 3 at one instant, bound {cap}"
    );
    let s = store.stats();
    assert!(s.reused_files > 0, "{s:?}");
    assert!(s.used_bytes <= cap);
}
