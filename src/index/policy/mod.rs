//! Eviction and admission policies, behind one trait.
//!
//! The index calls a policy with every access in *chain order* (a batch of `get_many` or
//! `put_many` is a request's block chain, root first), asks it whether to admit a block that is
//! not stored, and asks it for victims when the store is over its bound.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;
use crate::key::BlockHash;

mod adaptive;
mod admit2;
mod arc;
mod belady;
mod door;
mod lru;

pub use adaptive::{Adaptive, DOOR_WINDOW_CAPACITIES, SHADOW_BLOCKS};
pub use admit2::Admit2;
pub use arc::Arc as ArcPolicy;
pub use belady::{Belady, Oracle};
pub use door::Doorkeeper;
pub use lru::Lru;

/// The policies' maps and sets: hashbrown's keyed foldhash (the `lru` crate's default) in
/// place of std's SipHash, a fraction of its cost for the one word a [`BlockHash`] feeds it;
/// the default policy's shadows look keys up a few dozen times per access.
type Map<K, V> = std::collections::HashMap<K, V, ::lru::DefaultHasher>;
/// See [`Map`].
type Set<K> = std::collections::HashSet<K, ::lru::DefaultHasher>;

/// One access of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// The block.
    pub hash: BlockHash,
    /// True if the block was just stored, false if it was read (a hit) or touched.
    pub inserted: bool,
}

/// Decides which blocks stay.
pub trait Policy: Send + fmt::Debug {
    /// The policy's name, as configuration spells it.
    fn name(&self) -> &'static str;

    /// Records a batch of accesses in chain order (root first).
    fn on_access(&mut self, batch: &[Access]);

    /// A chain of accesses starts: the accesses and admissions that follow continue the chain
    /// after `parent` (a request's cached prefix ends there), or, with `None`, start at a
    /// chain's root (a get batch: a request's hit prefix). Lets a policy tell prefix hits from
    /// blocks that are present but unreachable. The default ignores it.
    fn on_chain(&mut self, parent: Option<&BlockHash>) {
        let _ = parent;
    }

    /// Whether a block that is not stored should be (admission). Called once per put of an
    /// absent block; the default admits everything.
    fn admit(&mut self, hash: &BlockHash) -> bool {
        let _ = hash;
        true
    }

    /// Chooses the next block to evict and forgets it, skipping blocks for which `pinned`
    /// returns true. `None` when every block is pinned or none is held.
    fn victim(&mut self, pinned: &dyn Fn(&BlockHash) -> bool) -> Option<BlockHash>;

    /// Forgets a block removed for another reason (removed by the user, found corrupt or
    /// deleted behind the store's back).
    fn on_remove(&mut self, hash: &BlockHash);

    /// One line on the policy's own state, for diagnostics (the adaptive policy names the
    /// rule it follows); empty by default.
    fn summary(&self) -> String {
        String::new()
    }

    /// The capacity in blocks, when known (sizes ghost lists).
    fn set_capacity_hint(&mut self, blocks: usize) {
        let _ = blocks;
    }
}

/// The policies that configuration can name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyKind {
    /// Least recently used, touching a batch in chain order.
    Lru,
    /// LRU that admits a block only on its second sight (a ghost list 4x the capacity
    /// remembers blocks seen once), as Dynamo's KVBM does.
    Admit2,
    /// ARC (adaptive replacement cache: a recency list and a frequency list whose split adapts
    /// to ghost hits), touching a batch deepest block first so a chain's root is its most
    /// recently used block.
    Arc,
    /// The default: evicts and admits as ARC, LRU, or either with admission on second sight,
    /// whichever small shadow caches show to be winning on the workload (`Adaptive`).
    /// docs/eviction.md has the figures.
    #[default]
    Adaptive,
}

impl PolicyKind {
    /// A fresh policy of this kind.
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new()),
            PolicyKind::Admit2 => Box::new(Admit2::new(4)),
            PolicyKind::Arc => Box::new(ArcPolicy::new()),
            PolicyKind::Adaptive => Box::new(Adaptive::new()),
        }
    }
}

impl FromStr for PolicyKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "lru" => Ok(PolicyKind::Lru),
            "admit2" | "lru-admit2" => Ok(PolicyKind::Admit2),
            "arc" => Ok(PolicyKind::Arc),
            "adaptive" => Ok(PolicyKind::Adaptive),
            _ => Err(Error::Config(format!(
                "unknown policy {s:?}; use adaptive, lru, admit2 or arc (belady: trace replay only)"
            ))),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Admit2 => "admit2",
            PolicyKind::Arc => "arc",
            PolicyKind::Adaptive => "adaptive",
        })
    }
}

/// Pops the least recently used unpinned key of `list`.
pub(crate) fn pop_lru_unpinned(
    list: &mut ::lru::LruCache<BlockHash, ()>,
    pinned: &dyn Fn(&BlockHash) -> bool,
) -> Option<BlockHash> {
    let h = *list.iter().rev().map(|(h, _)| h).find(|h| !pinned(h))?;
    list.pop(&h);
    Some(h)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashSet;

    pub(crate) fn h(i: u64) -> BlockHash {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        BlockHash(b)
    }

    /// Replays requests (lists of ids) with prefix-hit semantics through an [`Index`] with a
    /// block-count capacity, in the calls the store makes for `tierkv-bench --rw replay`: the
    /// hit prefix is read (`get_many`), the rest offered (`offer_many`).
    pub(crate) fn replay(policy: Box<dyn Policy>, cap: usize, reqs: &[Vec<u64>]) -> f64 {
        hit_ratio(&replay_counts(policy, cap, reqs).0)
    }

    /// The hit ratio of requests given as (hits, references) each.
    pub(crate) fn hit_ratio(counts: &[(usize, usize)]) -> f64 {
        let (hits, refs) = counts
            .iter()
            .fold((0, 0), |(h, r), &(h1, r1)| (h + h1, r + r1));
        hits as f64 / refs as f64
    }

    /// As [`replay`]: each request's hits and references, and the policy's summary at the end.
    pub(crate) fn replay_counts(
        policy: Box<dyn Policy>,
        cap: usize,
        reqs: &[Vec<u64>],
    ) -> (Vec<(usize, usize)>, String) {
        let index = replay_index(policy, cap);
        let counts = replay_into(&index, reqs);
        (counts, index.policy_summary())
    }

    /// The index the replays run: `cap` block files, evicting exactly at the bound.
    pub(crate) fn replay_index(policy: Box<dyn Policy>, cap: usize) -> crate::index::Index {
        let limits = crate::index::Limits {
            max_bytes: None,
            max_files: Some(cap as u64),
            high: 1.0,
            low: 1.0,
        };
        crate::index::Index::new(limits, policy)
    }

    /// Replays `reqs` into `index` as [`replay_counts`] does: each request's hits and
    /// references.
    pub(crate) fn replay_into(
        index: &crate::index::Index,
        reqs: &[Vec<u64>],
    ) -> Vec<(usize, usize)> {
        use crate::index::Offer;
        let mut counts = Vec::with_capacity(reqs.len());
        for r in reqs {
            let n = r.iter().take_while(|&&i| index.contains(&h(i))).count();
            counts.push((n, r.len()));
            index.record_hits(&r[..n].iter().map(|&i| h(i)).collect::<Vec<_>>());
            let rest: Vec<(BlockHash, u64)> = r[n..].iter().map(|&i| (h(i), 1)).collect();
            let after = n.checked_sub(1).map(|i| h(r[i]));
            let (offers, victims) = index.offer(&rest, false, after);
            index.drained(&victims); // the store unlinks them before writing
            for ((hh, _), o) in rest.iter().zip(offers) {
                if o == Offer::Reserved {
                    index.commit(hh, 1, o);
                }
            }
        }
        counts
    }

    /// As [`replay`], also giving the hit ratio of the requests from `from` on, and the
    /// policy's summary at the end.
    pub(crate) fn replay_split(
        policy: Box<dyn Policy>,
        cap: usize,
        reqs: &[Vec<u64>],
        from: usize,
    ) -> (f64, f64, String) {
        let (counts, summary) = replay_counts(policy, cap, reqs);
        (hit_ratio(&counts), hit_ratio(&counts[from..]), summary)
    }

    /// The reference simulation of tests/data/README.md, written without the index or the
    /// policies: per request, hits = the longest present prefix, then every block in order
    /// is touched (present) or stored (absent; with `admit2`, only on its second sight,
    /// remembered by a ghost LRU of 4x the capacity), evicting the least recently used
    /// block when full.
    pub(crate) fn reference(cap: usize, admit2: bool, reqs: &[Vec<u64>]) -> f64 {
        use std::collections::{BTreeMap, HashMap};
        let mut tick = 0u64;
        let mut at: HashMap<u64, u64> = HashMap::new();
        let mut order: BTreeMap<u64, u64> = BTreeMap::new();
        let mut ghost_at: HashMap<u64, u64> = HashMap::new();
        let mut ghost: BTreeMap<u64, u64> = BTreeMap::new();
        let (mut hits, mut refs) = (0usize, 0usize);
        for r in reqs {
            hits += r.iter().take_while(|i| at.contains_key(i)).count();
            refs += r.len();
            for &id in r {
                tick += 1;
                if let Some(t) = at.insert(id, tick) {
                    order.remove(&t);
                    order.insert(tick, id);
                    continue;
                }
                at.remove(&id);
                if admit2 {
                    match ghost_at.remove(&id) {
                        Some(t) => {
                            ghost.remove(&t);
                        }
                        None => {
                            ghost_at.insert(id, tick);
                            ghost.insert(tick, id);
                            while ghost.len() > 4 * cap {
                                let (t, g) = ghost.pop_first().expect("non-empty");
                                ghost_at.remove(&g);
                                let _ = t;
                            }
                            continue;
                        }
                    }
                }
                if at.len() == cap {
                    let (_, old) = order.pop_first().expect("full");
                    at.remove(&old);
                }
                at.insert(id, tick);
                order.insert(tick, id);
            }
        }
        hits as f64 / refs as f64
    }

    /// The shared Mooncake trace, as lists of ids.
    pub(crate) fn mooncake() -> Vec<Vec<u64>> {
        read_trace(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/mooncake_synthetic_trace.jsonl"
        ))
    }

    /// Mooncake's conversation trace (one hour of a real chat service: 12,031 requests, every
    /// one behind the same system-prompt block), as lists of ids: the one real
    /// trace the rules' table below was measured on.
    pub(crate) fn mooncake_conversation() -> Vec<Vec<u64>> {
        read_trace(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/mooncake_conversation_trace.jsonl"
        ))
    }

    /// A trace file in the shared format, as lists of ids.
    pub(crate) fn read_trace(path: &str) -> Vec<Vec<u64>> {
        parse_trace(&std::fs::read_to_string(path).expect("trace"))
    }

    /// A trace in the shared format (JSON lines with `hash_ids`), as lists of ids.
    pub(crate) fn parse_trace(text: &str) -> Vec<Vec<u64>> {
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json line");
                v["hash_ids"]
                    .as_array()
                    .expect("hash_ids")
                    .iter()
                    .map(|x| x.as_u64().expect("id"))
                    .collect()
            })
            .collect()
    }

    // Whole-trace replays: minutes unoptimised, seconds optimised. tools/test.sh runs them
    // with --release.
    #[test]
    #[cfg_attr(
        debug_assertions,
        ignore = "optimised only: cargo test --release --lib policy"
    )]
    fn trace_hit_ratios() {
        let reqs = mooncake();
        let round = |x: f64| (x * 1e4).round() / 1e4;
        // (capacity, LRU and admit-on-second-sight from tests/data/README.md)
        for (cap, lru_ref, admit_ref) in [
            (1000, 0.0825, 0.0830),
            (4000, 0.2302, 0.2373),
            (16000, 0.5297, 0.4873),
        ] {
            // The harness reproduces the published reference figures...
            assert_eq!(
                round(reference(cap, false, &reqs)),
                lru_ref,
                "reference lru at {cap}"
            );
            assert_eq!(
                round(reference(cap, true, &reqs)),
                admit_ref,
                "reference admit2 at {cap}"
            );
            // ... and the index's policies, which keep chains prefix-closed (cut from the
            // tail), do no worse than the plain rules they refine.
            let [lru, arc, admit] = simple_from(cap, &reqs, 0);
            let adaptive = replay(Box::new(Adaptive::new()), cap, &reqs);
            eprintln!(
                "cap {cap}: lru {lru:.4} admit2 {admit:.4} arc {arc:.4} adaptive {adaptive:.4}"
            );
            assert!(
                adaptive >= lru.max(admit),
                "adaptive at {cap}: {} < max({}, {})",
                round(adaptive),
                round(lru),
                round(admit)
            );
            // The target on the one real trace, as the shapes test reads it: at least
            // the best of the three rules, or within 0.005 of its hit ratio (ARC leads at
            // 1,000 and 16,000 blocks; docs/eviction.md, "Hit ratios").
            assert!(
                adaptive >= arc - 0.005,
                "adaptive at {cap}: {} more than 0.005 below arc's {}",
                round(adaptive),
                round(arc)
            );
            assert!(lru >= lru_ref, "lru at {cap}: {lru} < {lru_ref}");
            assert!(admit >= admit_ref, "admit2 at {cap}: {admit} < {admit_ref}");
            assert!(
                arc >= lru.max(admit),
                "arc at {cap}: {} < max({}, {})",
                round(arc),
                round(lru),
                round(admit)
            );
        }
    }

    /// The rules' table, on the trace it was measured on (Mooncake's conversation trace): the
    /// three rules' hit ratios as first measured (that replay was through a store; this
    /// one, through the index, gives the same figures), and the default at least the best of
    /// them, or within 0.5 % of its hit ratio (read both ways: 0.005 of the references, and
    /// 0.995x), over the whole trace.
    #[test]
    #[cfg_attr(
        debug_assertions,
        ignore = "optimised only: cargo test --release --lib policy"
    )]
    fn the_rules_table_holds_on_the_conversation_trace() {
        let reqs = mooncake_conversation();
        let round = |x: f64| (x * 1e4).round() / 1e4;
        // (capacity, lru, admit2, arc), from the issue.
        for (cap, lru_t, admit_t, arc_t) in [
            (1000, 0.0445, 0.0831, 0.0529),
            (4000, 0.0865, 0.1500, 0.0978),
            (16000, 0.2627, 0.2117, 0.2704),
        ] {
            let rules @ [lru, arc, admit] = simple_from(cap, &reqs, 0);
            assert_eq!(
                [round(lru), round(admit), round(arc)],
                [lru_t, admit_t, arc_t],
                "the rules at {cap} blocks"
            );
            let (ad, _, summary) = replay_split(Box::new(Adaptive::new()), cap, &reqs, 0);
            let best = best_of(rules);
            eprintln!(
                "conversation trace at {cap}: adaptive {ad:.4} ({:+.4}, {:.4}x the best; {summary})",
                ad - best,
                ad / best
            );
            assert!(
                ad >= best - 0.005 && ad >= 0.995 * best,
                "adaptive at {cap}: {ad:.4}, the best rule {best:.4}"
            );
        }
    }

    /// On the same trace, at 1 % to 50 % of its distinct blocks: after the first 10 %, the
    /// default at least the best of the three rules less 0.005 (as
    /// [`the_default_is_at_least_the_best_simple_rule_on_every_shape`] reads the shapes).
    /// Above [`SHADOW_BLOCKS`] (20 % on) its shadows sample conversations, by the block after
    /// the shared system prompt ([`super::adaptive::MAX_SAMPLE_DEPTH`]): sampled by the root,
    /// 20 % to 30 % fell 0.0084 to 0.0139 below LRU.
    #[test]
    #[cfg_attr(
        debug_assertions,
        ignore = "optimised only: cargo test --release --lib policy"
    )]
    fn the_default_on_the_conversation_trace_from_1_to_50_percent() {
        let reqs = mooncake_conversation();
        let distinct = reqs.iter().flatten().collect::<HashSet<_>>().len();
        let tail = reqs.len() / 10;
        let mut failures = Vec::new();
        for pct in [1, 2, 5, 10, 20, 25, 30, 40, 50] {
            let cap = distinct * pct / 100;
            let rules = simple_from(cap, &reqs, tail);
            let best = best_of(rules);
            let (_, ad, summary) = replay_split(Box::new(Adaptive::new()), cap, &reqs, tail);
            eprintln!(
                "conversation trace at {cap} ({pct} %), after 10 %: lru {:.4} arc {:.4} admit2 {:.4} \
                 adaptive {ad:.4} ({:+.4}; {summary})",
                rules[0],
                rules[1],
                rules[2],
                ad - best
            );
            if ad < best - 0.005 {
                failures.push(format!("{cap} ({pct} %): {ad:.4}, best {best:.4}"));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// The capacities a shape is tested at, in percent of its distinct blocks: 1 % to 50 %,
    /// and for the loop, capacities just smaller than the loop, where recency gets nothing.
    pub(crate) fn test_capacities(shape: &str) -> &'static [usize] {
        if shape == "loop" {
            &[50, 90]
        } else if shape == "phases" {
            // Its regimes alternate: at 2 and 3 % a duel that carried one regime's lead into
            // the next fell 0.012 to 0.018 below ARC (docs/eviction.md).
            &[1, 2, 3, 5, 20, 50]
        } else {
            &[1, 5, 20, 50]
        }
    }

    /// A trace of `tools/gen-trace.py` (4,000 requests, seed 1: the traces of
    /// docs/eviction.md's figures; `TIERKV_SHAPE_SEED` picks another seed, to see how far a
    /// figure moves with the trace alone).
    pub(crate) fn generated(shape: &str) -> Vec<Vec<u64>> {
        let seed = std::env::var("TIERKV_SHAPE_SEED").unwrap_or_else(|_| "1".into());
        generated_seed(shape, &seed)
    }

    /// The shapes `tools/gen-trace.py` makes.
    pub(crate) fn shape_names() -> Vec<String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/gen-trace.py");
        let list = std::process::Command::new("python3")
            .args([script, "--list"])
            .output()
            .expect("python3");
        assert!(list.status.success(), "gen-trace.py --list");
        String::from_utf8(list.stdout)
            .expect("utf-8")
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// A trace of `tools/gen-trace.py` of 4,000 requests with this seed.
    pub(crate) fn generated_seed(shape: &str, seed: &str) -> Vec<Vec<u64>> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/gen-trace.py");
        let out = std::process::Command::new("python3")
            .args([script, shape, "--seed", seed, "--requests", "4000"])
            .output()
            .expect("python3");
        assert!(out.status.success(), "{shape}");
        parse_trace(&String::from_utf8(out.stdout).expect("utf-8"))
    }

    /// Once past the first 10 % of a trace (where it finds its rule), the default is at least
    /// the best of LRU, ARC and admit-on-second-sight, or within 0.005 of it, on every shape of
    /// `tools/gen-trace.py`, at capacities from 1 % to 50 % of the shape's distinct blocks, both
    /// up to [`SHADOW_BLOCKS`], where the shadows are exact, and above it, where they sample
    /// chains (the whole-trace figures are printed; docs/eviction.md has them). The set is wide enough
    /// that each simple rule loses by more than that tolerance somewhere: a policy tuned on one
    /// shape fails another.
    #[test]
    #[cfg_attr(
        debug_assertions,
        ignore = "optimised only: cargo test --release --lib policy"
    )]
    fn the_default_is_at_least_the_best_simple_rule_on_every_shape() {
        let shapes = shape_names();
        assert!(shapes.len() >= 9, "{shapes:?}");
        let mut worst = f64::INFINITY;
        // How far below the best each simple rule falls at its worst.
        let mut rule_worst = [0.0f64; 3];
        let mut failures = Vec::new();
        for shape in &shapes {
            let shape = shape.as_str();
            let reqs = generated(shape);
            let distinct = reqs.iter().flatten().collect::<HashSet<_>>().len();
            let tail = reqs.len() / 10;
            for &pct in test_capacities(shape) {
                let cap = distinct * pct / 100;
                let simple = [
                    replay_split(Box::new(Lru::new()), cap, &reqs, tail),
                    replay_split(Box::new(ArcPolicy::new()), cap, &reqs, tail),
                    replay_split(Box::new(Admit2::new(4)), cap, &reqs, tail),
                ];
                let ad = replay_split(Box::new(Adaptive::new()), cap, &reqs, tail);
                let best = simple.iter().map(|r| r.0).fold(0.0, f64::max);
                let best_late = simple.iter().map(|r| r.1).fold(0.0, f64::max);
                for (w, r) in rule_worst.iter_mut().zip(&simple) {
                    *w = w.max(best - r.0);
                }
                // Above SHADOW_BLOCKS the shadows sample chains (asserted all the same).
                let sampled = if cap <= SHADOW_BLOCKS {
                    ""
                } else {
                    ", sampled"
                };
                eprintln!(
                    "{shape} {cap} ({pct} %{sampled}): lru {:.4} arc {:.4} admit2 {:.4} adaptive {:.4} \
                     ({:+.4}; after 10 %: {:+.4}; {})",
                    simple[0].0,
                    simple[1].0,
                    simple[2].0,
                    ad.0,
                    ad.0 - best,
                    ad.1 - best_late,
                    ad.2,
                );
                // After the first 10 %, each figure, and the default's as a share of the best.
                eprintln!(
                    "  after 10 %: lru {:.4} arc {:.4} admit2 {:.4} adaptive {:.4} ({:.4}x the best)",
                    simple[0].1,
                    simple[1].1,
                    simple[2].1,
                    ad.1,
                    ad.1 / best_late,
                );
                worst = worst.min(ad.1 - best_late);
                if ad.1 < best_late - 0.005 {
                    failures.push(format!(
                        "{shape} at {cap}: {:.4} after 10 %, best {best_late:.4}",
                        ad.1
                    ));
                }
            }
        }
        eprintln!("worst margin {worst:+.4}; simple rules' worst {rule_worst:?}");
        assert!(failures.is_empty(), "{failures:#?}");
        for (rule, w) in ["lru", "arc", "admit2"].iter().zip(rule_worst) {
            assert!(
                w > 0.005,
                "{rule} is never beaten by more than 0.005: {w:.4}"
            );
        }
    }

    /// The simple rules of [`simple_from`], in its order.
    const SIMPLE: [&str; 3] = ["lru", "arc", "admit2"];

    /// The hit ratios of LRU, ARC and `admit2` over the requests from `from` on.
    fn simple_from(cap: usize, reqs: &[Vec<u64>], from: usize) -> [f64; 3] {
        [
            replay_split(Box::new(Lru::new()), cap, reqs, from).1,
            replay_split(Box::new(ArcPolicy::new()), cap, reqs, from).1,
            replay_split(Box::new(Admit2::new(4)), cap, reqs, from).1,
        ]
    }

    /// The best hit ratio of LRU, ARC and `admit2` over the requests from `from` on.
    fn best_simple_from(cap: usize, reqs: &[Vec<u64>], from: usize) -> f64 {
        best_of(simple_from(cap, reqs, from))
    }

    /// The best of the simple rules' hit ratios.
    fn best_of(rules: [f64; 3]) -> f64 {
        rules.into_iter().fold(0.0, f64::max)
    }

    /// Chat's traffic hangs off 3 system prompts, so shadows that sample chains by their root
    /// see 0 to 3 of them. At half of its blocks on seed 2 (25,487 blocks), sampled shadows
    /// misjudged LRU against ARC and the default fell 0.0142 below LRU after the first 10 %
    /// (more than 0.005 below on 7 of 8 seeds: docs/eviction-log.md at commit 2f3502f, "On other
    /// seeds"); with shadows exact up to [`SHADOW_BLOCKS`] it is within 0.005.
    #[test]
    #[cfg_attr(
        debug_assertions,
        ignore = "optimised only: cargo test --release --lib policy"
    )]
    fn chat_at_half_its_blocks_on_another_seed_is_within_the_bound() {
        let reqs = generated_seed("chat", "2");
        let distinct = reqs.iter().flatten().collect::<HashSet<_>>().len();
        let (cap, tail) = (distinct / 2, reqs.len() / 10);
        let best = best_simple_from(cap, &reqs, tail);
        let ad = replay_split(Box::new(Adaptive::new()), cap, &reqs, tail).1;
        assert!(
            ad >= best - 0.005,
            "chat at {cap} blocks, seed 2: {ad:.4} after 10 %, best {best:.4}"
        );
    }

    /// The default against the best of LRU, ARC and `admit2` after the first 10 % of each trace,
    /// on many seeds of every shape (`TIERKV_SEEDS`, default 1 to 8), at the capacities of
    /// [`the_default_is_at_least_the_best_simple_rule_on_every_shape`] up to [`SHADOW_BLOCKS`]
    /// (`TIERKV_ALL_CELLS=1`: the sampled ones too), or at other percentages of each shape's
    /// distinct blocks (`TIERKV_PCTS=2,3.5,7`: the capacities between the tested ones): one
    /// `CELL shape#capacity-index sSEED ratio difference` line per cell, then a summary;
    /// then, per shape and capacity, the floor the seeds set (`FIXED` lines): the simple rule
    /// with the best mean over the seeds, fixed, against each seed's best rule. A design tool
    /// (docs/eviction.md, "On other seeds"): a change to the default is judged on all the
    /// seeds, not on the one the shapes test asserts.
    #[test]
    #[ignore = "a design tool: TIERKV_SEEDS=1,2 cargo test --release --lib shapes_seeds -- --ignored --nocapture"]
    fn shapes_seeds() {
        let seeds: Vec<String> = std::env::var("TIERKV_SEEDS")
            .unwrap_or("1,2,3,4,5,6,7,8".into())
            .split(',')
            .map(str::to_string)
            .collect();
        // Other capacities than the shapes test's, the same for every shape.
        let pcts: Option<Vec<f64>> = std::env::var("TIERKV_PCTS").ok().map(|list| {
            list.split(',')
                .map(|p| p.trim().parse().expect("TIERKV_PCTS: percentages"))
                .collect()
        });
        let all_cells = std::env::var("TIERKV_ALL_CELLS").is_ok();
        let shapes = shape_names();
        let jobs: Vec<(String, String)> = seeds
            .iter()
            .flat_map(|sd| shapes.iter().map(move |sh| (sh.clone(), sd.clone())))
            .collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let out = std::sync::Mutex::new(Vec::new());
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((shape, seed)) = jobs.get(i) else {
                            break;
                        };
                        let reqs = generated_seed(shape, seed);
                        let distinct = reqs.iter().flatten().collect::<HashSet<_>>().len();
                        let tail = reqs.len() / 10;
                        let pcts = pcts.clone().unwrap_or_else(|| {
                            test_capacities(shape).iter().map(|&p| p as f64).collect()
                        });
                        for (ci, &pct) in pcts.iter().enumerate() {
                            let cap = (distinct as f64 * pct / 100.0) as usize;
                            if cap > SHADOW_BLOCKS && !all_cells {
                                continue;
                            }
                            let rules = simple_from(cap, &reqs, tail);
                            let ad = replay_split(Box::new(Adaptive::new()), cap, &reqs, tail).1;
                            out.lock().expect("cells").push(Cell {
                                cell: format!("{shape}#{ci}"),
                                seed: seed.clone(),
                                rules,
                                ad,
                            });
                        }
                    }
                });
            }
        });
        let mut out = out.into_inner().expect("cells");
        out.sort_by(|a, b| (&a.cell, &a.seed).cmp(&(&b.cell, &b.seed)));
        for c in &out {
            let b = c.best();
            println!(
                "CELL {} s{} {:.4} {:+.4}",
                c.cell,
                c.seed,
                c.ad / b,
                c.ad - b
            );
        }
        let n = out.len() as f64;
        let below = out.iter().filter(|c| c.ad < 0.995 * c.best()).count();
        let absf = out.iter().filter(|c| c.ad < c.best() - 0.005).count();
        let mean = out.iter().map(|c| c.ad / c.best()).sum::<f64>() / n;
        let worst = out
            .iter()
            .map(|c| c.ad / c.best())
            .fold(f64::INFINITY, f64::min);
        let mean_d = out.iter().map(|c| c.ad - c.best()).sum::<f64>() / n;
        println!(
            "SUMMARY cells {n}, below 0.995x the best {below}, below the best - 0.005 {absf}, \
             worst {worst:.4}x, mean {mean:.4}x, mean difference {mean_d:+.5}"
        );
        print_floor(&out);
    }

    /// Prints, per shape and capacity of [`shapes_seeds`] (`out` sorted by cell), the floor
    /// the seeds themselves set: the simple rule with the best mean over the seeds, chosen as
    /// if the shape were known beforehand, against the best rule of each seed. Where the rules
    /// are close, the winner changes from seed to seed, and no rule chosen without seeing the
    /// trace is the best on all of them.
    fn print_floor(out: &[Cell]) {
        let (mut o_below, mut o_absf) = (0, 0);
        for seeds in out.chunk_by(|a, b| a.cell == b.cell) {
            let mean = |r: usize| seeds.iter().map(|c| c.rules[r]).sum::<f64>();
            let fixed = (0..3)
                .max_by(|&a, &b| mean(a).total_cmp(&mean(b)))
                .expect("3 rules");
            let count = |f: &dyn Fn(&Cell) -> bool| seeds.iter().filter(|c| f(c)).count();
            let fb = count(&|c| c.rules[fixed] < 0.995 * c.best());
            let fa = count(&|c| c.rules[fixed] < c.best() - 0.005);
            let ab = count(&|c| c.ad < c.best() - 0.005);
            println!(
                "FIXED {} {} below 0.995x {fb} below - 0.005 {fa}; adaptive below - 0.005 {ab} \
                 of {}",
                seeds[0].cell,
                SIMPLE[fixed],
                seeds.len()
            );
            (o_below, o_absf) = (o_below + fb, o_absf + fa);
        }
        println!(
            "SUMMARY the rule best on average in each cell, fixed: below 0.995x the best \
             {o_below}, below the best - 0.005 {o_absf}"
        );
    }

    /// One cell of [`shapes_seeds`]: LRU's, ARC's, `admit2`'s and the default's hit ratios
    /// after the first 10 % of one seed's trace.
    struct Cell {
        cell: String,
        seed: String,
        rules: [f64; 3],
        ad: f64,
    }

    impl Cell {
        /// The best hit ratio of the three rules.
        fn best(&self) -> f64 {
            best_of(self.rules)
        }
    }

    /// Hit ratios tenth by tenth of one generated trace (`TIERKV_SHAPE`, default `phases`;
    /// or the trace file `TIERKV_TRACE`;
    /// `TIERKV_SHAPE_SEED`, default 1; `TIERKV_PCT`, the capacity in percent of its distinct
    /// blocks, default 2): the default's, and each of its five candidates' followed alone (as
    /// its shadow would keep the store), with the hit ratio after the first 10 % and the rule
    /// followed at the end. Where the default loses to a candidate, it shows in which part of
    /// the trace (docs/eviction.md, "Where following the leader loses").
    #[test]
    #[ignore = "a design tool: TIERKV_SHAPE=phases TIERKV_PCT=7 cargo test --release --lib tenths -- --ignored --nocapture"]
    fn tenths() {
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.into());
        let shape = var("TIERKV_SHAPE", "phases");
        let seed = var("TIERKV_SHAPE_SEED", "1");
        let pct: f64 = var("TIERKV_PCT", "2")
            .parse()
            .expect("TIERKV_PCT: a percentage");
        let (shape, reqs) = match std::env::var("TIERKV_TRACE") {
            Ok(path) => {
                let reqs = read_trace(&path);
                (path, reqs)
            }
            Err(_) => {
                let reqs = generated_seed(&shape, &seed);
                (shape, reqs)
            }
        };
        let distinct = reqs.iter().flatten().collect::<HashSet<_>>().len();
        let cap = ((distinct as f64 * pct / 100.0) as usize).max(1);
        let tenth = reqs.len().div_ceil(10);
        let refs = |c: &[Vec<u64>]| c.iter().map(Vec::len).sum::<usize>();
        let ends: Vec<usize> = (1..=reqs.len().div_ceil(tenth))
            .map(|i| refs(&reqs[..(i * tenth).min(reqs.len())]))
            .collect();
        println!(
            "{shape}, seed {seed}, {cap} blocks ({pct} % of {distinct}); each tenth ends at \
             reference {ends:?}"
        );
        for name in ["default", "arc", "arc+door", "lru", "lru+door", "admit2"] {
            let policy: Box<dyn Policy> = match name {
                "default" => Box::new(Adaptive::new()),
                _ => Box::new(Adaptive::fixed(name, DOOR_WINDOW_CAPACITIES)),
            };
            let (counts, summary) = replay_counts(policy, cap, &reqs);
            let per: Vec<String> = counts
                .chunks(tenth)
                .map(|c| format!("{:.3}", hit_ratio(c)))
                .collect();
            println!(
                "{name:9} after the first 10 % {:.4} | by tenths {} | {summary}",
                hit_ratio(&counts[tenth.min(counts.len())..]),
                per.join(" ")
            );
        }
    }

    /// Hit ratios of every policy on every trace of `$TIERKV_TRACES` (a directory of .jsonl
    /// files), through the index: the quick table used while designing `Adaptive`
    /// (`tools/replay-table.sh` gives the same figures through a real store).
    #[test]
    #[ignore = "a design tool: TIERKV_TRACES=dir cargo test --release --lib shapes_table -- --ignored --nocapture"]
    fn shapes_table() {
        let dir = std::env::var("TIERKV_TRACES").expect("TIERKV_TRACES");
        // Capacities in blocks, or with `%` in percent of each trace's distinct blocks.
        let caps: Vec<String> = std::env::var("TIERKV_CAPS")
            .unwrap_or("1000,2000,4000,8000,16000".into())
            .split(',')
            .map(str::to_string)
            .collect();
        type Make = Box<dyn Fn() -> Box<dyn Policy>>;
        let variants: Vec<(String, Make)> = {
            let mut v: Vec<(String, Make)> = vec![
                ("lru".into(), Box::new(|| Box::new(Lru::new()))),
                ("admit2".into(), Box::new(|| Box::new(Admit2::new(4)))),
                ("arc".into(), Box::new(|| Box::new(ArcPolicy::new()))),
                ("adaptive".into(), Box::new(|| Box::new(Adaptive::new()))),
            ];
            if let Ok(extra) = std::env::var("TIERKV_VARIANTS") {
                // shadow_blocks:half_life:door_window, e.g. 1000000:4:2, or fixed:lru+door:2
                for p in extra.split(',') {
                    if let Some(m) = p.strip_prefix("fixed:") {
                        let (m, w) = m.split_once(':').expect("fixed:mode:window");
                        let (m, w) = (m.to_string(), w.parse().expect("window"));
                        v.push((
                            format!("{m}/{w}"),
                            Box::new(move || Box::new(Adaptive::fixed(&m, w))),
                        ));
                        continue;
                    }
                    let n: Vec<usize> = p.split(':').map(|x| x.parse().expect("number")).collect();
                    let (a, b, c) = (n[0], n[1], n[2]);
                    v.push((
                        format!("adaptive({a},{b},{c})"),
                        Box::new(move || Box::new(Adaptive::with_constants(a, b, c))),
                    ));
                }
            }
            v
        };
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        let names: Vec<&str> = variants.iter().map(|(n, _)| n.as_str()).collect();
        println!(
            "| trace | capacity | {} | best simple | adaptive - best simple |",
            names.join(" | ")
        );
        for f in files {
            let reqs = read_trace(f.to_str().expect("utf-8"));
            let distinct = reqs
                .iter()
                .flatten()
                .collect::<std::collections::HashSet<_>>()
                .len();
            for cap in &caps {
                let cap = match cap.strip_suffix('%') {
                    Some(pct) => distinct * pct.parse::<usize>().expect("percent") / 100,
                    None => cap.parse().expect("capacity"),
                };
                let hr: Vec<f64> = variants
                    .iter()
                    .map(|(_, mk)| replay(mk(), cap, &reqs))
                    .collect();
                let best = hr[0].max(hr[1]).max(hr[2]);

                println!(
                    "| {} | {cap} | {} | {best:.4} | {:+.4} |",
                    f.file_stem().unwrap().to_string_lossy(),
                    hr.iter()
                        .map(|x| format!("{x:.4}"))
                        .collect::<Vec<_>>()
                        .join(" | "),
                    hr[3] - best
                );
            }
        }
    }

    #[test]
    fn names_parse() {
        for k in [
            PolicyKind::Lru,
            PolicyKind::Admit2,
            PolicyKind::Arc,
            PolicyKind::Adaptive,
        ] {
            assert_eq!(k.to_string().parse::<PolicyKind>().unwrap(), k);
            assert_eq!(k.build().name(), k.to_string());
        }
        assert!("belady".parse::<PolicyKind>().is_err());
    }
}
