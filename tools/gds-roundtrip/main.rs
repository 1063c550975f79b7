//! gds-roundtrip: blocks between GPU memory and block files through the nixl engine (NIXL's
//! GDS_MT or GDS backend), checked byte for byte. Run it on a GPU machine through
//! `tools/gds-roundtrip.sh`, which sets up cuFile (compat mode where nvidia-fs is absent).
//!
//! Steps: allocate source and destination buffers on the GPU (CUDA driver API, loaded at run
//! time from `libcuda.so.1`), fill the sources from host patterns, `put_many_device` them,
//! read the files back through the host (`get_many`, checksums verified), `get_many_device`
//! them into the destinations and copy those back to the host, and do the same for blocks
//! written from host memory. Then times the same hot reads into GPU memory and into host
//! memory. Prints what it did and the rates; exits 1 on any mismatch.

use std::ffi::{CStr, CString, c_void};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use serde_json::json;
use tierkv::DeviceMem;
use tierkv::engine::nixl::{NixlConfig, NixlEngine};
use tierkv::{BlockHash, Lookup, Store, StoreConfig, WorkerId};

#[path = "../common.rs"]
mod common;

use common::{BoxError, parse_size};

/// Round trips of blocks between GPU memory and files through NIXL GDS.
#[derive(Parser, Debug)]
#[command(version, long_about = None)]
struct Args {
    /// Cache root (on the filesystem to test; default: a temporary directory there is).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// CUDA device index.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Blocks per batch.
    #[arg(long, default_value_t = 32)]
    blocks: usize,
    /// Block size (e.g. 64KiB, 1MiB).
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    bs: u64,
    /// Batches of reads after the checks (for a rate).
    #[arg(long, default_value_t = 20)]
    loops: usize,
    /// GPU buffer registrations the engine keeps between transfers (0: none).
    #[arg(long, default_value_t = 0)]
    keep_gpu_registrations: usize,
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => common::exit_for("gds-roundtrip", &e),
    }
}

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> i32;
type FreeFn = unsafe extern "C" fn(u64) -> i32;
type HtoDFn = unsafe extern "C" fn(u64, *const c_void, usize) -> i32;
type DtoHFn = unsafe extern "C" fn(*mut c_void, u64, usize) -> i32;
type MemsetFn = unsafe extern "C" fn(u64, u8, usize) -> i32;
type SyncFn = unsafe extern "C" fn() -> i32;
type ErrorStringFn = unsafe extern "C" fn(i32, *mut *const i8) -> i32;
type InitFn = unsafe extern "C" fn(u32) -> i32;
type DeviceGetFn = unsafe extern "C" fn(*mut i32, i32) -> i32;
type RetainFn = unsafe extern "C" fn(*mut *mut c_void, i32) -> i32;
type SetCurrentFn = unsafe extern "C" fn(*mut c_void) -> i32;

/// The CUDA driver API calls used here, from `libcuda.so.1`.
struct Cuda {
    mem_alloc: AllocFn,
    mem_free: FreeFn,
    htod: HtoDFn,
    dtoh: DtoHFn,
    memset: MemsetFn,
    sync: SyncFn,
    error_string: ErrorStringFn,
}

impl Cuda {
    /// Loads the driver, and makes device `ordinal`'s primary context current on this thread
    /// (NIXL's GDS plugins register buffers in the primary context).
    fn load(ordinal: u32) -> Result<Cuda, BoxError> {
        let name = CString::new("libcuda.so.1")?;
        // SAFETY: dlopen with a valid C string; the handle stays open for the process.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            return Err("libcuda.so.1 (the NVIDIA driver) could not be loaded: no GPU here".into());
        }
        let sym = |s: &str| -> Result<*mut c_void, BoxError> {
            let c = CString::new(s)?;
            // SAFETY: h is a live handle and c a valid C string.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if p.is_null() {
                Err(format!("libcuda.so.1 has no {s}").into())
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is the CUDA driver API function of that name, whose C signature
        // the transmuted type states (cuda.h; CUresult = int, CUdevice = int, CUdeviceptr =
        // unsigned long long, CUcontext = pointer).
        unsafe {
            use std::mem::transmute;
            let init = transmute::<*mut c_void, InitFn>(sym("cuInit")?);
            let device_get = transmute::<*mut c_void, DeviceGetFn>(sym("cuDeviceGet")?);
            let retain = transmute::<*mut c_void, RetainFn>(sym("cuDevicePrimaryCtxRetain")?);
            let set_current = transmute::<*mut c_void, SetCurrentFn>(sym("cuCtxSetCurrent")?);
            let cuda = Cuda {
                mem_alloc: transmute::<*mut c_void, AllocFn>(sym("cuMemAlloc_v2")?),
                mem_free: transmute::<*mut c_void, FreeFn>(sym("cuMemFree_v2")?),
                htod: transmute::<*mut c_void, HtoDFn>(sym("cuMemcpyHtoD_v2")?),
                dtoh: transmute::<*mut c_void, DtoHFn>(sym("cuMemcpyDtoH_v2")?),
                memset: transmute::<*mut c_void, MemsetFn>(sym("cuMemsetD8_v2")?),
                sync: transmute::<*mut c_void, SyncFn>(sym("cuCtxSynchronize")?),
                error_string: transmute::<*mut c_void, ErrorStringFn>(sym("cuGetErrorString")?),
            };
            cuda.check("cuInit", init(0))?;
            let mut dev = 0i32;
            cuda.check("cuDeviceGet", device_get(&mut dev, ordinal as i32))?;
            let mut ctx = std::ptr::null_mut();
            cuda.check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
            cuda.check("cuCtxSetCurrent", set_current(ctx))?;
            Ok(cuda)
        }
    }

    fn check(&self, what: &str, r: i32) -> Result<(), BoxError> {
        if r == 0 {
            return Ok(());
        }
        let mut s: *const i8 = std::ptr::null();
        // SAFETY: cuGetErrorString writes a static string's address or leaves null.
        unsafe { (self.error_string)(r, &mut s) };
        let msg = if s.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: a non-null result is a static NUL-terminated string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        Err(format!("{what}: {msg}").into())
    }
}

/// A GPU allocation, freed on drop.
struct GpuBuf<'a> {
    cuda: &'a Cuda,
    ptr: u64,
    len: usize,
}

impl<'a> GpuBuf<'a> {
    fn new(cuda: &'a Cuda, len: usize) -> Result<Self, BoxError> {
        let mut ptr = 0u64;
        // SAFETY: cuMemAlloc writes the new allocation's address into ptr.
        cuda.check("cuMemAlloc", unsafe { (cuda.mem_alloc)(&mut ptr, len) })?;
        Ok(GpuBuf { cuda, ptr, len })
    }

    fn mem(&self, device: u32) -> DeviceMem {
        // SAFETY: a live allocation of len bytes on `device`, in its primary context; it
        // outlives every store call it is given to (GpuBufs are dropped at the end of run).
        unsafe { DeviceMem::new(self.ptr, self.len, device) }
    }

    fn upload(&self, host: &[u8]) -> Result<(), BoxError> {
        // SAFETY: host holds len bytes (checked), ptr len bytes of device memory.
        assert_eq!(host.len(), self.len);
        self.cuda.check("cuMemcpyHtoD", unsafe {
            (self.cuda.htod)(self.ptr, host.as_ptr().cast(), self.len)
        })?;
        // A copy from pageable memory may return before the DMA ends: wait for it.
        // SAFETY: no arguments.
        self.cuda
            .check("cuCtxSynchronize", unsafe { (self.cuda.sync)() })
    }

    fn download(&self) -> Result<Vec<u8>, BoxError> {
        let mut host = vec![0u8; self.len];
        // SAFETY: host and the allocation both hold len bytes.
        self.cuda.check("cuMemcpyDtoH", unsafe {
            (self.cuda.dtoh)(host.as_mut_ptr().cast(), self.ptr, self.len)
        })?;
        Ok(host)
    }

    fn clear(&self) -> Result<(), BoxError> {
        // SAFETY: the allocation holds len bytes.
        self.cuda.check("cuMemsetD8", unsafe {
            (self.cuda.memset)(self.ptr, 0, self.len)
        })?;
        // SAFETY: no arguments.
        self.cuda
            .check("cuCtxSynchronize", unsafe { (self.cuda.sync)() })
    }
}

impl Drop for GpuBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc and is freed once.
        let _ = unsafe { (self.cuda.mem_free)(self.ptr) };
    }
}

fn pattern(i: usize, len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8 ^ salt)
        .collect()
}

/// The directory the blocks go in: `--dir`, or a temp dir, removed when its guard drops.
fn root_dir(dir: Option<&PathBuf>) -> Result<(PathBuf, Option<tempfile::TempDir>), BoxError> {
    Ok(match dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("gds-roundtrip.")
                .tempdir()?;
            (t.path().to_path_buf(), Some(t))
        }
    })
}

fn run(args: &Args) -> Result<bool, BoxError> {
    let cuda = Cuda::load(args.device)?;
    let (root, _tmp) = root_dir(args.dir.as_ref())?;
    let bs = usize::try_from(args.bs)?;
    let n = args.blocks;
    let engine = Arc::new(NixlEngine::new(&NixlConfig {
        gpu_registrations_kept: args.keep_gpu_registrations,
        ..NixlConfig::default()
    })?);
    let store = Store::open_with_engine(
        &root,
        WorkerId::new(&format!("gpu{}", args.device))?,
        StoreConfig::default().with_max_block_size(bs.max(tierkv::DEFAULT_MAX_BLOCK_SIZE)),
        engine.clone(),
    )?;
    let key = |i: usize| store.key(BlockHash::chain(None, &[i as u32, 0x6d5]));
    let dev_keys: Vec<_> = (0..n).map(key).collect();
    let host_keys: Vec<_> = (n..2 * n).map(key).collect();
    let src: Vec<GpuBuf> = (0..n)
        .map(|_| GpuBuf::new(&cuda, bs))
        .collect::<Result<_, _>>()?;
    let dst: Vec<GpuBuf> = (0..n)
        .map(|_| GpuBuf::new(&cuda, bs))
        .collect::<Result<_, _>>()?;
    let mut ok = true;
    let mut mismatch = |what: &str, i: usize| {
        eprintln!("gds-roundtrip: {what} of block {i} differ");
        ok = false;
    };

    // 1. GPU -> files.
    tracing::info!("GPU -> files");
    for (i, b) in src.iter().enumerate() {
        b.upload(&pattern(i, bs, 0))?;
    }
    let items: Vec<_> = dev_keys
        .iter()
        .cloned()
        .zip(src.iter().map(|b| b.mem(args.device)))
        .collect();
    let t = Instant::now();
    for r in store.put_many_device(&items) {
        r?;
    }
    let put_s = t.elapsed().as_secs_f64();
    // 2. The files, read through the host (checksums verified).
    tracing::info!("files -> host, checked");
    let mut host = vec![vec![0u8; bs]; n];
    for (i, r) in store.get_many(&dev_keys, &mut host).into_iter().enumerate() {
        if r? != Lookup::Hit(bs) || host[i] != pattern(i, bs, 0) {
            mismatch("host read of a GPU-written file and the source", i);
        }
    }
    // 3. Files -> GPU, for GPU-written and host-written blocks.
    tracing::info!("files -> GPU, checked");
    let host_items: Vec<_> = (0..n)
        .map(|i| (host_keys[i].clone(), pattern(i, bs, 0x5a)))
        .collect();
    for r in store.put_many(&host_items) {
        r?;
    }
    for (keys, salt) in [(&dev_keys, 0u8), (&host_keys, 0x5a)] {
        for b in &dst {
            b.clear()?;
        }
        let mems: Vec<DeviceMem> = dst.iter().map(|b| b.mem(args.device)).collect();
        for (i, r) in store.get_many_device(keys, &mems).into_iter().enumerate() {
            if r? != Lookup::Hit(bs) || dst[i].download()? != pattern(i, bs, salt) {
                mismatch("GPU read and the source", i);
            }
        }
    }
    // 4 and 5. Rates of hot reads into GPU memory and into host memory.
    let (get_s, host_s) = timed_reads(args, &store, &dev_keys, &dst, &mut host, &mut mismatch)?;
    let mib = |blocks: usize, s: f64| (blocks * bs) as f64 / s.max(1e-9) / 1048576.0;
    let doc = json!({
        "ok": ok,
        "backend": engine.gds_backend(),
        "gpu_registrations_kept": engine.kept_gpu_registrations(),
        "device": args.device,
        "blocks": n,
        "bs": bs,
        "dir": root.display().to_string(),
        "put_device_mib_per_sec": mib(n, put_s),
        "get_device_mib_per_sec": mib(n * args.loops, get_s),
        "get_host_mib_per_sec": mib(n * args.loops, host_s),
        "device_vs_host_get": host_s / get_s.max(1e-9),
        "store": store.stats(),
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(ok)
}

/// Times `args.loops` batches of hot reads of `keys` into the GPU buffers `dst`, then the same
/// into the host buffers `host` (a ratio measured in the same run). The destinations are
/// cleared first and checked after, so the timed reads are known to have landed. Returns
/// the seconds each took.
fn timed_reads(
    args: &Args,
    store: &Store,
    keys: &[tierkv::BlockKey],
    dst: &[GpuBuf<'_>],
    host: &mut [Vec<u8>],
    mismatch: &mut impl FnMut(&str, usize),
) -> Result<(f64, f64), BoxError> {
    let bs = usize::try_from(args.bs)?;
    tracing::info!("timed reads into GPU memory");
    for b in dst {
        b.clear()?;
    }
    let mems: Vec<DeviceMem> = dst.iter().map(|b| b.mem(args.device)).collect();
    let t = Instant::now();
    for _ in 0..args.loops {
        for r in store.get_many_device(keys, &mems) {
            if r? != Lookup::Hit(bs) {
                mismatch("a timed read's outcome and a hit", 0);
            }
        }
    }
    let get_s = t.elapsed().as_secs_f64();
    for (i, b) in dst.iter().enumerate() {
        if args.loops > 0 && b.download()? != pattern(i, bs, 0) {
            mismatch("GPU read (timed) and the source", i);
        }
    }
    tracing::info!("timed reads into host memory");
    for h in host.iter_mut() {
        h.fill(0);
    }
    let t = Instant::now();
    for _ in 0..args.loops {
        for r in store.get_many(keys, host) {
            if r? != Lookup::Hit(bs) {
                mismatch("a timed read's outcome and a hit", 0);
            }
        }
    }
    let host_s = t.elapsed().as_secs_f64();
    for (i, h) in host.iter().enumerate() {
        if args.loops > 0 && *h != pattern(i, bs, 0) {
            mismatch("host read (timed) and the source", i);
        }
    }
    Ok((get_s, host_s))
}
