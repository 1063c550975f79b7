//! The default policy: ARC, LRU, `admit2`, or ARC or LRU behind a doorkeeper, whichever of five
//! shadow caches shows to be winning on the workload at hand (set dueling).

use super::door::Doorkeeper;
use super::{Access, ArcPolicy, Lru, Policy, Set};
use crate::key::BlockHash;

mod duel;
mod mirror;
mod sampling;
mod shadow;
#[cfg(test)]
mod tests;

use duel::Duel;
use mirror::Exact;
pub use sampling::MAX_SAMPLE_DEPTH;
use sampling::Sampled;
use shadow::{MODES, Mode, Shadow};

/// Shadow caches are exact up to this many blocks; above it each follows 1 in `2^k` of the
/// chains (hash-sampled by a chain's first blocks, so a chain is seen whole) at capacity /
/// `2^k` (spatial sampling, "SHARDS", FAST'15). Why: exact shadows cost a share of the cache in
/// memory and time, sampled ones a constant, at some accuracy (eviction log, 2f3502f).
pub const SHADOW_BLOCKS: usize = 32768;

/// The doorkeeper remembers a first offer for 4 to 8 capacities' worth of other offers. Why
/// 4: as long as `admit2`'s ghost list, so it never refuses a block that rule would admit.
pub const DOOR_WINDOW_CAPACITIES: usize = 4;

/// Shadow hit counts halve every this many capacities' worth of references. Why 4: the duel
/// follows a workload that changes, yet a candidate must lead for a while to be followed.
pub const HALF_LIFE_CAPACITIES: usize = 4;

/// The default policy. The real cache keeps both an ARC and an LRU order over its blocks, and a
/// [`Doorkeeper`] of recent offers; five shadow caches (metadata only, on a hash-sampled subset
/// of the chains when the cache is larger than [`SHADOW_BLOCKS`]) replay the same accesses as
/// ARC, ARC with admission on second sight, LRU, LRU with admission on second sight, and
/// `admit2`, and count their hits with a half-life of [`HALF_LIFE_CAPACITIES`] capacities. The
/// real cache follows the shadow with the most recent hits (the leader), switching when another
/// leads it by [`SWITCH_SIGMAS`](duel::SWITCH_SIGMAS) standard deviations: set dueling (Qureshi et al., ISCA'07), as
/// adaptive insertion policies in CPU caches decide. With exact shadows it mirrors the shadows:
/// it admits a block when the shadows that just admitted it carry half the weight of a vote
/// ([`VOTE_SIGMAS`](mirror::VOTE_SIGMAS)), and evicts first the blocks whose holders carry the least, which with a
/// clear leader is the leader's shadow block for block; with sampled ones it applies the
/// leader's rule to its own orders. With exact shadows it also keeps a duel per regime of the
/// workload ([`REGIME_SHIFT`](duel::REGIME_SHIFT)), so a regime that comes back brings back the rule that won in
/// it. No constant is fitted to a trace; each is fixed with its reason beside it, and
/// docs/eviction-log.md at commit 2f3502f (`git show 2f3502f:docs/eviction-log.md`) shows their
/// sensitivity.
///
/// Chain order is the index's: eviction takes only blocks without present children, whichever
/// order chooses among them.
#[derive(Debug)]
pub struct Adaptive {
    lru: Lru,
    arc: ArcPolicy,
    door: Doorkeeper,
    /// Admitted by `admit`, not yet reported inserted: their reference is already counted.
    admitted: Set<BlockHash>,
    shadows: Vec<Shadow>,
    /// Exact or sampled shadows, and the state only that kind has (made anew with them).
    kind: Kind,
    /// Which draw of the sampled chains this is, and the references (all, and of sampled
    /// chains) since the draw's share was last checked ([`RESAMPLE_BELOW`](sampling::RESAMPLE_BELOW)).
    /// Kept while the shadows are made anew, as is `depth`.
    draw: u32,
    draw_seen: u64,
    draw_sampled: u64,
    shadow_blocks: usize,
    half_life: usize,
    door_window: usize,
    cap_hint: usize,
    /// The shadows' recent hits and the leader they chose.
    duel: Duel,
    /// The last block referenced, and whether its chain is one the shadows follow.
    last_ref: Option<BlockHash>,
    chain_sampled: bool,
    /// A chain started at its root: its block at `depth` (or its last, if it is shorter)
    /// decides whether it is sampled ([`MAX_SAMPLE_DEPTH`]).
    at_root: bool,
    /// With sampled shadows: the depth of the block that decides whether a chain is followed,
    /// whether the current chain is decided yet, and its blocks before the deciding one (the
    /// shadows see them once it is decided).
    depth: usize,
    decided: bool,
    pending: Vec<BlockHash>,
    switches: u64,
    fixed: bool,
}

/// The shadows' kind, and the state only that kind has.
#[derive(Debug)]
enum Kind {
    /// The shadows hold the whole capacity (at most [`SHADOW_BLOCKS`]): the real cache mirrors
    /// them, and each regime of the workload keeps its duel.
    Exact(Exact),
    /// The shadows follow 1 in `sample` of the chains, at their share of the capacity.
    Sampled(Sampled),
}

impl Default for Adaptive {
    fn default() -> Self {
        Self::new()
    }
}

impl Adaptive {
    /// The default policy with its documented constants.
    pub fn new() -> Self {
        Self::with_constants(SHADOW_BLOCKS, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES)
    }

    /// With other constants (for the sensitivity tables of docs/eviction-log.md at commit 2f3502f).
    pub fn with_constants(
        shadow_blocks: usize,
        half_life_capacities: usize,
        door_window_capacities: usize,
    ) -> Self {
        Adaptive {
            lru: Lru::new(),
            arc: ArcPolicy::new(),
            door: Doorkeeper::new(1),
            admitted: Set::default(),
            shadows: Vec::new(),
            kind: Kind::Exact(Exact::new()),
            draw: 0,
            draw_seen: 0,
            draw_sampled: 0,
            shadow_blocks: shadow_blocks.max(1),
            half_life: half_life_capacities.max(1),
            door_window: door_window_capacities.max(1),
            cap_hint: 0,
            duel: Duel::new(Mode::Arc),
            last_ref: None,
            chain_sampled: false,
            at_root: false,
            depth: 0,
            decided: true,
            pending: Vec::new(),
            switches: 0,
            fixed: false,
        }
    }

    /// One in how many chains the shadows follow (1: they are exact).
    fn sample(&self) -> u64 {
        match &self.kind {
            Kind::Exact(_) => 1,
            Kind::Sampled(s) => s.sample,
        }
    }

    /// Follows one candidate whatever the shadows say (`lru`, `lru+door`, `arc`, `arc+door`,
    /// `admit2`; its shadow alone votes): for the design tables only.
    #[cfg(test)]
    pub fn fixed(mode: &str, door_window_capacities: usize) -> Self {
        let mut a =
            Self::with_constants(SHADOW_BLOCKS, HALF_LIFE_CAPACITIES, door_window_capacities);
        a.duel.leader = *MODES.iter().find(|m| m.name() == mode).expect("mode");
        a.fixed = true;
        a
    }

    /// The candidate the real cache follows now.
    #[cfg(test)]
    pub fn leader(&self) -> &'static str {
        self.duel.leader.name()
    }

    /// How many times the leader changed.
    #[cfg(test)]
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// How many times the workload changed regime ([`REGIME_SHIFT`](duel::REGIME_SHIFT)).
    #[cfg(test)]
    pub fn regime_changes(&self) -> u64 {
        self.regimes_changed()
    }

    /// How many times the workload changed regime since the shadows were made.
    fn regimes_changed(&self) -> u64 {
        match &self.kind {
            Kind::Exact(e) => e.regimes.changes,
            Kind::Sampled(_) => 0,
        }
    }

    /// The index of the leader's shadow.
    fn leader_index(&self) -> Option<usize> {
        self.shadows.iter().position(|s| s.mode == self.duel.leader)
    }

    fn reference(&mut self, h: BlockHash) {
        if self.at_root {
            // Chains are sampled whole, by one of their first blocks, so a shadow sees every
            // block of the chains it follows and can tell prefix hits.
            self.at_root = false;
            self.decided = false;
            self.pending.clear();
            if let Kind::Sampled(s) = &mut self.kind {
                s.chain_head.clear();
                s.chain_len = 0;
            }
        }
        self.last_ref = Some(h);
        if self.shadows.is_empty() {
            return;
        }
        if let Kind::Sampled(s) = &mut self.kind {
            s.chain_len += 1;
            if s.chain_head.len() < MAX_SAMPLE_DEPTH {
                s.chain_head.push(h);
            }
        }
        if !self.decided {
            self.pending.push(h);
            if self.sample() == 1 || self.pending.len() > self.depth {
                self.decide(h);
            }
            return;
        }
        self.follow(h);
    }

    /// The current chain's block `key` decides whether the shadows follow it; they see the
    /// blocks before it now.
    fn decide(&mut self, key: BlockHash) {
        self.decided = true;
        self.chain_sampled = self.sampled(&key);
        let mut pending = std::mem::take(&mut self.pending);
        for &p in &pending {
            self.follow(p);
        }
        pending.clear();
        self.pending = pending;
    }

    /// A chain ends (another starts, or one the shadows did not see from its root): a chain
    /// shorter than the deciding depth is decided by its last block; with sampled shadows each
    /// depth's share of the traffic counts its references, and its hits join the duel's
    /// variance as one observation (the square of each pair's difference).
    fn end_chain(&mut self) {
        if !self.decided {
            if let Some(&last) = self.pending.last() {
                self.decide(last);
            }
            self.decided = true;
        }
        let draw = self.draw;
        if let Kind::Sampled(s) = &mut self.kind {
            s.end_chain(draw);
            let c = std::mem::take(&mut s.chain_hits);
            if c.iter().any(|&x| x != 0.0) {
                self.duel.count_chain(&c);
            }
        }
    }

    /// A reference of the current chain, once decided: counted toward the sampled share, and
    /// replayed on the shadows if they follow the chain.
    fn follow(&mut self, h: BlockHash) {
        if self.sample() > 1 && self.count_share() {
            // Another draw or depth: the shadows start over, from the next chain.
            self.chain_sampled = false;
            return;
        }
        if !self.chain_sampled {
            return;
        }
        let mut hit = [false; MODES.len()];
        for (s, hit) in self.shadows.iter_mut().zip(&mut hit) {
            *hit = s.reference(h);
        }
        self.duel.count(&hit);
        if let Kind::Sampled(s) = &mut self.kind {
            for (c, hit) in s.chain_hits.iter_mut().zip(hit) {
                *c += f64::from(u8::from(hit));
            }
        }
        if self.mirrors() {
            self.track(&h);
        }
        self.regime(hit.contains(&true));
        // Toward the half-life of the duel now current (after a move, the one taken up).
        self.duel.refs += 1;
        if self.duel.refs >= self.half_life * self.shadows[0].cap {
            self.duel.halve();
        }
        if !self.fixed {
            self.follow_the_leader();
        }
    }

    fn rebuild_shadows(&mut self) {
        let cap = self.cap_hint.max(1);
        let mut sample = 1u64;
        while cap as u64 / sample > self.shadow_blocks as u64 {
            sample *= 2;
        }
        if !self.shadows.is_empty() && sample == self.sample() {
            // Same sampling, another size: keep what the shadows learned.
            self.resize_shadows(self.shadow_cap());
            return;
        }
        // The state of the shadows' kind starts again with them (each depth's share too:
        // another draw, depth or rate); a chain under way keeps its head.
        self.kind = if sample == 1 {
            Kind::Exact(Exact::new())
        } else {
            let mut fresh = Sampled::new(sample);
            if let Kind::Sampled(old) = &mut self.kind {
                fresh.chain_head = std::mem::take(&mut old.chain_head);
                fresh.chain_len = old.chain_len;
            }
            Kind::Sampled(fresh)
        };
        let shadow_cap = self.shadow_cap();
        let w = self.door_window;
        self.shadows = MODES
            .iter()
            .map(|&m| Shadow::new(m, shadow_cap, w))
            .collect();
        self.duel = Duel::new(self.duel.leader);
        self.remask();
    }
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn on_chain(&mut self, parent: Option<&BlockHash>) {
        if parent.is_none() || self.last_ref.as_ref() != parent {
            self.end_chain();
        }
        match parent {
            None => {
                self.at_root = true;
                for s in &mut self.shadows {
                    s.start_chain(true);
                }
            }
            Some(p) if self.last_ref.as_ref() == Some(p) => {} // the same chain goes on
            Some(_) => {
                // A chain the shadows did not see from its root: followed only unsampled, and
                // not as hits.
                self.at_root = false;
                self.decided = true;
                self.chain_sampled = self.sample() == 1;
                for s in &mut self.shadows {
                    s.start_chain(false);
                }
            }
        }
    }

    fn on_access(&mut self, batch: &[Access]) {
        self.lru.on_access(batch);
        self.arc.on_access(batch);
        for a in batch {
            if a.inserted {
                if !self.admitted.remove(&a.hash) && self.sampled(&a.hash) {
                    // Found on disk at open, or published after a removal: stored, not asked for.
                    for s in &mut self.shadows {
                        s.insert(a.hash, None);
                    }
                    if self.mirrors() {
                        self.track(&a.hash);
                    }
                }
                if self.mirrors() {
                    // Grouped by the shadows that hold it (none, if stored in free room
                    // where they declined it: a first victim).
                    self.group(a.hash);
                }
            } else {
                self.reference(a.hash);
                if let Kind::Exact(e) = &mut self.kind {
                    e.promote(&a.hash);
                }
            }
        }
    }

    fn admit(&mut self, hash: &BlockHash) -> bool {
        self.reference(*hash);
        let second = self.door.sight(hash);
        let arc = self.arc.admit(hash);
        // A doorkeeper only spares room: while there is free room, everything is admitted.
        // The index reports a batch's insertions after its evictions, so the blocks admitted
        // and not yet reported take room too: without them, a block offered after the batch's
        // first eviction found room that was already spoken for and was stored where the
        // leader's shadow had declined it.
        let full = self.cap_hint > 0 && self.lru.len() + self.admitted.len() >= self.cap_hint;
        let declined = if self.mirrors() {
            // As the shadows vote, having just seen this offer: stored if the shadows that
            // stored it weigh at least half.
            let w = self.weights();
            full && Self::vote(&w, self.holders(hash)) < 0.5 * w.iter().sum::<f64>()
        } else {
            self.duel.leader.second_sight() && !second && full
        };
        if declined {
            // Not stored: ARC forgets the ghost hit it noted for the insertion.
            self.arc.on_remove(hash);
            return false;
        }
        if arc {
            self.admitted.insert(*hash);
        }
        arc
    }

    fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash> {
        if self.mirrors() {
            if let Some(v) = self.mirror_victim(pinned) {
                self.lru.on_remove(&v);
                self.arc.evicted(&v);
                return Some(v);
            }
        }
        let v = if self.duel.leader.arc() {
            let v = self.arc.victim(pinned)?;
            self.lru.on_remove(&v);
            v
        } else {
            let v = self.lru.victim(pinned)?;
            self.arc.evicted(&v);
            v
        };
        self.ungroup(&v);
        Some(v)
    }

    fn on_remove(&mut self, hash: &BlockHash) {
        self.lru.on_remove(hash);
        self.arc.on_remove(hash);
        self.admitted.remove(hash);
        self.ungroup(hash);
    }

    fn summary(&self) -> String {
        format!(
            "following {} after {} switches, {} regime changes",
            self.duel.leader.name(),
            self.switches,
            self.regimes_changed()
        )
    }

    fn set_capacity_hint(&mut self, blocks: usize) {
        self.cap_hint = blocks.max(1);
        self.arc.set_capacity_hint(self.cap_hint);
        self.door.set_window(self.door_window * self.cap_hint);
        self.rebuild_shadows();
    }
}
