//! The event journal (docs/events.md): replayed from its first event, it is the tree. Every
//! way a block comes and goes is driven (puts, eviction by reuse and by unlinking, in the
//! put and in the background, removal with and without descendants, `clear`, a corrupt file
//! found by a read, a file deleted by hand and found missing), in exclusive mode and by two
//! shared stores that overlap; then the journal, read by the independent reader of
//! tests/common/oracle.rs, is replayed into a set and compared with the block files the oracle
//! finds in the tree.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::oracle::{self, JournalRecord};
use common::*;
use tierkv::{BlockKey, EventCause, EventKind, Sharing, Store, StoreConfig};

const LEN: usize = 8192;

/// The journal of worker `w` under `root`, replayed: the names of the blocks it says are
/// stored. Also checks that the store's own reader gives the same events.
fn replay(root: &Path, w: &str, store: Option<&Store>) -> (BTreeSet<String>, Vec<JournalRecord>) {
    let (next, _, records) = oracle::read_journal(&root.join("v1").join(w).join("EVENTS"));
    assert_eq!(
        records.first().map(|r| r.seq),
        Some(0),
        "the ring still holds every event"
    );
    let mut present = BTreeSet::new();
    for r in &records {
        match r.kind {
            1 => present.insert(r.hex.clone()),
            _ => present.remove(&r.hex),
        };
    }
    if let Some(s) = store {
        let read = s.events_since(0, usize::MAX).unwrap();
        assert_eq!((read.next, read.missed), (next, 0));
        let ours: Vec<(u64, String, bool)> = read
            .events
            .iter()
            .map(|e| (e.seq, e.hash.to_hex(), e.kind == EventKind::Stored))
            .collect();
        let theirs: Vec<(u64, String, bool)> = records
            .iter()
            .map(|r| (r.seq, r.hex.clone(), r.kind == 1))
            .collect();
        assert_eq!(ours, theirs, "the store reads what the document describes");
    }
    (present, records)
}

/// The names of the valid block files of worker `w`, by the oracle.
fn tree(root: &Path, w: &str) -> BTreeSet<String> {
    let t = oracle::read_worker(&root.join("v1").join(w));
    assert!(t.bad_blocks.is_empty() && t.misplaced.is_empty(), "{t:?}");
    t.blocks
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// How many records have each cause (1 put .. 6 repair).
fn causes(records: &[JournalRecord]) -> [usize; 7] {
    let mut n = [0; 7];
    for r in records {
        n[usize::from(r.cause)] += 1;
    }
    n
}

fn put_chains(store: &Store, seeds: std::ops::Range<u32>, n: usize) -> Vec<Vec<BlockKey>> {
    seeds
        .map(|seed| {
            let chain = chain_keys(store, seed, n);
            let data: Vec<Vec<u8>> = (0..n).map(|i| payload(i as u64, seed as u8, LEN)).collect();
            for r in store.put_many(&items(&chain, &data)) {
                r.unwrap();
            }
            chain
        })
        .collect()
}

/// Exclusive stores, reuse of evicted files on and off: every cause but repair shows in the
/// journal, and the journal replayed is the tree.
#[test]
fn replayed_the_journal_is_the_tree_whatever_removed_the_blocks() {
    for reuse in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = quiet()
            .with_sharing(Sharing::Exclusive)
            .with_events(true)
            .with_reuse_evicted(reuse)
            .with_capacity_files(40);
        let store = Store::open(dir.path(), worker("w"), cfg).unwrap();
        let chains = put_chains(&store, 0..30, 4);
        // Removed with its descendants, and alone (its descendants stay, detached).
        let last = chains.last().unwrap();
        assert!(store.remove_many(&last[1..2])[0].as_ref().unwrap());
        let prev = &chains[chains.len() - 2];
        assert!(store.discard_many(&prev[..1])[0].as_ref().unwrap());
        // A corrupt file found by a read, a file deleted by hand found by a lookup.
        let held: Vec<&BlockKey> = chains
            .iter()
            .flatten()
            .filter(|k| {
                store.contains_many(std::slice::from_ref(*k))[0]
                    .as_ref()
                    .unwrap()
                    == &true
            })
            .collect();
        let (bad, gone) = (held[0].clone(), held[1].clone());
        std::fs::write(store.path_of(&bad.hash), b"not a block").unwrap();
        let mut buf = vec![0u8; LEN];
        assert!(!store.get(&bad, &mut buf).unwrap().is_hit());
        std::fs::remove_file(store.path_of(&gone.hash)).unwrap();
        store.recheck_many(std::slice::from_ref(&gone)).unwrap();
        let (present, records) = replay(dir.path(), "w", Some(&store));
        drop(store);
        assert_eq!(present, tree(dir.path(), "w"), "reuse {reuse}");
        let n = causes(&records);
        assert!(
            n[1] >= 120 && n[2] > 0 && n[3] >= 2 && n[4] == 1 && n[5] == 1,
            "{n:?}"
        );
        assert!(
            records
                .iter()
                .all(|r| r.node == tierkv::testing::node_id() && r.pid == std::process::id())
        );
        // A store opened without events on a worker that has a journal writes to it.
        let plain = quiet()
            .with_sharing(Sharing::Exclusive)
            .with_capacity_files(40);
        let store = Store::open(dir.path(), worker("w"), plain).unwrap();
        let removed = store.clear().unwrap();
        assert!(removed > 0);
        let (present, records) = replay(dir.path(), "w", Some(&store));
        assert!(present.is_empty() && tree(dir.path(), "w").is_empty());
        assert_eq!(causes(&records)[3] as u64, 2 + removed);
    }
}

/// A store opened without events on a worker with no journal makes none.
#[test]
fn without_events_no_journal_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), quiet()).unwrap();
    put_chains(&store, 0..2, 3);
    let read = store.events_since(0, 10).unwrap();
    assert_eq!((read.events.len(), read.journal_id), (0, 0));
    assert!(!dir.path().join("v1/w/EVENTS").exists());
}

/// Two shared stores on one worker, putting overlapping chains at once under one capacity,
/// each evicting blocks the other put: the journal replayed is the tree, and its order is
/// the order on disk (no block ends up "stored" that is gone, nor the reverse).
#[test]
fn two_shared_stores_that_overlap_journal_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || {
        quiet()
            .with_sharing(Sharing::Shared)
            .with_events(true)
            .with_capacity_files(48)
    };
    let a = Store::open(dir.path(), worker("w"), cfg()).unwrap();
    let b = Store::open(dir.path(), worker("w"), cfg()).unwrap();
    std::thread::scope(|s| {
        for (store, from) in [(&a, 0u32), (&b, 20u32)] {
            s.spawn(move || {
                for round in 0..3u32 {
                    // Chains 20..40 are put by both: published by one, found by the other.
                    put_chains(store, from + round * 5..from + round * 5 + 25, 3);
                }
            });
        }
    });
    drop(b);
    let (present, records) = replay(dir.path(), "w", Some(&a));
    drop(a);
    assert_eq!(present, tree(dir.path(), "w"));
    let n = causes(&records);
    assert!(n[1] > 100 && n[2] > 50, "{n:?}");
    // No block is told stored twice without a removal between (which would mean a removal
    // lost); a removal may be told twice (a store that finds gone what another evicted).
    let mut last = std::collections::HashMap::<&str, u8>::new();
    for r in &records {
        if let Some(prev) = last.insert(&r.hex, r.kind) {
            assert!(
                !(prev == 1 && r.kind == 1),
                "block {} told stored twice in a row (seq {})",
                r.hex,
                r.seq
            );
        }
    }
}

/// The public event types carry what the journal holds.
#[test]
fn events_name_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), quiet().with_events(true)).unwrap();
    let k = store.key(hash(1));
    store.put(&k, &[1u8; 100]).unwrap();
    store.remove_many(std::slice::from_ref(&k))[0]
        .as_ref()
        .unwrap();
    let ev = store.events_since(0, 10).unwrap().events;
    let got: Vec<(EventKind, EventCause, &str)> = ev
        .iter()
        .map(|e| (e.kind, e.cause, e.cause.name()))
        .collect();
    assert_eq!(
        got,
        vec![
            (EventKind::Stored, EventCause::Put, "put"),
            (EventKind::Removed, EventCause::Removed, "removed")
        ]
    );
    assert!(ev.iter().all(|e| e.hash == k.hash));
    let later = store.events_since(2, 10).unwrap();
    assert_eq!((later.events.len(), later.next), (0, 2));
    let end = store.events_end().unwrap();
    // A reader opened before the journal was made reads it once it is.
    let dir2 = tempfile::tempdir().unwrap();
    let early = Store::open(dir2.path(), worker("w"), quiet()).unwrap();
    drop(early);
    let reader = Store::open(dir2.path(), worker("w"), quiet().with_read_only(true)).unwrap();
    assert_eq!(reader.events_end().unwrap().journal_id, 0);
    let writer = Store::open(dir2.path(), worker("w"), quiet().with_events(true)).unwrap();
    writer.put(&writer.key(hash(2)), &[2u8; 100]).unwrap();
    let seen = reader.events_since(0, 10).unwrap();
    assert_eq!((seen.events.len(), seen.next), (1, 1));
    assert_eq!(seen.events[0].hash, hash(2));
    assert_eq!((end.next, end.journal_id), (2, later.journal_id));
    assert!(end.events.is_empty());
    let _ = StoreConfig::default();
}

/// A block file removed by hand, then evicted (exclusive) or forgotten by a shared store's
/// rescan of the tree: its removal is told (as missing), and the journal replayed is the tree.
#[test]
fn a_block_removed_by_hand_is_told_when_the_store_finds_it_gone() {
    for sharing in [Sharing::Exclusive, Sharing::Shared] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = quiet()
            .with_sharing(sharing)
            .with_events(true)
            .with_capacity_files(6);
        let store = Store::open(dir.path(), worker("w"), cfg).unwrap();
        let first = put_chains(&store, 0..2, 3);
        std::fs::remove_file(store.path_of(&first[0][2].hash)).unwrap();
        put_chains(&store, 2..8, 3);
        let (present, records) = replay(dir.path(), "w", Some(&store));
        drop(store);
        assert_eq!(present, tree(dir.path(), "w"), "{sharing:?}");
        assert!(
            causes(&records)[5] >= 1,
            "{sharing:?}: {:?}",
            causes(&records)
        );
    }
}

/// A shared store that cannot evict for a put (its chain's leaf is pinned, and eviction
/// takes only leaves) scans the tree for room; the block removed by hand beneath the leaf,
/// which the scan finds gone, is told as missing by the scan (nothing else looks at it), so
/// the journal replayed is still the tree.
#[test]
fn a_shared_stores_scan_tells_a_block_it_finds_gone() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = quiet()
        .with_sharing(Sharing::Shared)
        .with_events(true)
        .with_capacity_files(4);
    let store = Store::open(dir.path(), worker("w"), cfg).unwrap();
    let chain = put_chains(&store, 0..1, 4).remove(0);
    assert!(store.pin_many(&chain[3..]).into_iter().all(|r| r.unwrap()));
    std::fs::remove_file(store.path_of(&chain[2].hash)).unwrap();
    put_chains(&store, 1..2, 1);
    let (present, records) = replay(dir.path(), "w", Some(&store));
    let missing: Vec<_> = records
        .iter()
        .filter(|r| usize::from(r.cause) == 5)
        .map(|r| r.hex.clone())
        .collect();
    drop(store);
    assert_eq!(present, tree(dir.path(), "w"));
    assert_eq!(
        missing,
        vec![chain[2].hash.to_hex()],
        "told missing once, by the scan"
    );
}

/// Takes from `tail` until `want` events came or 10 s passed; the events and whether any
/// take said some were missed.
fn take_until(tail: &tierkv::EventTail, want: usize) -> (Vec<tierkv::BlockEvent>, bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut got, mut missed) = (Vec::new(), false);
    while got.len() < want && std::time::Instant::now() < deadline {
        let (events, m) = tail.take();
        got.extend(events);
        missed |= m;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    (got, missed)
}

/// The follower of a store's journal gives what another store of the worker appends after
/// it started (not what was there before), in order, nothing missed; closing it stops its
/// thread at once.
#[test]
fn an_event_tail_takes_what_is_appended_after_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || quiet().with_sharing(Sharing::Shared).with_events(true);
    let writer = Store::open(dir.path(), worker("w"), cfg()).unwrap();
    let before = put_chains(&writer, 0..1, 2);
    let reader = Store::open(dir.path(), worker("w"), cfg()).unwrap();
    let tail = tierkv::EventTail::start(reader, std::time::Duration::from_millis(10)).unwrap();
    let chain = put_chains(&writer, 1..2, 3).remove(0);
    assert!(writer.remove_many(&chain[2..])[0].as_ref().unwrap());
    let (got, missed) = take_until(&tail, 4);
    let seen: Vec<(String, EventKind)> = got.iter().map(|e| (e.hash.to_hex(), e.kind)).collect();
    let mut want: Vec<(String, EventKind)> = chain
        .iter()
        .map(|k| (k.hash.to_hex(), EventKind::Stored))
        .collect();
    want.push((chain[2].hash.to_hex(), EventKind::Removed));
    assert_eq!(seen, want, "only what came after the start, in order");
    assert!(!missed && !seen.iter().any(|(h, _)| *h == before[0][0].hash.to_hex()));
    // Nothing more comes, and the thread, waiting for more, stops at once when closed.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(tail.take(), (Vec::new(), false));
    let t0 = std::time::Instant::now();
    tail.close();
    assert!(t0.elapsed() < std::time::Duration::from_secs(1));
    // The thread ended with it and let go of its store: with the writer gone too, nothing
    // holds the worker, so an exclusive store opens.
    drop(writer);
    let cfg = quiet().with_sharing(Sharing::Exclusive);
    Store::open(dir.path(), worker("w"), cfg).expect("the tail's store was closed");
}

/// The follower looks at the journal every `interval` while it finds nothing (here an hour,
/// starting from its start: what is appended meanwhile waits), and closing it wakes it at
/// once.
#[test]
fn an_event_tail_looks_again_only_after_its_interval() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || quiet().with_sharing(Sharing::Shared).with_events(true);
    let writer = Store::open(dir.path(), worker("w"), cfg()).unwrap();
    let reader = Store::open(dir.path(), worker("w"), cfg()).unwrap();
    let tail = tierkv::EventTail::start(reader, std::time::Duration::from_secs(3600)).unwrap();
    put_chains(&writer, 0..1, 2);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(tail.take(), (Vec::new(), false), "read before its interval");
    let t0 = std::time::Instant::now();
    tail.close();
    assert!(t0.elapsed() < std::time::Duration::from_secs(1));
}

/// Dropped without `close`, the follower stops its thread just the same.
#[test]
fn a_dropped_event_tail_stops_its_thread() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = quiet().with_sharing(Sharing::Shared).with_events(true);
    let reader = Store::open(dir.path(), worker("w"), cfg).unwrap();
    let tail = tierkv::EventTail::start(reader, std::time::Duration::from_secs(3600)).unwrap();
    drop(tail);
    let cfg = quiet().with_sharing(Sharing::Exclusive);
    Store::open(dir.path(), worker("w"), cfg).expect("the tail's store was closed");
}
