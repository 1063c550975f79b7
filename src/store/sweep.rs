//! The scan of a worker's tree when a store opens: counts block files, removes temp files left
//! by a crashed store, and counts (never touches) foreign files and symlinks.

use std::path::PathBuf;
use std::sync::Mutex;

use rustix::io::Errno;

use crate::key::BlockHash;
use crate::layout::{EntryName, Layout};
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
    layout: Layout,
    temps: TempRule,
    stat_blocks: bool,
}

/// Scans the worker directory of `ns` laid out as `layout`, through the namespace layer (no
/// symlink is followed, nothing but regular temp files is removed); removes temp files
/// when `remove_temp`; stats every block file (size and times, for the index) when
/// `stat_blocks`. Top-level shard directories are scanned by parallel threads.
pub fn sweep(ns: &BlockDir, layout: Layout, remove_temp: bool, stat_blocks: bool) -> SweepReport {
    let temps = if remove_temp {
        TempRule::All
    } else {
        TempRule::Keep
    };
    sweep_with(ns, layout, temps, stat_blocks)
}

/// As [`sweep`], removing the temp files `temps` says.
pub fn sweep_with(
    ns: &BlockDir,
    layout: Layout,
    temps: TempRule,
    stat_blocks: bool,
) -> SweepReport {
    let mode = Mode {
        layout,
        temps,
        stat_blocks,
    };
    let mut report = SweepReport::default();
    let mut subdirs = Vec::new();
    scan_dir(ns, "", 0, mode, &mut report, &mut subdirs);
    if subdirs.is_empty() {
        return report;
    }
    let parts = in_parallel(subdirs, 8, |d, r: &mut SweepReport| {
        let mut stack: Vec<(String, u8)> = vec![(d, 1)];
        // Deeper levels are scanned by the same thread, depth first.
        while let Some((p, lvl)) = stack.pop() {
            let mut more = Vec::new();
            scan_dir(ns, &p, lvl, mode, r, &mut more);
            stack.extend(more.into_iter().map(|m| (m, lvl + 1)));
        }
    });
    for p in parts {
        report.merge(p);
    }
    report
}

/// Runs `job` over `items` on up to `max_threads` threads (no more than the machine's cores or
/// the items): each thread takes the next item from a shared queue and folds what it finds
/// into a result of its own, and the threads' results are returned. The tree walks (this
/// sweep, `tierkv-stat`'s scan) use it to read shard directories in parallel.
pub fn in_parallel<T: Send, R: Default + Send>(
    items: Vec<T>,
    max_threads: usize,
    job: impl Fn(T, &mut R) + Sync,
) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, max_threads.max(1))
        .min(items.len());
    let queue = Mutex::new(items);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut r = R::default();
                    loop {
                        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                        let Some(item) = next else { break };
                        job(item, &mut r);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("scan thread panicked"))
            .collect()
    })
}

/// Scans the directory `rel` at `level` (0 = the worker directory). Shard subdirectories to
/// descend into are pushed on `subdirs`.
fn scan_dir(
    ns: &BlockDir,
    rel: &str,
    level: u8,
    mode: Mode,
    r: &mut SweepReport,
    subdirs: &mut Vec<String>,
) {
    let layout = mode.layout;
    let join = |name: &str| crate::ns::join(rel, name);
    let (parent, entries) = match ns.list(rel) {
        Ok(x) => x,
        Err(Errno::LOOP) => {
            // Replaced by a symlink since its parent was listed: not followed.
            r.symlinks += 1;
            return;
        }
        Err(e) => {
            r.errors.push((ns.full(rel), io_err(e).to_string()));
            return;
        }
    };
    let is_leaf = level == layout.depth;
    for entry in entries {
        let name = entry.name_str();
        match entry.kind {
            FileKind::Symlink => {
                r.symlinks += 1;
                continue;
            }
            FileKind::Dir => {
                if !is_leaf && layout.is_shard_dir(name) {
                    subdirs.push(join(name));
                } else {
                    r.foreign += 1;
                }
                continue;
            }
            FileKind::Special => {
                r.foreign += 1;
                continue;
            }
            FileKind::File => {}
        }
        match Layout::classify(name) {
            EntryName::Block(hash) if is_leaf && layout.rel_path(&hash).dir() == rel => {
                r.blocks += 1;
                if mode.stat_blocks {
                    match ns.stat_in(&parent, name) {
                        Ok(m) if FileKind::of_stat(&m) == FileKind::File => {
                            let ns =
                                |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
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
                            r.errors.push((ns.full(&join(name)), io_err(e).to_string()));
                        }
                    }
                }
            }
            EntryName::Block(_) => {
                r.misplaced += 1;
                r.misplaced_paths.push(join(name));
            }
            EntryName::Temp if is_leaf => remove_temp(ns, &parent, rel, name, mode, r),
            EntryName::ControlTemp if level == 0 => remove_temp(ns, &parent, rel, name, mode, r),
            EntryName::Meta if level == 0 => {
                let owner = crate::layout::instance_stats_owner(name);
                if owner.is_some()
                    && abandoned(ns, &parent, name, owner, mode.temps).is_some()
                    && ns.unlink_in(&parent, name, None).is_ok()
                {
                    r.stale_instances += 1;
                }
            }
            _ => r.foreign += 1,
        }
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

/// Counts a temp file, and removes it (if it is still a regular file) when the rule says
/// its owner is gone.
fn remove_temp(
    ns: &BlockDir,
    parent: &Parent<'_>,
    rel: &str,
    name: &str,
    mode: Mode,
    r: &mut SweepReport,
) {
    if mode.temps == TempRule::Keep {
        r.temp += 1;
        return;
    }
    let Some(gone) = abandoned(ns, parent, name, Layout::temp_owner(name), mode.temps) else {
        r.temp_kept += 1;
        return;
    };
    r.temp += 1;
    match ns.unlink_in_sized(parent, name, None) {
        Ok((_, bytes)) => {
            r.temp_bytes += bytes;
            if gone == Gone::Dead {
                r.temp_dead += 1;
                r.temp_dead_bytes += bytes;
            }
        }
        Err(e) => {
            r.errors
                .push((ns.full(&crate::ns::join(rel, name)), io_err(e).to_string()));
        }
    }
}
