//! The engine-facing asynchronous API (src/transfer): loads and saves of whole batches between
//! an engine's KV memory, described once, and a store; one outcome per block; the submitting
//! thread never does disk I/O and never waits on a stalled disk; a save's completion comes
//! after its blocks are stored.

mod common;

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use common::*;
use tierkv::engine::{IoEngine, IoRequest, PsyncEngine};
use tierkv::{KvMemory, LoadOutcome, Lookup, Region, SaveOutcome, Store, Transfer, Transfers};

/// A paged KV memory shaped as an engine's: per block a K region of 96 bytes and a V region
/// of 64 bytes, each layer of the two in its own span, `blocks` blocks.
struct Pool {
    bytes: Vec<u8>,
    blocks: usize,
}

const K: usize = 96;
const V: usize = 64;

/// The regions of a pool of `blocks` blocks: all K regions, then all V regions.
fn pool_regions(blocks: usize) -> Vec<Region> {
    vec![
        Region {
            offset: 0,
            len: K,
            stride: K,
        },
        Region {
            offset: blocks * K,
            len: V,
            stride: V,
        },
    ]
}

impl Pool {
    fn new(blocks: usize) -> Pool {
        Pool {
            bytes: vec![0u8; blocks * (K + V)],
            blocks,
        }
    }

    fn regions(&self) -> Vec<Region> {
        pool_regions(self.blocks)
    }

    /// Block `b`'s payload as the store holds it: K then V.
    fn block(&self, b: usize) -> Vec<u8> {
        let mut out = self.bytes[b * K..(b + 1) * K].to_vec();
        let v = self.blocks * K + b * V;
        out.extend_from_slice(&self.bytes[v..v + V]);
        out
    }

    fn fill(&mut self, b: usize, seed: u8) {
        for i in 0..K {
            self.bytes[b * K + i] = seed.wrapping_add(i as u8);
        }
        let v = self.blocks * K + b * V;
        for i in 0..V {
            self.bytes[v + i] = seed.wrapping_mul(3).wrapping_add(i as u8);
        }
    }

    /// Transfers between this pool and `store` (the pool outlives them in every test).
    fn transfers(&mut self, store: Store, threads: usize) -> Transfers {
        let regions = self.regions();
        // SAFETY: the pool's buffer is neither moved nor freed while the transfers live (each
        // test drops them first), and the test touches no block of a batch in flight.
        let mem = unsafe {
            KvMemory::new(
                self.bytes.as_mut_ptr(),
                self.bytes.len(),
                regions,
                self.blocks,
            )
        }
        .unwrap();
        Transfers::new(store, mem, threads).unwrap()
    }
}

thread_local! {
    /// Completions collected while waiting for another batch (each test runs on its thread).
    static STASH: std::cell::RefCell<Vec<Transfer>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Waits for the completion of batch `id` (keeping the others that come first).
fn wait_for(t: &Transfers, id: u64) -> Transfer {
    for _ in 0..1000 {
        let kept = STASH.with(|s| {
            let mut s = s.borrow_mut();
            let i = s.iter().position(|d| d.id() == id)?;
            Some(s.remove(i))
        });
        if let Some(done) = kept {
            return done;
        }
        let got = t.wait(Some(Duration::from_secs(10)));
        STASH.with(|s| s.borrow_mut().extend(got));
    }
    panic!("batch {id} never completed");
}

fn saved(done: Transfer) -> Vec<SaveOutcome> {
    match done {
        Transfer::Save { outcomes, .. } => outcomes,
        other => panic!("not a save: {other:?}"),
    }
}

fn loaded(done: Transfer) -> Vec<LoadOutcome> {
    match done {
        Transfer::Load { outcomes, .. } => outcomes,
        other => panic!("not a load: {other:?}"),
    }
}

fn names_s(o: &[SaveOutcome]) -> Vec<&'static str> {
    o.iter().map(SaveOutcome::name).collect()
}

fn names_l(o: &[LoadOutcome]) -> Vec<&'static str> {
    o.iter().map(LoadOutcome::name).collect()
}

#[test]
fn saves_and_loads_move_whole_blocks_with_one_outcome_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), quiet()).unwrap();
    let ks = chain_keys(&store, 1, 4);
    let mut pool = Pool::new(8);
    for b in 0..3 {
        pool.fill(b, 10 * b as u8 + 1);
    }
    let want: Vec<Vec<u8>> = (0..3).map(|b| pool.block(b)).collect();
    let t = pool.transfers(store.clone(), 2);
    assert_eq!(t.memory().regions(), pool_regions(8).as_slice());
    assert_eq!((t.memory().blocks(), t.memory().block_bytes()), (8, K + V));
    let shown = format!("{t:?}");
    assert!(
        shown.contains("threads: 2")
            && shown.contains("blocks: 8")
            && shown.contains("block_bytes: 160"),
        "{shown}"
    );
    let id = t.submit_save(None, ks[..3].to_vec(), vec![0, 1, 2]);
    let o = saved(wait_for(&t, id));
    assert!(o.iter().all(SaveOutcome::is_stored));
    assert_eq!(names_s(&o), ["written"; 3]);
    // The completion comes after the blocks are stored: another reader sees them whole.
    for (k, w) in ks.iter().zip(&want) {
        let mut buf = vec![0u8; K + V];
        assert_eq!(store.get(k, &mut buf).unwrap(), Lookup::Hit(K + V));
        assert_eq!(&buf, w);
    }
    // Saved again: present, not rewritten.
    let id = t.submit_save(None, ks[..3].to_vec(), vec![0, 1, 2]);
    assert_eq!(names_s(&saved(wait_for(&t, id))), ["present"; 3]);
    assert_eq!(store.stats().puts, 3);
    // Loaded into other blocks (K and V regions each filled), the fourth key never stored.
    let id = t.submit_load(ks.clone(), vec![4, 5, 6, 7]);
    let o = loaded(wait_for(&t, id));
    assert_eq!(
        o.iter().map(LoadOutcome::is_loaded).collect::<Vec<_>>(),
        [true, true, true, false]
    );
    assert_eq!(names_l(&o), ["loaded", "loaded", "loaded", "missing"]);
    // A block stored with another length (another layout's) is not loaded as this one's.
    let odd = chain_keys(&store, 9, 1).remove(0);
    store.put(&odd, &[7u8; 10]).unwrap();
    let id = t.submit_load(vec![odd], vec![3]);
    match loaded(wait_for(&t, id)).as_slice() {
        [LoadOutcome::WrongLength { len: 10 }] => {}
        other => panic!("{other:?}"),
    }
    // Closing runs what was submitted and hands back what was not collected.
    let id = t.submit_save(None, ks[..1].to_vec(), vec![0]);
    let left = t.close();
    assert_eq!(left.iter().map(Transfer::id).collect::<Vec<_>>(), [id]);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&pool.block(4 + i), w, "block {}", 4 + i);
    }
    assert_eq!(
        pool.block(7),
        vec![0u8; K + V],
        "a missing block's memory is untouched"
    );
}

#[test]
fn a_save_hung_from_a_block_no_longer_stored_is_not_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), quiet()).unwrap();
    let ks = chain_keys(&store, 2, 3);
    let mut pool = Pool::new(4);
    pool.fill(1, 5);
    pool.fill(2, 6);
    let t = pool.transfers(store.clone(), 1);
    let id = t.submit_save(Some(ks[0].clone()), ks[1..].to_vec(), vec![1, 2]);
    let o = saved(wait_for(&t, id));
    assert!(!o.iter().any(SaveOutcome::is_stored));
    assert_eq!(names_s(&o), ["not_admitted"; 2]);
    assert_eq!(store.contains_prefix(&ks[1..]).unwrap(), 0);
}

#[test]
fn a_batch_that_names_a_block_twice_or_outside_the_memory_fails_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("w"), quiet()).unwrap();
    let ks = chain_keys(&store, 3, 3);
    let mut pool = Pool::new(4);
    let t = pool.transfers(store.clone(), 1);
    let twice = t.submit_save(None, ks[..2].to_vec(), vec![1, 1]);
    let outside = t.submit_load(ks[..2].to_vec(), vec![0, 4]);
    let uneven = t.submit_save(None, ks[..3].to_vec(), vec![0, 1]);
    for (id, what) in [(twice, "twice"), (uneven, "uneven")] {
        let o = saved(wait_for(&t, id));
        assert_eq!(o.len(), if what == "twice" { 2 } else { 3 });
        assert!(
            o.iter().all(|o| matches!(o, SaveOutcome::Failed(_))),
            "{what}: {o:?}"
        );
    }
    let o = loaded(wait_for(&t, outside));
    assert!(
        o.iter()
            .all(|o| matches!(o, LoadOutcome::Failed(e) if e.to_string().contains("outside"))),
        "{o:?}"
    );
    // The refusal is said once, not wrapped in its own prefix again.
    let LoadOutcome::Failed(e) = &o[0] else {
        unreachable!()
    };
    assert_eq!(
        e.to_string().matches("invalid configuration").count(),
        1,
        "{e}"
    );
    assert_eq!(store.stats().puts, 0);
}

#[test]
fn a_memory_whose_blocks_would_overlap_or_pass_its_end_is_refused() {
    let mut bytes = vec![0u8; 1000];
    let p = bytes.as_mut_ptr();
    let r = |offset, len, stride| Region {
        offset,
        len,
        stride,
    };
    let cases = [
        (vec![], 4, "no region"),
        (vec![r(0, 0, 10)], 4, "empty"),
        (vec![r(0, 100, 50)], 4, "shorter"),
        (vec![r(0, 100, 100)], 11, "passes the end"),
        (vec![r(0, 100, 100), r(350, 10, 10)], 4, "overlap"),
    ];
    for (regions, blocks, why) in cases {
        // SAFETY: `bytes` outlives the value (dropped at once or refused).
        let e = unsafe { KvMemory::new(p, bytes.len(), regions, blocks) }.unwrap_err();
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
    // SAFETY: as above.
    let ok =
        unsafe { KvMemory::new(p, bytes.len(), vec![r(0, 100, 100), r(400, 10, 10)], 4) }.unwrap();
    assert_eq!((ok.blocks(), ok.block_bytes()), (4, 110));
}

/// An engine that holds every batch until the gate opens, and records the threads that
/// submitted batches: a stalled disk (a hung NFS server, a full queue).
#[derive(Debug, Default)]
struct Stalled {
    open: Mutex<bool>,
    opened: Condvar,
    threads: Mutex<Vec<ThreadId>>,
}

impl Stalled {
    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl IoEngine for Stalled {
    fn name(&self) -> &'static str {
        "stalled"
    }
    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        drop(open);
        PsyncEngine::new().submit(batch)
    }
}

#[test]
fn a_stalled_disk_never_blocks_a_submission() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Stalled::default());
    let store = Store::open_with_engine(dir.path(), worker("w"), quiet(), engine.clone()).unwrap();
    let ks = chain_keys(&store, 4, 6);
    let mut pool = Pool::new(8);
    for b in 0..6 {
        pool.fill(b, b as u8 + 1);
    }
    let want: Vec<Vec<u8>> = (0..6).map(|b| pool.block(b)).collect();
    let t = Arc::new(pool.transfers(store.clone(), 1));
    // The first save takes the one transfer thread and hangs in the engine; the submissions
    // after it return (a submission that waited on the disk would hang here for good).
    let first = t.submit_save(None, ks[..3].to_vec(), vec![0, 1, 2]);
    let t2 = t.clone();
    let ks2 = ks.clone();
    let (second, load) = within(30, "submitting beside a stalled save", move || {
        let second = t2.submit_save(Some(ks2[2].clone()), ks2[3..].to_vec(), vec![3, 4, 5]);
        let load = t2.submit_load(ks2[..3].to_vec(), vec![6, 7, 5]);
        (second, load)
    });
    assert!(
        t.drain().is_empty(),
        "nothing completes while the disk is stalled"
    );
    assert_eq!(t.pending(), 3);
    engine.release();
    // Collected by polling: drain gives what finished, without waiting.
    let mut polled = Vec::new();
    for _ in 0..1000 {
        polled.extend(t.drain());
        if !polled.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(polled.first().map(Transfer::id), Some(first));
    STASH.with(|s| s.borrow_mut().extend(polled));
    assert_eq!(names_s(&saved(wait_for(&t, first))), ["written"; 3]);
    assert_eq!(names_s(&saved(wait_for(&t, second))), ["written"; 3]);
    assert_eq!(names_l(&loaded(wait_for(&t, load))), ["loaded"; 3]);
    // Every batch went to the disk from the transfer thread, none from a submitting thread.
    let me = std::thread::current().id();
    assert!(engine.threads.lock().unwrap().iter().all(|id| *id != me));
    drop(t);
    assert_eq!(pool.block(6), want[0]);
    assert_eq!(store.contains_prefix(&ks).unwrap(), 6);
}
