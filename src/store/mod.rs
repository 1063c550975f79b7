//! The store: one worker's blocks under a root directory.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::buf::{AlignedBuf, align_up};
use crate::engine::{IoEngine, IoRequest};
use crate::error::{Error, Result};
use crate::format::{HEADER_LEN, Header, PADDING, PAYLOAD_OFFSET};
use crate::key::{BlockHash, BlockKey, WorkerId};
use crate::layout::{self, LAYOUT_FILE, LOCK_FILE, Layout, RelPath, TEMP_PREFIX};

mod async_api;
mod config;
mod fdcache;
mod stats;
pub mod sweep;

pub use config::{DEFAULT_FD_CACHE_MAX, DEFAULT_MAX_BLOCK_SIZE, StoreConfig, VerifyMode};
pub use stats::StoreStats;

use fdcache::{FdCache, OpenBlock};
use stats::Counters;

/// File mode of block files, as passed to `open` (the umask applies).
pub const FILE_MODE: u32 = 0o644;
/// Mode of shard directories, as passed to `mkdir` (the umask applies).
pub const DIR_MODE: u32 = 0o755;

/// Attempts to open a file when the open-file limit is hit, shrinking the cache in between.
const EMFILE_RETRIES: usize = 16;

/// The outcome of reading one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The block was found, verified as configured, and copied to the front of the buffer.
    Hit(usize),
    /// No valid block under this key (absent, deleted, or corrupt and removed).
    Miss,
}

impl Lookup {
    /// True for a hit.
    pub fn is_hit(&self) -> bool {
        matches!(self, Lookup::Hit(_))
    }

    /// The block length for a hit.
    pub fn hit_len(&self) -> Option<usize> {
        match self {
            Lookup::Hit(n) => Some(*n),
            Lookup::Miss => None,
        }
    }
}

/// One worker's block store under a root directory. Cheap to clone (clones share the store);
/// safe to use from many threads at once.
///
/// Opening takes an exclusive lock on the worker's directory, so two stores (in one process or
/// several) never own the same worker; stores of different workers share a root freely.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    worker: WorkerId,
    dir: PathBuf,
    dirfd: OwnedFd,
    _lock: OwnedFd,
    layout: Layout,
    verify: VerifyMode,
    direct: bool,
    sync_writes: bool,
    max_block: usize,
    engine: Arc<dyn IoEngine>,
    fds: FdCache,
    counters: Counters,
    has_openat2: AtomicBool,
    temp_seq: AtomicU64,
}

enum ReadPlan {
    Done(Result<Lookup>),
    Cached {
        block: Arc<OpenBlock>,
        bounce: Option<AlignedBuf>,
    },
    Fresh {
        fd: OwnedFd,
        rel: RelPath,
        head: Vec<u8>,
        tail: [u8; 1],
        bounce: Option<AlignedBuf>,
    },
}

struct WritePlan {
    rel: RelPath,
    temp_rel: String,
    fd: OwnedFd,
    header: [u8; HEADER_LEN],
    bounce: Option<AlignedBuf>,
}

fn io_err(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

impl Store {
    /// Opens (creating if needed) the store of `worker` under `root`, with `config`.
    ///
    /// Creates `<root>/v1/<worker>/`, records or checks the layout, takes the worker lock and
    /// sweeps temp files left by a crashed predecessor.
    pub fn open(root: impl AsRef<Path>, worker: WorkerId, config: StoreConfig) -> Result<Store> {
        let engine = config.engine.build()?;
        Self::open_with_engine(root, worker, config, engine)
    }

    /// As [`Store::open`], with an engine built by the caller (e.g. a
    /// [`FaultyEngine`](crate::engine::FaultyEngine)).
    #[tracing::instrument(skip(root, config, engine), fields(root = %root.as_ref().display()))]
    pub fn open_with_engine(
        root: impl AsRef<Path>,
        worker: WorkerId,
        config: StoreConfig,
        engine: Arc<dyn IoEngine>,
    ) -> Result<Store> {
        config.validate()?;
        let dir = layout::worker_dir(root.as_ref(), &worker);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&dir)
            .map_err(|e| Error::from_io(&dir, e))?;
        let dirfd = rustix::fs::open(
            &dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| Error::from_io(&dir, io_err(e)))?;

        let lock_path = dir.join(LOCK_FILE);
        let lock = rustix::fs::openat(
            &dirfd,
            LOCK_FILE,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| Error::from_io(&lock_path, io_err(e)))?;
        match rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Err(Error::WorkerBusy { path: dir }),
            Err(e) => return Err(Error::from_io(&lock_path, io_err(e))),
        }

        let layout = resolve_layout(&dir, config.layout)?;
        let report = sweep::sweep(&dir, layout, !config.keep_temp_files);
        for (p, e) in &report.errors {
            tracing::warn!(path = %p.display(), error = %e, "could not scan part of the tree");
        }
        if report.temp > 0 {
            tracing::info!(
                count = report.temp,
                "removed temp files of an unfinished put"
            );
        }
        if report.foreign + report.symlinks > 0 {
            tracing::warn!(
                foreign = report.foreign,
                symlinks = report.symlinks,
                "files that are not blocks of this store are in the tree; left alone"
            );
        }
        let counters = Counters::default();
        Counters::add(&counters.temp_swept, report.temp);
        Counters::add(&counters.foreign, report.foreign + report.symlinks);
        Counters::add(&counters.blocks_at_open, report.blocks);

        let fd_cap = config.fd_cache_capacity();
        tracing::debug!(worker = %worker, %layout, fd_cache = fd_cap, engine = engine.name(), "store open");
        Ok(Store {
            inner: Arc::new(Inner {
                worker,
                dir,
                dirfd,
                _lock: lock,
                layout,
                verify: config.verify,
                direct: config.direct_io,
                sync_writes: config.sync_writes,
                max_block: config.max_block_size(),
                engine,
                fds: FdCache::new(fd_cap),
                counters,
                has_openat2: AtomicBool::new(true),
                temp_seq: AtomicU64::new(0),
            }),
        })
    }

    /// The worker this store serves.
    pub fn worker(&self) -> &WorkerId {
        &self.inner.worker
    }

    /// The worker's directory (`<root>/v1/<worker>`).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The layout in use.
    pub fn layout(&self) -> Layout {
        self.inner.layout
    }

    /// The I/O engine's name.
    pub fn engine_name(&self) -> &'static str {
        self.inner.engine.name()
    }

    /// The key of `hash` for this store's worker.
    pub fn key(&self, hash: BlockHash) -> BlockKey {
        BlockKey::new(self.inner.worker.clone(), hash)
    }

    /// The path a block is (or would be) stored at.
    pub fn path_of(&self, hash: &BlockHash) -> PathBuf {
        self.inner
            .dir
            .join(self.inner.layout.rel_path(hash).as_str())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> StoreStats {
        let c = &self.inner.counters;
        let g = Counters::get;
        StoreStats {
            hits: g(&c.hits),
            misses: g(&c.misses),
            bytes_read: g(&c.bytes_read),
            bytes_written: g(&c.bytes_written),
            puts: g(&c.puts),
            put_errors: g(&c.put_errors),
            read_errors: g(&c.read_errors),
            removes: g(&c.removes),
            corrupt: g(&c.corrupt),
            foreign: g(&c.foreign),
            temp_swept: g(&c.temp_swept),
            blocks_at_open: g(&c.blocks_at_open),
            fd_cache_hits: g(&c.fd_hits),
            fd_cache_misses: g(&c.fd_misses),
            fd_cache_evictions: self.inner.fds.counters.evictions.load(Ordering::Relaxed) as u64,
            fd_cache_shrinks: self.inner.fds.counters.shrinks.load(Ordering::Relaxed) as u64,
            fd_cache_len: self.inner.fds.len() as u64,
            fd_cache_capacity: self.inner.fds.capacity() as u64,
        }
    }

    /// Stores one block. See [`Store::put_many`].
    pub fn put(&self, key: &BlockKey, data: &[u8]) -> Result<()> {
        self.put_many(&[(key.clone(), data)])
            .pop()
            .expect("one result per item")
    }

    /// Reads one block into `buf`. See [`Store::get_many`].
    pub fn get(&self, key: &BlockKey, buf: &mut [u8]) -> Result<Lookup> {
        self.get_many(std::slice::from_ref(key), &mut [buf])
            .pop()
            .expect("one result per key")
    }

    /// Stores a batch of blocks; one result per item, in order.
    ///
    /// Each block is written to a temp file in its final directory and published by `rename`,
    /// so readers see the old block or the new one, never a mix, and a failure at any point
    /// unlinks the temp file: no partial block is ever visible. An invalid key or a block over
    /// the maximum size is rejected before anything is written. An existing key is replaced.
    pub fn put_many<D: AsRef<[u8]>>(&self, items: &[(BlockKey, D)]) -> Vec<Result<()>> {
        let inner = &*self.inner;
        let mut results: Vec<Option<Result<()>>> = Vec::with_capacity(items.len());
        let mut plans: Vec<Option<WritePlan>> = Vec::with_capacity(items.len());
        for (key, data) in items {
            let data = data.as_ref();
            match inner.plan_write(key, data) {
                Ok(p) => {
                    plans.push(Some(p));
                    results.push(None);
                }
                Err(e) => {
                    plans.push(None);
                    results.push(Some(Err(e)));
                }
            }
        }

        // One engine batch with every write.
        let mut owners = Vec::with_capacity(items.len());
        let io_results = {
            let mut reqs = Vec::with_capacity(items.len());
            for (i, (plan, (_, data))) in plans.iter_mut().zip(items).enumerate() {
                let Some(p) = plan else { continue };
                let req = match &p.bounce {
                    Some(b) => IoRequest::write(p.fd.as_fd(), 0, vec![IoSlice::new(b)]),
                    None => IoRequest::write(
                        p.fd.as_fd(),
                        0,
                        vec![
                            IoSlice::new(&p.header),
                            IoSlice::new(&PADDING),
                            IoSlice::new(data.as_ref()),
                        ],
                    ),
                };
                reqs.push(req);
                owners.push(i);
            }
            inner.engine.submit(&mut reqs)
        };

        let mut dirs_to_sync: Vec<String> = Vec::new();
        for (i, io) in owners.into_iter().zip(io_results) {
            let plan = plans[i].take().expect("planned");
            let len = items[i].1.as_ref().len();
            let r = inner.publish(plan, io, len, &mut dirs_to_sync);
            results[i] = Some(r);
        }
        if inner.sync_writes {
            for d in dirs_to_sync {
                inner.sync_dir(&d);
            }
        }
        results
            .into_iter()
            .map(|r| {
                let r = r.expect("every item has a result");
                if r.is_err() {
                    Counters::add(&inner.counters.put_errors, 1);
                }
                r
            })
            .collect()
    }

    /// Reads a batch of blocks, each into the front of its buffer; one result per key, in
    /// order: `Hit(len)`, `Miss`, or an error (invalid key, buffer too small, I/O error).
    ///
    /// A missing file is a miss, never an error, even if it was deleted behind the store's back
    /// after being read before. A corrupt file (bad header, wrong length, checksum mismatch
    /// when verified) is a miss too; it is removed, counted and logged.
    pub fn get_many<B: AsMut<[u8]>>(
        &self,
        keys: &[BlockKey],
        bufs: &mut [B],
    ) -> Vec<Result<Lookup>> {
        let inner = &*self.inner;
        if keys.len() != bufs.len() {
            return keys
                .iter()
                .map(|_| {
                    Err(Error::Config(format!(
                        "get_many got {} keys and {} buffers",
                        keys.len(),
                        bufs.len()
                    )))
                })
                .collect();
        }
        let mut plans: Vec<ReadPlan> = keys
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| inner.plan_read(k, b.as_mut().len()))
            .collect();

        let mut owners = Vec::with_capacity(keys.len());
        let io_results = {
            let mut reqs = Vec::with_capacity(keys.len());
            for (i, (plan, buf)) in plans.iter_mut().zip(bufs.iter_mut()).enumerate() {
                let buf = buf.as_mut();
                let req = match plan {
                    ReadPlan::Done(_) => continue,
                    ReadPlan::Cached { block, bounce } => match bounce {
                        Some(b) => IoRequest::read(
                            block.fd.as_fd(),
                            PAYLOAD_OFFSET,
                            vec![IoSliceMut::new(b)],
                        ),
                        None => {
                            let n = block.header.payload_len as usize;
                            IoRequest::read(
                                block.fd.as_fd(),
                                PAYLOAD_OFFSET,
                                vec![IoSliceMut::new(&mut buf[..n])],
                            )
                        }
                    },
                    ReadPlan::Fresh {
                        fd,
                        head,
                        tail,
                        bounce,
                        ..
                    } => match bounce {
                        Some(b) => IoRequest::read((*fd).as_fd(), 0, vec![IoSliceMut::new(b)]),
                        None => IoRequest::read(
                            (*fd).as_fd(),
                            0,
                            vec![
                                IoSliceMut::new(head),
                                IoSliceMut::new(buf),
                                IoSliceMut::new(tail),
                            ],
                        ),
                    },
                };
                reqs.push(req);
                owners.push(i);
            }
            inner.engine.submit(&mut reqs)
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
            results[i] = Some(inner.finish_read(&keys[i], plan, bufs[i].as_mut(), io));
        }
        let c = &inner.counters;
        results
            .into_iter()
            .map(|r| {
                let r = r.expect("every key has a result");
                match &r {
                    Ok(Lookup::Hit(n)) => {
                        Counters::add(&c.hits, 1);
                        Counters::add(&c.bytes_read, *n as u64);
                    }
                    Ok(Lookup::Miss) => Counters::add(&c.misses, 1),
                    Err(_) => Counters::add(&c.read_errors, 1),
                }
                r
            })
            .collect()
    }

    /// Whether each key has a block file. Cheap (a cached descriptor or one `stat`); the
    /// contents are checked only when read, so a later `get` of a corrupt file may still miss.
    pub fn contains_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.inner.contains(k)).collect()
    }

    /// How many leading keys of a block chain are present: the question an engine asks for a
    /// request's prefix. Stops at the first absent key.
    pub fn contains_prefix(&self, keys: &[BlockKey]) -> Result<usize> {
        for (i, k) in keys.iter().enumerate() {
            if !self.inner.contains(k)? {
                return Ok(i);
            }
        }
        Ok(keys.len())
    }

    /// Removes blocks; one result per key: `true` if a block was removed, `false` if absent.
    pub fn remove_many(&self, keys: &[BlockKey]) -> Vec<Result<bool>> {
        keys.iter().map(|k| self.inner.remove(k)).collect()
    }
}

/// Reads the layout recorded in `dir`, or records `wanted` (or the default) there.
fn resolve_layout(dir: &Path, wanted: Option<Layout>) -> Result<Layout> {
    let path = dir.join(LAYOUT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found = Layout::from_file_text(&text).ok_or_else(|| Error::Corrupt {
                path: path.clone(),
                reason: format!("unreadable layout file: {text:?}"),
            })?;
            match wanted {
                Some(w) if w != found => Err(Error::LayoutMismatch {
                    path,
                    found: found.to_string(),
                    configured: w.to_string(),
                }),
                _ => Ok(found),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let l = wanted.unwrap_or_default();
            let tmp = dir.join(format!("{TEMP_PREFIX}layout.{}", std::process::id()));
            std::fs::write(&tmp, l.to_file_text()).map_err(|e| Error::from_io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| Error::from_io(&path, e))?;
            Ok(l)
        }
        Err(e) => Err(Error::from_io(&path, e)),
    }
}

impl Inner {
    fn check_key(&self, key: &BlockKey) -> Result<()> {
        if key.worker != self.worker {
            return Err(Error::invalid_key(format!(
                "key {key} belongs to worker {:?}; this store serves {:?}",
                key.worker.as_str(),
                self.worker.as_str()
            )));
        }
        Ok(())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Opens `rel` beneath the worker directory, never following a symlink anywhere on the
    /// path (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; `openat` with
    /// `O_NOFOLLOW` on kernels without `openat2`). On EMFILE/ENFILE the open-file cache
    /// shrinks and the open is retried.
    fn open_beneath(&self, rel: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let mut tries = 0;
        loop {
            let r = if self.has_openat2.load(Ordering::Relaxed) {
                match rustix::fs::openat2(
                    &self.dirfd,
                    rel,
                    flags,
                    mode,
                    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
                ) {
                    Err(Errno::NOSYS) => {
                        self.has_openat2.store(false, Ordering::Relaxed);
                        continue;
                    }
                    r => r,
                }
            } else {
                rustix::fs::openat(&self.dirfd, rel, flags, mode)
            };
            match r {
                Err(Errno::MFILE | Errno::NFILE) if tries < EMFILE_RETRIES => {
                    tries += 1;
                    if self.fds.shrink() == 0 && tries > 2 {
                        return r;
                    }
                }
                r => return r,
            }
        }
    }

    fn read_flags(&self) -> OFlags {
        if self.direct {
            OFlags::RDONLY | OFlags::DIRECT
        } else {
            OFlags::RDONLY
        }
    }

    fn plan_read(&self, key: &BlockKey, buf_len: usize) -> ReadPlan {
        if let Err(e) = self.check_key(key) {
            return ReadPlan::Done(Err(e));
        }
        if let Some(block) = self.fds.get(&key.hash) {
            // A cached descriptor may name a file that was deleted or replaced behind our
            // back: its link count is then 0, and the path is looked up again.
            match rustix::fs::fstat(&block.fd) {
                Ok(st) if st.st_nlink > 0 => {
                    Counters::add(&self.counters.fd_hits, 1);
                    let need = block.header.payload_len as usize;
                    if need > buf_len {
                        return ReadPlan::Done(Err(Error::BufferTooSmall {
                            key: key.to_string(),
                            need,
                            have: buf_len,
                        }));
                    }
                    let bounce = self.direct.then(|| AlignedBuf::zeroed(align_up(need)));
                    return ReadPlan::Cached { block, bounce };
                }
                _ => self.fds.invalidate_if(&key.hash, &block),
            }
        }
        Counters::add(&self.counters.fd_misses, 1);
        let rel = self.layout.rel_path(&key.hash);
        match self.open_beneath(rel.as_str(), self.read_flags(), Mode::empty()) {
            Ok(fd) => {
                let (head, bounce) = if self.direct {
                    (
                        Vec::new(),
                        Some(AlignedBuf::zeroed(align_up(
                            PAYLOAD_OFFSET as usize + buf_len + 1,
                        ))),
                    )
                } else {
                    (vec![0u8; PAYLOAD_OFFSET as usize], None)
                };
                ReadPlan::Fresh {
                    fd,
                    rel,
                    head,
                    tail: [0],
                    bounce,
                }
            }
            Err(Errno::NOENT | Errno::NOTDIR) => ReadPlan::Done(Ok(Lookup::Miss)),
            Err(Errno::LOOP | Errno::XDEV) => {
                tracing::warn!(path = %self.path(rel.as_str()).display(), "symlink in the tree: not followed, counted as a miss");
                Counters::add(&self.counters.foreign, 1);
                ReadPlan::Done(Ok(Lookup::Miss))
            }
            Err(e) => ReadPlan::Done(Err(Error::from_io(self.path(rel.as_str()), io_err(e)))),
        }
    }

    fn finish_read(
        &self,
        key: &BlockKey,
        plan: ReadPlan,
        buf: &mut [u8],
        io: std::io::Result<usize>,
    ) -> Result<Lookup> {
        match plan {
            ReadPlan::Done(r) => r,
            ReadPlan::Cached { block, bounce } => {
                let rel = self.layout.rel_path(&key.hash);
                let n = io.map_err(|e| Error::from_io(self.path(rel.as_str()), e))?;
                let len = block.header.payload_len as usize;
                if n != len {
                    return Ok(self.corrupt(
                        &rel,
                        &block.fd,
                        Some(&block),
                        format!("payload is {n} bytes, header says {len}"),
                    ));
                }
                if let Some(b) = bounce {
                    buf[..len].copy_from_slice(&b[..len]);
                }
                let check = match self.verify {
                    VerifyMode::Always => true,
                    VerifyMode::Never => false,
                    VerifyMode::OnOpen => !block.verified.load(Ordering::Relaxed),
                };
                if check {
                    if !block.header.verify(&buf[..len]) {
                        return Ok(self.corrupt(
                            &rel,
                            &block.fd,
                            Some(&block),
                            "payload checksum mismatch".into(),
                        ));
                    }
                    block.verified.store(true, Ordering::Relaxed);
                }
                Ok(Lookup::Hit(len))
            }
            ReadPlan::Fresh {
                fd,
                rel,
                head,
                tail,
                bounce,
            } => {
                let n = io.map_err(|e| Error::from_io(self.path(rel.as_str()), e))?;
                let head_bytes: &[u8] = match &bounce {
                    Some(b) => &b[..n.min(PAYLOAD_OFFSET as usize)],
                    None => &head[..n.min(PAYLOAD_OFFSET as usize)],
                };
                let header = match Header::decode(head_bytes) {
                    Ok(h) => h,
                    Err(e) => return Ok(self.corrupt(&rel, &fd, None, e.to_string())),
                };
                if head_bytes.len() < PAYLOAD_OFFSET as usize
                    || head_bytes[HEADER_LEN..].iter().any(|&b| b != 0)
                {
                    return Ok(self.corrupt(&rel, &fd, None, "header padding is not zero".into()));
                }
                if header.key != key.hash {
                    return Ok(self.corrupt(
                        &rel,
                        &fd,
                        None,
                        format!("header names block {}", header.key),
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
                        &rel,
                        &fd,
                        None,
                        format!(
                            "file is {}{} bytes, header says {expect}",
                            if n > expect { "over " } else { "" },
                            n
                        ),
                    ));
                }
                if let Some(b) = &bounce {
                    buf[..len].copy_from_slice(&b[PAYLOAD_OFFSET as usize..expect]);
                }
                let verified = self.verify != VerifyMode::Never;
                if verified && !header.verify(&buf[..len]) {
                    return Ok(self.corrupt(&rel, &fd, None, "payload checksum mismatch".into()));
                }
                self.fds.insert(
                    key.hash,
                    Arc::new(OpenBlock {
                        fd,
                        header,
                        verified: AtomicBool::new(verified),
                    }),
                );
                Ok(Lookup::Hit(len))
            }
        }
    }

    /// Handles a corrupt file: removes it if the path still names the same file, counts it,
    /// logs it, and reports a miss.
    fn corrupt(
        &self,
        rel: &RelPath,
        fd: &OwnedFd,
        cached: Option<&Arc<OpenBlock>>,
        reason: String,
    ) -> Lookup {
        let path = self.path(rel.as_str());
        tracing::warn!(path = %path.display(), %reason, "corrupt block file: removed, counted as a miss");
        Counters::add(&self.counters.corrupt, 1);
        if let Some(b) = cached {
            self.fds.invalidate_if(&b.header.key, b);
        }
        if let (Ok(open), Ok(named)) = (
            rustix::fs::fstat(fd),
            rustix::fs::statat(&self.dirfd, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW),
        ) {
            // Only remove what we read: a concurrent put may have published a good block.
            if open.st_ino == named.st_ino && open.st_dev == named.st_dev {
                if let Err(e) = rustix::fs::unlinkat(&self.dirfd, rel.as_str(), AtFlags::empty()) {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove corrupt block file");
                }
            }
        }
        Lookup::Miss
    }

    fn plan_write(&self, key: &BlockKey, data: &[u8]) -> Result<WritePlan> {
        self.check_key(key)?;
        if data.len() > self.max_block {
            return Err(Error::TooLarge {
                key: key.to_string(),
                len: data.len(),
                max: self.max_block,
            });
        }
        let header = Header::for_payload(key.hash, data).encode();
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
        let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
        if self.direct {
            flags |= OFlags::DIRECT;
        }
        let mode = Mode::from_raw_mode(FILE_MODE);
        let fd = match self.open_beneath(&temp_rel, flags, mode) {
            Err(Errno::NOENT) => {
                self.make_dirs(rel.dir())?;
                self.open_beneath(&temp_rel, flags, mode)
            }
            r => r,
        }
        .map_err(|e| Error::from_io(self.path(&temp_rel), io_err(e)))?;
        let bounce = self.direct.then(|| {
            let total = PAYLOAD_OFFSET as usize + data.len();
            let mut b = AlignedBuf::zeroed(align_up(total));
            b[..HEADER_LEN].copy_from_slice(&header);
            b[PAYLOAD_OFFSET as usize..total].copy_from_slice(data);
            b
        });
        Ok(WritePlan {
            rel,
            temp_rel,
            fd,
            header,
            bounce,
        })
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

    /// Completes one write: checks the engine's result, sizes and syncs the file, renames it
    /// into place; on any failure unlinks the temp file.
    fn publish(
        &self,
        plan: WritePlan,
        io: std::io::Result<usize>,
        len: usize,
        dirs_to_sync: &mut Vec<String>,
    ) -> Result<()> {
        let temp_path = || self.path(&plan.temp_rel);
        let outcome = (|| -> Result<()> {
            let n = io.map_err(|e| Error::from_io(temp_path(), e))?;
            let total = PAYLOAD_OFFSET as usize + len;
            if plan.bounce.is_some() {
                if n != align_up(total) {
                    return Err(Error::from_io(
                        temp_path(),
                        std::io::ErrorKind::WriteZero.into(),
                    ));
                }
                rustix::fs::ftruncate(&plan.fd, total as u64)
                    .map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
            } else if n != total {
                return Err(Error::from_io(
                    temp_path(),
                    std::io::ErrorKind::WriteZero.into(),
                ));
            }
            if self.sync_writes {
                rustix::fs::fdatasync(&plan.fd)
                    .map_err(|e| Error::from_io(temp_path(), io_err(e)))?;
            }
            rustix::fs::renameat(
                &self.dirfd,
                plan.temp_rel.as_str(),
                &self.dirfd,
                plan.rel.as_str(),
            )
            .map_err(|e| Error::from_io(self.path(plan.rel.as_str()), io_err(e)))?;
            Ok(())
        })();
        let hash = plan.header_key();
        drop(plan.fd);
        match outcome {
            Ok(()) => {
                // The old file (if any) is unlinked: drop its cached descriptor.
                self.fds.invalidate(&hash);
                Counters::add(&self.counters.puts, 1);
                Counters::add(&self.counters.bytes_written, len as u64);
                if self.sync_writes && !dirs_to_sync.iter().any(|d| d == plan.rel.dir()) {
                    dirs_to_sync.push(plan.rel.dir().to_string());
                }
                Ok(())
            }
            Err(e) => {
                if let Err(ue) =
                    rustix::fs::unlinkat(&self.dirfd, plan.temp_rel.as_str(), AtFlags::empty())
                {
                    if ue != Errno::NOENT {
                        tracing::warn!(path = %temp_path().display(), error = %ue, "could not unlink temp file after a failed put");
                    }
                }
                tracing::debug!(error = %e, "put failed; temp file unlinked");
                Err(e)
            }
        }
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

    fn contains(&self, key: &BlockKey) -> Result<bool> {
        self.check_key(key)?;
        if let Some(block) = self.fds.get(&key.hash) {
            if rustix::fs::fstat(&block.fd).is_ok_and(|st| st.st_nlink > 0) {
                return Ok(true);
            }
            self.fds.invalidate_if(&key.hash, &block);
        }
        let rel = self.layout.rel_path(&key.hash);
        match rustix::fs::statat(&self.dirfd, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::RegularFile
                && st.st_size as u64 >= PAYLOAD_OFFSET),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(false),
            Err(e) => Err(Error::from_io(self.path(rel.as_str()), io_err(e))),
        }
    }

    fn remove(&self, key: &BlockKey) -> Result<bool> {
        self.check_key(key)?;
        let rel = self.layout.rel_path(&key.hash);
        let r = rustix::fs::unlinkat(&self.dirfd, rel.as_str(), AtFlags::empty());
        self.fds.invalidate(&key.hash);
        match r {
            Ok(()) => {
                Counters::add(&self.counters.removes, 1);
                Ok(true)
            }
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(false),
            Err(e) => Err(Error::from_io(self.path(rel.as_str()), io_err(e))),
        }
    }
}

impl WritePlan {
    fn header_key(&self) -> BlockHash {
        BlockHash(self.header[64..96].try_into().expect("32 bytes"))
    }
}
