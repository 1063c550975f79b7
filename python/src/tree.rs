//! A cache tree seen from outside any store (`tierkv::inspect`): its workers, a worker's
//! event journal and block listing, and the filesystem it is on. What a standalone event
//! publisher (`tierkv_g3.kv_events`) follows without opening a store.

use std::path::PathBuf;

use pyo3::prelude::*;
use tierkv::inspect::{Found, ScanOptions, WorkerDir};

use crate::py_result;

/// One journal event as Python sees it: (seq, kind, cause, key, node, pid, unix_ms).
pub(crate) type EventTuple = (u64, &'static str, &'static str, [u8; 32], u64, u32, u64);

/// A journal read as Python sees it: (events, next, missed, journal_id).
pub(crate) type EventsTuple = (Vec<EventTuple>, u64, u64, u64);

/// `read` as Python sees it.
pub(crate) fn events_tuple(read: tierkv::EventsRead) -> EventsTuple {
    let events = read
        .events
        .iter()
        .map(|e| {
            (
                e.seq,
                e.kind.name(),
                e.cause.name(),
                e.hash.0,
                e.node,
                e.pid,
                e.unix_ms,
            )
        })
        .collect();
    (events, read.next, read.missed, read.journal_id)
}

/// The workers of the tree at `root`, sorted.
#[pyfunction]
pub(crate) fn workers(py: Python<'_>, root: PathBuf) -> PyResult<Vec<String>> {
    py_result(py, py.detach(|| tierkv::inspect::workers(&root)))
}

/// `worker`'s journal events from `start` on, at most `max`, as `Store.events_since` gives
/// them; empty, journal id 0, where the worker has no journal.
#[pyfunction]
#[pyo3(signature = (root, worker, start, max=4096))]
pub(crate) fn journal_since(
    py: Python<'_>,
    root: PathBuf,
    worker: String,
    start: u64,
    max: usize,
) -> PyResult<EventsTuple> {
    let read = py.detach(|| WorkerDir::open(&root, &worker)?.events_since(start, max));
    Ok(events_tuple(py_result(py, read)?))
}

/// Where `worker`'s journal ends now: `(next, journal_id)`, `(0, 0)` without a journal.
#[pyfunction]
pub(crate) fn journal_end(py: Python<'_>, root: PathBuf, worker: String) -> PyResult<(u64, u64)> {
    let end = py_result(
        py,
        py.detach(|| WorkerDir::open(&root, &worker)?.events_end()),
    )?;
    Ok((end.next, end.journal_id))
}

/// The keys of the valid block files of `worker` (each header, name and length checked, no
/// checksum), sorted: a snapshot to resync from.
#[pyfunction]
pub(crate) fn tree_blocks(
    py: Python<'_>,
    root: PathBuf,
    worker: String,
) -> PyResult<Vec<[u8; 32]>> {
    let listed = py.detach(|| -> tierkv::Result<Vec<[u8; 32]>> {
        let dir = WorkerDir::open(&root, &worker)?;
        let Some(layout) = dir.layout()? else {
            return Ok(Vec::new());
        };
        let found = dir.scan(layout, &ScanOptions::default(), None, Vec::new, |v, f| {
            if let Found::Block { hash, .. } = f {
                v.push(hash.0)
            }
        });
        let mut keys: Vec<[u8; 32]> = found.into_iter().flatten().collect();
        keys.sort_unstable();
        Ok(keys)
    });
    py_result(py, listed)
}

/// The filesystem `path` is on: (its type, whether other nodes mount it: a network or
/// cluster filesystem).
#[pyfunction]
pub(crate) fn filesystem(py: Python<'_>, path: PathBuf) -> PyResult<(String, bool)> {
    let fs = py_result(py, py.detach(|| tierkv::inspect::filesystem(&path)))?;
    Ok((fs.kind, fs.network))
}
