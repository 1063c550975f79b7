//! `tierkv_g3.Transfers`: the engine-facing asynchronous API ([`tierkv::Transfers`]) for
//! Python engines. The engine's KV memory is described once (a buffer and its regions);
//! loads and saves name blocks by index, return an id at once, and come back with one outcome
//! per block through `drain()`, `wait()` or an eventfd. No disk I/O, and no Python object per
//! block or per region, on the calling thread.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use tierkv::{KvMemory, LoadOutcome, Region, SaveOutcome, Transfer, WorkerId};

use crate::buffer::View;
use crate::errors;

/// The exported buffer of the engine's memory, held for the transfers' lifetime.
struct Held(#[expect(dead_code, reason = "held to be released when dropped")] View);

// SAFETY: a `View` must be created and released with the GIL held. `Held` is made in `new` and
// dropped in `close` or the object's drop, both with the GIL; in between it only sits here.
unsafe impl Send for Held {}

struct State {
    /// `None` once closed. Shared with a `wait` in progress (which holds a clone).
    transfers: Option<Arc<tierkv::Transfers>>,
    /// Dropped after the transfers (whose threads are joined first).
    memory: Option<Held>,
}

impl Drop for State {
    fn drop(&mut self) {
        // The transfers first: dropping them runs what is queued and joins their threads, so
        // no thread still touches the memory when its view is released.
        drop(self.transfers.take());
        drop(self.memory.take());
    }
}

/// One finished batch: `(id, kind, outcomes, errors)`; `kind` is "load" or "save",
/// `outcomes` one string per block, `errors` `{index: message}` for the failed ones.
type Done = (u64, &'static str, Vec<&'static str>, Vec<(usize, String)>);

/// Loads and saves of whole batches between an engine's KV memory and a store, on threads of
/// their own (see python/tierkv_g3/__init__.py's `Transfers` docstring).
#[pyclass(module = "tierkv_g3._tierkv", name = "Transfers", frozen)]
pub struct PyTransfers {
    state: Mutex<State>,
    worker: WorkerId,
    block_bytes: usize,
    blocks: usize,
}

impl PyTransfers {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with<T>(&self, f: impl FnOnce(&Arc<tierkv::Transfers>) -> T) -> PyResult<T> {
        match &self.state().transfers {
            Some(t) => Ok(f(t)),
            None => Err(errors::ClosedError::new_err("the transfers are closed")),
        }
    }
}

fn outcomes(done: Vec<Transfer>) -> Vec<Done> {
    done.into_iter()
        .filter_map(|t| {
            let id = t.id();
            let (kind, names, errors) = match t {
                Transfer::Load { outcomes, .. } => (
                    "load",
                    outcomes.iter().map(LoadOutcome::name).collect(),
                    errors_of(&outcomes, |o| match o {
                        LoadOutcome::WrongLength { len } => {
                            Some(format!("stored block of {len} bytes"))
                        }
                        LoadOutcome::Failed(e) => Some(e.to_string()),
                        _ => None,
                    }),
                ),
                Transfer::Save { outcomes, .. } => (
                    "save",
                    outcomes.iter().map(SaveOutcome::name).collect(),
                    errors_of(&outcomes, |o| match o {
                        SaveOutcome::Failed(e) => Some(e.to_string()),
                        _ => None,
                    }),
                ),
                _ => return None,
            };
            Some((id, kind, names, errors))
        })
        .collect()
}

/// `(index, message)` of each outcome that carries one.
fn errors_of<O>(outcomes: &[O], message: impl Fn(&O) -> Option<String>) -> Vec<(usize, String)> {
    outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| message(o).map(|m| (i, m)))
        .collect()
}

#[pymethods]
impl PyTransfers {
    /// `Transfers(store, memory, regions, blocks, threads=2)`: `memory` is a writable
    /// contiguous buffer (a numpy array, a memoryview) over the engine's KV memory, kept alive
    /// and in place until `close()`; `regions` a sequence of `(offset, length, stride)`
    /// tuples, in payload order: block `b`'s bytes of region `r` are `memory[offset + b *
    /// stride:][:length]`; `blocks` how many blocks the memory holds.
    #[new]
    #[pyo3(signature = (store, memory, regions, blocks, threads=2))]
    fn new(
        py: Python<'_>,
        store: &Bound<'_, crate::PyStore>,
        memory: &Bound<'_, PyAny>,
        regions: Vec<(usize, usize, usize)>,
        blocks: usize,
        threads: usize,
    ) -> PyResult<Self> {
        let store = store.get().store()?;
        let view = View::new(memory, "memory", true)?;
        let span = view.span();
        let regions: Vec<Region> = regions
            .into_iter()
            .map(|(offset, len, stride)| Region {
                offset,
                len,
                stride,
            })
            .collect();
        // SAFETY: the view keeps the exporter's memory alive and in place (it refuses to
        // resize while exported) until it is released, which `State::drop` does only after the
        // transfers' threads are joined.
        let mem = unsafe { KvMemory::new(span.ptr(), span.len(), regions, blocks) }
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let block_bytes = mem.block_bytes();
        let worker = store.worker().clone();
        let transfers = py
            .detach(move || tierkv::Transfers::new(store, mem, threads))
            .map_err(|e| errors::to_py(py, e, None))?;
        Ok(PyTransfers {
            state: Mutex::new(State {
                transfers: Some(Arc::new(transfers)),
                memory: Some(Held(view)),
            }),
            worker,
            block_bytes,
            blocks,
        })
    }

    /// Queues a load of `keys[i]` into block `blocks[i]`; returns its id at once. The blocks
    /// are the load's until its completion is collected.
    fn submit_load(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        blocks: Vec<usize>,
    ) -> PyResult<u64> {
        let keys = crate::keys_of(py, &self.worker, keys)?;
        self.with(|t| t.submit_load(keys, blocks))
    }

    /// Queues a save of block `blocks[i]` under `keys[i]`, one chain hung from `parent` (the
    /// stored key before `keys[0]`, or None at a chain's root); returns its id at once. The
    /// engine must not reuse the blocks until its completion is collected.
    #[pyo3(signature = (keys, blocks, parent=None))]
    fn submit_save(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        blocks: Vec<usize>,
        parent: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let keys = crate::keys_of(py, &self.worker, keys)?;
        let parent = parent
            .map(|p| crate::hash_of(py, p).map(|h| tierkv::BlockKey::new(self.worker.clone(), h)))
            .transpose()?;
        self.with(|t| t.submit_save(parent, keys, blocks))
    }

    /// The finished batches not yet collected, without waiting: `(id, kind, outcomes,
    /// errors)` tuples (load outcomes "loaded", "missing", "wrong_length", "failed"; save
    /// outcomes "written", "present", "not_admitted", "failed"; errors `[(index, message)]`).
    fn drain(&self) -> PyResult<Vec<Done>> {
        self.with(|t| outcomes(t.drain()))
    }

    /// As `drain`, waiting up to `timeout` seconds (None: until one finishes) for at least one
    /// batch; returns at once when none is pending. The GIL is released while waiting.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<Done>> {
        let t = timeout.map(|s| Duration::from_secs_f64(s.max(0.0)));
        let tr = self.with(Arc::clone)?;
        Ok(outcomes(py.detach(move || tr.wait(t))))
    }

    /// An eventfd that is readable while finished batches wait for `drain()` (which resets
    /// it).
    fn event_fd(&self) -> PyResult<i32> {
        self.with(|t| t.event_fd().as_raw_fd())
    }

    /// Batches submitted and not yet collected.
    #[getter]
    fn pending(&self) -> PyResult<u64> {
        self.with(|t| t.pending())
    }

    /// A block's payload length (the regions' lengths added up).
    #[getter]
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// How many blocks the memory holds.
    #[getter]
    fn blocks(&self) -> usize {
        self.blocks
    }

    /// Runs every batch already submitted (the memory is not touched after this returns),
    /// stops the threads and releases the memory; returns what finished and was not
    /// collected. Closing twice returns nothing the second time. The GIL is released while
    /// batches finish.
    fn close(&self, py: Python<'_>) -> Vec<Done> {
        let (transfers, memory) = {
            let mut st = self.state();
            (st.transfers.take(), st.memory.take())
        };
        let left = match transfers {
            // A `wait` in progress holds a clone for at most its timeout, and returns as soon
            // as a batch finishes, which closing makes happen.
            Some(mut t) => py.detach(move || {
                loop {
                    match Arc::try_unwrap(t) {
                        Ok(t) => break t.close(),
                        Err(shared) => {
                            t = shared;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                }
            }),
            None => Vec::new(),
        };
        drop(memory);
        outcomes(left)
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
        format!(
            "Transfers(worker={:?}, blocks={}, block_bytes={}, closed={})",
            self.worker.as_str(),
            self.blocks,
            self.block_bytes,
            self.state().transfers.is_none()
        )
    }
}
