//! LRU with admission on second sight.

use lru::LruCache;

use super::{Access, Policy, pop_lru_unpinned};
use crate::key::BlockHash;

/// LRU that stores a block only the second time it is offered: the first time, it goes to a
/// ghost list (`ghost_factor` x the capacity, oldest forgotten first). One-time blocks then
/// never flush reused ones, at the price of a second computation for every reused block.
#[derive(Debug)]
pub struct Admit2 {
    list: LruCache<BlockHash, ()>,
    ghost: LruCache<BlockHash, ()>,
    ghost_factor: usize,
    cap_hint: usize,
}

impl Admit2 {
    /// A policy whose ghost list holds `ghost_factor` x the capacity.
    pub fn new(ghost_factor: usize) -> Self {
        Admit2 {
            list: LruCache::unbounded(),
            ghost: LruCache::unbounded(),
            ghost_factor,
            cap_hint: 0,
        }
    }

    fn ghost_cap(&self) -> usize {
        self.ghost_factor * self.cap_hint.max(self.list.len()).max(1)
    }
}

impl Policy for Admit2 {
    fn name(&self) -> &'static str {
        "admit2"
    }

    fn on_access(&mut self, batch: &[Access]) {
        for a in batch {
            self.list.put(a.hash, ());
        }
    }

    fn admit(&mut self, hash: &BlockHash) -> bool {
        if self.ghost.pop(hash).is_some() {
            return true;
        }
        self.ghost.put(*hash, ());
        while self.ghost.len() > self.ghost_cap() {
            self.ghost.pop_lru();
        }
        false
    }

    fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash> {
        pop_lru_unpinned(&mut self.list, pinned)
    }

    fn on_remove(&mut self, hash: &BlockHash) {
        self.list.pop(hash);
    }

    fn set_capacity_hint(&mut self, blocks: usize) {
        self.cap_hint = blocks;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::h;
    use super::*;

    #[test]
    fn admits_on_second_sight() {
        let mut p = Admit2::new(4);
        p.set_capacity_hint(2);
        assert!(!p.admit(&h(1)));
        assert!(p.admit(&h(1)));
        // The ghost list forgets the oldest beyond 8 entries.
        for i in 10..20 {
            assert!(!p.admit(&h(i)));
        }
        assert!(!p.admit(&h(10)), "forgotten");
        assert!(p.admit(&h(19)));
    }
}
