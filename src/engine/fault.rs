//! Fault injection: an engine that wraps another and fails chosen requests, the way a full
//! disk or a dying device would. Used by the test suite; public so that users can test their
//! own error handling against the store.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{IoEngine, IoKind, IoRequest};

/// Which requests fail, and how.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Fail writes whose index among all writes seen (from 0) is at least this.
    pub fail_writes_from: Option<u64>,
    /// Fail reads whose index among all reads seen is at least this.
    pub fail_reads_from: Option<u64>,
    /// A failing write first writes this fraction of its bytes (0.0..=1.0), then fails: a
    /// write that dies half way.
    pub partial_fraction: f64,
    /// The `errno` of the failure (e.g. 28 = ENOSPC, 5 = EIO).
    pub errno: i32,
}

impl FaultPlan {
    /// Every write from the `n`-th on writes half its bytes, then fails with ENOSPC.
    pub fn enospc_half_way_from(n: u64) -> Self {
        FaultPlan {
            fail_writes_from: Some(n),
            fail_reads_from: None,
            partial_fraction: 0.5,
            errno: rustix::io::Errno::NOSPC.raw_os_error(),
        }
    }
}

/// An engine that injects the failures of a [`FaultPlan`] into another engine's batches.
#[derive(Debug)]
pub struct FaultyEngine {
    inner: Arc<dyn IoEngine>,
    plan: FaultPlan,
    writes: AtomicU64,
    reads: AtomicU64,
    partial_bytes: AtomicU64,
}

impl FaultyEngine {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn IoEngine>, plan: FaultPlan) -> Self {
        FaultyEngine {
            inner,
            plan,
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            partial_bytes: AtomicU64::new(0),
        }
    }

    /// Writes seen so far.
    pub fn writes_seen(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Bytes that failing writes really wrote before failing.
    pub fn partial_bytes_written(&self) -> u64 {
        self.partial_bytes.load(Ordering::Relaxed)
    }
}

impl IoEngine for FaultyEngine {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn forget_file(&self, fd: std::os::fd::BorrowedFd<'_>) {
        self.inner.forget_file(fd);
    }

    fn moves_device_memory(&self) -> bool {
        self.inner.moves_device_memory()
    }

    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        let mut out = Vec::with_capacity(batch.len());
        for req in batch.iter_mut() {
            let (counter, from) = match req.kind {
                IoKind::Read(_) | IoKind::ReadDevice(_) => (&self.reads, self.plan.fail_reads_from),
                IoKind::Write(_) | IoKind::WriteDevice(_) => {
                    (&self.writes, self.plan.fail_writes_from)
                }
            };
            let idx = counter.fetch_add(1, Ordering::Relaxed);
            let fail = from.is_some_and(|f| idx >= f);
            if !fail {
                out.extend(self.inner.submit(std::slice::from_mut(req)));
                continue;
            }
            if let IoKind::Write(bufs) = &req.kind {
                // Write a prefix of the bytes for real, then fail.
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                let mut budget =
                    (total as f64 * self.plan.partial_fraction.clamp(0.0, 1.0)) as usize;
                let mut prefix: Vec<IoSlice<'_>> = Vec::new();
                for b in bufs {
                    if budget == 0 {
                        break;
                    }
                    let n = budget.min(b.len());
                    prefix.push(IoSlice::new(&b[..n]));
                    budget -= n;
                }
                if !prefix.is_empty() {
                    let mut r = [IoRequest::write(req.fd, req.offset, prefix)];
                    if let Some(Ok(n)) = self.inner.submit(&mut r).pop() {
                        self.partial_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            out.push(Err(io::Error::from_raw_os_error(self.plan.errno)));
        }
        out
    }
}
