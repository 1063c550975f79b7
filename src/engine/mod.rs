//! How I/O is submitted: the [`IoEngine`] trait and its implementations.
//!
//! The store decides *which file and where*; an engine moves the bytes. A call hands an engine
//! a whole batch of requests (the reads or writes of one `get_many`/`put_many`) and returns
//! when every request has completed, with one result per request in order. Because the call
//! does not return before completion, buffers are borrowed for its duration: an engine that
//! submits asynchronously (io_uring, NIXL) may hand their addresses to the kernel or to a
//! transfer library and must have reaped every completion before it returns. Async callers
//! reach engines through the store's async API, which moves owned buffers to a blocking thread
//! and hands them back with the result.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::BorrowedFd;
use std::str::FromStr;
use std::sync::Arc;

use crate::buf::DeviceMem;
use crate::error::Error;

mod fault;
#[cfg(feature = "nixl")]
pub mod nixl;
mod psync;
mod uring;

pub use fault::{FaultPlan, FaultyEngine};
pub use psync::PsyncEngine;
pub(crate) use psync::write_full;
pub use uring::{DEFAULT_QUEUE_DEPTH, UringEngine};

/// What one request does.
#[derive(Debug)]
pub enum IoKind<'a> {
    /// Fill these buffers, in order, from consecutive file bytes.
    Read(Vec<IoSliceMut<'a>>),
    /// Write these buffers, in order, to consecutive file bytes.
    Write(Vec<IoSlice<'a>>),
    /// Fill this GPU memory from consecutive file bytes (engines whose
    /// [`IoEngine::moves_device_memory`] is true; the others fail the request).
    ReadDevice(DeviceMem),
    /// Write this GPU memory to consecutive file bytes (as `ReadDevice`).
    WriteDevice(DeviceMem),
}

/// One positioned, vectored transfer on one open file.
#[derive(Debug)]
pub struct IoRequest<'a> {
    /// The open file (from the store's open-file cache, or freshly opened).
    pub fd: BorrowedFd<'a>,
    /// File offset of the first byte.
    pub offset: u64,
    /// Read or write, and the buffers.
    pub kind: IoKind<'a>,
    /// True when the descriptor stays open after the batch (it comes from the store's
    /// open-file cache): an engine may keep per-file state for it, such as a registration,
    /// until [`IoEngine::forget_file`].
    pub cached: bool,
    /// The file's length when the store knows it (a cached, validated block file), so an
    /// engine that must not read past the end of a file need not look it up.
    pub file_len: Option<u64>,
}

impl<'a> IoRequest<'a> {
    /// A read of `bufs` at `offset`.
    pub fn read(fd: BorrowedFd<'a>, offset: u64, bufs: Vec<IoSliceMut<'a>>) -> Self {
        IoRequest {
            fd,
            offset,
            kind: IoKind::Read(bufs),
            cached: false,
            file_len: None,
        }
    }

    /// A write of `bufs` at `offset`.
    pub fn write(fd: BorrowedFd<'a>, offset: u64, bufs: Vec<IoSlice<'a>>) -> Self {
        IoRequest {
            fd,
            offset,
            kind: IoKind::Write(bufs),
            cached: false,
            file_len: None,
        }
    }

    /// A read into GPU memory at `offset`.
    pub fn read_device(fd: BorrowedFd<'a>, offset: u64, mem: DeviceMem) -> Self {
        IoRequest {
            fd,
            offset,
            kind: IoKind::ReadDevice(mem),
            cached: false,
            file_len: None,
        }
    }

    /// A write from GPU memory at `offset`.
    pub fn write_device(fd: BorrowedFd<'a>, offset: u64, mem: DeviceMem) -> Self {
        IoRequest {
            fd,
            offset,
            kind: IoKind::WriteDevice(mem),
            cached: false,
            file_len: None,
        }
    }

    /// True for a write (host or device memory).
    pub fn is_write(&self) -> bool {
        matches!(self.kind, IoKind::Write(_) | IoKind::WriteDevice(_))
    }

    /// Marks the descriptor as one the store keeps open (see [`IoRequest::cached`]).
    pub fn on_cached_file(mut self) -> Self {
        self.cached = true;
        self
    }

    /// Records the file's length (see [`IoRequest::file_len`]).
    pub fn with_file_len(mut self, len: u64) -> Self {
        self.file_len = Some(len);
        self
    }

    /// Total bytes the request asks for.
    pub fn len(&self) -> usize {
        match &self.kind {
            IoKind::Read(b) => b.iter().map(|s| s.len()).sum(),
            IoKind::Write(b) => b.iter().map(|s| s.len()).sum(),
            IoKind::ReadDevice(m) | IoKind::WriteDevice(m) => m.len(),
        }
    }

    /// True when the request moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Moves bytes between memory and open files, a batch at a time.
///
/// Contract, for every engine:
/// - `submit` returns exactly one result per request, in request order, and only after every
///   request has completed (buffers are borrowed, not owned, for that reason);
/// - a read transfers until its buffers are full or the file ends and returns the byte count
///   (short only at end of file);
/// - a write transfers every byte or returns an error; after an error, how many bytes reached
///   the file is unspecified (the store unlinks the file);
/// - `EINTR` and short transfers are retried inside the engine, never surfaced.
pub trait IoEngine: Send + Sync + fmt::Debug {
    /// The engine's name, as `--ioengine` spells it.
    fn name(&self) -> &'static str;

    /// Runs a batch; see the trait's contract.
    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>>;

    /// True when the engine can move GPU memory ([`IoKind::ReadDevice`] and
    /// [`IoKind::WriteDevice`]); the default is false, and such requests fail with
    /// [`device_unsupported`].
    fn moves_device_memory(&self) -> bool {
        false
    }

    /// The store is about to close a descriptor it had cached (evicted from its open-file
    /// cache): drop any per-file state kept for it. The default keeps none.
    fn forget_file(&self, fd: BorrowedFd<'_>) {
        let _ = fd;
    }
}

/// Runs `batch` on `engine` and holds it to the contract's first rule: an engine that returns
/// a different number of results than requests fails the whole batch (which results belong
/// to which requests is unknown), so the store discards every write and releases every
/// reservation instead of panicking.
pub(crate) fn submit_checked(
    engine: &dyn IoEngine,
    batch: &mut [IoRequest<'_>],
) -> Vec<io::Result<usize>> {
    let n = batch.len();
    let results = engine.submit(batch);
    if results.len() == n {
        return results;
    }
    tracing::error!(
        engine = engine.name(),
        results = results.len(),
        requests = n,
        "engine broke its contract: result count differs from request count"
    );
    (0..n)
        .map(|_| {
            Err(io::Error::other(format!(
                "engine {} returned {} results for {n} requests",
                engine.name(),
                results.len()
            )))
        })
        .collect()
}

/// The error of a device-memory request given to an engine that moves host memory only.
pub fn device_unsupported(engine: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "the {engine} engine moves host memory only; GPU memory needs the nixl engine \
             (NIXL's GDS backends)"
        ),
    )
}

/// The engines that can be chosen by configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineKind {
    /// `pread`/`pwrite` (vectored) from the calling thread.
    #[default]
    Psync,
    /// io_uring, one ring per submitting thread; fails to build where the kernel refuses io_uring.
    IoUring,
    /// io_uring where the kernel allows it, else psync (with one warning).
    Auto,
    /// NIXL's POSIX backend (needs the `nixl` feature and the NIXL library at run time).
    Nixl,
}

/// The queue NIXL's POSIX backend submits through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PosixQueue {
    /// NIXL's choice (libaio in NIXL 1.5).
    #[default]
    Default,
    /// Linux native AIO (libaio): backend parameter `use_aio`.
    Libaio,
    /// io_uring (liburing): `use_uring`. NIXL 1.5 can report a failed transfer on this queue
    /// while other I/Os of it still run, and offers no way to wait for them: the engine then
    /// aborts the process rather than return with I/O in flight into borrowed buffers. For
    /// benchmarks; libaio reports failures only once a transfer has drained.
    Uring,
    /// POSIX AIO (glibc's threads): `use_posix_aio`. As `Uring`: a failed transfer aborts.
    PosixAio,
}

impl PosixQueue {
    /// The backend parameter that selects this queue, if any.
    pub fn backend_param(self) -> Option<&'static str> {
        match self {
            PosixQueue::Default => None,
            PosixQueue::Libaio => Some("use_aio"),
            PosixQueue::Uring => Some("use_uring"),
            PosixQueue::PosixAio => Some("use_posix_aio"),
        }
    }
}

impl FromStr for PosixQueue {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "default" => Ok(PosixQueue::Default),
            "libaio" | "aio" => Ok(PosixQueue::Libaio),
            "uring" | "io_uring" => Ok(PosixQueue::Uring),
            "posix-aio" | "posix_aio" => Ok(PosixQueue::PosixAio),
            _ => Err(Error::Config(format!(
                "unknown NIXL POSIX queue {s:?}; available: default, libaio, uring, posix-aio"
            ))),
        }
    }
}

impl fmt::Display for PosixQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PosixQueue::Default => "default",
            PosixQueue::Libaio => "libaio",
            PosixQueue::Uring => "uring",
            PosixQueue::PosixAio => "posix-aio",
        })
    }
}

/// Settings of the engines beyond which one is chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineOptions {
    /// io_uring: the ring's depth, the bound on I/Os in flight per submitting thread (default
    /// [`DEFAULT_QUEUE_DEPTH`]). A larger batch streams through this many slots.
    pub queue_depth: u32,
    /// NIXL: the POSIX backend's queue.
    pub nixl_posix_queue: PosixQueue,
    /// NIXL: the directory of `libnixl_capi.so` (default: `$TIERKV_NIXL_DIR`, then
    /// `.nixl/lib`, then the loader's search path).
    pub nixl_lib_dir: Option<std::path::PathBuf>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            queue_depth: DEFAULT_QUEUE_DEPTH,
            nixl_posix_queue: PosixQueue::Default,
            nixl_lib_dir: None,
        }
    }
}

impl EngineKind {
    /// Builds the engine with default options.
    pub fn build(self) -> Result<Arc<dyn IoEngine>, Error> {
        self.build_with(&EngineOptions::default())
    }

    /// Builds the engine.
    pub fn build_with(self, opts: &EngineOptions) -> Result<Arc<dyn IoEngine>, Error> {
        if opts.queue_depth == 0 {
            return Err(Error::Config(
                "the engine queue depth must be at least 1".into(),
            ));
        }
        match self {
            EngineKind::Psync => Ok(Arc::new(PsyncEngine::new())),
            EngineKind::IoUring => UringEngine::new(opts.queue_depth)
                .map(|e| Arc::new(e) as Arc<dyn IoEngine>)
                .map_err(|e| {
                    Error::Config(format!(
                        "io_uring is not available here ({e}); choose the psync engine, or auto"
                    ))
                }),
            #[cfg(feature = "nixl")]
            EngineKind::Nixl => Ok(Arc::new(nixl::NixlEngine::new(&nixl::NixlConfig {
                lib_dir: opts.nixl_lib_dir.clone(),
                posix_queue: opts.nixl_posix_queue,
            })?)),
            #[cfg(not(feature = "nixl"))]
            EngineKind::Nixl => Err(Error::Config(
                "this build has no NIXL engine: rebuild with --features nixl".into(),
            )),
            EngineKind::Auto => match UringEngine::new(opts.queue_depth) {
                Ok(e) => Ok(Arc::new(e)),
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring refused by the kernel: using psync");
                    Ok(Arc::new(PsyncEngine::new()))
                }
            },
        }
    }
}

impl FromStr for EngineKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "psync" => Ok(EngineKind::Psync),
            "io_uring" | "uring" => Ok(EngineKind::IoUring),
            "auto" => Ok(EngineKind::Auto),
            "nixl" => Ok(EngineKind::Nixl),
            _ => Err(Error::Config(format!(
                "unknown I/O engine {s:?}; available: psync, io_uring, auto, nixl"
            ))),
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Psync => "psync",
            EngineKind::IoUring => "io_uring",
            EngineKind::Auto => "auto",
            EngineKind::Nixl => "nixl",
        })
    }
}

#[cfg(test)]
pub(crate) mod contract {
    //! The contract every engine passes; each engine's tests call [`run_all`].
    use super::*;
    use std::fs::File;
    use std::os::fd::AsFd;

    pub(crate) fn run_all(engine: &dyn IoEngine) {
        round_trip_batch(engine);
        short_read_at_eof(engine);
        bad_fd_is_an_error(engine);
    }

    fn round_trip_batch(engine: &dyn IoEngine) {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<File> = (0..5)
            .map(|i| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(dir.path().join(i.to_string()))
                    .unwrap()
            })
            .collect();
        let datas: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8 + 1; 1000 * (i + 1)]).collect();
        let head = [0xAAu8; 7];
        let mut reqs: Vec<IoRequest<'_>> = files
            .iter()
            .zip(&datas)
            .map(|(f, d)| {
                IoRequest::write(f.as_fd(), 3, vec![IoSlice::new(&head), IoSlice::new(d)])
            })
            .collect();
        let res = engine.submit(&mut reqs);
        drop(reqs);
        for (r, d) in res.iter().zip(&datas) {
            assert_eq!(*r.as_ref().unwrap(), 7 + d.len());
        }
        let mut outs: Vec<Vec<u8>> = datas.iter().map(|d| vec![0u8; d.len()]).collect();
        let mut heads = vec![[0u8; 7]; 5];
        let mut reqs: Vec<IoRequest<'_>> = files
            .iter()
            .zip(outs.iter_mut().zip(heads.iter_mut()))
            .map(|(f, (o, h))| {
                IoRequest::read(f.as_fd(), 3, vec![IoSliceMut::new(h), IoSliceMut::new(o)])
            })
            .collect();
        let res = engine.submit(&mut reqs);
        drop(reqs);
        for ((r, d), (o, h)) in res.iter().zip(&datas).zip(outs.iter().zip(&heads)) {
            assert_eq!(*r.as_ref().unwrap(), 7 + d.len());
            assert_eq!(o, d);
            assert_eq!(h, &head);
        }
    }

    fn short_read_at_eof(engine: &dyn IoEngine) {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &[5u8; 100]).unwrap();
        let mut a = [0u8; 60];
        let mut b = [0u8; 60];
        let mut reqs = vec![IoRequest::read(
            f.as_fd(),
            10,
            vec![IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
        )];
        let res = engine.submit(&mut reqs);
        assert_eq!(*res[0].as_ref().unwrap(), 90);
        drop(reqs);
        assert_eq!(a, [5u8; 60]);
        assert_eq!(&b[..30], &[5u8; 30]);
        assert_eq!(&b[30..], &[0u8; 30]);
    }

    fn bad_fd_is_an_error(engine: &dyn IoEngine) {
        // A read-only file refuses writes: the error comes back per request.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        std::fs::write(&p, b"x").unwrap();
        let ro = File::open(&p).unwrap();
        let rw = tempfile::tempfile().unwrap();
        let mut reqs = vec![
            IoRequest::write(ro.as_fd(), 0, vec![IoSlice::new(b"abc")]),
            IoRequest::write(rw.as_fd(), 0, vec![IoSlice::new(b"abc")]),
        ];
        let res = engine.submit(&mut reqs);
        assert_eq!(res.len(), 2);
        assert!(res[0].is_err());
        assert_eq!(*res[1].as_ref().unwrap(), 3);
    }
}
