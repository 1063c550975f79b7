//! The shadow caches: metadata-only replays of each candidate rule on the chains the
//! shadows follow, counting prefix hits as the index would.

use super::super::door::Doorkeeper;
use super::super::{Access, Admit2, ArcPolicy, Lru, Map, Policy, Set};
use crate::key::BlockHash;

/// What a candidate (and the real cache, following the leader) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Arc,
    ArcDoor,
    Lru,
    LruDoor,
    /// The `admit2` rule itself (its ghost list of 4x the capacity), so that the default has
    /// the simple rule it must match among its candidates.
    Admit2,
}

pub(super) const MODES: [Mode; 5] = [
    Mode::Arc,
    Mode::ArcDoor,
    Mode::Lru,
    Mode::LruDoor,
    Mode::Admit2,
];

impl Mode {
    pub(super) fn arc(self) -> bool {
        matches!(self, Mode::Arc | Mode::ArcDoor)
    }
    /// Admits on second sight through the doorkeeper.
    pub(super) fn door(self) -> bool {
        matches!(self, Mode::ArcDoor | Mode::LruDoor)
    }
    /// Admits on second sight, by either mechanism.
    pub(super) fn second_sight(self) -> bool {
        self.door() || self == Mode::Admit2
    }
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Arc => "arc",
            Mode::ArcDoor => "arc+door",
            Mode::Lru => "lru",
            Mode::LruDoor => "lru+door",
            Mode::Admit2 => "admit2",
        }
    }
}

/// A cache of metadata only, simulating one candidate on the sampled chains as the index
/// keeps a store: prefix-closed (only blocks without present children are evicted, never one
/// of the chain being placed; a block that does not fit is not admitted, nor the rest of its
/// chain), with prefix hits counted.
#[derive(Debug)]
pub(super) struct Shadow {
    pub(super) mode: Mode,
    pub(super) evict: Box<dyn Policy>,
    pub(super) door: Doorkeeper,
    /// Present blocks: their chain parent and how many present children they have.
    pub(super) present: Map<BlockHash, (Option<BlockHash>, u32)>,
    pub(super) cap: usize,
    /// Every block of the current chain so far was a hit.
    pub(super) run: bool,
    /// A block of the current chain was not admitted.
    pub(super) declined: bool,
    /// The current chain's blocks (not evicted while it is placed), and its last block.
    pub(super) chain: Set<BlockHash>,
    pub(super) prev: Option<BlockHash>,
    /// The blocks this shadow evicted since the owner last took them (kept while the real
    /// cache mirrors the shadows, to regroup its blocks).
    pub(super) evicted: Vec<BlockHash>,
    pub(super) log_evictions: bool,
}

impl Shadow {
    pub(super) fn new(mode: Mode, cap: usize, door_window: usize) -> Self {
        let mut evict: Box<dyn Policy> = match mode {
            Mode::Arc | Mode::ArcDoor => Box::new(ArcPolicy::new()),
            Mode::Lru | Mode::LruDoor => Box::new(Lru::new()),
            Mode::Admit2 => Box::new(Admit2::new(4)),
        };
        evict.set_capacity_hint(cap);
        Shadow {
            mode,
            evict,
            door: Doorkeeper::new(door_window * cap),
            present: Map::default(),
            cap,
            run: false,
            declined: false,
            chain: Set::default(),
            prev: None,
            evicted: Vec::new(),
            log_evictions: false,
        }
    }

    /// A chain starts at its root (`true`), or continues one this shadow did not follow.
    pub(super) fn start_chain(&mut self, at_root: bool) {
        self.run = at_root;
        self.declined = false;
        self.chain.clear();
        self.prev = None;
    }

    /// The engine asked for `h`, the next block of the current chain: a hit if it is present
    /// and so is the whole chain before it (a prefix hit), else a miss that may be stored.
    /// Returns whether it was a prefix hit.
    pub(super) fn reference(&mut self, h: BlockHash) -> bool {
        let prev = self.prev.replace(h);
        if self.present.contains_key(&h) && !self.declined {
            self.evict.on_access(&[Access {
                hash: h,
                inserted: false,
            }]);
            self.chain.insert(h);
            self.link(prev, h);
            return self.run;
        }
        self.run = false;
        // Every offer is a sighting, also one after a block that was not admitted.
        let second = self.door.sight(&h) || !self.mode.door() || self.present.len() < self.cap;
        if self.declined {
            // As the index does: the policy still sees the offer, then forgets it.
            if !self.present.contains_key(&h) {
                let _ = self.evict.admit(&h);
                self.evict.on_remove(&h);
            }
        } else if !second || !self.insert(h, prev) {
            self.declined = true;
        }
        false
    }

    fn link(&mut self, parent: Option<BlockHash>, child: BlockHash) {
        let Some(p) = parent.filter(|p| *p != child && self.present.contains_key(p)) else {
            return;
        };
        match self.present.get_mut(&child) {
            Some(c) if c.0.is_none() => c.0 = Some(p),
            _ => return,
        }
        if let Some(pe) = self.present.get_mut(&p) {
            pe.1 += 1;
        }
    }

    /// Stores `h` after `parent` (a miss admitted, or a block found on disk at open), making
    /// room first; false if there is none.
    pub(super) fn insert(&mut self, h: BlockHash, parent: Option<BlockHash>) -> bool {
        if self.present.contains_key(&h) || !self.evict.admit(&h) {
            return false;
        }
        while self.present.len() >= self.cap {
            let (present, chain) = (&self.present, &self.chain);
            let pinned =
                |x: &BlockHash| chain.contains(x) || present.get(x).is_some_and(|e| e.1 > 0);
            let Some(v) = self.evict.victim(&pinned) else {
                self.evict.on_remove(&h);
                return false;
            };
            if let Some((Some(p), _)) = self.present.remove(&v) {
                if let Some(pe) = self.present.get_mut(&p) {
                    pe.1 -= 1;
                }
            }
            if self.log_evictions {
                self.evicted.push(v);
            }
        }
        self.present.insert(h, (None, 0));
        self.link(parent, h);
        self.chain.insert(h);
        self.evict.on_access(&[Access {
            hash: h,
            inserted: true,
        }]);
        true
    }
}
