//! Counters of a store.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A snapshot of a store's counters (since it was opened).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
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
    /// Foreign files and symlinks seen in the tree (left alone).
    pub foreign: u64,
    /// Temp files removed when the store was opened.
    pub temp_swept: u64,
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
    pub foreign: AtomicU64,
    pub temp_swept: AtomicU64,
    pub blocks_at_open: AtomicU64,
    pub fd_hits: AtomicU64,
    pub fd_misses: AtomicU64,
    pub nospace_retries: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
