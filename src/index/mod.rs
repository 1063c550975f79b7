//! What is kept: the in-memory index of a worker's blocks, capacity accounting, pins, and the
//! choice of victims through a [`policy::Policy`].
//!
//! The index knows every block file of its worker (rebuilt by a scan when a store opens) and
//! the bytes each takes on disk (`st_blocks`, header included). The store asks it before
//! touching the disk: an absent key is a miss without a system call.
//!
//! It also knows the chains: a batch offered to it is one chain, root first, so each block's
//! parent is the block before it. The present set is kept *prefix-closed* (a block is held
//! only while its parent is): eviction takes only blocks without present children (chains are
//! cut from the tail), a block whose parent is declined is declined too, and a block that
//! leaves for another reason (removed, corrupt, deleted) takes its descendants with it.

pub mod policy;

use std::collections::{HashMap, HashSet};
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
    /// The block before it in its chain, when known (offered in one batch with it).
    parent: Option<BlockHash>,
    /// Present blocks whose parent it is.
    children: Vec<BlockHash>,
}

impl Entry {
    fn new(bytes: u64, pending: bool, parent: Option<BlockHash>) -> Entry {
        Entry {
            bytes,
            pins: u32::from(pending),
            pending,
            parent,
            children: Vec::new(),
        }
    }
}

/// What an offered block becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Present: touched; nothing to write.
    Touched,
    /// Present, and the caller replaces it: room for the whole new file was reserved
    /// (`reserved` bytes: old and new file coexist until the rename); write it, then
    /// `commit` (or `abort`).
    Replace {
        /// Bytes reserved for the new file.
        reserved: u64,
    },
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
    /// Temp files of replacements in flight: each counts as a file against the bound until
    /// it is renamed over the block it replaces.
    extra_files: u64,
    /// Evicted blocks whose files are not unlinked yet (`drained` when they are): still on
    /// disk, so they count against the bound for everyone but the caller that unlinks them
    /// before creating its own files.
    draining_bytes: u64,
    draining_files: u64,
    /// Draining victims whose files could not be unlinked (immutable, under a mount point, in
    /// a directory the store may not write): they still count, and are tried again.
    stuck: Vec<Victim>,
    /// Running mean of offered block sizes, to turn a byte capacity into the block count
    /// that policies size their ghost lists by.
    mean_bytes: f64,
}

/// The bytes and files of `victims`: what a caller that unlinks them itself may count as free.
fn credit(victims: &[Victim]) -> (u64, u64) {
    (victims.iter().map(|v| v.bytes).sum(), victims.len() as u64)
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
    /// False for a shared store: the capacity is the tree's (its ledger's), so the index
    /// evicts only when asked ([`Index::evict_some`]); `limits` still size the policy.
    enforce: bool,
}

impl Index {
    #[cfg(test)]
    pub fn new(limits: Limits, policy: Box<dyn Policy>) -> Self {
        Self::with_enforcement(limits, policy, true)
    }

    /// An index whose bound is kept elsewhere (`enforce: false`, a shared worker's ledger):
    /// it never evicts by itself, and `limits` only tell the policy the capacity.
    pub fn with_enforcement(limits: Limits, mut policy: Box<dyn Policy>, enforce: bool) -> Self {
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
                extra_files: 0,
                draining_bytes: 0,
                draining_files: 0,
                stuck: Vec::new(),
                mean_bytes: 0.0,
            }),
            limits,
            enforce,
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
        st.policy.on_chain(None);
        st.policy.on_access(&batch);
    }

    /// Offers a batch of blocks, one chain in chain order (with the on-disk bytes each would
    /// take): present blocks are touched (or, with `replace`, marked for rewriting); absent
    /// ones go through admission, and room is made for each admitted one before it is
    /// reserved. Returns what each block became and the victims whose files the caller must
    /// unlink.
    ///
    /// Room is made only by evicting blocks without present children (never this batch's);
    /// when none can go, the block is not admitted. Once a block of the chain is not
    /// admitted, neither is any block after it, so the present set stays prefix-closed and
    /// a batch larger than the capacity stores the prefix that fits.
    ///
    /// Accesses reach the policy in batch order; before each eviction the accesses seen so
    /// far are handed over, so a policy sees touches and insertions interleaved with its
    /// evictions exactly as a block-by-block replay would.
    ///
    /// `after` is the chain parent of `items[0]` (the last block of a cached prefix), if
    /// any; when it is not present, nothing of the batch is admitted.
    pub fn offer(
        &self,
        items: &[(BlockHash, u64)],
        replace: bool,
        after: Option<BlockHash>,
    ) -> (Vec<Offer>, Vec<Victim>) {
        let mut st = self.lock();
        self.update_hint(&mut st, items);
        let mut out = Vec::with_capacity(items.len());
        let mut victims = Vec::new();
        let mut acc: Vec<Access> = Vec::with_capacity(items.len());
        let mut parent: Option<BlockHash> = after;
        let mut declined = after.is_some_and(|p| st.map.get(&p).is_none_or(|e| e.pending));
        // The cached prefix's last block is what this chain hangs from: it must stay.
        let anchor = after.filter(|_| !declined);
        if let Some(a) = anchor {
            if let Some(e) = st.map.get_mut(&a) {
                e.pins += 1;
            }
        }
        // Pinned for the batch: what it touched stays while the rest is placed.
        let mut touched: Vec<BlockHash> = Vec::new();
        st.policy.on_chain(after.as_ref());
        // The batch's keys so far: a key repeated in one batch is the block already placed,
        // neither a second access nor a link back into the chain (which would make a loop
        // that eviction, cutting tails, never opens); offered, it is only touched, and put
        // (`replace`), its later item replaces the earlier one, as a put of a present key.
        let mut seen: HashSet<BlockHash> = HashSet::with_capacity(items.len());
        for &(hash, est) in items {
            let prev = parent.replace(hash);
            let repeat = !seen.insert(hash);
            if repeat && (declined || !replace) {
                out.push(Self::repeated(&mut st, declined));
                continue;
            }
            if st.map.contains_key(&hash) && !declined {
                // Present (or reserved by another put of the same key: this one replaces it).
                let pending = st.map.get(&hash).is_some_and(|e| e.pending);
                if replace || pending {
                    // Pinned: not its own victim, and kept for the replacement.
                    if let Some(e) = st.map.get_mut(&hash) {
                        e.pins += 1;
                    }
                    if !self.make_room(&mut st, &mut acc, &mut victims, est) {
                        if let Some(e) = st.map.get_mut(&hash) {
                            e.pins -= 1;
                        }
                        st.not_admitted += 1;
                        out.push(Offer::NotAdmitted);
                        declined = true;
                        continue;
                    }
                    st.bytes += est;
                    st.extra_files += 1;
                    out.push(Offer::Replace { reserved: est });
                } else {
                    if let Some(e) = st.map.get_mut(&hash) {
                        e.pins += 1;
                    }
                    touched.push(hash);
                    out.push(Offer::Touched);
                }
                if !repeat {
                    Self::link(&mut st, prev, hash);
                    acc.push(Access {
                        hash,
                        inserted: false,
                    });
                }
                continue;
            }
            if declined || st.map.contains_key(&hash) {
                // Its parent was declined: it could never be reached. The policy still sees
                // it offered (admission counts sightings), then forgets it.
                if !st.map.contains_key(&hash) {
                    Self::touches_first(&mut st, &mut acc);
                    let _ = st.policy.admit(&hash);
                    st.policy.on_remove(&hash);
                }
                st.not_admitted += 1;
                out.push(Offer::NotAdmitted);
                continue;
            }
            Self::touches_first(&mut st, &mut acc);
            if !st.policy.admit(&hash) {
                st.not_admitted += 1;
                out.push(Offer::NotAdmitted);
                declined = true;
                continue;
            }
            if !self.make_room(&mut st, &mut acc, &mut victims, est) {
                // Everything left is pinned, being written, or a parent: no room.
                st.policy.on_remove(&hash);
                st.not_admitted += 1;
                out.push(Offer::NotAdmitted);
                declined = true;
                continue;
            }
            st.map.insert(hash, Entry::new(est, true, None));
            Self::link(&mut st, prev, hash);
            st.bytes += est;
            acc.push(Access {
                hash,
                inserted: true,
            });
            out.push(Offer::Reserved);
        }
        st.policy.on_access(&acc);
        for h in touched.into_iter().chain(anchor) {
            if let Some(e) = st.map.get_mut(&h) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
        (out, victims)
    }

    /// What a key repeated in one offer becomes: not admitted (counted) after a decline,
    /// else touched (the block its first item placed).
    fn repeated(st: &mut State, declined: bool) -> Offer {
        if declined {
            st.not_admitted += 1;
            Offer::NotAdmitted
        } else {
            Offer::Touched
        }
    }

    /// Before an admission, hands the policy the batch's accesses so far if any is a touch, so
    /// the policy sees touches and admissions in chain order. (Insertions alone stay batched:
    /// their admission was already seen, and ARC orders a batch deepest first.)
    fn touches_first(st: &mut State, acc: &mut Vec<Access>) {
        if acc.iter().any(|a| !a.inserted) {
            st.policy.on_access(acc);
            acc.clear();
        }
    }

    /// Makes room on disk for one more file of `est` bytes: hands the policy the batch's
    /// accesses so far, then evicts (the victims join `victims`, which the caller unlinks
    /// before it creates any file). True if it fits now.
    fn make_room(
        &self,
        st: &mut State,
        acc: &mut Vec<Access>,
        victims: &mut Vec<Victim>,
        est: u64,
    ) -> bool {
        if !self.over_disk(st, est, 1, credit(victims)) {
            return true;
        }
        st.policy.on_access(acc);
        acc.clear();
        let v = self.evict_locked(st, credit(victims), |ix, st, c| ix.over_disk(st, est, 1, c));
        victims.extend(v);
        !self.over_disk(st, est, 1, credit(victims))
    }

    /// Records that `parent` (when present) is the chain parent of the present `child`, if
    /// the child has none yet (e.g. it was loaded by a rebuild, or first stored as a root).
    fn link(st: &mut State, parent: Option<BlockHash>, child: BlockHash) {
        let Some(p) = parent else { return };
        if p == child || !st.map.contains_key(&p) {
            return;
        }
        match st.map.get(&child) {
            Some(c) if c.parent.is_none() => {
                // A root with descendants, hung below one of them, would close a loop.
                if !c.children.is_empty() && Self::descends(st, p, &child) {
                    return;
                }
            }
            _ => return,
        }
        if let Some(c) = st.map.get_mut(&child) {
            c.parent = Some(p);
        }
        if let Some(pe) = st.map.get_mut(&p) {
            pe.children.push(child);
        }
    }

    /// Whether `node` is `ancestor` or below it (its parents, followed up to a root, pass it).
    /// Parents never form a loop ([`Index::link`] sees to it), so the walk ends.
    fn descends(st: &State, mut node: BlockHash, ancestor: &BlockHash) -> bool {
        loop {
            if node == *ancestor {
                return true;
            }
            match st.map.get(&node).and_then(|e| e.parent) {
                Some(p) => node = p,
                None => return false,
            }
        }
    }

    /// Every block the index holds (those being written included).
    pub fn hashes(&self) -> HashSet<BlockHash> {
        self.lock().map.keys().copied().collect()
    }

    /// A put of `hash` was published and takes `bytes` on disk. Returns victims to unlink
    /// when the file took more than was reserved and the bound is exceeded.
    pub fn commit(&self, hash: &BlockHash, bytes: u64, offer: Offer) -> Vec<Victim> {
        let mut st = self.lock();
        match st.map.get_mut(hash) {
            Some(e) => {
                let (old, extra) = match offer {
                    // The old file is gone (renamed over) and the reservation is spent.
                    Offer::Replace { reserved } => (e.bytes, reserved),
                    _ => (e.bytes, 0),
                };
                let replaced = matches!(offer, Offer::Replace { .. });
                e.bytes = bytes;
                e.pins = e.pins.saturating_sub(1);
                e.pending = false;
                st.bytes = (st.bytes + bytes).saturating_sub(old + extra);
                if replaced {
                    st.extra_files = st.extra_files.saturating_sub(1);
                }
            }
            None => {
                // Removed while it was being written (e.g. `remove_many`): it is on disk now.
                if let Offer::Replace { reserved } = offer {
                    st.bytes = st.bytes.saturating_sub(reserved);
                    st.extra_files = st.extra_files.saturating_sub(1);
                }
                st.map.insert(*hash, Entry::new(bytes, false, None));
                st.bytes += bytes;
                st.policy.on_access(&[Access {
                    hash: *hash,
                    inserted: true,
                }]);
            }
        }
        if self.over(&st, 0, 0) {
            // Pinned while it is placed: the block just published is not its own victim.
            if let Some(e) = st.map.get_mut(hash) {
                e.pins += 1;
            }
            let v = self.evict_locked(&mut st, (0, 0), |ix, st, c| ix.over_disk(st, 0, 0, c));
            if let Some(e) = st.map.get_mut(hash) {
                e.pins -= 1;
            }
            return v;
        }
        Vec::new()
    }

    /// A put of `hash` failed: a reservation is dropped, a replacement keeps the old block.
    pub fn abort(&self, hash: &BlockHash, offer: Offer) {
        let mut st = self.lock();
        let reserved = offer == Offer::Reserved && st.map.get(hash).is_some_and(|e| e.pending);
        if reserved {
            // A child reserved after it in the same batch is aborted by its own put.
            Self::take(&mut st, hash);
        } else {
            if let Offer::Replace { reserved } = offer {
                st.bytes = st.bytes.saturating_sub(reserved);
                st.extra_files = st.extra_files.saturating_sub(1);
            }
            if let Some(e) = st.map.get_mut(hash) {
                e.pins = e.pins.saturating_sub(1);
            }
        }
    }

    /// Takes a block out of the index, its policy and its parent's children; returns its
    /// entry (with its children, which the caller deals with).
    fn take(st: &mut State, h: &BlockHash) -> Option<Entry> {
        let e = st.map.remove(h)?;
        st.bytes -= e.bytes;
        st.policy.on_remove(h);
        Self::unlink_parent(st, h, e.parent);
        Some(e)
    }

    fn unlink_parent(st: &mut State, hash: &BlockHash, parent: Option<BlockHash>) {
        if let Some(p) = parent {
            if let Some(pe) = st.map.get_mut(&p) {
                pe.children.retain(|c| c != hash);
            }
        }
    }

    /// A reserved put that must not be written after all (a shared capacity declined it):
    /// dropped as by [`Index::abort`], and counted as not admitted.
    pub fn decline(&self, hash: &BlockHash, offer: Offer) {
        self.abort(hash, offer);
        self.lock().not_admitted += 1;
    }

    /// Counts `n` blocks as not admitted: a put removed them again because the block before
    /// them in their chain could not be stored.
    pub fn count_not_admitted(&self, n: u64) {
        self.lock().not_admitted += n;
    }

    /// Adds a block found on disk (the rebuild on open; call oldest first).
    pub fn load(&self, hash: BlockHash, bytes: u64) {
        self.load_many(std::iter::once((hash, bytes)));
    }

    /// Adds blocks found on disk, oldest first (the rebuild on open): one lock and the map
    /// grown once. The policy is told one block at a time, as separate accesses (a batch
    /// would be one request, whose order some policies read backwards).
    pub fn load_many(&self, blocks: impl ExactSizeIterator<Item = (BlockHash, u64)>) {
        let mut st = self.lock();
        st.map.reserve(blocks.len());
        for (hash, bytes) in blocks {
            match st.map.get_mut(&hash) {
                Some(e) => {
                    let old = e.bytes;
                    e.bytes = bytes;
                    st.bytes -= old;
                }
                None => {
                    st.map.insert(hash, Entry::new(bytes, false, None));
                }
            }
            st.bytes += bytes;
            st.policy.on_access(&[Access {
                hash,
                inserted: true,
            }]);
        }
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
        self.over_disk(st, bytes, files, (st.draining_bytes, st.draining_files))
    }

    /// True if `bytes` and `files` more would not fit on disk: what is held and reserved, plus
    /// evicted files not yet unlinked, less `credit` (the victims the caller itself unlinks
    /// before it creates any file).
    fn over_disk(&self, st: &State, bytes: u64, files: u64, credit: (u64, u64)) -> bool {
        if !self.enforce {
            return false;
        }
        let (max_b, max_f) = self.limits.scaled(1.0);
        let on_disk_b = (st.bytes + st.draining_bytes).saturating_sub(credit.0);
        let on_disk_f =
            (st.map.len() as u64 + st.extra_files + st.draining_files).saturating_sub(credit.1);
        on_disk_b.saturating_add(bytes) > max_b || on_disk_f.saturating_add(files) > max_f
    }

    /// The files of `victims` are unlinked (or found gone): they no longer count.
    pub fn drained(&self, victims: &[Victim]) {
        if victims.is_empty() {
            return;
        }
        let mut st = self.lock();
        for v in victims {
            st.draining_bytes = st.draining_bytes.saturating_sub(v.bytes);
            st.draining_files = st.draining_files.saturating_sub(1);
        }
    }

    /// The files of `victims` could not be unlinked: they stay on disk, so they go on
    /// counting against the bound (as draining) until [`Index::take_stuck`] hands them out
    /// again and they are `drained`.
    pub fn stuck(&self, victims: Vec<Victim>) {
        if !victims.is_empty() {
            self.lock().stuck.extend(victims);
        }
    }

    /// At most `max` of the victims left [`Index::stuck`], to try to unlink again (they still
    /// count as draining).
    pub fn take_stuck(&self, max: usize) -> Vec<Victim> {
        let mut st = self.lock();
        let n = st.stuck.len().min(max);
        st.stuck.drain(..n).collect()
    }

    /// True if what is held, reserved and still draining exceeds the capacity (victims that
    /// could not be unlinked can put it there; never for a bound kept elsewhere).
    pub fn over_bound(&self) -> bool {
        let st = self.lock();
        self.over_disk(&st, 0, 0, (0, 0))
    }

    /// Forgets a block that left behind the store's back (found missing, corrupt, or not a
    /// regular file). Its children are kept, detached: they become reachable again when the
    /// engine recomputes and stores the block (content addresses: same key), and a chain
    /// offered through them links them again. True if it was known.
    pub fn forget(&self, h: &BlockHash) -> bool {
        let mut st = self.lock();
        let Some(e) = Self::take(&mut st, h) else {
            return false;
        };
        for c in e.children {
            if let Some(ce) = st.map.get_mut(&c) {
                ce.parent = None;
            }
        }
        true
    }

    /// Forgets the present blocks (not pinned, not being written) that are not in `found`
    /// (a scan of the tree found their files gone: another store evicted them). Returns how
    /// many.
    pub fn forget_absent(&self, found: &std::collections::HashSet<BlockHash>) -> usize {
        self.absent(found).iter().filter(|h| self.forget(h)).count()
    }

    /// The present blocks (not pinned, not being written) that are not in `found`: those
    /// [`Index::forget_absent`] forgets.
    pub fn absent(&self, found: &std::collections::HashSet<BlockHash>) -> Vec<BlockHash> {
        let st = self.lock();
        st.map
            .iter()
            .filter(|(h, e)| !found.contains(*h) && e.pins == 0 && !e.pending)
            .map(|(h, _)| *h)
            .collect()
    }

    /// Removes a block (the user's `remove_many`) and, since they can no longer be reached,
    /// its descendants: returned as victims whose files the caller unlinks.
    pub fn remove(&self, h: &BlockHash) -> Vec<Victim> {
        let mut st = self.lock();
        let Some(e) = Self::take(&mut st, h) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut stack = e.children;
        while let Some(c) = stack.pop() {
            // A descendant still being written is left to its put (its parent is gone).
            if st.map.get(&c).is_some_and(|d| d.pending) {
                continue;
            }
            if let Some(d) = st.map.remove(&c) {
                st.bytes -= d.bytes;
                st.draining_bytes += d.bytes;
                st.draining_files += 1;
                st.policy.on_remove(&c);
                st.evictions += 1;
                st.evicted_bytes += d.bytes;
                out.push(Victim {
                    hash: c,
                    bytes: d.bytes,
                });
                stack.extend(d.children);
            }
        }
        out
    }

    /// True if every present block with a known parent has that parent present: the
    /// invariant the module docs state (for tests).
    #[cfg(test)]
    pub fn is_prefix_closed(&self) -> bool {
        let st = self.lock();
        st.map.iter().all(|(h, e)| {
            e.parent
                .is_none_or(|p| st.map.get(&p).is_some_and(|pe| pe.children.contains(h)))
                && e.children
                    .iter()
                    .all(|c| st.map.get(c).is_some_and(|ce| ce.parent == Some(*h)))
        })
    }

    /// True when usage is above the high watermark.
    pub fn over_high(&self) -> bool {
        if !self.enforce {
            return false;
        }
        let (hb, hf) = self.limits.scaled(self.limits.high);
        let st = self.lock();
        st.bytes > hb || st.map.len() as u64 > hf
    }

    /// Evicts toward the low watermark, at most `max` blocks (the evictor unlinks them and
    /// comes back, so little is ever evicted but not yet unlinked).
    pub fn evict_to_low(&self, max: usize) -> Vec<Victim> {
        let (lb, lf) = self.limits.scaled(self.limits.low);
        let mut st = self.lock();
        let mut n = 0;
        self.evict_locked(&mut st, (0, 0), |_, st, _| {
            n += 1;
            n <= max && (st.bytes > lb || st.map.len() as u64 > lf)
        })
    }

    /// Evicts down to the bounds themselves.
    pub fn evict_to_bound(&self) -> Vec<Victim> {
        let mut st = self.lock();
        self.evict_locked(&mut st, (0, 0), |ix, st, c| ix.over_disk(st, 0, 0, c))
    }

    /// Evicts at least `bytes` (for ENOSPC below the configured capacity), never the blocks
    /// in `keep` (the ones the room is for).
    pub fn evict_bytes(&self, bytes: u64, keep: &[BlockHash]) -> Vec<Victim> {
        self.evict_some(bytes, 0, keep)
    }

    /// Evicts at least `bytes` and `files` (or all it can), never the blocks in `keep`: room
    /// under a capacity kept elsewhere (a shared worker's ledger).
    pub fn evict_some(&self, bytes: u64, files: u64, keep: &[BlockHash]) -> Vec<Victim> {
        let mut st = self.lock();
        let target = st.bytes.saturating_sub(bytes);
        let target_files = (st.map.len() as u64).saturating_sub(files);
        let mut pinned = Vec::new();
        for h in keep {
            if let Some(e) = st.map.get_mut(h) {
                e.pins += 1;
                pinned.push(*h);
            }
        }
        let out = self.evict_locked(&mut st, (0, 0), |_, st, _| {
            st.bytes > target || st.map.len() as u64 > target_files
        });
        for h in pinned {
            if let Some(e) = st.map.get_mut(&h) {
                e.pins -= 1;
            }
        }
        out
    }

    /// Evicts while `over(index, state, credit)` says so, where `credit` is `base` plus what
    /// this call evicted so far; evicted blocks count as draining until `drained`.
    fn evict_locked(
        &self,
        st: &mut State,
        base: (u64, u64),
        mut over: impl FnMut(&Self, &State, (u64, u64)) -> bool,
    ) -> Vec<Victim> {
        let mut out: Vec<Victim> = Vec::new();
        let mut c = base;
        while over(self, st, c) {
            let State { map, policy, .. } = &mut *st;
            // Only leaves of the chain tree go: a block with present children is their prefix.
            let Some(v) = policy.victim(&|h| {
                map.get(h)
                    .is_some_and(|e| e.pins > 0 || e.pending || !e.children.is_empty())
            }) else {
                break; // everything left is pinned or a parent
            };
            if let Some(e) = st.map.remove(&v) {
                Self::unlink_parent(st, &v, e.parent);
                st.bytes -= e.bytes;
                st.draining_bytes += e.bytes;
                st.draining_files += 1;
                c = (c.0 + e.bytes, c.1 + 1);
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

    /// The policy's one-line summary of its state ([`Policy::summary`]).
    #[cfg(test)]
    pub(crate) fn policy_summary(&self) -> String {
        self.lock().policy.summary()
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

    /// Blocks a put removed again (after a gap in their chain) add to the declined ones.
    #[test]
    fn blocks_cut_after_a_gap_count_as_not_admitted() {
        let i = idx(Some(100), None);
        let (o, _) = i.offer(&[(h(1), 60), (h(2), 60)], false, None);
        assert_eq!(o[1], Offer::NotAdmitted);
        i.count_not_admitted(4);
        assert_eq!(i.counts().not_admitted, 5);
    }

    fn put(i: &Index, h: BlockHash, bytes: u64) -> Vec<Victim> {
        let (o, v) = i.offer(&[(h, bytes)], false, None);
        i.drained(&v); // the store unlinks them before writing
        assert_eq!(o, vec![Offer::Reserved]);
        assert!(i.commit(&h, bytes, o[0]).is_empty());
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
        let (o, _) = i.offer(&[(h(1), 10), (h(2), 10)], false, None);
        assert_eq!(o, vec![Offer::Reserved, Offer::Reserved]);
        assert!(!i.contains(&h(1)), "a block being written is not readable");
        // Full of reservations (pinned): nothing can be evicted for a third block, which is
        // not admitted (the bound holds).
        let (o, v) = i.offer(&[(h(3), 10)], false, None);
        assert_eq!(o, vec![Offer::NotAdmitted]);
        assert!(v.is_empty());
        assert!(i.commit(&h(1), 12, Offer::Reserved).is_empty());
        i.abort(&h(2), Offer::Reserved);
        let (o, _) = i.offer(&[(h(3), 10)], false, None);
        assert_eq!(o, vec![Offer::Reserved]);
        i.commit(&h(3), 10, o[0]);
        assert!(i.contains(&h(1)) && !i.contains(&h(2)) && i.contains(&h(3)));
        assert_eq!(i.counts().bytes, 22);
        // Present: touched, or replaced (room for the whole new file is reserved).
        assert_eq!(i.offer(&[(h(1), 10)], false, None).0, vec![Offer::Touched]);
        let (o, v) = i.offer(&[(h(1), 10)], true, None);
        assert_eq!(o, vec![Offer::Replace { reserved: 10 }]);
        assert_eq!(v.len(), 1, "h(3) made room for the new file of h(1)");
        assert_eq!(i.counts().bytes, 22, "12 + the reserved 10, without h(3)");
        i.abort(&h(1), o[0]);
        assert!(
            i.contains(&h(1)),
            "a failed replacement keeps the old block"
        );
        assert_eq!(i.counts().bytes, 12);
    }

    #[test]
    fn watermarks_and_accounting() {
        let i = idx(None, Some(10));
        for k in 0..10 {
            i.load(h(k), 10);
        }
        assert!(i.over_high());
        let first = i.evict_to_low(3);
        assert_eq!(first.len(), 3, "at most the step");
        i.drained(&first);
        assert_eq!(i.evict_to_low(100).len(), 2);
        assert!(!i.over_high());
        i.load(h(9), 30); // replaced: 10 -> 30 bytes
        assert_eq!(i.counts().bytes, 4 * 10 + 30);
        assert!(i.remove(&h(9)).is_empty());
        assert!(!i.contains(&h(9)));
        assert_eq!(i.counts().bytes, 40);
        // h(5) is the least recent, but it is what the room is for.
        let v = i.evict_bytes(15, &[h(5)]);
        assert_eq!(
            v.iter().map(|v| v.hash).collect::<Vec<_>>(),
            vec![h(6), h(7)]
        );
        assert!(i.contains(&h(5)), "kept");
    }

    /// Offers a chain of `ids` (root first) after `after`, committing what was reserved.
    fn chain(i: &Index, ids: &[u64], after: Option<u64>) -> Vec<Offer> {
        let items: Vec<(BlockHash, u64)> = ids.iter().map(|&k| (h(k), 1)).collect();
        let (o, v) = i.offer(&items, false, after.map(h));
        i.drained(&v);
        for ((hh, _), o) in items.iter().zip(&o) {
            if matches!(o, Offer::Reserved) {
                i.commit(hh, 1, *o);
            }
        }
        o
    }

    #[test]
    fn chains_are_cut_from_the_tail() {
        for kind in [
            PolicyKind::Lru,
            PolicyKind::Admit2,
            PolicyKind::Arc,
            PolicyKind::Adaptive,
        ] {
            let i = Index::new(
                Limits {
                    max_bytes: None,
                    max_files: Some(50),
                    high: 1.0,
                    low: 1.0,
                },
                kind.build(),
            );
            for round in 0..2 {
                for c in 0..3u64 {
                    chain(&i, &(c * 100..c * 100 + 30).collect::<Vec<_>>(), None);
                    assert!(i.is_prefix_closed(), "{kind} round {round}");
                }
            }
            assert!(i.counts().files <= 50, "{kind}");
            // Every chain is present as a prefix: root first.
            for c in 0..3u64 {
                let present: Vec<bool> =
                    (c * 100..c * 100 + 30).map(|k| i.contains(&h(k))).collect();
                let n = present.iter().take_while(|p| **p).count();
                assert!(
                    present[n..].iter().all(|p| !p),
                    "{kind} chain {c}: {present:?}"
                );
            }
            // The most recent chain is whole (ARC, LRU) or at least rooted.
            assert!(i.contains(&h(200)), "{kind}");
        }
    }

    #[test]
    fn a_batch_over_the_capacity_stores_the_prefix_that_fits() {
        let i = idx(None, Some(10));
        let o = chain(&i, &(0..200).collect::<Vec<_>>(), None);
        assert_eq!(o.iter().filter(|o| **o == Offer::Reserved).count(), 10);
        assert!(o[..10].iter().all(|o| *o == Offer::Reserved));
        assert!(o[10..].iter().all(|o| *o == Offer::NotAdmitted));
        assert_eq!(i.counts().files, 10);
        assert_eq!(i.counts().not_admitted, 190);
        // A continuation of a chain whose parent is gone stores nothing.
        assert!(
            chain(&i, &[500, 501], Some(999))
                .iter()
                .all(|o| *o == Offer::NotAdmitted)
        );
        // Removing a block removes its descendants.
        let orphans = i.remove(&h(5));
        assert_eq!(orphans.len(), 4);
        assert!(i.contains(&h(4)) && !i.contains(&h(6)));
        assert!(i.is_prefix_closed());
    }

    #[test]
    fn a_commit_larger_than_reserved_evicts_to_the_bound() {
        let i = idx(Some(100), None);
        assert!(put(&i, h(1), 40).is_empty());
        let (o, _) = i.offer(&[(h(2), 40)], false, None);
        // The filesystem took more than estimated: the bound is restored at once.
        let v = i.commit(&h(2), 70, o[0]);
        assert_eq!(v.iter().map(|v| v.hash).collect::<Vec<_>>(), vec![h(1)]);
        assert!(i.counts().bytes <= 100);
    }

    #[test]
    fn evicted_blocks_not_yet_unlinked_still_count() {
        let i = idx(None, Some(2));
        assert!(put(&i, h(1), 10).is_empty());
        assert!(put(&i, h(2), 10).is_empty());
        // The background evictor took h(1) and has not unlinked it yet.
        let bg = i.evict_to_low(1);
        assert_eq!(bg.iter().map(|v| v.hash).collect::<Vec<_>>(), vec![h(1)]);
        // Its file is still on disk: a new block needs another victim to fit two files.
        let (o, v) = i.offer(&[(h(3), 10)], false, None);
        assert_eq!(o, vec![Offer::Reserved]);
        assert_eq!(v.iter().map(|v| v.hash).collect::<Vec<_>>(), vec![h(2)]);
        i.drained(&v);
        i.commit(&h(3), 10, o[0]);
        // Once it is unlinked, there is room again without evicting.
        i.drained(&bg);
        let (o, v) = i.offer(&[(h(4), 10)], false, None);
        assert_eq!(o, vec![Offer::Reserved]);
        assert!(v.is_empty());
    }

    #[test]
    fn admission_goes_through_the_policy() {
        let i = Index::new(Limits::unbounded(), PolicyKind::Admit2.build());
        assert_eq!(
            i.offer(&[(h(1), 1)], false, None).0,
            vec![Offer::NotAdmitted]
        );
        assert_eq!(i.offer(&[(h(1), 1)], false, None).0, vec![Offer::Reserved]);
        i.commit(&h(1), 1, Offer::Reserved);
        assert_eq!(
            i.offer(&[(h(1), 1)], true, None).0,
            vec![Offer::Replace { reserved: 1 }],
            "present keys are always taken"
        );
        assert_eq!(i.counts().not_admitted, 1);
    }
}
