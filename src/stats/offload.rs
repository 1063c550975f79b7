//! Counters of an offloader: in [`StoreStats::offload`](crate::StoreStats::offload), so in
//! `STATS.json`, `tierkv-stat --live` and its Prometheus output.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::store::{Latency, LatencySummary};

/// A snapshot of an offloader's counters (since it started). Block counts unless named
/// bytes. Every offered block ends in exactly one of `written`, `not_admitted`, `failed`,
/// `deduped_*` or `dropped_*`, or is still in flight (`in_flight_blocks`): the counters add
/// up (`offload::counters_add_up` tests it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct OffloadStats {
    /// The admission filter's name.
    pub filter: String,
    /// Blocks offered.
    pub offered: u64,
    /// Blocks queued for writing (admitted by the filter, room in the queue).
    pub queued: u64,
    /// Payload bytes queued.
    pub queued_bytes: u64,
    /// Queued blocks the store holds after their batch (written now or found present).
    pub written: u64,
    /// Payload bytes of `written`.
    pub written_bytes: u64,
    /// Queued blocks the store declined (its capacity or policy; parent no longer stored).
    pub not_admitted: u64,
    /// Queued blocks whose write failed with an error.
    pub failed: u64,
    /// Offered blocks already stored: not written again.
    pub deduped_present: u64,
    /// Offered blocks already queued by an earlier offer: not queued again.
    pub deduped_queued: u64,
    /// Dropped: the queue was full (bytes or blocks), the newest offer lost.
    pub dropped_full: u64,
    /// Dropped: the admission filter declined them.
    pub dropped_filtered: u64,
    /// Dropped: their chain parent is neither stored nor queued (it could never be reached).
    pub dropped_no_parent: u64,
    /// Dropped at shutdown, or offered after it: never written.
    pub dropped_closed: u64,
    /// Dropped: the key is another worker's.
    pub dropped_invalid: u64,
    /// Gets served from the queue (the block not yet written).
    pub served_from_queue: u64,
    /// Store calls (one chain batch each).
    pub batches: u64,
    /// Blocks queued or being written now.
    pub in_flight_blocks: u64,
    /// Payload bytes queued or being written now.
    pub in_flight_bytes: u64,
    /// Time a block waited in the queue before its batch was handed to the store.
    pub queue_wait: LatencySummary,
    /// Time the engine's thread spent in an offer call (whole calls).
    pub offer_latency: LatencySummary,
}

impl OffloadStats {
    /// All the drops, whatever their reason (deduplications are not drops).
    pub fn dropped(&self) -> u64 {
        self.dropped_full
            + self.dropped_filtered
            + self.dropped_no_parent
            + self.dropped_closed
            + self.dropped_invalid
    }
}

#[derive(Debug, Default)]
pub(crate) struct OffloadCounters {
    pub filter: std::sync::OnceLock<&'static str>,
    pub offered: AtomicU64,
    pub queued: AtomicU64,
    pub queued_bytes: AtomicU64,
    pub written: AtomicU64,
    pub written_bytes: AtomicU64,
    pub not_admitted: AtomicU64,
    pub failed: AtomicU64,
    pub deduped_present: AtomicU64,
    pub deduped_queued: AtomicU64,
    pub dropped_full: AtomicU64,
    pub dropped_filtered: AtomicU64,
    pub dropped_no_parent: AtomicU64,
    pub dropped_closed: AtomicU64,
    pub dropped_invalid: AtomicU64,
    pub served_from_queue: AtomicU64,
    pub batches: AtomicU64,
    pub in_flight_blocks: AtomicU64,
    pub in_flight_bytes: AtomicU64,
    pub queue_wait: Latency,
    pub offer_latency: Latency,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn sub(c: &AtomicU64, n: u64) {
    c.fetch_sub(n, Ordering::Relaxed);
}

impl OffloadCounters {
    pub fn snapshot(&self) -> OffloadStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OffloadStats {
            filter: self.filter.get().copied().unwrap_or("").to_string(),
            offered: g(&self.offered),
            queued: g(&self.queued),
            queued_bytes: g(&self.queued_bytes),
            written: g(&self.written),
            written_bytes: g(&self.written_bytes),
            not_admitted: g(&self.not_admitted),
            failed: g(&self.failed),
            deduped_present: g(&self.deduped_present),
            deduped_queued: g(&self.deduped_queued),
            dropped_full: g(&self.dropped_full),
            dropped_filtered: g(&self.dropped_filtered),
            dropped_no_parent: g(&self.dropped_no_parent),
            dropped_closed: g(&self.dropped_closed),
            dropped_invalid: g(&self.dropped_invalid),
            served_from_queue: g(&self.served_from_queue),
            batches: g(&self.batches),
            in_flight_blocks: g(&self.in_flight_blocks),
            in_flight_bytes: g(&self.in_flight_bytes),
            queue_wait: self.queue_wait.summary(),
            offer_latency: self.offer_latency.summary(),
        }
    }
}
