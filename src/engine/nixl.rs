//! The NIXL engine: bytes move through NIXL's POSIX backend (DRAM <-> FILE), with transfer
//! descriptors built on demand for each batch. The library is loaded at run time (nixl-sys's
//! stub/dlopen mode); when it is absent, building this engine fails with instructions, and
//! nothing else in the process is affected.
//!
//! GPU memory ([`IoKind::ReadDevice`], [`IoKind::WriteDevice`]) moves through NIXL's GDS_MT
//! backend (else GDS; NIXL allows one of the two per agent), created on the first such
//! request: VRAM descriptors carry the CUDA device index, transfers are pinned to that
//! backend; a file a GPU transfer uses is registered with both backends (a deregistration
//! removes a file from every backend), others with POSIX alone. Host buffers stay on POSIX.
//!
//! Per batch: one FILE registration per distinct descriptor (offset 0 to the furthest byte the
//! batch asks of it, the fd as device id; kept while the descriptor is in the open-file
//! cache), one DRAM registration per buffer segment, one descriptor pair per segment, one
//! transfer request per direction, posted and polled to completion. Reads are clamped to
//! the file's length first (NIXL reports no byte counts), so a read that reaches the end of a
//! file is short exactly as with the other engines.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nixl_sys::{
    Agent, Backend, MemType, MemoryRegion, NixlDescriptor, OptArgs, RegistrationHandle,
    XferDescList, XferOp, XferStatus,
};

use super::{IoEngine, IoKind, IoRequest};
use crate::error::Error;

/// Environment variable naming the directory that holds `libnixl_capi.so`.
pub const NIXL_DIR_ENV: &str = "TIERKV_NIXL_DIR";

/// Where the caller's buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferLocation {
    /// Host memory: the POSIX backend.
    Dram,
    /// GPU memory of CUDA device `device`: the GDS / GDS_MT backends.
    Vram {
        /// CUDA device index.
        device: u64,
    },
}

/// How to build the NIXL engine.
#[derive(Clone, Debug, Default)]
pub struct NixlConfig {
    /// Directory of `libnixl_capi.so` (default: `$TIERKV_NIXL_DIR`, then `.nixl/lib` under the
    /// current directory, then the dynamic loader's search path).
    pub lib_dir: Option<PathBuf>,
    /// The POSIX backend's queue.
    pub posix_queue: super::PosixQueue,
    /// GPU buffer registrations kept between transfers, least recently used dropped first
    /// (default 0: each transfer registers its GPU buffers and drops them). Registering a
    /// GPU buffer and dropping it cost about 6 ms (cuFile compat mode on an H200,
    /// docs/io-engines.md), so a batch of 32 blocks spent 0.2 s on them; kept, a read into a
    /// buffer seen before (same address, length and device) registers nothing. Only for GPU
    /// buffers that stay allocated while the engine lives (an engine's KV pool, which
    /// NIXL's own users register once): before such a buffer is freed, its registration
    /// must be dropped with [`NixlEngine::forget_gpu_registrations`].
    pub gpu_registrations_kept: usize,
}

/// One transfer descriptor: (address or file offset, length, device id).
pub type Desc = (usize, usize, u64);

/// The descriptors of one transfer: pairs of local memory and remote FILE descriptors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferPlan {
    /// Local side (DRAM, or VRAM for GDS): buffer address, length, device id.
    pub local: Vec<Desc>,
    /// Remote side (FILE): file offset, length, fd.
    pub remote: Vec<Desc>,
    /// Bytes each request moves.
    pub bytes: Vec<usize>,
    /// Per request: the file region to register, from offset 0 to the end of what is asked,
    /// and whether its registration is kept for later batches.
    pub file_extent: Vec<(RawFd, usize, bool)>,
    /// `O_DIRECT` reads whose last aligned block crosses the end of the file: NIXL fails a
    /// short transfer, so these (fd, buffer address, aligned length, file offset) are read
    /// with a plain `pread`, which the kernel shortens at the end of the file.
    pub tails: Vec<(RawFd, usize, usize, u64)>,
}

/// One request as the planner sees it: fd, file offset, buffer segments (address, length),
/// and for reads the file's length (reads are clamped to it).
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// File descriptor.
    pub fd: RawFd,
    /// File offset of the first byte.
    pub offset: u64,
    /// Buffer segments: (address, length).
    pub segments: Vec<(usize, usize)>,
    /// The file's length, for reads.
    pub file_len: Option<u64>,
    /// Transfer granularity: 1, or the `O_DIRECT` alignment.
    pub align: usize,
    /// The descriptor stays open after the batch: its FILE registration is kept.
    pub cached: bool,
}

/// Builds the descriptor lists NIXL gets for a batch: one pair per buffer segment, reads
/// clamped to the end of the file, zero-length pieces left out. `location` picks the local
/// memory's device id (0 for DRAM, the GPU index for VRAM).
pub fn plan_transfer(reqs: &[PlanRequest], location: BufferLocation) -> TransferPlan {
    let dev = match location {
        BufferLocation::Dram => 0,
        BufferLocation::Vram { device } => device,
    };
    let mut plan = TransferPlan::default();
    for r in reqs {
        let mut off = r.offset;
        let mut moved = 0usize;
        let mut extent = r.offset as usize;
        for &(addr, len) in &r.segments {
            let (asked, got, tail) = match r.file_len {
                Some(end) => {
                    let left = end.saturating_sub(off) as usize;
                    let got = len.min(left);
                    if r.align > 1 && got % r.align != 0 {
                        // The aligned part through NIXL, the block holding the end by pread.
                        let head = got / r.align * r.align;
                        let tail_len = (len - head).min(r.align);
                        (
                            head,
                            got,
                            Some((r.fd, addr + head, tail_len, off + head as u64)),
                        )
                    } else {
                        (got, got, None)
                    }
                }
                None => (len, len, None),
            };
            if asked > 0 {
                plan.local.push((addr, asked, dev));
                plan.remote.push((off as usize, asked, r.fd as u64));
                extent = extent.max(off as usize + asked);
            }
            plan.tails.extend(tail);
            moved += got;
            off += len as u64;
            if got < len {
                break; // the file ends here
            }
        }
        plan.bytes.push(moved);
        plan.file_extent.push((r.fd, extent, r.cached));
    }
    plan
}

#[derive(Debug)]
struct Region {
    addr: usize,
    len: usize,
    mem: MemType,
    dev: u64,
}

impl MemoryRegion for Region {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for Region {
    fn mem_type(&self) -> MemType {
        self.mem
    }
    fn device_id(&self) -> u64 {
        self.dev
    }
}

/// Data movement through NIXL (POSIX backend; GDS for GPU memory).
#[derive(Debug)]
pub struct NixlEngine {
    agent: Agent,
    name: String,
    /// The POSIX backend: host memory.
    posix: Backend,
    /// The POSIX backend's queue.
    posix_queue: super::PosixQueue,
    /// The GPU-direct backend (name, handle), created on the first device request, or why it
    /// could not be.
    gds: std::sync::OnceLock<Result<(&'static str, Backend), String>>,
    /// NIXL serialises calls on an agent; one batch at a time keeps its queue simple.
    lock: Mutex<()>,
    /// FILE registrations kept for descriptors in the store's open-file cache, dropped
    /// (deregistered) by `forget_file` before the fd closes.
    files: Mutex<std::collections::HashMap<RawFd, KeptFile>>,
    /// DRAM registrations of recently used buffers, by (address, length): engines' block
    /// managers reuse a pool of buffers, so a hot read registers nothing. The POSIX backend
    /// neither pins nor maps DRAM (a registration is bookkeeping of address ranges), so a
    /// kept registration of memory the caller has since freed is never dereferenced.
    dram: Mutex<lru::LruCache<(usize, usize), RegistrationHandle>>,
    /// GPU buffer registrations kept, by (address, length, device), when
    /// [`NixlConfig::gpu_registrations_kept`] is not 0.
    vram: Option<Mutex<lru::LruCache<Desc, RegistrationHandle>>>,
    /// Descriptors of cached files opened again for cuFile (by the store's descriptor), with
    /// none of the flags it refuses ([`crate::sys::CUFILE_REFUSED_FLAGS`]); closed by
    /// `forget_file` after their registration is dropped. Declared after `files`, so that on
    /// drop the registrations go first.
    cufile_fds: Mutex<CufileFds>,
    /// `O_DIRECT` mode of cached descriptors.
    meta: Mutex<std::collections::HashMap<RawFd, rustix::fs::OFlags>>,
    /// Registrations made, for the tests and the benchmark.
    registrations: std::sync::atomic::AtomicU64,
}

/// A FILE registration kept with a cached descriptor.
#[derive(Debug)]
struct KeptFile {
    /// Deregisters on drop (from every backend).
    _handle: RegistrationHandle,
    /// Registered length, from offset 0.
    len: usize,
    /// Registered with the GPU-direct backend as well as POSIX.
    gpu: bool,
}

/// Cached descriptors opened again for cuFile.
#[derive(Debug, Default)]
struct CufileFds {
    /// By the store's descriptor.
    by_store: std::collections::HashMap<RawFd, OwnedFd>,
    /// The numbers of the descriptors opened again: used by GPU transfers alone, so they are
    /// registered with the GPU-direct backend alone.
    ours: std::collections::HashSet<RawFd>,
}

/// DRAM registrations kept.
const DRAM_REGISTRATIONS_KEPT: usize = 1024;

fn find_library(cfg: &NixlConfig) -> Option<PathBuf> {
    let candidates = [
        cfg.lib_dir.clone(),
        std::env::var_os(NIXL_DIR_ENV).map(PathBuf::from),
        Some(PathBuf::from(".nixl/lib")),
    ];
    candidates
        .into_iter()
        .flatten()
        .map(|d| d.join("libnixl_capi.so"))
        .find(|p| p.is_file())
}

fn load(path: &Path) -> Result<(), String> {
    let c =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen with a valid NUL-terminated path; the handle is kept for the life of the
    // process (never dlclosed), as nixl-sys resolves its symbols from it lazily.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null dlerror results are valid C strings.
            unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!("dlopen {}: {msg}", path.display()));
    }
    Ok(())
}

static AGENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl NixlEngine {
    /// Loads the NIXL library and creates an agent with a POSIX backend. Fails, without
    /// touching anything else, when the library is not installed.
    pub fn new(cfg: &NixlConfig) -> Result<Self, Error> {
        let found = find_library(cfg);
        let mut why = String::new();
        if let Some(p) = &found {
            if let Err(e) = load(p) {
                why = e;
            }
        }
        // `is_stub` only tries to load the library; any other call would abort without it.
        if nixl_sys::is_stub() {
            return Err(Error::Config(format!(
                "the NIXL library (libnixl_capi.so) could not be loaded{}; fetch it with \
                 tools/fetch-nixl.sh (PyPI wheel nixl-cu12, into .nixl/lib) or set {NIXL_DIR_ENV} \
                 to a directory that holds it",
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                }
            )));
        }
        let name = format!(
            "tierkv-{}-{}",
            std::process::id(),
            AGENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let nerr =
            |what: &str, e: nixl_sys::NixlError| Error::Config(format!("NIXL {what}: {e:?}"));
        let agent = Agent::new(&name).map_err(|e| nerr("agent", e))?;
        let (_mems, params) = agent
            .get_plugin_params("POSIX")
            .map_err(|e| nerr("POSIX plugin", e))?;
        let mut params = params.clone().map_err(|e| nerr("params", e))?;
        if let Some(p) = cfg.posix_queue.backend_param() {
            params.set(p, "true").map_err(|e| nerr("params", e))?;
        }
        let posix = agent
            .create_backend("POSIX", &params)
            .map_err(|e| nerr("POSIX backend", e))?;
        Ok(NixlEngine {
            agent,
            name,
            posix,
            posix_queue: cfg.posix_queue,
            gds: std::sync::OnceLock::new(),
            lock: Mutex::new(()),
            files: Mutex::new(std::collections::HashMap::new()),
            cufile_fds: Mutex::new(CufileFds::default()),
            meta: Mutex::new(std::collections::HashMap::new()),
            dram: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(DRAM_REGISTRATIONS_KEPT).expect("non-zero"),
            )),
            vram: std::num::NonZeroUsize::new(cfg.gpu_registrations_kept)
                .map(|n| Mutex::new(lru::LruCache::new(n))),
            registrations: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// FILE registrations kept for cached descriptors now.
    pub fn kept_file_registrations(&self) -> usize {
        self.files.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// GPU buffer registrations kept now (see [`NixlConfig::gpu_registrations_kept`]).
    pub fn kept_gpu_registrations(&self) -> usize {
        self.vram
            .as_ref()
            .map_or(0, |v| v.lock().unwrap_or_else(|e| e.into_inner()).len())
    }

    /// Drops every kept GPU buffer registration: call it before freeing GPU memory that
    /// was given to the store while [`NixlConfig::gpu_registrations_kept`] is not 0. It
    /// waits for the transfer in progress, if any.
    pub fn forget_gpu_registrations(&self) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = &self.vram {
            v.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// FILE, DRAM and GPU registrations made so far.
    pub fn registrations(&self) -> u64 {
        self.registrations
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The GPU-direct backend in use, if one was created.
    pub fn gds_backend(&self) -> Option<&'static str> {
        match self.gds.get() {
            Some(Ok((name, _))) => Some(name),
            _ => None,
        }
    }

    /// The GPU-direct backend, created on first use: GDS_MT (a thread pool of synchronous
    /// cuFile calls), else GDS (cuFile's batch API).
    fn gds(&self) -> Result<&Backend, String> {
        let made = self.gds.get_or_init(|| {
            let mut why = Vec::new();
            for name in ["GDS_MT", "GDS"] {
                let params = match self.agent.get_plugin_params(name) {
                    Ok((_, p)) => match p.clone() {
                        Ok(p) => p,
                        Err(e) => {
                            why.push(format!("{name} params: {e:?}"));
                            continue;
                        }
                    },
                    Err(e) => {
                        why.push(format!("{name} plugin: {e:?}"));
                        continue;
                    }
                };
                match self.agent.create_backend(name, &params) {
                    Ok(b) => {
                        tracing::info!(backend = name, "NIXL GPU-direct backend created");
                        return Ok((name, b));
                    }
                    Err(e) => why.push(format!("{name}: {e:?}")),
                }
            }
            Err(format!(
                "no NIXL GPU-direct backend could be created ({}); GDS needs a GPU with its \
                 driver, libcufile.so.0 and libcudart.so.12 beside the NIXL libraries \
                 (tools/fetch-nixl.sh --gpu), and without the nvidia-fs module a cufile.json \
                 with allow_compat_mode named by CUFILE_ENV_PATH_JSON (tools/gds-roundtrip.sh)",
                why.join("; ")
            ))
        });
        made.as_ref().map(|(_, b)| b).map_err(Clone::clone)
    }

    fn register(&self, r: &Region, backends: &[&Backend]) -> Result<RegistrationHandle, String> {
        self.registrations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let opt = opt_args(backends)?;
        self.agent
            .register_memory(r, Some(&opt))
            .map_err(|x| format!("register {:?}: {x:?}", r.mem))
    }

    /// Runs one transfer (all reads or all writes) of `plan`, whose local side is at
    /// `location`.
    fn transfer(
        &self,
        plan: &TransferPlan,
        write: bool,
        location: BufferLocation,
    ) -> Result<(), String> {
        if plan.local.is_empty() {
            return Ok(());
        }
        let (backend, local_mem) = match location {
            BufferLocation::Dram => (&self.posix, MemType::Dram),
            BufferLocation::Vram { .. } => (self.gds()?, MemType::Vram),
        };
        // Registrations live until the transfer completed (dropped at the end of this call).
        let mut regs: Vec<RegistrationHandle> = Vec::with_capacity(plan.local.len() + 1);
        self.register_local(plan, local_mem, backend, &mut regs)?;
        self.register_files(plan, local_mem == MemType::Vram, backend, &mut regs)?;
        self.post_and_poll(plan, write, location, local_mem, backend)?;
        drop(regs);
        Ok(())
    }

    /// Registers the local side of `plan` (`local_mem`, through `backend`): DRAM segments in
    /// the kept LRU, VRAM segments for this transfer alone. Registrations the transfer needs
    /// until it completes go to `regs`.
    fn register_local(
        &self,
        plan: &TransferPlan,
        local_mem: MemType,
        backend: &Backend,
        regs: &mut Vec<RegistrationHandle>,
    ) -> Result<(), String> {
        if local_mem == MemType::Dram {
            let mut dram = self.dram.lock().unwrap_or_else(|e| e.into_inner());
            for &(addr, len, dev) in &plan.local {
                if dram.get(&(addr, len)).is_none() {
                    let h = self.register(
                        &Region {
                            addr,
                            len,
                            mem: MemType::Dram,
                            dev,
                        },
                        &[&self.posix],
                    )?;
                    // The registration this one evicts from the LRU may belong to a segment
                    // of this very batch (batches of more than DRAM_REGISTRATIONS_KEPT
                    // segments): it lives until the transfer has completed.
                    if let Some((_, evicted)) = dram.push((addr, len), h) {
                        regs.push(evicted);
                    }
                }
            }
        } else {
            // GPU buffers are registered each exactly as its descriptor (NIXL 1.5's GDS_MT
            // takes a descriptor's address as the buffer base): kept between transfers where
            // the engine keeps them, else for this transfer only.
            let mut kept = self
                .vram
                .as_ref()
                .map(|v| v.lock().unwrap_or_else(|e| e.into_inner()));
            for &(addr, len, dev) in &plan.local {
                if let Some(k) = kept.as_mut()
                    && k.get(&(addr, len, dev)).is_some()
                {
                    continue;
                }
                let h = self.register(
                    &Region {
                        addr,
                        len,
                        mem: MemType::Vram,
                        dev,
                    },
                    &[backend],
                )?;
                match kept.as_mut() {
                    // As with DRAM: what this evicts may be a buffer of this very batch.
                    Some(k) => regs.extend(k.push((addr, len, dev), h).map(|(_, old)| old)),
                    None => regs.push(h),
                }
            }
        }
        Ok(())
    }

    /// Registers the files of `plan`, each from offset 0 to the end of what the transfer
    /// asks: kept with cached descriptors, else for this transfer alone (into `regs`, with
    /// `backend`). `gpu`: the transfer moves GPU memory.
    fn register_files(
        &self,
        plan: &TransferPlan,
        gpu: bool,
        backend: &Backend,
        regs: &mut Vec<RegistrationHandle>,
    ) -> Result<(), String> {
        // Descriptors opened again for cuFile: GPU transfers alone use them. (Looked up
        // before `files` is locked; no path holds both locks at once.)
        let gpu_only: Vec<RawFd> = if gpu {
            let c = self.cufile_fds.lock().unwrap_or_else(|e| e.into_inner());
            plan.file_extent
                .iter()
                .map(|&(fd, _, _)| fd)
                .filter(|fd| c.ours.contains(fd))
                .collect()
        } else {
            Vec::new()
        };
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen: Vec<RawFd> = Vec::new();
        for &(fd, _, cached) in &plan.file_extent {
            if seen.contains(&fd) {
                continue;
            }
            seen.push(fd);
            let extent = plan
                .file_extent
                .iter()
                .filter(|(f, _, _)| *f == fd)
                .map(|(_, x, _)| *x)
                .max()
                .unwrap_or(0);
            if extent == 0 {
                continue;
            }
            let region = Region {
                addr: 0,
                len: extent,
                mem: MemType::File,
                dev: fd as u64,
            };
            if !cached {
                // For this transfer only, with its backend alone.
                regs.push(self.register(&region, &[backend])?);
                continue;
            }
            // Registered once per open descriptor and kept until the store closes it: with
            // POSIX, and with the GPU backend too once a GPU transfer used the file. A NIXL
            // deregistration removes a file from every backend, so a registration that lacks
            // what this transfer needs is dropped and made again with both.
            let fits = files
                .get(&fd)
                .is_some_and(|k| k.len >= extent && (k.gpu || !gpu));
            if !fits {
                let had_gpu = files.remove(&fd).is_some_and(|k| k.gpu);
                let with_gpu = gpu || had_gpu;
                let backends: Vec<&Backend> = if gpu_only.contains(&fd) {
                    vec![self.gds()?]
                } else if with_gpu {
                    vec![&self.posix, self.gds()?]
                } else {
                    vec![&self.posix]
                };
                let handle = self.register(&region, &backends)?;
                files.insert(
                    fd,
                    KeptFile {
                        _handle: handle,
                        len: extent,
                        gpu: with_gpu,
                    },
                );
            }
        }
        Ok(())
    }

    /// Posts the descriptor pairs of `plan` (local side `local_mem` at `location`, pinned to
    /// `backend`) as transfer requests of at most [`MAX_DESCS_PER_TRANSFER`] pairs, each
    /// polled to completion before the next is posted.
    fn post_and_poll(
        &self,
        plan: &TransferPlan,
        write: bool,
        location: BufferLocation,
        local_mem: MemType,
        backend: &Backend,
    ) -> Result<(), String> {
        let e = |what: &str, err: nixl_sys::NixlError| format!("{what}: {err:?}");
        let op = if write { XferOp::Write } else { XferOp::Read };
        let pin = opt_args(&[backend])?;
        // Chunks well under the POSIX backend's I/O pool (65,536): a request that does not
        // fit is left half queued by NIXL 1.5, and a later transfer would submit the rest.
        let idx: Vec<usize> = (0..plan.local.len()).collect();
        for chunk in idx.chunks(MAX_DESCS_PER_TRANSFER) {
            let mut local = XferDescList::new(local_mem).map_err(|x| e("descriptor list", x))?;
            let mut remote =
                XferDescList::new(MemType::File).map_err(|x| e("descriptor list", x))?;
            for &i in chunk {
                let ((a, l, d), (o, rl, fd)) = (plan.local[i], plan.remote[i]);
                local.add_desc(a, l, d);
                remote.add_desc(o, rl, fd);
            }
            let req = self
                .agent
                .create_xfer_req(op, &local, &remote, &self.name, Some(&pin))
                .map_err(|x| e("create transfer", x))?;
            let mut pending = match self.agent.post_xfer_req(&req, None) {
                Ok(p) => p,
                Err(x) => return Err(self.failed(req, "post transfer", x, false)),
            };
            while pending {
                match self.agent.get_xfer_status(&req) {
                    Ok(XferStatus::Success) => pending = false,
                    Ok(XferStatus::InProgress) => std::hint::spin_loop(),
                    Err(x) => {
                        let drained = location == BufferLocation::Dram
                            && matches!(
                                self.posix_queue,
                                super::PosixQueue::Default | super::PosixQueue::Libaio
                            );
                        return Err(self.failed(req, "transfer", x, drained));
                    }
                }
            }
        }
        Ok(())
    }

    /// A transfer failed. Returns its error when NIXL guarantees that none of its I/O is in
    /// flight any more (`drained`): NIXL 1.5's POSIX backend on libaio reports an error only
    /// once the request's I/Os have completed. Otherwise (a failed post; POSIX on io_uring or
    /// POSIX AIO, which report the first failure while other I/Os of the request may still
    /// run; the GPU backends) NIXL gives no way to wait for them, and releasing the request
    /// does not cancel them (ai-dynamo/nixl#1955): the kernel could still write buffers this
    /// call only borrows after it returns. The process aborts then, as the io_uring engine
    /// does when it cannot reap, rather than return unsoundly.
    fn failed(
        &self,
        req: nixl_sys::XferRequest,
        what: &str,
        err: nixl_sys::NixlError,
        drained: bool,
    ) -> String {
        if drained {
            drop(req);
            return format!("{what}: {err:?}");
        }
        tracing::error!(
            queue = %self.posix_queue,
            error = ?err,
            "NIXL {what} failed with I/O possibly in flight into borrowed buffers; aborting"
        );
        // The queue still refers to the request: never release it.
        std::mem::forget(req);
        std::process::abort();
    }
}

/// Descriptors per NIXL transfer request at most.
const MAX_DESCS_PER_TRANSFER: usize = 4096;

/// Where a request's memory is.
fn location_of(r: &IoRequest<'_>) -> BufferLocation {
    match &r.kind {
        IoKind::ReadDevice(m) | IoKind::WriteDevice(m) => BufferLocation::Vram {
            device: u64::from(m.device()),
        },
        _ => BufferLocation::Dram,
    }
}

/// The transfers a batch becomes: one per direction and memory location, reads before
/// writes, each in the order its first request appears.
pub fn transfer_groups(batch: &[IoRequest<'_>]) -> Vec<(bool, BufferLocation)> {
    let mut groups: Vec<(bool, BufferLocation)> = Vec::new();
    for write in [false, true] {
        for r in batch {
            let g = (write, location_of(r));
            if r.is_write() == write && !groups.contains(&g) {
                groups.push(g);
            }
        }
    }
    groups
}

/// Optional arguments naming `backends`.
fn opt_args(backends: &[&Backend]) -> Result<OptArgs, String> {
    let mut o = OptArgs::new().map_err(|e| format!("opt args: {e:?}"))?;
    for b in backends {
        o.add_backend(b).map_err(|e| format!("opt args: {e:?}"))?;
    }
    Ok(o)
}

/// Reads the end-of-file blocks of `O_DIRECT` requests (see [`TransferPlan::tails`]).
fn read_tails(plan: &TransferPlan) -> Result<(), String> {
    for &(fd, addr, len, off) in &plan.tails {
        // SAFETY: fd is open for the batch (borrowed by its request), and [addr, addr + len)
        // lies inside that request's buffer, which the caller lends us until submit returns.
        let (bfd, buf) = unsafe {
            (
                std::os::fd::BorrowedFd::borrow_raw(fd),
                std::slice::from_raw_parts_mut(addr as *mut u8, len),
            )
        };
        crate::sys::read_full(bfd, off, &mut [std::io::IoSliceMut::new(buf)])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn file_len(fd: RawFd) -> io::Result<u64> {
    // SAFETY: fd is open for the duration of the batch (borrowed by the request).
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(bfd)
        .map(|st| st.st_size as u64)
        .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))
}

/// NIXL reports a failed write without an errno; a full filesystem is told apart by its free
/// space, so that callers get ENOSPC as from the other engines.
fn classify_write_failure(fd: RawFd, needed: usize, msg: String) -> io::Error {
    // SAFETY: as in file_len.
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    match rustix::fs::fstatvfs(bfd) {
        Ok(v) if v.f_bavail.saturating_mul(v.f_frsize) < needed as u64 => {
            io::Error::from_raw_os_error(libc::ENOSPC)
        }
        _ => io::Error::other(format!("nixl: {msg}")),
    }
}

impl IoEngine for NixlEngine {
    fn name(&self) -> &'static str {
        "nixl"
    }

    fn forget_file(&self, fd: std::os::fd::BorrowedFd<'_>) {
        let reopened = {
            let mut c = self.cufile_fds.lock().unwrap_or_else(|e| e.into_inner());
            let f = c.by_store.remove(&fd.as_raw_fd());
            if let Some(f) = &f {
                c.ours.remove(&f.as_raw_fd());
            }
            f
        };
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let gone = files.remove(&fd.as_raw_fd());
        let gone_gpu = reopened.as_ref().and_then(|f| files.remove(&f.as_raw_fd()));
        drop(files);
        self.meta
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fd.as_raw_fd());
        drop(gone); // deregisters
        drop(gone_gpu);
        drop(reopened); // closed once no registration names it
    }

    fn moves_device_memory(&self) -> bool {
        true
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut results: Vec<Option<io::Result<usize>>> = (0..batch.len()).map(|_| None).collect();
        let groups = transfer_groups(batch);
        for (write, location) in groups {
            let mut idx = Vec::new();
            let mut reqs = Vec::new();
            // Descriptors opened again for cuFile for this batch alone (uncached files):
            // closed after the transfer and its registrations are done.
            let mut held: Vec<OwnedFd> = Vec::new();
            for (i, r) in batch.iter_mut().enumerate() {
                if r.is_write() != write || location_of(r) != location {
                    continue;
                }
                match self.plan_request(r, write, location, &mut held) {
                    Ok(req) => {
                        idx.push(i);
                        reqs.push(req);
                    }
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
            if reqs.is_empty() {
                continue;
            }
            let plan = plan_transfer(&reqs, location);
            match self
                .transfer(&plan, write, location)
                .and_then(|()| read_tails(&plan))
            {
                Ok(()) => {
                    for (k, &i) in idx.iter().enumerate() {
                        results[i] = Some(Ok(plan.bytes[k]));
                    }
                }
                Err(msg) => {
                    // One request failed the whole transfer: run them one by one so each gets
                    // its own outcome, as with the other engines.
                    for (k, &i) in idx.iter().enumerate() {
                        let one = plan_transfer(std::slice::from_ref(&reqs[k]), location);
                        let r = if reqs.len() == 1 {
                            Err(msg.clone())
                        } else {
                            self.transfer(&one, write, location)
                                .and_then(|()| read_tails(&one))
                        };
                        results[i] = Some(match r {
                            Ok(()) => Ok(one.bytes[0]),
                            Err(m) if write => {
                                Err(classify_write_failure(reqs[k].fd, one.bytes[0], m))
                            }
                            Err(m) => Err(io::Error::other(format!("nixl: {m}"))),
                        });
                    }
                }
            }
            drop(held);
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(0))).collect()
    }
}

impl NixlEngine {
    /// One request of a transfer group as the planner sees it, or why it cannot be part
    /// of the transfer (it fails alone: NIXL would fail the whole post, with no way to wait
    /// for the rest of the batch). Descriptors opened again for cuFile for this batch alone
    /// go to `held`.
    fn plan_request(
        &self,
        r: &mut IoRequest<'_>,
        write: bool,
        location: BufferLocation,
        held: &mut Vec<OwnedFd>,
    ) -> io::Result<PlanRequest> {
        let segments: Vec<(usize, usize)> = match &mut r.kind {
            IoKind::Read(b) => b
                .iter_mut()
                .map(|s| (s.as_mut_ptr() as usize, s.len()))
                .collect(),
            IoKind::Write(b) => b.iter().map(|s| (s.as_ptr() as usize, s.len())).collect(),
            IoKind::ReadDevice(m) | IoKind::WriteDevice(m) => {
                vec![(m.addr() as usize, m.len())]
            }
        };
        // The file's length: given by the store for cached, validated files (it checks
        // their size on every read), else looked up.
        let len = match r.file_len {
            Some(n) => n,
            None => file_len(r.fd.as_raw_fd())?,
        };
        let flags = self.fd_flags(r)?;
        // A descriptor that cannot do this transfer.
        let mode = flags & rustix::fs::OFlags::RWMODE;
        let refused = if write {
            mode == rustix::fs::OFlags::RDONLY
        } else {
            mode == rustix::fs::OFlags::WRONLY
        };
        if refused {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        // cuFile refuses descriptors with some status flags, which every block file the
        // store opens has (O_NOFOLLOW): GPU transfers use the file opened again.
        let fd = if location != BufferLocation::Dram
            && flags.intersects(crate::sys::CUFILE_REFUSED_FLAGS)
        {
            self.cufile_fd(r, held)?
        } else {
            r.fd.as_raw_fd()
        };
        // O_DIRECT descriptors need aligned host transfers (cuFile handles alignment of GPU
        // ones itself).
        let direct = location == BufferLocation::Dram && flags.contains(rustix::fs::OFlags::DIRECT);
        Ok(PlanRequest {
            fd,
            offset: r.offset,
            segments,
            file_len: (!write).then_some(len),
            align: if direct { 4096 } else { 1 },
            cached: r.cached,
        })
    }

    /// The descriptor a GPU transfer of `r` gives cuFile: its file opened again without the
    /// flags cuFile refuses ([`crate::sys::reopen_plain`]). Kept with a cached descriptor until
    /// `forget_file`; else pushed to `held`, for this batch alone.
    fn cufile_fd(&self, r: &IoRequest<'_>, held: &mut Vec<OwnedFd>) -> io::Result<RawFd> {
        let reopen = || crate::sys::reopen_plain(r.fd.as_fd()).map_err(crate::sys::errno);
        if !r.cached {
            let f = reopen()?;
            let raw = f.as_raw_fd();
            held.push(f);
            return Ok(raw);
        }
        let mut fds = self.cufile_fds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = fds.by_store.get(&r.fd.as_raw_fd()) {
            return Ok(f.as_raw_fd());
        }
        let f = reopen()?;
        let raw = f.as_raw_fd();
        fds.by_store.insert(r.fd.as_raw_fd(), f);
        fds.ours.insert(raw);
        Ok(raw)
    }

    /// The status flags of the request's descriptor (access mode, `O_DIRECT`); remembered for
    /// cached descriptors, whose mode never changes.
    fn fd_flags(&self, r: &IoRequest<'_>) -> io::Result<rustix::fs::OFlags> {
        let fd = r.fd.as_raw_fd();
        if r.cached {
            let known = self
                .meta
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&fd)
                .copied();
            if let Some(f) = known {
                return Ok(f);
            }
        }
        let f = rustix::fs::fcntl_getfl(r.fd)
            .map_err(|e| io::Error::from_raw_os_error(e.raw_os_error()))?;
        if r.cached {
            self.meta
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(fd, f);
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records a skip as tests/common's `skip` does: a `SKIPPED` line on stderr and in
    /// `target/test-skips.txt`, which tools/test.sh prints.
    fn skip(reason: &str) {
        use std::io::Write;
        let line = format!(
            "SKIPPED {} (unit tests): {reason}",
            std::thread::current().name().unwrap_or("?")
        );
        eprintln!("{line}");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-skips.txt");
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }

    #[test]
    fn plans_pair_segments_and_clamp_reads_at_end_of_file() {
        let reqs = vec![
            // header + payload + one spare byte, read from a 4096+100-byte file
            PlanRequest {
                fd: 7,
                offset: 0,
                segments: vec![(0x1000, 4096), (0x9000, 200), (0xA000, 1)],
                file_len: Some(4196),
                align: 1,
                cached: false,
            },
            // a write of two segments at offset 10
            PlanRequest {
                fd: 8,
                offset: 10,
                segments: vec![(0x2000, 5), (0x3000, 0), (0x4000, 7)],
                file_len: None,
                align: 1,
                cached: true,
            },
            // O_DIRECT: one aligned bounce buffer, the file ends inside its last block
            PlanRequest {
                fd: 9,
                offset: 0,
                segments: vec![(0x10000, 16384)],
                file_len: Some(4096 + 5000),
                align: 4096,
                cached: false,
            },
        ];
        let p = plan_transfer(&reqs, BufferLocation::Dram);
        assert_eq!(
            p.local,
            vec![
                (0x1000, 4096, 0),
                (0x9000, 100, 0),
                (0x2000, 5, 0),
                (0x4000, 7, 0),
                (0x10000, 8192, 0)
            ]
        );
        assert_eq!(
            p.remote,
            vec![
                (0, 4096, 7),
                (4096, 100, 7),
                (10, 5, 8),
                (15, 7, 8),
                (0, 8192, 9)
            ]
        );
        assert_eq!(p.bytes, vec![4196, 12, 9096]);
        assert_eq!(
            p.file_extent,
            vec![(7, 4196, false), (8, 22, true), (9, 8192, false)]
        );
        assert_eq!(p.tails, vec![(9, 0x10000 + 8192, 4096, 8192)]);
    }

    #[test]
    fn a_batch_becomes_one_transfer_per_direction_and_memory() {
        let f = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsFd::as_fd(&f);
        let mut host = [0u8; 8];
        // SAFETY: never dereferenced: only grouped.
        let gpu = |d: u32| unsafe { crate::buf::DeviceMem::new(0x1000, 8, d) };
        let batch = [
            IoRequest::write_device(fd, 0, gpu(1)),
            IoRequest::read_device(fd, 0, gpu(1)),
            IoRequest::read(fd, 0, vec![io::IoSliceMut::new(&mut host)]),
            IoRequest::read_device(fd, 0, gpu(0)),
            IoRequest::write(fd, 0, vec![io::IoSlice::new(b"x")]),
            IoRequest::read_device(fd, 0, gpu(1)),
        ];
        let v = |device| BufferLocation::Vram { device };
        assert_eq!(
            transfer_groups(&batch),
            [
                (false, v(1)),
                (false, BufferLocation::Dram),
                (false, v(0)),
                (true, v(1)),
                (true, BufferLocation::Dram),
            ]
        );
    }

    #[test]
    fn vram_descriptors_carry_the_gpu_index() {
        // What the GDS backends would be given for buffers on GPU 3.
        let reqs = vec![PlanRequest {
            fd: 5,
            offset: 4096,
            segments: vec![(0x7f00_0000, 65_536)],
            file_len: Some(4096 + 65_536),
            align: 4096,
            cached: false,
        }];
        let p = plan_transfer(&reqs, BufferLocation::Vram { device: 3 });
        assert_eq!(p.local, vec![(0x7f00_0000, 65_536, 3)]);
        assert_eq!(p.remote, vec![(4096, 65_536, 5)]);
    }

    #[test]
    fn a_transfer_larger_than_one_request_is_split() {
        let e = match NixlEngine::new(&NixlConfig::default()) {
            Ok(e) => e,
            Err(e) => {
                assert!(std::env::var_os("TIERKV_REQUIRE_NIXL").is_none(), "{e}");
                skip(&e.to_string());
                return;
            }
        };
        // One request of 5,000 buffer segments: 5,000 descriptor pairs, two NIXL requests.
        let n = MAX_DESCS_PER_TRANSFER + 904;
        let data: Vec<u8> = (0..n * 8).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &data).unwrap();
        let mut bufs = vec![[0u8; 8]; n];
        let segments: Vec<io::IoSliceMut<'_>> =
            bufs.iter_mut().map(|b| io::IoSliceMut::new(b)).collect();
        let mut batch = [IoRequest::read(std::os::fd::AsFd::as_fd(&f), 0, segments)];
        let r = e.submit(&mut batch);
        assert_eq!(*r[0].as_ref().unwrap(), n * 8);
        assert_eq!(bufs.concat(), data);
    }

    #[test]
    fn engine_contract_or_a_clear_error() {
        match NixlEngine::new(&NixlConfig::default()) {
            Ok(e) => super::super::contract::run_all(&e),
            Err(e) => {
                assert!(
                    std::env::var_os("TIERKV_REQUIRE_NIXL").is_none(),
                    "NIXL required: {e}"
                );
                assert!(e.to_string().contains("fetch-nixl.sh"), "{e}");
                skip(&e.to_string());
            }
        }
    }
}
