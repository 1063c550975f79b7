//! tierkv: the disk tier ("G3") of an LLM inference engine's KV cache.
//!
//! An engine computes the attention KV of each block of prompt tokens once; tierkv keeps those
//! blocks as files, one per block, so that a later request with the same prefix loads them
//! instead of recomputing. A [`Store`] serves one worker (tensor-parallel rank) under a root
//! directory shared with other workers.
//!
//! The modules follow the architecture:
//! - where bytes live: [`layout`] (the sharded directory tree), [`format`](mod@format) (the
//!   block file) and [`ns`] (every file operation, beneath the worker directory, never
//!   through a symlink);
//! - how I/O is submitted: [`engine`] (the [`IoEngine`](engine::IoEngine) trait, psync);
//! - what is kept: [`index`] (capacity, eviction policies) and [`store`] (put/get semantics,
//!   the open-file cache, counters, the rebuild on open);
//! - what the engine calls to write: [`offload`] (write-behind: a bounded queue in front of a
//!   store, an admission filter, batches written on a thread of its own);
//! - what users run (with the `tools` feature): `tierkv-bench` (the fio-style benchmark) and
//!   `tierkv-stat` (what a cache tree holds, the live counters of its stores), in `tools/`.
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

pub mod buf;
pub mod engine;
mod error;
pub mod format;
pub mod index;
mod key;
pub mod layout;
pub mod ns;
pub mod offload;
pub mod queue;
mod stats;
pub mod store;
pub mod sys;
pub mod transfer;

pub use error::{CorruptReason, Error, Result};
pub use index::policy::PolicyKind;
pub use key::{BlockHash, BlockKey, MAX_WORKER_ID_LEN, WorkerId};
pub use layout::Layout;
pub use offload::{OffloadConfig, Offloader, Payload};
pub use queue::{Completion, Completions, Outcome};
pub use store::{Lookup, Parts, Publish, Sharing, Store, StoreConfig, StoreStats, VerifyMode};
pub use transfer::{KvMemory, LoadOutcome, Region, SaveOutcome, Transfer, Transfers};
