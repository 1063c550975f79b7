//! `tierkv_g3.Offloader`: the write-behind offloader ([`tierkv::Offloader`]) for Python
//! engines. An offer hands blocks over (each one buffer or several parts, written as one
//! payload, straight from the engine's memory) and returns at once; the offloader's own thread
//! writes them in chain batches. Its bounds, drop-newest when full and dedupe of queued and
//! stored blocks are the Rust offloader's.
//!
//! Each block may carry a release callable: once the block is written or dropped, the
//! offloader's thread takes the GIL, releases the exported views of its parts and calls it
//! (the engine's notice that its buffers may be reused: LMCache's `ref_count_down`). So that
//! this never deadlocks, every method that waits on the offloader releases the GIL first.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use tierkv::{BlockKey, WorkerId};
use tierkv::{OffloadConfig, OnClose, Payload, PayloadParts};

use crate::buffer::{Span, View};
use crate::errors;

/// One block's payload as the writer sees it: its parts' exported views (kept alive until
/// the guard drops) and the engine's release callable.
struct Guard {
    spans: Vec<Span>,
    views: Option<Vec<View>>,
    release: Option<Py<PyAny>>,
}

// SAFETY: the views are only created and released with the GIL held (made in `offer`, which
// holds it; released in `drop`, which takes it); the spans name memory those views keep alive
// and in place, which the engine does not write until `release` is called.
unsafe impl Send for Guard {}
// SAFETY: shared use only reads the spans (see `Send`).
unsafe impl Sync for Guard {}

impl PayloadParts for Guard {
    fn parts(&self) -> Vec<&[u8]> {
        // SAFETY: the views stay alive until this guard drops, after every use of its parts.
        self.spans.iter().map(|s| unsafe { s.as_slice() }).collect()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let views = self.views.take();
        let release = self.release.take();
        Python::attach(|py| {
            drop(views);
            if let Some(r) = release {
                if let Err(e) = r.call0(py) {
                    e.write_unraisable(py, None);
                }
            }
        });
    }
}

/// `Offloader(store, max_bytes=None, max_blocks=None, max_batch_blocks=None)`: write-behind
/// offers of blocks into `store`. `offer(keys, parts, parent=None, releases=None)` queues a
/// chain of blocks (each a list of buffers written as one payload, straight from them) and
/// returns at once; a block already stored or queued is not written twice; past `max_bytes`
/// (512 MiB by default) of payloads queued or being written, the newest blocks are dropped
/// (counted), never waited for. The offloader's own thread writes them; `releases[i]` is
/// called from it once block `i` is written or dropped. `is_queued(key)`, `flush()`,
/// `stats()`, `close(drop=False)`.
#[pyclass(module = "tierkv_g3._tierkv", name = "Offloader", frozen)]
pub struct PyOffloader {
    /// `None` once closed.
    inner: Mutex<Option<std::sync::Arc<tierkv::Offloader>>>,
    worker: WorkerId,
}

impl PyOffloader {
    fn lock(&self) -> MutexGuard<'_, Option<std::sync::Arc<tierkv::Offloader>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self) -> PyResult<std::sync::Arc<tierkv::Offloader>> {
        self.lock()
            .clone()
            .ok_or_else(|| errors::ClosedError::new_err("the offloader is closed"))
    }

    /// The guards of one offer: per block, its parts exported read-only, and its release.
    fn guards(
        parts: &Bound<'_, PyAny>,
        releases: Option<&Bound<'_, PyAny>>,
        n: usize,
    ) -> PyResult<Vec<Payload>> {
        let mut out = Vec::with_capacity(n);
        let mut rel = releases.map(|r| r.try_iter()).transpose()?;
        for (i, block) in parts.try_iter()?.enumerate() {
            let views = block?
                .try_iter()?
                .enumerate()
                .map(|(j, p)| View::new(&p?, &format!("parts[{i}][{j}]"), false))
                .collect::<PyResult<Vec<View>>>()?;
            let release = match rel.as_mut() {
                Some(it) => it
                    .next()
                    .transpose()?
                    .filter(|r| !r.is_none())
                    .map(Bound::unbind),
                None => None,
            };
            out.push(Payload::vectored(Guard {
                spans: views.iter().map(View::span).collect(),
                views: Some(views),
                release,
            }));
        }
        if out.len() != n {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{n} keys but {} payloads: one list of parts per key",
                out.len()
            )));
        }
        Ok(out)
    }
}

#[pymethods]
impl PyOffloader {
    /// `Offloader(store, max_bytes=512 MiB, max_blocks=None, max_batch_blocks=None)`: a
    /// write-behind queue in front of `store`, bounded by payload bytes (and blocks) queued or
    /// being written; a full queue drops the newest offer (counted), never waits.
    #[new]
    #[pyo3(signature = (store, max_bytes=None, max_blocks=None, max_batch_blocks=None))]
    fn new(
        py: Python<'_>,
        store: &Bound<'_, crate::PyStore>,
        max_bytes: Option<u64>,
        max_blocks: Option<usize>,
        max_batch_blocks: Option<usize>,
    ) -> PyResult<Self> {
        let store = store.get().store()?;
        let worker = store.worker().clone();
        let mut config = OffloadConfig::new();
        if let Some(b) = max_bytes {
            config = config.with_max_bytes(b);
        }
        if let Some(b) = max_blocks {
            config = config.with_max_blocks(b);
        }
        if let Some(b) = max_batch_blocks {
            config = config.with_max_batch_blocks(b);
        }
        let off = py
            .detach(move || tierkv::Offloader::new(store, config))
            .map_err(|e| errors::to_py(py, e, None))?;
        Ok(PyOffloader {
            inner: Mutex::new(Some(std::sync::Arc::new(off))),
            worker,
        })
    }

    /// Offers `keys[i]` with payload `parts[i]` (a list of buffers written as one payload, in
    /// order), one chain hung from `parent` (None: `keys[0]` is a root); returns at once with
    /// `{"queued", "deduped", "dropped"}` counts. `releases[i]` (optional, a callable or
    /// None) is called once block `i` is written or dropped, from the offloader's thread:
    /// until then its buffers must stay as they are.
    #[pyo3(signature = (keys, parts, parent=None, releases=None))]
    fn offer<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        parts: &Bound<'py, PyAny>,
        parent: Option<&Bound<'py, PyAny>>,
        releases: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let off = self.get()?;
        let keys = crate::keys_of(py, &self.worker, keys)?;
        let parent = parent
            .map(|p| crate::hash_of(py, p).map(|h| BlockKey::new(self.worker.clone(), h)))
            .transpose()?;
        let payloads = Self::guards(parts, releases, keys.len())?;
        let blocks: Vec<(BlockKey, Payload)> = keys.into_iter().zip(payloads).collect();
        // Without the GIL: a payload dropped here (deduped, the queue full) takes it to call
        // its release, and the writer may hold the queue's lock while it takes it.
        let o = py.detach(move || off.offer(parent.as_ref(), blocks));
        let d = PyDict::new(py);
        d.set_item("queued", o.queued)?;
        d.set_item("deduped", o.deduped)?;
        d.set_item("dropped", o.dropped)?;
        Ok(d)
    }

    /// Whether `key` is queued or being written.
    fn is_queued(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let off = self.get()?;
        let key = BlockKey::new(self.worker.clone(), crate::hash_of(py, key)?);
        Ok(py.detach(move || off.is_queued(&key)))
    }

    /// Waits until every block offered before this call is written or dropped (the GIL
    /// released meanwhile).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let off = self.get()?;
        py.detach(move || off.flush());
        Ok(())
    }

    /// The offloader's counters (`Store.stats()["offload"]` gives the same).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let off = self.get()?;
        let s = py.detach(move || off.stats());
        let v =
            serde_json::to_value(&s).map_err(|e| errors::Error::new_err(format!("stats: {e}")))?;
        crate::json_to_py(py, &v)
    }

    /// Writes what is queued (`drop=True`: drops it, counted, each release called), stops
    /// the writer and returns; closing twice does nothing.
    #[pyo3(signature = (drop=false))]
    fn close(&self, py: Python<'_>, drop: bool) {
        let off = self.lock().take();
        if let Some(off) = off {
            let how = if drop { OnClose::Drop } else { OnClose::Write };
            py.detach(move || {
                if let Ok(off) = std::sync::Arc::try_unwrap(off) {
                    off.close(how);
                }
            });
        }
    }
}

impl Drop for PyOffloader {
    fn drop(&mut self) {
        let off = self
            .inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(off) = off {
            // Joining the writer needs the GIL free: its last payloads take it to release.
            Python::attach(|py| py.detach(move || drop(off)));
        }
    }
}
