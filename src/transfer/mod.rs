//! The engine-facing asynchronous API: loads and saves of whole batches of blocks between an
//! engine's own KV memory and a [`Store`], submitted without waiting and finished on threads
//! of their own.
//!
//! An engine describes its KV memory once ([`KvMemory`]: one base address, and per region of a
//! block its offset, length and the stride from one block to the next: a paged KV cache's
//! layers, K and V), then names blocks by their index in it. A batch is a list of keys and block
//! indices; nothing per layer or per region crosses the call, and the submitting thread does no
//! disk I/O and takes no lock a batch holds while it runs: [`Transfers::submit_load`] and
//! [`Transfers::submit_save`] queue the batch and return its id. Each finished batch comes back
//! ([`Transfers::drain`], [`Transfers::wait`], or an eventfd for the engine's own loop:
//! [`Transfers::event_fd`]) with one outcome per block: [`LoadOutcome`] (loaded, missing,
//! failed) and [`SaveOutcome`] (written, present, not admitted, failed).
//!
//! The contract with the engine is the buffers' ownership, as in io_uring: from a submission
//! until its completion is collected, the batch's blocks are the batch's. A save reads its
//! blocks' memory on a transfer thread, so the engine must not reuse a block until the save
//! that names it has completed (the completion is the notification that it may); a load writes
//! them, so the engine must not read them before. Blocks of one batch must be distinct (a batch
//! that names one twice is refused whole); two batches in flight at once must not name one
//! block if either is a load.
//!
//! Ordering: batches start in submission order; with more than one thread they may complete in
//! any order (each completion carries its id). Closing (or dropping) runs every batch already
//! submitted first.

use std::collections::HashSet;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::BlockKey;
use crate::queue::{Runner, guarded};
use crate::store::{Lookup, Store};

/// One region of every block: block `b`'s bytes of it are `offset + b * stride ..` plus `len`,
/// from the memory's base. A block's payload is its regions' bytes in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Where block 0's bytes of this region start, from the base.
    pub offset: usize,
    /// How many bytes each block has in this region.
    pub len: usize,
    /// From one block's bytes of this region to the next block's.
    pub stride: usize,
}

/// An engine's KV memory as the transfers see it: a base address and the regions of a block
/// (see the module docs). Checked when made: every block's regions lie within the memory, and
/// no two blocks share a byte, so transfers of distinct blocks never touch the same memory.
#[derive(Debug)]
pub struct KvMemory {
    base: *mut u8,
    regions: Vec<Region>,
    blocks: usize,
    block_bytes: usize,
}

// SAFETY: `KvMemory` is an address range that its maker promised is valid for reads and writes
// for as long as the value lives (`KvMemory::new`'s contract); the transfers touch it only
// through disjoint blocks that the engine hands over for the time of a batch.
unsafe impl Send for KvMemory {}
// SAFETY: as for `Send`: shared references give no access to the memory but through a batch.
unsafe impl Sync for KvMemory {}

impl KvMemory {
    /// The memory `[base, base + len)` holding `blocks` blocks, each made of `regions` in order.
    ///
    /// Refused (`Error::Config`): no region or an empty one, a region whose blocks would
    /// overlap one another (a stride shorter than its length) or pass the end of the memory,
    /// and two regions whose spans (block 0 to the last block) overlap.
    ///
    /// # Safety
    /// `base..base + len` must be valid for reads and writes, and must stay so, in place, for
    /// as long as the returned value and any [`Transfers`] made from it live. The engine may
    /// use the memory meanwhile, but not the blocks of a batch in flight (module docs).
    pub unsafe fn new(
        base: *mut u8,
        len: usize,
        regions: Vec<Region>,
        blocks: usize,
    ) -> Result<Self> {
        let bad = |what: String| Err(Error::Config(format!("KV memory: {what}")));
        if regions.is_empty() {
            return bad("no region".into());
        }
        let mut spans = Vec::with_capacity(regions.len());
        for (i, r) in regions.iter().enumerate() {
            if r.len == 0 {
                return bad(format!("region {i} is empty"));
            }
            if blocks > 1 && r.stride < r.len {
                return bad(format!(
                    "region {i}: a stride of {} bytes is shorter than its {} bytes a block",
                    r.stride, r.len
                ));
            }
            let end = blocks
                .saturating_sub(1)
                .checked_mul(r.stride)
                .and_then(|s| s.checked_add(r.offset))
                .and_then(|s| s.checked_add(r.len));
            match end {
                Some(end) if end <= len => spans.push((r.offset, end, i)),
                _ => {
                    return bad(format!(
                        "region {i} of {blocks} blocks passes the end of the memory ({len} bytes)"
                    ));
                }
            }
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return bad(format!("regions {} and {} overlap", w[0].2, w[1].2));
            }
        }
        let block_bytes = regions.iter().map(|r| r.len).sum();
        Ok(KvMemory {
            base,
            regions,
            blocks,
            block_bytes,
        })
    }

    /// How many blocks the memory holds.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// A block's payload length: its regions' lengths added up.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The regions of a block.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The addresses and lengths of block `b`'s regions.
    fn parts(&self, b: usize) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        // SAFETY (of the `add`): `b < blocks`, checked by the caller, so every part lies
        // within the memory (`new` checked the last block's end against `len`).
        self.regions
            .iter()
            .map(move |r| (unsafe { self.base.add(r.offset + b * r.stride) }, r.len))
    }
}

/// What a load did to one block.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadOutcome {
    /// The block's bytes are in its memory, whole.
    Loaded,
    /// Not stored (never, evicted, deleted, or corrupt and removed): recompute it. Its memory
    /// holds no known bytes.
    Missing,
    /// Stored with a length other than a block of this memory (another layout's block).
    WrongLength {
        /// The stored payload's length.
        len: usize,
    },
    /// An error (an I/O error, a refused batch): recompute it.
    Failed(Error),
}

impl LoadOutcome {
    /// True for [`LoadOutcome::Loaded`].
    pub fn is_loaded(&self) -> bool {
        matches!(self, LoadOutcome::Loaded)
    }

    /// Its name: `loaded`, `missing`, `wrong_length` or `failed` (as Python sees it).
    pub fn name(&self) -> &'static str {
        match self {
            LoadOutcome::Loaded => "loaded",
            LoadOutcome::Missing => "missing",
            LoadOutcome::WrongLength { .. } => "wrong_length",
            LoadOutcome::Failed(_) => "failed",
        }
    }
}

/// What a save did with one block.
#[derive(Debug)]
#[non_exhaustive]
pub enum SaveOutcome {
    /// Written by this save.
    Written,
    /// Already stored (by an earlier save, or another store of the tree): only marked used.
    Present,
    /// Not stored: declined by the policy, no room under the capacity, or its chain's
    /// parent was no longer stored (a block is stored only while its parent is).
    NotAdmitted,
    /// An error: not stored.
    Failed(Error),
}

impl SaveOutcome {
    /// True if the block is stored after the save ([`SaveOutcome::Written`] or
    /// [`SaveOutcome::Present`]).
    pub fn is_stored(&self) -> bool {
        matches!(self, SaveOutcome::Written | SaveOutcome::Present)
    }

    /// Its name: `written`, `present`, `not_admitted` or `failed` (as Python sees it).
    pub fn name(&self) -> &'static str {
        match self {
            SaveOutcome::Written => "written",
            SaveOutcome::Present => "present",
            SaveOutcome::NotAdmitted => "not_admitted",
            SaveOutcome::Failed(_) => "failed",
        }
    }
}

/// A finished batch: its id and one outcome per block, in the order submitted.
#[derive(Debug)]
#[non_exhaustive]
pub enum Transfer {
    /// A [`Transfers::submit_load`].
    Load {
        /// The id its submission returned.
        id: u64,
        /// One per block.
        outcomes: Vec<LoadOutcome>,
    },
    /// A [`Transfers::submit_save`]: its blocks' memory may be reused.
    Save {
        /// The id its submission returned.
        id: u64,
        /// One per block.
        outcomes: Vec<SaveOutcome>,
    },
}

impl Transfer {
    /// The id its submission returned.
    pub fn id(&self) -> u64 {
        match self {
            Transfer::Load { id, .. } | Transfer::Save { id, .. } => *id,
        }
    }
}

/// One batch, as submitted.
enum Job {
    Load {
        keys: Vec<BlockKey>,
        blocks: Vec<usize>,
    },
    Save {
        parent: Option<BlockKey>,
        keys: Vec<BlockKey>,
        blocks: Vec<usize>,
    },
}

/// What every batch runs against.
struct Ctx {
    store: Store,
    memory: KvMemory,
}

/// Loads and saves between an engine's [`KvMemory`] and a [`Store`] (see the module docs).
pub struct Transfers {
    runner: Runner<Ctx, Job, Transfer>,
}

impl std::fmt::Debug for Transfers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = &self.runner.ctx().memory;
        f.debug_struct("Transfers")
            .field("threads", &self.runner.threads())
            .field("pending", &self.pending())
            .field("blocks", &m.blocks)
            .field("block_bytes", &m.block_bytes)
            .finish_non_exhaustive()
    }
}

impl Transfers {
    /// Transfers between `memory` and `store` on `threads` threads (`tierkv-xfer-N`, at least
    /// one). A load or save of one batch runs on one thread, through the store's batch calls
    /// (whose I/O engine submits the blocks together).
    pub fn new(store: Store, memory: KvMemory, threads: usize) -> Result<Self> {
        let dir = store.dir().to_path_buf();
        let ctx = Ctx { store, memory };
        Ok(Transfers {
            runner: Runner::new(ctx, Ctx::run, threads, "tierkv-xfer", &dir)?,
        })
    }

    /// The store the batches run on.
    pub fn store(&self) -> &Store {
        &self.runner.ctx().store
    }

    /// The memory the batches move blocks into and out of.
    pub fn memory(&self) -> &KvMemory {
        &self.runner.ctx().memory
    }

    /// Queues a load of `keys[i]` into block `blocks[i]` of the memory; returns its id. The
    /// blocks are the batch's until its completion is collected.
    pub fn submit_load(&self, keys: Vec<BlockKey>, blocks: Vec<usize>) -> u64 {
        self.submit(Job::Load { keys, blocks })
    }

    /// Queues a save of block `blocks[i]` of the memory under `keys[i]`, one chain hung from
    /// `parent` (the stored block before `keys[0]`, or `None` at a chain's root: as
    /// [`Store::offer_many_vectored_after`]); returns its id. The blocks must not be reused
    /// until its completion is collected.
    pub fn submit_save(
        &self,
        parent: Option<BlockKey>,
        keys: Vec<BlockKey>,
        blocks: Vec<usize>,
    ) -> u64 {
        self.submit(Job::Save {
            parent,
            keys,
            blocks,
        })
    }

    fn submit(&self, job: Job) -> u64 {
        self.runner.submit(job)
    }

    /// The finished batches not yet collected, without waiting.
    pub fn drain(&self) -> Vec<Transfer> {
        self.runner.drain()
    }

    /// Waits until at least one batch has finished or `timeout` has passed (`None`: no limit,
    /// but returns at once when none is pending), and collects what finished.
    pub fn wait(&self, timeout: Option<Duration>) -> Vec<Transfer> {
        self.runner.wait(timeout)
    }

    /// An eventfd that is readable while finished batches wait to be collected.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.runner.event_fd()
    }

    /// Batches submitted and not yet collected (queued, running or finished).
    pub fn pending(&self) -> u64 {
        self.runner.pending()
    }

    /// Runs every batch already submitted, stops the threads, and returns what finished and
    /// was not collected. (Dropping runs what was submitted too: no block handed over is left
    /// half-written.)
    pub fn close(mut self) -> Vec<Transfer> {
        self.runner.stop();
        self.runner.drain()
    }
}

impl Ctx {
    /// Runs batch `id`.
    fn run(&self, id: u64, job: Job) -> Transfer {
        match job {
            Job::Load { keys, blocks } => Transfer::Load {
                id,
                outcomes: self.load(&keys, &blocks),
            },
            Job::Save {
                parent,
                keys,
                blocks,
            } => Transfer::Save {
                id,
                outcomes: self.save(parent.as_ref(), &keys, &blocks),
            },
        }
    }

    /// Why a batch naming `blocks` for `keys` cannot run, if it cannot: a count mismatch, a
    /// block out of the memory, or one block named twice.
    fn refuse(&self, keys: &[BlockKey], blocks: &[usize]) -> Option<String> {
        let m = &self.memory;
        if keys.len() != blocks.len() {
            return Some(format!(
                "a transfer of {} keys names {} blocks: one block per key",
                keys.len(),
                blocks.len()
            ));
        }
        if let Some(b) = blocks.iter().find(|&&b| b >= m.blocks) {
            return Some(format!(
                "block {b} is outside the KV memory ({} blocks)",
                m.blocks
            ));
        }
        let mut seen = HashSet::with_capacity(blocks.len());
        if let Some(b) = blocks.iter().find(|&&b| !seen.insert(b)) {
            return Some(format!("block {b} is named twice in one transfer"));
        }
        None
    }

    fn load(&self, keys: &[BlockKey], blocks: &[usize]) -> Vec<LoadOutcome> {
        if let Some(why) = self.refuse(keys, blocks) {
            return failed_all(blocks.len().max(keys.len()), &why, LoadOutcome::Failed);
        }
        let want = self.memory.block_bytes;
        let results = guarded(&self.store, keys.len(), || {
            // SAFETY: the blocks are within the memory and distinct (`refuse`), so their parts
            // are valid and pairwise disjoint (`KvMemory::new`); the engine does not touch them
            // until this batch's completion is collected (the module's contract).
            let mut parts: Vec<Vec<&mut [u8]>> = blocks
                .iter()
                .map(|&b| {
                    self.memory
                        .parts(b)
                        .map(|(p, n)| unsafe { std::slice::from_raw_parts_mut(p, n) })
                        .collect()
                })
                .collect();
            let mut per_key: Vec<&mut [&mut [u8]]> =
                parts.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.store.get_many_vectored(keys, &mut per_key)
        });
        results
            .into_iter()
            .map(|r| match r {
                Ok(Lookup::Hit(n)) if n == want => LoadOutcome::Loaded,
                Ok(Lookup::Hit(n)) => LoadOutcome::WrongLength { len: n },
                Ok(Lookup::Miss) => LoadOutcome::Missing,
                Err(e) => LoadOutcome::Failed(e),
            })
            .collect()
    }

    fn save(
        &self,
        parent: Option<&BlockKey>,
        keys: &[BlockKey],
        blocks: &[usize],
    ) -> Vec<SaveOutcome> {
        if let Some(why) = self.refuse(keys, blocks) {
            return failed_all(blocks.len().max(keys.len()), &why, SaveOutcome::Failed);
        }
        let before: Vec<bool> = keys.iter().map(|k| self.store.indexed(k)).collect();
        let results = guarded(&self.store, keys.len(), || {
            // SAFETY: as in `load`; a save only reads, and the engine does not reuse the
            // blocks until this batch's completion is collected.
            let parts: Vec<Vec<&[u8]>> = blocks
                .iter()
                .map(|&b| {
                    self.memory
                        .parts(b)
                        .map(|(p, n)| unsafe { std::slice::from_raw_parts(p.cast_const(), n) })
                        .collect()
                })
                .collect();
            let items: Vec<(BlockKey, &[&[u8]])> = keys
                .iter()
                .cloned()
                .zip(parts.iter().map(|v| v.as_slice()))
                .collect();
            self.store.offer_many_vectored_after(parent, &items)
        });
        results
            .into_iter()
            .zip(keys.iter().zip(before))
            .map(|(r, (k, was))| match r {
                Err(e) => SaveOutcome::Failed(e),
                Ok(()) if was => SaveOutcome::Present,
                Ok(()) if self.store.indexed(k) => SaveOutcome::Written,
                Ok(()) => SaveOutcome::NotAdmitted,
            })
            .collect()
    }
}

/// `n` outcomes, each failing with the refusal `why`.
fn failed_all<T>(n: usize, why: &str, f: impl Fn(Error) -> T) -> Vec<T> {
    (0..n).map(|_| f(Error::Config(why.to_string()))).collect()
}
