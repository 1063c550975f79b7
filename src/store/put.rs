//! A put call: the batch (`write.rs`) in sub-batches under the open-file budget, then, if
//! part of it failed, its recovery: the chain kept a prefix, and after ENOSPC below the
//! capacity, eviction and a retry.

use std::sync::atomic::Ordering;

use super::{Inner, Stored, config, write};
use crate::error::{Error, Result};
use crate::key::{BlockHash, BlockKey};
use crate::stats::Counters;

/// Whether a put's result stored its block (written, or present already).
fn stored(r: &Result<Stored>) -> bool {
    matches!(r, Ok(Stored::Written | Stored::Present))
}

impl Inner {
    /// A put that failed part way: keeps the chain's present blocks a prefix of it, and if
    /// the first block it could not store met ENOSPC below the capacity, makes room and
    /// writes the chain from that block on once more, block by block in chain order (so
    /// that the retry's own failures are the chain's tail), until one is not stored. The
    /// blocks it removed and did not write again are counted as not admitted (their results
    /// stay `Ok`).
    fn recover_partial_put<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        replace: bool,
        after: Option<BlockHash>,
        results: &mut [Result<Stored>],
    ) {
        let (gap, cut) = self.cut_after_gap(items, results);
        let Some(g) = gap else { return };
        // The last item offered again (the gap itself when there is no retry): the index
        // counts what it declines of those, and their errors are theirs.
        let mut last_offered = g;
        if matches!(results[g], Err(Error::NoSpace { .. }))
            && (self.room_for_retry(items, g, after) || !cut.is_empty())
        {
            Counters::add(&self.counters.nospace_retries, 1);
            for i in g..items.len() {
                last_offered = i;
                let anchor = i.checked_sub(1).map(|p| items[p].0.hash).or(after);
                let r = self.put_batch(items, &[i], replace, anchor).pop();
                results[i] = r.unwrap_or(Ok(Stored::Declined));
                if !stored(&results[i]) || !self.contains(&items[i].0).unwrap_or(false) {
                    break;
                }
            }
        }
        let mut lost = 0;
        for &i in cut.iter().filter(|&&i| i > last_offered) {
            if stored(&results[i]) {
                results[i] = Ok(Stored::Declined);
                lost += 1;
            }
        }
        if lost > 0 {
            self.index.count_not_admitted(lost as u64);
        }
    }

    /// Evicts other blocks (never this batch's, as the index never does for it, nor the
    /// prefix it hangs from) to make room for the chain from item `g` on; whether any went.
    fn room_for_retry<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        g: usize,
        after: Option<BlockHash>,
    ) -> bool {
        let need: u64 = items[g..]
            .iter()
            .map(|(_, d)| write::disk_estimate(write::Source::len(d)))
            .sum();
        let floor = self.index.counts().bytes / 100;
        let keep: Vec<BlockHash> = items.iter().map(|(k, _)| k.hash).chain(after).collect();
        let victims = self.index.evict_bytes(need.max(floor), &keep);
        if victims.is_empty() {
            return false;
        }
        self.unlink_victims(victims);
        true
    }

    /// The first item that is not stored (failed, declined, or not present), and the blocks
    /// after it that were stored and are now removed: no prefix lookup could reach them
    /// (removing a block removes its descendants with it, so they are found first).
    fn cut_after_gap<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        results: &[Result<Stored>],
    ) -> (Option<usize>, Vec<usize>) {
        let kept = |i: usize| stored(&results[i]) && self.contains(&items[i].0).unwrap_or(false);
        let Some(gap) = (0..items.len()).find(|&i| !kept(i)) else {
            return (None, Vec::new());
        };
        let cut: Vec<usize> = (gap + 1..items.len()).filter(|&i| kept(i)).collect();
        for &i in &cut {
            if let Err(e) = self.remove(&items[i].0, true) {
                tracing::warn!(error = %e, "put: a block after a gap in its chain could not be removed");
            }
        }
        if !cut.is_empty() {
            tracing::debug!(
                cut = cut.len(),
                gap,
                "put: blocks after a gap in their chain removed"
            );
        }
        (Some(gap), cut)
    }

    /// A put batch, then, if part of it failed, its recovery ([`Inner::recover_partial_put`]:
    /// the chain kept a prefix, and after ENOSPC below the capacity, eviction and a retry).
    pub(super) fn put_with_retry<D: write::Source>(
        &self,
        items: &[(BlockKey, D)],
        replace: bool,
        after: Option<BlockHash>,
    ) -> Vec<Result<Stored>> {
        if self.opts.read_only {
            return items
                .iter()
                .map(|_| {
                    Err(Error::ReadOnly {
                        path: self.ns.path().to_path_buf(),
                        op: "put",
                    })
                })
                .collect();
        }
        if self.lock_lost.load(Ordering::Relaxed) {
            let holder = self.ns.holder();
            return items
                .iter()
                .map(|_| {
                    Err(Error::WorkerBusy {
                        path: self.ns.path().to_path_buf(),
                        holder: holder.clone(),
                    })
                })
                .collect();
        }
        // Shared: a present block is never rewritten (another store may be reading it, and
        // its key names its content).
        let replace = replace && self.shared.is_none();
        let started = std::time::Instant::now();
        // A batch larger than the open-file budget runs as consecutive sub-batches, each
        // hung from the last block of the one before (a gap there cuts the rest, as in one
        // batch), so that a batch of any size stays under the open-file limit.
        let all: Vec<usize> = (0..items.len()).collect();
        let mut results = Vec::with_capacity(items.len());
        for chunk in all.chunks(config::batch_files()) {
            let anchor = chunk[0].checked_sub(1).map(|p| items[p].0.hash).or(after);
            results.extend(self.put_batch(items, chunk, replace, anchor));
        }
        if results.iter().any(Result::is_err) {
            self.recover_partial_put(items, replace, after, &mut results);
        }
        let errors = results.iter().filter(|r| r.is_err()).count();
        Counters::add(&self.counters.put_errors, errors as u64);
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            self.counters.error(e);
        }
        self.counters.put_latency.record(started.elapsed());
        if self.index.over_high() {
            if let Some(ev) = &*self
                .threads
                .evictor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
            {
                ev.wake();
            }
        }
        results
    }
}
