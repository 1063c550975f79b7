//! The put path: validation, admission, room, temp files, one engine batch, publication.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::{Counters, FILE_MODE, Inner, io_err};
use crate::buf::{DeviceMem, PooledBuf, align_up};
use crate::engine::IoRequest;
use crate::error::{Error, Result};
use crate::format::{HEADER_LEN, Header, PADDING, PAYLOAD_OFFSET};
use crate::index::Offer;
use crate::key::{BlockHash, BlockKey};
use crate::layout::{RelPath, TEMP_PREFIX};
use crate::ns::{Parent, join};

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
}

/// What a put writes: host bytes, or GPU memory.
pub(super) trait Source {
    /// Payload bytes.
    fn len(&self) -> usize;
    /// The bytes, when they are in host memory.
    fn host(&self) -> Option<&[u8]>;
    /// The memory, when it is on a GPU.
    fn device(&self) -> Option<DeviceMem>;
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

/// Put batches of at least this many payload bytes (and two blocks) write on two threads: one
/// half's temp files are created and its headers hashed while the other half's writes are in
/// flight (docs/benchmarks.md#puts).
pub(crate) const PARALLEL_PUT_MIN_BYTES: usize = 8 << 20;

/// What steps 3 to 5 of a put batch made of one item: its slot, its offer, and its written
/// temp file with the bytes it takes on disk, or the error.
type FileOutcome<'s> = (usize, Offer, Result<(WritePlan<'s>, u64)>);

/// A put's payload as the batch's threads share it: host bytes or GPU memory.
#[derive(Clone, Copy)]
pub(super) enum Payload<'a> {
    Host(&'a [u8]),
    Device(DeviceMem),
}

impl<'a> Payload<'a> {
    fn of<D: Source>(d: &'a D) -> Payload<'a> {
        match (d.host(), d.device()) {
            (Some(h), _) => Payload::Host(h),
            (None, Some(m)) => Payload::Device(m),
            (None, None) => unreachable!("a payload is in host or device memory"),
        }
    }
}

impl Source for Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Host(h) => h.len(),
            Payload::Device(m) => m.len(),
        }
    }
    fn host(&self) -> Option<&[u8]> {
        match self {
            Payload::Host(h) => Some(h),
            Payload::Device(_) => None,
        }
    }
    fn device(&self) -> Option<DeviceMem> {
        match self {
            Payload::Host(_) => None,
            Payload::Device(m) => Some(*m),
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
    ) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = (0..which.len()).map(|_| None).collect();
        // 1. Validate everything before anything is written.
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
        // 2. The index decides: touch, admission, room under the capacity, reservation.
        let offered: Vec<(BlockHash, u64)> = valid
            .iter()
            .map(|&slot| {
                let (key, data) = (&items[which[slot]].0, &items[which[slot]].1);
                (key.hash, disk_estimate(data.len()))
            })
            .collect();
        let (offers, victims) = self.index.offer(&offered, replace, after);
        self.unlink_victims(victims);

        // 3-5. Temp files, one engine batch of writes, sizes and syncs: on two threads for
        //      large batches, so that one half's file creation (and hashing) runs while the
        //      other half's writes are in flight.
        let mut todo: Vec<(usize, Offer)> = Vec::with_capacity(valid.len());
        for (slot, offer) in valid.into_iter().zip(offers) {
            match offer {
                Offer::Touched | Offer::NotAdmitted => results[slot] = Some(Ok(())),
                Offer::Reserved | Offer::Replace { .. } => todo.push((slot, offer)),
            }
        }
        let payloads: Vec<(&BlockKey, Payload<'_>)> = which
            .iter()
            .map(|&i| (&items[i].0, Payload::of(&items[i].1)))
            .collect();
        let bytes: usize = todo.iter().map(|(slot, _)| payloads[*slot].1.len()).sum();
        let outcomes = if todo.len() >= 2 && bytes >= PARALLEL_PUT_MIN_BYTES {
            let (a, b) = todo.split_at(todo.len() / 2);
            std::thread::scope(|scope| {
                let other = scope.spawn(|| self.write_files(&payloads, b));
                let mut first = self.write_files(&payloads, a);
                match other.join() {
                    Ok(second) => first.extend(second),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
                first
            })
        } else {
            self.write_files(&payloads, &todo)
        };
        let mut written: Vec<(usize, Offer, WritePlan, u64)> = Vec::with_capacity(todo.len());
        for (slot, offer, outcome) in outcomes {
            match outcome {
                Ok((plan, bytes)) => written.push((slot, offer, plan, bytes)),
                Err(e) => results[slot] = Some(Err(e)),
            }
        }

        // 6. Publish under the keys' stripe locks, so that an eviction or removal of the same
        //    key cannot interleave between a file's publication and its commit in the index.
        let mut stripes: Vec<usize> = written
            .iter()
            .map(|(_, _, p, _)| self.stripe_of(&p.hash))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let guards: Vec<_> = stripes.iter().map(|&s| self.lock_stripe(s)).collect();
        let mut over_victims = Vec::new();
        let mut synced: Vec<&str> = Vec::new();
        for (slot, offer, plan, bytes) in written.iter() {
            let (slot, offer, bytes) = (*slot, *offer, *bytes);
            match self.publish_file(plan) {
                Ok(()) => {
                    // The replaced file (if any) is unlinked: drop its cached descriptor.
                    self.fds.invalidate(&plan.hash);
                    over_victims.extend(self.index.commit(&plan.hash, bytes, offer));
                    Counters::add(&self.counters.puts, 1);
                    Counters::add(&self.counters.bytes_written, plan.len as u64);
                    if self.opts.sync_writes && !synced.contains(&plan.rel.dir()) {
                        synced.push(plan.rel.dir());
                        self.sync_dir(plan);
                    }
                    results[slot] = Some(Ok(()));
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
        self.unlink_victims(over_victims);
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }

    /// Steps 3 to 5 of a put batch for the admitted `todo` (slot in `payloads`, offer): creates
    /// each temp file, writes them all in one engine batch, then sizes and syncs each. A
    /// failure unlinks its temp file and drops its reservation; each outcome is returned with
    /// its slot and offer, in `todo`'s order.
    fn write_files<'s>(
        &'s self,
        payloads: &[(&BlockKey, Payload<'_>)],
        todo: &[(usize, Offer)],
    ) -> Vec<FileOutcome<'s>> {
        let mut out = Vec::with_capacity(todo.len());
        let mut plans: Vec<(usize, Offer, WritePlan)> = Vec::with_capacity(todo.len());
        for &(slot, offer) in todo {
            let (key, data) = &payloads[slot];
            match self.plan_write(key, data) {
                Ok(p) => plans.push((slot, offer, p)),
                Err(e) => {
                    self.index.abort(&key.hash, offer);
                    out.push((slot, offer, Err(e)));
                }
            }
        }
        let io_results = {
            let mut reqs = Vec::with_capacity(plans.len());
            for (slot, _, p) in &plans {
                let data = &payloads[*slot].1;
                reqs.push(match (&p.bounce, data.host(), data.device()) {
                    (Some(b), _, _) => IoRequest::write(p.fd.as_fd(), 0, vec![IoSlice::new(b)]),
                    (None, Some(data), _) if p.head_page.is_some() => IoRequest::write(
                        p.fd.as_fd(),
                        0,
                        vec![
                            IoSlice::new(p.head_page.as_deref().expect("checked")),
                            IoSlice::new(data),
                        ],
                    ),
                    (None, Some(data), _) => IoRequest::write(
                        p.fd.as_fd(),
                        0,
                        vec![
                            IoSlice::new(&p.header),
                            IoSlice::new(&PADDING),
                            IoSlice::new(data),
                        ],
                    ),
                    (None, None, Some(mem)) => {
                        IoRequest::write_device(p.fd.as_fd(), PAYLOAD_OFFSET, mem)
                    }
                    (None, None, None) => unreachable!("a payload is in host or device memory"),
                });
            }
            crate::engine::submit_checked(self.engine.as_ref(), &mut reqs)
        };
        for ((slot, offer, plan), io) in plans.into_iter().zip(io_results) {
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
        if plan.bounce.is_some() {
            rustix::fs::ftruncate(&plan.fd, total as u64)
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

    /// Creates the temp file of one validated, admitted put.
    fn plan_write<D: Source>(&self, key: &BlockKey, data: &D) -> Result<WritePlan<'_>> {
        // From GPU memory, the header is written once the payload is in the file.
        let header = match data.host() {
            Some(d) => Header::for_payload(key.hash, d, self.boot).encode(),
            None => [0; HEADER_LEN],
        };
        let rel = self.layout.rel_path(&key.hash);
        let seq = self.publish.temp_seq.fetch_add(1, Ordering::Relaxed);
        let temp_name = format!(
            "{TEMP_PREFIX}{}.{}.{seq}",
            rel.file_name(),
            std::process::id()
        );
        let direct = if self.opts.direct {
            OFlags::DIRECT
        } else {
            OFlags::empty()
        };
        let mode = Mode::from_raw_mode(FILE_MODE);
        let (parent, fd, anonymous) = self.create_temp(&rel, &temp_name, direct, mode)?;
        // O_DIRECT from a payload whose address and length are page-aligned (an engine's KV
        // pool): only the header page is the store's; else the whole file is copied into an
        // aligned bounce buffer.
        let aligned = |d: &[u8]| {
            d.as_ptr() as usize % crate::buf::DIRECT_ALIGN == 0
                && d.len() % crate::buf::DIRECT_ALIGN == 0
        };
        let head_page = data
            .host()
            .filter(|d| self.opts.direct && aligned(d))
            .map(|_| {
                let mut b = self.bufs.take(PAYLOAD_OFFSET as usize);
                b[..HEADER_LEN].copy_from_slice(&header);
                b[HEADER_LEN..].fill(0);
                b
            });
        let bounce = data
            .host()
            .filter(|_| self.opts.direct && head_page.is_none())
            .map(|data| {
                let total = PAYLOAD_OFFSET as usize + data.len();
                let mut b = self.bufs.take(total);
                b[..HEADER_LEN].copy_from_slice(&header);
                // A reused buffer holds old bytes: the padding must be zero.
                b[HEADER_LEN..PAYLOAD_OFFSET as usize].fill(0);
                b[PAYLOAD_OFFSET as usize..total].copy_from_slice(data);
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
        })
    }

    /// Creates the file a put writes: an anonymous `O_TMPFILE` inode in the block's directory
    /// where the filesystem supports it (nothing is left behind by a crash, and publishing is
    /// one `linkat`), else a named temp file. Creates missing shard directories (an error
    /// there keeps its errno: ENOSPC is [`Error::NoSpace`]). Opened for reading too: a
    /// payload written from GPU memory is read back for its checksum.
    fn create_temp(
        &self,
        rel: &RelPath,
        temp_name: &str,
        direct: OFlags,
        mode: Mode,
    ) -> Result<(Parent<'_>, OwnedFd, bool)> {
        let dir = rel.dir();
        let dir_err =
            |e: Errno| Error::from_io(self.path(if dir.is_empty() { "." } else { dir }), io_err(e));
        let parent = match self.retry_emfile(|| self.ns.parent(dir)) {
            Ok(p) => p,
            Err(Errno::NOENT) => {
                self.ns.make_dirs(dir).map_err(dir_err)?;
                self.retry_emfile(|| self.ns.parent(dir)).map_err(dir_err)?
            }
            Err(e) => return Err(dir_err(e)),
        };
        loop {
            if self.publish.tmpfile.load(Ordering::Relaxed) {
                match self.retry_emfile(|| self.ns.tmpfile_in(&parent, OFlags::RDWR | direct, mode))
                {
                    Ok(fd) => return Ok((parent, fd, true)),
                    Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                        tracing::info!(
                            "the filesystem has no O_TMPFILE: puts use named temp files"
                        );
                        self.publish.tmpfile.store(false, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => return Err(Error::from_io(self.path(rel.as_str()), io_err(e))),
                }
            }
            return match self.retry_emfile(|| {
                self.ns
                    .create_in(&parent, temp_name, OFlags::RDWR | direct, mode)
            }) {
                Ok(fd) => Ok((parent, fd, false)),
                Err(e) => Err(Error::from_io(self.path(&join(dir, temp_name)), io_err(e))),
            };
        }
    }

    /// Gives an anonymous inode the name `name` in `parent`: `linkat` with `AT_EMPTY_PATH`
    /// (needs CAP_DAC_READ_SEARCH), else through `/proc/self/fd`. Fails with EEXIST if the
    /// name exists.
    fn link_anonymous(
        &self,
        fd: &OwnedFd,
        parent: &Parent<'_>,
        name: &str,
    ) -> rustix::io::Result<()> {
        if self.publish.link_empty_path.load(Ordering::Relaxed) {
            match self.ns.link_in(fd.as_fd(), parent, name, false) {
                // Without CAP_DAC_READ_SEARCH: link through /proc instead, from now on
                // (unless that fails the same way: then the directory itself is missing).
                Err(e @ (Errno::NOENT | Errno::PERM)) => {
                    let r = self.ns.link_in(fd.as_fd(), parent, name, true);
                    if !matches!(r, Err(Errno::NOENT | Errno::PERM)) {
                        self.publish.link_empty_path.store(false, Ordering::Relaxed);
                        return r;
                    }
                    return Err(e);
                }
                r => return r,
            }
        }
        self.ns.link_in(fd.as_fd(), parent, name, true)
    }

    /// Publishes a fully written temp file under its final name, atomically replacing any
    /// existing block.
    fn publish_file(&self, plan: &WritePlan<'_>) -> rustix::io::Result<()> {
        let name = plan.rel.file_name();
        if !plan.anonymous {
            return self.ns.rename_in(&plan.parent, &plan.temp_name, name);
        }
        match self.link_anonymous(&plan.fd, &plan.parent, name) {
            Err(Errno::EXIST) => {
                // Replacing a block: name the inode, then rename over the old one.
                self.link_anonymous(&plan.fd, &plan.parent, &plan.temp_name)?;
                self.ns
                    .rename_in(&plan.parent, &plan.temp_name, name)
                    .inspect_err(|_| {
                        let _ = self.ns.unlink_in(&plan.parent, &plan.temp_name, None);
                    })
            }
            r => r,
        }
    }

    fn sync_dir(&self, plan: &WritePlan<'_>) {
        if let Err(e) =
            rustix::fs::fsync(&plan.parent).map(|()| Counters::add(&self.counters.dir_syncs, 1))
        {
            tracing::warn!(dir = %self.path(plan.rel.dir()).display(), error = %e, "fsync of directory failed");
        }
    }
}
