//! ARC, the adaptive replacement cache (Megiddo and Modha, FAST 2003), chain-ordered.

use lru::LruCache;

use super::{Access, Policy, pop_lru_unpinned};
use crate::key::BlockHash;

/// ARC: `t1` holds blocks seen once recently, `t2` blocks seen at least twice; `b1`/`b2`
/// remember what was evicted from each. A hit in `b1` means recency was undervalued and grows
/// `t1`'s target share `p`; a hit in `b2` shrinks it. One-time blocks thus age out through
/// `t1` without flushing the frequently reused blocks of `t2`, and the split adapts to the
/// workload instead of being a constant.
///
/// Chain order: a batch is touched deepest block first, so a chain's root, which every longer
/// prefix needs, is its most recently used block and the last of its chain to go.
#[derive(Debug)]
pub struct Arc {
    t1: LruCache<BlockHash, ()>,
    t2: LruCache<BlockHash, ()>,
    b1: LruCache<BlockHash, ()>,
    b2: LruCache<BlockHash, ()>,
    /// Target size of `t1`, in blocks.
    p: f64,
    cap_hint: usize,
    /// Ghost hits already accounted in `p` by `admit`, waiting for their insertion.
    pending: super::Set<BlockHash>,
}

impl Arc {
    /// An empty ARC.
    pub fn new() -> Self {
        Arc {
            t1: LruCache::unbounded(),
            t2: LruCache::unbounded(),
            b1: LruCache::unbounded(),
            b2: LruCache::unbounded(),
            p: 0.0,
            cap_hint: 0,
            pending: super::Set::default(),
        }
    }

    /// The capacity ARC reasons with: the known bound, or what is held now.
    fn c(&self) -> usize {
        self.cap_hint.max(self.t1.len() + self.t2.len()).max(1)
    }

    /// Adapts `p` to a ghost hit of `h` and forgets the ghost; true if it was one.
    fn ghost_hit(&mut self, h: &BlockHash) -> bool {
        let c = self.c() as f64;
        if self.b1.contains(h) {
            let delta = (self.b2.len() as f64 / self.b1.len() as f64).max(1.0);
            self.p = (self.p + delta).min(c);
            self.b1.pop(h);
            true
        } else if self.b2.contains(h) {
            let delta = (self.b1.len() as f64 / self.b2.len() as f64).max(1.0);
            self.p = (self.p - delta).max(0.0);
            self.b2.pop(h);
            true
        } else {
            false
        }
    }

    fn access(&mut self, h: BlockHash) {
        if self.t1.pop(&h).is_some() {
            self.t2.put(h, ());
        } else if self.t2.get(&h).is_some() {
            // promoted by get
        } else if self.pending.remove(&h) || self.ghost_hit(&h) {
            self.t2.put(h, ());
        } else {
            self.t1.put(h, ());
        }
    }

    fn trim_ghosts(&mut self) {
        let c = self.c();
        while self.t1.len() + self.b1.len() > c && self.b1.pop_lru().is_some() {}
        while self.t1.len() + self.t2.len() + self.b1.len() + self.b2.len() > 2 * c {
            if self.b2.pop_lru().is_none() && self.b1.pop_lru().is_none() {
                break;
            }
        }
    }
}

impl Arc {
    /// `h` was evicted by another order (the [`Adaptive`](super::Adaptive) policy following
    /// LRU): it leaves as ARC's own victims do, into the ghost list of where it was.
    pub(crate) fn evicted(&mut self, h: &BlockHash) {
        if self.t1.pop(h).is_some() {
            self.b1.put(*h, ());
        } else if self.t2.pop(h).is_some() {
            self.b2.put(*h, ());
        }
        self.pending.remove(h);
        self.trim_ghosts();
    }
}

impl Default for Arc {
    fn default() -> Self {
        Self::new()
    }
}

impl Policy for Arc {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn on_access(&mut self, batch: &[Access]) {
        for a in batch.iter().rev() {
            self.access(a.hash);
        }
        self.trim_ghosts();
    }

    /// ARC adapts its split when a block it evicted comes back, before it makes room for
    /// it: the store asks `admit` before choosing victims, so that is where ghost hits count.
    fn admit(&mut self, hash: &BlockHash) -> bool {
        if self.ghost_hit(hash) {
            self.pending.insert(*hash);
        }
        true
    }

    fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash> {
        let t1_first = !self.t1.is_empty() && (self.t1.len() as f64 > self.p || self.t2.is_empty());
        let (v, from_t1) = if t1_first {
            match pop_lru_unpinned(&mut self.t1, pinned) {
                Some(v) => (v, true),
                None => (pop_lru_unpinned(&mut self.t2, pinned)?, false),
            }
        } else {
            match pop_lru_unpinned(&mut self.t2, pinned) {
                Some(v) => (v, false),
                None => (pop_lru_unpinned(&mut self.t1, pinned)?, true),
            }
        };
        if from_t1 {
            self.b1.put(v, ());
        } else {
            self.b2.put(v, ());
        }
        self.trim_ghosts();
        Some(v)
    }

    fn on_remove(&mut self, hash: &BlockHash) {
        self.t1.pop(hash);
        self.t2.pop(hash);
        self.pending.remove(hash);
    }

    fn set_capacity_hint(&mut self, blocks: usize) {
        self.cap_hint = blocks;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{h, replay};
    use super::super::{Lru, Policy};
    use super::*;

    #[test]
    fn a_scan_does_not_flush_reused_blocks() {
        // A chain of 10 blocks reused every round; between two uses, 12 blocks seen once.
        // Together they overflow a capacity of 20.
        let mut reqs = Vec::new();
        let mut fresh = 1000;
        for _ in 0..50 {
            reqs.push((0..10).collect::<Vec<u64>>());
            reqs.push((fresh..fresh + 12).collect());
            fresh += 12;
        }
        let arc = replay(Box::new(Arc::new()), 20, &reqs);
        let lru = replay(Box::new(Lru::new()), 20, &reqs);
        let plain = super::super::tests::reference(20, false, &reqs);
        eprintln!("arc {arc} lru {lru} plain lru {plain}");
        assert_eq!(plain, 0.0, "plain LRU loses it to the blocks seen once");
        assert!(arc > 0.1, "ARC keeps part of the reused chain: {arc}");
        assert!(arc >= lru, "ARC {arc} < LRU {lru}");
    }

    #[test]
    fn ghosts_stay_bounded_and_pins_are_respected() {
        let mut p = Arc::new();
        p.set_capacity_hint(4);
        for i in 0..100 {
            p.on_access(&[Access {
                hash: h(i),
                inserted: true,
            }]);
            if p.t1.len() + p.t2.len() > 4 {
                let v = p.victim(&|x| *x == h(i)).unwrap();
                assert_ne!(v, h(i));
            }
            assert!(p.t1.len() + p.t2.len() + p.b1.len() + p.b2.len() <= 8);
        }
        assert_eq!(p.victim(&|_| true), None);
    }
}
