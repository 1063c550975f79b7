//! Fault injection: writes that fail half way, a full disk (injected and real), read errors.

mod common;

use std::sync::Arc;

use common::*;
use tierkv::engine::{IoEngine, PsyncEngine};
use tierkv::testing::{FaultPlan, FaultyEngine};
use tierkv::{Error, Lookup, Store, StoreConfig};

fn faulty_store(dir: &std::path::Path, plan: FaultPlan) -> (Store, Arc<FaultyEngine>) {
    let engine = Arc::new(FaultyEngine::new(Arc::new(PsyncEngine::new()), plan));
    let store = Store::open_with_engine(
        dir,
        worker("w"),
        StoreConfig::default(),
        engine.clone() as Arc<dyn IoEngine>,
    )
    .unwrap();
    (store, engine)
}

#[test]
fn a_write_failing_half_way_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = faulty_store(dir.path(), FaultPlan::enospc_half_way_from(2));
    // Another chain's block, stored first: what ENOSPC can evict.
    let other = store.key(hash(999));
    store.put(&other, &payload(999, 0, 100_000)).unwrap();
    let ks = keys(&store, 3);
    let datas: Vec<Vec<u8>> = (0..3).map(|i| payload(i, 0, 100_000)).collect();
    let items = items(&ks, &datas);
    let res = store.put_many(&items);
    // ENOSPC below the capacity: the store evicted what it could (the other chain's block;
    // never the batch's own blocks) and retried the chain from its first failed block, block
    // by block; that block failed again, so the retry stopped there (a block after it could
    // not be reached).
    assert_eq!(engine.writes_seen(), 5);
    // Every failing write really wrote half its bytes (header + half the payload).
    assert_eq!(
        engine.partial_bytes_written(),
        3 * u64::midpoint(4096, 100_000)
    );
    let s = store.stats();
    assert_eq!((s.nospace_retries, s.evictions), (1, 1));
    assert!(res[0].is_ok());
    for r in &res[1..] {
        match r {
            Err(Error::NoSpace { path, .. }) => assert!(
                path.to_str().unwrap().contains(&ks[1].hash.to_hex()[..8])
                    || path.to_str().unwrap().contains(&ks[2].hash.to_hex()[..8])
            ),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        temp_files_under(store.dir()).is_empty(),
        "temp files unlinked"
    );
    assert!(!store.path_of(&ks[1].hash).exists());
    assert_eq!(
        check_all_blocks(store.dir()),
        1,
        "the other block was evicted for room; the chain's root stays"
    );
    assert!(!store.path_of(&other.hash).exists());
    // Reads keep working: misses, not errors.
    let mut b = vec![0u8; 100_000];
    assert!(store.get(&ks[0], &mut b).unwrap().is_hit());
    for k in &ks[1..] {
        assert_eq!(store.get(k, &mut b).unwrap(), Lookup::Miss);
    }
    assert_eq!(store.stats().put_errors, 2);
}

#[test]
fn a_failed_overwrite_keeps_the_old_block() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = faulty_store(dir.path(), FaultPlan::enospc_half_way_from(1));
    let k = store.key(hash(1));
    store.put(&k, &payload(1, 1, 50_000)).unwrap();
    assert!(matches!(
        store.put(&k, &payload(1, 2, 50_000)),
        Err(Error::NoSpace { .. })
    ));
    let mut b = vec![0u8; 50_000];
    assert_eq!(store.get(&k, &mut b).unwrap(), Lookup::Hit(50_000));
    assert_eq!(b, payload(1, 1, 50_000));
    assert!(temp_files_under(store.dir()).is_empty());
}

#[test]
fn read_errors_are_errors_not_misses_and_keep_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan {
        fail_writes_from: None,
        fail_reads_from: Some(0),
        partial_fraction: 0.0,
        errno: 5, // EIO
    };
    let (store, _) = faulty_store(dir.path(), plan);
    let k = store.key(hash(1));
    store.put(&k, b"block").unwrap();
    match store.get(&k, &mut [0u8; 5]) {
        Err(Error::Io { path, source }) => {
            assert_eq!(source.raw_os_error(), Some(5));
            assert_eq!(path, store.path_of(&k.hash));
        }
        other => panic!("{other:?}"),
    }
    assert!(store.path_of(&k.hash).exists());
    assert_eq!(store.stats().read_errors, 1);
}

/// A real full filesystem: a 2 MiB tmpfs. Needs root (mount); CI runs as root and sets
/// TIERKV_REQUIRE_PRIVILEGED_TESTS=1 so that this cannot silently skip there.
#[test]
fn a_real_full_disk_is_no_space_and_leaves_nothing_partial() {
    let Some(mnt) = Tmpfs::mount("2m", "the real ENOSPC test") else {
        return;
    };

    let store = open(mnt.path(), "w");
    // 200 blocks of 96 KiB (19 MiB) into 2 MiB: every put succeeds by evicting older blocks
    // when the filesystem reports ENOSPC (no capacity is configured).
    for i in 0..200 {
        let k = store.key(hash(i));
        store.put(&k, &payload(i, 0, 96 * 1024)).unwrap();
        // Whatever the moment, nothing partial is visible and no temp file survives.
        if i % 20 == 0 {
            assert!(temp_files_under(store.dir()).is_empty());
            check_all_blocks(store.dir());
        }
    }
    let s = store.stats();
    assert!(s.nospace_retries > 0 && s.evictions > 0, "{s:?}");
    assert_eq!(s.put_errors, 0);
    assert!(
        temp_files_under(store.dir()).is_empty(),
        "no temp file survives ENOSPC"
    );
    assert_eq!(
        check_all_blocks(store.dir()) as u64,
        s.used_files,
        "no partial block is visible"
    );
    // Reads keep working on a full disk; the newest block is there.
    let mut b = vec![0u8; 96 * 1024];
    assert_eq!(
        store.get(&store.key(hash(199)), &mut b).unwrap(),
        Lookup::Hit(96 * 1024)
    );
    assert_eq!(b, payload(199, 0, 96 * 1024));
    // A block larger than the whole filesystem: NoSpace after the retry, nothing partial.
    match store.put(&store.key(hash(1000)), &vec![7u8; 3 << 20]) {
        Err(Error::NoSpace { .. }) => {}
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert!(temp_files_under(store.dir()).is_empty());
    assert!(!store.path_of(&hash(1000)).exists());
    check_all_blocks(store.dir());
    drop(store);
}

/// A chain put into a filesystem it does not fit (a 24 MiB tmpfs, 16 blocks of 2 MiB, no
/// capacity configured): ENOSPC makes the store evict and retry, and whatever it keeps of the
/// chain is a prefix of it; every block past that prefix is `NoSpace` or, if it was written
/// but its parent could not be, counted as not admitted. Found through SGLang's backend
/// (tools/engine-bench-sglang.py): the batch's two writer threads each met ENOSPC on their
/// own tail, the retry took both runs for one chain, and blocks 0-7 and 13-15 were kept,
/// 8-12 evicted, all 16 puts `Ok`.
#[test]
fn a_chain_meeting_a_full_disk_keeps_a_prefix() {
    for (size, n) in [("24m", 16), ("48m", 32)] {
        chain_at_a_full_disk(size, n);
    }
}

fn chain_at_a_full_disk(size: &str, n: usize) {
    let Some(mnt) = Tmpfs::mount(size, "the chain at a full disk test") else {
        return;
    };
    let store = open(mnt.path(), "w");
    let ks = chain_keys(&store, 7, n);
    let datas: Vec<Vec<u8>> = (0..n as u64).map(|i| payload(i, 0, 2 << 20)).collect();
    let res = store.put_many(&items(&ks, &datas));
    let present: Vec<bool> = store
        .contains_many(&ks)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let kept = present.iter().take_while(|p| **p).count();
    assert!(
        prefix_closed(&store, std::slice::from_ref(&ks)),
        "present: {present:?}, results: {res:?}"
    );
    // 11 blocks of 2 MiB + 4 KiB fit in 24 MiB, 23 in 48: the retry, block by block,
    // fills it (within a block).
    let fit = n * 11 / 16;
    assert!(kept + 1 >= fit && kept < n, "{present:?}, results: {res:?}");
    let failed = res.iter().filter(|r| r.is_err()).count();
    for (i, r) in res.iter().enumerate().take(kept) {
        assert!(r.is_ok(), "block {i} is stored: {r:?}");
    }
    for (i, r) in res.iter().enumerate().skip(kept) {
        assert!(
            matches!(r, Ok(()) | Err(Error::NoSpace { .. })),
            "block {i}: {r:?}"
        );
    }
    assert_eq!(
        failed as u64 + store.stats().not_admitted,
        (n - kept) as u64,
        "every block past the prefix is said not stored: {res:?}"
    );
    let mut b = vec![0u8; 2 << 20];
    for (i, k) in ks.iter().enumerate().take(kept) {
        assert_eq!(store.get(k, &mut b).unwrap(), Lookup::Hit(2 << 20));
        assert_eq!(b, datas[i]);
    }
    assert!(temp_files_under(store.dir()).is_empty());
}

/// A buffered batch of 8 MiB and more writes on two threads, each streaming half of it: an I/O
/// error on some of its writes fails exactly those blocks (their temp files gone, misses after),
/// every block before the first failure is published with its own bytes, and the blocks after
/// it that were written are removed again (the batch is one chain: they could not be reached),
/// `Ok` and counted as not admitted. The same batch `O_DIRECT` (one thread) holds to the same.
#[test]
fn a_large_batch_keeps_each_result_with_its_block_when_writes_fail() {
    for direct in [false, true] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let plan = FaultPlan {
            fail_writes_from: Some(5),
            fail_reads_from: None,
            partial_fraction: 0.5,
            errno: 5, // EIO
        };
        let engine = Arc::new(FaultyEngine::new(Arc::new(PsyncEngine::new()), plan));
        let store = Store::open_with_engine(
            dir.path(),
            worker("w"),
            StoreConfig::default().with_direct_io(direct),
            engine.clone() as Arc<dyn IoEngine>,
        )
        .unwrap();
        let ks = keys(&store, 8);
        let datas: Vec<Vec<u8>> = (0..8)
            .map(|i| payload(i, 0, (1 << 20) + 4096 * i as usize))
            .collect();
        let res = store.put_many(&items(&ks, &datas));
        assert_eq!(engine.writes_seen(), 8, "direct={direct}");
        let failed: Vec<usize> = (0..8).filter(|&i| res[i].is_err()).collect();
        assert_eq!(
            failed.len(),
            3,
            "direct={direct}: writes 5, 6 and 7 failed: {res:?}"
        );
        if direct {
            // One thread: the writes run in the batch's order.
            assert_eq!(failed, vec![5, 6, 7]);
        }
        let first = failed[0];
        let mut b = vec![0u8; 2 << 20];
        for (i, (k, d)) in ks.iter().zip(&datas).enumerate() {
            match &res[i] {
                Ok(()) if i > first => {
                    assert_eq!(store.get(k, &mut b).unwrap(), Lookup::Miss, "block {i}");
                }
                Ok(()) => {
                    assert_eq!(
                        store.get(k, &mut b).unwrap(),
                        Lookup::Hit(d.len()),
                        "block {i}"
                    );
                    assert_eq!(&b[..d.len()], &d[..], "block {i}'s bytes");
                }
                Err(Error::Io { path, .. }) => {
                    assert!(
                        path.to_str().unwrap().contains(&k.hash.to_hex()[..8]),
                        "{path:?}"
                    );
                    assert_eq!(store.get(k, &mut b).unwrap(), Lookup::Miss, "block {i}");
                }
                Err(e) => panic!("block {i}: {e:?}"),
            }
        }
        assert!(
            temp_files_under(store.dir()).is_empty(),
            "temp files unlinked"
        );
        assert_eq!(check_all_blocks(store.dir()), first, "direct={direct}");
        assert_eq!(store.stats().put_errors, 3);
        assert_eq!(store.stats().not_admitted, (8 - first - 3) as u64);
    }
}

/// A temp name that exists already (planted, or left by a crash) is not an error: the put
/// takes another sequence number, up to 16 more times; any other error of the create is the
/// put's error, at once.
#[test]
fn a_temp_name_taken_already_is_retried_and_other_create_errors_are_not() {
    use rustix::io::Errno;
    use tierkv::testing::{NsFaults, NsOp};
    let data = payload(1, 0, 5000);
    // Taken once: the next name is used.
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    let store = open_with_ns_faults(dir.path(), StoreConfig::new(), &faults);
    let k = store.key(hash(1));
    faults.fail(NsOp::Create, Errno::EXIST, 0, 1);
    store.put(&k, &data).unwrap();
    assert_eq!(faults.injected(), 1);
    let mut buf = vec![0u8; 8192];
    assert_eq!(store.get(&k, &mut buf).unwrap(), Lookup::Hit(5000));
    assert!(buf[..5000] == data[..]);
    // Taken every time: 17 names tried, then the put fails, naming its temp file.
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    let store = open_with_ns_faults(dir.path(), StoreConfig::new(), &faults);
    faults.fail(NsOp::Create, Errno::EXIST, 0, u64::MAX);
    match store.put(&k, &data) {
        Err(Error::Io { path, source }) => {
            assert_eq!(source.raw_os_error(), Some(Errno::EXIST.raw_os_error()));
            assert!(path.to_str().unwrap().contains(".tmp."), "{path:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(faults.injected(), 17);
    // Another error: not retried.
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(NsFaults::new());
    let store = open_with_ns_faults(dir.path(), StoreConfig::new(), &faults);
    faults.fail(NsOp::Create, Errno::ACCESS, 0, 1);
    assert!(store.put(&k, &data).is_err());
    assert_eq!(faults.injected(), 1);
    assert_eq!(store.get(&k, &mut buf).unwrap(), Lookup::Miss);
}
