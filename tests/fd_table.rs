//! The open-file cache never grows the process's descriptor table while it fills: the store
//! grows the table once, when it opens (`BlockDir::reserve_descriptor_slots`). Alone in its
//! test binary, because the table is the process's.

mod common;

use common::*;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tierkv::{Store, StoreConfig};

/// The size of this process's descriptor table (`FDSize` in /proc/self/status).
fn fd_table_size() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .expect("FDSize in /proc/self/status")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn opening_a_store_grows_the_descriptor_table_for_its_open_file_cache() {
    // A soft limit that leaves room for the cache and the margin.
    let old = getrlimit(Resource::Nofile);
    let hard = old.maximum.unwrap_or(1 << 20);
    let soft = hard.min(1 << 16);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(soft),
            maximum: old.maximum,
        },
    )
    .unwrap();
    let cap = (soft as usize / 4).min(3000);
    let dir = tempfile::tempdir().unwrap();

    // Without a cache the table stays as it is.
    let before = fd_table_size();
    assert!(
        before < cap,
        "the table already holds {before} >= {cap} descriptors"
    );
    let store = Store::open(dir.path(), worker("w"), StoreConfig::new().with_fd_cache(0)).unwrap();
    assert_eq!(fd_table_size(), before);
    drop(store);

    let store = Store::open(
        dir.path(),
        worker("w"),
        StoreConfig::new().with_fd_cache(cap),
    )
    .unwrap();
    let after = fd_table_size();
    assert!(
        after >= cap,
        "descriptor table of {after} after opening a store with a cache of {cap} (was {before})"
    );
    // Filling the cache does not grow it again.
    let ks = keys(&store, cap as u64);
    for (i, k) in ks.iter().enumerate() {
        store.put(k, &payload(i as u64, 0, 64)).unwrap();
    }
    let mut b = vec![0u8; 64];
    for k in &ks {
        assert_eq!(store.get(k, &mut b).unwrap(), tierkv::Lookup::Hit(64));
    }
    assert!(store.stats().fd_cache_len as usize >= cap - 1);
    assert_eq!(fd_table_size(), after);
}
