//! `tierkv_g3._tierkv.EventTail`: a store's event journal followed on a Rust thread
//! ([`tierkv::EventTail`]), so that an engine's scheduler takes the events appended since its
//! last step from memory, with no Python thread and no disk read on its own.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;

use crate::py_result;

/// One event as the taker sees it: (kind, key): "stored" or "removed", the block's 32 bytes.
type Taken = (&'static str, [u8; 32]);

/// Follows a store's event journal from where it ends now (docs/events.md).
#[pyclass(module = "tierkv_g3._tierkv", name = "EventTail", frozen)]
pub struct PyEventTail {
    /// `None` once closed.
    tail: Mutex<Option<tierkv::EventTail>>,
}

#[pymethods]
impl PyEventTail {
    /// `EventTail(store, interval=0.05)`: starts a thread reading what `store`'s worker
    /// journal appends from now on, looking again every `interval` seconds while nothing is.
    #[new]
    #[pyo3(signature = (store, interval=0.05))]
    fn new(py: Python<'_>, store: &Bound<'_, crate::PyStore>, interval: f64) -> PyResult<Self> {
        let store = store.get().store()?;
        let interval = Duration::try_from_secs_f64(interval).map_err(|_| {
            pyo3::exceptions::PyValueError::new_err(format!("interval {interval} s"))
        })?;
        let tail = py_result(
            py,
            py.detach(move || tierkv::EventTail::start(store, interval)),
        )?;
        Ok(PyEventTail {
            tail: Mutex::new(Some(tail)),
        })
    }

    /// `(events, missed)`: the events read since the last call, in journal order, each
    /// `(kind, key)`; `missed` True if some were lost since (the journal's ring went round,
    /// or too many waited untaken): the caller checks what it told against the store. After
    /// `close()`, `([], False)`.
    fn take(&self) -> (Vec<Taken>, bool) {
        let guard = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tail) = guard.as_ref() else {
            return (Vec::new(), false);
        };
        let (events, missed) = tail.take();
        let events = events
            .into_iter()
            .map(|e| (e.kind.name(), e.hash.0))
            .collect();
        (events, missed)
    }

    /// Stops the thread (at once, if it waits for more) and waits for it. Closing twice
    /// does nothing the second time.
    fn close(&self, py: Python<'_>) {
        let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = tail {
            py.detach(move || t.close());
        }
    }
}
