//! Sampled shadows, above [`SHADOW_BLOCKS`](super::SHADOW_BLOCKS): which chains they follow (by one of a chain's
//! first blocks, drawn again when the draw starves them), and their size, the share of the
//! capacity their chains take of the traffic.

use super::super::door::mix;
use super::duel::REGIME_MIN_REFERENCES;
use super::shadow::MODES;
use super::{Adaptive, Kind};
use crate::key::BlockHash;

/// Sampled shadows draw their chains again (another salt) when, over a capacity's worth of
/// references, their chains take less than 1 / (`RESAMPLE_BELOW` x `2^k`) of the traffic. Why: a
/// few shared roots can carry all of it, and a draw that samples none leaves nothing to compare.
pub const RESAMPLE_BELOW: u64 = 8;

/// At most this many draws. Why: traffic no draw samples stays unsampled, not redrawn forever.
pub const MAX_DRAWS: u32 = 8;

/// Sampled shadows decide whether to follow a chain by its block at a depth, the shallowest
/// up to this one whose chains' share of the traffic fits their share of the capacity. Why: real
/// traces start every request with one system prompt, so a sample by root takes all the traffic
/// or none, and the shallowest fitting depth keeps a conversation's turns together.
pub const MAX_SAMPLE_DEPTH: usize = 64;

/// Whether the sampled chains' share fits is checked every this many capacities' worth of
/// references (at least [`REGIME_MIN_REFERENCES`]). Why 1/8: a shared root shows within the
/// first few hundred requests, so the depth is right within the first 10 % of a trace.
pub const SAMPLE_DEPTH_CHECK: f64 = 0.125;

/// What sampled shadows keep beside them, made anew with them.
#[derive(Debug)]
pub(super) struct Sampled {
    /// The shadows follow the chains whose deciding block's `mix`, salted with the draw, is 0
    /// modulo `sample` (a power of two, at least 2).
    pub(super) sample: u64,
    /// Every reference, and those of the sampled chains, halved every half-life of the real
    /// cache's references. Their ratio (the share of the traffic the shadows see, which chains
    /// sharing a root make far from 1 in `sample`) sizes the shadows.
    pub(super) seen: f64,
    pub(super) seen_sampled: f64,
    /// Each shadow's hits in the current chain so far.
    pub(super) chain_hits: [f64; MODES.len()],
    /// The current chain's first [`MAX_SAMPLE_DEPTH`] blocks and its length, and, since the
    /// depth was last chosen, the references of all chains and of those each depth would
    /// sample.
    pub(super) chain_head: Vec<BlockHash>,
    pub(super) chain_len: u64,
    pub(super) depth_seen: u64,
    pub(super) depth_sampled: Vec<u64>,
}

impl Sampled {
    pub(super) fn new(sample: u64) -> Self {
        Sampled {
            sample,
            seen: 0.0,
            seen_sampled: 0.0,
            chain_hits: [0.0; MODES.len()],
            chain_head: Vec::new(),
            chain_len: 0,
            depth_seen: 0,
            depth_sampled: vec![0; MAX_SAMPLE_DEPTH],
        }
    }

    /// A chain ends: its references count toward each depth's share of the traffic (each
    /// block of its head decides one depth; the last decides the depths past a short chain's
    /// end too).
    pub(super) fn end_chain(&mut self, draw: u32) {
        if let Some((last, head)) = self.chain_head.split_last() {
            self.depth_seen += self.chain_len;
            let last_sampled = is_sampled(self.sample, draw, last);
            for d in 0..MAX_SAMPLE_DEPTH {
                let sampled = head
                    .get(d)
                    .map_or(last_sampled, |b| is_sampled(self.sample, draw, b));
                if sampled {
                    self.depth_sampled[d] += self.chain_len;
                }
            }
        }
        self.chain_head.clear();
        self.chain_len = 0;
    }
}

/// Whether a chain decided by block `h` is one of the 1 in `sample` that draw `draw` follows.
fn is_sampled(sample: u64, draw: u32, h: &BlockHash) -> bool {
    if sample == 1 {
        return true;
    }
    let mut x = mix(h);
    if draw > 0 {
        // Another draw: the root's hash through a salted splitmix64 finalizer.
        x ^= u64::from(draw).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
    }
    x.rotate_left(17) % sample == 0
}

impl Adaptive {
    /// Whether the shadows follow a chain decided by block `h`.
    pub(super) fn sampled(&self, h: &BlockHash) -> bool {
        is_sampled(self.sample(), self.draw, h)
    }

    /// The sampled shadows' state (`None` with exact shadows).
    pub(super) fn sampling(&self) -> Option<&Sampled> {
        match &self.kind {
            Kind::Sampled(s) => Some(s),
            Kind::Exact(_) => None,
        }
    }

    fn sampling_mut(&mut self) -> Option<&mut Sampled> {
        match &mut self.kind {
            Kind::Sampled(s) => Some(s),
            Kind::Exact(_) => None,
        }
    }

    /// Counts a reference toward the share of the traffic the sampled shadows see, and sizes
    /// the shadows to that share of the capacity (at most [`SHADOW_BLOCKS`](super::SHADOW_BLOCKS)): a sampled
    /// shadow estimates the full cache when it holds the share of the capacity that its chains
    /// take of the traffic. Sampling by root gives 1 in `sample` of the chains, but not of the
    /// traffic when a few roots (shared system prompts) carry most of it. True when the
    /// shadows start over (another draw or depth).
    pub(super) fn count_share(&mut self) -> bool {
        let chain_sampled = self.chain_sampled;
        let Some(s) = self.sampling_mut() else {
            return false;
        };
        s.seen += 1.0;
        if chain_sampled {
            s.seen_sampled += 1.0;
        }
        self.draw_seen += 1;
        if chain_sampled {
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
                    let share = self
                        .sampling()
                        .map_or(0.0, |s| s.depth_sampled[d] as f64 / s.depth_seen as f64);
                    self.restart_sample();
                    let cap = self.cap_hint as f64;
                    if let Some(s) = self.sampling_mut() {
                        s.seen = cap;
                        s.seen_sampled = share * cap;
                    }
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
        let half_life = self.half_life as f64 * cap;
        if let Some(s) = self.sampling_mut() {
            if s.seen >= half_life {
                s.seen *= 0.5;
                s.seen_sampled *= 0.5;
            }
        }
        let target = self.shadow_cap();
        let now = self.shadows[0].cap;
        if target.abs_diff(now) > now / 16 {
            self.resize_shadows(target);
        }
        false
    }

    /// The shallowest depth whose block, deciding which chains are sampled, gives the sampled
    /// chains a share of the traffic the shadows can hold (at most [`SHADOW_BLOCKS`](super::SHADOW_BLOCKS) of the
    /// capacity) and not a starved one ([`RESAMPLE_BELOW`]), as measured since the depth was
    /// last chosen; `None` if it is the current one or none fits.
    pub(super) fn fitting_depth(&self) -> Option<usize> {
        let s = self.sampling()?;
        if s.depth_seen == 0 {
            return None;
        }
        (0..MAX_SAMPLE_DEPTH)
            .find(|&d| self.misfit(s.depth_sampled[d], s.depth_seen) == (false, false))
            .filter(|&d| d != self.depth)
    }

    /// Whether sampled chains taking `sampled` of `seen` references are *starved* (less than
    /// 1 / ([`RESAMPLE_BELOW`] x `2^k`) of them) and whether they are *crowded* (a share of
    /// the capacity larger than the shadows may hold).
    pub(super) fn misfit(&self, sampled: u64, seen: u64) -> (bool, bool) {
        let starved = sampled * RESAMPLE_BELOW * self.sample() < seen;
        let crowded =
            sampled as f64 * self.cap_hint as f64 > self.shadow_blocks as f64 * seen as f64;
        (starved, crowded)
    }

    /// The shadows start over on another sample (another draw or depth).
    pub(super) fn restart_sample(&mut self) {
        self.draw_seen = 0;
        self.draw_sampled = 0;
        self.shadows.clear();
        self.rebuild_shadows();
    }

    /// The size of each shadow: the capacity, or with sampling its share of the capacity as
    /// [`Self::count_share`] measures it.
    pub(super) fn shadow_cap(&self) -> usize {
        let cap = self.cap_hint.max(1) as f64;
        let Some(s) = self.sampling() else {
            return self.cap_hint.max(1);
        };
        // One capacity of references at 1 in `sample` as the prior, until the trace says.
        let share = (s.seen_sampled + cap / s.sample as f64) / (s.seen + cap);
        ((cap * share).round() as usize).clamp(1, self.shadow_blocks)
    }

    pub(super) fn resize_shadows(&mut self, shadow_cap: usize) {
        for s in &mut self.shadows {
            s.cap = shadow_cap;
            s.evict.set_capacity_hint(shadow_cap);
            s.door.set_window(self.door_window * shadow_cap);
        }
    }
}
