//! The write-behind offloader (src/offload): bounded queue (drop-on-full, blocking), dedupe,
//! gets from the queue, flush, shutdown that writes or drops (counted), a SIGKILL while blocks
//! are queued, per-block outcomes, counters that add up.
//!
//! The writer is held still by a gated engine (its writes wait until the test opens the gate),
//! so what is queued at each step is known without any timing.

mod common;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use common::*;
use tierkv::engine::{EngineKind, IoEngine, IoRequest};
use tierkv::testing::{FaultPlan, FaultyEngine};
use tierkv::{BlockHash, BlockKey, Lookup, Store, StoreConfig};
use tierkv::{
    DropReason, FilterKind, OfferOutcome, OffloadConfig, OffloadStats, Offloader, OnClose, Payload,
    PayloadParts, WhenFull,
};

/// Writes wait at a gate until the test opens it; reads pass.
#[derive(Debug)]
struct GatedEngine {
    inner: Arc<dyn IoEngine>,
    open: Mutex<bool>,
    cv: Condvar,
    /// Write batches that reached the gate.
    entered: AtomicU64,
}

impl GatedEngine {
    fn new() -> Arc<GatedEngine> {
        Arc::new(GatedEngine {
            inner: EngineKind::Psync.build().unwrap(),
            open: Mutex::new(false),
            cv: Condvar::new(),
            entered: AtomicU64::new(0),
        })
    }

    fn open_gate(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }

    /// Waits until `n` write batches have reached the gate.
    fn wait_entered(&self, n: u64) {
        let mut open = self.open.lock().unwrap();
        while self.entered.load(Ordering::SeqCst) < n {
            open = self.cv.wait(open).unwrap();
        }
    }
}

impl IoEngine for GatedEngine {
    fn name(&self) -> &'static str {
        "gated"
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        if batch.iter().any(IoRequest::is_write) {
            let mut open = self.open.lock().unwrap();
            self.entered.fetch_add(1, Ordering::SeqCst);
            self.cv.notify_all();
            // A test that fails while the gate is shut must not hang in the offloader's
            // close: past 60 s the gate opens by itself (no test waits that long for it).
            let since = std::time::Instant::now();
            while !*open && since.elapsed() < std::time::Duration::from_secs(60) {
                open = self
                    .cv
                    .wait_timeout(open, std::time::Duration::from_secs(1))
                    .unwrap()
                    .0;
            }
        }
        self.inner.submit(batch)
    }
}

const LEN: usize = 8192;

/// The bytes of block `h`: a function of its hash, so any hit can be checked.
fn bytes_of(h: &BlockHash, len: usize) -> Vec<u8> {
    (0..len).map(|j| h.0[j % 32] ^ (j / 32) as u8).collect()
}

fn blocks(keys: &[BlockKey]) -> Vec<(BlockKey, Vec<u8>)> {
    keys.iter()
        .map(|k| (k.clone(), bytes_of(&k.hash, LEN)))
        .collect()
}

fn gated_store(root: &std::path::Path) -> (Store, Arc<GatedEngine>) {
    let gate = GatedEngine::new();
    let store = Store::open_with_engine(root, worker("0"), quiet(), gate.clone()).unwrap();
    (store, gate)
}

/// Every offered block is in exactly one counter, or still in flight.
fn assert_add_up(s: &OffloadStats) {
    let ended =
        s.written + s.not_admitted + s.failed + s.deduped_present + s.deduped_queued + s.dropped();
    assert_eq!(s.offered, ended + s.in_flight_blocks, "{s:#?}");
    // Closed drops are of queued blocks (no offer can follow a close: it takes the
    // offloader).
    assert_eq!(
        s.queued,
        s.written + s.not_admitted + s.failed + s.dropped_closed + s.in_flight_blocks,
        "{s:#?}"
    );
}

fn reasons(outcomes: &[OfferOutcome]) -> Vec<Option<DropReason>> {
    outcomes.iter().map(OfferOutcome::drop_reason).collect()
}

#[test]
fn a_full_queue_drops_the_newest_offer_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let cfg = OffloadConfig::new()
        .with_max_blocks(4)
        .with_max_bytes(100 * LEN as u64);
    let off = Offloader::new(store.clone(), cfg).unwrap();
    let a = chain_keys(&store, 1, 4);
    let b = chain_keys(&store, 2, 3);
    let got = off.offer(None, blocks(&a));
    assert_eq!((got.queued, got.dropped), (4, 0));
    // The queue holds 4 blocks (being written or not): the newest offer is dropped.
    let done = off.offer_tracked(None, blocks(&b));
    assert!(done.is_done(), "drops are known at once");
    let outcomes = done.wait();
    assert_eq!(reasons(&outcomes), vec![Some(DropReason::Full); 3]);
    assert_eq!(off.stats().dropped_full, 3);
    assert_add_up(&off.stats());
    gate.open_gate();
    off.flush();
    assert_eq!(store.contains_prefix(&a).unwrap(), 4);
    assert_eq!(store.contains_prefix(&b).unwrap(), 0);
    let s = off.stats();
    assert_eq!((s.written, s.dropped_full, s.in_flight_blocks), (4, 3, 0));
    assert_add_up(&s);

    // The byte bound: room for 2.5 blocks keeps a chain's first 2, drops its tail.
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let cfg = OffloadConfig::new().with_max_bytes(5 * LEN as u64 / 2);
    let off = Offloader::new(store.clone(), cfg).unwrap();
    let c = chain_keys(&store, 3, 4);
    let outcomes = off.offer_tracked(None, blocks(&c));
    gate.open_gate();
    let outcomes = outcomes.wait();
    assert!(outcomes[0].is_written() && outcomes[1].is_written());
    assert_eq!(reasons(&outcomes[2..]), vec![Some(DropReason::Full); 2]);
    off.flush();
    assert_eq!(store.contains_prefix(&c).unwrap(), 2);
    assert!(prefix_closed(&store, &[c]));
    assert_add_up(&off.stats());
}

#[test]
fn blocking_mode_waits_for_room_instead_of_dropping() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let cfg = OffloadConfig::new()
        .with_max_blocks(2)
        .with_when_full(WhenFull::Block);
    let off = Arc::new(Offloader::new(store.clone(), cfg).unwrap());
    let a = chain_keys(&store, 1, 7);
    let engine_thread = {
        let (off, a) = (off.clone(), a.clone());
        std::thread::spawn(move || off.offer(None, blocks(&a)))
    };
    // The writer holds the first two blocks at the gate; the offer waits for room.
    gate.wait_entered(1);
    gate.open_gate();
    let got = engine_thread.join().unwrap();
    assert_eq!((got.queued, got.dropped), (7, 0));
    off.flush();
    assert_eq!(store.contains_prefix(&a).unwrap(), 7);
    let s = off.stats();
    assert_eq!((s.written, s.dropped_full), (7, 0));
    assert!(s.batches >= 4, "at most 2 blocks in flight: {s:#?}");
    assert_add_up(&s);
}

#[test]
fn stored_and_queued_blocks_are_not_written_twice_and_queued_ones_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let a = chain_keys(&store, 1, 6);
    assert_eq!(off.offer(None, blocks(&a[..4])).queued, 4);
    // Offered again while queued: deduplicated, the tail queued after the queued prefix.
    let again = off.offer_tracked(None, blocks(&a));
    // Served from the queue while the writer is held at the gate.
    assert_eq!(store.contains_prefix(&a).unwrap(), 0);
    assert_eq!(off.contains_prefix(&a).unwrap(), 6);
    assert!(off.is_queued(&a[5]));
    let mut bufs = vec![vec![0u8; LEN]; 6];
    for (i, r) in off.get_many(&a, &mut bufs).into_iter().enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit(LEN));
        assert_eq!(bufs[i], bytes_of(&a[i].hash, LEN));
    }
    assert_eq!(off.stats().served_from_queue, 6);
    gate.open_gate();
    let outcomes = again.wait();
    assert_eq!(
        reasons(&outcomes[..4]),
        vec![Some(DropReason::AlreadyQueued); 4]
    );
    assert!(outcomes[4..].iter().all(OfferOutcome::is_written));
    off.flush();
    // Stored now: offered again, nothing is written.
    let got = off.offer(None, blocks(&a));
    assert_eq!((got.queued, got.deduped), (0, 6));
    off.flush();
    assert_eq!(store.stats().puts, 6, "each block written once");
    let s = off.stats();
    assert_eq!(
        (s.written, s.deduped_queued, s.deduped_present),
        (6, 4, 6),
        "{s:#?}"
    );
    assert_add_up(&s);
    // Served from the store now, not the queue.
    for r in off.get_many(&a, &mut bufs) {
        assert_eq!(r.unwrap(), Lookup::Hit(LEN));
    }
    assert_eq!(off.stats().served_from_queue, 6);
}

/// A vectored payload's guard: a header and a body, written as one payload; on drop it
/// records whether the store held its block then (the notice an engine's buffer is free).
struct Guarded {
    header: Vec<u8>,
    body: Vec<u8>,
    store: Store,
    key: BlockKey,
    released: Arc<Mutex<Vec<(BlockKey, bool)>>>,
}

impl PayloadParts for Guarded {
    fn parts(&self) -> Vec<&[u8]> {
        vec![&self.header, &self.body]
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let held = self.store.contains_many(std::slice::from_ref(&self.key))[0]
            .as_ref()
            .copied()
            .unwrap_or(false);
        self.released.lock().unwrap().push((self.key.clone(), held));
    }
}

#[test]
fn a_vectored_payload_is_one_block_and_its_guard_drops_after_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let keys = chain_keys(&store, 1, 3);
    let released = Arc::new(Mutex::new(Vec::new()));
    let payloads: Vec<(BlockKey, Payload)> = keys
        .iter()
        .map(|k| {
            let whole = bytes_of(&k.hash, LEN);
            let guard = Guarded {
                header: whole[..100].to_vec(),
                body: whole[100..].to_vec(),
                store: store.clone(),
                key: k.clone(),
                released: released.clone(),
            };
            (k.clone(), Payload::vectored(guard))
        })
        .collect();
    assert_eq!(payloads[0].1.len(), LEN);
    assert_eq!(off.offer(None, payloads).queued, 3);
    // Queued (the writer at the gate): served whole from the queue, nothing released.
    let mut bufs = vec![vec![0u8; LEN]; 3];
    for (i, r) in off.get_many(&keys, &mut bufs).into_iter().enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit(LEN));
        assert_eq!(bufs[i], bytes_of(&keys[i].hash, LEN));
    }
    assert!(released.lock().unwrap().is_empty());
    gate.open_gate();
    off.flush();
    // Each guard dropped once, after its block was stored; the block is the parts in order.
    let mut got = released.lock().unwrap().clone();
    got.sort_by_key(|(k, _)| k.hash.0);
    let mut want: Vec<(BlockKey, bool)> = keys.iter().map(|k| (k.clone(), true)).collect();
    want.sort_by_key(|(k, _)| k.hash.0);
    assert_eq!(got, want);
    let mut bufs = vec![vec![0u8; LEN]; 3];
    for (i, r) in store.get_many(&keys, &mut bufs).into_iter().enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit(LEN));
        assert_eq!(bufs[i], bytes_of(&keys[i].hash, LEN));
    }
}

#[test]
fn flush_waits_for_everything_offered_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("0"), quiet()).unwrap();
    let cfg = OffloadConfig::new().with_max_batch_blocks(3);
    let off = Offloader::new(store.clone(), cfg).unwrap();
    let chains: Vec<Vec<BlockKey>> = (0..10).map(|s| chain_keys(&store, s, 8)).collect();
    for c in &chains {
        off.offer(None, blocks(c));
    }
    off.flush();
    for c in &chains {
        assert_eq!(store.contains_prefix(c).unwrap(), 8);
    }
    let s = off.stats();
    assert_eq!((s.written, s.in_flight_blocks, s.batches), (80, 0, 30));
    assert_eq!(s.written_bytes, 80 * LEN as u64);
    assert_eq!(s.queue_wait.count, 80);
    assert_eq!(s.offer_latency.count, 10);
    assert_add_up(&s);
    // A continuation after a cached prefix, in another offer.
    let long = chain_keys(&store, 0, 12);
    assert_eq!(long[..8], chains[0][..]);
    off.offer(Some(&long[7]), blocks(&long[8..]));
    off.flush();
    assert_eq!(store.contains_prefix(&long).unwrap(), 12);
    // The counters are part of the store's stats.
    assert_eq!(store.stats().offload.unwrap().written, 84);
}

#[test]
fn close_writes_what_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let chains: Vec<Vec<BlockKey>> = (0..3).map(|s| chain_keys(&store, s, 2)).collect();
    for c in &chains {
        off.offer(None, blocks(c));
    }
    gate.wait_entered(1);
    let closer = std::thread::spawn(move || off.close(OnClose::Write));
    gate.open_gate();
    let s = closer.join().unwrap();
    assert_eq!((s.written, s.dropped_closed, s.in_flight_blocks), (6, 0, 0));
    assert_add_up(&s);
    for c in &chains {
        assert_eq!(store.contains_prefix(c).unwrap(), 2);
    }
    // Dropping an offloader closes it as configured (write, by default).
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let d = chain_keys(&store, 9, 3);
    off.offer(None, blocks(&d));
    drop(off);
    assert_eq!(store.contains_prefix(&d).unwrap(), 3);
}

#[test]
fn close_can_drop_what_is_queued_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate) = gated_store(dir.path());
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let first = chain_keys(&store, 1, 2);
    let later: Vec<Vec<BlockKey>> = (2..4).map(|s| chain_keys(&store, s, 2)).collect();
    let first_done = off.offer_tracked(None, blocks(&first));
    // The writer holds the first batch at the gate; the others wait in the queue.
    gate.wait_entered(1);
    let later_done: Vec<_> = later
        .iter()
        .map(|c| off.offer_tracked(None, blocks(c)))
        .collect();
    let closer = std::thread::spawn(move || off.close(OnClose::Drop));
    // Drops are known (counted, outcomes set) before the batch at the gate finishes (a
    // guard against a hang, not a timing: a close that wrote them would never get there).
    for d in later_done {
        let out = d.wait_timeout(std::time::Duration::from_secs(60));
        let out = out.unwrap_or_else(|_| panic!("queued blocks not dropped at close"));
        assert_eq!(reasons(&out), vec![Some(DropReason::Closed); 2]);
    }
    gate.open_gate();
    let s = closer.join().unwrap();
    assert!(first_done.wait().iter().all(OfferOutcome::is_written));
    assert_eq!((s.written, s.dropped_closed, s.in_flight_blocks), (2, 4, 0));
    assert_add_up(&s);
    assert_eq!(store.contains_prefix(&first).unwrap(), 2);
    for c in &later {
        assert_eq!(store.contains_prefix(c).unwrap(), 0);
    }
}

#[test]
fn each_offer_can_ask_for_its_outcomes() {
    // Writes from the third on fail with EIO.
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan {
        fail_writes_from: Some(2),
        fail_reads_from: None,
        partial_fraction: 0.5,
        errno: 5,
    };
    let engine = Arc::new(FaultyEngine::new(EngineKind::Psync.build().unwrap(), plan));
    let store = Store::open_with_engine(dir.path(), worker("0"), quiet(), engine).unwrap();
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let a = chain_keys(&store, 1, 4);
    let out = off.offer_tracked(None, blocks(&a)).wait();
    assert!(out[0].is_written() && out[1].is_written(), "{out:?}");
    for o in &out[2..] {
        assert!(
            matches!(o, OfferOutcome::Failed(tierkv::Error::Io { .. })),
            "{out:?}"
        );
    }
    // Another worker's key, and a continuation of a chain that is not stored.
    let other = BlockKey::new(worker("1"), a[0].hash);
    let out = off
        .offer_tracked(None, vec![(other, vec![1u8; LEN])])
        .wait();
    assert_eq!(reasons(&out), vec![Some(DropReason::InvalidKey)]);
    let b = chain_keys(&store, 2, 3);
    let out = off.offer_tracked(Some(&b[0]), blocks(&b[1..])).wait();
    assert_eq!(reasons(&out), vec![Some(DropReason::NoParent); 2]);
    off.flush();
    let s = off.stats();
    assert_eq!(
        (s.written, s.failed, s.dropped_invalid, s.dropped_no_parent),
        (2, 2, 1, 2)
    );
    assert_add_up(&s);
    assert_eq!(check_all_blocks(store.dir()), 2, "nothing partial");

    // The store declines a block larger than its capacity: not admitted.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        worker("0"),
        quiet().with_capacity_bytes(16 << 10),
    )
    .unwrap();
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let c = chain_keys(&store, 3, 1);
    let out = off
        .offer_tracked(None, vec![(c[0].clone(), vec![0u8; 64 << 10])])
        .wait();
    assert_eq!(reasons(&out), vec![Some(DropReason::NotAdmitted)]);
    assert_add_up(&off.stats());

    // A block the store refuses mid-chain: the block after it was written, then removed
    // (no lookup could reach it), so it is not admitted, never "written".
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("0"), quiet().with_max_block_size(LEN)).unwrap();
    let off = Offloader::new(store.clone(), OffloadConfig::new()).unwrap();
    let e = chain_keys(&store, 5, 3);
    let sizes = [LEN, 2 * LEN, LEN];
    let items = e.iter().zip(sizes).map(|(k, n)| (k.clone(), vec![5u8; n]));
    let out = off.offer_tracked(None, items.collect()).wait();
    assert!(out[0].is_written(), "{out:?}");
    assert!(
        matches!(out[1], OfferOutcome::Failed(tierkv::Error::TooLarge { .. })),
        "{out:?}"
    );
    assert_eq!(reasons(&out[2..]), vec![Some(DropReason::NotAdmitted)]);
    assert_eq!(store.contains_many(&e[2..])[0].as_ref().ok(), Some(&false));
    assert_add_up(&off.stats());

    // The doorkeeper: written on the second offer only.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), worker("0"), quiet()).unwrap();
    let cfg = OffloadConfig::new().with_filter(FilterKind::SecondOffer(100));
    let off = Offloader::new(store.clone(), cfg).unwrap();
    let d = chain_keys(&store, 4, 3);
    let out = off.offer_tracked(None, blocks(&d)).wait();
    assert_eq!(reasons(&out), vec![Some(DropReason::Filtered); 3]);
    let out = off.offer_tracked(None, blocks(&d)).wait();
    assert!(out.iter().all(OfferOutcome::is_written), "{out:?}");
    let s = off.stats();
    assert_eq!(
        (s.filter.as_str(), s.dropped_filtered, s.written),
        ("second-offer", 3, 3)
    );
    assert_add_up(&s);
}

/// The child of `sigkill_while_blocks_are_queued_loses_only_them`: offers chain after chain
/// through a small blocking queue until killed. Does nothing in a normal test run.
#[test]
fn crash_child() {
    let Ok(root) = std::env::var("TIERKV_OFFLOAD_CRASH_CHILD") else {
        return;
    };
    let config = StoreConfig::new().with_stats_interval(Some(std::time::Duration::from_millis(10)));
    let store = Store::open(&root, worker("0"), config).unwrap();
    let cfg = OffloadConfig::new()
        .with_max_blocks(8)
        .with_max_batch_blocks(4)
        .with_when_full(WhenFull::Block);
    let off = Offloader::new(store.clone(), cfg).unwrap();
    for round in 0u32.. {
        let c = chain_keys(&store, round, CRASH_CHAIN);
        let c: Vec<(BlockKey, Vec<u8>)> = c
            .iter()
            .map(|k| (k.clone(), bytes_of(&k.hash, CRASH_LEN)))
            .collect();
        off.offer(None, c);
    }
}

const CRASH_CHAIN: usize = 6;
const CRASH_LEN: usize = 64 << 10;

/// The offloader's counters in the last `STATS.json`, if process `pid` wrote it.
fn live_offload(root: &std::path::Path, pid: u32) -> Option<OffloadStats> {
    let text = std::fs::read(root.join("v1/0/STATS.json")).ok()?;
    let doc: serde_json::Value = serde_json::from_slice(&text).ok()?;
    if doc["pid"].as_u64() != Some(pid as u64) {
        return None;
    }
    serde_json::from_value(doc["stats"]["offload"].clone()).ok()
}

#[test]
fn sigkill_while_blocks_are_queued_loses_only_them() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("TIERKV_OFFLOAD_CRASH_CHILD", dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let pid = child.0.id();
        // Kill it once it has written some blocks and has more queued.
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                panic!("round {round}: the child exited ({status})");
            }
            match live_offload(dir.path(), pid) {
                Some(s) if s.written >= 12 && s.in_flight_blocks > 0 && s.offered > 0 => break,
                _ => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        child.0.kill().unwrap(); // SIGKILL
        child.0.wait().unwrap();
        let last = live_offload(dir.path(), pid).unwrap();

        // Before any store sweeps: every block file is whole.
        let wdir = dir.path().join("v1/0");
        let files = check_all_blocks(&wdir);
        // Reopen: what the last published counters say was written is there, and verifies.
        let store = Store::open(dir.path(), worker("0"), quiet()).unwrap();
        let s = store.stats();
        assert_eq!(s.blocks_at_open as usize, files);
        assert!(
            s.blocks_at_open >= last.written,
            "round {round}: {} blocks at open, {} written before the kill",
            s.blocks_at_open,
            last.written
        );
        assert!(temp_files_under(store.dir()).is_empty());
        // Every chain the child could have offered: present blocks are a prefix, each hits
        // and holds its own bytes.
        let mut hits = 0;
        let mut chains = Vec::new();
        let mut buf = vec![0u8; CRASH_LEN];
        for seed in 0..(last.offered as u32 / CRASH_CHAIN as u32 + 64) {
            let c = chain_keys(&store, seed, CRASH_CHAIN);
            for k in &c {
                if let Lookup::Hit(n) = store.get(k, &mut buf).unwrap() {
                    assert_eq!(n, CRASH_LEN);
                    assert!(buf == bytes_of(&k.hash, CRASH_LEN), "round {round}: {k}");
                    hits += 1;
                }
            }
            chains.push(c);
        }
        assert!(prefix_closed(&store, &chains), "round {round}");
        assert_eq!(
            hits, files,
            "round {round}: every block file is a block offered"
        );
        assert_eq!(store.stats().corrupt, 0);
        eprintln!(
            "round {round}: killed with {} blocks in flight; {files} blocks on disk, {} written per the last counters",
            last.in_flight_blocks, last.written
        );
        // The next child starts over the same tree: it offers the same chains again.
        drop(store);
    }
}
