//! Test doubles (the `testing` feature): faults injected into the namespace layer
//! ([`NsFaults`]: a chosen file operation fails, for a chosen file) and into an I/O engine
//! ([`FaultyEngine`] around any engine, failing as its [`FaultPlan`] says). The library's own
//! tests and the tools' use them; a store built with them behaves as one whose disk or
//! filesystem fails there.

pub use crate::engine::fault::{FaultPlan, FaultyEngine};
pub use crate::ns::{NsFaults, NsOp};
