//! The scan of a worker's tree when a store opens: counts block files, removes temp files left
//! by a crashed store, and counts (never touches) foreign files and symlinks.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use std::os::unix::fs::MetadataExt;

use crate::key::BlockHash;
use crate::layout::{EntryName, Layout};

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
    /// Files or directories that do not belong to the layout (left alone).
    pub foreign: u64,
    /// Symlinks anywhere in the tree (never followed, left alone).
    pub symlinks: u64,
    /// Errors met while scanning (unreadable directories), with their paths.
    pub errors: Vec<(PathBuf, String)>,
    /// The block files, when the scan was asked to stat them.
    pub entries: Vec<BlockEntry>,
}

impl SweepReport {
    fn merge(&mut self, o: SweepReport) {
        self.blocks += o.blocks;
        self.temp += o.temp;
        self.foreign += o.foreign;
        self.symlinks += o.symlinks;
        self.errors.extend(o.errors);
        self.entries.extend(o.entries);
    }
}

/// How a scan treats what it finds.
#[derive(Clone, Copy, Debug)]
struct Mode {
    layout: Layout,
    remove_temp: bool,
    stat_blocks: bool,
}

/// Scans the worker directory `dir` laid out as `layout`; removes temp files when
/// `remove_temp`; stats every block file (size and times, for the index) when `stat_blocks`.
/// Top-level shard directories are scanned by parallel threads.
pub fn sweep(dir: &Path, layout: Layout, remove_temp: bool, stat_blocks: bool) -> SweepReport {
    let mode = Mode {
        layout,
        remove_temp,
        stat_blocks,
    };
    let mut report = SweepReport::default();
    let mut subdirs = Vec::new();
    scan_dir(dir, 0, mode, &mut report, &mut subdirs);
    if subdirs.is_empty() {
        return report;
    }
    let parts = in_parallel(subdirs, 8, |d, r: &mut SweepReport| {
        let mut nested = Vec::new();
        scan_dir(&d, 1, mode, r, &mut nested);
        // Deeper levels are scanned by the same thread, depth first.
        let mut stack: Vec<(PathBuf, u8)> = nested.into_iter().map(|p| (p, 2)).collect();
        while let Some((p, lvl)) = stack.pop() {
            let mut more = Vec::new();
            scan_dir(&p, lvl, mode, r, &mut more);
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

/// Scans one directory at `level` (0 = the worker directory). Shard subdirectories to
/// descend into are pushed on `subdirs`.
fn scan_dir(dir: &Path, level: u8, mode: Mode, r: &mut SweepReport, subdirs: &mut Vec<PathBuf>) {
    let layout = mode.layout;
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            r.errors.push((dir.to_path_buf(), e.to_string()));
            return;
        }
    };
    let is_leaf = level == layout.depth;
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                r.errors.push((dir.to_path_buf(), e.to_string()));
                continue;
            }
        };
        // file_type() does not follow symlinks.
        let ft = match entry.file_type() {
            Ok(t) => t,
            Err(e) => {
                r.errors.push((entry.path(), e.to_string()));
                continue;
            }
        };
        let name = entry.file_name();
        let name = name.to_str().unwrap_or("");
        if ft.is_symlink() {
            r.symlinks += 1;
            continue;
        }
        if ft.is_dir() {
            if !is_leaf && layout.is_shard_dir(name) {
                subdirs.push(entry.path());
            } else {
                r.foreign += 1;
            }
            continue;
        }
        if !ft.is_file() {
            r.foreign += 1;
            continue;
        }
        match Layout::classify(name) {
            EntryName::Block(hash) if is_leaf => {
                r.blocks += 1;
                if mode.stat_blocks {
                    match entry.metadata() {
                        Ok(m) => {
                            let ns =
                                |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
                            r.entries.push(BlockEntry {
                                hash,
                                bytes: m.blocks() * 512,
                                recency_ns: ns(m.atime(), m.atime_nsec())
                                    .max(ns(m.mtime(), m.mtime_nsec())),
                            });
                        }
                        // Gone since readdir: nothing to index.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => r.blocks -= 1,
                        Err(e) => r.errors.push((entry.path(), e.to_string())),
                    }
                }
            }
            EntryName::Temp if is_leaf => {
                r.temp += 1;
                if mode.remove_temp {
                    if let Err(e) = fs::remove_file(entry.path()) {
                        r.errors.push((entry.path(), e.to_string()));
                    }
                }
            }
            EntryName::Meta if level == 0 => {}
            _ => r.foreign += 1,
        }
    }
}
