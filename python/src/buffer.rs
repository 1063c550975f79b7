//! Zero-copy access to the memory of Python objects through the buffer protocol.
//!
//! PyO3's `PyBuffer` is only available with the stable ABI from CPython 3.11, and this
//! package is one abi3 wheel for CPython 3.9+. So the two functions of the protocol are called
//! through their C ABI here: `PyObject_GetBuffer` and `PyBuffer_Release` have been exported by
//! every CPython 3 with this signature, and `Py_buffer` has had the layout below since 3.3; from
//! 3.11 all three are part of the stable ABI, with the same definitions.
//!
//! A [`View`] holds an exported buffer (the exporter keeps the memory alive and in place, and
//! refuses to resize it, until the view is released). It is `!Send`, so it can only be created
//! and dropped with the GIL held; the I/O runs on [`Span`]s (pointer and length), which are
//! `Send` and travel into `Python::detach`.

use std::ffi::{c_char, c_int, c_void};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// `Py_buffer` (CPython's `Include/pybuffer.h`, identical from 3.3 on).
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

unsafe extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

/// `PyBUF_STRIDES`: shape and strides, no suboffsets (an exporter that needs them refuses),
/// read-only or writable (the `readonly` field says which).
const PYBUF_STRIDES: c_int = 0x0010 | 0x0008;

/// One exported buffer, released on drop (with the GIL held: a `View` is `!Send`).
pub struct View {
    /// Boxed: the exporter may keep the view's address until it is released.
    raw: Box<RawBuffer>,
}

/// Pointer and length of a view's memory, valid while its [`View`] lives.
#[derive(Clone, Copy)]
pub struct Span {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `Span` is an address and a length; the memory it names is kept alive by its `View`,
// which stays on the thread that holds the GIL for as long as any use of the span (callers
// drop views only after the detached I/O returned).
unsafe impl Send for Span {}

impl View {
    /// Exports the buffer of `obj`, which is argument `what` of a call (for error messages).
    /// `writable`: refuse a read-only buffer (`TypeError`). A buffer that is not contiguous
    /// (a strided numpy view, a transposed array) is refused (`ValueError`): its bytes are not
    /// one run of memory. An object without the buffer protocol but with `__dlpack__` (a torch
    /// CPU tensor) is viewed through `numpy.from_dlpack`, which shares its memory.
    pub fn new(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<View> {
        match Self::export(obj) {
            Ok(v) => v.check(obj, what, writable),
            Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) && obj.hasattr("__dlpack__")? => {
                let arr = obj
                    .py()
                    .import("numpy")
                    .and_then(|np| np.call_method1("from_dlpack", (obj,)))
                    .map_err(|e2| {
                        PyTypeError::new_err(format!(
                            "{what}: {} has no buffer protocol, and numpy.from_dlpack failed \
                             ({e2}); pass a contiguous numpy array (tensor.numpy())",
                            type_name(obj)
                        ))
                    })?;
                Self::export(&arr)
                    .map_err(|e| not_a_buffer(obj, what, e))?
                    .check(obj, what, writable)
            }
            Err(e) => Err(not_a_buffer(obj, what, e)),
        }
    }

    fn export(obj: &Bound<'_, PyAny>) -> PyResult<View> {
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (we hold a reference and the GIL); `raw` points to a
        // `Py_buffer`-shaped struct that outlives the call. On success the view must be
        // released exactly once, which `View::drop` does.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *raw, PYBUF_STRIDES) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(View { raw })
    }

    fn check(self, obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<View> {
        if writable && self.raw.readonly != 0 {
            return Err(PyTypeError::new_err(format!(
                "{what}: {} is read-only; get_many_into fills writable buffers (bytearray, \
                 numpy arrays, writable memoryviews)",
                type_name(obj)
            )));
        }
        if !self.is_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what}: {} is not contiguous (shape {:?}, strides {:?}); pass a contiguous \
                 array (numpy.ascontiguousarray, tensor.contiguous())",
                type_name(obj),
                self.dims(self.raw.shape),
                self.dims(self.raw.strides),
            )));
        }
        Ok(self)
    }

    fn dims(&self, p: *const ffi::Py_ssize_t) -> Vec<isize> {
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: with PyBUF_STRIDES the exporter fills `shape` and `strides` with `ndim`
        // entries each (or leaves them NULL for ndim 0), valid until the view is released.
        unsafe { std::slice::from_raw_parts(p, self.raw.ndim.max(0) as usize) }.to_vec()
    }

    /// C- or Fortran-contiguous, no suboffsets (what `PyBuffer_IsContiguous(view, 'A')`
    /// checks): the buffer's bytes are `len` bytes from `buf`.
    fn is_contiguous(&self) -> bool {
        if !self.raw.suboffsets.is_null() {
            return false;
        }
        let shape = self.dims(self.raw.shape);
        let strides = self.dims(self.raw.strides);
        if strides.is_empty() || shape.contains(&0) {
            return true;
        }
        let dense = |order: &mut dyn Iterator<Item = usize>| {
            let mut expect = self.raw.itemsize;
            for i in order {
                if shape[i] != 1 && strides[i] != expect {
                    return false;
                }
                expect *= shape[i];
            }
            true
        };
        dense(&mut (0..shape.len()).rev()) || dense(&mut (0..shape.len()))
    }

    /// The view's memory.
    pub fn span(&self) -> Span {
        Span {
            ptr: self.raw.buf.cast(),
            len: self.raw.len.max(0) as usize,
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once;
        // `View` is `!Send` (raw pointers), so this runs on the thread that holds the GIL.
        unsafe { PyBuffer_Release(&mut *self.raw) }
    }
}

impl Span {
    /// The address of the first byte (valid while the span's `View` lives).
    pub fn ptr(self) -> *mut u8 {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(self) -> usize {
        self.len
    }

    /// The bytes.
    ///
    /// # Safety
    /// The span's `View` must be alive for `'a`, and nothing may write the memory meanwhile.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `ptr` while the view lives
        // (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to be written.
    ///
    /// # Safety
    /// The span's `View` must be alive for `'a` and writable, and no other reference to the
    /// memory may exist meanwhile (see [`check_disjoint`]).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as `as_slice`, and the view is writable and not aliased (the caller's
        // contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Refuses destination buffers that share memory (`ValueError`): two reads into one byte
/// would alias two `&mut [u8]`.
pub fn check_disjoint(spans: &[Span]) -> PyResult<()> {
    check_disjoint_by(spans, &|i| format!("buffers[{i}]"))
}

/// As [`check_disjoint`], naming span `i` `name(i)` in the error.
pub fn check_disjoint_by(spans: &[Span], name: &dyn Fn(usize) -> String) -> PyResult<()> {
    let mut order: Vec<usize> = (0..spans.len()).filter(|&i| spans[i].len > 0).collect();
    order.sort_unstable_by_key(|&i| spans[i].ptr as usize);
    for w in order.windows(2) {
        let (a, b) = (spans[w[0]], spans[w[1]]);
        if a.ptr as usize + a.len > b.ptr as usize {
            let (x, y) = (w[0].min(w[1]), w[0].max(w[1]));
            return Err(PyValueError::new_err(format!(
                "{} and {} share memory; each key needs its own buffer",
                name(x),
                name(y)
            )));
        }
    }
    Ok(())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

fn not_a_buffer(obj: &Bound<'_, PyAny>, what: &str, cause: PyErr) -> PyErr {
    let e = PyTypeError::new_err(format!(
        "{what}: {} does not export a buffer ({cause}); pass bytes, bytearray, memoryview or \
         a numpy array",
        type_name(obj)
    ));
    e.set_cause(obj.py(), Some(cause));
    e
}

/// The regions `(addresses[i], sizes[i])` as spans of the buffers of `memory` (one buffer, or
/// a list or tuple of them, exported here): each region must lie wholly inside one of them
/// (`ValueError` naming it otherwise), so no byte outside memory the caller exported is ever
/// touched. Returns the views (to be held for as long as the spans are used) and one span per
/// region, in order. For an engine's pool whose pages' regions it gives as addresses (SGLang's
/// `get_page_buffer_meta`): no Python object per region.
pub fn region_spans(
    memory: &Bound<'_, PyAny>,
    addresses: &[usize],
    sizes: &[usize],
    writable: bool,
) -> PyResult<(Vec<View>, Vec<Span>)> {
    if addresses.len() != sizes.len() {
        return Err(PyValueError::new_err(format!(
            "{} addresses but {} sizes",
            addresses.len(),
            sizes.len()
        )));
    }
    let views: Vec<View> = if memory.is_instance_of::<pyo3::types::PyList>()
        || memory.is_instance_of::<pyo3::types::PyTuple>()
    {
        memory
            .try_iter()?
            .enumerate()
            .map(|(i, b)| View::new(&b?, &format!("memory[{i}]"), writable))
            .collect::<PyResult<_>>()?
    } else {
        vec![View::new(memory, "memory", writable)?]
    };
    // (first address, length, pointer) of each buffer, by address.
    let mut bounds: Vec<(usize, usize, *mut u8)> = views
        .iter()
        .map(|v| (v.span().ptr as usize, v.span().len, v.span().ptr))
        .collect();
    bounds.sort_unstable_by_key(|b| b.0);
    let spans = addresses
        .iter()
        .zip(sizes)
        .enumerate()
        .map(|(i, (&addr, &len))| {
            // The last buffer starting at or before `addr` is the only one that can hold it.
            let k = bounds.partition_point(|&(start, ..)| start <= addr);
            match k.checked_sub(1).map(|k| bounds[k]) {
                Some((start, blen, ptr))
                    if addr.checked_add(len).is_some_and(|end| end <= start + blen) =>
                {
                    // From the buffer's own pointer, so the span keeps its provenance.
                    Ok(Span {
                        ptr: ptr.wrapping_add(addr - start),
                        len,
                    })
                }
                _ => Err(PyValueError::new_err(format!(
                    "region {i} ({len} bytes at {addr:#x}) is not inside the memory given"
                ))),
            }
        })
        .collect::<PyResult<Vec<Span>>>()?;
    Ok((views, spans))
}
