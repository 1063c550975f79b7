//! Counters of a store.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A snapshot of a store's counters (since it was opened).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct StoreStats {
    /// Lookups that returned a block.
    pub hits: u64,
    /// Lookups that found no (valid) block.
    pub misses: u64,
    /// Payload bytes returned by hits.
    pub bytes_read: u64,
    /// Payload bytes of published puts.
    pub bytes_written: u64,
    /// Blocks published.
    pub puts: u64,
    /// Puts that failed (nothing was left behind).
    pub put_errors: u64,
    /// Reads that failed with an error (not a miss).
    pub read_errors: u64,
    /// Blocks removed by `remove_many`.
    pub removes: u64,
    /// Corrupt block files found (and removed) by reads.
    pub corrupt: u64,
    /// First reads that served a file without hashing its payload because it was written on
    /// this machine since its current boot ([`VerifyMode::AfterReboot`](crate::VerifyMode)).
    pub checksums_skipped: u64,
    /// First reads whose payload was hashed piece by piece as the engine read it (the psync
    /// engine, version 2 files), not read again to be hashed after.
    pub checksums_streamed: u64,
    /// Get batches whose reads were split between threads ([`StoreConfig::read_threads`]).
    ///
    /// [`StoreConfig::read_threads`]: crate::StoreConfig::read_threads
    pub split_reads: u64,
    /// Foreign files and symlinks seen in the tree (left alone).
    pub foreign: u64,
    /// Temp files removed when the store was opened.
    pub temp_swept: u64,
    /// Block files `fdatasync`ed before being published (`sync_writes`).
    pub syncs: u64,
    /// Directories `fsync`ed after publishing into them (`sync_writes`: once per directory
    /// per batch).
    pub dir_syncs: u64,
    /// Block files found when the store was opened.
    pub blocks_at_open: u64,
    /// Reads served through a cached descriptor.
    pub fd_cache_hits: u64,
    /// Reads that had to open the file.
    pub fd_cache_misses: u64,
    /// Descriptors evicted from the cache.
    pub fd_cache_evictions: u64,
    /// Times the cache shrank on EMFILE/ENFILE.
    pub fd_cache_shrinks: u64,
    /// Descriptors cached now.
    pub fd_cache_len: u64,
    /// Current capacity of the cache.
    pub fd_cache_capacity: u64,
    /// On-disk bytes of the block files held now (headers included).
    pub used_bytes: u64,
    /// Block files held now.
    pub used_files: u64,
    /// The byte capacity, if bounded.
    pub capacity_bytes: Option<u64>,
    /// The file-count capacity, if bounded.
    pub capacity_files: Option<u64>,
    /// Blocks evicted.
    pub evictions: u64,
    /// On-disk bytes of evicted blocks.
    pub evicted_bytes: u64,
    /// Puts the policy declined to store (admission control).
    pub not_admitted: u64,
    /// Batches retried after ENOSPC below the capacity (after evicting).
    pub nospace_retries: u64,
    /// Shared mode: lookups of keys the index did not hold that asked the tree.
    pub tree_lookups: u64,
    /// Shared mode: those that found a block (published by another store, or before this
    /// one opened).
    pub tree_hits: u64,
    /// Shared mode: lookups answered "absent" by the negative cache, without a system call.
    pub negative_hits: u64,
    /// Shared mode: puts that found the block already published by another store (theirs
    /// is kept; keys are content addresses).
    pub published_by_others: u64,
    /// Puts written into an evicted block's file instead of a new one
    /// ([`StoreConfig::reuse_evicted`](crate::StoreConfig::reuse_evicted)).
    pub reused_files: u64,
    /// Shared mode: the shared worker's usage as its ledger last said (bytes, files).
    pub shared_bytes: Option<u64>,
    /// See `shared_bytes`.
    pub shared_files: Option<u64>,
    /// Errors returned, by kind.
    pub errors: ErrorCounts,
    /// Latency of `get_many` calls (whole batches).
    pub get_latency: LatencySummary,
    /// Latency of `put_many`/`offer_many` calls (whole batches).
    pub put_latency: LatencySummary,
    /// The write-behind offloader in front of the store, if one was started
    /// ([`Offloader`](crate::offload::Offloader)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<super::OffloadStats>,
}

/// Errors returned by a store, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ErrorCounts {
    /// `NoSpace`.
    pub no_space: u64,
    /// `TooManyOpenFiles`.
    pub too_many_open_files: u64,
    /// `Io`.
    pub io: u64,
    /// `InvalidKey`, `TooLarge`, `BufferTooSmall`, `Config`: the caller's input.
    pub invalid_input: u64,
    /// Anything else.
    pub other: u64,
}

/// A latency summary in nanoseconds (from power-of-two buckets: the percentiles are upper
/// bounds within a factor of two; `mean_ns` and `max_ns` are exact).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct LatencySummary {
    /// Calls measured.
    pub count: u64,
    /// Mean.
    pub mean_ns: u64,
    /// Median (bucket upper bound).
    pub p50_ns: u64,
    /// 99th percentile (bucket upper bound).
    pub p99_ns: u64,
    /// 99.9th percentile (bucket upper bound).
    pub p999_ns: u64,
    /// Largest.
    pub max_ns: u64,
}

const BUCKETS: usize = 48;

/// A lock-free latency histogram with power-of-two nanosecond buckets.
#[derive(Debug)]
pub(crate) struct Latency {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Latency {
    pub fn record(&self, d: std::time::Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        let b = (64 - ns.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[b].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn summary(&self) -> LatencySummary {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return LatencySummary::default();
        }
        let quantile = |q: f64| {
            let target = ((count as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= target {
                    // Bucket i holds values below 2^i ns; never above the exact maximum.
                    return (1u64 << i.min(63)).min(self.max_ns.load(Ordering::Relaxed));
                }
            }
            self.max_ns.load(Ordering::Relaxed)
        };
        LatencySummary {
            count,
            mean_ns: self.sum_ns.load(Ordering::Relaxed) / count,
            p50_ns: quantile(0.5),
            p99_ns: quantile(0.99),
            p999_ns: quantile(0.999),
            max_ns: self.max_ns.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub puts: AtomicU64,
    pub put_errors: AtomicU64,
    pub read_errors: AtomicU64,
    pub removes: AtomicU64,
    pub corrupt: AtomicU64,
    pub checksums_skipped: AtomicU64,
    pub checksums_streamed: AtomicU64,
    pub split_reads: AtomicU64,
    pub foreign: AtomicU64,
    pub temp_swept: AtomicU64,
    pub syncs: AtomicU64,
    pub dir_syncs: AtomicU64,
    pub blocks_at_open: AtomicU64,
    pub fd_hits: AtomicU64,
    pub fd_misses: AtomicU64,
    pub nospace_retries: AtomicU64,
    pub tree_lookups: AtomicU64,
    pub tree_hits: AtomicU64,
    pub negative_hits: AtomicU64,
    pub published_by_others: AtomicU64,
    pub reused_files: AtomicU64,
    pub err_no_space: AtomicU64,
    pub err_emfile: AtomicU64,
    pub err_io: AtomicU64,
    pub err_input: AtomicU64,
    pub err_other: AtomicU64,
    pub get_latency: Latency,
    pub put_latency: Latency,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Counts an error returned to a caller by its kind.
    pub fn error(&self, e: &Error) {
        let c = match e {
            Error::NoSpace { .. } => &self.err_no_space,
            Error::TooManyOpenFiles { .. } => &self.err_emfile,
            Error::Io { .. } => &self.err_io,
            Error::InvalidKey { .. }
            | Error::TooLarge { .. }
            | Error::BufferTooSmall { .. }
            | Error::Config(_)
            | Error::Unsupported(_) => &self.err_input,
            _ => &self.err_other,
        };
        Self::add(c, 1);
    }

    pub fn errors(&self) -> ErrorCounts {
        ErrorCounts {
            no_space: Self::get(&self.err_no_space),
            too_many_open_files: Self::get(&self.err_emfile),
            io: Self::get(&self.err_io),
            invalid_input: Self::get(&self.err_input),
            other: Self::get(&self.err_other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latency_summary() {
        let l = Latency::default();
        assert_eq!(l.summary(), LatencySummary::default());
        for _ in 0..98 {
            l.record(Duration::from_micros(10));
        }
        l.record(Duration::from_millis(5));
        l.record(Duration::from_millis(9));
        let s = l.summary();
        assert_eq!(s.count, 100);
        assert_eq!(s.max_ns, 9_000_000);
        assert!((10_000..=20_000).contains(&s.p50_ns), "{s:?}");
        assert!((4_000_000..=8_400_000).contains(&s.p99_ns), "{s:?}");
        assert_eq!(s.mean_ns, (98 * 10_000 + 5_000_000 + 9_000_000) / 100);
    }
}
