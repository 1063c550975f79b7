//! What a cache tree holds, read the way the store reads it: the namespace layer's view of a
//! worker directory ([`BlockDir`], entries opened and unlinked by inode, never through a
//! symlink), the parallel tree walk, the layout's names, the rules by which the store sweeps
//! abandoned temp and stats files, and the live counters a store writes. `tierkv-stat` is
//! built on this module; a caller that only stores and loads blocks needs none of it.

pub use crate::layout::{
    EntryName, INSTANCE_STATS_PREFIX, LAYOUT_FILE, STATS_FILE, TYPICAL_BLOCK_BYTES, USAGE_FILE,
    instance_stats_name, instance_stats_owner, version_dir,
};
pub use crate::ns::walk::{At, Visitor, walk};
pub use crate::ns::{
    BlockDir, Inode, Opened, Parent, Unlinked, io_err, list_workers, node_id, split,
};
pub use crate::store::LiveStats;
pub use crate::store::sweep::{TempRule, instance_stats_abandoned, temp_abandoned};
