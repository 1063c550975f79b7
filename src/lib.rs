//! tierkv: the disk tier ("G3") of an LLM inference engine's KV cache.
//!
//! An engine computes the attention KV of each block of prompt tokens once; tierkv keeps those
//! blocks as files, one per block, so that a later request with the same prefix loads them
//! instead of recomputing. A [`Store`] serves one worker (tensor-parallel rank) under a root
//! directory shared with other workers.
//!
//! The crate's root is its API: [`Store`] and [`StoreConfig`] (put/get semantics, capacity,
//! sharing), the keys ([`BlockHash`], [`BlockKey`], [`WorkerId`]), and what an inference engine
//! calls: the write-behind [`Offloader`], the batch [`Transfers`] between the engine's KV memory
//! and the store, and the [`Completions`] queue. Three modules are public beside it:
//! [`engine`] (the [`IoEngine`](engine::IoEngine) contract and its psync, io_uring and NIXL
//! engines), [`format`](mod@format) (the block file) and [`inspect`] (what a cache tree
//! holds, for `tierkv-stat`); with the `testing` feature, `testing` holds the fault-injecting
//! doubles the tests use. Inside, the modules follow the architecture: where bytes live
//! (`layout`, `format`, `ns`: every file operation, beneath the worker directory, never
//! through a symlink), how I/O is submitted (`engine`), what is kept (`index`, `store`), what
//! an engine calls (`offload`, `transfer`, `queue`). The tools (`tierkv-bench`, `tierkv-stat`)
//! are a crate of their own, in `tools/`. Linux only.
//!
//! ```
//! use tierkv::{BlockHash, Lookup, Store, StoreConfig, WorkerId};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path(), WorkerId::new("rank0")?, StoreConfig::default())?;
//! // Hash a prompt's block chain: equal prefixes give equal keys.
//! let tokens: Vec<u32> = (0..64).collect();
//! let keys: Vec<_> = BlockHash::chain_all(&tokens, 16).into_iter().map(|h| store.key(h)).collect();
//! let blocks: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8; 1024]).collect();
//! let items: Vec<_> = keys.iter().cloned().zip(blocks.iter().map(Vec::as_slice)).collect();
//! for r in store.put_many(&items) {
//!     r?;
//! }
//! assert_eq!(store.contains_prefix(&keys)?, 4);
//! let mut bufs = vec![vec![0u8; 1024]; 4];
//! let found = store.get_many(&keys, &mut bufs);
//! assert!(matches!(found[2], Ok(Lookup::Hit(1024))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod buf;
pub mod engine;
mod error;
pub mod format;
mod index;
pub mod inspect;
mod key;
mod layout;
mod ns;
mod offload;
mod queue;
mod stats;
mod store;
mod sys;
#[cfg(feature = "testing")]
pub mod testing;
mod transfer;

pub use buf::{AlignedBuf, DeviceMem, align_up};
pub use error::{CorruptReason, Error, HeaderError, Result};
pub use index::policy::{Access, Belady, Oracle, Policy, PolicyKind};
pub use key::{BlockHash, BlockKey, MAX_WORKER_ID_LEN, WorkerId};
pub use layout::Layout;
pub use ns::{BlockEvent, EventCause, EventKind, EventsRead, JOURNAL_CAPACITY};
pub use offload::{
    DropReason, FilterKind, OfferCompletion, OfferOutcome, Offered, OffloadConfig, OffloadStats,
    Offloader, OnClose, Payload, PayloadParts, WhenFull,
};
pub use queue::{Completion, Completions, Outcome};
pub use store::{
    Components, DEFAULT_DIRECT_PUTS_FROM, DEFAULT_MAX_BLOCK_SIZE, DEFAULT_READ_THREADS,
    DEFAULT_TEMP_LEASE, ErrorCounts, LatencySummary, Lookup, MIN_STATS_INTERVAL, PARALLEL_READ_MIN,
    Publish, Sharing, Store, StoreConfig, StoreStats, VerifyMode,
};
pub use store::{EventTail, TAIL_MAX_HELD};
pub use transfer::{KvMemory, LoadOutcome, Region, SaveOutcome, Transfer, Transfers};
