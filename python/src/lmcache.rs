//! The native object of LMCache's multiprocess mode (`lmcache server --l2-adapter
//! '{"type": "native_plugin", ...}'`): `tierkv_g3.LMCacheConnector`.
//!
//! LMCache's `NativeConnectorL2Adapter` (lmcache/v1/distributed/l2_adapters/
//! native_connector_l2_adapter.py) calls `submit_batch_get/set/exists` under its own lock and
//! expects each to return at once with a future id; a demux thread of its own polls
//! `event_fd()` and calls `drain_completions()` for `(id, ok, error, bools|None)` tuples. This
//! object is a [`tierkv::Completions`] queue over a store: the batches run on the queue's own
//! threads (no Python thread per call, the GIL free), straight from and into LMCache's buffers.
//!
//! A submission exports its buffers (the buffer protocol, as the store's own calls do) and
//! keeps the views in a table under the batch's id until its completion is collected, so
//! LMCache's memory stays alive and in place while a queue thread reads or fills it. A
//! submission that cannot run (a key that is not a str or bytes, a read-only destination, a
//! count of buffers that does not match) is never an exception: it becomes an empty batch of
//! the queue whose completion carries the failure, so it comes back through the eventfd in
//! order like any other.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use tierkv::{BlockHash, BlockKey, Completion, Completions, Lookup, Outcome, WorkerId};

use crate::buffer::{self, Span, View};
use crate::errors;

/// The engine-key context LMCache's MP keys are folded under (docs/engines-lmcache.md, MP mode).
const KEY_CONTEXT: &[u8] = b"lmcache-mp";

/// The block hash of an LMCache key: [`BlockHash::of_engine_key`] (the one fold of engine keys)
/// over the key's bytes (`<model>@<kv_rank>@<group>@<chunk_hash>[@<salt>]`, whose fields cannot
/// contain `@`), so keys of two models, ranks, groups or salts never name the same block.
pub fn fold_key(key: &[u8]) -> BlockHash {
    BlockHash::of_engine_key(KEY_CONTEXT, key)
}

/// A buffer of LMCache's, as a queue thread sees it: the memory of a [`View`] that the
/// connector's table holds until the batch's completion is collected.
struct SpanBuf(Span);

impl AsRef<[u8]> for SpanBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the span's view lives in the connector's table until the completion that
        // carries this buffer is collected, which is after the queue thread's last use; LMCache
        // does not touch a buffer while its batch is in flight (its contract with the adapter).
        unsafe { self.0.as_slice() }
    }
}

impl AsMut<[u8]> for SpanBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_ref`; the queue calls this for get batches only, whose views were
        // exported writable and checked pairwise disjoint when submitted.
        unsafe { self.0.as_mut_slice() }
    }
}

/// The exported buffers of a batch in flight.
struct Held(#[expect(dead_code, reason = "held to be released when dropped")] Vec<View>);

// SAFETY: a `View` must be created and released with the GIL held. `Held` values are made in
// the submit calls and dropped in `drain_completions`, `close` or the connector's drop, all of
// which run with the GIL; in between they only sit in the table (under a mutex), untouched.
unsafe impl Send for Held {}

/// What the table keeps of a batch in flight, to turn its completion into LMCache's tuple.
enum Pending {
    /// A get or set: the exported buffers.
    Buffers(#[expect(dead_code, reason = "held to be released when dropped")] Held),
    /// An exists or a delete: nothing to keep.
    Keys,
    /// A submission that was refused: the message its completion carries.
    Refused(String),
}

/// LMCache's completion tuple: `(future_id, ok, error, bools | None)`.
type Done = (u64, bool, String, Option<Vec<bool>>);

/// The connector's state, under one mutex: submissions register their batch in the table in
/// the same critical section as they queue it, so a completion is never collected before its
/// entry exists.
struct State {
    /// `None` once closed.
    queue: Option<Completions<SpanBuf>>,
    table: HashMap<u64, Pending>,
    /// Completions that `close` collected, and refusals after it: the next drain returns them.
    closed: Vec<Done>,
    /// Ids of submissions after `close` (above the queue's, which count from 1).
    next_closed_id: u64,
}

impl Drop for State {
    fn drop(&mut self) {
        // The queue first: dropping it runs what is queued and joins its threads, so no
        // thread still uses a buffer when the table (and its views) are dropped after it.
        drop(self.queue.take());
    }
}

/// The object LMCache's `native_plugin` L2 adapter wraps (see the module docs): a disk store
/// of tierkv behind a completion queue. `LMCacheConnector(root, worker="lmcache", threads=4,
/// **options)`: `options` are `tierkv_g3.Store`'s keyword arguments (capacity_bytes,
/// direct_io, verify, ...); `sharing` is `"shared"` unless given.
#[pyclass(module = "tierkv_g3._tierkv", name = "LMCacheConnector", frozen)]
pub struct LMCacheConnector {
    state: Mutex<State>,
    worker: WorkerId,
    /// The worker's directory (for `repr`).
    dir: PathBuf,
}

impl LMCacheConnector {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues what `prepare` made of a submission, or its refusal; returns the id.
    fn submit(&self, prepared: Result<Batch, String>) -> u64 {
        let mut guard = self.state();
        let st = &mut *guard;
        let Some(q) = st.queue.as_ref() else {
            let id = st.next_closed_id;
            st.next_closed_id += 1;
            let msg = match &prepared {
                Err(m) => m.clone(),
                Ok(_) => "the connector is closed".into(),
            };
            st.closed.push((id, false, msg, None));
            drop(guard);
            // Its views are released outside the lock (a release may run Python code).
            drop(prepared);
            return id;
        };
        let (id, pending) = match prepared {
            Ok(Batch::Get(keys, bufs, held)) => (q.submit_get(keys, bufs), Pending::Buffers(held)),
            Ok(Batch::Set(items, held)) => (q.submit_set(items), Pending::Buffers(held)),
            Ok(Batch::Exists(keys)) => (q.submit_exists(keys), Pending::Keys),
            Ok(Batch::Delete(keys)) => (q.submit_discard(keys), Pending::Keys),
            // An empty batch: its completion comes back through the eventfd in order.
            Err(msg) => (q.submit_exists(Vec::new()), Pending::Refused(msg)),
        };
        st.table.insert(id, pending);
        id
    }

    fn keys(&self, keys: &Bound<'_, PyAny>) -> Result<Vec<BlockKey>, String> {
        if keys.is_instance_of::<PyString>() || keys.is_instance_of::<PyBytes>() {
            return Err("keys is a list of keys, not one key".into());
        }
        let iter = keys.try_iter().map_err(|e| format!("keys: {e}"))?;
        iter.enumerate()
            .map(|(i, k)| {
                let k = k.map_err(|e| format!("keys: {e}"))?;
                let hash = if let Ok(s) = k.cast::<PyString>() {
                    fold_key(
                        s.to_cow()
                            .map_err(|e| format!("keys[{i}]: {e}"))?
                            .as_bytes(),
                    )
                } else if let Ok(b) = k.cast::<PyBytes>() {
                    fold_key(b.as_bytes())
                } else {
                    let t = k.get_type().name().map(|n| n.to_string());
                    return Err(format!(
                        "keys[{i}] is a {}, not a str or bytes",
                        t.unwrap_or_default()
                    ));
                };
                Ok(BlockKey::new(self.worker.clone(), hash))
            })
            .collect()
    }
}

/// A submission ready to queue.
enum Batch {
    Get(Vec<BlockKey>, Vec<SpanBuf>, Held),
    Set(Vec<(BlockKey, SpanBuf)>, Held),
    Exists(Vec<BlockKey>),
    Delete(Vec<BlockKey>),
}

/// Exports one buffer per key (writable ones for a get, pairwise disjoint).
fn views(buffers: &Bound<'_, PyAny>, n: usize, writable: bool) -> Result<Vec<View>, String> {
    let iter = buffers.try_iter().map_err(|e| format!("buffers: {e}"))?;
    let views = iter
        .enumerate()
        .map(|(i, b)| {
            let b = b.map_err(|e| format!("buffers: {e}"))?;
            View::new(&b, &format!("buffers[{i}]"), writable).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<View>, String>>()?;
    if views.len() != n {
        return Err(format!(
            "{n} keys but {} buffers: one buffer per key",
            views.len()
        ));
    }
    if writable {
        let spans: Vec<Span> = views.iter().map(View::span).collect();
        buffer::check_disjoint(&spans).map_err(|e| e.to_string())?;
    }
    Ok(views)
}

/// The first error of a batch as a message (with its position and, through the error, its
/// path), and how many of its results failed.
fn first_error<T>(results: &[tierkv::Result<T>]) -> Option<String> {
    let failed = results.iter().filter(|r| r.is_err()).count();
    let (i, e) = results
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))?;
    Some(format!(
        "{failed} of {} keys failed; keys[{i}]: {e}",
        results.len()
    ))
}

/// LMCache's tuple for a finished batch. A get says per key whether its buffer was filled
/// (a miss, an error or a block of another length than the buffer is `False`: LMCache loads
/// the keys marked `True` whatever `ok` says); `ok` is whether every key was. An exists gives
/// per key whether it is stored, or `None` with the error; a delete per key whether a block
/// was removed. A set gives `None`.
fn tuple_of(c: Completion<SpanBuf>, pending: Option<Pending>) -> Done {
    let id = c.id;
    if let Some(Pending::Refused(msg)) = pending {
        return (id, false, msg, None);
    }
    match c.outcome {
        Outcome::Get { results, bufs } => {
            let mut why = first_error(&results);
            let mut bools = Vec::with_capacity(results.len());
            for (i, (r, b)) in results.iter().zip(&bufs).enumerate() {
                let filled = match r {
                    Ok(Lookup::Hit(n)) if *n == b.0.len() => true,
                    Ok(Lookup::Hit(n)) => {
                        why.get_or_insert_with(|| {
                            format!(
                                "keys[{i}]: the block is {n} bytes, its buffer {}",
                                b.0.len()
                            )
                        });
                        false
                    }
                    Ok(Lookup::Miss) => {
                        why.get_or_insert_with(|| format!("keys[{i}]: not stored"));
                        false
                    }
                    Err(_) => false,
                };
                bools.push(filled);
            }
            (id, why.is_none(), why.unwrap_or_default(), Some(bools))
        }
        Outcome::Set { results, .. } => match first_error(&results) {
            None => (id, true, String::new(), None),
            Some(msg) => (id, false, msg, None),
        },
        Outcome::Exists { results } | Outcome::Remove { results } => match first_error(&results) {
            None => {
                let found = results.into_iter().map(|r| r.unwrap_or(false)).collect();
                (id, true, String::new(), Some(found))
            }
            Some(msg) => (id, false, msg, None),
        },
        _ => (
            id,
            false,
            "an outcome this connector never submits".into(),
            None,
        ),
    }
}

#[pymethods]
impl LMCacheConnector {
    #[new]
    #[pyo3(signature = (root, worker="lmcache", threads=4, **options))]
    fn new(
        py: Python<'_>,
        root: PathBuf,
        worker: &str,
        threads: usize,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // The store's own constructor parses and checks the options. Several `lmcache
        // server`s of one model on one root (replicas) open the same worker: shared unless
        // the options say otherwise.
        let options = match options {
            Some(o) => o.copy()?,
            None => PyDict::new(py),
        };
        if !options.contains("sharing")? {
            options.set_item("sharing", "shared")?;
        }
        let opened = py
            .get_type::<crate::PyStore>()
            .call((root, worker), Some(&options))?;
        let store = opened.cast::<crate::PyStore>()?.get().store()?;
        let worker = store.worker().clone();
        let dir = store.dir().to_path_buf();
        let queue = py
            .detach(move || Completions::new(store, threads))
            .map_err(|e| errors::to_py(py, e, None))?;
        Ok(LMCacheConnector {
            state: Mutex::new(State {
                queue: Some(queue),
                table: HashMap::new(),
                closed: Vec::new(),
                next_closed_id: 1 << 62,
            }),
            worker,
            dir,
        })
    }

    /// The queue's eventfd: readable while finished batches wait for `drain_completions`
    /// (which resets it). Raises `ClosedError` after `close()`.
    fn event_fd(&self) -> PyResult<i32> {
        match &self.state().queue {
            Some(q) => Ok(q.event_fd().as_raw_fd()),
            None => Err(errors::ClosedError::new_err("the connector is closed")),
        }
    }

    /// Queues a read of each key's block into its buffer (writable, contiguous, one per key,
    /// filled in place; untouched until the completion is collected); returns the id.
    fn submit_batch_get(&self, keys: &Bound<'_, PyAny>, memoryviews: &Bound<'_, PyAny>) -> u64 {
        let prepared = self.keys(keys).and_then(|keys| {
            let views = views(memoryviews, keys.len(), true)?;
            let bufs = views.iter().map(|v| SpanBuf(v.span())).collect();
            Ok(Batch::Get(keys, bufs, Held(views)))
        });
        self.submit(prepared)
    }

    /// Queues a write of each buffer as its key's block (a batch is stored as one chain,
    /// root first); returns the id. The buffers are read in place, so LMCache must not
    /// change them until the completion is collected.
    fn submit_batch_set(&self, keys: &Bound<'_, PyAny>, memoryviews: &Bound<'_, PyAny>) -> u64 {
        let prepared = self.keys(keys).and_then(|keys| {
            let views = views(memoryviews, keys.len(), false)?;
            let items = keys
                .into_iter()
                .zip(views.iter().map(|v| SpanBuf(v.span())))
                .collect();
            Ok(Batch::Set(items, Held(views)))
        });
        self.submit(prepared)
    }

    /// Queues a lookup of which keys are stored; returns the id.
    fn submit_batch_exists(&self, keys: &Bound<'_, PyAny>) -> u64 {
        self.submit(self.keys(keys).map(Batch::Exists))
    }

    /// Queues a removal of the keys' blocks; returns the id. Its completion says per key
    /// whether a block was removed. Only the keys named go: the blocks stored after them in
    /// their batch's chain stay.
    fn submit_batch_delete(&self, keys: &Bound<'_, PyAny>) -> u64 {
        self.submit(self.keys(keys).map(Batch::Delete))
    }

    /// The finished batches, without waiting: `[(id, ok, error, bools | None)]` (see
    /// docs/engines-lmcache.md, MP mode for what each operation gives). Never raises.
    fn drain_completions(&self) -> Vec<Done> {
        let mut st = self.state();
        let mut out = std::mem::take(&mut st.closed);
        let mut finished = Vec::new();
        if let Some(q) = st.queue.as_ref() {
            for c in q.drain() {
                let pending = st.table.remove(&c.id);
                finished.push((c, pending));
            }
        }
        drop(st);
        // The views are released here, with the GIL and outside the lock.
        out.extend(finished.into_iter().map(|(c, p)| tuple_of(c, p)));
        out
    }

    /// Finishes every batch already submitted (LMCache's buffers are not used after this
    /// returns), stops the queue's threads and closes the store; the completions not yet
    /// collected stay for `drain_completions`. Submissions after it fail (in their
    /// completion). Closing twice is fine. The GIL is released while batches finish.
    fn close(&self, py: Python<'_>) {
        let (queue, mut table) = {
            let mut st = self.state();
            (st.queue.take(), std::mem::take(&mut st.table))
        };
        let Some(queue) = queue else { return };
        let left = py.detach(move || queue.close());
        let done: Vec<Done> = left
            .into_iter()
            .map(|c| {
                let p = table.remove(&c.id);
                tuple_of(c, p)
            })
            .collect();
        self.state().closed.extend(done);
        drop(table);
    }

    /// The worker id the blocks are stored under (`<root>/v1/<worker>`).
    #[getter]
    fn worker(&self) -> &str {
        self.worker.as_str()
    }

    /// The file an LMCache key's block is (or would be) stored at. Raises `ClosedError`
    /// after `close()`.
    fn path_of(&self, key: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
        let hash = BlockHash::from_hex(&Self::key_hash(key)?)
            .map_err(|e| errors::to_py(key.py(), e, None))?;
        match &self.state().queue {
            Some(q) => Ok(q.store().path_of(&hash)),
            None => Err(errors::ClosedError::new_err("the connector is closed")),
        }
    }

    /// The block hash (64 hex characters) an LMCache key (str or bytes) is folded into.
    #[staticmethod]
    fn key_hash(key: &Bound<'_, PyAny>) -> PyResult<String> {
        if let Ok(s) = key.cast::<PyString>() {
            return Ok(fold_key(s.to_cow()?.as_bytes()).to_hex());
        }
        Ok(fold_key(key.cast::<PyBytes>()?.as_bytes()).to_hex())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let open = self.state().queue.is_some();
        format!(
            "<tierkv_g3.LMCacheConnector worker={:?} dir={:?}{}>",
            self.worker.as_str(),
            self.dir.display().to_string(),
            if open { "" } else { " closed" }
        )
    }
}
