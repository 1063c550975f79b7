//! How I/O is submitted: the [`IoEngine`] trait and its implementations.
//!
//! The store decides *which file and where*; an engine moves the bytes. A call hands an engine
//! a whole batch of requests (the reads of one `get_many`), or a stream of them that it pulls
//! one at a time (the writes of one `put_many`), and returns when every request has
//! completed, with one result per request in order. Because the call
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

#[cfg(any(test, feature = "testing"))]
pub(crate) mod fault;
#[cfg(feature = "nixl")]
pub mod nixl;
mod psync;
mod uring;

pub use psync::PsyncEngine;
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
    /// For a host read, where the engine may hand the bytes as they land (see [`Feed`]).
    pub feed: Option<Feed<'a>>,
}

/// A read's receiver of its bytes as they land, so that the caller can hash each piece while
/// it is still in the CPU's cache instead of reading the whole buffer again afterwards.
///
/// An engine may ignore it. One that uses it passes every byte the read transfers, once each,
/// in file order, in pieces of its choosing, before `submit` returns (the psync engine: after
/// each `preadv` of up to [`FEED_CHUNK`] bytes). The caller counts what it was fed and treats a
/// count short of the read's as "not fed".
pub struct Feed<'a>(pub &'a mut (dyn Landed + Send));

/// What a [`Feed`] hands a read's bytes to.
pub trait Landed {
    /// The next bytes of the read, in file order, just landed in the read's buffers.
    fn landed(&mut self, bytes: &[u8]);
}

impl fmt::Debug for Feed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Feed")
    }
}

/// The most bytes the psync engine reads before it feeds them to a [`Feed`]: a piece that
/// stays in a core's L2 cache, measured (2 MiB blocks, XXH3-128: pieces of 32 KiB to
/// 512 KiB within 0.80-0.83x of a plain read; docs/benchmarks.md, "Verified prefix loads").
pub const FEED_CHUNK: usize = 256 * 1024;

impl<'a> IoRequest<'a> {
    /// A read of `bufs` at `offset`.
    pub fn read(fd: BorrowedFd<'a>, offset: u64, bufs: Vec<IoSliceMut<'a>>) -> Self {
        IoRequest {
            fd,
            offset,
            kind: IoKind::Read(bufs),
            cached: false,
            file_len: None,
            feed: None,
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
            feed: None,
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
            feed: None,
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
            feed: None,
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

    /// Hands the read's bytes to `feed` as they land, where the engine can (see [`Feed`]).
    pub fn feeding(mut self, feed: &'a mut (dyn Landed + Send)) -> Self {
        self.feed = Some(Feed(feed));
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

    /// Runs the requests `stream` yields, one result per request in the order pulled; the same
    /// contract as [`IoEngine::submit`]. The engine pulls requests lazily and may start each
    /// as soon as it is pulled, so that the caller makes the next request (creates its file,
    /// hashes its payload) while earlier ones are in flight: a put batch streams through the
    /// engine instead of waiting for its last file before its first write. Every pulled
    /// request's borrows live for `'a`, past the call. The default pulls every request, then
    /// runs them as one batch.
    fn submit_stream<'a>(
        &self,
        stream: &mut dyn Iterator<Item = IoRequest<'a>>,
    ) -> Vec<io::Result<usize>> {
        let mut batch: Vec<IoRequest<'a>> = stream.collect();
        self.submit(&mut batch)
    }

    /// True when two threads may run [`IoEngine::submit`] at once, each at the speed it would
    /// have alone (the psync engine: each call is its caller's own system calls), so that a
    /// store may split a large batch between threads. The default is false.
    fn concurrent_submits(&self) -> bool {
        false
    }

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
    contract_broken(engine, results.len(), n)
}

/// One error per request (`n` of them) for an engine that returned `got` results.
fn contract_broken(engine: &dyn IoEngine, got: usize, n: usize) -> Vec<io::Result<usize>> {
    tracing::error!(
        engine = engine.name(),
        results = got,
        requests = n,
        "engine broke its contract: result count differs from request count"
    );
    (0..n)
        .map(|_| {
            Err(io::Error::other(format!(
                "engine {} returned {got} results for {n} requests",
                engine.name()
            )))
        })
        .collect()
}

/// [`IoEngine::submit_stream`] held to the same rule as [`submit_checked`]: an engine that
/// returns another number of results than the requests it pulled fails them all (and the
/// requests it never pulled are pulled here, so that the caller sees every one of them made).
pub(crate) fn submit_stream_checked(
    engine: &dyn IoEngine,
    stream: &mut dyn Iterator<Item = IoRequest<'_>>,
) -> Vec<io::Result<usize>> {
    let mut n = 0usize;
    let results = engine.submit_stream(&mut (&mut *stream).inspect(|_| n += 1));
    let left = stream.count();
    if results.len() == n && left == 0 {
        return results;
    }
    contract_broken(engine, results.len(), n + left)
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
    /// NIXL: GPU buffer registrations kept between transfers (0: each transfer registers its
    /// GPU buffers and drops them; see `NixlConfig::gpu_registrations_kept`, feature `nixl`).
    pub nixl_gpu_registrations_kept: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            queue_depth: DEFAULT_QUEUE_DEPTH,
            nixl_posix_queue: PosixQueue::Default,
            nixl_lib_dir: None,
            nixl_gpu_registrations_kept: 0,
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
                gpu_registrations_kept: opts.nixl_gpu_registrations_kept,
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
mod stream_checks {
    use super::*;
    use std::os::fd::AsFd;

    /// Runs its inner psync engine on the first `pull` requests of a stream, then returns
    /// their results with `extra` more (negative: fewer).
    #[derive(Debug)]
    struct Broken {
        pull: usize,
        extra: isize,
    }

    impl IoEngine for Broken {
        fn name(&self) -> &'static str {
            "broken"
        }
        fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
            PsyncEngine::new().submit(batch)
        }
        fn submit_stream<'a>(
            &self,
            stream: &mut dyn Iterator<Item = IoRequest<'a>>,
        ) -> Vec<io::Result<usize>> {
            let mut batch: Vec<IoRequest<'a>> = stream.take(self.pull).collect();
            let mut out = self.submit(&mut batch);
            match self.extra {
                e if e < 0 => out.truncate(out.len().saturating_sub(e.unsigned_abs())),
                e => out.extend((0..e).map(|_| Ok(1))),
            }
            out
        }
    }

    /// (results, requests pulled, how many results are errors) for a stream of 5 writes.
    fn run(engine: &dyn IoEngine) -> (usize, usize, usize) {
        let f = tempfile::tempfile().unwrap();
        let mut pulled = 0;
        let mut stream = (0..5).map(|i| {
            pulled += 1;
            IoRequest::write(f.as_fd(), i * 10, vec![IoSlice::new(b"0123456789")])
        });
        let res = submit_stream_checked(engine, &mut stream);
        drop(stream);
        let errs = res.iter().filter(|r| r.is_err()).count();
        (res.len(), pulled, errs)
    }

    #[test]
    fn a_stream_answered_in_full_passes_through() {
        assert_eq!(run(&Broken { pull: 5, extra: 0 }), (5, 5, 0));
        assert_eq!(run(&PsyncEngine::new()), (5, 5, 0));
    }

    #[test]
    fn a_stream_answered_with_a_wrong_count_fails_every_request() {
        // One result short, one too many.
        assert_eq!(run(&Broken { pull: 5, extra: -1 }), (5, 5, 5));
        assert_eq!(run(&Broken { pull: 5, extra: 1 }), (5, 5, 5));
        // Two requests pulled and answered, three never pulled: all five made, all failed;
        // and so when the answers happen to number five.
        assert_eq!(run(&Broken { pull: 2, extra: 0 }), (5, 5, 5));
        assert_eq!(run(&Broken { pull: 2, extra: 3 }), (5, 5, 5));
    }

    /// A request that feeds shows it in its debug form (the closure itself has none).
    #[test]
    fn a_feeding_request_says_so_when_printed() {
        struct Count(usize);
        impl Landed for Count {
            fn landed(&mut self, bytes: &[u8]) {
                self.0 += bytes.len();
            }
        }
        let f = tempfile::tempfile().unwrap();
        let mut buf = [0u8; 4];
        let mut count = Count(0);
        let r = IoRequest::read(f.as_fd(), 0, vec![IoSliceMut::new(&mut buf)]).feeding(&mut count);
        assert!(format!("{r:?}").contains("feed: Some(Feed)"), "{r:?}");
        let plain = IoRequest::read(f.as_fd(), 0, vec![]);
        assert!(format!("{plain:?}").contains("feed: None"), "{plain:?}");
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
        stream_results_in_pull_order(engine);
    }

    /// `submit_stream`: one result per pulled request, in order, every write done when it
    /// returns; an error stays with its request.
    fn stream_results_in_pull_order(engine: &dyn IoEngine) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        std::fs::write(&p, b"x").unwrap();
        let ro = File::open(&p).unwrap();
        let files: Vec<File> = (0..40).map(|_| tempfile::tempfile().unwrap()).collect();
        let datas: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 3000 + 17 * i]).collect();
        let mut pulled = 0;
        let mut stream = files.iter().zip(&datas).enumerate().map(|(i, (f, d))| {
            pulled += 1;
            let fd = if i == 7 { ro.as_fd() } else { f.as_fd() };
            IoRequest::write(fd, 5, vec![IoSlice::new(&d[..1]), IoSlice::new(&d[1..])])
        });
        let res = engine.submit_stream(&mut stream);
        drop(stream);
        assert_eq!((res.len(), pulled), (40, 40));
        for (i, ((r, f), d)) in res.iter().zip(&files).zip(&datas).enumerate() {
            if i == 7 {
                assert!(r.is_err(), "the write to a read-only descriptor failed");
                continue;
            }
            assert_eq!(*r.as_ref().unwrap(), d.len(), "request {i}");
            let mut back = vec![0u8; d.len()];
            rustix::io::pread(f, &mut back, 5).unwrap();
            assert_eq!(&back, d, "request {i}'s bytes");
        }
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
