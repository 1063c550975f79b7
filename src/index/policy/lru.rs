//! Least recently used.

use lru::LruCache;

use super::{Access, Policy, pop_lru_unpinned};
use crate::key::BlockHash;

/// LRU: every access makes a block the most recent, in batch order.
#[derive(Debug)]
pub struct Lru {
    list: LruCache<BlockHash, ()>,
}

impl Lru {
    /// An empty LRU.
    pub fn new() -> Self {
        Lru {
            list: LruCache::unbounded(),
        }
    }
}

impl Lru {
    /// How many blocks it orders.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Its blocks, least recent first.
    pub(crate) fn oldest_first(&self) -> impl Iterator<Item = &BlockHash> {
        self.list.iter().rev().map(|(h, _)| h)
    }
}

impl Default for Lru {
    fn default() -> Self {
        Self::new()
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn on_access(&mut self, batch: &[Access]) {
        for a in batch {
            self.list.put(a.hash, ());
        }
    }

    fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash> {
        pop_lru_unpinned(&mut self.list, pinned)
    }

    fn on_remove(&mut self, hash: &BlockHash) {
        self.list.pop(hash);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::h;
    use super::*;

    #[test]
    fn evicts_least_recent_skipping_pinned() {
        let mut p = Lru::new();
        let acc = |i| Access {
            hash: h(i),
            inserted: true,
        };
        p.on_access(&[acc(1), acc(2), acc(3)]);
        p.on_access(&[Access {
            hash: h(1),
            inserted: false,
        }]);
        assert_eq!(p.victim(&|x| *x == h(2)), Some(h(3)));
        assert_eq!(p.victim(&|_| false), Some(h(2)));
        p.on_remove(&h(1));
        assert_eq!(p.victim(&|_| false), None);
    }
}
