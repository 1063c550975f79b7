//! Live counters for `tierkv-stat`: the store rewrites `<worker dir>/STATS.json` atomically
//! (temp file + rename) every interval, and once more when it closes. docs/stat.md documents
//! the fields.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{Inner, StoreStats};
use crate::layout::STATS_FILE;

/// The document in `STATS.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LiveStats {
    /// Version of this document's shape.
    pub format: u32,
    /// The worker.
    pub worker: String,
    /// Process id of the store.
    pub pid: u32,
    /// When it was written, milliseconds since the epoch.
    pub updated_unix_ms: u64,
    /// How often it is rewritten while the store is open, in milliseconds.
    pub interval_ms: u64,
    /// False in the last snapshot, written when the store closed.
    pub open: bool,
    /// Shard depth of the tree.
    pub layout_depth: u8,
    /// Shard fan-out of the tree.
    pub layout_fanout: u32,
    /// Eviction policy.
    pub policy: String,
    /// I/O engine.
    pub engine: String,
    /// `exclusive` or `shared` (documents of earlier versions: exclusive).
    #[serde(default = "exclusive")]
    pub sharing: String,
    /// The host the store runs on.
    #[serde(default)]
    pub host: String,
    /// Its node id (16 hex characters; see `tierkv::inspect::node_id`).
    #[serde(default)]
    pub node: String,
    /// The counters.
    pub stats: StoreStats,
}

fn exclusive() -> String {
    "exclusive".into()
}

impl Inner {
    /// Writes `STATS.json` (atomically). Failures are logged, never returned: counters are
    /// a view, not data.
    pub(super) fn write_live_stats(&self, open: bool, interval: Duration) {
        // The ledger's pending corrections go out with each tick too.
        if let Some(sh) = &self.shared {
            if let Err(e) = sh.flush() {
                tracing::debug!(error = %e, "could not write the usage ledger");
            }
        }
        let doc = LiveStats {
            format: 1,
            worker: self.worker.to_string(),
            pid: std::process::id(),
            updated_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            interval_ms: interval.as_millis() as u64,
            open,
            layout_depth: self.layout.depth,
            layout_fanout: self.layout.fanout,
            policy: self.index.policy_name().to_string(),
            engine: self.engine.name().to_string(),
            sharing: self.opts.sharing.to_string(),
            host: crate::ns::host_name(),
            node: format!("{:016x}", crate::ns::node_id()),
            stats: self.snapshot(),
        };
        let name = self
            .shared
            .as_ref()
            .map_or(STATS_FILE, |s| s.stats_name.as_str());
        let result = serde_json::to_vec_pretty(&doc)
            .map_err(|e| crate::Error::Config(format!("counters as JSON: {e}")))
            .and_then(|bytes| self.ns.write_control(name, &bytes));
        if let Err(e) = result {
            tracing::debug!(error = %e, "could not publish live counters");
        }
    }
}
