//! The counters and their snapshots, below both the store and the write-behind offloader:
//! the store's ([`StoreStats`]) carry the offloader's ([`OffloadStats`]), and the offloader
//! times its work with the store's latency histogram, so neither imports the other for them.

mod offload;
mod store;

pub use offload::OffloadStats;
pub(crate) use offload::{OffloadCounters, add, sub};
pub(crate) use store::Counters;
pub use store::{ErrorCounts, LatencySummary, StoreStats};
