//! The default policy: ARC, LRU, `admit2`, or ARC or LRU behind a doorkeeper, whichever of five
//! shadow caches shows to be winning on the workload at hand (set dueling).

use std::collections::{HashMap, HashSet};

use lru::LruCache;

use super::door::{Doorkeeper, mix};
use super::{Access, Admit2, ArcPolicy, Lru, Policy, pop_lru_unpinned};
use crate::key::BlockHash;

/// Shadow caches simulate at most this many blocks each; above it they follow a hash-sampled
/// subset of the chains (1 in `2^k`, chosen by the chain's root, so a followed chain is seen
/// whole and its prefix hits can be counted) at capacity / `2^k`, which estimates the hit ratio
/// of the full-size cache (spatial sampling, Waldspurger et al., "SHARDS", FAST'15). Below it the
/// shadows are exact; above it their memory stays a constant, not a share of the cache. Sampling
/// costs accuracy: docs/eviction-log.md at commit 2f3502f (`git show 2f3502f:docs/eviction-log.md`)
/// measures sampled shadows against exact ones at 16k blocks.
pub const SHADOW_BLOCKS: usize = 32768;

/// The doorkeeper remembers a first offer for between 4 and 8 capacities' worth of other
/// offers: at least as long as the ghost list of admit-on-second-sight (4x the capacity), so it
/// never turns a block away for want of memory where that rule would admit it.
pub const DOOR_WINDOW_CAPACITIES: usize = 4;

/// Shadow hit counts are halved every this many capacities' worth of references, so the duel
/// follows a workload that changes, and a candidate must lead for a while to be followed.
pub const HALF_LIFE_CAPACITIES: usize = 4;

/// The leader changes when another shadow leads it by this many standard deviations of the
/// difference of their hits (McNemar's test on the references where one hit and the other did
/// not).
pub const SWITCH_SIGMAS: f64 = 3.0;

/// With exact shadows the real cache holds what the shadows vote for, each shadow weighing
/// `exp(-(z / VOTE_SIGMAS)^2 / 2)`, where `z` is how many standard deviations (McNemar's, as
/// for a switch) it trails the leader by: the leader, and a shadow ahead of it by less than the
/// switching margin, weigh 1; one half a deviation behind, 0.88; one deviation behind, 0.61;
/// two, 0.14; three, 0.011; one that no reference has yet told apart from the leader (one hit
/// where the other missed), 0. So with a clear leader the real cache is the leader's shadow,
/// and near a tie it keeps what most of the close shadows keep instead of what one of them,
/// perhaps by chance, keeps. Over the 216 cells of 8 seeds in docs/eviction-log.md at commit
/// 2f3502f, 1 leaves the fewest cells below the best simple rule by more than 0.005 of the
/// widths tried (7 at 1, 8 at 0.5, 9 at 1.5, 10 at 2), with 33 below 0.995x the best (36 at
/// 0.5).
pub const VOTE_SIGMAS: f64 = 1.0;

/// With sampled shadows (above [`SHADOW_BLOCKS`]), the leader changes when another shadow leads
/// it by this many standard deviations of the difference of their hits counted chain by chain
/// (the sum, over the chains ended, of the square of the difference in each; the lead is
/// checked at every reference, as with exact shadows). The shadows sample whole chains, whose
/// references hit or miss together, so a chain is one observation: per reference, documents at
/// 52,509 blocks switched from ARC to LRU on a lead of 36 hits in 14,000 (two chains) and lost
/// 0.0065. That deviation is larger than the per-reference one of [`SWITCH_SIGMAS`], hence
/// fewer of them: at 3, chat at 25,920 blocks follows LRU too late (-0.0100); 1.5 to 2.5 give
/// the same figures on every sampled cell of docs/eviction.md.
pub const SAMPLED_SWITCH_SIGMAS: f64 = 2.0;

/// The share of references that some shadow hits, averaged over this many capacities' worth of
/// references (an exponential moving average; at least [`REGIME_MIN_REFERENCES`]), is the
/// *rate* that tells the workload's regimes apart ([`REGIME_SHIFT`]).
pub const REGIME_RATE_CAPACITIES: usize = 1;

/// The capacity that sizes the rate's and a regime's spans ([`REGIME_RATE_CAPACITIES`],
/// [`REGIME_MEAN_CAPACITIES`]) is counted as at least this many references: at 167 blocks
/// (conversation at 1 % of its blocks) a capacity of references is six or seven chats, whose
/// hits come and go together, and the rate moved by 0.3 and back 27 and 46 times on traces of
/// one regime (seeds 8 and 4), 0.0067 to 0.0096 below the best rule on 3 of 8 seeds.
pub const REGIME_MIN_REFERENCES: usize = 1000;

/// A regime's mean rate is averaged over this many capacities' worth of references while the
/// workload is in it, and the workload stays in a regime at least this long. At 4 (the
/// half-life) phases at 5 % of its blocks fell 0.0054 below ARC (seed 1): its phases last 3 to
/// 5 capacities there, so a regime was left about as late as the duel's leader changed.
pub const REGIME_MEAN_CAPACITIES: usize = 2;

/// The workload has entered another regime when the rate ([`REGIME_RATE_CAPACITIES`]) moves
/// this far from the mean it had in the current one ([`REGIME_MEAN_CAPACITIES`]), and is nearer
/// the other regime's mean than the current one's (or there is no other yet). Each of the
/// [`REGIMES`] keeps its own duel (the shadows' hit counts, their discordant references and the
/// leader), so a regime that comes back brings back the rule that won in it instead of learning
/// it again against the other's lead. In phases (chat, then one-off prompts, in turn) the
/// candidates hit 0.57 to 0.92 of the references in the chat phases and 0.04 to 0.19 in the
/// others. A steady workload's rate wanders less, but not by much less at small capacities: at
/// 0.2, conversation at 2 % of its blocks (seed 8) changed regime 21 times where it has one,
/// against 3 times at 0.3 (both with a mean over 4 capacities and no [`REGIME_MIN_REFERENCES`]);
/// docs/eviction.md has the record.
pub const REGIME_SHIFT: f64 = 0.3;

/// How many regimes, each with its own duel, are kept ([`REGIME_SHIFT`]).
pub const REGIMES: usize = 2;

/// Sampled shadows draw their chains again (another salt for the hash of a chain's root) when,
/// over a capacity's worth of references, the chains they follow take less than
/// 1 / (`RESAMPLE_BELOW` x `2^k`) of the traffic: a few roots (shared system prompts) can
/// carry all of it, and a draw that samples none of them leaves the shadows nothing to compare
/// (chat at 25,487 blocks, seed 2, when the shadows were exact only up to 16,384 blocks: three
/// prompts, none sampled at 1 in 2, and the default stayed with ARC, 0.0197 below LRU).
pub const RESAMPLE_BELOW: u64 = 8;

/// At most this many draws: traffic that no draw samples stays unsampled, not redrawn forever.
pub const MAX_DRAWS: u32 = 8;

/// Sampled shadows decide whether they follow a chain by one of its blocks: at first its root,
/// and deeper (its second block, its third, ...) when the chains sharing the blocks up to that
/// depth carry too much of the traffic for the shadows to hold their share of the capacity, or
/// too little of it ([`RESAMPLE_BELOW`]). Real traces put a system prompt before every request:
/// every request of Mooncake's conversation trace starts with the same block, so a sample by
/// root takes all of the traffic or none of it, and a shadow of at most [`SHADOW_BLOCKS`] then
/// models a smaller cache than the real one (at 36,558 blocks the default ended 0.0139 below
/// LRU). The shadows measure the share each depth up to this one would give, and take the
/// shallowest that fits: the shallower, the likelier that every turn of a conversation (each
/// extending the last) is decided by the same block.
pub const MAX_SAMPLE_DEPTH: usize = 64;

/// With sampled shadows, whether the sampled chains' share of the traffic fits is checked every
/// this many capacities' worth of references (and at least [`REGIME_MIN_REFERENCES`]): a
/// shared root shows within the first few hundred requests, so the shadows take the right depth
/// within the first 10 % of a trace, and learn from there.
pub const SAMPLE_DEPTH_CHECK: f64 = 0.125;

/// What a candidate (and the real cache, following the leader) does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Arc,
    ArcDoor,
    Lru,
    LruDoor,
    /// The `admit2` rule itself (its ghost list of 4x the capacity), so that the default has
    /// the simple rule it must match among its candidates.
    Admit2,
}

const MODES: [Mode; 5] = [
    Mode::Arc,
    Mode::ArcDoor,
    Mode::Lru,
    Mode::LruDoor,
    Mode::Admit2,
];

impl Mode {
    fn arc(self) -> bool {
        matches!(self, Mode::Arc | Mode::ArcDoor)
    }
    /// Admits on second sight through the doorkeeper.
    fn door(self) -> bool {
        matches!(self, Mode::ArcDoor | Mode::LruDoor)
    }
    /// Admits on second sight, by either mechanism.
    fn second_sight(self) -> bool {
        self.door() || self == Mode::Admit2
    }
    fn name(self) -> &'static str {
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
struct Shadow {
    mode: Mode,
    evict: Box<dyn Policy>,
    door: Doorkeeper,
    /// Present blocks: their chain parent and how many present children they have.
    present: HashMap<BlockHash, (Option<BlockHash>, u32)>,
    cap: usize,
    /// Every block of the current chain so far was a hit.
    run: bool,
    /// A block of the current chain was not admitted.
    declined: bool,
    /// The current chain's blocks (not evicted while it is placed), and its last block.
    chain: HashSet<BlockHash>,
    prev: Option<BlockHash>,
    /// The blocks this shadow evicted since the owner last took them (kept while the real
    /// cache mirrors the shadows, to regroup its blocks).
    evicted: Vec<BlockHash>,
    log_evictions: bool,
}

impl Shadow {
    fn new(mode: Mode, cap: usize, door_window: usize) -> Self {
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
            present: HashMap::new(),
            cap,
            run: false,
            declined: false,
            chain: HashSet::new(),
            prev: None,
            evicted: Vec::new(),
            log_evictions: false,
        }
    }

    /// A chain starts at its root (`true`), or continues one this shadow did not follow.
    fn start_chain(&mut self, at_root: bool) {
        self.run = at_root;
        self.declined = false;
        self.chain.clear();
        self.prev = None;
    }

    /// The engine asked for `h`, the next block of the current chain: a hit if it is present
    /// and so is the whole chain before it (a prefix hit), else a miss that may be stored.
    /// Returns whether it was a prefix hit.
    fn reference(&mut self, h: BlockHash) -> bool {
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
    fn insert(&mut self, h: BlockHash, parent: Option<BlockHash>) -> bool {
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

/// The default policy. The real cache keeps both an ARC and an LRU order over its blocks, and a
/// [`Doorkeeper`] of recent offers; five shadow caches (metadata only, on a hash-sampled subset
/// of the chains when the cache is larger than [`SHADOW_BLOCKS`]) replay the same accesses as
/// ARC, ARC with admission on second sight, LRU, LRU with admission on second sight, and
/// `admit2`, and count their hits with a half-life of [`HALF_LIFE_CAPACITIES`] capacities. The
/// real cache follows the shadow with the most recent hits (the leader), switching when another
/// leads it by [`SWITCH_SIGMAS`] standard deviations: set dueling (Qureshi et al., ISCA'07), as
/// adaptive insertion policies in CPU caches decide. With exact shadows it mirrors the shadows:
/// it admits a block when the shadows that just admitted it carry half the weight of a vote
/// ([`VOTE_SIGMAS`]), and evicts first the blocks whose holders carry the least, which with a
/// clear leader is the leader's shadow block for block; with sampled ones it applies the
/// leader's rule to its own orders. With exact shadows it also keeps a duel per regime of the
/// workload ([`REGIME_SHIFT`]), so a regime that comes back brings back the rule that won in
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
    admitted: HashSet<BlockHash>,
    shadows: Vec<Shadow>,
    /// Shadows follow the chains whose root's `mix`, salted with `draw`, is 0 modulo `sample`
    /// (a power of two).
    sample: u64,
    /// Which draw of the sampled chains this is, and the references (all, and of sampled
    /// chains) since the draw's share was last checked ([`RESAMPLE_BELOW`]).
    draw: u32,
    draw_seen: u64,
    draw_sampled: u64,
    shadow_blocks: usize,
    half_life: usize,
    door_window: usize,
    cap_hint: usize,
    /// With sampled shadows: every reference, and those of the sampled chains, halved every
    /// half-life of the real cache's references. Their ratio (the share of the traffic the
    /// shadows see, which chains sharing a root make far from 1 in `sample`) sizes the shadows.
    seen: f64,
    seen_sampled: f64,
    /// With sampled shadows: each shadow's hits in the current chain so far.
    chain_hits: [f64; MODES.len()],
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
    /// With sampled shadows: the current chain's first [`MAX_SAMPLE_DEPTH`] blocks and its
    /// length, and, since the depth was last chosen, the references of all chains and of
    /// those each depth would sample.
    chain_head: Vec<BlockHash>,
    chain_len: u64,
    depth_seen: u64,
    depth_sampled: Vec<u64>,
    switches: u64,
    fixed: bool,
    /// With exact shadows: for each real block, the shadows that hold it (bit `i` for the
    /// shadow of `MODES[i]`).
    held: HashMap<BlockHash, u8>,
    /// With exact shadows: the real blocks grouped by the shadows that hold them (indexed by
    /// that bit set), each group least recently used or regrouped first. The victim comes from
    /// the group with the smallest vote.
    by_holders: Vec<LruCache<BlockHash, ()>>,
    /// With exact shadows: the regime the workload is in, and the duel each other one had.
    regimes: Regimes,
}

/// The duel between the shadows: their recent hits, what the differences between them vary
/// by, and the leader they chose. A regime the workload leaves keeps its duel ([`Regimes`]).
#[derive(Clone, Debug)]
struct Duel {
    /// Each shadow's prefix hits (in [`MODES`] order), halved every half-life.
    hits: [f64; MODES.len()],
    /// For each pair of shadows, the references on which exactly one of the two hit, halved
    /// with the hits: what the difference of their hits varies by.
    discordant: [[f64; MODES.len()]; MODES.len()],
    /// With sampled shadows: for each pair of shadows the sum over chains of the square of the
    /// difference of their hits in the chain, halved with the hits: what the difference of
    /// their hits varies by when whole chains are the sampled units.
    discordant_chains: [[f64; MODES.len()]; MODES.len()],
    /// References seen by the shadows since the last halving.
    refs: usize,
    /// The shadow the real cache follows.
    leader: Mode,
}

impl Duel {
    fn new(leader: Mode) -> Self {
        Duel {
            hits: [0.0; MODES.len()],
            discordant: [[0.0; MODES.len()]; MODES.len()],
            discordant_chains: [[0.0; MODES.len()]; MODES.len()],
            refs: 0,
            leader,
        }
    }

    /// Counts the hits and the discordant pairs of a reference that each shadow hit or
    /// missed.
    fn count(&mut self, hit: &[bool; MODES.len()]) {
        for (h, &hit) in self.hits.iter_mut().zip(hit) {
            *h += f64::from(u8::from(hit));
        }
        for i in 0..MODES.len() {
            for j in 0..i {
                if hit[i] != hit[j] {
                    self.discordant[i][j] += 1.0;
                    self.discordant[j][i] += 1.0;
                }
            }
        }
    }

    /// Counts a sampled chain that has ended, `c` being each shadow's hits in it: one
    /// observation of each pair's difference (its square joins the pair's variance).
    fn count_chain(&mut self, c: &[f64; MODES.len()]) {
        for i in 0..MODES.len() {
            for j in 0..i {
                let d = (c[i] - c[j]) * (c[i] - c[j]);
                self.discordant_chains[i][j] += d;
                self.discordant_chains[j][i] += d;
            }
        }
    }

    /// Halves what the duel remembers (a half-life has passed).
    fn halve(&mut self) {
        self.refs = 0;
        for h in &mut self.hits {
            *h *= 0.5;
        }
        for d in self.discordant.iter_mut().flatten() {
            *d *= 0.5;
        }
        for d in self.discordant_chains.iter_mut().flatten() {
            *d *= 0.5;
        }
    }
}

/// The workload's regimes, told apart by the share of references that some shadow hits
/// ([`REGIME_SHIFT`]).
#[derive(Debug, Default)]
struct Regimes {
    /// The share of references some shadow hit, averaged over [`REGIME_RATE_CAPACITIES`].
    rate: f64,
    /// The regime the workload is in.
    current: usize,
    /// The regimes known, in the order they were first entered.
    known: Vec<Regime>,
    /// References since the current regime was entered.
    stay: usize,
    changes: u64,
}

/// A regime: its mean rate (averaged over [`REGIME_MEAN_CAPACITIES`] while in it), and the duel
/// it left when the workload last moved out of it (none while the workload is in it).
#[derive(Debug)]
struct Regime {
    mean: f64,
    saved: Option<Duel>,
}

impl Regimes {
    /// Opens a regime whose mean is the rate now; returns its index.
    fn open(&mut self) -> usize {
        self.known.push(Regime {
            mean: self.rate,
            saved: None,
        });
        self.known.len() - 1
    }

    /// Counts a reference (`any`: some shadow hit it) with shadows of `cap` blocks; returns the
    /// regime left and the regime entered, if the workload has moved.
    fn observe(&mut self, any: bool, cap: usize) -> Option<(usize, usize)> {
        let cap = cap.max(REGIME_MIN_REFERENCES) as f64;
        self.rate += (f64::from(u8::from(any)) - self.rate) / (REGIME_RATE_CAPACITIES as f64 * cap);
        if self.known.is_empty() {
            self.open();
        }
        let slow = REGIME_MEAN_CAPACITIES as f64 * cap;
        let c = self.current;
        self.known[c].mean += (self.rate - self.known[c].mean) / slow;
        self.stay += 1;
        let far = |r: &Regime| (self.rate - r.mean).abs();
        if (self.stay as f64) < slow || far(&self.known[c]) <= REGIME_SHIFT {
            return None;
        }
        let next = if self.known.len() < REGIMES {
            self.open()
        } else {
            // The known regime nearest the rate now, if nearer than the current one: a rate
            // still on its way (from a regime entered half way through a move) is no move back.
            let j = (0..self.known.len())
                .filter(|&j| j != c)
                .min_by(|&a, &b| far(&self.known[a]).total_cmp(&far(&self.known[b])))
                .expect("another regime");
            if far(&self.known[j]) >= far(&self.known[c]) {
                return None;
            }
            j
        };
        self.current = next;
        self.stay = 0;
        self.changes += 1;
        Some((c, next))
    }
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
            admitted: HashSet::new(),
            shadows: Vec::new(),
            sample: 1,
            draw: 0,
            draw_seen: 0,
            draw_sampled: 0,
            shadow_blocks: shadow_blocks.max(1),
            half_life: half_life_capacities.max(1),
            door_window: door_window_capacities.max(1),
            cap_hint: 0,
            seen: 0.0,
            seen_sampled: 0.0,
            chain_hits: [0.0; MODES.len()],
            duel: Duel::new(Mode::Arc),
            last_ref: None,
            chain_sampled: false,
            at_root: false,
            depth: 0,
            decided: true,
            pending: Vec::new(),
            chain_head: Vec::new(),
            chain_len: 0,
            depth_seen: 0,
            depth_sampled: vec![0; MAX_SAMPLE_DEPTH],
            switches: 0,
            fixed: false,
            held: HashMap::new(),
            by_holders: (0..1 << MODES.len())
                .map(|_| LruCache::unbounded())
                .collect(),
            regimes: Regimes::default(),
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

    /// How many times the workload changed regime ([`REGIME_SHIFT`]).
    #[cfg(test)]
    pub fn regime_changes(&self) -> u64 {
        self.regimes.changes
    }

    /// Counts a reference toward the regime's rate (`any`: some shadow hit it); when the
    /// workload moves to another regime, keeps the duel of the one it leaves and takes up the
    /// one it enters (a regime entered for the first time starts from the duel as it is).
    fn regime(&mut self, any: bool) {
        if self.fixed || self.sample != 1 {
            return;
        }
        let Some((left, next)) = self.regimes.observe(any, self.shadows[0].cap) else {
            return;
        };
        let left_duel = match self.regimes.known[next].saved.take() {
            Some(d) => std::mem::replace(&mut self.duel, d),
            None => self.duel.clone(),
        };
        if left_duel.leader != self.duel.leader {
            self.switches += 1;
        }
        self.regimes.known[left].saved = Some(left_duel);
    }

    /// The real cache holds what the shadows vote for, block for block: they are exact.
    fn mirrors(&self) -> bool {
        self.sample == 1 && !self.shadows.is_empty()
    }

    /// Regroups every real block by the shadows that hold it (when the shadows are built), and
    /// has the shadows keep their evictions for it while the real cache mirrors them.
    fn remask(&mut self) {
        let mirrors = self.mirrors();
        for s in &mut self.shadows {
            s.log_evictions = mirrors;
            s.evicted.clear();
        }
        self.held.clear();
        for g in &mut self.by_holders {
            g.clear();
        }
        if !mirrors {
            return;
        }
        let real: Vec<BlockHash> = self.lru.oldest_first().copied().collect();
        for h in real {
            self.group(h);
        }
    }

    /// The index of the leader's shadow.
    fn leader_index(&self) -> Option<usize> {
        self.shadows.iter().position(|s| s.mode == self.duel.leader)
    }

    /// Puts the real block `h` in the group of the shadows that hold it, last.
    fn group(&mut self, h: BlockHash) {
        let m = self.holders(&h);
        if let Some(old) = self.held.insert(h, m) {
            self.by_holders[usize::from(old)].pop(&h);
        }
        self.by_holders[usize::from(m)].put(h, ());
    }

    /// Takes `h` out of its group (evicted or removed).
    fn ungroup(&mut self, h: &BlockHash) {
        if let Some(m) = self.held.remove(h) {
            self.by_holders[usize::from(m)].pop(h);
        }
    }

    /// The shadows that hold `h`, as a bit set in [`MODES`] order.
    fn holders(&self, h: &BlockHash) -> u8 {
        self.shadows
            .iter()
            .enumerate()
            .filter(|(_, s)| s.present.contains_key(h))
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// Moves the real block `h` to the group of the shadows `m`.
    fn regroup(&mut self, h: &BlockHash, m: u8) {
        let Some(old) = self.held.get_mut(h) else {
            return;
        };
        if *old != m {
            self.by_holders[usize::from(*old)].pop(h);
            *old = m;
            self.by_holders[usize::from(m)].put(*h, ());
        }
    }

    /// Each shadow's weight in the vote ([`VOTE_SIGMAS`]); a fixed leader's shadow alone votes.
    fn weights(&self) -> [f64; MODES.len()] {
        let mut w = [0.0; MODES.len()];
        let Some(l) = self.leader_index() else {
            return w;
        };
        for (i, w) in w.iter_mut().enumerate().take(self.shadows.len()) {
            *w = if i == l {
                1.0
            } else if self.fixed || self.duel.discordant[l][i] == 0.0 {
                // No reference has yet told the two apart (one hit where the other missed):
                // nothing to go on, so the leader decides (a small store that has read back
                // every block it was given keeps storing new ones, as ARC, the first leader,
                // does).
                0.0
            } else {
                let behind = (self.duel.hits[l] - self.duel.hits[i]).max(0.0);
                let z = behind / self.duel.discordant[l][i].max(1.0).sqrt() / VOTE_SIGMAS;
                (-0.5 * z * z).exp()
            };
        }
        w
    }

    /// The vote of the shadows `m` under the weights `w`.
    fn vote(w: &[f64; MODES.len()], m: u8) -> f64 {
        w.iter()
            .enumerate()
            .filter(|(i, _)| m & 1 << i != 0)
            .map(|(_, w)| w)
            .sum()
    }

    /// Brings the groups up to date after the shadows saw `h`: the blocks they evicted, and
    /// `h` itself.
    fn track(&mut self, h: &BlockHash) {
        for i in 0..self.shadows.len() {
            for v in std::mem::take(&mut self.shadows[i].evicted) {
                if let Some(&m) = self.held.get(&v) {
                    self.regroup(&v, m & !(1 << i));
                }
            }
        }
        if self.held.contains_key(h) {
            let m = self.holders(h);
            self.regroup(h, m);
        }
    }

    fn sampled(&self, h: &BlockHash) -> bool {
        if self.sample == 1 {
            return true;
        }
        let mut x = mix(h);
        if self.draw > 0 {
            // Another draw: the root's hash through a salted splitmix64 finalizer.
            x ^= u64::from(self.draw).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 31;
        }
        x.rotate_left(17) % self.sample == 0
    }

    fn reference(&mut self, h: BlockHash) {
        if self.at_root {
            // Chains are sampled whole, by one of their first blocks, so a shadow sees every
            // block of the chains it follows and can tell prefix hits.
            self.at_root = false;
            self.decided = false;
            self.pending.clear();
            self.chain_head.clear();
            self.chain_len = 0;
        }
        self.last_ref = Some(h);
        if self.shadows.is_empty() {
            return;
        }
        if self.sample > 1 {
            self.chain_len += 1;
            if self.chain_head.len() < MAX_SAMPLE_DEPTH {
                self.chain_head.push(h);
            }
        }
        if !self.decided {
            self.pending.push(h);
            if self.sample == 1 || self.pending.len() > self.depth {
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
        if self.sample > 1 {
            if let Some((last, head)) = self.chain_head.split_last() {
                self.depth_seen += self.chain_len;
                // Each block of the head decides one depth; the last decides the depths past
                // a short chain's end too.
                let last_sampled = self.sampled(last);
                for d in 0..MAX_SAMPLE_DEPTH {
                    let sampled = head.get(d).map_or(last_sampled, |b| self.sampled(b));
                    if sampled {
                        self.depth_sampled[d] += self.chain_len;
                    }
                }
            }
            let c = std::mem::take(&mut self.chain_hits);
            if c.iter().any(|&x| x != 0.0) {
                self.duel.count_chain(&c);
            }
        }
        self.chain_head.clear();
        self.chain_len = 0;
    }

    /// A reference of the current chain, once decided: counted toward the sampled share, and
    /// replayed on the shadows if they follow the chain.
    fn follow(&mut self, h: BlockHash) {
        if self.sample > 1 && self.count_share() {
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
        if self.sample > 1 {
            for (c, hit) in self.chain_hits.iter_mut().zip(hit) {
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

    /// Counts a reference toward the share of the traffic the sampled shadows see, and sizes
    /// the shadows to that share of the capacity (at most [`SHADOW_BLOCKS`]): a sampled
    /// shadow estimates the full cache when it holds the share of the capacity that its chains
    /// take of the traffic. Sampling by root gives 1 in `sample` of the chains, but not of the
    /// traffic when a few roots (shared system prompts) carry most of it.
    fn count_share(&mut self) -> bool {
        self.seen += 1.0;
        self.draw_seen += 1;
        if self.chain_sampled {
            self.seen_sampled += 1.0;
            self.draw_sampled += 1;
        }
        let cap_refs = self.cap_hint.max(1) as u64;
        let check =
            ((cap_refs as f64 * SAMPLE_DEPTH_CHECK) as u64).max(REGIME_MIN_REFERENCES as u64);
        if self.draw_seen % check == 0 || self.draw_seen >= cap_refs {
            let (starved, crowded) = self.misfit(self.draw_sampled, self.draw_seen);
            if starved || crowded {
                if let Some(d) = self.fitting_depth() {
                    // The chains are decided by their blocks at another depth from the next
                    // one on; the shadows start over, sized to the share measured there.
                    self.depth = d;
                    let share = self.depth_sampled[d] as f64 / self.depth_seen as f64;
                    self.restart_sample();
                    self.seen = self.cap_hint as f64;
                    self.seen_sampled = share * self.cap_hint as f64;
                    self.resize_shadows(self.shadow_cap());
                    return true;
                }
            }
            if self.draw_seen >= cap_refs {
                (self.draw_seen, self.draw_sampled) = (0, 0);
                if starved && self.draw + 1 < MAX_DRAWS {
                    // The next chain is drawn anew; the shadows start over on the new sample.
                    self.draw += 1;
                    self.restart_sample();
                    return true;
                }
            }
        }
        let cap = self.cap_hint.max(1) as f64;
        if self.seen >= self.half_life as f64 * cap {
            self.seen *= 0.5;
            self.seen_sampled *= 0.5;
        }
        let target = self.shadow_cap();
        let now = self.shadows[0].cap;
        if target.abs_diff(now) > now / 16 {
            self.resize_shadows(target);
        }
        false
    }

    /// The shallowest depth whose block, deciding which chains are sampled, gives the sampled
    /// chains a share of the traffic the shadows can hold (at most [`SHADOW_BLOCKS`] of the
    /// capacity) and not a starved one ([`RESAMPLE_BELOW`]), as measured since the depth was
    /// last chosen; `None` if it is the current one or none fits.
    fn fitting_depth(&self) -> Option<usize> {
        if self.depth_seen == 0 {
            return None;
        }
        (0..MAX_SAMPLE_DEPTH)
            .find(|&d| self.misfit(self.depth_sampled[d], self.depth_seen) == (false, false))
            .filter(|&d| d != self.depth)
    }

    /// Whether sampled chains taking `sampled` of `seen` references are *starved* (less than
    /// 1 / ([`RESAMPLE_BELOW`] x `2^k`) of them) and whether they are *crowded* (a share of
    /// the capacity larger than the shadows may hold).
    fn misfit(&self, sampled: u64, seen: u64) -> (bool, bool) {
        let starved = sampled * RESAMPLE_BELOW * self.sample < seen;
        let crowded =
            sampled as f64 * self.cap_hint as f64 > self.shadow_blocks as f64 * seen as f64;
        (starved, crowded)
    }

    /// The shadows start over on another sample (another draw or depth).
    fn restart_sample(&mut self) {
        self.draw_seen = 0;
        self.draw_sampled = 0;
        self.shadows.clear();
        self.rebuild_shadows();
    }

    /// The size of each shadow: the capacity, or with sampling its share of the capacity as
    /// [`Self::count_share`] measures it.
    fn shadow_cap(&self) -> usize {
        let cap = self.cap_hint.max(1) as f64;
        if self.sample == 1 {
            return self.cap_hint.max(1);
        }
        // One capacity of references at 1 in `sample` as the prior, until the trace says.
        let share = (self.seen_sampled + cap / self.sample as f64) / (self.seen + cap);
        ((cap * share).round() as usize).clamp(1, self.shadow_blocks)
    }

    fn resize_shadows(&mut self, shadow_cap: usize) {
        for s in &mut self.shadows {
            s.cap = shadow_cap;
            s.evict.set_capacity_hint(shadow_cap);
            s.door.set_window(self.door_window * shadow_cap);
        }
    }

    /// Switches to the shadow with the most recent hits if it leads the current leader by
    /// more than chance explains; on a tie keeps the current one.
    fn follow_the_leader(&mut self) {
        let Some(cur) = self.leader_index() else {
            return;
        };
        let hits = &self.duel.hits;
        // Both shadows see the same references, so their hit counts differ only on the
        // references where one hit and the other did not (McNemar's test): a difference of
        // SWITCH_SIGMAS standard deviations of those discordant counts is not chance.
        let best = (0..self.shadows.len())
            .filter(|&i| {
                let lead = hits[i] - hits[cur];
                if self.sample > 1 {
                    return lead
                        > SAMPLED_SWITCH_SIGMAS * self.duel.discordant_chains[i][cur].sqrt();
                }
                lead > SWITCH_SIGMAS * self.duel.discordant[i][cur].sqrt()
            })
            .max_by(|&a, &b| hits[a].total_cmp(&hits[b]));
        if let Some(best) = best {
            self.duel.leader = self.shadows[best].mode;
            self.switches += 1;
        }
    }

    fn rebuild_shadows(&mut self) {
        let cap = self.cap_hint.max(1);
        let mut sample = 1u64;
        while cap as u64 / sample > self.shadow_blocks as u64 {
            sample *= 2;
        }
        let same_sample = sample == self.sample;
        self.sample = sample;
        if !self.shadows.is_empty() && same_sample {
            // Same sampling, another size: keep what the shadows learned.
            self.resize_shadows(self.shadow_cap());
            return;
        }
        self.seen = 0.0;
        self.seen_sampled = 0.0;
        // Each depth's share starts again with the shadows (another draw, depth or rate).
        self.depth_seen = 0;
        self.depth_sampled.fill(0);
        let shadow_cap = self.shadow_cap();
        let w = self.door_window;
        self.shadows = MODES
            .iter()
            .map(|&m| Shadow::new(m, shadow_cap, w))
            .collect();
        self.chain_hits = [0.0; MODES.len()];
        self.duel = Duel::new(self.duel.leader);
        self.regimes = Regimes::default();
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
                self.chain_sampled = self.sample == 1;
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
                if let Some(&m) = self.held.get(&a.hash) {
                    self.by_holders[usize::from(m)].promote(&a.hash);
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
            // The group with the smallest vote first; among equal votes, blocks the leader
            // does not hold, then those fewer shadows hold.
            let w = self.weights();
            let lead = self.leader_index();
            let mut groups: Vec<(f64, bool, u32, usize)> = (0..self.by_holders.len())
                .filter(|&m| !self.by_holders[m].is_empty())
                .map(|m| {
                    let bits = m as u8;
                    let leads = lead.is_some_and(|l| bits & 1 << l != 0);
                    (Self::vote(&w, bits), leads, bits.count_ones(), m)
                })
                .collect();
            groups.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            for (.., m) in groups {
                if let Some(v) = pop_lru_unpinned(&mut self.by_holders[m], pinned) {
                    self.held.remove(&v);
                    self.lru.on_remove(&v);
                    self.arc.evicted(&v);
                    return Some(v);
                }
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
            self.regimes.changes
        )
    }

    fn set_capacity_hint(&mut self, blocks: usize) {
        self.cap_hint = blocks.max(1);
        self.arc.set_capacity_hint(self.cap_hint);
        self.door.set_window(self.door_window * self.cap_hint);
        self.rebuild_shadows();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{h, replay};
    use super::super::{Admit2, Lru};
    use super::*;

    /// A hot set of chains that fits, and long one-off scans that would flush it.
    fn hot_and_scans() -> Vec<Vec<u64>> {
        let mut reqs = Vec::new();
        let mut fresh = 1_000_000;
        for i in 0..3000u64 {
            if i % 6 == 5 {
                reqs.push((fresh..fresh + 100).collect());
                fresh += 100;
            } else {
                let c = (i * 7) % 25; // 25 chains of 6 blocks: 150 blocks
                reqs.push((c * 100..c * 100 + 6).collect());
            }
        }
        reqs
    }

    /// Chats in flight whose every turn extends the previous one with blocks seen once.
    fn conversations() -> Vec<Vec<u64>> {
        let mut chats: Vec<Vec<u64>> = (0..10).map(|c| vec![c * 1_000_000]).collect();
        let mut reqs = Vec::new();
        let mut next = 1;
        for i in 0..4000usize {
            let c = (i * 13 + i / 7) % chats.len();
            if chats[c].len() > 20 {
                chats[c] = vec![c as u64 * 1_000_000 + next];
                next += 1;
            }
            for _ in 0..2 {
                chats[c].push(c as u64 * 1_000_000 + next);
                next += 1;
            }
            reqs.push(chats[c].clone());
        }
        reqs
    }

    #[test]
    fn admits_on_second_sight_where_that_wins() {
        let reqs = hot_and_scans();
        let lru = replay(Box::new(Lru::new()), 200, &reqs);
        let admit = replay(Box::new(Admit2::new(4)), 200, &reqs);
        let ad = replay(Box::new(Adaptive::new()), 200, &reqs);
        eprintln!("lru {lru:.4} admit2 {admit:.4} adaptive {ad:.4}");
        assert!(
            admit > 2.0 * lru,
            "the workload favours admission: {admit} vs {lru}"
        );
        assert!(ad >= admit - 0.01, "adaptive {ad} < admit2 {admit}");
    }

    #[test]
    fn admits_everything_where_recency_wins() {
        let reqs = conversations();
        let lru = replay(Box::new(Lru::new()), 300, &reqs);
        let admit = replay(Box::new(Admit2::new(4)), 300, &reqs);
        let ad = replay(Box::new(Adaptive::new()), 300, &reqs);
        eprintln!("lru {lru:.4} admit2 {admit:.4} adaptive {ad:.4}");
        assert!(
            lru > admit + 0.05,
            "the workload favours recency: {lru} vs {admit}"
        );
        assert!(ad >= lru - 0.01, "adaptive {ad} < lru {lru}");
    }

    #[test]
    fn shadows_count_prefix_hits_and_keep_chains_whole() {
        let mut s = Shadow::new(Mode::Lru, 4, 4);
        let mut hits = 0;
        s.start_chain(true);
        for i in 1..=3 {
            hits += u32::from(s.reference(h(i)));
        }
        assert_eq!(hits, 0);
        s.start_chain(true);
        for i in 1..=3 {
            hits += u32::from(s.reference(h(i)));
        }
        assert_eq!(hits, 3, "a whole prefix is three hits");
        // A chain of 3 more: room is made from leaves only (3, then 2), so the root stays.
        s.start_chain(true);
        for i in 10..=12 {
            hits += u32::from(s.reference(h(i)));
        }
        let has = |s: &Shadow, i| s.present.contains_key(&h(i));
        assert!(
            has(&s, 1) && !has(&s, 2) && !has(&s, 3),
            "cut from the tail"
        );
        assert!((10..=12).all(|i| has(&s, i)));
        // A chain longer than the cache: its own blocks are never evicted for it, so its tail
        // is declined.
        s.start_chain(true);
        for i in 20..=24 {
            hits += u32::from(s.reference(h(i)));
        }
        assert!((20..=23).all(|i| has(&s, i)) && !has(&s, 24));
        // A present block after a missing one is no hit.
        s.start_chain(true);
        assert!(!s.reference(h(99)));
        assert!(!s.reference(h(20)), "present, after a missing block");
        assert_eq!(hits, 3, "no hit since the whole prefix");
    }

    /// Drives the policy as the index does, with one-block chains (so that prefix closure
    /// plays no part) and a real cache of `cap` blocks; returns the real cache's blocks.
    fn drive(a: &mut Adaptive, cap: usize, ids: &[u64], real: &mut HashSet<BlockHash>) {
        for &i in ids {
            let b = h(i);
            a.on_chain(None);
            if real.contains(&b) {
                a.on_access(&[Access {
                    hash: b,
                    inserted: false,
                }]);
                continue;
            }
            if !a.admit(&b) {
                continue;
            }
            while real.len() >= cap {
                let v = a.victim(&|x| *x == b).expect("a victim");
                assert!(real.remove(&v), "victim {v:?} is not stored");
            }
            real.insert(b);
            a.on_access(&[Access {
                hash: b,
                inserted: true,
            }]);
        }
    }

    /// A hot set of 150 blocks reused at random, with runs of one-off blocks between.
    fn hot_and_runs(n: usize, seed: u64) -> Vec<u64> {
        let mut x = seed;
        let mut out = Vec::new();
        let mut fresh = 1_000_000;
        while out.len() < n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (x >> 60) < 3 {
                out.extend(fresh..fresh + 40);
                fresh += 40;
            } else {
                out.push((x >> 33) % 150);
            }
        }
        out
    }

    /// The shadow of the candidate the real cache follows.
    fn leader_shadow(a: &Adaptive) -> &Shadow {
        &a.shadows[a.leader_index().expect("a leader")]
    }

    /// The index of a candidate's shadow.
    fn shadow_of(m: Mode) -> usize {
        MODES.iter().position(|&x| x == m).expect("a candidate")
    }

    /// Makes every shadow tie with every other, on 100 references that told them apart.
    fn tie(a: &mut Adaptive) {
        a.duel.hits = [500.0; MODES.len()];
        for d in a.duel.discordant.iter_mut().flatten() {
            *d = 100.0;
        }
    }

    /// Makes `leader` lead every other shadow by 100 deviations.
    fn lead_clearly(a: &mut Adaptive, leader: Mode) {
        let l = shadow_of(leader);
        a.duel.hits[l] = 1000.0;
        for i in 0..MODES.len() {
            if i != l {
                a.duel.discordant[l][i] = 100.0;
                a.duel.discordant[i][l] = 100.0;
            }
        }
    }

    #[test]
    fn a_shadow_weighs_by_how_many_deviations_it_trails_the_leader() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        let (arc, lru, door, admit2) = (
            shadow_of(Mode::Arc),
            shadow_of(Mode::Lru),
            shadow_of(Mode::LruDoor),
            shadow_of(Mode::Admit2),
        );
        assert_eq!(a.leader(), "arc");
        a.duel.hits[arc] = 510.0;
        // LRU: 10 hits behind on 100 discordant references, one deviation: exp(-(1/1)^2/2).
        a.duel.hits[lru] = 500.0;
        // LRU behind a doorkeeper: 20 ahead, short of the switching margin (30): as the leader.
        a.duel.hits[door] = 530.0;
        for i in [lru, door] {
            a.duel.discordant[arc][i] = 100.0;
            a.duel.discordant[i][arc] = 100.0;
        }
        // admit2: never told apart from ARC (no discordant reference): no vote.
        a.duel.hits[admit2] = 510.0;
        let w = a.weights();
        assert_eq!(w[arc], 1.0);
        assert!((w[lru] - (-0.5f64).exp()).abs() < 1e-12, "{}", w[lru]);
        assert_eq!(w[door], 1.0);
        assert_eq!(w[admit2], 0.0);
    }

    #[test]
    fn near_a_tie_a_block_is_stored_as_most_shadows_would() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        fill(&mut a, 0..100);
        assert_eq!(a.leader(), "arc");
        // No reference has told the shadows apart yet: the leader decides.
        a.on_chain(None);
        assert!(
            a.admit(&h(4999)),
            "with nothing to go on, ARC stores a first sight"
        );
        // All five tie on references that told them apart. A first sight in a full cache is
        // stored by ARC and LRU and turned away by the three that admit on second sight.
        tie(&mut a);
        a.on_chain(None);
        assert!(
            !a.admit(&h(5000)),
            "two of five shadows do not store a block"
        );
        // The same with ARC clearly ahead: its shadow alone decides.
        lead_clearly(&mut a, Mode::Arc);
        a.on_chain(None);
        assert!(a.admit(&h(5001)), "a clear leader stores it");
        assert_eq!(a.leader(), "arc");
    }

    #[test]
    fn a_block_half_of_the_vote_stores_is_stored() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        fill(&mut a, 0..100);
        // ARC and ARC behind a doorkeeper tie on references that told them apart; the others
        // have no vote. A first sight: ARC stores it, the doorkeeper turns it away.
        let (arc, door) = (shadow_of(Mode::Arc), shadow_of(Mode::ArcDoor));
        a.duel.discordant[arc][door] = 100.0;
        a.duel.discordant[door][arc] = 100.0;
        let w = a.weights();
        assert_eq!(w.iter().sum::<f64>(), 2.0);
        a.on_chain(None);
        assert!(a.admit(&h(6000)), "an even vote stores the block");
    }

    /// A full cache where `leader` and `other` tie and alone have a vote, block 3 held by the
    /// leader's shadow alone and block 7 by the other's: the same vote. Returns the victims.
    fn even_vote_victims(leader: Mode, other: Mode) -> [Option<BlockHash>; 2] {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        fill(&mut a, 0..100);
        let (l, o) = (shadow_of(leader), shadow_of(other));
        a.duel.leader = leader;
        a.duel.discordant[l][o] = 100.0;
        a.duel.discordant[o][l] = 100.0;
        for (i, s) in a.shadows.iter_mut().enumerate() {
            for (keeper, b) in [(l, h(3)), (o, h(7))] {
                if i != keeper {
                    s.present.remove(&b);
                    s.evicted.push(b);
                }
            }
        }
        a.track(&h(0));
        [a.victim(&|_| false), a.victim(&|_| false)]
    }

    #[test]
    fn on_an_even_vote_the_block_the_leader_dropped_stays() {
        // The leader's block goes last.
        assert_eq!(
            even_vote_victims(Mode::Arc, Mode::Lru),
            [Some(h(7)), Some(h(3))]
        );
        // Whichever shadow leads: ARC behind the doorkeeper's group comes before LRU's in the
        // groups' order, which alone would take its block first.
        assert_eq!(
            even_vote_victims(Mode::ArcDoor, Mode::Lru),
            [Some(h(7)), Some(h(3))]
        );
    }

    #[test]
    fn sampled_the_real_doorkeeper_remembers_four_capacities_of_offers() {
        // Above the shadows' size the real cache applies the leader's rule itself: behind a
        // doorkeeper, a block offered again after 3 capacities of other offers is stored.
        let mut a = Adaptive::with_constants(4, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(16);
        assert!(a.sample > 1 && !a.mirrors());
        a.duel.leader = Mode::LruDoor;
        a.fixed = true;
        for i in 0..16 {
            a.on_access(&[Access {
                hash: h(i),
                inserted: true,
            }]);
        }
        let b = h(100);
        a.on_chain(None);
        assert!(!a.admit(&b), "a first sight, the cache full: declined");
        for i in 0..48 {
            a.on_chain(None);
            assert!(!a.admit(&h(1_000 + i)));
        }
        a.on_chain(None);
        assert!(a.admit(&b), "seen 49 offers ago, within 4 capacities (64)");
    }

    #[test]
    fn near_a_tie_the_block_most_shadows_dropped_goes_first() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        fill(&mut a, 0..100);
        // As if the four other shadows had evicted block 7, and the leader's (ARC's) block 3.
        let drop = |a: &mut Adaptive| {
            let arc = shadow_of(Mode::Arc);
            for (i, s) in a.shadows.iter_mut().enumerate() {
                let dropped = if i == arc { h(3) } else { h(7) };
                s.present.remove(&dropped);
                s.evicted.push(dropped);
            }
            a.track(&h(0));
        };
        drop(&mut a);
        tie(&mut a);
        let mut b = Adaptive::new();
        b.set_capacity_hint(100);
        fill(&mut b, 0..100);
        drop(&mut b);
        lead_clearly(&mut b, Mode::Arc);
        assert_eq!(
            a.victim(&|_| false),
            Some(h(7)),
            "tied: the vote of four goes"
        );
        assert_eq!(
            b.victim(&|_| false),
            Some(h(3)),
            "a clear leader's victim goes"
        );
    }

    #[test]
    fn blocks_stored_while_the_shadows_sampled_are_grouped_when_they_become_exact() {
        // A byte bound's block count moves with the mean block size: from a sampled count
        // to an exact one, the shadows are built anew and every real block must be grouped,
        // or it is never a victim of the vote.
        let mut a = Adaptive::with_constants(64, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1024);
        assert!(!a.mirrors());
        fill(&mut a, 0..100);
        assert!(a.held.is_empty(), "no groups while sampling");
        a.set_capacity_hint(50);
        assert!(a.mirrors());
        let real: HashSet<BlockHash> = (0..100).map(h).collect();
        assert_eq!(
            a.held.keys().copied().collect::<HashSet<_>>(),
            real,
            "every real block grouped"
        );
        assert_eq!(
            a.by_holders[0].len(),
            100,
            "the new shadows hold none of them"
        );
        assert_eq!(
            a.victim(&|_| false),
            Some(h(0)),
            "the least recent goes first"
        );
    }

    #[test]
    fn the_real_cache_holds_what_the_leaders_shadow_holds() {
        for mode in ["lru", "lru+door", "arc", "arc+door", "admit2"] {
            let mut a = Adaptive::fixed(mode, DOOR_WINDOW_CAPACITIES);
            a.set_capacity_hint(100);
            let mut real = HashSet::new();
            drive(&mut a, 100, &hot_and_runs(20_000, 7), &mut real);
            let l = leader_shadow(&a);
            let held: HashSet<BlockHash> = l.present.keys().copied().collect();
            assert_eq!(
                real, held,
                "{mode}: the real cache is not the leader's shadow"
            );
            assert_eq!(
                a.held.keys().collect::<HashSet<_>>(),
                real.iter().collect::<HashSet<_>>(),
                "{mode}: every real block grouped"
            );
            assert_eq!(
                (a.leader(), a.switches()),
                (mode, 0),
                "a fixed leader stays"
            );
            assert!(
                a.shadows.iter().all(|s| s.evicted.is_empty()),
                "{mode}: evictions kept that no one takes"
            );
        }
    }

    /// Lends an [`Adaptive`] to an [`Index`](crate::index::Index) while the test keeps a
    /// handle to look at its shadows.
    #[derive(Debug, Clone)]
    struct Lent(std::sync::Arc<std::sync::Mutex<Adaptive>>);

    impl Lent {
        fn get(&self) -> std::sync::MutexGuard<'_, Adaptive> {
            self.0.lock().expect("adaptive")
        }
    }

    impl Policy for Lent {
        fn name(&self) -> &'static str {
            "lent"
        }
        fn on_access(&mut self, batch: &[Access]) {
            self.get().on_access(batch);
        }
        fn on_chain(&mut self, parent: Option<&BlockHash>) {
            self.get().on_chain(parent);
        }
        fn admit(&mut self, hash: &BlockHash) -> bool {
            self.get().admit(hash)
        }
        fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash> {
            self.get().victim(pinned)
        }
        fn on_remove(&mut self, hash: &BlockHash) {
            self.get().on_remove(hash);
        }
        fn set_capacity_hint(&mut self, blocks: usize) {
            self.get().set_capacity_hint(blocks);
        }
    }

    /// Sessions whose requests extend their last prompt by 3 blocks, between one-off
    /// chains of 6 blocks: most batches offer several new blocks.
    fn sessions_and_one_offs(n: usize, seed: u64) -> Vec<Vec<u64>> {
        let mut x = seed;
        let mut sessions: Vec<Vec<u64>> = vec![Vec::new(); 30];
        let mut fresh = 0;
        let mut reqs = Vec::new();
        while reqs.len() < n {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (x >> 61) < 3 {
                reqs.push((fresh..fresh + 6).collect());
                fresh += 6;
                continue;
            }
            let s = &mut sessions[((x >> 33) % 30) as usize];
            if s.len() > 30 {
                s.clear();
            }
            s.extend(fresh..fresh + 3);
            fresh += 3;
            reqs.push(s.clone());
        }
        reqs
    }

    /// Through the index, which reports a batch's insertions after its evictions: a block
    /// admitted after the batch's first eviction finds the cache full all the same (the
    /// blocks admitted before it count), so the real cache declines what the leader's shadow
    /// declined and holds exactly what that shadow holds.
    #[test]
    fn through_the_index_the_real_cache_holds_what_the_leaders_shadow_holds() {
        use super::super::tests::{replay_index, replay_into};
        let reqs = sessions_and_one_offs(3_000, 11);
        for mode in ["lru", "lru+door", "arc", "arc+door", "admit2"] {
            let lent = Lent(std::sync::Arc::new(std::sync::Mutex::new(Adaptive::fixed(
                mode,
                DOOR_WINDOW_CAPACITIES,
            ))));
            let index = replay_index(Box::new(lent.clone()), 100);
            replay_into(&index, &reqs);
            let ids: HashSet<u64> = reqs.iter().flatten().copied().collect();
            let real: HashSet<BlockHash> = ids
                .iter()
                .map(|&i| h(i))
                .filter(|b| index.contains(b))
                .collect();
            let a = lent.get();
            let held: HashSet<BlockHash> = leader_shadow(&a).present.keys().copied().collect();
            assert_eq!(real.len(), 100, "{mode}: the cache is full");
            assert_eq!(
                real.symmetric_difference(&held).count(),
                0,
                "{mode}: the real cache is not the leader's shadow"
            );
        }
    }

    #[test]
    fn after_a_switch_the_real_cache_converges_to_the_new_leader() {
        let mut a = Adaptive::fixed("lru", DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(100);
        let mut real = HashSet::new();
        drive(&mut a, 100, &hot_and_runs(5_000, 3), &mut real);
        a.duel.leader = Mode::Admit2;
        let held = |a: &Adaptive| -> HashSet<BlockHash> {
            leader_shadow(a).present.keys().copied().collect()
        };
        let differ = real.symmetric_difference(&held(&a)).count();
        assert!(differ > 20, "the two rules hold other blocks: {differ}");
        let admit2 = 1
            << MODES
                .iter()
                .position(|&m| m == Mode::Admit2)
                .expect("admit2");
        assert_eq!(
            a.held.values().filter(|&&m| m & admit2 == 0).count(),
            real.difference(&held(&a)).count(),
            "the real blocks the new leader does not hold are known"
        );
        drive(&mut a, 100, &hot_and_runs(20_000, 5), &mut real);
        assert_eq!(real, held(&a), "not converged");
    }

    #[test]
    fn the_leader_changes_only_on_a_lead_chance_does_not_explain() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        let (arc, lru) = (0, 2);
        assert_eq!(a.shadows[arc].mode, Mode::Arc);
        assert_eq!(a.shadows[lru].mode, Mode::Lru);
        a.duel.hits[arc] = 100.0;
        a.duel.hits[lru] = 130.0;
        // A lead of 30 on 200 discordant references: under 3 standard deviations (42).
        a.duel.discordant[arc][lru] = 200.0;
        a.duel.discordant[lru][arc] = 200.0;
        a.follow_the_leader();
        assert_eq!((a.duel.leader, a.switches), (Mode::Arc, 0));
        // The same lead on 90 discordant references: over 3 standard deviations (28.5).
        a.duel.discordant[arc][lru] = 90.0;
        a.duel.discordant[lru][arc] = 90.0;
        a.follow_the_leader();
        assert_eq!((a.duel.leader, a.switches), (Mode::Lru, 1));
        // A lead of exactly 3 standard deviations is not enough.
        a.duel.hits[arc] = 130.0 + 30.0;
        a.duel.discordant[arc][lru] = 100.0;
        a.duel.discordant[lru][arc] = 100.0;
        a.follow_the_leader();
        assert_eq!((a.duel.leader, a.switches), (Mode::Lru, 1));
    }

    /// Feeds `n` references to the regimes' rate, the `i`th hit by some shadow if `any(i)`;
    /// returns after the first change of regime, with how many references it took.
    fn rate_by(a: &mut Adaptive, any: impl Fn(usize) -> bool, n: usize) -> Option<usize> {
        let before = a.regime_changes();
        (1..=n).find(|&i| {
            a.regime(any(i));
            a.regime_changes() > before
        })
    }

    /// [`rate_by`] with every reference hit (`any`) or none.
    fn rate(a: &mut Adaptive, any: bool, n: usize) -> Option<usize> {
        rate_by(a, |_| any, n)
    }

    #[test]
    fn a_regime_that_comes_back_brings_back_its_duel() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        let span = REGIME_MIN_REFERENCES; // above the capacity
        // Nothing hits: one regime, where LRU behind the doorkeeper comes to lead.
        assert_eq!(
            rate(&mut a, false, 10 * span),
            None,
            "one regime while the rate holds"
        );
        a.duel.leader = Mode::LruDoor;
        lead_clearly(&mut a, Mode::LruDoor);
        a.duel.refs = 37; // since the last halving
        let door_duel = (a.duel.hits[shadow_of(Mode::LruDoor)], a.duel.discordant);
        // Every reference hits: once the rate has moved by REGIME_SHIFT (within a span), a
        // second regime, which starts from the duel as it is.
        let took = rate(&mut a, true, 10 * span).expect("a second regime");
        assert!(took <= span, "the second regime took {took} references");
        assert_eq!(
            a.duel.leader,
            Mode::LruDoor,
            "a new regime starts from the duel as it is"
        );
        // The rate goes on rising past the new regime's mean: no move back to the first.
        assert_eq!(rate(&mut a, true, 10 * span), None, "moved back on the way");
        // There LRU comes to lead.
        a.duel.leader = Mode::Lru;
        a.duel.hits = [0.0; MODES.len()];
        lead_clearly(&mut a, Mode::Lru);
        a.duel.refs = 5;
        let lru_duel = (a.duel.hits[shadow_of(Mode::Lru)], a.duel.discordant);
        let switches = a.switches();
        // Nothing hits again: back to the first regime, its duel and its leader, as soon as
        // the rate is nearer that regime's mean.
        let took = rate(&mut a, false, 10 * span).expect("back to the first regime");
        assert!(
            took <= span,
            "the first regime came back after {took} references"
        );
        assert_eq!(a.duel.leader, Mode::LruDoor);
        assert_eq!(
            a.switches(),
            switches + 1,
            "taking up another leader is a switch"
        );
        assert_eq!(
            (a.duel.hits[shadow_of(Mode::LruDoor)], a.duel.discordant),
            door_duel
        );
        assert_eq!(a.duel.refs, 37, "the halving goes on where it was");
        assert_eq!(rate(&mut a, false, 10 * span), None);
        // And to the second, which kept its own.
        rate(&mut a, true, 10 * span).expect("back to the second regime");
        assert_eq!(a.duel.leader, Mode::Lru);
        assert_eq!(
            (a.duel.hits[shadow_of(Mode::Lru)], a.duel.discordant),
            lru_duel
        );
        assert_eq!(a.regime_changes(), 3);
    }

    #[test]
    fn a_regime_is_kept_for_its_span_and_through_small_moves() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(100);
        let span = REGIME_MEAN_CAPACITIES * REGIME_MIN_REFERENCES;
        // From the start the rate climbs from nothing to everything, but the first regime
        // stands for its span.
        let took = rate(&mut a, true, 10 * span).expect("the rate moved by 1");
        assert!(took >= span, "left after {took} references");
        // A rate that moves by less than REGIME_SHIFT from its mean stays in its regime: a
        // quarter of the references missing, then half.
        assert_eq!(rate_by(&mut a, |i| i % 4 != 0, 10 * span), None);
        assert_eq!(rate_by(&mut a, |i| i % 2 != 0, 10 * span), None);
        assert_eq!(a.regime_changes(), 1);
    }

    #[test]
    fn sampled_and_fixed_candidates_keep_one_regime() {
        let mut a = Adaptive::fixed("arc", DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(100);
        rate(&mut a, true, 100_000);
        assert_eq!(rate(&mut a, false, 100_000), None);
        let mut a = Adaptive::with_constants(64, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1000);
        assert!(a.sample > 1);
        rate(&mut a, true, 100_000);
        assert_eq!(rate(&mut a, false, 100_000), None);
    }

    #[test]
    fn a_summary_names_the_rule_followed() {
        let mut a = Adaptive::fixed("lru+door", DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(10);
        assert_eq!(
            a.summary(),
            "following lru+door after 0 switches, 0 regime changes"
        );
        assert_eq!(Lru::new().summary(), "", "other policies have none");
    }

    #[test]
    fn without_a_capacity_a_door_admits_everything() {
        let mut a = Adaptive::fixed("lru+door", DOOR_WINDOW_CAPACITIES);
        a.on_chain(None);
        assert!(a.admit(&h(1)), "no capacity known: no room to spare");
    }

    #[test]
    fn a_removed_block_is_never_a_victim() {
        let mut a = Adaptive::fixed("lru", DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(4);
        fill(&mut a, 0..4);
        a.on_remove(&h(0));
        assert_eq!(a.victim(&|_| false), Some(h(1)), "the oldest block left");
    }

    /// Fills the real cache through `admit`, as the index does while there is room.
    fn fill(a: &mut Adaptive, ids: std::ops::Range<u64>) {
        for i in ids {
            a.on_chain(None);
            assert!(a.admit(&h(i)), "free room admits {i}");
            a.on_access(&[Access {
                hash: h(i),
                inserted: true,
            }]);
        }
    }

    #[test]
    fn while_there_is_room_everything_is_admitted_then_as_the_leader_does() {
        let mut a = Adaptive::fixed("admit2", DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(50);
        // admit2's shadow declines every first sight, but the real cache has room.
        fill(&mut a, 0..50);
        a.on_chain(None);
        assert!(
            !a.admit(&h(1000)),
            "full: a first sight is declined, as admit2 does"
        );
        a.on_chain(None);
        assert!(a.admit(&h(1000)), "its second sight is admitted");
    }

    #[test]
    fn above_the_exact_size_the_real_cache_applies_the_leaders_rule() {
        for (mode, first_sight) in [("admit2", false), ("lru+door", false), ("lru", true)] {
            let mut a = Adaptive::with_constants(64, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
            a.duel.leader = *MODES.iter().find(|m| m.name() == mode).expect("mode");
            a.fixed = true;
            a.set_capacity_hint(1024);
            assert!(a.sample > 1 && !a.mirrors());
            fill(&mut a, 0..1024);
            a.on_chain(None);
            assert_eq!(
                a.admit(&h(5000)),
                first_sight,
                "{mode}: a first sight when full"
            );
            a.on_chain(None);
            assert!(a.admit(&h(5000)), "{mode}: a second sight");
            assert!(a.held.is_empty(), "{mode}: groups only when mirroring");
            assert!(a.shadows.iter().all(|s| s.evicted.is_empty()), "{mode}");
        }
    }

    #[test]
    fn discordant_references_are_counted_and_everything_halves_each_half_life() {
        let mut a = Adaptive::new();
        a.set_capacity_hint(10);
        // Only the first shadow holds block 5: a reference of it is a hit there alone.
        assert!(a.shadows[0].insert(h(5), None));
        a.on_chain(None);
        a.reference(h(5));
        assert_eq!(a.duel.hits[0], 1.0);
        assert_eq!(
            (a.duel.discordant[0][1], a.duel.discordant[1][0]),
            (1.0, 1.0)
        );
        assert_eq!(a.duel.discordant[1][2], 0.0, "both missed");
        // A half-life is 4 capacities of references: the 40th halves the counts.
        a.duel.refs = 4 * 10 - 1;
        a.duel.discordant_chains[0][1] = 2.0; // as sampled shadows would have counted
        a.on_chain(None);
        a.reference(h(99));
        assert_eq!(a.duel.refs, 0);
        assert_eq!(a.duel.hits[0], 0.5);
        assert_eq!(a.duel.discordant[0][1], 0.5);
        assert_eq!(a.duel.discordant_chains[0][1], 1.0);
    }

    #[test]
    fn a_door_shadow_admits_first_sights_only_while_it_has_room() {
        let mut s = Shadow::new(Mode::LruDoor, 4, 4);
        for i in 0..4 {
            s.start_chain(true);
            s.reference(h(i));
        }
        assert_eq!(s.present.len(), 4, "room: first sights stored");
        s.start_chain(true);
        s.reference(h(10));
        assert!(
            !s.present.contains_key(&h(10)),
            "full: a first sight is declined"
        );
        s.start_chain(true);
        s.reference(h(10));
        assert!(s.present.contains_key(&h(10)), "a second sight is stored");
        // Without a door, first sights are stored when full too.
        let mut s = Shadow::new(Mode::Lru, 2, 4);
        for i in 0..3 {
            s.start_chain(true);
            s.reference(h(i));
        }
        assert!(s.present.contains_key(&h(2)) && s.present.len() == 2);
    }

    #[test]
    fn a_present_block_after_a_declined_one_stays_in_the_shadows_order() {
        let mut s = Shadow::new(Mode::Admit2, 2, 4);
        let offer = |s: &mut Shadow, ids: &[u64]| {
            s.start_chain(true);
            for &i in ids {
                s.reference(h(i));
            }
        };
        offer(&mut s, &[1]);
        offer(&mut s, &[1]);
        assert!(
            s.present.contains_key(&h(1)),
            "admitted on its second sight"
        );
        // 9 is declined (a first sight), so 1 after it is not reached: nothing happens to it.
        offer(&mut s, &[9, 1]);
        for i in [20, 21, 22] {
            offer(&mut s, &[i]);
            offer(&mut s, &[i]);
        }
        assert!(
            !s.present.contains_key(&h(1)),
            "1 was still in the order and aged out"
        );
        assert_eq!(s.present.len(), 2);
    }

    /// Offers a chain of `n` blocks from `root` (fresh blocks after it, from `next`).
    fn offer_chain(a: &mut Adaptive, root: u64, next: &mut u64, n: u64) {
        a.on_chain(None);
        a.admit(&h(root));
        for _ in 1..n {
            a.admit(&h(*next));
            *next += 1;
        }
    }

    #[test]
    fn a_draw_that_samples_no_traffic_is_drawn_again() {
        let mut a = Adaptive::with_constants(256, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1024);
        assert_eq!((a.sample, a.draw), (4, 0));
        // All the traffic is one block (a shared system prompt read again and again, so no
        // block below it can decide the sample instead) that the first draw does not sample,
        // and that a later one does.
        let mut probe = Adaptive::with_constants(256, 4, 4);
        probe.set_capacity_hint(1024);
        let mut sampled_in = |draw, i| {
            probe.draw = draw;
            probe.sampled(&h(i))
        };
        let root = (0..100_000)
            .find(|&i| !sampled_in(0, i) && sampled_in(1, i))
            .expect("a root the second draw samples");
        let mut next = 1_000_000;
        // One capacity of references (1,024) without a sampled one: drawn again.
        for _ in 0..=1024 {
            offer_chain(&mut a, root, &mut next, 1);
        }
        assert_eq!(
            a.draw, 1,
            "drawn again after a capacity of unsampled traffic"
        );
        assert!(a.sampled(&h(root)));
        // Now the shadows see the traffic, and the draw stays.
        for _ in 0..4 * 1024 {
            offer_chain(&mut a, root, &mut next, 1);
        }
        assert_eq!((a.draw, a.depth), (1, 0));
        assert!(a.seen_sampled > 0.0 && !a.shadows[0].present.is_empty());
        // Traffic that no draw samples stops the draws at MAX_DRAWS.
        let mut b = Adaptive::with_constants(256, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        b.set_capacity_hint(1024);
        let never = (0..100_000)
            .find(|&i| {
                (0..MAX_DRAWS).all(|d| {
                    b.draw = d;
                    !b.sampled(&h(i))
                })
            })
            .expect("a root no draw samples");
        b.draw = 0;
        for _ in 0..(MAX_DRAWS as usize + 2) * 1024 {
            offer_chain(&mut b, never, &mut next, 1);
        }
        assert_eq!((b.draw, b.depth), (MAX_DRAWS - 1, 0));
    }

    #[test]
    fn the_depth_is_chosen_within_an_eighth_of_a_capacity() {
        // 1 in 4 of a 10,000-block cache: an eighth of a capacity is 1,250 references.
        let mut a = Adaptive::with_constants(3000, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(10_000);
        assert_eq!(a.sample, 4);
        let root = (0..)
            .find(|&i| !a.sampled(&h(i)))
            .expect("a root not sampled");
        let mut next = 1_000_000;
        for _ in 0..150 {
            offer_chain(&mut a, root, &mut next, 8);
        }
        assert_eq!(a.depth, 0, "1,200 references: not checked yet");
        for _ in 0..10 {
            offer_chain(&mut a, root, &mut next, 8);
        }
        assert_eq!(
            a.depth, 1,
            "checked at 1,250 references, long before a capacity"
        );
        // The shadows start over sized to the share measured at that depth, about 1 in 4.
        let cap = a.shadows[0].cap;
        assert!((2000..=2900).contains(&cap), "shadows of {cap} blocks");
        // Each depth's share counted so far was at 1 in 4: at another rate it starts again.
        offer_chain(&mut a, root, &mut next, 8);
        assert!(a.depth_seen > 0);
        a.set_capacity_hint(20_000);
        assert_eq!((a.sample, a.depth_seen), (8, 0));
    }

    #[test]
    fn a_root_that_carries_the_traffic_is_sampled_below_it() {
        // 1 in 4 of a 1,000-block cache, shadows of at most 300 blocks.
        let fresh = || {
            let mut a = Adaptive::with_constants(300, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
            a.set_capacity_hint(1000);
            assert_eq!((a.sample, a.depth), (4, 0));
            a
        };
        let probe = fresh();
        let sampled_root = (0..)
            .find(|&i| probe.sampled(&h(i)))
            .expect("a sampled root");
        let other_root = (0..)
            .find(|&i| !probe.sampled(&h(i)))
            .expect("another root");
        for (root, why) in [(sampled_root, "all of it"), (other_root, "none of it")] {
            // Every chain starts with the same block (a system prompt, as in Mooncake's
            // conversation trace): sampled by it, the shadows see all of the traffic (more than
            // 300 blocks' share of the capacity) or none of it.
            let mut a = fresh();
            let mut next = 1_000_000;
            for _ in 0..200 {
                offer_chain(&mut a, root, &mut next, 8);
            }
            assert_eq!(
                (a.depth, a.draw),
                (1, 0),
                "with a root that samples {why}, chains are decided by their second block"
            );
            for _ in 0..2000 {
                offer_chain(&mut a, root, &mut next, 8);
            }
            assert_eq!(a.depth, 1, "{why}: the depth stays");
            let share = a.seen_sampled / a.seen;
            assert!(
                (0.18..0.32).contains(&share),
                "{why}: the shadows see {share:.3} of the traffic, about 1 in 4"
            );
            let cap = a.shadows[0].cap;
            assert!((190..=300).contains(&cap), "{why}: shadows of {cap} blocks");
            // A followed chain is seen whole, its shared root included.
            let s = &a.shadows[0];
            assert!(s.present.contains_key(&h(root)), "{why}: the root is held");
            let last = h(next - 1);
            if a.sampled(&last) {
                assert!(
                    s.present.contains_key(&h(next - 7)),
                    "{why}: its first fresh block"
                );
            }
        }
        // A chain is decided by its block at the depth, and one shorter than the depth by its
        // last block; the shadows see its blocks once it is decided.
        let (yes, no) = (
            (10..)
                .find(|&x| probe.sampled(&h(x)))
                .expect("a sampled block"),
            (10..).find(|&x| !probe.sampled(&h(x))).expect("another"),
        );
        for (fourth, sampled) in [(yes, true), (no, false)] {
            let mut a = fresh();
            a.depth = 3;
            a.on_chain(None);
            for x in 2_000_000..2_000_003 {
                a.admit(&h(x));
            }
            assert!(!a.decided, "three blocks of a chain decided by its fourth");
            assert!(a.shadows[0].present.is_empty(), "not yet seen");
            a.admit(&h(fourth));
            assert!(a.decided);
            assert_eq!(a.chain_sampled, sampled, "decided by its fourth block");
            let seen = a.shadows[0].present.contains_key(&h(2_000_000));
            assert_eq!(seen, sampled, "its first block seen once it is decided");
        }
        let mut a = fresh();
        a.depth = 3;
        a.on_chain(None);
        a.admit(&h(yes));
        a.admit(&h(no));
        assert!(!a.decided, "two blocks of a chain decided by its fourth");
        a.on_chain(None);
        assert!(a.decided);
        assert_eq!(
            a.chain_sampled,
            a.sampled(&h(no)),
            "decided by its last block"
        );
    }

    #[test]
    fn sampled_shadows_are_sized_to_their_share_of_the_traffic() {
        let mut a = Adaptive::with_constants(256, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1024);
        assert_eq!((a.sample, a.shadows[0].cap), (4, 256), "1 in 4 at first");
        let sampled_root = (0..).find(|&i| a.sampled(&h(i))).expect("a sampled root");
        let other_root = (0..).find(|&i| !a.sampled(&h(i))).expect("another root");
        // One chain in eight hangs off a sampled root, the rest off one that is not (a
        // shared system prompt): the shadows see 1/8 of the traffic, not 1/4.
        let mut next = 1_000_000;
        for r in 0..4000 {
            let root = if r % 8 == 0 { sampled_root } else { other_root };
            offer_chain(&mut a, root, &mut next, 8);
        }
        let cap = a.shadows[0].cap;
        assert!(
            (110..=160).contains(&cap),
            "shadows of {cap} blocks for 1/8 of a 1,024-block cache"
        );
        assert!(a.shadows.iter().all(|s| s.cap == cap));
        // All the traffic sampled: the shadows grow to their bound, not to the capacity.
        for _ in 0..4000 {
            offer_chain(&mut a, sampled_root, &mut next, 8);
        }
        let cap = a.shadows[0].cap;
        assert!(
            (240..=256).contains(&cap),
            "{cap}: up to the shadow size (within the 1/16 that resizes), not the capacity"
        );
    }

    /// Shadows sampling 1 in 16 chains, and a sampled chain of 5 blocks that only the first
    /// shadow (ARC, the leader) holds.
    fn sampled_with_a_chain_arc_holds() -> (Adaptive, Vec<BlockHash>) {
        let mut a = Adaptive::with_constants(64, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1024);
        assert_eq!(a.sample, 16);
        let root = (0..).find(|&i| a.sampled(&h(i))).expect("a sampled root");
        let chain: Vec<BlockHash> = std::iter::once(h(root))
            .chain((1..5).map(|i| h(1_000_000 + i)))
            .collect();
        let mut parent = None;
        for &b in &chain {
            assert!(a.shadows[0].insert(b, parent));
            parent = Some(b);
        }
        (a, chain)
    }

    /// The engine reads `blocks` (hits of the real cache).
    fn read(a: &mut Adaptive, blocks: &[BlockHash]) {
        for &b in blocks {
            a.on_access(&[Access {
                hash: b,
                inserted: false,
            }]);
        }
    }

    #[test]
    fn a_sampled_duel_counts_a_chain_as_one_observation() {
        let (mut a, chain) = sampled_with_a_chain_arc_holds();
        a.on_chain(None);
        read(&mut a, &chain);
        a.on_chain(None); // the chain ends
        assert_eq!(a.duel.hits[0], 5.0);
        assert_eq!(a.duel.discordant[0][1], 5.0, "five discordant references");
        assert_eq!(
            (
                a.duel.discordant_chains[0][1],
                a.duel.discordant_chains[1][0]
            ),
            (25.0, 25.0),
            "one chain, 5 hits apart"
        );
        assert_eq!(a.duel.discordant_chains[1][2], 0.0);
        // A lead of 30 that per reference would be 3.2 standard deviations (90 discordant
        // references) but is 1.5 of the chains' (400): no switch.
        let (arc, lru) = (0, 2);
        a.duel.hits[arc] = 100.0;
        a.duel.hits[lru] = 130.0;
        a.duel.discordant[arc][lru] = 90.0;
        a.duel.discordant[lru][arc] = 90.0;
        a.duel.discordant_chains[arc][lru] = 400.0;
        a.duel.discordant_chains[lru][arc] = 400.0;
        a.follow_the_leader();
        assert_eq!((a.duel.leader, a.switches), (Mode::Arc, 0));
        // Over 2 of the chains' standard deviations (200: 28.3): a switch.
        a.duel.discordant_chains[arc][lru] = 200.0;
        a.duel.discordant_chains[lru][arc] = 200.0;
        a.follow_the_leader();
        assert_eq!((a.duel.leader, a.switches), (Mode::Lru, 1));
    }

    #[test]
    fn a_chain_continued_after_its_prefix_is_still_one_observation() {
        // An engine reads a chain's cached prefix, then offers the rest after its last block:
        // one chain, so one observation of the sampled duel, not one per call.
        let (mut a, chain) = sampled_with_a_chain_arc_holds();
        a.on_chain(None);
        read(&mut a, &chain[..3]);
        a.on_chain(Some(&chain[2])); // the same chain goes on
        read(&mut a, &chain[3..]);
        a.on_chain(None); // the chain ends
        assert_eq!(a.duel.hits[0], 5.0);
        assert_eq!(
            a.duel.discordant_chains[0][1], 25.0,
            "one chain 5 hits apart (3 and 2 apart, as two, would be 13)"
        );
    }

    #[test]
    fn a_chain_offered_after_another_parent_is_a_new_one() {
        // Exact shadows: a chain that goes on after a block other than the last one seen is
        // not the chain the shadows were following: no prefix hits on it, but every offer is
        // still seen.
        let mut a = Adaptive::new();
        a.set_capacity_hint(64);
        assert_eq!(a.sample, 1);
        let (x0, x1) = (h(1), h(2));
        assert!(a.shadows[0].insert(x0, None));
        assert!(a.shadows[0].insert(x1, Some(x0)));
        a.on_chain(None);
        read(&mut a, &[x0, x1]);
        assert_eq!(a.duel.hits[0], 2.0);
        a.on_chain(Some(&h(999)));
        read(&mut a, &[x0]);
        assert_eq!(
            a.duel.hits[0], 2.0,
            "not a prefix hit: the chain did not start here"
        );
        let new = h(3);
        a.admit(&new);
        assert!(
            a.shadows[2].present.contains_key(&new),
            "LRU's shadow saw the offer"
        );

        // Sampled shadows: the jump ends the chain being followed, one observation.
        let (mut a, chain) = sampled_with_a_chain_arc_holds();
        a.on_chain(None);
        read(&mut a, &chain);
        a.on_chain(Some(&h(2_000_000)));
        assert_eq!(
            a.duel.discordant_chains[0][1], 25.0,
            "the chain ended at the jump"
        );
    }

    #[test]
    fn large_caches_sample_whole_chains() {
        let mut a = Adaptive::with_constants(64, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1024);
        assert_eq!(a.sample, 16);
        assert_eq!(a.shadows[0].cap, 64);
        for c in 0..400u64 {
            a.on_chain(None);
            for i in 0..5 {
                a.admit(&h(c * 10 + i));
            }
        }
        let present = &a.shadows[0].present;
        assert!(!present.is_empty());
        let sampled = (0..400u64).filter(|c| a.sampled(&h(c * 10))).count();
        assert!(
            (10..50).contains(&sampled),
            "{sampled} of 400 chains sampled at 1 in 16"
        );
        for c in 0..400u64 {
            if (0..5).any(|i| present.contains_key(&h(c * 10 + i))) {
                assert!(
                    a.sampled(&h(c * 10)),
                    "chain {c} followed but its root is not sampled"
                );
            }
        }
    }
}
