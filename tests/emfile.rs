//! The store under a small open-file limit: a working set far larger than the limit keeps
//! working, and a batch far larger than the limit is neither failed nor cut. Alone in its test
//! binary, because it lowers the process's RLIMIT_NOFILE (its tests take turns).

mod common;

use common::*;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tierkv::{Lookup, Store, StoreConfig};

/// The tests of this binary change one process-wide limit: one at a time.
static LIMIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets the soft open-file limit to `n`; returns the old limits.
fn limit_files(n: u64) -> Rlimit {
    let old = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(n),
            maximum: old.maximum,
        },
    )
    .unwrap();
    old
}

#[test]
fn thousands_of_blocks_under_an_open_file_limit_of_64() {
    let _turn = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 3000;
    {
        let store = open(dir.path(), "w");
        let ks = keys(&store, N);
        for (i, k) in ks.iter().enumerate() {
            store.put(k, &payload(i as u64, 0, 512)).unwrap();
        }
    }
    let old = limit_files(64);

    // The default capacity follows the limit (a quarter of it).
    let store = open(dir.path(), "w");
    assert_eq!(store.stats().fd_cache_capacity, 16);
    drop(store);

    // Configured far above the limit: EMFILE happens, the cache shrinks and the read retries.
    let store = Store::open(
        dir.path(),
        worker("w"),
        StoreConfig::new().with_fd_cache(1000),
    )
    .unwrap();
    // Other parts of the process hold descriptors too.
    let held: Vec<std::fs::File> = (0..20).map(|_| tempfile::tempfile().unwrap()).collect();
    let ks = keys(&store, N);
    let mut order: Vec<usize> = (0..N as usize).collect();
    let mut b = vec![0u8; 512];
    for pass in 0..2 {
        // A different order each pass, batches of 8.
        order.reverse();
        for chunk in order.chunks(8) {
            let batch: Vec<_> = chunk.iter().map(|&i| ks[i].clone()).collect();
            let mut bufs = vec![vec![0u8; 512]; batch.len()];
            for (j, r) in store.get_many(&batch, &mut bufs).into_iter().enumerate() {
                assert_eq!(r.unwrap(), Lookup::Hit(512), "pass {pass}");
                assert_eq!(bufs[j], payload(chunk[j] as u64, 0, 512));
            }
        }
        // Puts (which open temp files) work too.
        for (i, k) in ks.iter().enumerate().take(200) {
            store.put(k, &payload(i as u64, 0, 512)).unwrap();
        }
    }
    let s = store.stats();
    assert!(s.fd_cache_shrinks > 0, "the limit was reached: {s:?}");
    assert!(s.fd_cache_capacity < 64, "{s:?}");
    assert_eq!(s.read_errors + s.put_errors, 0);
    assert_eq!(store.get(&ks[0], &mut b).unwrap(), Lookup::Hit(512));
    drop(held);
    setrlimit(Resource::Nofile, old).unwrap();
}

/// A put of 2,000 blocks at a soft limit of 1,024 stored 508 and raised
/// EMFILE; a get of 2,000 stored blocks did the same. Here the limit is 64 and one batch holds
/// 2,000 blocks: every block is stored and read back whole.
#[test]
fn one_batch_of_thousands_of_blocks_under_an_open_file_limit_of_64() {
    let _turn = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    const N: u64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let old = limit_files(64);
    let (ks, items) = {
        let store = open(dir.path(), "w");
        let ks = keys(&store, N);
        let items: Vec<_> = ks
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), payload(i as u64, 0, 512)))
            .collect();
        for (i, r) in store.put_many(&items).into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("block {i}: {e}"));
        }
        let s = store.stats();
        assert_eq!((s.not_admitted, s.put_errors), (0, 0), "{s:?}");
        (ks, items)
    };
    // A fresh store (an empty open-file cache): every read opens its file.
    let store = open(dir.path(), "w");
    let mut bufs = vec![vec![0u8; 512]; N as usize];
    for (i, r) in store.get_many(&ks, &mut bufs).into_iter().enumerate() {
        assert_eq!(
            r.unwrap_or_else(|e| panic!("block {i}: {e}")),
            Lookup::Hit(512)
        );
        assert_eq!(bufs[i], items[i].1, "block {i}");
    }
    setrlimit(Resource::Nofile, old).unwrap();
}
