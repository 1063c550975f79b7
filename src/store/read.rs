//! The get path: index and pins, open-file cache, one engine batch, checks.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::Errno;

use super::fdcache::OpenBlock;
use super::scatter::Scatter;
use super::{Counters, Inner, Lookup, VerifyMode, io_err};
use crate::buf::{DIRECT_ALIGN, DeviceMem, PooledBuf, align_up};
use crate::engine::IoRequest;
use crate::error::{CorruptReason, Error, Result};
use crate::format::{PAYLOAD_OFFSET, check_head};
use crate::key::{BlockHash, BlockKey};
use crate::layout::RelPath;
use crate::ns::{Inode, Opened};

pub(super) enum ReadPlan {
    Done(Result<Lookup>),
    Cached {
        block: Arc<OpenBlock>,
        bounce: Option<PooledBuf>,
    },
    Fresh(FreshRead),
}

/// A read of a file opened for it (not in the open-file cache): header and payload in one
/// read, checked when it lands.
pub(super) struct FreshRead {
    fd: OwnedFd,
    /// The file's length when it was opened.
    size: u64,
    rel: RelPath,
    head: Vec<u8>,
    tail: [u8; 1],
    bounce: Option<PooledBuf>,
    /// `O_DIRECT` into an aligned caller's buffer: the header page goes here, the payload
    /// straight into the caller's buffer (no bounce buffer, no copy).
    direct_head: Option<PooledBuf>,
    /// The payload hashed as the engine reads it, when the verify mode hashes every
    /// fresh file.
    stream: Option<crate::format::FileHasher>,
}

impl FreshRead {
    /// The read of the file's header, payload (into `buf`, or through the bounce buffer) and
    /// spare byte, feeding the stream hash if there is one.
    fn request<'a>(&'a mut self, buf: &'a mut Scatter<'_>) -> IoRequest<'a> {
        let FreshRead {
            fd,
            head,
            tail,
            bounce,
            direct_head,
            stream,
            ..
        } = self;
        let req = match (bounce, direct_head) {
            (Some(b), _) => IoRequest::read((*fd).as_fd(), 0, vec![IoSliceMut::new(b)]),
            (None, Some(h)) => {
                let mut slices = vec![IoSliceMut::new(h)];
                let n = buf.len();
                buf.push_slices(n, &mut slices);
                IoRequest::read((*fd).as_fd(), 0, slices)
            }
            (None, None) => {
                let mut slices = vec![IoSliceMut::new(head)];
                let n = buf.len();
                buf.push_slices(n, &mut slices);
                slices.push(IoSliceMut::new(tail));
                IoRequest::read((*fd).as_fd(), 0, slices)
            }
        };
        match stream {
            Some(s) => req.feeding(s),
            None => req,
        }
    }
}

impl crate::engine::Landed for crate::format::FileHasher {
    fn landed(&mut self, bytes: &[u8]) {
        self.feed(bytes);
    }
}

/// The error of every key of a batch whose keys and buffers do not pair up, if they don't.
pub(super) fn count_mismatch(
    call: &str,
    keys: &[BlockKey],
    nbufs: usize,
) -> Option<Vec<Result<Lookup>>> {
    (keys.len() != nbufs).then(|| {
        keys.iter()
            .map(|_| {
                Err(Error::Config(format!(
                    "{call} got {} keys and {nbufs} buffers",
                    keys.len()
                )))
            })
            .collect()
    })
}

/// Where a get puts a block's payload: host memory, or GPU memory that the engine fills.
pub(super) enum Dest<'a> {
    /// A caller's host buffer, or several filled in order.
    Host(Scatter<'a>),
    /// A caller's GPU buffer.
    Device(DeviceMem),
}

impl Inner {
    /// Reads a batch into host buffers; see [`Store::get_many`](super::Store::get_many).
    pub(super) fn get_batch<B: AsMut<[u8]>>(
        &self,
        keys: &[BlockKey],
        bufs: &mut [B],
    ) -> Vec<Result<Lookup>> {
        if let Some(e) = count_mismatch("get_many", keys, bufs.len()) {
            return e;
        }
        let mut dests: Vec<Dest<'_>> = bufs
            .iter_mut()
            .map(|b| Dest::Host(Scatter::One(b.as_mut())))
            .collect();
        self.read_pipeline(keys, &mut dests)
    }

    /// Reads a batch into several host buffers a block; see
    /// [`Store::get_many_vectored`](super::Store::get_many_vectored).
    pub(super) fn get_batch_vectored(
        &self,
        keys: &[BlockKey],
        bufs: &mut [&mut [&mut [u8]]],
    ) -> Vec<Result<Lookup>> {
        if let Some(e) = count_mismatch("get_many_vectored", keys, bufs.len()) {
            return e;
        }
        let mut dests: Vec<Dest<'_>> = bufs
            .iter_mut()
            .map(|parts| Dest::Host(Scatter::Many(parts.iter_mut().map(|p| &mut **p).collect())))
            .collect();
        self.read_pipeline(keys, &mut dests)
    }

    /// The one read pipeline of host and GPU gets: plan (index and pins, the open-file cache,
    /// opens and checks), one engine batch, finish (lengths, checksums, corrupt files).
    ///
    /// For a GPU destination the store never reads the payload through GPU memory: a fresh
    /// file is opened and its header checked through the host when planned, and the payload
    /// checksum verified through a host read there when the verify mode asks for it; the engine
    /// then moves only the payload. For a host destination a fresh file's header, payload and a
    /// spare byte come in one vectored read, checked when the batch finishes.
    ///
    /// A batch larger than [`batch_files`](super::config::batch_files) runs as consecutive
    /// sub-batches of that many keys, so that a batch of any size holds at most that many
    /// fresh descriptors at once, under any open-file limit.
    pub(super) fn read_pipeline(
        &self,
        keys: &[BlockKey],
        dests: &mut [Dest<'_>],
    ) -> Vec<Result<Lookup>> {
        let n = super::config::batch_files();
        let mut results = Vec::with_capacity(keys.len());
        for (k, d) in keys.chunks(n).zip(dests.chunks_mut(n)) {
            results.extend(self.read_chunk(k, d));
        }
        results
    }

    /// One sub-batch of [`Inner::read_pipeline`].
    fn read_chunk(&self, keys: &[BlockKey], dests: &mut [Dest<'_>]) -> Vec<Result<Lookup>> {
        let (present, pinned) = self.pin_batch(keys);
        let mut plans: Vec<ReadPlan> = Vec::with_capacity(keys.len());
        for ((k, p), d) in keys.iter().zip(present).zip(dests.iter()) {
            plans.push(match (p, d) {
                (Err(e), _) => ReadPlan::Done(Err(e)),
                (Ok(false), _) => ReadPlan::Done(Ok(Lookup::Miss)),
                (Ok(true), Dest::Host(b)) => self.plan_read(k, b.len(), b.aligned()),
                (Ok(true), Dest::Device(m)) => self.plan_device_read(k, m.len()),
            });
        }

        let mut owners = Vec::with_capacity(keys.len());
        let io_results = {
            let mut reqs = Vec::with_capacity(keys.len());
            for (i, (plan, dest)) in plans.iter_mut().zip(dests.iter_mut()).enumerate() {
                if let Some(req) = self.read_request(plan, dest) {
                    reqs.push(req);
                    owners.push(i);
                }
            }
            super::split::submit(
                self.engine.as_ref(),
                &mut reqs,
                self.opts.read_threads,
                &self.counters.split_reads,
            )
        };

        let mut results: Vec<Option<Result<Lookup>>> = plans
            .iter_mut()
            .map(|p| match p {
                ReadPlan::Done(r) => Some(std::mem::replace(r, Ok(Lookup::Miss))),
                _ => None,
            })
            .collect();
        for (i, io) in owners.into_iter().zip(io_results) {
            let plan = std::mem::replace(&mut plans[i], ReadPlan::Done(Ok(Lookup::Miss)));
            results[i] = Some(match &mut dests[i] {
                Dest::Host(buf) => self.finish_read(&keys[i], plan, buf, io),
                Dest::Device(_) => self.finish_device_read(&keys[i], plan, io),
            });
        }
        let results: Vec<Result<Lookup>> = results
            .into_iter()
            .map(|r| r.expect("every key has a result"))
            .collect();
        self.end_batch(keys, &results, &pinned);
        results
    }

    /// The engine's request of `plan` into `dest`, if it reads anything: for a GPU
    /// destination, only a cached file's payload (a fresh one was read when planned).
    fn read_request<'a>(
        &self,
        plan: &'a mut ReadPlan,
        dest: &'a mut Dest<'_>,
    ) -> Option<IoRequest<'a>> {
        let buf = match dest {
            Dest::Host(b) => b,
            Dest::Device(mem) => {
                let ReadPlan::Cached { block, .. } = plan else {
                    return None;
                };
                let len = block.header.payload_len as usize;
                return Some(
                    IoRequest::read_device(block.fd.as_fd(), PAYLOAD_OFFSET, mem.prefix(len))
                        .on_cached_file()
                        .with_file_len(block.header.file_len()),
                );
            }
        };
        Some(match plan {
            ReadPlan::Done(_) => return None,
            ReadPlan::Cached { block, bounce } => match bounce {
                Some(b) => {
                    IoRequest::read(block.fd.as_fd(), PAYLOAD_OFFSET, vec![IoSliceMut::new(b)])
                        .on_cached_file()
                        .with_file_len(block.header.file_len())
                }
                None => {
                    // O_DIRECT without a bounce reads whole aligned blocks (the
                    // kernel shortens the last one at the end of the file).
                    let len = block.header.payload_len as usize;
                    let n = if self.opts.direct { align_up(len) } else { len };
                    let mut slices = Vec::with_capacity(2);
                    buf.push_slices(n, &mut slices);
                    IoRequest::read(block.fd.as_fd(), PAYLOAD_OFFSET, slices)
                        .on_cached_file()
                        .with_file_len(block.header.file_len())
                }
            },
            ReadPlan::Fresh(fresh) => fresh.request(buf),
        })
    }

    /// Starts a get batch: per key, an invalid key's error, or whether the index holds it.
    /// Keys it holds are pinned for the batch (eviction skips them) and returned to be
    /// unpinned by [`Inner::end_batch`]; others are misses without a system call.
    pub(super) fn pin_batch(&self, keys: &[BlockKey]) -> (Vec<Result<bool>>, Vec<BlockHash>) {
        let valid: Vec<Result<()>> = keys.iter().map(|k| self.check_key(k)).collect();
        let to_pin: Vec<&BlockHash> = keys
            .iter()
            .zip(&valid)
            .filter(|(_, v)| v.is_ok())
            .map(|(k, _)| &k.hash)
            .collect();
        let mut present = self.index.pin_present(&to_pin).into_iter();
        let mut pinned = Vec::with_capacity(keys.len());
        let found = keys
            .iter()
            .zip(valid)
            .map(|(k, v)| {
                v.map(|()| {
                    let p = present.next() == Some(true);
                    if p {
                        pinned.push(k.hash);
                    }
                    p || self.ask_tree(&k.hash)
                })
            })
            .collect();
        (found, pinned)
    }

    /// A store of a shared tree (writable or read-only), a key the index does not hold: true
    /// if the tree must be asked (it is not remembered as absent). Exclusive: false (the index
    /// owns the tree).
    pub(super) fn ask_tree(&self, hash: &BlockHash) -> bool {
        let Some(neg) = &self.tree else {
            return false;
        };
        if neg.known_absent(hash) {
            Counters::add(&self.counters.negative_hits, 1);
            return false;
        }
        Counters::add(&self.counters.tree_lookups, 1);
        true
    }

    /// Ends a get batch: counts its outcomes, tells the policy about the hits, unpins.
    pub(super) fn end_batch(
        &self,
        keys: &[BlockKey],
        results: &[Result<Lookup>],
        pinned: &[BlockHash],
    ) {
        let c = &self.counters;
        let mut hits = Vec::with_capacity(keys.len());
        for (k, r) in keys.iter().zip(results) {
            match r {
                Ok(Lookup::Hit(n)) => {
                    Counters::add(&c.hits, 1);
                    Counters::add(&c.bytes_read, *n as u64);
                    hits.push(k.hash);
                }
                Ok(Lookup::Miss) => Counters::add(&c.misses, 1),
                Err(_) => Counters::add(&c.read_errors, 1),
            }
        }
        self.index.record_hits(&hits);
        self.index.unpin(pinned);
    }

    /// The block's descriptor from the open-file cache, if it still names the block's file
    /// (counted as a cache hit). A cached descriptor may name a file deleted or replaced
    /// behind our back: its link count is then 0, the entry is dropped and `None` returned
    /// (the path is looked up again). A file whose size changed in place is corrupt: removed,
    /// and the miss returned as the error.
    pub(super) fn cached_block(
        &self,
        key: &BlockKey,
    ) -> std::result::Result<Option<Arc<OpenBlock>>, Lookup> {
        let Some(block) = self.fds.get(&key.hash) else {
            return Ok(None);
        };
        match rustix::fs::fstat(&block.fd) {
            Ok(st) if st.st_nlink > 0 && st.st_size as u64 != block.header.file_len() => {
                let rel = self.layout.rel_path(&key.hash);
                let reason = CorruptReason::Length {
                    file: st.st_size as u64,
                    header: block.header.file_len(),
                };
                Err(self.corrupt(&key.hash, &rel, &block.fd, Some(&block), reason))
            }
            Ok(st) if st.st_nlink > 0 => {
                Counters::add(&self.counters.fd_hits, 1);
                Ok(Some(block))
            }
            _ => {
                self.fds.invalidate_if(&key.hash, &block);
                Ok(None)
            }
        }
    }

    /// Plans the read of `key` into a destination of `buf_len` bytes, `aligned` as
    /// [`Scatter::aligned`] says.
    fn plan_read(&self, key: &BlockKey, buf_len: usize, aligned: bool) -> ReadPlan {
        if let Err(e) = self.check_key(key) {
            return ReadPlan::Done(Err(e));
        }
        match self.cached_block(key) {
            Err(miss) => return ReadPlan::Done(Ok(miss)),
            Ok(Some(block)) => {
                let need = block.header.payload_len as usize;
                if need > buf_len {
                    return ReadPlan::Done(Err(Error::BufferTooSmall {
                        key: key.to_string(),
                        need,
                        have: buf_len,
                    }));
                }
                // O_DIRECT straight into the caller's buffer when it is aligned and holds the
                // block rounded up to the alignment; else through a bounce buffer.
                let fits = aligned && buf_len >= align_up(need);
                let bounce = (self.opts.direct && !fits).then(|| self.bufs.take(need));
                return ReadPlan::Cached { block, bounce };
            }
            Ok(None) => {}
        }
        Counters::add(&self.counters.fd_misses, 1);
        let rel = self.layout.rel_path(&key.hash);
        match self.open_block(rel.as_str(), self.read_flags()) {
            Ok(Opened::NotRegular(kind)) => {
                tracing::warn!(path = %self.path(rel.as_str()).display(), %kind, "not a regular file under a block's name: not read, left alone, counted as a miss");
                Counters::add(&self.counters.foreign, 1);
                self.index.forget(&key.hash);
                ReadPlan::Done(Ok(Lookup::Miss))
            }
            Ok(Opened::File(fd, st)) => {
                let size = st.st_size as u64;
                // O_DIRECT into a caller's buffer whose address and length are aligned: the
                // header page into a pooled page, the payload in place. The file's length
                // (from fstat, checked against the header) stands in for the spare byte
                // that buffered reads use to see a file longer than its header says.
                let in_place = aligned && buf_len % DIRECT_ALIGN == 0;
                let (head, bounce, direct_head) = if !self.opts.direct {
                    (vec![0u8; PAYLOAD_OFFSET as usize], None, None)
                } else if in_place {
                    (
                        Vec::new(),
                        None,
                        Some(self.bufs.take(PAYLOAD_OFFSET as usize)),
                    )
                } else {
                    (
                        Vec::new(),
                        Some(self.bufs.take(PAYLOAD_OFFSET as usize + buf_len + 1)),
                        None,
                    )
                };
                ReadPlan::Fresh(FreshRead {
                    fd,
                    size,
                    rel,
                    head,
                    tail: [0],
                    bounce,
                    direct_head,
                    stream: matches!(self.opts.verify, VerifyMode::OnOpen | VerifyMode::Always)
                        .then(crate::format::FileHasher::new),
                })
            }
            Err(Errno::NOENT | Errno::NOTDIR | Errno::STALE) => {
                // Deleted behind the store's back (or, shared, never put or evicted by
                // another store).
                self.forget_if_missing(&key.hash, &rel);
                if let Some(neg) = &self.tree {
                    neg.absent(key.hash);
                }
                ReadPlan::Done(Ok(Lookup::Miss))
            }
            // An open that raced another store's reuse of the file (its name is gone; the
            // writer holds a lease, which a non-blocking open does not wait for).
            Err(Errno::AGAIN) => ReadPlan::Done(Ok(Lookup::Miss)),
            Err(Errno::LOOP | Errno::XDEV) => {
                tracing::warn!(path = %self.path(rel.as_str()).display(), "symlink in the tree: not followed, counted as a miss");
                Counters::add(&self.counters.foreign, 1);
                ReadPlan::Done(Ok(Lookup::Miss))
            }
            Err(e) => ReadPlan::Done(Err(Error::from_io(self.path(rel.as_str()), io_err(e)))),
        }
    }

    /// Finishes the read of `key` into `buf` as planned by `plan`, whose request (if any)
    /// returned `io`.
    fn finish_read(
        &self,
        key: &BlockKey,
        plan: ReadPlan,
        buf: &mut Scatter<'_>,
        io: std::io::Result<usize>,
    ) -> Result<Lookup> {
        match plan {
            ReadPlan::Done(r) => r,
            ReadPlan::Cached { block, bounce } => self.finish_cached(key, block, bounce, buf, io),
            ReadPlan::Fresh(fresh) => self.finish_fresh(key, fresh, buf, io),
        }
    }

    /// Finishes a read of a cached file: its length, the copy from the bounce buffer, the
    /// checksum as the verify mode asks.
    fn finish_cached(
        &self,
        key: &BlockKey,
        block: Arc<OpenBlock>,
        bounce: Option<PooledBuf>,
        buf: &mut Scatter<'_>,
        io: std::io::Result<usize>,
    ) -> Result<Lookup> {
        // The path only for what goes wrong, not for every cached hit.
        let rel = || self.layout.rel_path(&key.hash);
        let n = io.map_err(|e| Error::from_io(self.path(rel().as_str()), e))?;
        let len = block.header.payload_len as usize;
        if n != len {
            return Ok(self.corrupt(
                &key.hash,
                &rel(),
                &block.fd,
                Some(&block),
                CorruptReason::Length {
                    file: PAYLOAD_OFFSET + n as u64,
                    header: block.header.file_len(),
                },
            ));
        }
        if let Some(b) = bounce {
            buf.copy_from(&b[..len]);
        }
        let check = match self.opts.verify {
            VerifyMode::Always => true,
            VerifyMode::Never => false,
            VerifyMode::OnOpen | VerifyMode::AfterReboot => !block.verified.load(Ordering::Relaxed),
        };
        if check {
            if !buf.matches(&block.header, len) {
                return Ok(self.corrupt(
                    &key.hash,
                    &rel(),
                    &block.fd,
                    Some(&block),
                    CorruptReason::Checksum,
                ));
            }
            block.verified.store(true, Ordering::Relaxed);
        }
        Ok(Lookup::Hit(len))
    }

    /// Finishes a read of a file opened for it: its header, length and checksum checked (a
    /// corrupt file removed), the payload copied from the bounce buffer; a good file is
    /// adopted ([`Inner::adopt_fresh`]).
    fn finish_fresh(
        &self,
        key: &BlockKey,
        fresh: FreshRead,
        buf: &mut Scatter<'_>,
        io: std::io::Result<usize>,
    ) -> Result<Lookup> {
        let FreshRead {
            fd,
            size,
            rel,
            head,
            tail,
            bounce,
            direct_head,
            stream,
        } = fresh;
        let n = io.map_err(|e| Error::from_io(self.path(rel.as_str()), e))?;
        let head_bytes: &[u8] = match (&bounce, &direct_head) {
            (Some(b), _) | (None, Some(b)) => &b[..n.min(PAYLOAD_OFFSET as usize)],
            (None, None) => &head[..n.min(PAYLOAD_OFFSET as usize)],
        };
        let header = match check_head(&key.hash, head_bytes) {
            Ok(h) => h,
            Err(reason) => return Ok(self.corrupt(&key.hash, &rel, &fd, None, reason)),
        };
        // The claimed length against the file's own before anything is sized by it.
        if header.file_len() != size {
            return Ok(self.corrupt(
                &key.hash,
                &rel,
                &fd,
                None,
                CorruptReason::Length {
                    file: size,
                    header: header.file_len(),
                },
            ));
        }
        let len = header.payload_len as usize;
        if header.payload_len > buf.len() as u64 {
            return Err(Error::BufferTooSmall {
                key: key.to_string(),
                need: len,
                have: buf.len(),
            });
        }
        let expect = header.file_len() as usize;
        if n != expect {
            // Shorter: truncated. Longer (bytes beyond the payload, caught by the
            // one-byte tail): appended to.
            let _ = tail;
            return Ok(self.corrupt(
                &key.hash,
                &rel,
                &fd,
                None,
                CorruptReason::Length {
                    file: n as u64,
                    header: expect as u64,
                },
            ));
        }
        if let Some(b) = &bounce {
            buf.copy_from(&b[PAYLOAD_OFFSET as usize..expect]);
        }
        // after-reboot hashes only what a machine crash may have torn.
        let hash_now = match self.opts.verify {
            VerifyMode::Never => false,
            VerifyMode::Always | VerifyMode::OnOpen => true,
            VerifyMode::AfterReboot => !self.trusts(&header),
        };
        if hash_now && !self.payload_matches(&header, stream, n, buf, len) {
            return Ok(self.corrupt(&key.hash, &rel, &fd, None, CorruptReason::Checksum));
        }
        self.adopt_fresh(key.hash, fd, header, size);
        Ok(Lookup::Hit(len))
    }

    /// A fresh file read and checked: the index learns it if another store put it (shared),
    /// and its descriptor goes into the open-file cache.
    fn adopt_fresh(&self, hash: BlockHash, fd: OwnedFd, header: crate::format::Header, size: u64) {
        let verified = self.opts.verify != VerifyMode::Never;
        if self.tree.is_some() && !self.index.contains(&hash) {
            // Put by another store: the index learns it (as just used).
            Counters::add(&self.counters.tree_hits, 1);
            self.index.load(hash, align_up(size as usize) as u64);
        }
        self.fds.insert(
            hash,
            Arc::new(OpenBlock {
                engine: self.engine.clone(),
                fd,
                header,
                verified: AtomicBool::new(verified),
            }),
        );
    }

    /// True when the payload (the first `len` bytes of `buf`, read in `n` bytes with its
    /// header) matches `header`'s checksum: from what `stream` hashed as the bytes landed when
    /// it can tell (counted in `StoreStats::checksums_streamed`), else by hashing the payload.
    fn payload_matches(
        &self,
        header: &crate::format::Header,
        stream: Option<crate::format::FileHasher>,
        n: usize,
        buf: &Scatter<'_>,
        len: usize,
    ) -> bool {
        match stream.and_then(|s| s.verdict(header, n)) {
            Some(ok) => {
                Counters::add(&self.counters.checksums_streamed, 1);
                ok
            }
            None => buf.matches(header, len),
        }
    }

    /// True when `header`'s file needs no payload hash under [`VerifyMode::AfterReboot`]: it
    /// was written on this machine since its current boot (counted in
    /// `StoreStats::checksums_skipped`).
    pub(super) fn trusts(&self, header: &crate::format::Header) -> bool {
        let trusted = header.written_in_boot(self.boot.as_ref());
        if trusted {
            Counters::add(&self.counters.checksums_skipped, 1);
        }
        trusted
    }

    /// Handles a corrupt file: removes it if the path still names the same file, counts it,
    /// logs it, and reports a miss.
    pub(super) fn corrupt(
        &self,
        hash: &BlockHash,
        rel: &RelPath,
        fd: &OwnedFd,
        cached: Option<&Arc<OpenBlock>>,
        reason: CorruptReason,
    ) -> Lookup {
        let path = self.path(rel.as_str());
        tracing::warn!(path = %path.display(), %reason, "corrupt block file: removed, counted as a miss");
        Counters::add(&self.counters.corrupt, 1);
        if let Some(b) = cached {
            self.fds.invalidate_if(&b.header.key, b);
        }
        // Under the key's stripe lock, so a put cannot publish between the check and the
        // unlink; only the inode that was read is removed (a concurrent put may have
        // published a good block under the name).
        let mut journal = self.journal_lock();
        let _stripe = self.lock_stripe(self.stripe_of(hash));
        let mut note = |cause| {
            if let Some(j) = &mut journal {
                j.record(crate::ns::EventKind::Removed, cause, *hash);
            }
        };
        if self.opts.read_only {
            self.index.forget(hash);
        } else if let Ok(judged) = rustix::fs::fstat(fd).map(|st| Inode::of(&st)) {
            match self.ns.unlink_file_sized(rel.as_str(), Some(judged)) {
                Ok((crate::ns::Unlinked::Removed, bytes)) => {
                    self.freed(bytes);
                    self.index.forget(hash);
                    note(crate::ns::EventCause::Corrupt);
                }
                Ok((crate::ns::Unlinked::Missing, _)) => {
                    if self.index.forget(hash) {
                        note(crate::ns::EventCause::Missing);
                    }
                }
                Ok((crate::ns::Unlinked::Refused, _)) => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove corrupt block file");
                }
            }
        }
        Lookup::Miss
    }
}
