//! What is kept: the in-memory index of a worker's blocks, capacity accounting, pins, and the
//! choice of victims through a [`policy::Policy`].
//!
//! The index knows every block file of its worker (rebuilt by a scan when a store opens) and
//! the bytes each takes on disk (`st_blocks`, header included). The store asks it before
//! touching the disk: an absent key is a miss without a system call.

pub mod policy;

use std::collections::HashMap;
use std::sync::Mutex;

use policy::{Access, Policy};

use crate::key::BlockHash;

/// Capacity bounds and eviction watermarks of one store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Largest total of on-disk bytes of the worker's block files.
    pub max_bytes: Option<u64>,
    /// Largest number of block files.
    pub max_files: Option<u64>,
    /// Background eviction starts above this fraction of a bound.
    pub high: f64,
    /// ... and stops at this fraction.
    pub low: f64,
}

impl Limits {
    /// No bound at all.
    pub fn unbounded() -> Self {
        Limits {
            max_bytes: None,
            max_files: None,
            high: 1.0,
            low: 1.0,
        }
    }

    /// True when some bound is set.
    pub fn is_bounded(&self) -> bool {
        self.max_bytes.is_some() || self.max_files.is_some()
    }

    fn scaled(&self, f: f64) -> (u64, u64) {
        let s = |v: Option<u64>| v.map_or(u64::MAX, |v| (v as f64 * f) as u64);
        (s(self.max_bytes), s(self.max_files))
    }
}

#[derive(Debug)]
struct Entry {
    bytes: u64,
    pins: u32,
    /// Reserved by a put in flight: counted against the capacity, not yet readable.
    pending: bool,
}

/// What an offered block becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Present: touched; nothing to write.
    Touched,
    /// Present, and the caller replaces it: write it, then `commit` (or `abort`).
    Replace,
    /// Absent and admitted: room was made and the entry reserved; write it, then `commit`
    /// (or `abort`).
    Reserved,
    /// Absent and declined by the policy's admission control.
    NotAdmitted,
}

#[derive(Debug)]
struct State {
    map: HashMap<BlockHash, Entry>,
    bytes: u64,
    policy: Box<dyn Policy>,
    evictions: u64,
    evicted_bytes: u64,
    not_admitted: u64,
    /// Running mean of offered block sizes, to turn a byte capacity into the block count
    /// that policies size their ghost lists by.
    mean_bytes: f64,
}

/// A block chosen for eviction: already gone from the index; the store unlinks its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Victim {
    pub hash: BlockHash,
    pub bytes: u64,
}

/// Counters of the index.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IndexCounts {
    pub files: u64,
    pub bytes: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub not_admitted: u64,
}

/// The index of one worker's blocks.
#[derive(Debug)]
pub(crate) struct Index {
    state: Mutex<State>,
    limits: Limits,
}

impl Index {
    pub fn new(limits: Limits, mut policy: Box<dyn Policy>) -> Self {
        if let Some(files) = limits.max_files {
            policy.set_capacity_hint(files as usize);
        }
        Index {
            state: Mutex::new(State {
                map: HashMap::new(),
                bytes: 0,
                policy,
                evictions: 0,
                evicted_bytes: 0,
                not_admitted: 0,
                mean_bytes: 0.0,
            }),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// True if a published block is held (not one that a put is still writing).
    pub fn contains(&self, h: &BlockHash) -> bool {
        self.lock().map.get(h).is_some_and(|e| !e.pending)
    }

    /// Pins the present keys (an eviction skips them until unpinned); returns which were
    /// present.
    pub fn pin_present(&self, hashes: &[&BlockHash]) -> Vec<bool> {
        let mut st = self.lock();
        hashes
            .iter()
            .map(|h| match st.map.get_mut(*h) {
                Some(e) if !e.pending => {
                    e.pins += 1;
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// Undoes [`Index::pin_present`] for the keys it reported present.
    pub fn unpin<'a>(&self, hashes: impl IntoIterator<Item = &'a BlockHash>) {
        let mut st = self.lock();
        for h in hashes {
            if let Some(e) = st.map.get_mut(h) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// Records hits (or touches), in chain order.
    pub fn record_hits(&self, hits: &[BlockHash]) {
        if hits.is_empty() {
            return;
        }
        let mut st = self.lock();
        let batch: Vec<Access> = hits
            .iter()
            .filter(|h| st.map.get(*h).is_some_and(|e| !e.pending))
            .map(|&hash| Access {
                hash,
                inserted: false,
            })
            .collect();
        st.policy.on_access(&batch);
    }

    /// Offers a batch of blocks in chain order (with the on-disk bytes each would take):
    /// present blocks are touched (or, with `replace`, marked for rewriting); absent ones go
    /// through admission, and room is made for each admitted one before it is reserved.
    /// Returns what each block became and the victims whose files the caller must unlink.
    ///
    /// Accesses reach the policy in batch order; before each eviction the accesses seen so
    /// far are handed over, so a policy sees touches and insertions interleaved with its
    /// evictions exactly as a block-by-block replay would.
    pub fn offer(&self, items: &[(BlockHash, u64)], replace: bool) -> (Vec<Offer>, Vec<Victim>) {
        let mut st = self.lock();
        self.update_hint(&mut st, items);
        let mut out = Vec::with_capacity(items.len());
        let mut victims = Vec::new();
        let mut acc: Vec<Access> = Vec::with_capacity(items.len());
        for &(hash, est) in items {
            if let Some(e) = st.map.get_mut(&hash) {
                // Present (or reserved by another put of the same key: this one replaces it).
                if replace || e.pending {
                    e.pins += 1;
                    out.push(Offer::Replace);
                } else {
                    out.push(Offer::Touched);
                }
                acc.push(Access {
                    hash,
                    inserted: false,
                });
                continue;
            }
            if !st.policy.admit(&hash) {
                st.not_admitted += 1;
                out.push(Offer::NotAdmitted);
                continue;
            }
            if self.over(&st, est, 1) {
                st.policy.on_access(&acc);
                acc.clear();
                victims.extend(self.evict_locked(&mut st, |ix, st| ix.over(st, est, 1)));
            }
            st.map.insert(
                hash,
                Entry {
                    bytes: est,
                    pins: 1,
                    pending: true,
                },
            );
            st.bytes += est;
            acc.push(Access {
                hash,
                inserted: true,
            });
            out.push(Offer::Reserved);
        }
        st.policy.on_access(&acc);
        (out, victims)
    }

    /// A put of `hash` was published and takes `bytes` on disk.
    pub fn commit(&self, hash: &BlockHash, bytes: u64) {
        let mut st = self.lock();
        match st.map.get_mut(hash) {
            Some(e) => {
                let old = e.bytes;
                e.bytes = bytes;
                e.pins = e.pins.saturating_sub(1);
                e.pending = false;
                st.bytes = st.bytes - old + bytes;
            }
            None => {
                // Removed while it was being written (e.g. `remove_many`): it is on disk now.
                st.map.insert(
                    *hash,
                    Entry {
                        bytes,
                        pins: 0,
                        pending: false,
                    },
                );
                st.bytes += bytes;
                st.policy.on_access(&[Access {
                    hash: *hash,
                    inserted: true,
                }]);
            }
        }
    }

    /// A put of `hash` failed: a reservation is dropped, a replacement keeps the old block.
    pub fn abort(&self, hash: &BlockHash, offer: Offer) {
        let mut st = self.lock();
        let reserved = offer == Offer::Reserved && st.map.get(hash).is_some_and(|e| e.pending);
        if reserved {
            if let Some(e) = st.map.remove(hash) {
                st.bytes -= e.bytes;
                st.policy.on_remove(hash);
            }
        } else if let Some(e) = st.map.get_mut(hash) {
            e.pins = e.pins.saturating_sub(1);
        }
    }

    /// Adds a block found on disk (the rebuild on open; call oldest first).
    pub fn load(&self, hash: BlockHash, bytes: u64) {
        let mut st = self.lock();
        let entry = Entry {
            bytes,
            pins: 0,
            pending: false,
        };
        if let Some(old) = st.map.insert(hash, entry) {
            st.bytes -= old.bytes;
        }
        st.bytes += bytes;
        st.policy.on_access(&[Access {
            hash,
            inserted: true,
        }]);
    }

    /// With a byte capacity only, tells the policy how many blocks of the sizes seen so far
    /// fit (the count its ghost lists are sized by).
    fn update_hint(&self, st: &mut State, items: &[(BlockHash, u64)]) {
        let (Some(max_bytes), None) = (self.limits.max_bytes, self.limits.max_files) else {
            return;
        };
        if items.is_empty() {
            return;
        }
        let batch_mean = items.iter().map(|(_, b)| *b as f64).sum::<f64>() / items.len() as f64;
        let old = st.mean_bytes;
        st.mean_bytes = if old == 0.0 {
            batch_mean
        } else {
            0.9 * old + 0.1 * batch_mean
        };
        let blocks = (max_bytes as f64 / st.mean_bytes.max(1.0)) as usize;
        let old_blocks = if old == 0.0 {
            0
        } else {
            (max_bytes as f64 / old.max(1.0)) as usize
        };
        if old_blocks == 0 || blocks.abs_diff(old_blocks) * 20 > old_blocks {
            st.policy.set_capacity_hint(blocks.max(1));
        }
    }

    fn over(&self, st: &State, bytes: u64, files: u64) -> bool {
        let (max_b, max_f) = self.limits.scaled(1.0);
        st.bytes.saturating_add(bytes) > max_b
            || (st.map.len() as u64).saturating_add(files) > max_f
    }

    /// Forgets a block (removed, found missing or corrupt). True if it was known.
    pub fn remove(&self, h: &BlockHash) -> bool {
        let mut st = self.lock();
        match st.map.remove(h) {
            Some(e) => {
                st.bytes -= e.bytes;
                st.policy.on_remove(h);
                true
            }
            None => false,
        }
    }

    /// True when usage is above the high watermark.
    pub fn over_high(&self) -> bool {
        let (hb, hf) = self.limits.scaled(self.limits.high);
        let st = self.lock();
        st.bytes > hb || st.map.len() as u64 > hf
    }

    /// Evicts down to the low watermark.
    pub fn evict_to_low(&self) -> Vec<Victim> {
        let (lb, lf) = self.limits.scaled(self.limits.low);
        let mut st = self.lock();
        self.evict_locked(&mut st, |_, st| st.bytes > lb || st.map.len() as u64 > lf)
    }

    /// Evicts down to the bounds themselves.
    pub fn evict_to_bound(&self) -> Vec<Victim> {
        let mut st = self.lock();
        self.evict_locked(&mut st, |ix, st| ix.over(st, 0, 0))
    }

    /// Evicts at least `bytes` (for ENOSPC below the configured capacity), never the blocks
    /// in `keep` (the ones the room is for).
    pub fn evict_bytes(&self, bytes: u64, keep: &[BlockHash]) -> Vec<Victim> {
        let mut st = self.lock();
        let target = st.bytes.saturating_sub(bytes);
        let mut pinned = Vec::new();
        for h in keep {
            if let Some(e) = st.map.get_mut(h) {
                e.pins += 1;
                pinned.push(*h);
            }
        }
        let out = self.evict_locked(&mut st, |_, st| st.bytes > target);
        for h in pinned {
            if let Some(e) = st.map.get_mut(&h) {
                e.pins -= 1;
            }
        }
        out
    }

    fn evict_locked(
        &self,
        st: &mut State,
        mut over: impl FnMut(&Self, &State) -> bool,
    ) -> Vec<Victim> {
        let mut out = Vec::new();
        while over(self, st) {
            let State { map, policy, .. } = &mut *st;
            let Some(v) = policy.victim(&|h| map.get(h).is_some_and(|e| e.pins > 0 || e.pending))
            else {
                break; // everything left is pinned
            };
            if let Some(e) = st.map.remove(&v) {
                st.bytes -= e.bytes;
                st.evictions += 1;
                st.evicted_bytes += e.bytes;
                out.push(Victim {
                    hash: v,
                    bytes: e.bytes,
                });
            }
        }
        out
    }

    pub fn counts(&self) -> IndexCounts {
        let st = self.lock();
        IndexCounts {
            files: st.map.len() as u64,
            bytes: st.bytes,
            evictions: st.evictions,
            evicted_bytes: st.evicted_bytes,
            not_admitted: st.not_admitted,
        }
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.lock().policy.name()
    }
}

#[cfg(test)]
mod tests {
    use super::Offer;
    use super::policy::tests::h;
    use super::policy::{Lru, PolicyKind};
    use super::*;

    fn idx(max_bytes: Option<u64>, max_files: Option<u64>) -> Index {
        Index::new(
            Limits {
                max_bytes,
                max_files,
                high: 0.9,
                low: 0.5,
            },
            Box::new(Lru::new()),
        )
    }

    fn put(i: &Index, h: BlockHash, bytes: u64) -> Vec<Victim> {
        let (o, v) = i.offer(&[(h, bytes)], false);
        assert_eq!(o, vec![Offer::Reserved]);
        i.commit(&h, bytes);
        v
    }

    #[test]
    fn offer_evicts_lru_and_skips_pins() {
        let i = idx(Some(100), None);
        assert!(put(&i, h(1), 40).is_empty());
        assert!(put(&i, h(2), 40).is_empty());
        i.record_hits(&[h(1)]);
        // h(2) is least recent but pinned by a reader: h(1) goes.
        assert_eq!(i.pin_present(&[&h(2), &h(3)]), vec![true, false]);
        assert_eq!(
            put(&i, h(3), 40),
            vec![Victim {
                hash: h(1),
                bytes: 40
            }]
        );
        i.unpin([&h(2)]);
        assert_eq!(
            put(&i, h(4), 60),
            vec![Victim {
                hash: h(2),
                bytes: 40
            }]
        );
        assert_eq!(i.counts().files, 2);
        assert_eq!(i.counts().evictions, 2);
        assert_eq!(i.counts().bytes, 100);
    }

    #[test]
    fn reservations_count_but_are_not_readable_until_committed() {
        let i = idx(None, Some(2));
        let (o, _) = i.offer(&[(h(1), 10), (h(2), 10)], false);
        assert_eq!(o, vec![Offer::Reserved, Offer::Reserved]);
        assert!(!i.contains(&h(1)), "a block being written is not readable");
        // Full of reservations (pinned): nothing can be evicted for a third block.
        let (o, v) = i.offer(&[(h(3), 10)], false);
        assert_eq!(o, vec![Offer::Reserved]);
        assert!(v.is_empty());
        i.commit(&h(1), 12);
        i.abort(&h(2), Offer::Reserved);
        i.commit(&h(3), 10);
        assert!(i.contains(&h(1)) && !i.contains(&h(2)) && i.contains(&h(3)));
        assert_eq!(i.counts().bytes, 22);
        // Present: touched, or replaced.
        assert_eq!(i.offer(&[(h(1), 10)], false).0, vec![Offer::Touched]);
        assert_eq!(i.offer(&[(h(1), 10)], true).0, vec![Offer::Replace]);
        i.abort(&h(1), Offer::Replace);
        assert!(
            i.contains(&h(1)),
            "a failed replacement keeps the old block"
        );
    }

    #[test]
    fn watermarks_and_accounting() {
        let i = idx(None, Some(10));
        for k in 0..10 {
            i.load(h(k), 10);
        }
        assert!(i.over_high());
        assert_eq!(i.evict_to_low().len(), 5);
        assert!(!i.over_high());
        i.load(h(9), 30); // replaced: 10 -> 30 bytes
        assert_eq!(i.counts().bytes, 4 * 10 + 30);
        assert!(i.remove(&h(9)));
        assert!(!i.remove(&h(9)));
        assert_eq!(i.counts().bytes, 40);
        // h(5) is the least recent, but it is what the room is for.
        let v = i.evict_bytes(15, &[h(5)]);
        assert_eq!(
            v.iter().map(|v| v.hash).collect::<Vec<_>>(),
            vec![h(6), h(7)]
        );
        assert!(i.contains(&h(5)), "kept");
    }

    #[test]
    fn admission_goes_through_the_policy() {
        let i = Index::new(Limits::unbounded(), PolicyKind::Admit2.build());
        assert_eq!(i.offer(&[(h(1), 1)], false).0, vec![Offer::NotAdmitted]);
        assert_eq!(i.offer(&[(h(1), 1)], false).0, vec![Offer::Reserved]);
        i.commit(&h(1), 1);
        assert_eq!(
            i.offer(&[(h(1), 1)], true).0,
            vec![Offer::Replace],
            "present keys are always taken"
        );
        assert_eq!(i.counts().not_admitted, 1);
    }
}
