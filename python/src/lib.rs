//! `tierkv_g3._tierkv`: the native part of the `tierkv_g3` Python package (distribution `tierkv-g3`) (python/tierkv_g3/ is the
//! rest: the asyncio methods, the re-exports, the type stubs).
//!
//! Every call that touches the disk releases the GIL (`Python::detach`) for the whole batch.
//! Buffers are exported through the buffer protocol (src/buffer.rs) before the GIL is released
//! and released after it is taken back, so the store reads and writes the caller's memory in
//! place.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::RwLock;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use tierkv::engine::EngineKind;
use tierkv::{
    BlockHash, BlockKey, Layout, Lookup, PolicyKind, Publish, Sharing, StoreConfig, VerifyMode,
    WorkerId,
};

mod buffer;
mod errors;
mod lmcache;
mod offload;
mod tail;
mod transfer;
mod tree;

use buffer::{Span, View};

/// A Rust result to a Python one.
fn py_result<T>(py: Python<'_>, r: tierkv::Result<T>) -> PyResult<T> {
    r.map_err(|e| errors::to_py(py, e, None))
}

/// The first failing item of a batch as its exception (with `index`), else the values.
fn batch<T>(py: Python<'_>, results: Vec<tierkv::Result<T>>) -> PyResult<Vec<T>> {
    let mut out = Vec::with_capacity(results.len());
    for (i, r) in results.into_iter().enumerate() {
        out.push(r.map_err(|e| errors::to_py(py, e, Some(i)))?);
    }
    Ok(out)
}

/// A key as Python gives it: 64 lower-case hex characters (the block's file name, and the
/// spelling of SGLang HiCache's hash strings) or 32 bytes.
/// A get batch's answers for Python: per key the block's length, or None for a miss; the
/// first error raised.
fn lengths(py: Python<'_>, results: Vec<tierkv::Result<Lookup>>) -> PyResult<Vec<Option<usize>>> {
    Ok(batch(py, results)?
        .into_iter()
        .map(|l| match l {
            Lookup::Hit(n) => Some(n),
            Lookup::Miss => None,
        })
        .collect())
}

fn hash_of(py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<BlockHash> {
    if let Ok(s) = key.cast::<PyString>() {
        return py_result(py, BlockHash::from_hex(&s.to_cow()?));
    }
    if let Ok(b) = key.cast::<PyBytes>() {
        let b = b.as_bytes();
        return match <[u8; 32]>::try_from(b) {
            Ok(a) => Ok(BlockHash(a)),
            Err(_) => Err(errors::InvalidKeyError::new_err(format!(
                "invalid key: a bytes key must be 32 bytes, got {}",
                b.len()
            ))),
        };
    }
    Err(PyTypeError::new_err(format!(
        "a key is a str of 64 lower-case hex characters or 32 bytes, not {}",
        key.get_type().name()?
    )))
}

fn keys_of(py: Python<'_>, worker: &WorkerId, keys: &Bound<'_, PyAny>) -> PyResult<Vec<BlockKey>> {
    if keys.is_instance_of::<PyString>() || keys.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(
            "keys is a sequence of keys; wrap a single key in a list",
        ));
    }
    keys.try_iter()?
        .enumerate()
        .map(|(i, k)| {
            let h = hash_of(py, &k?).inspect_err(|e| {
                if e.is_instance_of::<errors::Error>(py) {
                    // Best effort: the error stands without its position.
                    let _ = e.value(py).setattr("index", i);
                }
            })?;
            Ok(BlockKey::new(worker.clone(), h))
        })
        .collect()
}

/// Exports each buffer of `buffers` (one per key).
fn views_of(buffers: &Bound<'_, PyAny>, n: usize, writable: bool) -> PyResult<Vec<View>> {
    let views = buffers
        .try_iter()?
        .enumerate()
        .map(|(i, b)| View::new(&b?, &format!("buffers[{i}]"), writable))
        .collect::<PyResult<Vec<View>>>()?;
    if views.len() != n {
        return Err(PyValueError::new_err(format!(
            "{n} keys but {} buffers: one buffer per key",
            views.len()
        )));
    }
    Ok(views)
}

/// Exports each key's parts of `parts` (one sequence of buffers per key): the views, and per
/// key the range of its parts in the flat list of views.
fn part_views_of(
    parts: &Bound<'_, PyAny>,
    n: usize,
    writable: bool,
) -> PyResult<(Vec<View>, Vec<std::ops::Range<usize>>)> {
    let mut views = Vec::new();
    let mut ranges = Vec::with_capacity(n);
    for (i, seq) in parts.try_iter()?.enumerate() {
        let seq = seq?;
        // A list or tuple only: an array or a tensor is iterable too (by rows), which would
        // silently split one buffer into parts.
        if !(seq.is_instance_of::<PyList>() || seq.is_instance_of::<PyTuple>()) {
            return Err(PyTypeError::new_err(format!(
                "parts[{i}] is a {}; each item of parts is a list or tuple of buffers",
                seq.get_type().name()?
            )));
        }
        let start = views.len();
        for (j, b) in seq.try_iter()?.enumerate() {
            views.push(View::new(&b?, &format!("parts[{i}][{j}]"), writable)?);
        }
        ranges.push(start..views.len());
    }
    if ranges.len() != n {
        return Err(PyValueError::new_err(format!(
            "{n} keys but {} sequences of parts: one per key",
            ranges.len()
        )));
    }
    Ok((views, ranges))
}

/// `n` keys' shares of `regions` regions: equal runs, in order.
fn regions_per_key(n: usize, regions: usize) -> PyResult<Vec<std::ops::Range<usize>>> {
    if n == 0 && regions == 0 {
        return Ok(Vec::new());
    }
    if n == 0 || regions % n != 0 {
        return Err(PyValueError::new_err(format!(
            "{regions} regions for {n} keys: each key needs the same number"
        )));
    }
    let r = regions / n;
    Ok((0..n).map(|i| i * r..(i + 1) * r).collect())
}

/// Reads `keys[i]` into the spans of `ranges[i]`, the GIL released.
///
/// The spans must be writable, pairwise disjoint, and kept alive by views the caller holds
/// until this returns.
fn get_into_spans(
    py: Python<'_>,
    store: tierkv::Store,
    keys: Vec<BlockKey>,
    spans: Vec<Span>,
    ranges: Vec<std::ops::Range<usize>>,
) -> PyResult<Vec<Option<usize>>> {
    let results = py.detach(move || {
        // SAFETY: the caller's views stay alive (held by its frame, with the GIL) until after
        // `detach` returns; the spans are writable and pairwise disjoint (its contract).
        let mut slices: Vec<&mut [u8]> = spans
            .into_iter()
            .map(|s| unsafe { s.as_mut_slice() })
            .collect();
        let mut per_key: Vec<&mut [&mut [u8]]> = Vec::with_capacity(ranges.len());
        let mut rest: &mut [&mut [u8]] = &mut slices;
        for r in &ranges {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            per_key.push(head);
            rest = tail;
        }
        store.get_many_vectored(&keys, &mut per_key)
    });
    lengths(py, results)
}

/// Puts (`offer` None) or offers after `offer`'s parent `keys[i]` from the spans of
/// `ranges[i]`, the GIL released. The spans must be kept alive by views the caller holds
/// until this returns.
fn put_from_spans(
    py: Python<'_>,
    store: tierkv::Store,
    keys: Vec<BlockKey>,
    spans: Vec<Span>,
    ranges: Vec<std::ops::Range<usize>>,
    offer: Option<Option<BlockKey>>,
) -> PyResult<()> {
    let results = py.detach(move || {
        // SAFETY: the caller's views stay alive (held by its frame, with the GIL) until after
        // `detach` returns; the store only reads them.
        let slices: Vec<&[u8]> = spans.iter().map(|s| unsafe { s.as_slice() }).collect();
        let items: Vec<(BlockKey, &[&[u8]])> = keys
            .into_iter()
            .zip(ranges)
            .map(|(k, r)| (k, &slices[r]))
            .collect();
        match offer {
            None => store.put_many_vectored(&items),
            Some(parent) => store.offer_many_vectored_after(parent.as_ref(), &items),
        }
    });
    batch(py, results).map(drop)
}

fn parse<T: FromStr<Err = tierkv::Error>>(py: Python<'_>, s: &str) -> PyResult<T> {
    py_result(py, s.parse())
}

/// One worker's block store under a root directory (see the `tierkv_g3.Store` docstring in
/// python/tierkv_g3/__init__.py, which subclasses this).
#[pyclass(module = "tierkv_g3._tierkv", name = "Store", subclass, frozen)]
struct PyStore {
    /// `None` once closed. Calls clone the handle (an `Arc`) and release the lock before any
    /// I/O, so close() never waits on I/O under this lock; a batch in flight keeps the store
    /// open until it ends.
    store: RwLock<Option<tierkv::Store>>,
    worker: WorkerId,
}

impl PyStore {
    fn store(&self) -> PyResult<tierkv::Store> {
        self.store
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| errors::ClosedError::new_err("the store is closed"))
    }
}

/// `StoreConfig::default()`'s stats interval in seconds (`None`: no stats file).
fn default_stats_interval() -> Option<f64> {
    StoreConfig::default()
        .stats_interval
        .map(|d| d.as_secs_f64())
}

/// `stats_interval` in seconds as a duration: a positive number, or `None` for off. Too long
/// for a `Duration` (1e300) is an error, not a panic; one that rounds to nothing (1e-300), or
/// is under the store's minimum, the store refuses.
fn seconds(s: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    match s {
        Some(s) if !(s.is_finite() && s > 0.0) => Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds or None, got {s}"
        ))),
        Some(s) => Duration::try_from_secs_f64(s).map(Some).map_err(|e| {
            PyValueError::new_err(format!(
                "{what} must be a positive number of seconds or None, got {s}: {e}"
            ))
        }),
        None => Ok(None),
    }
}

#[pymethods]
impl PyStore {
    /// Every option left out (or `None`) is `StoreConfig::default()`'s: the defaults are
    /// decided once, in Rust. `direct_puts_from` and `stats_interval`, where `None` means
    /// "off", default to the Rust default's value.
    #[new]
    #[pyo3(signature = (
        root, worker, *, capacity_bytes=None, capacity_files=None, policy=None, engine=None,
        read_only=None, verify=None, direct_io=None,
        direct_puts_from=StoreConfig::default().direct_puts_from, sync_writes=None,
        fd_cache=None, max_block_size=None, layout=None, publish=None, watermarks=None,
        queue_depth=None, stats_interval=default_stats_interval(), keep_temp_files=None,
        reuse_evicted=None, sharing=None, negative_ttl=None, events=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        worker: &Bound<'_, PyAny>,
        capacity_bytes: Option<u64>,
        capacity_files: Option<u64>,
        policy: Option<&str>,
        engine: Option<&str>,
        read_only: Option<bool>,
        verify: Option<&str>,
        direct_io: Option<bool>,
        direct_puts_from: Option<usize>,
        sync_writes: Option<bool>,
        fd_cache: Option<usize>,
        max_block_size: Option<usize>,
        layout: Option<(u8, u32)>,
        publish: Option<&str>,
        watermarks: Option<(f64, f64)>,
        queue_depth: Option<u32>,
        stats_interval: Option<f64>,
        keep_temp_files: Option<bool>,
        reuse_evicted: Option<bool>,
        sharing: Option<&str>,
        negative_ttl: Option<f64>,
        events: Option<bool>,
    ) -> PyResult<Self> {
        // A worker is a name; a TP rank may be given as an int.
        let worker: String = if worker.is_instance_of::<pyo3::types::PyInt>() {
            worker.str()?.to_string()
        } else {
            worker.extract()?
        };
        let worker = py_result(py, WorkerId::new(&worker))?;
        let mut config = StoreConfig::default()
            .with_direct_puts_from(direct_puts_from)
            .with_stats_interval(seconds(stats_interval, "stats_interval")?);
        if let Some(p) = policy {
            config = config.with_policy(parse::<PolicyKind>(py, p)?);
        }
        if let Some(e) = engine {
            config = config.with_engine(parse::<EngineKind>(py, e)?);
        }
        if let Some(v) = verify {
            config = config.with_verify(parse::<VerifyMode>(py, v)?);
        }
        if let Some(p) = publish {
            config = config.with_publish(parse::<Publish>(py, p)?);
        }
        if let Some(s) = sharing {
            config = config.with_sharing(parse::<Sharing>(py, s)?);
        }
        if let Some(on) = read_only {
            config = config.with_read_only(on);
        }
        if let Some(on) = direct_io {
            config = config.with_direct_io(on);
        }
        if let Some(on) = sync_writes {
            config = config.with_sync_writes(on);
        }
        if let Some(on) = reuse_evicted {
            config = config.with_reuse_evicted(on);
        }
        if let Some(on) = events {
            config = config.with_events(on);
        }
        if let Some(on) = keep_temp_files {
            config.keep_temp_files = on;
        }
        if let Some(t) = negative_ttl {
            config = config.with_negative_ttl(Duration::try_from_secs_f64(t).map_err(|e| {
                PyValueError::new_err(format!(
                    "negative_ttl must be a number of seconds >= 0, got {t}: {e}"
                ))
            })?);
        }
        if let Some(b) = capacity_bytes {
            config = config.with_capacity_bytes(b);
        }
        if let Some(f) = capacity_files {
            config = config.with_capacity_files(f);
        }
        if let Some(n) = fd_cache {
            config = config.with_fd_cache(n);
        }
        if let Some(n) = max_block_size {
            config = config.with_max_block_size(n);
        }
        if let Some((depth, fanout)) = layout {
            config = config.with_layout(py_result(py, Layout::new(depth, fanout))?);
        }
        if let Some((high, low)) = watermarks {
            config = config.with_watermarks(high, low);
        }
        if let Some(d) = queue_depth {
            config = config.with_queue_depth(d);
        }
        let w = worker.clone();
        let store = py.detach(move || tierkv::Store::open(root, w, config));
        Ok(PyStore {
            store: RwLock::new(Some(py_result(py, store)?)),
            worker,
        })
    }

    /// Closes the store: stops its background threads, writes its last counters and
    /// releases the worker lock, so the worker can be opened again at once. A batch still
    /// running in another thread finishes first (the store closes when it ends). Closing
    /// twice is fine; any other call on a closed store raises `tierkv_g3.ClosedError`.
    fn close(&self, py: Python<'_>) {
        let store = self.store.write().unwrap_or_else(|e| e.into_inner()).take();
        // Dropping the last handle joins the store's threads: without the GIL.
        py.detach(move || drop(store));
    }

    /// True once `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.store
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// The worker id (the directory name under `<root>/v1/`).
    #[getter]
    fn worker(&self) -> &str {
        self.worker.as_str()
    }

    /// The worker's directory, `<root>/v1/<worker>`.
    #[getter]
    fn dir(&self) -> PyResult<PathBuf> {
        Ok(self.store()?.dir().to_path_buf())
    }

    /// The I/O engine in use (`psync`, `io_uring`, `nixl`; `auto` resolves to one of them).
    #[getter]
    fn engine(&self) -> PyResult<&'static str> {
        Ok(self.store()?.engine_name())
    }

    /// The eviction policy in use.
    #[getter]
    fn policy(&self) -> PyResult<&'static str> {
        Ok(self.store()?.policy_name())
    }

    /// True if opened with read_only=True.
    #[getter]
    fn read_only(&self) -> PyResult<bool> {
        Ok(self.store()?.is_read_only())
    }

    /// The file a block is (or would be) stored at.
    fn path_of(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
        Ok(self.store()?.path_of(&hash_of(py, key)?))
    }

    fn __repr__(&self) -> String {
        match self.store() {
            Ok(s) => format!(
                "<tierkv_g3.Store worker={:?} dir={:?} engine={} policy={}>",
                self.worker.as_str(),
                s.dir().display().to_string(),
                s.engine_name(),
                s.policy_name()
            ),
            Err(_) => format!("<tierkv_g3.Store worker={:?} closed>", self.worker.as_str()),
        }
    }

    /// Stores a batch of blocks: `buffers[i]` under `keys[i]`, read in place (any object
    /// with a contiguous buffer: bytes, bytearray, memoryview, numpy array; a torch CPU
    /// tensor through `__dlpack__`). The batch is one chain, root first: `keys[i]`'s parent
    /// is `keys[i - 1]`, so eviction cuts it from the tail and removing a block removes what
    /// follows it. Each put is atomic (temp file + rename); an existing key is replaced. A
    /// block that does not fit the capacity is not stored (no error; `stats()` counts it in
    /// `not_admitted`). Raises the first failing item's error, with its `index`; the other
    /// items were still attempted. The GIL is released during the I/O.
    fn put_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.put(py, keys, buffers, None)
    }

    /// As `put_many`, the call an engine makes after computing a request's blocks: blocks
    /// already stored are only marked as used, absent ones are stored. `parent`: the last
    /// key of the request's cached prefix (the chain parent of `keys[0]`), or None if `keys`
    /// starts at the root; if `parent` is no longer stored, nothing is.
    #[pyo3(signature = (keys, buffers, parent=None))]
    fn offer_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
        parent: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let parent = self.parent_key(py, parent)?;
        self.put(py, keys, buffers, Some(parent))
    }

    /// Reads a batch of blocks into caller-owned writable buffers (bytearray, numpy array,
    /// writable memoryview; contiguous), in place, each block at the front of its buffer.
    /// Returns, per key, the block's length, or None for a miss (absent, evicted, deleted or
    /// corrupt): a miss is never an exception. A buffer smaller than its block raises
    /// `BufferTooSmallError`. Buffers must not share memory, and must not be touched by
    /// another thread until the call returns. The GIL is released during the I/O.
    fn get_many_into(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<usize>>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let views = views_of(buffers, keys.len(), true)?;
        let spans: Vec<Span> = views.iter().map(View::span).collect();
        buffer::check_disjoint(&spans)?;
        let results = py.detach(move || {
            // SAFETY: the views stay alive (held by this frame, with the GIL) until after
            // `detach` returns; the spans are writable and pairwise disjoint (checked above).
            let mut bufs: Vec<&mut [u8]> = spans
                .into_iter()
                .map(|s| unsafe { s.as_mut_slice() })
                .collect();
            store.get_many(&keys, &mut bufs)
        });
        drop(views);
        lengths(py, results)
    }

    /// As `put_many`, for blocks held in several buffers: `parts[i]` is a sequence of
    /// buffers (an MHA page's K and V regions), written in order as the payload of
    /// `keys[i]`, each read in place (no copy into one buffer). The blocks read back with
    /// `get_many_into` (one buffer) or `get_many_into_vectored` (parts). The GIL is
    /// released during the I/O.
    fn put_many_vectored(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.put_vectored(py, keys, parts, None)
    }

    /// As `offer_many`, for blocks held in several buffers (as `put_many_vectored`): blocks
    /// already stored are only marked as used, absent ones are written from their parts in
    /// place. `parent`: the last key of the request's cached prefix (the chain parent of
    /// `keys[0]`), or None if `keys` starts at the root; if `parent` is no longer stored,
    /// nothing is. The GIL is released during the I/O.
    #[pyo3(signature = (keys, parts, parent=None))]
    fn offer_many_vectored(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
        parent: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let parent = self.parent_key(py, parent)?;
        self.put_vectored(py, keys, parts, Some(parent))
    }

    /// As `get_many_into`, into several writable buffers per block: `parts[i]` is a
    /// sequence of buffers filled in order with the payload of `keys[i]` (an MHA page's K
    /// and V regions). Returns per key the block's length or None (a miss). Parts that
    /// together are smaller than the block raise `BufferTooSmallError`; no two buffers of
    /// the whole call may share memory. The GIL is released during the I/O.
    fn get_many_into_vectored(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<usize>>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let (views, ranges) = part_views_of(parts, keys.len(), true)?;
        let spans: Vec<Span> = views.iter().map(View::span).collect();
        let names = |flat: usize| {
            let i = ranges.partition_point(|r| r.end <= flat);
            format!("parts[{i}][{}]", flat - ranges[i].start)
        };
        buffer::check_disjoint_by(&spans, &names)?;
        let r = get_into_spans(py, store, keys, spans, ranges);
        drop(views);
        r
    }

    /// As `get_many_into_vectored`, the regions given as addresses inside `memory` (a
    /// writable buffer, or a list or tuple of them: an engine's KV pool), exported once:
    /// block `keys[i]` fills regions `i * r .. (i + 1) * r` of `(addresses, sizes)` in
    /// order, `r = len(addresses) // len(keys)`. A region not wholly inside one buffer of
    /// `memory` is a `ValueError` (nothing outside it is touched); no two regions may share
    /// memory. No Python object per region: for SGLang's `get_page_buffer_meta`.
    fn get_many_into_regions(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        memory: &Bound<'_, PyAny>,
        addresses: Vec<usize>,
        sizes: Vec<usize>,
    ) -> PyResult<Vec<Option<usize>>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let (views, spans) = buffer::region_spans(memory, &addresses, &sizes, true)?;
        buffer::check_disjoint_by(&spans, &|i| format!("region {i}"))?;
        let ranges = regions_per_key(keys.len(), spans.len())?;
        let r = get_into_spans(py, store, keys, spans, ranges);
        drop(views);
        r
    }

    /// As `put_many_vectored`, the regions given as addresses inside `memory` (a buffer, or a
    /// list or tuple of them), as `get_many_into_regions` takes them.
    fn put_many_regions(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        memory: &Bound<'_, PyAny>,
        addresses: Vec<usize>,
        sizes: Vec<usize>,
    ) -> PyResult<()> {
        self.put_regions(py, keys, memory, (addresses, sizes), None)
    }

    /// As `offer_many_vectored` (`parent`: the stored key before `keys[0]`, None at a chain's
    /// root), the regions given as addresses inside `memory`, as `get_many_into_regions`
    /// takes them.
    #[pyo3(signature = (keys, memory, addresses, sizes, parent=None))]
    fn offer_many_regions(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        memory: &Bound<'_, PyAny>,
        addresses: Vec<usize>,
        sizes: Vec<usize>,
        parent: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let parent = self.parent_key(py, parent)?;
        self.put_regions(py, keys, memory, (addresses, sizes), Some(parent))
    }

    /// How many leading keys of a chain are stored (stops at the first absent one): the
    /// question an engine asks for a request's prefix. Cheap (the index, then one `stat`).
    fn contains_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.contains_prefix(&keys));
        py_result(py, r)
    }

    /// How many leading keys are stored, answered from what the store remembers (the Rust
    /// `Store::lookup_prefix`): a key once found costs no system call; one a shared store
    /// lacks is looked up in the tree once per `negative_ttl`. For a scheduler's lookups at
    /// every step; `recheck_many` makes it look again.
    fn lookup_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.lookup_prefix(&keys));
        py_result(py, r)
    }

    /// Per key, whether it is stored, answered as `lookup_prefix` answers (from memory; a key
    /// a shared store lacks is asked of the tree once per `negative_ttl`). With `tree=False`,
    /// only what the store's index holds: no system call at all.
    #[pyo3(signature = (keys, tree=true))]
    fn lookup_many(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        tree: bool,
    ) -> PyResult<Vec<bool>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        if !tree {
            return Ok(store.known_many(&keys));
        }
        let r = py.detach(move || store.lookup_many(&keys));
        batch(py, r)
    }

    /// Whether the store's index holds the block of the engine key `key` under `context`
    /// (`engine_key(context, key)`), with no system call: a scheduler's lookup of one key in
    /// one call, without building a key or a list in Python (`lookup_many(..., tree=False)`
    /// of one folded key answers the same).
    fn knows_engine_key(&self, context: &[u8], key: &[u8]) -> PyResult<bool> {
        let store = self.store()?;
        let k = BlockKey::new(self.worker.clone(), BlockHash::of_engine_key(context, key));
        Ok(store.known_many(std::slice::from_ref(&k))[0])
    }

    /// Makes `lookup_prefix` look at these keys in the tree again: one it found is checked now
    /// (forgotten if its file is gone), one it remembered as absent is forgotten as such.
    fn recheck_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.recheck_many(&keys));
        py_result(py, r)
    }

    /// Whether each key is stored (a list of bool, any order of keys).
    fn contains_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.contains_many(&keys));
        batch(py, r)
    }

    /// Removes blocks (and, within their chains, the blocks after them); per key True if a
    /// block was removed, False if it was absent.
    fn remove_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.remove_many(&keys));
        batch(py, r)
    }

    /// Removes exactly these blocks (the blocks after them in their chains stay, detached):
    /// for keys that name independent objects. Per key True if a block was removed.
    fn discard_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.discard_many(&keys));
        batch(py, r)
    }

    /// Pins blocks: this store never evicts a pinned block until as many `unpin_many` calls
    /// name it (or the store closes); per key True if it is stored and now pinned. A
    /// removal still removes it; in shared mode another store may still evict it (a miss).
    fn pin_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let r = py.detach(move || store.pin_many(&keys));
        batch(py, r)
    }

    /// Releases one pin of each key (`pin_many`); keys not pinned are ignored.
    fn unpin_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        py_result(py, store.unpin_many(&keys))
    }

    /// Removes every block of this worker (the Rust `Store::clear`): those this store knows
    /// and those other stores put in the tree. The worker's directories and control files
    /// stay, so other stores open on it (other ranks, replicas) keep working and keep what is
    /// put after. Returns how many block files were removed. The GIL is released meanwhile.
    fn clear(&self, py: Python<'_>) -> PyResult<u64> {
        let store = self.store()?;
        let r = py.detach(move || store.clear());
        py_result(py, r)
    }

    /// Marks stored blocks as used, in chain order, without reading them (e.g. a prefix the
    /// engine still holds in a faster tier). Absent keys are ignored.
    fn touch_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        py_result(py, store.touch_many(&keys))
    }

    /// The store's counters since it opened, as a dict: hits, misses, bytes_read,
    /// bytes_written, puts, evictions, not_admitted, corrupt, used_bytes, used_files,
    /// capacity_bytes, fd_cache_* , errors (by kind), get_latency and put_latency (count,
    /// mean_ns, p50_ns, p99_ns, max_ns), ... (the Rust `StoreStats`, field for field).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.store()?.stats();
        let v = serde_json::to_value(&stats)
            .map_err(|e| errors::Error::new_err(format!("stats: {e}")))?;
        json_to_py(py, &v)
    }

    /// The worker's events from `start` on (at most `max`), from its event journal
    /// (`events=True`, docs/events.md): `(events, next, missed, journal_id)`, each event a
    /// tuple `(seq, kind, cause, key, node, pid, unix_ms)` (`kind` "stored" or "removed",
    /// `cause` "put", "evicted", "removed", "corrupt", "missing" or "repair", `key` the
    /// block's 32 bytes). `missed`: events asked for that the ring no longer holds (resync
    /// from a listing); a `journal_id` that changes means the journal was made again. Reads
    /// the file without the GIL.
    /// Where the worker's event journal ends now: `(next, journal_id)`, to tail it from
    /// here with `events_since(next)`; `(0, 0)` without a journal.
    fn events_end(&self, py: Python<'_>) -> PyResult<(u64, u64)> {
        let store = self.store()?;
        let end = py_result(py, py.detach(move || store.events_end()))?;
        Ok((end.next, end.journal_id))
    }

    #[pyo3(signature = (start, max=4096))]
    fn events_since(&self, py: Python<'_>, start: u64, max: usize) -> PyResult<tree::EventsTuple> {
        let store = self.store()?;
        let read = py_result(py, py.detach(move || store.events_since(start, max)))?;
        Ok(tree::events_tuple(read))
    }
}

impl PyStore {
    /// `put_many_vectored` (`offer` None) or `offer_many_vectored` (`offer`: the parent).
    fn put_vectored(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyAny>,
        offer: Option<Option<BlockKey>>,
    ) -> PyResult<()> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let (views, ranges) = part_views_of(parts, keys.len(), false)?;
        let spans: Vec<Span> = views.iter().map(View::span).collect();
        let r = put_from_spans(py, store, keys, spans, ranges, offer);
        drop(views);
        r
    }

    /// An offer's `parent` argument as this worker's key (None: the chain's root).
    fn parent_key(
        &self,
        py: Python<'_>,
        parent: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<BlockKey>> {
        parent
            .map(|p| hash_of(py, p).map(|h| BlockKey::new(self.worker.clone(), h)))
            .transpose()
    }

    /// `put_many_regions` (`offer` None) or `offer_many_regions` (`offer`: the parent).
    fn put_regions(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        memory: &Bound<'_, PyAny>,
        (addresses, sizes): (Vec<usize>, Vec<usize>),
        offer: Option<Option<BlockKey>>,
    ) -> PyResult<()> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let (views, spans) = buffer::region_spans(memory, &addresses, &sizes, false)?;
        let ranges = regions_per_key(keys.len(), spans.len())?;
        let r = put_from_spans(py, store, keys, spans, ranges, offer);
        drop(views);
        r
    }

    /// put_many (`offer: None`) or offer_many (`offer: Some(parent)`).
    fn put(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        buffers: &Bound<'_, PyAny>,
        offer: Option<Option<BlockKey>>,
    ) -> PyResult<()> {
        let store = self.store()?;
        let keys = keys_of(py, &self.worker, keys)?;
        let views = views_of(buffers, keys.len(), false)?;
        let spans: Vec<Span> = views.iter().map(View::span).collect();
        let results = py.detach(move || {
            // SAFETY: the views stay alive (held by this frame, with the GIL) until after
            // `detach` returns; the store only reads them.
            let items: Vec<(BlockKey, &[u8])> = keys
                .into_iter()
                .zip(spans.into_iter().map(|s| unsafe { s.as_slice() }))
                .collect();
            match offer {
                None => store.put_many(&items),
                Some(parent) => store.offer_many_after(parent.as_ref(), &items),
            }
        });
        drop(views);
        batch(py, results).map(drop)
    }
}

fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (_, Some(i)) => i.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// The chain hashes of every full block of `token_ids` (`block_tokens` tokens each), as
/// 64-character lower-case hex strings: the same hashes as the Rust `BlockHash::chain_all`
/// (blake3 over a domain tag, the parent's hash, the token count and the ids as little-endian
/// u32; docs/format.md). A trailing partial block gets no hash. `parent`: the hash of the
/// block before `token_ids` (continuing a chain), or None for a chain's root.
#[pyfunction]
#[pyo3(signature = (token_ids, block_tokens, parent=None))]
fn chain_hashes(
    py: Python<'_>,
    token_ids: Vec<u32>,
    block_tokens: usize,
    parent: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<String>> {
    if block_tokens == 0 {
        return Err(PyValueError::new_err("block_tokens must be positive"));
    }
    let parent = parent.map(|p| hash_of(py, p)).transpose()?;
    Ok(py.detach(move || {
        BlockHash::chain_all_from(parent.as_ref(), &token_ids, block_tokens)
            .iter()
            .map(BlockHash::to_hex)
            .collect()
    }))
}

/// The 32-byte block hash of an inference engine's own key under `context` (which engine,
/// and what its keys are relative to): the Rust `BlockHash::of_engine_key`, the one fold of
/// engine keys every backend uses.
#[pyfunction]
fn engine_key<'py>(py: Python<'py>, context: &[u8], key: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &BlockHash::of_engine_key(context, key).0)
}

/// The worker id `<prefix>.<16 hex>` of a configuration described by `description_json` (a
/// JSON text): the Rust `WorkerId::from_description`, over the description's canonical JSON,
/// the one derivation of worker ids every backend uses. An invalid prefix is
/// `tierkv_g3.InvalidKeyError`; text that is not JSON a `ValueError`.
#[pyfunction]
fn _worker_id(py: Python<'_>, prefix: &str, description_json: &str) -> PyResult<String> {
    let description: serde_json::Value = serde_json::from_str(description_json)
        .map_err(|e| PyValueError::new_err(format!("worker description is not JSON: {e}")))?;
    py_result(py, WorkerId::from_description(prefix, &description)).map(|w| w.as_str().to_owned())
}

/// Raises the exception a Rust error of kind `kind` becomes (for the tests of the mapping:
/// some kinds cannot be provoked from Python on every machine).
#[pyfunction]
fn _raise_rust_error(py: Python<'_>, kind: &str) -> PyResult<()> {
    use std::io;
    use tierkv::Error as E;
    let path = || PathBuf::from("/cache/v1/rank0/ab/cd/x");
    let e = match kind {
        "InvalidKey" => E::InvalidKey {
            reason: "test".into(),
        },
        "TooLarge" => E::TooLarge {
            key: "rank0/ab".into(),
            len: 2,
            max: 1,
        },
        "BufferTooSmall" => E::BufferTooSmall {
            key: "rank0/ab".into(),
            need: 2,
            have: 1,
        },
        "NoSpace" => E::from_io(path(), io::Error::from_raw_os_error(28)),
        "TooManyOpenFiles" => E::from_io(path(), io::Error::from_raw_os_error(24)),
        "Corrupt" => E::Corrupt {
            path: path(),
            reason: tierkv::CorruptReason::Checksum,
        },
        "ReadOnly" => E::ReadOnly {
            path: path(),
            op: "put",
        },
        "LayoutMismatch" => E::LayoutMismatch {
            path: path(),
            found: "a".into(),
            configured: "b".into(),
        },
        "WorkerBusy" => E::WorkerBusy {
            path: path(),
            holder: "pid 1 on host".into(),
        },
        "Unsupported" => E::Unsupported("test".into()),
        "Config" => E::Config("test".into()),
        "Io" => E::from_io(path(), io::Error::from_raw_os_error(5)),
        _ => return Err(PyValueError::new_err(format!("unknown kind {kind:?}"))),
    };
    Err(errors::to_py(py, e, Some(3)))
}

/// tierkv: the disk tier of an LLM inference engine's KV cache (native module).
#[pymodule]
fn _tierkv(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStore>()?;
    m.add_class::<lmcache::LMCacheConnector>()?;
    m.add_class::<transfer::PyTransfers>()?;
    m.add_class::<offload::PyOffloader>()?;
    m.add_class::<tail::PyEventTail>()?;
    m.add_function(wrap_pyfunction!(chain_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(engine_key, m)?)?;
    m.add_function(wrap_pyfunction!(_worker_id, m)?)?;
    m.add_function(wrap_pyfunction!(_raise_rust_error, m)?)?;
    m.add_function(wrap_pyfunction!(tree::workers, m)?)?;
    m.add_function(wrap_pyfunction!(tree::journal_since, m)?)?;
    m.add_function(wrap_pyfunction!(tree::journal_end, m)?)?;
    m.add_function(wrap_pyfunction!(tree::tree_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(tree::filesystem, m)?)?;
    errors::register(m)?;
    Ok(())
}
