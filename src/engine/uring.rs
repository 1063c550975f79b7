//! The `io_uring` engine: one ring per submitting thread. A batch becomes one submission of
//! vectored reads and writes (up to the queue depth in flight), reaped together; short
//! transfers are resubmitted for their remainder.
//!
//! The first version handed batches to a dedicated ring thread through a channel; on this
//! project's 2-vCPU VMs the two thread hand-offs per batch cost about 100 us, more than a hot
//! 64 KiB read (docs/engines.md). A ring per calling thread has no hand-off. Rings stay off
//! tokio's worker threads all the same: the store's async API runs batches on tokio's
//! blocking pool.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{IoUring, opcode, types};

use super::{IoEngine, IoKind, IoRequest};

/// Default number of operations in flight per ring.
pub const DEFAULT_QUEUE_DEPTH: u32 = 64;

/// One transfer of a job, in the ring thread's hands.
struct Op {
    fd: RawFd,
    offset: u64,
    write: bool,
    /// The caller's buffers.
    iov: Vec<libc::iovec>,
    /// The not yet transferred part of `iov` (what is in flight).
    rest: Vec<libc::iovec>,
    want: usize,
    done: usize,
    result: Option<io::Result<usize>>,
}

thread_local! {
    /// This thread's ring and its depth.
    static RING: RefCell<Option<(u32, IoUring)>> = const { RefCell::new(None) };
}

/// Vectored reads and writes through io_uring.
#[derive(Debug)]
pub struct UringEngine {
    depth: u32,
}

impl UringEngine {
    /// An engine with rings of `depth` entries. Sets one up at once to fail early when the
    /// kernel refuses io_uring (too old, seccomp, `io_uring_disabled`).
    pub fn new(depth: u32) -> io::Result<Self> {
        let depth = depth.max(1);
        RING.with(|r| -> io::Result<()> {
            let mut r = r.borrow_mut();
            if r.as_ref().is_none_or(|(d, _)| *d != depth) {
                *r = Some((depth, IoUring::new(depth)?));
            }
            Ok(())
        })?;
        Ok(UringEngine { depth })
    }

    /// The ring's queue depth.
    pub fn depth(&self) -> u32 {
        self.depth
    }
}

fn make_iov(ptr: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr as *mut libc::c_void,
        iov_len: len,
    }
}

/// The part of `iov` after the first `skip` bytes.
fn advance(iov: &[libc::iovec], mut skip: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(iov.len());
    for v in iov {
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        // SAFETY: skip < iov_len, so the pointer stays inside the same buffer.
        let base = unsafe { (v.iov_base as *const u8).add(skip) };
        out.push(make_iov(base, v.iov_len - skip));
        skip = 0;
    }
    out
}

/// Runs `ops` to completion on `ring`; one result per op.
fn run_job(ring: &mut IoUring, mut ops: Vec<Op>) -> Vec<io::Result<usize>> {
    let depth = ring.params().sq_entries() as usize;
    let mut pending: VecDeque<usize> = VecDeque::new();
    for (i, op) in ops.iter_mut().enumerate() {
        if op.result.is_some() {
            // Refused before submission.
        } else if op.want == 0 {
            op.result = Some(Ok(0));
        } else {
            pending.push_back(i);
        }
    }
    let mut inflight = 0usize;
    loop {
        while inflight < depth {
            let Some(i) = pending.pop_front() else { break };
            let op = &mut ops[i];
            op.rest = advance(&op.iov, op.done);
            let fd = types::Fd(op.fd);
            let at = op.offset + op.done as u64;
            // One buffer: the plain opcodes (what fio submits), else the vectored ones.
            let entry = match (op.write, op.rest.as_slice()) {
                (true, [one]) => {
                    opcode::Write::new(fd, one.iov_base as *const u8, one.iov_len as u32)
                        .offset(at)
                        .build()
                }
                (false, [one]) => {
                    opcode::Read::new(fd, one.iov_base as *mut u8, one.iov_len as u32)
                        .offset(at)
                        .build()
                }
                (true, _) => opcode::Writev::new(fd, op.rest.as_ptr(), op.rest.len() as u32)
                    .offset(at)
                    .build(),
                (false, _) => opcode::Readv::new(fd, op.rest.as_ptr(), op.rest.len() as u32)
                    .offset(at)
                    .build(),
            }
            .user_data(i as u64);
            // SAFETY: the iovec array (op.rest) and the buffers it points to stay valid and
            // unmoved until this operation's completion is reaped below: op.rest is only
            // replaced when the operation is resubmitted, after its completion.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                pending.push_front(i);
                break;
            }
            inflight += 1;
        }
        if inflight == 0 {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            // Interrupted, or the kernel is short of resources or completion slots: reap what
            // completed and go on.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                // Operations in flight hold pointers into buffers this call only borrows:
                // returning now would let the kernel write memory the caller may free. A ring
                // that can no longer even be waited on leaves no sound way out.
                tracing::error!(error = %e, inflight, "io_uring wait failed with operations in flight");
                std::process::abort();
            }
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            inflight -= 1;
            let i = ud as usize;
            let op = &mut ops[i];
            if res < 0 {
                let errno = -res;
                if errno == libc::EINTR || errno == libc::EAGAIN {
                    pending.push_back(i);
                } else {
                    op.result = Some(Err(io::Error::from_raw_os_error(errno)));
                }
            } else if res == 0 {
                op.result = Some(if op.write {
                    Err(io::Error::from(io::ErrorKind::WriteZero))
                } else {
                    Ok(op.done) // end of file
                });
            } else {
                op.done += res as usize;
                if op.done >= op.want {
                    op.result = Some(Ok(op.done));
                } else {
                    pending.push_back(i); // short transfer: the rest goes again
                }
            }
        }
    }
    ops.into_iter()
        .map(|o| {
            o.result
                .unwrap_or_else(|| Err(io::Error::other("io_uring operation lost")))
        })
        .collect()
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        let ops: Vec<Op> = batch
            .iter_mut()
            .map(|r| {
                let mut result = None;
                let (write, iov): (bool, Vec<libc::iovec>) = match &mut r.kind {
                    IoKind::Read(bufs) => (
                        false,
                        bufs.iter_mut()
                            .map(|b| make_iov(b.as_mut_ptr(), b.len()))
                            .collect(),
                    ),
                    IoKind::Write(bufs) => (
                        true,
                        bufs.iter().map(|b| make_iov(b.as_ptr(), b.len())).collect(),
                    ),
                    IoKind::ReadDevice(_) | IoKind::WriteDevice(_) => {
                        result = Some(Err(super::device_unsupported("io_uring")));
                        (false, Vec::new())
                    }
                };
                let want = iov.iter().map(|v| v.iov_len).sum();
                Op {
                    fd: r.fd.as_raw_fd(),
                    offset: r.offset,
                    write,
                    iov,
                    rest: Vec::new(),
                    want,
                    done: 0,
                    result,
                }
            })
            .collect();
        RING.with(|r| {
            let mut r = r.borrow_mut();
            if r.as_ref().is_none_or(|(d, _)| *d != self.depth) {
                match IoUring::new(self.depth) {
                    Ok(ring) => *r = Some((self.depth, ring)),
                    Err(e) => {
                        let n = ops.len();
                        return (0..n)
                            .map(|_| Err(io::Error::new(e.kind(), e.to_string())))
                            .collect();
                    }
                }
            }
            let (_, ring) = r.as_mut().expect("set above");
            run_job(ring, ops)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn contract() {
        let e = super::UringEngine::new(8).expect("io_uring works on this kernel");
        super::super::contract::run_all(&e);
    }

    #[test]
    fn batches_larger_than_the_ring() {
        use super::super::{IoEngine, IoRequest};
        use std::io::{IoSlice, IoSliceMut};
        use std::os::fd::AsFd;
        let e = super::UringEngine::new(4).unwrap();
        let files: Vec<std::fs::File> = (0..50).map(|_| tempfile::tempfile().unwrap()).collect();
        let data: Vec<Vec<u8>> = (0..50).map(|i| vec![i as u8; 10_000 + i]).collect();
        let mut w: Vec<IoRequest<'_>> = files
            .iter()
            .zip(&data)
            .map(|(f, d)| IoRequest::write(f.as_fd(), 7, vec![IoSlice::new(d)]))
            .collect();
        assert!(e.submit(&mut w).iter().all(|r| r.is_ok()));
        drop(w);
        let mut outs: Vec<Vec<u8>> = data.iter().map(|d| vec![0u8; d.len() + 5]).collect();
        let mut r: Vec<IoRequest<'_>> = files
            .iter()
            .zip(outs.iter_mut())
            .map(|(f, o)| IoRequest::read(f.as_fd(), 7, vec![IoSliceMut::new(o)]))
            .collect();
        let res = e.submit(&mut r);
        drop(r);
        for ((res, o), d) in res.into_iter().zip(&outs).zip(&data) {
            assert_eq!(res.unwrap(), d.len(), "short read at end of file");
            assert_eq!(&o[..d.len()], &d[..]);
        }
    }
}
