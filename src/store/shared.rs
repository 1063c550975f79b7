//! Shared mode (docs/shared.md): what a store keeps when other stores, in other processes or
//! on other nodes, use the same worker directory.
//!
//! - **The usage ledger** (`USAGE`): the bytes and files of the worker's blocks, for the whole
//!   tree, read and rewritten under the file's `flock` by every store that shares it. A put
//!   reserves its batch there before it creates a file (evicting from its own index until the
//!   batch fits, or declining the chain's tail); what turns out different from the reservation
//!   (a block another store published first, a failed write, the exact size, an eviction) is a
//!   correction applied at the next update: at once when the ledger counts too little, else
//!   with the next reservation, the stats tick or the close.
//! - **Negative answers**: a key found absent in the tree is taken as absent for the
//!   configured time, so a request's prefix that misses asks the filesystem once per key and
//!   period, not once per lookup.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Inner, sweep};
use crate::error::Result;
use crate::index::{Limits, Offer};
use crate::key::BlockHash;
use crate::ns::{BlockDir, Ledger};

/// Keys remembered as absent at most (the oldest are forgotten first).
const NEGATIVE_ENTRIES: usize = 1 << 16;

/// The usage the ledger records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Bytes on disk of the worker's block files (and reserved for puts in flight).
    pub bytes: u64,
    /// Block files (and reservations).
    pub files: u64,
}

impl Usage {
    /// The ledger's text: `bytes=N` and `files=N` lines, each number 20 digits wide, so
    /// every record has the same length and a rewrite in place never leaves a tail.
    pub fn to_text(self) -> String {
        format!("bytes={:020}\nfiles={:020}\n", self.bytes, self.files)
    }

    /// Parses the ledger's text; `None` if it is not one (empty, torn or foreign).
    pub fn from_text(text: &[u8]) -> Option<Usage> {
        let text = std::str::from_utf8(text).ok()?;
        let field = |k: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.trim().parse().ok())
        };
        let lines = text.lines().count();
        (lines == 2 && text.ends_with('\n')).then_some(())?;
        Some(Usage {
            bytes: field("bytes")?,
            files: field("files")?,
        })
    }
}

/// Which way a ledger's record cannot be the tree's ([`SharedTier::implausible`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Implausible {
    /// It counts fewer blocks than one store knows of.
    Low,
    /// It counts more than twice the capacity.
    High,
}

/// A change of usage not yet written to the ledger.
#[derive(Clone, Copy, Debug, Default)]
struct Delta {
    bytes: i64,
    files: i64,
}

/// A shared store's state.
#[derive(Debug)]
pub(crate) struct SharedTier {
    ledger: Ledger,
    limits: Limits,
    pending: Mutex<Delta>,
    /// Another node's temp files older than this are abandoned.
    pub temp_lease: Duration,
    /// When the tree was last scanned for blocks other stores put (to find victims).
    last_rescan: Mutex<Option<Instant>>,
    /// The stats file of this store (`STATS.<node>.<pid>.json`).
    pub stats_name: String,
    /// What the ledger said when last read or written here.
    last: Mutex<Usage>,
}

/// The least time between two scans of the tree for victims.
pub(crate) const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// How many more files than the ledger a store's own index may count before the ledger is
/// taken for talked down: blocks other stores removed or replaced that the index has not
/// seen go yet (racing puts of one key by three stores left it 1 or 2 ahead).
const STALE_FILES: u64 = 8;

impl SharedTier {
    pub fn new(
        ns: &BlockDir,
        limits: Limits,
        temp_lease: Duration,
        ledger_wait: Duration,
    ) -> Result<SharedTier> {
        Ok(SharedTier {
            ledger: ns.open_ledger(ledger_wait)?,
            limits,
            pending: Mutex::new(Delta::default()),
            temp_lease,
            last_rescan: Mutex::new(None),
            stats_name: crate::layout::instance_stats_name(
                crate::ns::node_id(),
                std::process::id(),
            ),
            last: Mutex::new(Usage::default()),
        })
    }

    /// The ledger's usage, `None` if it holds no valid record.
    pub fn read(&self) -> Result<Option<Usage>> {
        let g = self.ledger.lock()?;
        let u = Usage::from_text(&g.read()?);
        if let Some(u) = u {
            self.note(u);
        }
        Ok(u)
    }

    /// What the ledger said when this store last read or wrote it.
    pub fn last_usage(&self) -> Usage {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn note(&self, u: Usage) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = u;
    }

    fn write(&self, g: &crate::ns::LedgerGuard<'_>, u: Usage) -> Result<()> {
        g.write(u.to_text().as_bytes())?;
        self.note(u);
        Ok(())
    }

    /// Sets the ledger to `usage` (a store that found itself alone on the tree, after its
    /// scan), dropping pending corrections.
    pub fn reset(&self, usage: Usage) -> Result<()> {
        let g = self.ledger.lock()?;
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Delta::default();
        self.write(&g, usage)
    }

    /// Records a change of usage to be written with the next update.
    pub fn adjust(&self, bytes: i64, files: i64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.bytes += bytes;
        p.files += files;
    }

    /// Blocks this store removed (evicted, removed, corrupt): they no longer count.
    pub fn freed(&self, bytes: u64, files: u64) {
        self.adjust(-(bytes as i64), -(files as i64));
    }

    /// True if a correction makes the ledger count too little (it must be written at once).
    pub fn owes(&self) -> bool {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.bytes > 0 || p.files > 0
    }

    /// Writes pending corrections to the ledger.
    pub fn flush(&self) -> Result<()> {
        if self.take_pending_is_empty() {
            return self.read().map(|_| ());
        }
        let g = self.ledger.lock()?;
        let mut u = self.parse_or(&g.read()?, Usage::default());
        self.apply_pending(&mut u);
        self.write(&g, u)
    }

    fn parse_or(&self, text: &[u8], fallback: Usage) -> Usage {
        Usage::from_text(text).unwrap_or_else(|| {
            tracing::warn!(path = %self.ledger.path().display(), "the usage ledger holds no valid record: counting this store's own blocks");
            fallback
        })
    }

    fn take_pending_is_empty(&self) -> bool {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.bytes == 0 && p.files == 0
    }

    fn apply_pending(&self, u: &mut Usage) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        u.bytes = u.bytes.saturating_add_signed(p.bytes);
        u.files = u.files.saturating_add_signed(p.files);
        *p = Delta::default();
    }

    fn fits(&self, u: Usage, bytes: u64, files: u64) -> bool {
        self.limits
            .max_bytes
            .is_none_or(|m| u.bytes.saturating_add(bytes) <= m)
            && self
                .limits
                .max_files
                .is_none_or(|m| u.files.saturating_add(files) <= m)
    }

    /// Reserves room for a batch's new files (`estimates`, in chain order) under the shared
    /// capacity: under the ledger's lock, while the next file does not fit, `evict(bytes,
    /// files)` is asked to free at least that much (it unlinks blocks of this store's index
    /// and reports what it removed through [`SharedTier::freed`]; `Ok(false)` when it found
    /// nothing more to evict). Returns how many leading estimates are reserved (the rest must
    /// not be written: the chain's tail is declined).
    ///
    /// `fallback` is this store's own view (its index, which counts this batch already). A
    /// ledger that holds no valid record (written over by hand, say) counts as that view,
    /// less the batch, and is rewritten. A record is checked, not believed
    /// ([`SharedTier::implausible`]): one that counts fewer blocks than this store alone knows
    /// of, or more than twice the capacity, is replaced by `recount(forced)` (a scan of the
    /// tree; unless forced, as for a count too high, `None` when one ran too recently: then
    /// the record is raised to this store's view), so that a ledger talked down never lets
    /// the tree past its bound, and one talked up never evicts everything.
    pub fn reserve(
        &self,
        estimates: &[u64],
        fallback: Usage,
        recount: impl FnOnce(bool) -> Option<Usage>,
        mut evict: impl FnMut(u64, u64) -> bool,
    ) -> Result<usize> {
        if estimates.is_empty() {
            return Ok(0);
        }
        // This store's view without this batch (its index counts the batch already).
        let own = Usage {
            bytes: fallback.bytes.saturating_sub(estimates.iter().sum::<u64>()),
            files: fallback.files.saturating_sub(estimates.len() as u64),
        };
        let g = self.ledger.lock()?;
        let mut u = self.parse_or(&g.read()?, own);
        self.apply_pending(&mut u);
        if let Some(why) = self.implausible(u, own) {
            let healed = match recount(why == Implausible::High) {
                Some(found) => Usage {
                    bytes: found.bytes.saturating_sub(fallback.bytes - own.bytes),
                    files: found.files.saturating_sub(fallback.files - own.files),
                },
                None if why == Implausible::High => own,
                None => Usage {
                    bytes: u.bytes.max(own.bytes),
                    files: u.files.max(own.files),
                },
            };
            tracing::warn!(
                path = %self.ledger.path().display(),
                ledger_bytes = u.bytes,
                ledger_files = u.files,
                healed_bytes = healed.bytes,
                healed_files = healed.files,
                "the usage ledger counted {} than the tree can hold: healed",
                if why == Implausible::High { "more" } else { "less" },
            );
            *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Delta::default();
            u = healed;
        }
        let mut granted = 0;
        let (mut need_b, mut need_f) = (0u64, 0u64);
        for &est in estimates {
            while !self.fits(u, need_b.saturating_add(est), need_f + 1) {
                let over_b = self.limits.max_bytes.map_or(0, |m| {
                    u.bytes
                        .saturating_add(need_b)
                        .saturating_add(est)
                        .saturating_sub(m)
                });
                let over_f = self.limits.max_files.map_or(0, |m| {
                    u.files
                        .saturating_add(need_f)
                        .saturating_add(1)
                        .saturating_sub(m)
                });
                if !evict(over_b, over_f) {
                    break;
                }
                self.apply_pending(&mut u);
            }
            if !self.fits(u, need_b.saturating_add(est), need_f + 1) {
                break;
            }
            need_b += est;
            need_f += 1;
            granted += 1;
        }
        u.bytes = u.bytes.saturating_add(need_b);
        u.files = u.files.saturating_add(need_f);
        self.write(&g, u)?;
        Ok(granted)
    }

    /// Why the ledger's usage `u` cannot be the tree's, if it cannot: files or bytes under
    /// seven eighths of this store's own view (`own`), and at least [`STALE_FILES`] files (or
    /// their bytes) under it, since that view may count a few blocks other stores have
    /// removed or replaced meanwhile (and sizes are estimates until published); more than
    /// twice the capacity (puts are granted only while they fit).
    fn implausible(&self, u: Usage, own: Usage) -> Option<Implausible> {
        let stale = (own.files / 8).max(STALE_FILES);
        let per_file = own.bytes.checked_div(own.files).unwrap_or(0);
        let stale_bytes = (own.bytes / 8).max(stale.saturating_mul(per_file));
        let low = u.files.saturating_add(stale) < own.files
            || u.bytes.saturating_add(stale_bytes) < own.bytes;
        let high = self
            .limits
            .max_bytes
            .is_some_and(|m| u.bytes > m.saturating_mul(2))
            || self
                .limits
                .max_files
                .is_some_and(|m| u.files > m.saturating_mul(2));
        if high {
            Some(Implausible::High)
        } else if low {
            Some(Implausible::Low)
        } else {
            None
        }
    }

    /// True (and the time noted) if the tree may be scanned again for victims.
    pub fn may_rescan(&self) -> bool {
        let mut last = self.last_rescan.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < RESCAN_INTERVAL) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// The ledger's path, for messages.
    pub fn ledger_path(&self) -> &std::path::Path {
        self.ledger.path()
    }
}

/// What a store of a shared tree does with the ledger: reserve room for a put batch, evict
/// for it, learn the blocks other stores put.
impl Inner {
    /// Shared mode: reserves the batch's new files in the tree's ledger (evicting from this
    /// store's index until they fit). Offers past what fits are declined, so the chain is cut
    /// at its tail. Returns the bytes and files reserved.
    pub(super) fn reserve_shared(
        &self,
        sh: &SharedTier,
        offered: &[(BlockHash, u64)],
        offers: &mut [Offer],
        after: Option<BlockHash>,
    ) -> Result<(u64, u64)> {
        let new: Vec<usize> = (0..offers.len())
            .filter(|&i| matches!(offers[i], Offer::Reserved | Offer::Replace { .. }))
            .collect();
        if new.is_empty() {
            return Ok((0, 0));
        }
        let estimates: Vec<u64> = new.iter().map(|&i| offered[i].1).collect();
        let keep: Vec<BlockHash> = offered.iter().map(|(h, _)| *h).chain(after).collect();
        let indexed = || {
            let ix = self.index.counts();
            Usage {
                bytes: ix.bytes,
                files: ix.files,
            }
        };
        // A recount is the scan that teaches the index the tree's blocks, then its counts.
        let recount = |forced: bool| self.learn_tree(forced).then(indexed);
        let granted = sh.reserve(&estimates, indexed(), recount, |bytes, files| {
            self.evict_for_shared(bytes, files, &keep)
        })?;
        for &i in &new[granted..] {
            self.index.decline(&offered[i].0, offers[i]);
            offers[i] = Offer::NotAdmitted;
        }
        Ok((estimates[..granted].iter().sum(), granted as u64))
    }

    /// Frees at least `bytes` and `files` of the shared tree by evicting blocks of this
    /// store's index (what it removed reaches the ledger through `SharedTier::freed`). When the
    /// index has nothing left to evict, the tree is scanned (at most every
    /// `shared::RESCAN_INTERVAL`) for blocks other stores put, and eviction tried again. False
    /// if nothing was evicted.
    fn evict_for_shared(&self, bytes: u64, files: u64, keep: &[BlockHash]) -> bool {
        let mut victims = self.index.evict_some(bytes, files, keep);
        if victims.is_empty() && self.learn_tree(false) {
            victims = self.index.evict_some(bytes, files, keep);
        }
        if victims.is_empty() {
            return false;
        }
        self.unlink_victims(victims);
        true
    }

    /// Shared mode: scans the tree (at most every `shared::RESCAN_INTERVAL`) so the index
    /// knows the blocks other stores put (as the oldest, by their files' times) and forgets
    /// those gone; abandoned temp files are swept on the way. True if the scan ran. `forced`:
    /// even if one ran less than that interval ago.
    pub(super) fn learn_tree(&self, forced: bool) -> bool {
        let Some(sh) = &self.shared else {
            return false;
        };
        if !sh.may_rescan() && !forced {
            return false;
        }
        let mut report = sweep::sweep_with(
            &self.ns,
            self.layout,
            sweep::TempRule::OwnerGone {
                lease: sh.temp_lease,
            },
            true,
        );
        sh.freed(report.temp_dead_bytes, report.temp_dead);
        report
            .entries
            .sort_unstable_by_key(|e| (e.recency_ns, e.hash));
        let found: std::collections::HashSet<BlockHash> =
            report.entries.iter().map(|e| e.hash).collect();
        let mut learned = 0;
        for e in &report.entries {
            if !self.index.contains(&e.hash) {
                self.index.load(e.hash, e.bytes);
                learned += 1;
            }
        }
        let stale = if self.journal.is_some() && !self.opts.read_only {
            // Told to the journal as missing, each looked at again under its lock, so that a
            // block published again since the scan is neither forgotten nor told gone (a
            // removal another store told already is told twice: docs/events.md).
            let gone = self.index.absent(&found);
            gone.iter()
                .filter(|h| self.forget_if_missing(h, &self.layout.rel_path(h)))
                .count()
        } else {
            self.index.forget_absent(&found)
        };
        tracing::debug!(
            learned,
            stale,
            "scanned the shared tree for blocks of other stores"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_text_round_trips_and_rejects_torn_records() {
        let u = Usage {
            bytes: 123_456,
            files: 7,
        };
        assert_eq!(Usage::from_text(u.to_text().as_bytes()), Some(u));
        assert_eq!(Usage::from_text(b""), None);
        assert_eq!(Usage::from_text(b"bytes=12\n"), None);
        assert_eq!(Usage::from_text(b"bytes=12\nfiles=3"), None);
        assert_eq!(Usage::from_text(b"bytes=x\nfiles=3\n"), None);
        assert_eq!(Usage::from_text(b"bytes=1\nfiles=3\nbytes=2\n"), None);
    }
}

/// The answers "absent from the tree" of a store that shares its tree (writable or
/// read-only), each kept for the store's negative time to live, so that a key asked again
/// and again costs one `stat` per that time.
#[derive(Debug)]
pub(crate) struct Negative {
    cache: Mutex<lru::LruCache<BlockHash, Instant>>,
    ttl: Duration,
}

impl Negative {
    pub fn new(ttl: Duration) -> Negative {
        Negative {
            cache: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(NEGATIVE_ENTRIES).expect("nonzero"),
            )),
            ttl,
        }
    }

    /// True if `hash` was found absent less than the negative time ago.
    pub fn known_absent(&self, hash: &BlockHash) -> bool {
        if self.ttl.is_zero() {
            return false;
        }
        let mut n = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        match n.get(hash) {
            Some(t) if t.elapsed() < self.ttl => true,
            Some(_) => {
                n.pop(hash);
                false
            }
            None => false,
        }
    }

    /// Remembers that `hash` is absent from the tree.
    pub fn absent(&self, hash: BlockHash) {
        if !self.ttl.is_zero() {
            self.cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(hash, Instant::now());
        }
    }

    /// Forgets that `hash` was absent (this store just published it).
    pub fn present(&self, hash: &BlockHash) {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop(hash);
    }
}
