//! With exact shadows the real cache mirrors them: each real block grouped by the shadows
//! that hold it, stored and evicted as their weighted vote says.

use lru::LruCache;

use super::super::{Map, pop_lru_unpinned};
use super::duel::Regimes;
use super::shadow::{MODES, Shadow};
use super::{Adaptive, Kind};
use crate::key::BlockHash;

/// With exact shadows the real cache holds what the shadows vote for, each weighing
/// `exp(-(z / VOTE_SIGMAS)^2 / 2)` where `z` is how many standard deviations it trails the
/// leader by (0 for one no reference has told apart from it), so a clear leader's shadow is the
/// real cache and near a tie the close shadows' majority is. Why 1: of 0.5, 1, 1.5 and 2 it left
/// the fewest cells more than 0.005 below the best simple rule (7 of 216; eviction log, 2f3502f).
pub const VOTE_SIGMAS: f64 = 1.0;

/// What exact shadows keep beside them: the real blocks grouped by the shadows that hold
/// them, and the regimes of the workload with their duels.
#[derive(Debug)]
pub(super) struct Exact {
    /// For each real block, the shadows that hold it (bit `i` for the shadow of `MODES[i]`).
    pub(super) held: Map<BlockHash, u8>,
    /// The real blocks grouped by the shadows that hold them (indexed by that bit set), each
    /// group least recently used or regrouped first. The victim comes from the group with the
    /// smallest vote.
    pub(super) by_holders: Vec<LruCache<BlockHash, ()>>,
    /// The regime the workload is in, and the duel each other one had.
    pub(super) regimes: Regimes,
}

impl Exact {
    pub(super) fn new() -> Self {
        Exact {
            held: Map::default(),
            by_holders: (0..1 << MODES.len())
                .map(|_| LruCache::unbounded())
                .collect(),
            regimes: Regimes::default(),
        }
    }

    /// Puts the real block `h` in group `m`, last.
    fn group(&mut self, h: BlockHash, m: u8) {
        if let Some(old) = self.held.insert(h, m) {
            self.by_holders[usize::from(old)].pop(&h);
        }
        self.by_holders[usize::from(m)].put(h, ());
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

    /// The real block `h` was read: last in its group.
    pub(super) fn promote(&mut self, h: &BlockHash) {
        if let Some(&m) = self.held.get(h) {
            self.by_holders[usize::from(m)].promote(h);
        }
    }
}

/// The shadows that hold `h`, as a bit set in [`MODES`] order.
fn holders(shadows: &[Shadow], h: &BlockHash) -> u8 {
    shadows
        .iter()
        .enumerate()
        .filter(|(_, s)| s.present.contains_key(h))
        .fold(0, |m, (i, _)| m | 1 << i)
}

impl Adaptive {
    /// The real cache holds what the shadows vote for, block for block: they are exact.
    pub(super) fn mirrors(&self) -> bool {
        matches!(self.kind, Kind::Exact(_)) && !self.shadows.is_empty()
    }

    /// Regroups every real block by the shadows that hold it (when the shadows are built), and
    /// has the shadows keep their evictions for it while the real cache mirrors them.
    pub(super) fn remask(&mut self) {
        let mirrors = self.mirrors();
        for s in &mut self.shadows {
            s.log_evictions = mirrors;
            s.evicted.clear();
        }
        let Kind::Exact(e) = &mut self.kind else {
            return;
        };
        e.held.clear();
        for g in &mut e.by_holders {
            g.clear();
        }
        if !mirrors {
            return;
        }
        for h in self.lru.oldest_first() {
            e.group(*h, holders(&self.shadows, h));
        }
    }

    /// Puts the real block `h` in the group of the shadows that hold it, last.
    pub(super) fn group(&mut self, h: BlockHash) {
        if let Kind::Exact(e) = &mut self.kind {
            e.group(h, holders(&self.shadows, &h));
        }
    }

    /// Takes `h` out of its group (evicted or removed).
    pub(super) fn ungroup(&mut self, h: &BlockHash) {
        if let Kind::Exact(e) = &mut self.kind {
            if let Some(m) = e.held.remove(h) {
                e.by_holders[usize::from(m)].pop(h);
            }
        }
    }

    /// The shadows that hold `h`, as a bit set in [`MODES`] order.
    pub(super) fn holders(&self, h: &BlockHash) -> u8 {
        holders(&self.shadows, h)
    }

    /// Each shadow's weight in the vote ([`VOTE_SIGMAS`]); a fixed leader's shadow alone votes.
    pub(super) fn weights(&self) -> [f64; MODES.len()] {
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
    pub(super) fn vote(w: &[f64; MODES.len()], m: u8) -> f64 {
        w.iter()
            .enumerate()
            .filter(|(i, _)| m & 1 << i != 0)
            .map(|(_, w)| w)
            .sum()
    }

    /// Brings the groups up to date after the shadows saw `h`: the blocks they evicted, and
    /// `h` itself.
    pub(super) fn track(&mut self, h: &BlockHash) {
        let Kind::Exact(e) = &mut self.kind else {
            return;
        };
        for (i, s) in self.shadows.iter_mut().enumerate() {
            for v in std::mem::take(&mut s.evicted) {
                if let Some(&m) = e.held.get(&v) {
                    e.regroup(&v, m & !(1 << i));
                }
            }
        }
        if e.held.contains_key(h) {
            e.regroup(h, holders(&self.shadows, h));
        }
    }

    /// With exact shadows, the real block to evict: from the group with the smallest vote
    /// first; among equal votes, blocks the leader does not hold, then those fewer shadows
    /// hold; none unpinned, `None`.
    pub(super) fn mirror_victim(
        &mut self,
        pinned: &dyn Fn(&BlockHash) -> bool,
    ) -> Option<BlockHash> {
        let w = self.weights();
        let lead = self.leader_index();
        let Kind::Exact(e) = &mut self.kind else {
            return None;
        };
        let mut groups: Vec<(f64, bool, u32, usize)> = (0..e.by_holders.len())
            .filter(|&m| !e.by_holders[m].is_empty())
            .map(|m| {
                let bits = m as u8;
                let leads = lead.is_some_and(|l| bits & 1 << l != 0);
                (Self::vote(&w, bits), leads, bits.count_ones(), m)
            })
            .collect();
        groups.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for (.., m) in groups {
            if let Some(v) = pop_lru_unpinned(&mut e.by_holders[m], pinned) {
                e.held.remove(&v);
                return Some(v);
            }
        }
        None
    }
}
