//! The put path: validation, admission, room, temp files streamed through the engine,
//! publication.

use std::cell::OnceCell;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::reuse::{Spare, add_direct};
use super::{Counters, Inner, Stored, io_err};
use crate::buf::{DeviceMem, PooledBuf, align_up};
use crate::engine::IoRequest;
use crate::error::{Error, Result};
use crate::format::{HEADER_LEN, Header, PADDING, PAYLOAD_OFFSET};
use crate::index::Offer;
use crate::key::{BlockHash, BlockKey};
use crate::layout::RelPath;
use crate::ns::{
    CreateError, CreateHooks, Created, EventCause, EventKind, Parent, Published, TempFile, join,
};

/// A put in progress: its temp file and what it will be published as.
pub(super) struct WritePlan<'a> {
    pub rel: RelPath,
    /// The block's directory, opened beneath the worker directory: the temp file is created,
    /// renamed, linked and unlinked through it, never through a path.
    pub parent: Parent<'a>,
    /// The temp name (in `parent`): the file's name until published, or (for an anonymous
    /// `O_TMPFILE` inode) the name it takes when it must replace an existing block.
    pub temp_name: String,
    /// True for an `O_TMPFILE` inode, which has no name until it is linked.
    pub anonymous: bool,
    pub fd: OwnedFd,
    pub header: [u8; HEADER_LEN],
    pub bounce: Option<PooledBuf>,
    /// `O_DIRECT` from an aligned payload: the header and padding in an aligned page of the
    /// store's, the payload written from the caller's memory (no bounce buffer, no copy).
    pub head_page: Option<PooledBuf>,
    pub hash: BlockHash,
    pub len: usize,
    /// The payload comes from GPU memory: the engine writes it, then the header is computed
    /// from the bytes in the file and written (see `Inner::seal`).
    pub device: bool,
    /// The file is an evicted block's, reused ([`Spare`]): its length before this put, and
    /// when the write lease held on it until the put's bytes are in was taken.
    pub reused: Option<(u64, std::time::Instant)>,
}

/// What a put writes: host bytes, or GPU memory.
pub(super) trait Source {
    /// The payload's length in bytes.
    fn len(&self) -> usize;
    /// The bytes, when they are in host memory.
    fn host(&self) -> Option<&[u8]>;
    /// The memory, when it is on a GPU.
    fn device(&self) -> Option<DeviceMem>;
    /// The bytes, when they are in several host buffers, one payload in their order.
    fn parts(&self) -> Option<&[&[u8]]> {
        None
    }
}

/// A payload gathered from several host buffers (an MHA page's K and V regions), written as
/// one payload in their order without copying them together ([`Store::put_many_vectored`]).
///
/// [`Store::put_many_vectored`]: super::Store::put_many_vectored
pub(super) struct Gather<'a>(pub(super) &'a [&'a [u8]]);

impl Source for Gather<'_> {
    fn len(&self) -> usize {
        self.0.iter().map(|p| p.len()).sum()
    }
    fn host(&self) -> Option<&[u8]> {
        None
    }
    fn device(&self) -> Option<DeviceMem> {
        None
    }
    fn parts(&self) -> Option<&[&[u8]]> {
        Some(self.0)
    }
}

impl<D: AsRef<[u8]>> Source for D {
    fn len(&self) -> usize {
        self.as_ref().len()
    }
    fn host(&self) -> Option<&[u8]> {
        Some(self.as_ref())
    }
    fn device(&self) -> Option<DeviceMem> {
        None
    }
}

impl Source for DeviceMem {
    fn len(&self) -> usize {
        DeviceMem::len(self)
    }
    fn host(&self) -> Option<&[u8]> {
        None
    }
    fn device(&self) -> Option<DeviceMem> {
        Some(*self)
    }
}

/// Buffered put batches of at least this many payload bytes (and two blocks) write on two
/// threads, each streaming half of the batch through its own ring, so that two cores copy into
/// the page cache. `O_DIRECT` batches stream on one thread, all their writes through one ring:
/// on this project's 2-vCPU machines that was 1.1-1.5x the two threads at 8 MiB, where
/// buffered two threads were 1.2-1.5x one (docs/benchmarks.md#puts).
pub(crate) const PARALLEL_PUT_MIN_BYTES: usize = 8 << 20;

/// The write of a planned file: the header (and padding) and the payload in one vectored
/// write, from the bounce buffer or the header page when `O_DIRECT`, or the payload alone from
/// GPU memory (its header is written after, see `Inner::seal`).
fn write_request<'p>(p: &'p WritePlan<'_>, data: &'p PutBytes<'_>) -> IoRequest<'p> {
    match (&p.bounce, data.host_parts(), data.device()) {
        (Some(b), _, _) => IoRequest::write(p.fd.as_fd(), 0, vec![IoSlice::new(b)]),
        (None, Some(parts), _) if p.head_page.is_some() => {
            let head = p.head_page.as_deref().expect("checked");
            let slices = std::iter::once(head).chain(parts.iter().copied());
            IoRequest::write(p.fd.as_fd(), 0, slices.map(IoSlice::new).collect())
        }
        (None, Some(parts), _) => {
            let head = [&p.header[..], &PADDING[..]];
            let slices = head.into_iter().chain(parts.iter().copied());
            IoRequest::write(p.fd.as_fd(), 0, slices.map(IoSlice::new).collect())
        }
        (None, None, Some(mem)) => IoRequest::write_device(p.fd.as_fd(), PAYLOAD_OFFSET, mem),
        (None, None, None) => unreachable!("a payload is in host or device memory"),
    }
}

/// What steps 3 to 5 of a put batch made of one item: its slot, its offer, and its written
/// temp file with the bytes it takes on disk, or the error.
type FileOutcome<'s> = (usize, Offer, Result<(WritePlan<'s>, u64)>);

/// What step 2 of a put batch decided for its valid items, in their order.
struct Admitted<'s> {
    /// Each item's hash and the room it takes (estimated).
    offered: Vec<(BlockHash, u64)>,
    /// The index's answer for each.
    offers: Vec<Offer>,
    /// The evicted files taken for the reserved items, in their order (reusing only).
    spares: Vec<Option<Spare<'s>>>,
}

/// A file of a put batch written (steps 3 to 5), to be published: its slot, its offer, its
/// plan, and the bytes it takes on disk.
type Written<'s> = (usize, Offer, WritePlan<'s>, u64);

/// The results of a batch's slots, each set by one of its steps.
fn every_result(results: Vec<Option<Result<Stored>>>) -> Vec<Result<Stored>> {
    results
        .into_iter()
        .map(|r| r.expect("every item has a result"))
        .collect()
}

/// A put's payload as the batch's threads share it: host bytes (in one buffer or several)
/// or GPU memory.
#[derive(Clone, Copy)]
pub(super) enum PutBytes<'a> {
    Host(&'a [u8]),
    Vectored(&'a [&'a [u8]]),
    Device(DeviceMem),
}

impl<'a> PutBytes<'a> {
    fn of<D: Source>(d: &'a D) -> PutBytes<'a> {
        match (d.parts(), d.host(), d.device()) {
            (Some(p), _, _) => PutBytes::Vectored(p),
            (None, Some(h), _) => PutBytes::Host(h),
            (None, None, Some(m)) => PutBytes::Device(m),
            (None, None, None) => unreachable!("a payload is in host or device memory"),
        }
    }

    /// The host bytes, in order, as one buffer or several; `None` for GPU memory.
    fn host_parts(&self) -> Option<&[&'a [u8]]> {
        match self {
            PutBytes::Host(h) => Some(std::slice::from_ref(h)),
            PutBytes::Vectored(p) => Some(p),
            PutBytes::Device(_) => None,
        }
    }
}

impl Source for PutBytes<'_> {
    fn len(&self) -> usize {
        match self {
            PutBytes::Host(h) => h.len(),
            PutBytes::Vectored(p) => p.iter().map(|b| b.len()).sum(),
            PutBytes::Device(m) => m.len(),
        }
    }
    fn host(&self) -> Option<&[u8]> {
        match self {
            PutBytes::Host(h) => Some(h),
            PutBytes::Vectored(_) | PutBytes::Device(_) => None,
        }
    }
    fn device(&self) -> Option<DeviceMem> {
        match self {
            PutBytes::Host(_) | PutBytes::Vectored(_) => None,
            PutBytes::Device(m) => Some(*m),
        }
    }
    fn parts(&self) -> Option<&[&[u8]]> {
        match self {
            PutBytes::Vectored(p) => Some(p),
            PutBytes::Host(_) | PutBytes::Device(_) => None,
        }
    }
}

/// The bytes a block file of `len` payload bytes takes on a 4 KiB-block filesystem; used to
/// make room before writing (the exact `st_blocks` is accounted after).
pub(crate) fn disk_estimate(len: usize) -> u64 {
    align_up(PAYLOAD_OFFSET as usize + len) as u64
}

impl Inner {
    /// Writes and publishes the items at `which`; one result per entry of `which`. With
    /// `replace`, present blocks are rewritten (`put_many`); without, they are only touched
    /// (`offer_many`).
    pub(super) fn put_batch<D: Source>(
        &self,
        items: &[(BlockKey, D)],
        which: &[usize],
        replace: bool,
        after: Option<BlockHash>,
    ) -> Vec<Result<Stored>> {
        let mut results: Vec<Option<Result<Stored>>> = (0..which.len()).map(|_| None).collect();
        // 1. Validate everything before anything is written.
        let valid = self.validate_batch(items, which, &mut results);
        // 2. The index decides: touch, admission, room under the capacity, reservation.
        let Admitted {
            offered,
            mut offers,
            spares,
        } = self.admit_batch(items, which, &valid, replace, after);
        // Shared: room under the tree's one capacity, reserved in its ledger.
        let reserved = match &self.shared {
            Some(sh) => match self.reserve_shared(sh, &offered, &mut offers, after) {
                Ok(r) => r,
                Err(e) => {
                    self.refuse_unreserved(sh, &e, &valid, &offers, &offered, &mut results);
                    return every_result(results);
                }
            },
            None => (0, 0),
        };
        // 3-5. Temp files and their writes streamed through the engine, sizes and syncs.
        let written = self.write_batch(items, which, valid, offers, spares, &mut results);
        // 6. Publish.
        self.publish_batch(written, reserved, &mut results);
        every_result(results)
    }

    /// Step 1 of a put batch: the slots (in `which`) of the items whose key and length are
    /// valid; the others' errors go to `results`.
    fn validate_batch<D: Source>(
        &self,
        items: &[(BlockKey, D)],
        which: &[usize],
        results: &mut [Option<Result<Stored>>],
    ) -> Vec<usize> {
        let mut valid: Vec<usize> = Vec::with_capacity(which.len());
        for (slot, &i) in which.iter().enumerate() {
            let (key, data) = (&items[i].0, &items[i].1);
            if let Err(e) = self.check_key(key) {
                results[slot] = Some(Err(e));
            } else if data.len() > self.opts.max_block {
                results[slot] = Some(Err(Error::TooLarge {
                    key: key.to_string(),
                    len: data.len(),
                    max: self.opts.max_block,
                }));
            } else {
                valid.push(slot);
            }
        }
        valid
    }

    /// Step 2 of a put batch: the index's offer of the `valid` slots (touch, admission, room
    /// under the capacity, reservation), and its victims unlinked or, reusing, taken as the
    /// new blocks' files.
    fn admit_batch<D: Source>(
        &self,
        items: &[(BlockKey, D)],
        which: &[usize],
        valid: &[usize],
        replace: bool,
        after: Option<BlockHash>,
    ) -> Admitted<'_> {
        let offered: Vec<(BlockHash, u64)> = valid
            .iter()
            .map(|&slot| {
                let (key, data) = (&items[which[slot]].0, &items[which[slot]].1);
                (key.hash, disk_estimate(data.len()))
            })
            .collect();
        let (mut offers, victims) = self.index.offer(&offered, replace, after);
        // Exclusive mode: the victims' files become the new blocks' files where they can.
        let (mut spares, stuck): (Vec<Option<Spare<'_>>>, bool) =
            if self.publish.reuse.load(Ordering::Relaxed) {
                let targets: Vec<(&BlockKey, u64)> = valid
                    .iter()
                    .zip(&offers)
                    .zip(&offered)
                    .filter(|((_, o), _)| matches!(o, Offer::Reserved | Offer::Replace { .. }))
                    .map(|((&slot, _), &(_, room))| (&items[which[slot]].0, room))
                    .collect();
                self.reuse_victims(victims, &targets)
            } else {
                (Vec::new(), self.unlink_victims(victims))
            };
        // Victims whose files could not be unlinked still take room. (Only then: other puts'
        // victims not unlinked yet count too, and those puts unlink them before they create
        // a file, so the tree stays under the bound while `over_bound` may say otherwise.)
        if stuck {
            self.shed_over_bound(&offered, &mut offers, &mut spares);
        }
        Admitted {
            offered,
            offers,
            spares,
        }
    }

    /// Shared mode, the ledger's reservation failed with `e`: the reserved offers of the
    /// `valid` slots are aborted and fail with it; the others (touched, not admitted) succeed.
    fn refuse_unreserved(
        &self,
        sh: &super::shared::SharedTier,
        e: &Error,
        valid: &[usize],
        offers: &[Offer],
        offered: &[(BlockHash, u64)],
        results: &mut [Option<Result<Stored>>],
    ) {
        let msg = e.to_string();
        for (slot, (offer, (hash, _))) in valid.iter().zip(offers.iter().zip(offered)) {
            if matches!(offer, Offer::Reserved | Offer::Replace { .. }) {
                self.index.abort(hash, *offer);
                results[*slot] = Some(Err(Error::Io {
                    path: sh.ledger_path().to_path_buf(),
                    source: std::io::Error::other(msg.clone()),
                }));
            } else {
                results[*slot] = Some(Ok(Stored::of_offer(*offer)));
            }
        }
    }

    /// Steps 3 to 5 of a put batch: temp files and their writes streamed through the engine,
    /// sizes and syncs, for the `valid` slots the index reserved room for (`offers`); on two
    /// threads for large buffered batches, each streaming half of the batch. Touched and
    /// failed slots get their results; the files written are returned.
    fn write_batch<'s, D: Source>(
        &'s self,
        items: &[(BlockKey, D)],
        which: &[usize],
        valid: Vec<usize>,
        offers: Vec<Offer>,
        mut spares: Vec<Option<Spare<'s>>>,
        results: &mut [Option<Result<Stored>>],
    ) -> Vec<Written<'s>> {
        let mut todo: Vec<(usize, Offer)> = Vec::with_capacity(valid.len());
        for (slot, offer) in valid.into_iter().zip(offers) {
            match offer {
                Offer::Touched | Offer::NotAdmitted => {
                    results[slot] = Some(Ok(Stored::of_offer(offer)));
                }
                Offer::Reserved | Offer::Replace { .. } => todo.push((slot, offer)),
            }
        }
        let payloads: Vec<(&BlockKey, PutBytes<'_>)> = which
            .iter()
            .map(|&i| (&items[i].0, PutBytes::of(&items[i].1)))
            .collect();
        let bytes: usize = todo.iter().map(|(slot, _)| payloads[*slot].1.len()).sum();
        spares.resize_with(todo.len(), || None);
        let direct = todo
            .iter()
            .all(|(slot, _)| self.put_direct(&payloads[*slot].1));
        let outcomes = if todo.len() >= 2 && bytes >= PARALLEL_PUT_MIN_BYTES && !direct {
            let (a, b) = todo.split_at(todo.len() / 2);
            let (sa, sb) = spares.split_at_mut(todo.len() / 2);
            std::thread::scope(|scope| {
                let other = scope.spawn(|| self.write_files(&payloads, b, sb));
                let mut first = self.write_files(&payloads, a, sa);
                match other.join() {
                    Ok(second) => first.extend(second),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
                first
            })
        } else {
            self.write_files(&payloads, &todo, &mut spares)
        };
        // Every planned put takes its spare; one left (none is) would be an evicted file
        // under a temp name: removed.
        for s in spares.into_iter().flatten() {
            let _ = self.ns.unlink_in(&s.parent, &s.name, None);
        }
        let mut written: Vec<Written<'s>> = Vec::with_capacity(todo.len());
        for (slot, offer, outcome) in outcomes {
            match outcome {
                Ok((plan, bytes)) => written.push((slot, offer, plan, bytes)),
                Err(e) => results[slot] = Some(Err(e)),
            }
        }
        written
    }

    /// Step 6 of a put batch: publishes the `written` files under the keys' stripe locks and
    /// commits them in the index (their results go to `results`), unlinks the victims of the
    /// commits, and settles the ledger's `reserved` (bytes, files) against what was published.
    fn publish_batch(
        &self,
        written: Vec<Written<'_>>,
        reserved: (u64, u64),
        results: &mut [Option<Result<Stored>>],
    ) {
        let mut published = (0u64, 0u64);
        // The journal's lock first (as everywhere): held while the files are published.
        let mut journal = self.journal_lock();
        // Under the keys' stripe locks, so that an eviction or removal of the same key cannot
        // interleave between a file's publication and its commit in the index.
        let mut stripes: Vec<usize> = written
            .iter()
            .map(|(_, _, p, _)| self.stripe_of(&p.hash))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let guards: Vec<_> = stripes.iter().map(|&s| self.lock_stripe(s)).collect();
        let mut over_victims = Vec::new();
        let mut synced: Vec<&str> = Vec::new();
        for (slot, offer, plan, bytes) in &written {
            let (slot, offer, bytes) = (*slot, *offer, *bytes);
            match self.publish_file(plan) {
                Ok(Published::Theirs) => {
                    // Another store published this block first: theirs stays (and is theirs
                    // in the ledger); ours is gone.
                    Counters::add(&self.counters.published_by_others, 1);
                    over_victims.extend(self.index.commit(&plan.hash, bytes, offer));
                    results[slot] = Some(Ok(Stored::Present));
                }
                Ok(Published::Ours) => {
                    published.0 += bytes;
                    published.1 += 1;
                    if let Some(neg) = &self.tree {
                        neg.present(&plan.hash);
                    }
                    // The replaced file (if any) is unlinked: drop its cached descriptor.
                    self.fds.invalidate(&plan.hash);
                    over_victims.extend(self.index.commit(&plan.hash, bytes, offer));
                    Counters::add(&self.counters.puts, 1);
                    if plan.reused.is_some() {
                        Counters::add(&self.counters.reused_files, 1);
                    }
                    Counters::add(&self.counters.bytes_written, plan.len as u64);
                    if let Some(j) = &mut journal {
                        j.record(EventKind::Stored, EventCause::Put, plan.hash);
                    }
                    if self.opts.sync_writes && !synced.contains(&plan.rel.dir()) {
                        synced.push(plan.rel.dir());
                        self.sync_dir(plan);
                    }
                    results[slot] = Some(Ok(Stored::Written));
                }
                Err(e) => {
                    self.discard(plan);
                    self.index.abort(&plan.hash, offer);
                    let path = self.path(plan.rel.as_str());
                    results[slot] = Some(Err(Error::from_io(path, io_err(e))));
                }
            }
        }
        // The descriptors close before the stripe locks open: once a block can be evicted,
        // no descriptor of ours keeps its file (and its space) alive after the unlink.
        drop(synced);
        drop(written);
        drop(guards);
        // Appended now, before the victims' unlinking takes the lock again.
        drop(journal);
        self.unlink_victims(over_victims);
        if let Some(sh) = &self.shared {
            // What was reserved, against what this store published.
            sh.adjust(
                published.0 as i64 - reserved.0 as i64,
                published.1 as i64 - reserved.1 as i64,
            );
            if sh.owes() {
                if let Err(e) = sh.flush() {
                    tracing::warn!(error = %e, "could not write the usage ledger");
                }
            }
        }
    }

    /// Steps 3 to 5 of a put batch for the admitted `todo` (slot in `payloads`, offer): streams
    /// the writes through the engine (each temp file created as the engine pulls its write),
    /// then sizes and syncs each. A failure unlinks its temp file and drops its reservation;
    /// each outcome is returned with its slot and offer, in `todo`'s order. `spares[i]`, if
    /// any, is the evicted file `todo[i]` is written into instead of a new one.
    fn write_files<'s>(
        &'s self,
        payloads: &[(&BlockKey, PutBytes<'_>)],
        todo: &[(usize, Offer)],
        spares: &mut [Option<Spare<'s>>],
    ) -> Vec<FileOutcome<'s>> {
        // Each temp file is created (and its header hashed) when the engine pulls its write,
        // so the files after the first are made while the writes before them are in flight.
        // The cells keep each plan in place for the requests that borrow it.
        let plans: Vec<OnceCell<Result<WritePlan<'s>>>> =
            todo.iter().map(|_| OnceCell::new()).collect();
        let io_results = {
            let mut stream = todo.iter().zip(&plans).zip(spares.iter_mut()).filter_map(
                |((&(slot, _), cell), spare)| {
                    let (key, data) = &payloads[slot];
                    let plan = cell.get_or_init(|| self.plan_write(key, data, spare.take()));
                    plan.as_ref().ok().map(|p| write_request(p, data))
                },
            );
            crate::engine::submit_stream_checked(self.engine.as_ref(), &mut stream)
        };
        let mut io_results = io_results.into_iter();
        let mut out = Vec::with_capacity(todo.len());
        for (&(slot, offer), cell) in todo.iter().zip(plans) {
            let plan = match cell.into_inner() {
                Some(Ok(plan)) => plan,
                Some(Err(e)) => {
                    self.index.abort(&payloads[slot].0.hash, offer);
                    out.push((slot, offer, Err(e)));
                    continue;
                }
                None => unreachable!("submit_stream_checked pulls every request"),
            };
            let io = io_results
                .next()
                .unwrap_or_else(|| Err(std::io::Error::other("the engine returned no result")));
            let io = if plan.device {
                io.and_then(|n| self.seal(&plan, n))
            } else {
                io
            };
            match self.finish_write(&plan, io) {
                Ok(bytes) => out.push((slot, offer, Ok((plan, bytes)))),
                Err(e) => {
                    self.discard(&plan);
                    self.index.abort(&plan.hash, offer);
                    out.push((slot, offer, Err(e)));
                }
            }
        }
        out
    }

    /// Completes a file whose payload the engine wrote from GPU memory (`n` bytes): reads the
    /// payload back, and writes the header with its checksum and the zero padding. Returns
    /// the bytes of the whole file, as a host write would have.
    fn seal(&self, plan: &WritePlan, n: usize) -> std::io::Result<usize> {
        if n != plan.len {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
        }
        // Aligned buffers and lengths, so that O_DIRECT descriptors work too.
        let mut payload = self.bufs.take(plan.len);
        let got = self.engine_one(IoRequest::read(
            plan.fd.as_fd(),
            PAYLOAD_OFFSET,
            vec![IoSliceMut::new(&mut payload)],
        ))?;
        if got != plan.len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        let header = Header::for_payload(plan.hash, &payload[..plan.len], self.boot).encode();
        let mut head = self.bufs.take(PAYLOAD_OFFSET as usize);
        head[..HEADER_LEN].copy_from_slice(&header);
        head[HEADER_LEN..PAYLOAD_OFFSET as usize].fill(0);
        self.engine_one(IoRequest::write(
            plan.fd.as_fd(),
            0,
            vec![IoSlice::new(&head)],
        ))?;
        Ok(PAYLOAD_OFFSET as usize + plan.len)
    }

    /// Checks a write's outcome, gives the file its exact length, syncs it if configured, and
    /// returns the bytes it takes on disk.
    fn finish_write(&self, plan: &WritePlan, io: std::io::Result<usize>) -> Result<u64> {
        let temp_path = || self.temp_path(plan);
        let n = io.map_err(|e| Error::from_io(temp_path(), e))?;
        let total = PAYLOAD_OFFSET as usize + plan.len;
        let expect = if plan.bounce.is_some() {
            align_up(total)
        } else {
            total
        };
        if n != expect {
            let short = std::io::Error::from(std::io::ErrorKind::WriteZero);
            return Err(Error::from_io(temp_path(), short));
        }
        // A reused file longer than this block is cut to its length.
        if plan.bounce.is_some() || plan.reused.is_some_and(|(old, _)| old > total as u64) {
            rustix::fs::ftruncate(&plan.fd, total as u64)
                .map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
        }
        if let Some((_, leased)) = plan.reused {
            // An open that got through the lease (the kernel's lease-break time passed while
            // the put wrote) holds the file: it may have read a mix of both blocks, or may
            // write. The put fails and the file is discarded, never published.
            let kept = self
                .ns
                .lease_kept(plan.fd.as_fd(), leased)
                .map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
            if !kept {
                let broken = std::io::Error::other(
                    "the write lease on a reused file was broken during the put: another process opened it",
                );
                return Err(Error::from_io(temp_path(), broken));
            }
            // The new block's bytes are in: an open that raced the reuse may go on (it sees
            // the new header, not its block's, and misses).
            self.ns
                .release_lease(plan.fd.as_fd())
                .map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
        }
        if self.opts.sync_writes {
            // Counted by the call's own success: a put that did not sync cannot count one.
            rustix::fs::fdatasync(&plan.fd)
                .map(|()| Counters::add(&self.counters.syncs, 1))
                .map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
        }
        let st = rustix::fs::fstat(&plan.fd).map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
        Ok(st.st_blocks as u64 * 512)
    }

    /// Errors name the temp file, or for an anonymous inode the block it was to become.
    fn temp_path(&self, plan: &WritePlan<'_>) -> std::path::PathBuf {
        if plan.anonymous {
            self.path(plan.rel.as_str())
        } else {
            self.path(&join(plan.rel.dir(), &plan.temp_name))
        }
    }

    /// Removes what a failed put created: a named temp file is unlinked; an anonymous inode
    /// vanishes when its descriptor closes.
    fn discard(&self, plan: &WritePlan<'_>) {
        if plan.anonymous {
            return;
        }
        match self.ns.unlink_in(&plan.parent, &plan.temp_name, None) {
            Ok(_) => {}
            Err(e) => tracing::warn!(
                path = %self.temp_path(plan).display(),
                error = %e,
                "could not unlink temp file after a failed put"
            ),
        }
    }

    /// `O_DIRECT` if the store's block I/O is direct, else no flag.
    pub(super) fn direct_flag(&self) -> OFlags {
        if self.opts.direct {
            OFlags::DIRECT
        } else {
            OFlags::empty()
        }
    }

    /// Whether a put of `data` writes with `O_DIRECT`: every put with
    /// [`StoreConfig::direct_io`](crate::StoreConfig), and host payloads of at least
    /// [`StoreConfig::direct_puts_from`](crate::StoreConfig) bytes while the filesystem takes
    /// it.
    pub(super) fn put_direct(&self, data: &PutBytes<'_>) -> bool {
        self.opts.direct
            || (data.host_parts().is_some()
                && self.opts.direct_puts_from.is_some_and(|m| data.len() >= m)
                && self.publish.direct_puts.load(Ordering::Relaxed))
    }

    /// The filesystem refused `O_DIRECT` for a put that chose it alone: puts are buffered from
    /// now on.
    fn refuse_direct_puts(&self, path: &std::path::Path) {
        if self.publish.direct_puts.swap(false, Ordering::Relaxed) {
            tracing::info!(path = %path.display(),
                "the filesystem refuses O_DIRECT: puts are buffered");
        }
    }

    /// Creates the temp file of one validated, admitted put, or takes `spare`'s.
    fn plan_write<'s>(
        &'s self,
        key: &BlockKey,
        data: &PutBytes<'_>,
        spare: Option<Spare<'s>>,
    ) -> Result<WritePlan<'s>> {
        // From GPU memory, the header is written once the payload is in the file.
        let header = match data.host_parts() {
            Some(parts) => Header::for_parts(key.hash, parts, self.boot).encode(),
            None => [0; HEADER_LEN],
        };
        let rel = self.layout.rel_path(&key.hash);

        let mut direct = if self.put_direct(data) {
            OFlags::DIRECT
        } else {
            OFlags::empty()
        };
        let reused = spare.as_ref().map(|s| (s.len, s.leased));
        // A name that exists already (planted, or left by a crash): another sequence number.
        let mut tries = 0;
        let (temp_name, (parent, fd, anonymous)) = if let Some(s) = spare {
            // Taken with the store's flags: without O_DIRECT unless the store is direct.
            if !direct.is_empty() && !self.opts.direct && !add_direct(&s.fd) {
                self.refuse_direct_puts(&self.path(rel.as_str()));
                direct = OFlags::empty();
            }
            (s.name, (s.parent, s.fd, false))
        } else {
            loop {
                let name = self.ns.temp_name(rel.file_name());
                match self.create_temp(&rel, &name, &mut direct) {
                    Err(Error::Io { source, .. })
                        if source.raw_os_error() == Some(Errno::EXIST.raw_os_error())
                            && tries < 16 =>
                    {
                        tries += 1;
                    }
                    r => break (name, r?),
                }
            }
        };
        // O_DIRECT from a payload whose address and length are page-aligned (an engine's KV
        // pool): only the header page is the store's; else the whole file is copied into an
        // aligned bounce buffer.
        let aligned = |parts: &[&[u8]]| {
            parts.iter().all(|d| {
                d.as_ptr() as usize % crate::buf::DIRECT_ALIGN == 0
                    && d.len() % crate::buf::DIRECT_ALIGN == 0
            })
        };
        let head_page = data
            .host_parts()
            .filter(|parts| !direct.is_empty() && aligned(parts))
            .map(|_| {
                let mut b = self.bufs.take(PAYLOAD_OFFSET as usize);
                b[..HEADER_LEN].copy_from_slice(&header);
                b[HEADER_LEN..].fill(0);
                b
            });
        let bounce = data
            .host_parts()
            .filter(|_| !direct.is_empty() && head_page.is_none())
            .map(|parts| {
                let total = PAYLOAD_OFFSET as usize + data.len();
                let mut b = self.bufs.take(total);
                b[..HEADER_LEN].copy_from_slice(&header);
                // A reused buffer holds old bytes: the padding must be zero.
                b[HEADER_LEN..PAYLOAD_OFFSET as usize].fill(0);
                let mut at = PAYLOAD_OFFSET as usize;
                for part in parts {
                    b[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
                b
            });
        let device = data.device().is_some();
        Ok(WritePlan {
            rel,
            parent,
            temp_name,
            anonymous,
            fd,
            header,
            bounce,
            head_page,
            hash: key.hash,
            len: data.len(),
            device,
            reused,
        })
    }

    /// Creates the file a put writes in the directory of `rel` (missing shard directories
    /// made: an error there keeps its errno, so ENOSPC is [`Error::NoSpace`]) through the
    /// namespace layer's [`Publisher`](crate::ns::Publisher). `direct` (`O_DIRECT` or
    /// nothing) is cleared where the filesystem refuses `O_DIRECT` for a put that chose it
    /// by its size alone.
    fn create_temp(
        &self,
        rel: &RelPath,
        temp_name: &str,
        direct: &mut OFlags,
    ) -> Result<(Parent<'_>, OwnedFd, bool)> {
        let by_size = !direct.is_empty() && !self.opts.direct;
        let dir = rel.dir();
        let dir_err =
            |e: Errno| Error::from_io(self.path(if dir.is_empty() { "." } else { dir }), io_err(e));
        let parent = self.block_dir(dir).map_err(dir_err)?;
        let created = self.publish.files.create(
            &self.ns,
            &parent,
            temp_name,
            direct,
            by_size,
            CreateHooks {
                retry: &|op| self.retry_emfile(op),
                direct_refused: &|| self.refuse_direct_puts(&self.path(rel.as_str())),
            },
        );
        match created {
            Ok(Created { fd, anonymous }) => Ok((parent, fd, anonymous)),
            Err(CreateError { errno, named }) => {
                let path = if named {
                    self.path(&join(dir, temp_name))
                } else {
                    self.path(rel.as_str())
                };
                Err(Error::from_io(path, io_err(errno)))
            }
        }
    }

    /// The block directory `dir` opened, its missing levels created first (retrying on
    /// EMFILE): where a put's file is made or an evicted file is moved.
    pub(super) fn block_dir(&self, dir: &str) -> rustix::io::Result<Parent<'_>> {
        match self.retry_emfile(|| self.ns.parent(dir)) {
            Err(Errno::NOENT) => {
                self.ns.make_dirs(dir)?;
                self.retry_emfile(|| self.ns.parent(dir))
            }
            r => r,
        }
    }

    /// Publishes a fully written temp file under its final name through the namespace
    /// layer's [`Publisher`](crate::ns::Publisher): atomically replacing any existing block;
    /// in shared mode never replacing one (another store's block under the name stays, and
    /// this file goes: [`Published::Theirs`]).
    fn publish_file(&self, plan: &WritePlan<'_>) -> rustix::io::Result<Published> {
        let temp = TempFile {
            parent: &plan.parent,
            name: &plan.temp_name,
            fd: &plan.fd,
            anonymous: plan.anonymous,
        };
        let noreplace = self.shared.is_some();
        self.publish
            .files
            .publish(&self.ns, &temp, plan.rel.file_name(), noreplace, &|| {
                self.discard(plan)
            })
    }

    fn sync_dir(&self, plan: &WritePlan<'_>) {
        if let Err(e) =
            rustix::fs::fsync(&plan.parent).map(|()| Counters::add(&self.counters.dir_syncs, 1))
        {
            tracing::warn!(dir = %self.path(plan.rel.dir()).display(), error = %e, "fsync of directory failed");
        }
    }
}
