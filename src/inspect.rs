//! What a cache tree holds, for `tierkv-stat` and any tool that audits a tree: its workers,
//! the counters its running stores publish, and a scan of one worker's tree that judges every
//! block file against the format (docs/format.md) the way the store reads it, and with
//! repair removes what the store's own sweep would. Everything goes through the namespace
//! layer: nothing is followed through a symlink, only regular files are removed, and only the
//! inode that was judged. Block files are opened `O_NOATIME`, so a scan does not move the
//! access times the store's recency comes from. A caller that only stores and loads blocks
//! needs none of this.
//!
//! ```
//! use tierkv::inspect::{Found, ScanOptions, WorkerDir, workers};
//! use tierkv::{Store, StoreConfig, WorkerId};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path(), WorkerId::new("rank0")?, StoreConfig::default())?;
//! store.put(&store.key(tierkv::BlockHash::of_engine_key(b"m", b"k")), &[7u8; 4096])?;
//! drop(store);
//! assert_eq!(workers(dir.path())?, vec!["rank0".to_string()]);
//! let w = WorkerDir::open(dir.path(), "rank0")?;
//! let layout = w.layout()?.expect("a store records its layout");
//! let mut blocks = 0;
//! for found in w.scan(layout, &ScanOptions::default(), None, Vec::new, |v, f| v.push(f)) {
//!     blocks += found.iter().filter(|f| matches!(f, Found::Block { .. })).count();
//! }
//! assert_eq!(blocks, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::error::{CorruptReason, Error, Result};
use crate::key::BlockHash;
use crate::layout::{EntryName, LAYOUT_FILE, Layout, USAGE_FILE};
use crate::ns::walk::{At, Visitor, walk};
use crate::ns::{BlockDir, Inode, Opened, Parent, Unlinked, io_err};
use crate::store::sweep::{instance_stats_abandoned, temp_abandoned};
use crate::store::{DEFAULT_TEMP_LEASE, Sharing};

pub use crate::layout::{STATS_FILE, version_dir};
pub use crate::ns::{Filesystem, filesystem};
pub use crate::store::LiveStats;
pub use crate::store::sweep::TempRule;

/// The workers of the cache tree at `root` (the names of the directories under
/// `<root>/v1/`, sorted; a symlink there is not followed). An error names the path.
pub fn workers(root: &Path) -> Result<Vec<String>> {
    crate::ns::list_workers(root)
}

/// A shared worker's usage ledger (`USAGE`): what the stores of the tree have counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerUsage {
    /// Bytes the tree's block files take on disk.
    pub bytes: u64,
    /// Block files in the tree.
    pub files: u64,
}

/// One worker's directory, opened for inspection (never created, never locked unless for
/// repair).
#[derive(Debug)]
pub struct WorkerDir {
    ns: BlockDir,
}

/// The worker lock, held for a repair ([`WorkerDir::lock_for_repair`]) until dropped.
#[derive(Debug)]
pub struct RepairLock<'a> {
    dir: &'a WorkerDir,
    shared: bool,
}

impl Drop for RepairLock<'_> {
    fn drop(&mut self) {
        let _ = self.dir.ns.unlock();
    }
}

/// How a scan reads and what it removes.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct ScanOptions {
    /// Read every block's payload and check its checksum (else the header, name, padding and
    /// length only).
    pub verify: bool,
}

impl ScanOptions {
    /// Checksums verified or not.
    pub fn with_verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }
}

/// What a scan found, one entry at a time.
#[derive(Debug)]
#[non_exhaustive]
pub enum Found {
    /// A valid block file.
    Block {
        /// The block.
        hash: BlockHash,
        /// Its payload's length.
        payload: u64,
        /// The bytes it takes on disk.
        disk_bytes: u64,
        /// When it was last used, in seconds since the epoch (the later of its access and
        /// modification times, as the store's recency reads them).
        last_used_s: u64,
    },
    /// A block file that fails its checks: the header, its name, its padding or length
    /// ([`CorruptReason`] says which), or with [`ScanOptions::verify`] its checksum.
    Bad {
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: CorruptReason,
        /// Removed by the repair (only the inode that was judged).
        removed: bool,
    },
    /// A file named as a block outside the directory its layout puts it in: never served.
    Misplaced {
        /// Its path.
        path: PathBuf,
        /// Removed by the repair.
        removed: bool,
    },
    /// A temp file of a put (or of a control file being rewritten).
    Temp {
        /// Removed by the repair: its owner is gone, as [`TempRule`] decides.
        removed: bool,
        /// Kept by a repair: its owner may still be writing it.
        kept: bool,
    },
    /// The stats file of a shared store that is gone, removed by the repair (as the store's
    /// own sweep removes it).
    StaleStatsRemoved,
    /// A symlink, never followed.
    Symlink,
    /// An entry that does not belong to the layout (a directory, FIFO, device, socket, or a
    /// file with another name), left alone.
    Foreign,
    /// A block file not read: `O_NOATIME` was refused (the scan does not run as the file's
    /// owner), and reading it would move the access time the store's recency comes from.
    NotRead,
    /// Every entry of one leaf directory was visited: the block files it held (valid, bad or
    /// not read).
    LeafDone {
        /// Block files in the leaf.
        blocks: u64,
    },
    /// What could not be read, judged or removed.
    Error {
        /// Its path.
        path: PathBuf,
        /// What went wrong.
        error: String,
    },
}

impl WorkerDir {
    /// Opens the directory of `worker` under `root` (`<root>/v1/<worker>`, no symlink
    /// followed) for inspection. An error names the path.
    pub fn open(root: &Path, worker: &str) -> Result<WorkerDir> {
        Ok(WorkerDir {
            ns: BlockDir::open(root, worker, false)?,
        })
    }

    /// The worker's directory.
    pub fn path(&self) -> &Path {
        self.ns.path()
    }

    /// The layout its `LAYOUT` file records, `None` without one (or one that is not a
    /// layout file). An error reading it names the file.
    pub fn layout(&self) -> Result<Option<Layout>> {
        Ok(self.ns.read_control(LAYOUT_FILE)?.and_then(|t| {
            std::str::from_utf8(&t)
                .ok()
                .and_then(Layout::from_file_text)
        }))
    }

    /// The entries of the worker directory that are not its control files: all foreign when
    /// it has no layout (nothing can be placed without one).
    pub fn entries_besides_control_files(&self) -> Result<u64> {
        let entries = self
            .ns
            .read_dir("")
            .map_err(|e| Error::from_io(self.ns.path(), io_err(e)))?;
        Ok(entries
            .iter()
            .filter(|e| Layout::classify(e.name_str()) != EntryName::Meta)
            .count() as u64)
    }

    /// True if a store holds the worker lock exclusively (an exclusive store is running; a
    /// shared store holds it shared, which this does not see: its stats file does).
    pub fn in_use(&self) -> bool {
        self.ns.is_locked_by_other().unwrap_or(false)
    }

    /// True if the lock's record says its holder is a shared store.
    pub fn holder_is_shared(&self) -> bool {
        self.ns.holder_is_shared()
    }

    /// Takes the worker lock for a repair, held until the guard drops: exclusive (no store
    /// may run, nor open meanwhile), or with `Sharing::Shared` shared beside the running
    /// shared stores. Refused, the error names the holder.
    pub fn lock_for_repair(&self, sharing: Sharing) -> Result<RepairLock<'_>> {
        let shared = sharing == Sharing::Shared;
        let locked = if shared {
            self.ns.try_lock_shared()
        } else {
            self.ns.try_lock()
        };
        match locked {
            Ok(true) => Ok(RepairLock { dir: self, shared }),
            Ok(false) => Err(Error::WorkerBusy {
                path: self.ns.path().to_path_buf(),
                holder: self.ns.holder(),
            }),
            Err(e) => Err(Error::Io {
                path: self.ns.path().to_path_buf(),
                source: std::io::Error::new(
                    io_err(e).kind(),
                    format!("could not take the worker lock: {}", io_err(e)),
                ),
            }),
        }
    }

    /// The counters its stores publish, with their files' names: `STATS.json` (an exclusive
    /// store) and `STATS.<node>.<pid>.json` (one per shared store). Files that cannot be read
    /// or parsed are left out.
    pub fn live_stats(&self) -> Vec<(String, LiveStats)> {
        let mut names = vec![STATS_FILE.to_string()];
        if let Ok(entries) = self.ns.read_dir("") {
            names.extend(
                entries
                    .iter()
                    .map(|e| e.name_str().to_string())
                    .filter(|n| crate::layout::instance_stats_owner(n).is_some()),
            );
        }
        names
            .into_iter()
            .filter_map(|n| {
                let bytes = self.ns.read_control(&n).ok()??;
                let l: LiveStats = serde_json::from_slice(&bytes).ok()?;
                Some((n, l))
            })
            .collect()
    }

    /// A shared worker's usage ledger, if it has a valid one.
    pub fn ledger(&self) -> Option<LedgerUsage> {
        let text = self.ns.read_control(USAGE_FILE).ok()??;
        let text = String::from_utf8_lossy(&text);
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.trim().parse().ok())
        };
        Some(LedgerUsage {
            bytes: field("bytes")?,
            files: field("files")?,
        })
    }

    /// The worker's events from `from` on (at most `max`), from its event journal
    /// ([`StoreConfig::events`](crate::StoreConfig::events)); empty, its `journal_id` 0,
    /// without one.
    pub fn events_since(&self, from: u64, max: usize) -> Result<crate::EventsRead> {
        self.read_journal(|j| j.read_since(from, max))
    }

    /// Where the worker's event journal ends now (its `next` and `journal_id`; the default,
    /// without one): where a consumer that has just listed the tree starts following it.
    pub fn events_end(&self) -> Result<crate::EventsRead> {
        self.read_journal(crate::ns::Journal::end)
    }

    /// `read` of the worker's journal, opened to read (no lock); the default without one.
    fn read_journal(
        &self,
        read: impl FnOnce(&crate::ns::Journal) -> Result<crate::EventsRead>,
    ) -> Result<crate::EventsRead> {
        match self
            .ns
            .open_journal(false, false, true, std::time::Duration::ZERO)?
        {
            Some(j) => read(&j),
            None => Ok(crate::EventsRead::default()),
        }
    }

    /// Walks the tree laid out as `layout` and reads every block file in it, on up to 8
    /// threads, each reporting what it finds to `on` with a sink of its own from `make`;
    /// returns the sinks. With `repair` (the worker lock held), bad and misplaced block files
    /// are removed, and temp files and stale stats files whose owner is gone (exclusively
    /// held: all of them; shared: as [`TempRule::OwnerGone`] decides, with `temp_lease`).
    pub fn scan<S: Send>(
        &self,
        layout: Layout,
        options: &ScanOptions,
        repair: Option<(&RepairLock<'_>, Option<std::time::Duration>)>,
        make: impl Fn() -> S + Sync,
        on: impl Fn(&mut S, Found) + Sync,
    ) -> Vec<S> {
        let rule = match repair {
            None => TempRule::Keep,
            Some((lock, lease)) if lock.shared => TempRule::OwnerGone {
                lease: lease.unwrap_or(DEFAULT_TEMP_LEASE),
            },
            Some(_) => TempRule::All,
        };
        // Opened as a shared store opens it: the stores of other nodes may append too.
        let journal = match repair {
            Some(_) => self
                .ns
                .open_journal(false, true, true, crate::StoreConfig::default().ledger_wait)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the event journal: this repair's removals are not told");
                    None
                }),
            None => None,
        };
        walk(&self.ns, layout, 8, || Scan {
            repair: repair.is_some(),
            journal: journal.as_ref(),
            verify: options.verify,
            rule,
            sink: make(),
            on: &on,
            in_leaf: 0,
        })
        .into_iter()
        .map(|s| s.sink)
        .collect()
    }
}

/// The tree walk's visitor of [`WorkerDir::scan`], one per thread.
struct Scan<'o, S, F> {
    repair: bool,
    /// The worker's event journal, if it has one: a repair tells the blocks it removes.
    journal: Option<&'o crate::ns::Journal>,
    verify: bool,
    rule: TempRule,
    sink: S,
    on: &'o F,
    /// Block files of the leaf being read.
    in_leaf: u64,
}

/// What reading one block file found.
enum Judged {
    /// A valid block: its payload length and `fstat`.
    Good(u64, Box<rustix::fs::Stat>),
    /// A bad block, read through the descriptor whose inode is given (so repair removes
    /// exactly that file, never a newer one published under the name since).
    Bad(CorruptReason, Inode),
    /// Not a regular file: never read, never removed.
    NotRegular,
    /// Gone since the listing.
    Gone,
    /// Not read: `O_NOATIME` was refused.
    NoAtime,
}

/// Reads and judges a block file ([`crate::format::check_file`]: header, name, padding,
/// length against its own `fstat`, and with `verify` the payload's checksum, streamed),
/// opened `O_NOATIME`. `Err` is an error reading it, never a judgement.
fn check_block(
    ns: &BlockDir,
    parent: &Parent<'_>,
    name: &str,
    name_hash: &BlockHash,
    verify: bool,
) -> std::result::Result<Judged, Errno> {
    let (fd, st) = match ns.open_file_in(parent, name, OFlags::RDONLY | OFlags::NOATIME) {
        Ok(Opened::File(fd, st)) => (fd, st),
        Ok(Opened::NotRegular(_)) => return Ok(Judged::NotRegular),
        // EAGAIN: the writer is reusing the file (a lease; this open does not block).
        Err(Errno::NOENT | Errno::AGAIN) => return Ok(Judged::Gone),
        Err(Errno::PERM) => return Ok(Judged::NoAtime),
        Err(e) => return Err(e),
    };
    match crate::format::check_file(fd.as_fd(), name_hash, st.st_size as u64, verify) {
        Ok(Ok(header)) => Ok(Judged::Good(header.payload_len, st)),
        Ok(Err(reason)) => Ok(Judged::Bad(reason, Inode::of(&st))),
        Err(e) => Err(Errno::from_io_error(&e).unwrap_or(Errno::IO)),
    }
}

impl<S, F: Fn(&mut S, Found)> Scan<'_, S, F> {
    fn found(&mut self, f: Found) {
        (self.on)(&mut self.sink, f);
    }

    /// Removes `at`'s entry for repair: only a regular file, only the inode judged (if
    /// given). True if removed; an error is reported. A block (`told`) is told to the
    /// worker's event journal, under its lock as a store's removals are.
    fn remove(&mut self, at: &At<'_>, judged: Option<Inode>, told: Option<BlockHash>) -> bool {
        let mut journal = told
            .and(self.journal)
            .and_then(|j| j.lock().inspect_err(|e| tracing::warn!(error = %e, "the event journal's lock: a repair's removal is not told")).ok());
        match at.ns.unlink_in(at.parent, at.name, judged) {
            Ok(Unlinked::Removed) => {
                if let (Some(j), Some(h)) = (&mut journal, told) {
                    j.record(
                        crate::ns::EventKind::Removed,
                        crate::ns::EventCause::Repair,
                        h,
                    );
                }
                true
            }
            Ok(Unlinked::Missing) => false,
            Ok(Unlinked::Refused) => {
                tracing::warn!(path = %at.path().display(), "replaced since it was judged: left alone");
                false
            }
            Err(e) => {
                self.found(Found::Error {
                    path: at.path(),
                    error: format!("could not remove: {}", io_err(e)),
                });
                false
            }
        }
    }
}

impl<S, F: Fn(&mut S, Found)> Visitor for Scan<'_, S, F> {
    fn block(&mut self, at: &At<'_>, hash: BlockHash) {
        match check_block(at.ns, at.parent, at.name, &hash, self.verify) {
            Ok(Judged::Good(payload, st)) => {
                self.in_leaf += 1;
                let last_used_s = st.st_atime.max(st.st_mtime).max(0) as u64;
                self.found(Found::Block {
                    hash,
                    payload,
                    disk_bytes: st.st_blocks as u64 * 512,
                    last_used_s,
                });
            }
            Ok(Judged::Bad(reason, inode)) => {
                self.in_leaf += 1;
                tracing::warn!(path = %at.path().display(), %reason, "bad block file");
                let removed = self.repair && self.remove(at, Some(inode), Some(hash));
                self.found(Found::Bad {
                    path: at.path(),
                    reason,
                    removed,
                });
            }
            Ok(Judged::NotRegular) => self.found(Found::Foreign),
            Ok(Judged::Gone) => {}
            Ok(Judged::NoAtime) => {
                self.in_leaf += 1;
                self.found(Found::NotRead);
            }
            Err(e) => {
                self.in_leaf += 1;
                self.found(Found::Error {
                    path: at.path(),
                    error: io_err(e).to_string(),
                });
            }
        }
    }

    fn misplaced(&mut self, at: &At<'_>, _: BlockHash) {
        let mut removed = false;
        if self.repair {
            if let Ok(st) = at.ns.stat_in(at.parent, at.name) {
                removed = self.remove(at, Some(Inode::of(&st)), None);
            }
        }
        self.found(Found::Misplaced {
            path: at.path(),
            removed,
        });
    }

    fn temp(&mut self, at: &At<'_>) {
        let (mut removed, mut kept) = (false, false);
        if self.rule != TempRule::Keep {
            if temp_abandoned(at.ns, at.parent, at.name, self.rule) {
                removed = self.remove(at, None, None);
            } else {
                kept = true;
            }
        }
        self.found(Found::Temp { removed, kept });
    }

    fn meta(&mut self, at: &At<'_>) {
        // A shared store's stats file whose store is gone: removed by repair, as a store's
        // open-time sweep removes it.
        if self.repair
            && instance_stats_abandoned(at.ns, at.parent, at.name, self.rule)
            && self.remove(at, None, None)
        {
            self.found(Found::StaleStatsRemoved);
        }
    }

    fn symlink(&mut self) {
        self.found(Found::Symlink);
    }

    fn foreign(&mut self) {
        self.found(Found::Foreign);
    }

    fn unreadable(&mut self, path: PathBuf, err: Errno) {
        self.found(Found::Error {
            path,
            error: io_err(err).to_string(),
        });
    }

    fn leaf_done(&mut self, _: &str) {
        let blocks = std::mem::take(&mut self.in_leaf);
        self.found(Found::LeafDone { blocks });
    }
}
