//! Buffers: a heap buffer aligned for `O_DIRECT`, a pool of them, and [`DeviceMem`], GPU
//! memory the store moves blocks to and from without touching it.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of `O_DIRECT` buffers, offsets and lengths (the page size, which covers every
/// common logical block size).
pub const DIRECT_ALIGN: usize = 4096;

/// Rounds `n` up to a multiple of `DIRECT_ALIGN`.
pub const fn align_up(n: usize) -> usize {
    n.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
}

/// A zero-initialised byte buffer whose address is a multiple of `DIRECT_ALIGN`.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give shared access to the bytes, like &Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` may be 0).
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            return AlignedBuf {
                ptr: NonNull::dangling(),
                len: 0,
            };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, DIRECT_ALIGN).expect("buffer size overflows")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (zeroed at allocation), or dangling
        // with len 0, which from_raw_parts allows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in zeroed() with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// A range of GPU memory that blocks are read into or written from. The store never
/// dereferences it: only an engine that addresses device memory (the nixl engine, through
/// NIXL's GDS backends) moves its bytes; the others refuse it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceMem {
    addr: u64,
    len: usize,
    device: u32,
}

impl DeviceMem {
    /// Names `len` bytes at `addr` in the memory of CUDA device `device`.
    ///
    /// # Safety
    /// `addr .. addr + len` must be memory of device `device` allocated in its primary
    /// context (e.g. `cuMemAlloc` or `cudaMalloc`), and must stay allocated, and unused by
    /// anything else, for as long as a store call that is given it runs: reads write it by
    /// DMA, and no bounds are checked beyond `len`.
    pub unsafe fn new(addr: u64, len: usize, device: u32) -> Self {
        DeviceMem { addr, len, device }
    }

    /// The device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA device index.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The first `len` bytes (at most all of them).
    pub fn prefix(&self, len: usize) -> DeviceMem {
        DeviceMem {
            len: len.min(self.len),
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, 70000] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % DIRECT_ALIGN, 0);
                assert!(b.iter().all(|&x| x == 0));
                b[len - 1] = 9;
                assert_eq!(b[len - 1], 9);
            }
        }
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_up(4096), 4096);
        assert_eq!(align_up(4097), 8192);
    }
}

/// A pool of aligned buffers, reused across reads and writes so that `O_DIRECT` transfers go
/// to memory that is already mapped (fresh pages for every transfer cost page faults, and on
/// some VMs far more than the transfer itself).
#[derive(Debug)]
pub struct BufPool {
    free: std::sync::Mutex<std::collections::HashMap<usize, Vec<AlignedBuf>>>,
    kept: std::sync::atomic::AtomicUsize,
    max_bytes: usize,
}

impl BufPool {
    /// A pool that keeps at most `max_bytes` of idle buffers.
    pub fn new(max_bytes: usize) -> std::sync::Arc<Self> {
        std::sync::Arc::new(BufPool {
            free: std::sync::Mutex::new(std::collections::HashMap::new()),
            kept: std::sync::atomic::AtomicUsize::new(0),
            max_bytes,
        })
    }

    /// A buffer of `len` bytes (rounded up to [`DIRECT_ALIGN`]); its contents are unspecified
    /// (zero when new, stale when reused). It returns to the pool when dropped.
    pub fn take(self: &std::sync::Arc<Self>, len: usize) -> PooledBuf {
        let len = align_up(len);
        let reused = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&len)
            .and_then(Vec::pop);
        let buf = match reused {
            Some(b) => {
                self.kept
                    .fetch_sub(len, std::sync::atomic::Ordering::Relaxed);
                b
            }
            None => AlignedBuf::zeroed(len),
        };
        PooledBuf {
            buf: Some(buf),
            pool: self.clone(),
        }
    }

    fn give(&self, b: AlignedBuf) {
        let len = b.len();
        if self.kept.load(std::sync::atomic::Ordering::Relaxed) + len > self.max_bytes {
            return;
        }
        self.kept
            .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(len)
            .or_default()
            .push(b);
    }
}

/// A buffer on loan from a [`BufPool`].
#[derive(Debug)]
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    pool: std::sync::Arc<BufPool>,
}

impl Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().expect("present until drop")
    }
}

impl DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().expect("present until drop")
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_aligned() {
        let pool = BufPool::new(1 << 20);
        let p = {
            let mut a = pool.take(5000);
            assert_eq!(a.len(), 8192);
            assert_eq!(a.as_ptr() as usize % DIRECT_ALIGN, 0);
            a[0] = 7;
            a.as_ptr() as usize
        };
        let b = pool.take(8000);
        assert_eq!(b.as_ptr() as usize, p, "the same memory again");
        drop(b);
        // Over the cap: not kept.
        let small = BufPool::new(4096);
        drop(small.take(8192));
        assert_eq!(small.kept.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}
