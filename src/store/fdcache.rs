//! The open-file cache: a sharded LRU (the `lru` crate) of open block files.
//!
//! Entries are `Arc`s: evicting an entry drops the cache's reference, and the descriptor is
//! closed when the last reader using it drops its own. The capacity adapts down when the
//! process meets its open-file limit (EMFILE/ENFILE), and grows back by steps while the limit
//! is not met again (descriptors the rest of the process held may have been closed since).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::engine::IoEngine;
use crate::format::Header;
use crate::key::BlockHash;

/// An open, validated block file.
#[derive(Debug)]
pub(crate) struct OpenBlock {
    /// The engine that reads it, told when the descriptor closes.
    pub engine: Arc<dyn IoEngine>,
    /// The descriptor (read-only).
    pub fd: OwnedFd,
    /// Its header, read and checked when it was opened.
    pub header: Header,
    /// True once the payload checksum was verified through this descriptor.
    pub verified: AtomicBool,
}

impl Drop for OpenBlock {
    /// The last reference is gone: the engine drops its state for the descriptor (e.g. a NIXL
    /// registration) before it closes.
    fn drop(&mut self) {
        self.engine.forget_file(self.fd.as_fd());
    }
}

type Shard = Mutex<LruCache<BlockHash, Arc<OpenBlock>>>;

/// How long a shrunk cache keeps its capacity before growing a step.
const REGROW_AFTER: Duration = Duration::from_secs(10);

/// Counters the cache keeps itself.
#[derive(Debug, Default)]
pub(crate) struct FdCacheCounters {
    pub evictions: AtomicUsize,
    pub shrinks: AtomicUsize,
}

/// A bounded, sharded LRU of open block files. The bound is global (an atomic count); when
/// it is exceeded, the least recently used entry of the inserting shard goes, which keeps the
/// capacity exact and the order close to a global LRU without a global lock.
#[derive(Debug)]
pub(crate) struct FdCache {
    shards: Box<[Shard]>,
    /// Entries allowed in all now (0: nothing is kept).
    cap: AtomicUsize,
    /// The configured capacity, which a shrunk cache grows back to.
    max_cap: usize,
    /// When the capacity last changed after an EMFILE (a shrink or a step back up).
    last_change: Mutex<Option<Instant>>,
    /// How long the capacity stays put after a change before it grows a step.
    regrow_after: Duration,
    /// Entries held in all.
    len: AtomicUsize,
    pub counters: FdCacheCounters,
}

impl FdCache {
    /// A cache of `capacity` descriptors (0 disables it).
    pub fn new(capacity: usize) -> Self {
        Self::with_regrow(capacity, REGROW_AFTER)
    }

    /// As `new`, growing back `regrow_after` after each shrink or step.
    fn with_regrow(capacity: usize, regrow_after: Duration) -> Self {
        // One shard per 256 entries, at most 16, so small caches stay exact LRUs.
        let n = (capacity / 256).clamp(1, 16).next_power_of_two().min(16);
        let shards = (0..n).map(|_| Mutex::new(LruCache::unbounded())).collect();
        FdCache {
            shards,
            cap: AtomicUsize::new(capacity),
            max_cap: capacity,
            last_change: Mutex::new(None),
            regrow_after,
            len: AtomicUsize::new(0),
            counters: FdCacheCounters::default(),
        }
    }

    fn shard(&self, hash: &BlockHash) -> &Shard {
        &self.shards[hash.0[31] as usize % self.shards.len()]
    }

    /// Current capacity (entries).
    pub fn capacity(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// True when caching is disabled.
    pub fn is_disabled(&self) -> bool {
        self.max_cap == 0
    }

    /// The capacity, after growing it a step (an eighth of the configured capacity) if it was
    /// shrunk and has not changed for `regrow_after`.
    fn regrown_capacity(&self) -> usize {
        let cap = self.capacity();
        if cap >= self.max_cap {
            return cap;
        }
        let mut last = self.last_change.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < self.regrow_after) {
            return self.capacity();
        }
        let grown = (self.capacity() + self.max_cap / 8 + 1).min(self.max_cap);
        self.cap.store(grown, Ordering::Relaxed);
        *last = Some(Instant::now());
        tracing::debug!(capacity = grown, "open-file cache growing back");
        grown
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// The entry for `hash`, marked most recently used.
    pub fn get(&self, hash: &BlockHash) -> Option<Arc<OpenBlock>> {
        if self.is_disabled() {
            return None;
        }
        lock(self.shard(hash)).get(hash).cloned()
    }

    /// Inserts (or replaces) the entry for `hash`, evicting the least recently used entries
    /// over capacity. Evicted descriptors close outside the lock, once no reader holds them.
    pub fn insert(&self, hash: BlockHash, block: Arc<OpenBlock>) {
        let cap = self.regrown_capacity();
        if cap == 0 {
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut s = lock(self.shard(&hash));
            match s.put(hash, block) {
                Some(old) => evicted.push(old),
                None => {
                    self.len.fetch_add(1, Ordering::Relaxed);
                }
            }
            while self.len() > cap {
                match s.pop_lru() {
                    Some((_, b)) => {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                        evicted.push(b);
                        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                    }
                    None => break,
                }
            }
        }
        drop(evicted);
    }

    /// Drops the entry for `hash` (the key was removed or replaced).
    pub fn invalidate(&self, hash: &BlockHash) {
        let old = lock(self.shard(hash)).pop(hash);
        if old.is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        drop(old);
    }

    /// Drops the entry for `hash` only if it is `block` (a newer entry stays).
    pub fn invalidate_if(&self, hash: &BlockHash, block: &Arc<OpenBlock>) {
        let mut s = lock(self.shard(hash));
        if s.peek(hash).is_some_and(|b| Arc::ptr_eq(b, block)) {
            let old = s.pop(hash);
            self.len.fetch_sub(1, Ordering::Relaxed);
            drop(s);
            drop(old);
        }
    }

    /// Reacts to EMFILE/ENFILE: lowers the capacity to three quarters of what is held now and
    /// evicts down to it. Returns how many entries were evicted (0: nothing left to give back).
    pub fn shrink(&self) -> usize {
        let held = self.len();
        let new_cap = held * 3 / 4;
        self.cap.store(new_cap, Ordering::Relaxed);
        *self.last_change.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.counters.shrinks.fetch_add(1, Ordering::Relaxed);
        let mut evicted = Vec::new();
        'outer: while self.len() > new_cap {
            let mut progressed = false;
            for shard in &self.shards {
                if self.len() <= new_cap {
                    break 'outer;
                }
                if let Some((_, b)) = lock(shard).pop_lru() {
                    self.len.fetch_sub(1, Ordering::Relaxed);
                    evicted.push(b);
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        let n = evicted.len();
        self.counters.evictions.fetch_add(n, Ordering::Relaxed);
        drop(evicted);
        tracing::warn!(
            held,
            new_capacity = new_cap,
            "open-file limit reached: shrinking the open-file cache"
        );
        n
    }
}

fn lock(s: &Shard) -> std::sync::MutexGuard<'_, LruCache<BlockHash, Arc<OpenBlock>>> {
    // A panic while holding the lock leaves the LRU consistent (no invariant spans the
    // critical sections), so a poisoned lock is still usable.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> Arc<OpenBlock> {
        let f = tempfile::tempfile().unwrap();
        Arc::new(OpenBlock {
            engine: Arc::new(crate::engine::PsyncEngine::new()),
            fd: f.into(),
            header: Header::for_payload(BlockHash([0; 32]), b"", None),
            verified: AtomicBool::new(false),
        })
    }

    fn h(i: u8) -> BlockHash {
        let mut b = [0u8; 32];
        b[0] = i;
        b[31] = i;
        BlockHash(b)
    }

    #[test]
    fn lru_order_and_capacity() {
        let c = FdCache::new(3);
        assert_eq!(c.capacity(), 3);
        for i in 0..3 {
            c.insert(h(i), block());
        }
        assert!(c.get(&h(0)).is_some()); // 0 becomes most recent
        c.insert(h(3), block()); // evicts 1
        assert!(c.get(&h(1)).is_none());
        assert!(c.get(&h(0)).is_some());
        assert_eq!(c.len(), 3);
        assert_eq!(c.counters.evictions.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn evicted_entry_stays_open_while_used() {
        let c = FdCache::new(1);
        c.insert(h(1), block());
        let held = c.get(&h(1)).unwrap();
        c.insert(h(2), block());
        assert!(c.get(&h(1)).is_none());
        // The reader's reference keeps the descriptor valid.
        rustix::fs::fstat(&held.fd).unwrap();
        assert_eq!(Arc::strong_count(&held), 1);
    }

    #[test]
    fn disabled_and_shrink() {
        let c = FdCache::new(0);
        c.insert(h(1), block());
        assert!(c.get(&h(1)).is_none());
        assert_eq!(c.len(), 0, "a disabled cache holds nothing");
        let c = FdCache::new(1000);
        for i in 0..200u8 {
            c.insert(h(i), block());
        }
        assert_eq!(c.len(), 200);
        // Shrinks to three quarters of what it holds, evicting the least recently used.
        assert_eq!(c.shrink(), 50);
        assert_eq!((c.len(), c.capacity()), (150, 150));
        assert!(c.get(&h(0)).is_none(), "the oldest entry was evicted");
        assert!(c.get(&h(199)).is_some(), "the newest entry stays cached");
        c.invalidate(&h(199));
        assert!(c.get(&h(199)).is_none(), "invalidate drops it");
        assert_eq!(c.len(), 149);
    }

    #[test]
    fn a_shrunk_cache_grows_back_by_steps() {
        // Right away (no wait between steps), for the test.
        let c = FdCache::with_regrow(800, Duration::ZERO);
        for i in 0..200u8 {
            c.insert(h(i), block());
        }
        c.shrink();
        assert_eq!(c.capacity(), 150);
        // Each insert after the wait grows the capacity by an eighth of 800, up to 800.
        c.insert(h(200), block());
        assert_eq!(c.capacity(), 251);
        for i in 0..20u8 {
            c.insert(h(i), block());
        }
        assert_eq!(c.capacity(), 800);
        // With the usual wait, a shrink holds.
        let c = FdCache::new(800);
        for i in 0..100u8 {
            c.insert(h(i), block());
        }
        c.shrink();
        c.insert(h(100), block());
        assert_eq!(c.capacity(), 75);
        assert!(c.len() <= 75);
    }
}
