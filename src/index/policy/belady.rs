//! Belady's offline optimum with perfect admission, for trace replay only.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use super::{Access, Policy};
use crate::key::BlockHash;

/// When each block is next used: the replay driver, which knows the trace, keeps it current.
#[derive(Debug, Default)]
pub struct Oracle {
    next: HashMap<BlockHash, u64>,
}

impl Oracle {
    /// The position of a block never used again.
    pub const NEVER: u64 = u64::MAX;

    /// Records that `hash` is next used at trace position `pos` ([`Oracle::NEVER`] if never).
    pub fn set(&mut self, hash: BlockHash, pos: u64) {
        self.next.insert(hash, pos);
    }

    fn get(&self, hash: &BlockHash) -> u64 {
        self.next.get(hash).copied().unwrap_or(Oracle::NEVER)
    }
}

/// Evicts the block used furthest in the future and never admits a block that is used later
/// than everything held (or never). Knows the future through a shared [`Oracle`], so only a
/// trace replay can build it: it bounds what any policy could reach.
#[derive(Debug)]
pub struct Belady {
    oracle: Arc<Mutex<Oracle>>,
    by_next: BTreeSet<(u64, BlockHash)>,
    held: HashMap<BlockHash, u64>,
    cap_hint: usize,
}

impl Belady {
    /// A policy reading next uses from `oracle`.
    pub fn new(oracle: Arc<Mutex<Oracle>>) -> Self {
        Belady {
            oracle,
            by_next: BTreeSet::new(),
            held: HashMap::new(),
            cap_hint: 0,
        }
    }

    fn next_of(&self, h: &BlockHash) -> u64 {
        self.oracle.lock().unwrap_or_else(|e| e.into_inner()).get(h)
    }
}

impl Policy for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn on_access(&mut self, batch: &[Access]) {
        for a in batch {
            let n = self.next_of(&a.hash);
            if let Some(old) = self.held.insert(a.hash, n) {
                self.by_next.remove(&(old, a.hash));
            }
            self.by_next.insert((n, a.hash));
        }
    }

    fn admit(&mut self, hash: &BlockHash) -> bool {
        let n = self.next_of(hash);
        if n == Oracle::NEVER {
            return false;
        }
        let full = self.cap_hint > 0 && self.held.len() >= self.cap_hint;
        match self.by_next.last() {
            Some(&(furthest, _)) if full => n < furthest,
            _ => true,
        }
    }

    fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash> {
        let &(n, h) = self.by_next.iter().rev().find(|(_, h)| !pinned(h))?;
        self.by_next.remove(&(n, h));
        self.held.remove(&h);
        Some(h)
    }

    fn on_remove(&mut self, hash: &BlockHash) {
        if let Some(n) = self.held.remove(hash) {
            self.by_next.remove(&(n, *hash));
        }
    }

    fn set_capacity_hint(&mut self, blocks: usize) {
        self.cap_hint = blocks;
    }
}
