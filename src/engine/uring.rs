//! The `io_uring` engine: one ring per submitting thread. A batch becomes one submission of
//! vectored reads and writes (up to the queue depth in flight), reaped together; short
//! transfers are resubmitted for their remainder. A stream (`submit_stream`, a put batch) is
//! submitted a request at a time as the caller makes them, so its first writes run while the
//! caller creates and hashes the next files.
//!
//! The first version handed batches to a dedicated ring thread through a channel; on this
//! project's 2-vCPU VMs the two thread hand-offs per batch cost about 100 us, more than a hot
//! 64 KiB read (docs/io-engines.md). A ring per calling thread has no hand-off. Rings stay off
//! tokio's worker threads all the same: the store's async API runs batches on tokio's
//! blocking pool.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{IoUring, opcode, squeue, types};

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
        RING.with(|r| this_ring(&mut r.borrow_mut(), depth).map(|_| ()))?;
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

/// Settles an op that moves no bytes (refused before submission, or of length 0); true when it
/// must go to the ring.
fn needs_transfer(op: &mut Op) -> bool {
    if op.result.is_none() && op.want == 0 {
        op.result = Some(Ok(0));
    }
    op.result.is_none()
}

/// Runs `ops` to completion on `ring`; one result per op.
fn run_job(ring: &mut IoUring, ops: Vec<Op>) -> Vec<io::Result<usize>> {
    run(ring, ops, None)
}

/// Runs `ops`, then every op `more` yields, to completion on `ring`; one result per op. An op
/// from `more` is submitted as soon as it is pulled (and the ring has room), before the next
/// is pulled, so that the caller's work on the next one overlaps the transfers in flight.
fn run(
    ring: &mut IoUring,
    mut ops: Vec<Op>,
    mut more: Option<&mut dyn FnMut() -> Option<Op>>,
) -> Vec<io::Result<usize>> {
    let depth = ring.params().sq_entries() as usize;
    let mut pending: VecDeque<usize> = VecDeque::new();
    for (i, op) in ops.iter_mut().enumerate() {
        if needs_transfer(op) {
            pending.push_back(i);
        }
    }
    let mut inflight = 0usize;
    // A panic in the caller's stream while ops are in flight is held until they complete:
    // unwinding at once would free buffers the kernel still reads or writes.
    let mut panicked = None;
    loop {
        while inflight < depth {
            let (i, pulled) = match pending.pop_front() {
                Some(i) => (i, false),
                None => {
                    let Some(pull) = more.as_mut() else { break };
                    let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(pull));
                    let Some(mut op) = next.unwrap_or_else(|p| {
                        panicked = Some(p);
                        None
                    }) else {
                        more = None;
                        break;
                    };
                    let transfer = needs_transfer(&mut op);
                    ops.push(op);
                    if !transfer {
                        continue;
                    }
                    (ops.len() - 1, true)
                }
            };
            let entry = entry_of(&mut ops[i], i);
            // SAFETY: the iovec array (op.rest, a heap buffer that stays put when `ops` grows)
            // and the buffers it points to stay valid and unmoved until this operation's
            // completion is reaped below: op.rest is only replaced when the operation is
            // resubmitted, after its completion.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                pending.push_front(i);
                break;
            }
            inflight += 1;
            if pulled {
                // Start it now: the next op is made while this one is in flight. A refusal
                // here (EAGAIN, EBUSY, EINTR) leaves it queued for the wait below.
                let _ = ring.submit();
            }
        }
        if inflight == 0 {
            break;
        }
        // The ring is full or nothing is left to pull: wait for a completion.
        wait_for_completion(ring, inflight);
        inflight -= reap(ring, &mut ops, &mut pending);
    }
    if let Some(p) = panicked {
        std::panic::resume_unwind(p);
    }
    ops.into_iter()
        .map(|o| {
            o.result
                .unwrap_or_else(|| Err(io::Error::other("io_uring operation lost")))
        })
        .collect()
}

/// The submission entry of `op` (index `i` in the run's ops) for what is left of it; sets
/// `op.rest` to that remainder, which the entry points into.
fn entry_of(op: &mut Op, i: usize) -> squeue::Entry {
    op.rest = advance(&op.iov, op.done);
    let fd = types::Fd(op.fd);
    let at = op.offset + op.done as u64;
    // One buffer: the plain opcodes (what fio submits), else the vectored ones.
    match (op.write, op.rest.as_slice()) {
        (true, [one]) => opcode::Write::new(fd, one.iov_base as *const u8, one.iov_len as u32)
            .offset(at)
            .build(),
        (false, [one]) => opcode::Read::new(fd, one.iov_base as *mut u8, one.iov_len as u32)
            .offset(at)
            .build(),
        (true, _) => opcode::Writev::new(fd, op.rest.as_ptr(), op.rest.len() as u32)
            .offset(at)
            .build(),
        (false, _) => opcode::Readv::new(fd, op.rest.as_ptr(), op.rest.len() as u32)
            .offset(at)
            .build(),
    }
    .user_data(i as u64)
}

/// Submits what is queued and waits for at least one completion; `inflight` operations are
/// in flight. Aborts the process if the ring cannot be waited on.
fn wait_for_completion(ring: &mut IoUring, inflight: usize) {
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
}

/// Reaps the completions on `ring` into `ops`: settles each op done or failed, and queues on
/// `pending` those to go again (interrupted, or short). Returns how many it reaped.
fn reap(ring: &mut IoUring, ops: &mut [Op], pending: &mut VecDeque<usize>) -> usize {
    let done: Vec<(u64, i32)> = ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect();
    for &(ud, res) in &done {
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
    done.len()
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        let ops: Vec<Op> = batch.iter_mut().map(op_of).collect();
        RING.with(|r| match this_ring(&mut r.borrow_mut(), self.depth) {
            Ok(ring) => run_job(ring, ops),
            Err(e) => ops.iter().map(|_| Err(copy_err(&e))).collect(),
        })
    }

    fn submit_stream(
        &self,
        stream: &mut dyn Iterator<Item = IoRequest<'_>>,
    ) -> Vec<io::Result<usize>> {
        RING.with(|r| match this_ring(&mut r.borrow_mut(), self.depth) {
            Ok(ring) => {
                // The requests' buffers are borrowed for 'a, past this call, so an op may
                // outlive the request it was made from.
                let mut pull = || stream.next().map(|mut r| op_of(&mut r));
                run(ring, Vec::new(), Some(&mut pull))
            }
            Err(e) => stream.map(|_| Err(copy_err(&e))).collect(),
        })
    }
}

/// This thread's ring of `depth` entries, set up first if it has none of that depth.
fn this_ring(slot: &mut Option<(u32, IoUring)>, depth: u32) -> io::Result<&mut IoUring> {
    if slot.as_ref().is_none_or(|(d, _)| *d != depth) {
        *slot = Some((depth, IoUring::new(depth)?));
    }
    Ok(&mut slot.as_mut().expect("set above").1)
}

fn copy_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// The op of one request: its buffers as iovecs (a device request fails at once).
fn op_of(r: &mut IoRequest<'_>) -> Op {
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
}

#[cfg(test)]
mod tests {
    #[test]
    fn contract() {
        let e = super::UringEngine::new(8).expect("io_uring works on this kernel");
        super::super::contract::run_all(&e);
    }

    /// A stream's request is in flight before the next is pulled: when the stream makes
    /// request k, request k-1's write has started (it completes while the caller waits here).
    #[test]
    fn a_stream_starts_each_request_before_pulling_the_next() {
        use super::super::{IoEngine, IoRequest};
        use std::io::IoSlice;
        use std::os::fd::AsFd;
        let e = super::UringEngine::new(8).unwrap();
        let files: Vec<std::fs::File> = (0..6).map(|_| tempfile::tempfile().unwrap()).collect();
        let data = vec![7u8; 64 << 10];
        let mut started = Vec::new();
        let mut stream = files.iter().enumerate().map(|(k, f)| {
            if k > 0 && started.contains(&false) {
                started.push(false);
            } else if k > 0 {
                // Up to 10 s for the previous write to land (it was submitted, not waited for).
                let prev = &files[k - 1];
                let t = std::time::Instant::now();
                let landed = loop {
                    let len = prev.metadata().unwrap().len();
                    if len == data.len() as u64 {
                        break true;
                    }
                    if t.elapsed() > std::time::Duration::from_secs(10) {
                        break false;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                };
                started.push(landed);
            }
            IoRequest::write(f.as_fd(), 0, vec![IoSlice::new(&data)])
        });
        let res = e.submit_stream(&mut stream);
        drop(stream);
        assert!(res.iter().all(|r| *r.as_ref().unwrap() == data.len()));
        assert_eq!(
            started,
            vec![true; 5],
            "writes started before the next pull"
        );
    }

    /// A stream never has more requests in flight than the ring's depth: with depth 1, the
    /// second request is pulled only once the first (a read of a pipe that another thread fills
    /// later) has completed. The same thread first ran a ring of depth 8, which the engine of
    /// depth 1 must not reuse.
    #[test]
    fn a_stream_keeps_at_most_the_depth_in_flight() {
        use super::super::{IoEngine, IoRequest};
        use std::io::{IoSlice, IoSliceMut};
        use std::os::fd::AsFd;
        use std::sync::atomic::{AtomicBool, Ordering};
        let wide = super::UringEngine::new(8).unwrap();
        let f = tempfile::tempfile().unwrap();
        let res = wide.submit(&mut [IoRequest::write(f.as_fd(), 0, vec![IoSlice::new(b"x")])]);
        assert_eq!(*res[0].as_ref().unwrap(), 1);

        let e = super::UringEngine::new(1).unwrap();
        let (rx, mut tx) = std::io::pipe().unwrap();
        let filled = AtomicBool::new(false);
        let mut first = [0u8; 4];
        let mut second = [0u8; 4];
        let other = tempfile::tempfile().unwrap();
        rustix::io::pwrite(&other, b"abcd", 0).unwrap();
        let mut seen_filled = None;
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                filled.store(true, Ordering::SeqCst);
                std::io::Write::write_all(&mut tx, b"pipe").unwrap();
            });
            let mut bufs = [Some(&mut first), Some(&mut second)].into_iter();
            let mut k = 0;
            let mut stream = std::iter::from_fn(|| {
                let buf = bufs.next()?;
                let buf = buf.expect("two buffers");
                k += 1;
                Some(if k == 1 {
                    IoRequest::read(rx.as_fd(), 0, vec![IoSliceMut::new(buf)])
                } else {
                    seen_filled = Some(filled.load(Ordering::SeqCst));
                    IoRequest::read(other.as_fd(), 0, vec![IoSliceMut::new(buf)])
                })
            });
            let res = e.submit_stream(&mut stream);
            assert!(res.iter().all(|r| *r.as_ref().unwrap() == 4), "{res:?}");
        });
        assert_eq!(
            seen_filled,
            Some(true),
            "the second request was pulled with the first in flight"
        );
        assert_eq!((&first, &second), (b"pipe", b"abcd"));
    }

    /// A stream that panics while a request of it is in flight: the engine waits for that
    /// request to complete before the panic reaches the caller (the buffer is filled by then).
    #[test]
    fn a_panicking_stream_unwinds_only_once_its_requests_complete() {
        use super::super::{IoEngine, IoRequest};
        use std::io::IoSliceMut;
        use std::os::fd::AsFd;
        let e = super::UringEngine::new(8).unwrap();
        let (rx, mut tx) = std::io::pipe().unwrap();
        let mut buf = [0u8; 4];
        let (caught, at_unwind) = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                std::io::Write::write_all(&mut tx, b"pipe").unwrap();
            });
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut first = Some(&mut buf);
                let mut stream = std::iter::from_fn(|| match first.take() {
                    Some(b) => Some(IoRequest::read(rx.as_fd(), 0, vec![IoSliceMut::new(b)])),
                    None => panic!("the stream fails"),
                });
                e.submit_stream(&mut stream)
            }));
            // Before the writer's 300 ms are up unless the engine waited for the read.
            (caught, buf)
        });
        assert!(caught.is_err(), "the panic reaches the caller");
        assert_eq!(&at_unwind, b"pipe", "the read completed before the unwind");
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
