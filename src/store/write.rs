//! The put path: validation, admission, room, temp files, one engine batch, publication.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::{Counters, DIR_MODE, FILE_MODE, Inner, io_err};
use crate::buf::{DeviceMem, PooledBuf, align_up};
use crate::engine::{IoRequest, read_full, write_full};
use crate::error::{Error, Result};
use crate::format::{HEADER_LEN, Header, PADDING, PAYLOAD_OFFSET};
use crate::index::Offer;
use crate::key::{BlockHash, BlockKey};
use crate::layout::{RelPath, TEMP_PREFIX};

/// A put in progress: its temp file and what it will be published as.
pub(super) struct WritePlan {
    pub rel: RelPath,
    /// The temp name: the file's name until published, or (for an anonymous `O_TMPFILE`
    /// inode) the name it takes when it must replace an existing block.
    pub temp_rel: String,
    /// True for an `O_TMPFILE` inode, which has no name until it is linked.
    pub anonymous: bool,
    pub fd: OwnedFd,
    pub header: [u8; HEADER_LEN],
    pub bounce: Option<PooledBuf>,
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
    ) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = (0..which.len()).map(|_| None).collect();
        // 1. Validate everything before anything is written.
        let mut valid: Vec<usize> = Vec::with_capacity(which.len());
        for (slot, &i) in which.iter().enumerate() {
            let (key, data) = (&items[i].0, &items[i].1);
            if let Err(e) = self.check_key(key) {
                results[slot] = Some(Err(e));
            } else if data.len() > self.max_block {
                results[slot] = Some(Err(Error::TooLarge {
                    key: key.to_string(),
                    len: data.len(),
                    max: self.max_block,
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
        let (offers, victims) = self.index.offer(&offered, replace);
        self.unlink_victims(victims);

        // 3. Temp files for what must be written.
        let mut plans: Vec<(usize, Offer, WritePlan)> = Vec::with_capacity(valid.len());
        for (slot, offer) in valid.into_iter().zip(offers) {
            let (key, data) = (&items[which[slot]].0, &items[which[slot]].1);
            match offer {
                Offer::Touched | Offer::NotAdmitted => results[slot] = Some(Ok(())),
                Offer::Reserved | Offer::Replace => match self.plan_write(key, data) {
                    Ok(p) => plans.push((slot, offer, p)),
                    Err(e) => {
                        self.index.abort(&key.hash, offer);
                        results[slot] = Some(Err(e));
                    }
                },
            }
        }

        // 4. One engine batch with every write.
        let io_results = {
            let mut reqs = Vec::with_capacity(plans.len());
            for (slot, _, p) in &plans {
                let data = &items[which[*slot]].1;
                reqs.push(match (&p.bounce, data.host(), data.device()) {
                    (Some(b), _, _) => IoRequest::write(p.fd.as_fd(), 0, vec![IoSlice::new(b)]),
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
            self.engine.submit(&mut reqs)
        };

        // 5. Size, sync; failures unlink their temp file and drop their reservation.
        let mut written: Vec<(usize, Offer, WritePlan, u64)> = Vec::with_capacity(plans.len());
        for ((slot, offer, plan), io) in plans.into_iter().zip(io_results) {
            let io = if plan.device {
                io.and_then(|n| self.seal(&plan, n))
            } else {
                io
            };
            match self.finish_write(&plan, io) {
                Ok(bytes) => written.push((slot, offer, plan, bytes)),
                Err(e) => {
                    self.discard(&plan);
                    self.index.abort(&plan.hash, offer);
                    results[slot] = Some(Err(e));
                }
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
        let mut dirs_to_sync: Vec<String> = Vec::new();
        for (slot, offer, plan, bytes) in written {
            match self.publish_file(&plan) {
                Ok(()) => {
                    // The replaced file (if any) is unlinked: drop its cached descriptor.
                    self.fds.invalidate(&plan.hash);
                    self.index.commit(&plan.hash, bytes);
                    Counters::add(&self.counters.puts, 1);
                    Counters::add(&self.counters.bytes_written, plan.len as u64);
                    if self.sync_writes && !dirs_to_sync.iter().any(|d| d == plan.rel.dir()) {
                        dirs_to_sync.push(plan.rel.dir().to_string());
                    }
                    results[slot] = Some(Ok(()));
                }
                Err(e) => {
                    self.discard(&plan);
                    self.index.abort(&plan.hash, offer);
                    let path = self.path(plan.rel.as_str());
                    results[slot] = Some(Err(Error::from_io(path, io_err(e))));
                }
            }
        }
        drop(guards);
        for d in dirs_to_sync {
            self.sync_dir(&d);
        }
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
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
        let got = read_full(
            plan.fd.as_fd(),
            PAYLOAD_OFFSET,
            &mut [IoSliceMut::new(&mut payload)],
        )?;
        if got != plan.len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        let header = Header::for_payload(plan.hash, &payload[..plan.len]).encode();
        let mut head = self.bufs.take(PAYLOAD_OFFSET as usize);
        head[..HEADER_LEN].copy_from_slice(&header);
        head[HEADER_LEN..PAYLOAD_OFFSET as usize].fill(0);
        write_full(plan.fd.as_fd(), 0, &mut [IoSlice::new(&head)])?;
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
        if self.sync_writes {
            rustix::fs::fdatasync(&plan.fd).map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
        }
        let st = rustix::fs::fstat(&plan.fd).map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
        Ok(st.st_blocks as u64 * 512)
    }

    /// Errors name the temp file, or for an anonymous inode the block it was to become.
    fn temp_path(&self, plan: &WritePlan) -> std::path::PathBuf {
        if plan.anonymous {
            self.path(plan.rel.as_str())
        } else {
            self.path(&plan.temp_rel)
        }
    }

    /// Removes what a failed put created: a named temp file is unlinked; an anonymous inode
    /// vanishes when its descriptor closes.
    fn discard(&self, plan: &WritePlan) {
        if plan.anonymous {
            return;
        }
        match rustix::fs::unlinkat(&self.dirfd, plan.temp_rel.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => tracing::warn!(
                path = %self.temp_path(plan).display(),
                error = %e,
                "could not unlink temp file after a failed put"
            ),
        }
    }

    /// Creates the temp file of one validated, admitted put.
    fn plan_write<D: Source>(&self, key: &BlockKey, data: &D) -> Result<WritePlan> {
        // From GPU memory, the header is written once the payload is in the file.
        let header = match data.host() {
            Some(d) => Header::for_payload(key.hash, d).encode(),
            None => [0; HEADER_LEN],
        };
        let rel = self.layout.rel_path(&key.hash);
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "{TEMP_PREFIX}{}.{}.{seq}",
            rel.file_name(),
            std::process::id()
        );
        let temp_rel = if rel.dir().is_empty() {
            name
        } else {
            format!("{}/{name}", rel.dir())
        };
        let direct = if self.direct {
            OFlags::DIRECT
        } else {
            OFlags::empty()
        };
        let mode = Mode::from_raw_mode(FILE_MODE);
        let (fd, anonymous) = self
            .create_temp(&rel, &temp_rel, direct, mode)
            .map_err(|e| Error::from_io(self.path(&temp_rel), io_err(e)))?;
        let bounce = data.host().filter(|_| self.direct).map(|data| {
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
            temp_rel,
            anonymous,
            fd,
            header,
            bounce,
            hash: key.hash,
            len: data.len(),
            device,
        })
    }

    /// Creates the file a put writes: an anonymous `O_TMPFILE` inode in the block's directory
    /// where the filesystem supports it (nothing is left behind by a crash, and publishing is
    /// one `linkat`), else a named temp file. Creates missing shard directories. Opened for
    /// reading too: a payload written from GPU memory is read back for its checksum.
    fn create_temp(
        &self,
        rel: &RelPath,
        temp_rel: &str,
        direct: OFlags,
        mode: Mode,
    ) -> rustix::io::Result<(OwnedFd, bool)> {
        let dir = if rel.dir().is_empty() { "." } else { rel.dir() };
        let mut made_dirs = false;
        loop {
            let r = if self.tmpfile.load(Ordering::Relaxed) {
                match self.open_beneath(dir, OFlags::TMPFILE | OFlags::RDWR | direct, mode) {
                    Ok(fd) => return Ok((fd, true)),
                    Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                        tracing::info!(
                            "the filesystem has no O_TMPFILE: puts use named temp files"
                        );
                        self.tmpfile.store(false, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => Err(e),
                }
            } else {
                self.open_beneath(
                    temp_rel,
                    OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | direct,
                    mode,
                )
                .map(|fd| (fd, false))
            };
            match r {
                Err(Errno::NOENT) if !made_dirs => {
                    made_dirs = true;
                    self.make_dirs(rel.dir()).map_err(|_| Errno::NOENT)?;
                }
                r => return r,
            }
        }
    }

    /// Gives an anonymous inode the name `rel`: `linkat` with `AT_EMPTY_PATH` (needs
    /// CAP_DAC_READ_SEARCH), else through `/proc/self/fd`. Fails with EEXIST if `rel` exists.
    fn link_anonymous(&self, fd: &OwnedFd, rel: &str) -> rustix::io::Result<()> {
        if self.link_empty_path.load(Ordering::Relaxed) {
            match rustix::fs::linkat(fd, "", &self.dirfd, rel, AtFlags::EMPTY_PATH) {
                // Without CAP_DAC_READ_SEARCH: link through /proc instead, from now on
                // (unless that fails the same way: then the directory itself is missing).
                Err(e @ (Errno::NOENT | Errno::PERM)) => {
                    let r = self.link_via_proc(fd, rel);
                    if !matches!(r, Err(Errno::NOENT | Errno::PERM)) {
                        self.link_empty_path.store(false, Ordering::Relaxed);
                        return r;
                    }
                    return Err(e);
                }
                r => return r,
            }
        }
        self.link_via_proc(fd, rel)
    }

    fn link_via_proc(&self, fd: &OwnedFd, rel: &str) -> rustix::io::Result<()> {
        use std::os::fd::AsRawFd;
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::linkat(
            rustix::fs::CWD,
            proc_path.as_str(),
            &self.dirfd,
            rel,
            AtFlags::SYMLINK_FOLLOW,
        )
    }

    /// Publishes a fully written temp file under its final name, atomically replacing any
    /// existing block.
    fn publish_file(&self, plan: &WritePlan) -> rustix::io::Result<()> {
        let rel = plan.rel.as_str();
        if !plan.anonymous {
            return rustix::fs::renameat(&self.dirfd, plan.temp_rel.as_str(), &self.dirfd, rel);
        }
        match self.link_anonymous(&plan.fd, rel) {
            Err(Errno::EXIST) => {
                // Replacing a block: name the inode, then rename over the old one.
                self.link_anonymous(&plan.fd, &plan.temp_rel)?;
                rustix::fs::renameat(&self.dirfd, plan.temp_rel.as_str(), &self.dirfd, rel)
                    .inspect_err(|_| {
                        let _ = rustix::fs::unlinkat(
                            &self.dirfd,
                            plan.temp_rel.as_str(),
                            AtFlags::empty(),
                        );
                    })
            }
            r => r,
        }
    }

    /// Creates the shard directories of `dir` (e.g. `ab/cd`), each level in turn.
    fn make_dirs(&self, dir: &str) -> Result<()> {
        let ends = dir
            .match_indices('/')
            .map(|(i, _)| i)
            .chain(std::iter::once(dir.len()));
        for end in ends {
            let part = &dir[..end];
            match rustix::fs::mkdirat(&self.dirfd, part, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(Error::from_io(self.path(part), io_err(e))),
            }
        }
        Ok(())
    }

    fn sync_dir(&self, rel_dir: &str) {
        let d = if rel_dir.is_empty() { "." } else { rel_dir };
        match self.open_beneath(d, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()) {
            Ok(fd) => {
                if let Err(e) = rustix::fs::fsync(&fd) {
                    tracing::warn!(dir = %self.path(d).display(), error = %e, "fsync of directory failed");
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.path(d).display(), error = %e, "could not open directory to fsync")
            }
        }
    }
}
