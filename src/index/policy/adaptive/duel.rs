//! The duel between the shadows (set dueling): their recent hits, the leader the real cache
//! follows and when it changes, and a duel per regime of the workload.

use super::shadow::{MODES, Mode};
use super::{Adaptive, Kind};

/// The leader changes when another shadow leads it by this many standard deviations of the
/// difference of their hits (McNemar's test on the references where one hit and the other missed).
/// Why 3: a chance lead of that size is rarer than 1 in 700, so the leader does not flap.
pub const SWITCH_SIGMAS: f64 = 3.0;

/// With sampled shadows (above [`SHADOW_BLOCKS`](super::SHADOW_BLOCKS)), the same margin over
/// the hits counted chain by chain (the sum over ended chains of the squared difference in each).
/// Why 2, not 3: a sampled chain's references hit or miss together, so a chain is one
/// observation and its deviation is larger; 1.5 to 2.5 measured the same (eviction log, 2f3502f).
pub const SAMPLED_SWITCH_SIGMAS: f64 = 2.0;

/// The share of references that some shadow hits, averaged (exponentially) over this many
/// capacities' worth of references: the *rate* that tells the workload's regimes apart
/// ([`REGIME_SHIFT`]). Why 1: a regime must show within the span a leader change takes.
pub const REGIME_RATE_CAPACITIES: usize = 1;

/// The capacity that sizes the rate's and a regime's spans counts as at least this many
/// references. Why: at a small cache a capacity of references is a handful of chats that hit
/// together, and the rate then moved between regimes on traces that have one.
pub const REGIME_MIN_REFERENCES: usize = 1000;

/// A regime's mean rate is averaged over this many capacities' worth of references in it, and
/// the workload stays in a regime at least this long. Why 2: phases last 3 to 5 capacities, and
/// at 4 a regime was left as late as the duel's leader changed.
pub const REGIME_MEAN_CAPACITIES: usize = 2;

/// The workload has entered another regime when the rate moves this far from the current
/// regime's mean and nearer the other's. Each of the [`REGIMES`] keeps its own duel, so a regime
/// that comes back brings back the rule that won in it. Why 0.3: phases' rates differ by 0.4 or
/// more (0.57-0.92 against 0.04-0.19); at 0.2 a steady trace changed regime 21 times.
pub const REGIME_SHIFT: f64 = 0.3;

/// How many regimes, each with its own duel, are kept ([`REGIME_SHIFT`]). Why 2: the workloads
/// measured alternate between two (chat and one-off prompts).
pub const REGIMES: usize = 2;

/// The duel between the shadows: their recent hits, what the differences between them vary
/// by, and the leader they chose. A regime the workload leaves keeps its duel ([`Regimes`]).
#[derive(Clone, Debug)]
pub(super) struct Duel {
    /// Each shadow's prefix hits (in [`MODES`] order), halved every half-life.
    pub(super) hits: [f64; MODES.len()],
    /// For each pair of shadows, the references on which exactly one of the two hit, halved
    /// with the hits: what the difference of their hits varies by.
    pub(super) discordant: [[f64; MODES.len()]; MODES.len()],
    /// With sampled shadows: for each pair of shadows the sum over chains of the square of the
    /// difference of their hits in the chain, halved with the hits: what the difference of
    /// their hits varies by when whole chains are the sampled units.
    pub(super) discordant_chains: [[f64; MODES.len()]; MODES.len()],
    /// References seen by the shadows since the last halving.
    pub(super) refs: usize,
    /// The shadow the real cache follows.
    pub(super) leader: Mode,
}

impl Duel {
    pub(super) fn new(leader: Mode) -> Self {
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
    pub(super) fn count(&mut self, hit: &[bool; MODES.len()]) {
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
    pub(super) fn count_chain(&mut self, c: &[f64; MODES.len()]) {
        for i in 0..MODES.len() {
            for j in 0..i {
                let d = (c[i] - c[j]) * (c[i] - c[j]);
                self.discordant_chains[i][j] += d;
                self.discordant_chains[j][i] += d;
            }
        }
    }

    /// Halves what the duel remembers (a half-life has passed).
    pub(super) fn halve(&mut self) {
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
pub(super) struct Regimes {
    /// The share of references some shadow hit, averaged over [`REGIME_RATE_CAPACITIES`].
    pub(super) rate: f64,
    /// The regime the workload is in.
    pub(super) current: usize,
    /// The regimes known, in the order they were first entered.
    pub(super) known: Vec<Regime>,
    /// References since the current regime was entered.
    pub(super) stay: usize,
    pub(super) changes: u64,
}

/// A regime: its mean rate (averaged over [`REGIME_MEAN_CAPACITIES`] while in it), and the duel
/// it left when the workload last moved out of it (none while the workload is in it).
#[derive(Debug)]
pub(super) struct Regime {
    pub(super) mean: f64,
    pub(super) saved: Option<Duel>,
}

impl Regimes {
    /// Opens a regime whose mean is the rate now; returns its index.
    pub(super) fn open(&mut self) -> usize {
        self.known.push(Regime {
            mean: self.rate,
            saved: None,
        });
        self.known.len() - 1
    }

    /// Counts a reference (`any`: some shadow hit it) with shadows of `cap` blocks; returns the
    /// regime left and the regime entered, if the workload has moved.
    pub(super) fn observe(&mut self, any: bool, cap: usize) -> Option<(usize, usize)> {
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

impl Adaptive {
    /// Counts a reference toward the regime's rate (`any`: some shadow hit it); when the
    /// workload moves to another regime, keeps the duel of the one it leaves and takes up the
    /// one it enters (a regime entered for the first time starts from the duel as it is).
    pub(super) fn regime(&mut self, any: bool) {
        if self.fixed {
            return;
        }
        let cap = self.shadows[0].cap;
        let Kind::Exact(e) = &mut self.kind else {
            return;
        };
        let Some((left, next)) = e.regimes.observe(any, cap) else {
            return;
        };
        let left_duel = match e.regimes.known[next].saved.take() {
            Some(d) => std::mem::replace(&mut self.duel, d),
            None => self.duel.clone(),
        };
        if left_duel.leader != self.duel.leader {
            self.switches += 1;
        }
        e.regimes.known[left].saved = Some(left_duel);
    }

    /// Switches to the shadow with the most recent hits if it leads the current leader by
    /// more than chance explains; on a tie keeps the current one.
    pub(super) fn follow_the_leader(&mut self) {
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
                if self.sample() > 1 {
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
}
