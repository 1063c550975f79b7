//! Test doubles (the `testing` feature): faults injected into the namespace layer
//! ([`NsFaults`]: a chosen file operation fails, for a chosen file) and into an I/O engine
//! ([`FaultyEngine`] around any engine, failing as its [`FaultPlan`] says). The library's own
//! tests and the tools' use them; a store built with them behaves as one whose disk or
//! filesystem fails there. Beside them, what tests reach beneath the store with: the
//! namespace layer's [`BlockDir`] (to hold a lease or a lock as another process would), this
//! node's id and the names the store gives its files.

pub use crate::engine::fault::{FaultPlan, FaultyEngine};
pub use crate::layout::{TYPICAL_BLOCK_BYTES, instance_stats_name};
pub use crate::ns::{BlockDir, Opened, Unlinked, node_id};
pub use crate::ns::{NsFaults, NsOp};
