//! GPU memory: blocks read straight into, and written straight from, [`DeviceMem`] by an
//! engine that moves device memory (the nixl engine, through NIXL's GDS backends).
//!
//! The semantics are the host paths': a missing file is a miss, a corrupt one is removed and
//! is a miss, a put publishes a complete file or nothing. What differs is where checksums are
//! computed, since the store never reads GPU memory:
//! - a get checks the header through the host (it is read when a file is opened), and
//!   verifies the payload checksum through a host read of the file when the verify mode asks
//!   for it (on open: once per opened file; always: on every get), then moves the payload
//!   into GPU memory;
//! - a put has the engine write the payload into the temp file, reads it back to compute the
//!   header's checksum, writes the header, and publishes.

use std::io::IoSliceMut;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::Errno;

use super::fdcache::OpenBlock;
use super::read::{Dest, ReadPlan, count_mismatch};
use super::{Counters, Inner, Lookup, Store, VerifyMode, io_err};
use crate::buf::DeviceMem;
use crate::engine::IoRequest;
use crate::error::{Error, Result};
use crate::format::PAYLOAD_OFFSET;
use crate::format::check_head;
use crate::key::BlockKey;

impl Store {
    /// Reads a batch of blocks into GPU memory; one result per key, in order, as
    /// [`Store::get_many`]: `Hit(len)` (the block is in the first `len` bytes of its buffer),
    /// `Miss`, or an error. Needs an engine that moves device memory (`EngineKind::Nixl`);
    /// with another every key fails with [`Error::Unsupported`] and nothing is read.
    pub fn get_many_device(&self, keys: &[BlockKey], bufs: &[DeviceMem]) -> Vec<Result<Lookup>> {
        let started = std::time::Instant::now();
        let results = self.inner.get_device(keys, bufs);
        self.inner.record_get(started, &results);
        results
    }

    /// Stores a batch of blocks from GPU memory; one result per item, as
    /// [`Store::put_many`] (same publication, capacity and admission rules). Needs an engine
    /// that moves device memory; with another every item fails with [`Error::Unsupported`]
    /// and nothing is written.
    pub fn put_many_device(&self, items: &[(BlockKey, DeviceMem)]) -> Vec<Result<()>> {
        if !self.inner.engine.moves_device_memory() {
            let results: Vec<Result<()>> = items
                .iter()
                .map(|_| Err(self.inner.device_unsupported()))
                .collect();
            let c = &self.inner.counters;
            Counters::add(&c.put_errors, results.len() as u64);
            for e in results.iter().filter_map(|r| r.as_ref().err()) {
                c.error(e);
            }
            return results;
        }
        super::flatten(self.inner.put_with_retry(items, true, None))
    }
}

impl Inner {
    fn device_unsupported(&self) -> Error {
        Error::Unsupported(format!(
            "the {} engine moves host memory only; GPU memory needs the nixl engine (NIXL GDS)",
            self.engine.name()
        ))
    }

    fn get_device(&self, keys: &[BlockKey], bufs: &[DeviceMem]) -> Vec<Result<Lookup>> {
        if !self.engine.moves_device_memory() {
            return keys
                .iter()
                .map(|_| Err(self.device_unsupported()))
                .collect();
        }
        if let Some(e) = count_mismatch("get_many_device", keys, bufs.len()) {
            return e;
        }
        let mut dests: Vec<Dest<'_>> = bufs.iter().map(|b| Dest::Device(*b)).collect();
        self.read_pipeline(keys, &mut dests)
    }

    /// Finishes a GPU read (the checks were made when it was planned): the engine moved the
    /// whole payload, or the file is shorter than its header says and is corrupt.
    pub(super) fn finish_device_read(
        &self,
        key: &BlockKey,
        plan: ReadPlan,
        io: std::io::Result<usize>,
    ) -> Result<Lookup> {
        let block = match plan {
            ReadPlan::Cached { block, .. } => block,
            ReadPlan::Done(r) => return r,
            ReadPlan::Fresh(_) => unreachable!("GPU reads are planned on open, checked files"),
        };
        let len = block.header.payload_len as usize;
        // The path only for what goes wrong.
        let rel = || self.layout.rel_path(&key.hash);
        match io {
            Ok(n) if n == len => Ok(Lookup::Hit(len)),
            Ok(n) => Ok(self.corrupt(
                &key.hash,
                &rel(),
                &block.fd,
                Some(&block),
                crate::error::CorruptReason::Length {
                    file: PAYLOAD_OFFSET + n as u64,
                    header: block.header.file_len(),
                },
            )),
            Err(e) => Err(Error::from_io(self.path(rel().as_str()), e)),
        }
    }

    /// Finds the block's open, checked file (the open-file cache, else the tree) and verifies
    /// its payload through the host when the verify mode asks for it.
    pub(super) fn plan_device_read(&self, key: &BlockKey, buf_len: usize) -> ReadPlan {
        // The path only for what needs it (an open, an error), not for every cached hit.
        let rel = || self.layout.rel_path(&key.hash);
        let block = match self.cached_block(key) {
            Err(miss) => return ReadPlan::Done(Ok(miss)),
            Ok(Some(b)) => b,
            Ok(None) => {
                Counters::add(&self.counters.fd_misses, 1);
                match self.open_device_block(key, &rel()) {
                    Ok(b) => b,
                    Err(done) => return ReadPlan::Done(done),
                }
            }
        };
        let need = block.header.payload_len as usize;
        if need > buf_len {
            return ReadPlan::Done(Err(Error::BufferTooSmall {
                key: key.to_string(),
                need,
                have: buf_len,
            }));
        }
        let check = match self.opts.verify {
            VerifyMode::Always => true,
            VerifyMode::Never => false,
            VerifyMode::OnOpen => !block.verified.load(Ordering::Relaxed),
            // A file written since this boot is moved to the GPU without a host read.
            VerifyMode::AfterReboot => {
                !block.verified.load(Ordering::Relaxed) && !self.trusts(&block.header)
            }
        };
        if check {
            let mut payload = self.bufs.take(need);
            let read = self.engine_one(IoRequest::read(
                block.fd.as_fd(),
                PAYLOAD_OFFSET,
                vec![IoSliceMut::new(&mut payload)],
            ));
            match read {
                Ok(n) if n >= need && block.header.verify(&payload[..need]) => {
                    block.verified.store(true, Ordering::Relaxed);
                }
                Ok(_) => {
                    return ReadPlan::Done(Ok(self.corrupt(
                        &key.hash,
                        &rel(),
                        &block.fd,
                        Some(&block),
                        crate::error::CorruptReason::Checksum,
                    )));
                }
                Err(e) => {
                    return ReadPlan::Done(Err(Error::from_io(self.path(rel().as_str()), e)));
                }
            }
        }
        ReadPlan::Cached {
            block,
            bounce: None,
        }
    }

    /// Opens a block file, checks its header and size, and caches the descriptor.
    fn open_device_block(
        &self,
        key: &BlockKey,
        rel: &crate::layout::RelPath,
    ) -> std::result::Result<Arc<OpenBlock>, Result<Lookup>> {
        let fd = match self.open_block(rel.as_str(), self.read_flags()) {
            Ok(crate::ns::Opened::File(fd, _)) => fd,
            Ok(crate::ns::Opened::NotRegular(kind)) => {
                tracing::warn!(path = %self.path(rel.as_str()).display(), %kind, "not a regular file under a block's name: not read, left alone, counted as a miss");
                Counters::add(&self.counters.foreign, 1);
                self.index.forget(&key.hash);
                return Err(Ok(Lookup::Miss));
            }
            Err(Errno::NOENT | Errno::NOTDIR) => {
                self.forget_if_missing(&key.hash, rel);
                return Err(Ok(Lookup::Miss));
            }
            // Being reused by its writer (see `Inner::plan_read`).
            Err(Errno::AGAIN) => return Err(Ok(Lookup::Miss)),
            Err(Errno::LOOP | Errno::XDEV) => {
                tracing::warn!(path = %self.path(rel.as_str()).display(), "symlink in the tree: not followed, counted as a miss");
                Counters::add(&self.counters.foreign, 1);
                return Err(Ok(Lookup::Miss));
            }
            Err(e) => {
                return Err(Err(Error::from_io(self.path(rel.as_str()), io_err(e))));
            }
        };
        let io_error = |e: std::io::Error| -> Result<Lookup> {
            Err(Error::from_io(self.path(rel.as_str()), e))
        };
        // An aligned buffer, so that O_DIRECT descriptors work too.
        let mut head = self.bufs.take(PAYLOAD_OFFSET as usize);
        let n = self
            .engine_one(IoRequest::read(
                fd.as_fd(),
                0,
                vec![IoSliceMut::new(&mut head)],
            ))
            .map_err(io_error)?;
        let header = match check_head(&key.hash, &head[..n]) {
            Ok(h) => h,
            Err(reason) => {
                return Err(Ok(self.corrupt(&key.hash, rel, &fd, None, reason)));
            }
        };
        let size = rustix::fs::fstat(&fd)
            .map_err(|e| io_error(io_err(e)))?
            .st_size as u64;
        if size != header.file_len() {
            let reason = crate::error::CorruptReason::Length {
                file: size,
                header: header.file_len(),
            };
            return Err(Ok(self.corrupt(&key.hash, rel, &fd, None, reason)));
        }
        let block = Arc::new(OpenBlock {
            engine: self.engine.clone(),
            fd,
            header,
            verified: AtomicBool::new(false),
        });
        self.fds.insert(key.hash, block.clone());
        Ok(block)
    }
}
