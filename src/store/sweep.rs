//! The scan of a worker's tree when a store opens: counts block files, removes temp files left
//! by a crashed store, and counts (never touches) foreign files and symlinks. The tree is
//! walked by [`crate::ns::walk`], which `tierkv-stat` walks it with too.

use std::path::PathBuf;

use rustix::io::Errno;

use crate::key::BlockHash;
use crate::layout::Layout;
use crate::ns::walk::{At, Visitor, walk};
use crate::ns::{BlockDir, FileKind, Parent, io_err};

/// A block file found by a scan, with what the index needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEntry {
    /// The block (from the file name).
    pub hash: BlockHash,
    /// Bytes it takes on disk (`st_blocks * 512`).
    pub bytes: u64,
    /// Last use as far as the filesystem knows: the later of access and modification time,
    /// in nanoseconds since the epoch.
    pub recency_ns: i64,
}

/// What a scan found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Block files (by name; contents are not read).
    pub blocks: u64,
    /// Temp files removed (or found, when not removing).
    pub temp: u64,
    /// Bytes on disk of the temp files removed.
    pub temp_bytes: u64,
    /// Of the temp files removed, those whose writer is known to be gone (a process of this
    /// node that is not alive, or any under [`TempRule::All`]), and their bytes: the room
    /// they held in a shared ledger is theirs to return. One removed only for its age may
    /// belong to a writer still at work (stopped, or slower than the lease), whose failed put
    /// returns its reservation itself.
    pub temp_dead: u64,
    /// Bytes on disk of those.
    pub temp_dead_bytes: u64,
    /// Temp files kept because their owner may still be writing them (shared mode).
    pub temp_kept: u64,
    /// Stats files of shared stores that are gone, removed.
    pub stale_instances: u64,
    /// Files or directories that do not belong to the layout (left alone).
    pub foreign: u64,
    /// Symlinks anywhere in the tree (never followed, left alone).
    pub symlinks: u64,
    /// Files named like a block but not where the layout puts that block (never served).
    pub misplaced: u64,
    /// Their paths, relative to the worker directory.
    pub misplaced_paths: Vec<String>,
    /// Errors met while scanning (unreadable directories), with their paths.
    pub errors: Vec<(PathBuf, String)>,
    /// The block files, when the scan was asked to stat them.
    pub entries: Vec<BlockEntry>,
}

impl SweepReport {
    fn merge(&mut self, o: SweepReport) {
        self.blocks += o.blocks;
        self.temp += o.temp;
        self.temp_bytes += o.temp_bytes;
        self.temp_dead += o.temp_dead;
        self.temp_dead_bytes += o.temp_dead_bytes;
        self.temp_kept += o.temp_kept;
        self.stale_instances += o.stale_instances;
        self.foreign += o.foreign;
        self.symlinks += o.symlinks;
        self.misplaced += o.misplaced;
        self.misplaced_paths.extend(o.misplaced_paths);
        self.errors.extend(o.errors);
        self.entries.extend(o.entries);
    }
}

/// Which temp files a scan removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TempRule {
    /// None (they are counted).
    Keep,
    /// All of them: no other store can be writing (the worker lock is held exclusively).
    All,
    /// Those whose owner is gone (shared mode): a temp file of this node whose process is not
    /// alive, and one of another node (or of a name without a node) older than `lease`. A
    /// temp file of a live process of this node stays whatever its age (the process may be
    /// stopped, or slow). Stats files of shared stores that are gone go by the same rule.
    OwnerGone {
        /// The age after which another node's temp file is abandoned.
        lease: std::time::Duration,
    },
}

/// How a scan treats what it finds.
#[derive(Clone, Copy, Debug)]
struct Mode {
    temps: TempRule,
    stat_blocks: bool,
}

/// Scans the worker directory of `ns` laid out as `layout`, through the namespace layer (no
/// symlink is followed, nothing but regular temp files is removed); removes the temp files
/// `temps` says; stats every block file (size and times, for the index) when `stat_blocks`.
/// Top-level shard directories are scanned by parallel threads.
pub fn sweep_with(
    ns: &BlockDir,
    layout: Layout,
    temps: TempRule,
    stat_blocks: bool,
) -> SweepReport {
    let mode = Mode { temps, stat_blocks };
    let mut report = SweepReport::default();
    for part in walk(ns, layout, 8, || Sweeper {
        mode,
        r: SweepReport::default(),
    }) {
        report.merge(part.r);
    }
    report
}

/// The sweep's visitor of the tree walk: what one thread found.
struct Sweeper {
    mode: Mode,
    r: SweepReport,
}

impl Visitor for Sweeper {
    fn block(&mut self, at: &At<'_>, hash: BlockHash) {
        let r = &mut self.r;
        r.blocks += 1;
        if !self.mode.stat_blocks {
            return;
        }
        match at.ns.stat_in(at.parent, at.name) {
            Ok(m) if FileKind::of_stat(&m) == FileKind::File => {
                let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
                r.entries.push(BlockEntry {
                    hash,
                    bytes: m.st_blocks as u64 * 512,
                    recency_ns: ns(m.st_atime, m.st_atime_nsec as i64)
                        .max(ns(m.st_mtime, m.st_mtime_nsec as i64)),
                });
            }
            // Replaced by something else since the listing: not a block.
            Ok(_) => {
                r.blocks -= 1;
                r.foreign += 1;
            }
            // Gone since readdir: nothing to index.
            Err(Errno::NOENT) => r.blocks -= 1,
            Err(e) => {
                r.blocks -= 1;
                r.errors.push((at.path(), io_err(e).to_string()));
            }
        }
    }

    fn misplaced(&mut self, at: &At<'_>, _: BlockHash) {
        self.r.misplaced += 1;
        self.r.misplaced_paths.push(at.rel());
    }

    fn temp(&mut self, at: &At<'_>) {
        remove_temp(at, self.mode, &mut self.r);
    }

    fn meta(&mut self, at: &At<'_>) {
        if instance_stats_abandoned(at.ns, at.parent, at.name, self.mode.temps)
            && at.ns.unlink_in(at.parent, at.name, None).is_ok()
        {
            self.r.stale_instances += 1;
        }
    }

    fn symlink(&mut self) {
        self.r.symlinks += 1;
    }

    fn foreign(&mut self) {
        self.r.foreign += 1;
    }

    fn unreadable(&mut self, path: PathBuf, err: Errno) {
        self.r.errors.push((path, io_err(err).to_string()));
    }
}

/// Why a file is abandoned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gone {
    /// Its writer is known not to be running: a process of this node that is not alive, or
    /// any writer under [`TempRule::All`].
    Dead,
    /// Another node's (or a name's without a node) and older than the lease: its writer may
    /// still be at work.
    Aged,
}

/// Whether the file `name` (a temp file or a shared store's stats file), written by `owner`
/// as its name says (`None`: a name of an earlier version, which says no owner), is abandoned
/// under `rule`, and why: under `OwnerGone`, its owner is a process of this node that is not
/// alive, or it is another node's (or says no node) and older than the lease. A process of
/// this node that is alive keeps its files at any age.
fn abandoned(
    ns: &BlockDir,
    parent: &Parent<'_>,
    name: &str,
    owner: Option<crate::layout::Owner>,
    rule: TempRule,
) -> Option<Gone> {
    match rule {
        TempRule::Keep => None,
        TempRule::All => Some(Gone::Dead),
        TempRule::OwnerGone { lease } => match owner {
            Some(o) if o.node == Some(crate::ns::node_id()) => {
                (!crate::ns::pid_alive(o.pid)).then_some(Gone::Dead)
            }
            _ => older_than(ns, parent, name, lease).then_some(Gone::Aged),
        },
    }
}

/// True if `name`'s modification time is more than `lease` ago.
fn older_than(ns: &BlockDir, parent: &Parent<'_>, name: &str, lease: std::time::Duration) -> bool {
    let Ok(st) = ns.stat_in(parent, name) else {
        return false;
    };
    let mtime = std::time::UNIX_EPOCH
        + std::time::Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec as u32);
    std::time::SystemTime::now()
        .duration_since(mtime)
        .is_ok_and(|age| age > lease)
}

/// True if the temp file `name` in `parent` is abandoned under `rule`: what a sweep would
/// remove (for tools that clean a tree, e.g. `tierkv-stat --repair --sharing shared`).
pub fn temp_abandoned(ns: &BlockDir, parent: &Parent<'_>, name: &str, rule: TempRule) -> bool {
    abandoned(ns, parent, name, Layout::temp_owner(name), rule).is_some()
}

/// True if `name` in `parent` is the stats file of a shared store that is gone under `rule`:
/// what a sweep removes (`tierkv-stat --repair` removes it too).
pub fn instance_stats_abandoned(
    ns: &BlockDir,
    parent: &Parent<'_>,
    name: &str,
    rule: TempRule,
) -> bool {
    let owner = crate::layout::instance_stats_owner(name);
    owner.is_some() && abandoned(ns, parent, name, owner, rule).is_some()
}

/// Counts a temp file, and removes it (if it is still a regular file) when the rule says
/// its owner is gone.
fn remove_temp(at: &At<'_>, mode: Mode, r: &mut SweepReport) {
    if mode.temps == TempRule::Keep {
        r.temp += 1;
        return;
    }
    let owner = Layout::temp_owner(at.name);
    let Some(gone) = abandoned(at.ns, at.parent, at.name, owner, mode.temps) else {
        r.temp_kept += 1;
        return;
    };
    r.temp += 1;
    match at.ns.unlink_in_sized(at.parent, at.name, None) {
        Ok((_, bytes)) => {
            r.temp_bytes += bytes;
            if gone == Gone::Dead {
                r.temp_dead += 1;
                r.temp_dead_bytes += bytes;
            }
        }
        Err(e) => r.errors.push((at.path(), io_err(e).to_string())),
    }
}
