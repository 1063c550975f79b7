//! The exceptions: one class per kind of [`tierkv::Error`], all under `tierkv.Error`, each
//! carrying what the Rust error names (`path`, `key`, `errno`) as attributes.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyModule;

create_exception!(
    tierkv_g3,
    Error,
    PyException,
    "Base of every tierkv error. A miss is never an error. Attributes: `path` (the file or \
     directory concerned, or None), `key` (the block's key, or None), `index` (the position \
     in the batch of the item that failed, or None)."
);
create_exception!(
    tierkv_g3,
    InvalidKeyError,
    Error,
    "A worker id or key that cannot name a block (not 64 lower-case hex characters or 32 \
     bytes; a worker id outside [A-Za-z0-9_.-]). Nothing was read or written."
);
create_exception!(
    tierkv_g3,
    TooLargeError,
    Error,
    "A block over the store's max_block_size. Nothing was written."
);
create_exception!(
    tierkv_g3,
    BufferTooSmallError,
    Error,
    "The buffer given to get_many_into cannot hold the stored block. Nothing was copied."
);
create_exception!(
    tierkv_g3,
    NoSpaceError,
    Error,
    "The filesystem is full (ENOSPC or EDQUOT), after evicting and retrying once. Nothing \
     partial was left behind. `path` names what could not be written, `errno` the error."
);
create_exception!(
    tierkv_g3,
    TooManyOpenFilesError,
    Error,
    "The open-file limit (EMFILE/ENFILE) was hit even after the open-file cache was emptied."
);
create_exception!(
    tierkv_g3,
    CorruptError,
    Error,
    "A file of the tree failed its checks (raised when opening a store, e.g. a bad LAYOUT \
     file; a corrupt block is a miss, never this)."
);
create_exception!(
    tierkv_g3,
    ReadOnlyError,
    Error,
    "The store was opened with read_only=True: writes are refused."
);
create_exception!(
    tierkv_g3,
    LayoutMismatchError,
    Error,
    "The tree was written with another layout than the one asked for."
);
create_exception!(
    tierkv_g3,
    WorkerBusyError,
    Error,
    "Another store (in this or another process) holds the worker's directory; the message \
     names its pid and host."
);
create_exception!(
    tierkv_g3,
    UnsupportedError,
    Error,
    "The operation needs something this store was not built with."
);
create_exception!(
    tierkv_g3,
    ConfigError,
    Error,
    "An invalid option (unknown policy or engine, a capacity below one block file, ...)."
);
create_exception!(
    tierkv_g3,
    IoError,
    Error,
    "Any other I/O error; `path` names the file or directory, `errno` the error number."
);
create_exception!(
    tierkv_g3,
    ClosedError,
    Error,
    "The store was closed (close(), or the end of its `with` block)."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("InvalidKeyError", py.get_type::<InvalidKeyError>())?;
    m.add("TooLargeError", py.get_type::<TooLargeError>())?;
    m.add("BufferTooSmallError", py.get_type::<BufferTooSmallError>())?;
    m.add("NoSpaceError", py.get_type::<NoSpaceError>())?;
    m.add(
        "TooManyOpenFilesError",
        py.get_type::<TooManyOpenFilesError>(),
    )?;
    m.add("CorruptError", py.get_type::<CorruptError>())?;
    m.add("ReadOnlyError", py.get_type::<ReadOnlyError>())?;
    m.add("LayoutMismatchError", py.get_type::<LayoutMismatchError>())?;
    m.add("WorkerBusyError", py.get_type::<WorkerBusyError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    Ok(())
}

/// The Python exception for `e`; `index` is the failing item's position in its batch.
pub fn to_py(py: Python<'_>, e: tierkv::Error, index: Option<usize>) -> PyErr {
    use tierkv::Error as E;
    let msg = e.to_string();
    let (err, path, key, errno) = match &e {
        E::InvalidKey { .. } => (InvalidKeyError::new_err(msg), None, None, None),
        E::TooLarge { key, .. } => (TooLargeError::new_err(msg), None, Some(key.clone()), None),
        E::BufferTooSmall { key, .. } => (
            BufferTooSmallError::new_err(msg),
            None,
            Some(key.clone()),
            None,
        ),
        E::NoSpace { path, source } => (
            NoSpaceError::new_err(msg),
            Some(path.clone()),
            None,
            source.raw_os_error(),
        ),
        E::TooManyOpenFiles { path, source } => (
            TooManyOpenFilesError::new_err(msg),
            Some(path.clone()),
            None,
            source.raw_os_error(),
        ),
        E::Corrupt { path, .. } => (CorruptError::new_err(msg), Some(path.clone()), None, None),
        E::ReadOnly { path, .. } => (ReadOnlyError::new_err(msg), Some(path.clone()), None, None),
        E::LayoutMismatch { path, .. } => (
            LayoutMismatchError::new_err(msg),
            Some(path.clone()),
            None,
            None,
        ),
        E::WorkerBusy { path, .. } => (
            WorkerBusyError::new_err(msg),
            Some(path.clone()),
            None,
            None,
        ),
        E::Unsupported(_) => (UnsupportedError::new_err(msg), None, None, None),
        E::Config(_) => (ConfigError::new_err(msg), None, None, None),
        E::Io { path, source } => (
            IoError::new_err(msg),
            Some(path.clone()),
            None,
            source.raw_os_error(),
        ),
        // `tierkv::Error` is non-exhaustive: a kind added later is a plain tierkv.Error.
        _ => (Error::new_err(msg), None, None, None),
    };
    let value = err.value(py);
    let set = value
        .setattr("path", path)
        .and_then(|()| value.setattr("key", key))
        .and_then(|()| value.setattr("errno", errno))
        .and_then(|()| value.setattr("index", index));
    match set {
        Ok(()) => err,
        Err(e) => e,
    }
}
