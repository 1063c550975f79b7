use std::collections::HashSet;

use super::super::Map;
use super::super::tests::{h, replay};
use super::super::{Admit2, Lru};
use super::duel::{REGIME_MEAN_CAPACITIES, REGIME_MIN_REFERENCES};
use super::sampling::MAX_DRAWS;
use super::*;

/// The exact shadows' state (the test's shadows are exact).
fn exact(a: &Adaptive) -> &Exact {
    match &a.kind {
        Kind::Exact(e) => e,
        Kind::Sampled(_) => panic!("the shadows are sampled"),
    }
}

/// For each real block, the shadows that hold it: none while the shadows are sampled.
fn groups(a: &Adaptive) -> Map<BlockHash, u8> {
    match &a.kind {
        Kind::Exact(e) => e.held.clone(),
        Kind::Sampled(_) => Map::default(),
    }
}

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
    assert!(a.sample() > 1 && !a.mirrors());
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
    assert!(groups(&a).is_empty(), "no groups while sampling");
    a.set_capacity_hint(50);
    assert!(a.mirrors());
    let real: HashSet<BlockHash> = (0..100).map(h).collect();
    assert_eq!(
        groups(&a).keys().copied().collect::<HashSet<_>>(),
        real,
        "every real block grouped"
    );
    assert_eq!(
        exact(&a).by_holders[0].len(),
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
            groups(&a).keys().collect::<HashSet<_>>(),
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
    let held =
        |a: &Adaptive| -> HashSet<BlockHash> { leader_shadow(a).present.keys().copied().collect() };
    let differ = real.symmetric_difference(&held(&a)).count();
    assert!(differ > 20, "the two rules hold other blocks: {differ}");
    let admit2 = 1
        << MODES
            .iter()
            .position(|&m| m == Mode::Admit2)
            .expect("admit2");
    assert_eq!(
        groups(&a).values().filter(|&&m| m & admit2 == 0).count(),
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
    assert!(a.sample() > 1);
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
        assert!(a.sample() > 1 && !a.mirrors());
        fill(&mut a, 0..1024);
        a.on_chain(None);
        assert_eq!(
            a.admit(&h(5000)),
            first_sight,
            "{mode}: a first sight when full"
        );
        a.on_chain(None);
        assert!(a.admit(&h(5000)), "{mode}: a second sight");
        assert!(groups(&a).is_empty(), "{mode}: groups only when mirroring");
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
    assert_eq!((a.sample(), a.draw), (4, 0));
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
    assert!(a.sampling().expect("sampled").seen_sampled > 0.0 && !a.shadows[0].present.is_empty());
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
    assert_eq!(a.sample(), 4);
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
    assert!(a.sampling().expect("sampled").depth_seen > 0);
    a.set_capacity_hint(20_000);
    assert_eq!(
        (a.sample(), a.sampling().expect("sampled").depth_seen),
        (8, 0)
    );
}

#[test]
fn a_root_that_carries_the_traffic_is_sampled_below_it() {
    // 1 in 4 of a 1,000-block cache, shadows of at most 300 blocks.
    let fresh = || {
        let mut a = Adaptive::with_constants(300, HALF_LIFE_CAPACITIES, DOOR_WINDOW_CAPACITIES);
        a.set_capacity_hint(1000);
        assert_eq!((a.sample(), a.depth), (4, 0));
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
        let share =
            a.sampling().expect("sampled").seen_sampled / a.sampling().expect("sampled").seen;
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
    assert_eq!((a.sample(), a.shadows[0].cap), (4, 256), "1 in 4 at first");
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
    assert_eq!(a.sample(), 16);
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
    assert_eq!(a.sample(), 1);
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
    assert_eq!(a.sample(), 16);
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
