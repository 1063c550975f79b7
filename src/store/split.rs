//! A get's reads split between threads ([`StoreConfig::read_threads`]): a large batch of host
//! reads on an engine that runs concurrent submits at full speed goes to the calling thread
//! and scoped threads in contiguous shares of about equal bytes, so that a second core reads
//! (and hashes) half of it.
//!
//! [`StoreConfig::read_threads`]: crate::StoreConfig::read_threads

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::PARALLEL_READ_MIN;
use crate::engine::{IoEngine, IoKind, IoRequest, submit_checked};

/// Runs `reqs` on `engine`, split between up to `threads` threads (counted in `splits`) when they
/// are two or more host reads of at least [`PARALLEL_READ_MIN`] bytes in all and the engine
/// runs concurrent submits; else on the calling thread. One result per request, in order.
pub(super) fn submit(
    engine: &dyn IoEngine,
    reqs: &mut [IoRequest<'_>],
    threads: usize,
    splits: &AtomicU64,
) -> Vec<io::Result<usize>> {
    let lens: Vec<usize> = reqs.iter().map(IoRequest::len).collect();
    let host_only = reqs.iter().all(|r| matches!(r.kind, IoKind::Read(_)));
    let shares = shares(&lens, threads);
    if shares.len() < 2
        || !host_only
        || lens.iter().sum::<usize>() < PARALLEL_READ_MIN
        || !engine.concurrent_submits()
    {
        return submit_checked(engine, reqs);
    }
    splits.fetch_add(1, Ordering::Relaxed);
    let mut parts: Vec<&mut [IoRequest<'_>]> = Vec::with_capacity(shares.len());
    let mut rest = reqs;
    for &n in &shares {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
        parts.push(part);
        rest = tail;
    }
    let first = parts.remove(0);
    std::thread::scope(|s| {
        let others: Vec<_> = parts
            .into_iter()
            .map(|part| s.spawn(move || submit_checked(engine, part)))
            .collect();
        let mut results = submit_checked(engine, first);
        for h in others {
            results.extend(h.join().expect("a read thread panicked"));
        }
        results
    })
}

/// How many requests (of lengths `lens`, in order) each of at most `threads` contiguous shares
/// takes: a request goes to the share its middle byte falls in when the batch's bytes are cut
/// into `threads` equal parts; empty shares are left out.
fn shares(lens: &[usize], threads: usize) -> Vec<usize> {
    let threads = threads.max(1);
    let total = lens.iter().sum::<usize>().max(1);
    let mut counts = vec![0usize; threads];
    let mut before = 0usize;
    for &l in lens {
        let share = ((before + l / 2) * threads / total).min(threads - 1);
        counts[share] += 1;
        before += l;
    }
    counts.retain(|&c| c > 0);
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{IoSlice, IoSliceMut};
    use std::os::fd::AsFd;

    #[test]
    fn shares_are_contiguous_fair_and_never_empty() {
        assert_eq!(shares(&[10, 10, 10, 10], 2), [2, 2]);
        assert_eq!(shares(&[10, 10, 10, 10], 1), [4]);
        assert_eq!(shares(&[10, 10, 10, 10], 4), [1, 1, 1, 1]);
        // More threads than requests: one request each.
        assert_eq!(shares(&[5, 5], 8), [1, 1]);
        assert_eq!(shares(&[], 2), Vec::<usize>::new());
        assert_eq!(shares(&[7], 0), [1]);
        // By bytes, not by count: a large first request is a share of its own.
        assert_eq!(shares(&[100, 10, 10, 10], 2), [1, 3]);
        assert_eq!(shares(&[10, 10, 10, 100], 2), [3, 1]);
        // Three threads over 90 bytes: 30 each.
        assert_eq!(shares(&[10; 9], 3), [3, 3, 3]);
        // By each request's middle byte: 20 of 39 bytes, the first's middle (10) in the first
        // half, every other's in the second; a request larger than a share leaves a share
        // empty, and it is left out.
        assert_eq!(shares(&[20, 1, 1, 1, 1, 15], 2), [1, 5]);
        assert_eq!(shares(&[1, 1, 100], 3), [2, 1]);
        assert_eq!(shares(&[0, 0, 0], 2), [3]);
        // An empty request at the end falls past the last share's bytes: it joins that share.
        assert_eq!(shares(&[10, 0], 2), [2]);
    }

    /// psync with `concurrent_submits` as given, counting the threads it ran on.
    #[derive(Debug)]
    struct Seen {
        concurrent: bool,
        threads: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    }

    impl IoEngine for Seen {
        fn name(&self) -> &'static str {
            "seen"
        }
        fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
            self.threads
                .lock()
                .unwrap()
                .insert(std::thread::current().id());
            crate::engine::PsyncEngine::new().submit(batch)
        }
        fn concurrent_submits(&self) -> bool {
            self.concurrent
        }
    }

    /// Reads `n` requests of `len` bytes each (request `i` at offset `i * len` of a file of
    /// distinct bytes) through [`submit`]; returns (threads used, splits counted), having
    /// checked every result and every buffer.
    fn run(n: usize, len: usize, threads: usize, concurrent: bool, write: bool) -> (usize, u64) {
        let f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..n * len).map(|i| (i % 253) as u8).collect();
        crate::sys::write_full(f.as_fd(), 0, &mut [IoSlice::new(&data)]).unwrap();
        let engine = Seen {
            concurrent,
            threads: std::sync::Mutex::default(),
        };
        let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
        let mut reqs: Vec<IoRequest<'_>> = if write {
            data.chunks(len)
                .enumerate()
                .map(|(i, c)| IoRequest::write(f.as_fd(), (i * len) as u64, vec![IoSlice::new(c)]))
                .collect()
        } else {
            bufs.iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    IoRequest::read(f.as_fd(), (i * len) as u64, vec![IoSliceMut::new(b)])
                })
                .collect()
        };
        let splits = AtomicU64::new(0);
        let results = submit(&engine, &mut reqs, threads, &splits);
        drop(reqs);
        assert_eq!(results.len(), n);
        assert!(results.iter().all(|r| *r.as_ref().unwrap() == len));
        if !write {
            for (i, b) in bufs.iter().enumerate() {
                assert_eq!(b[..], data[i * len..(i + 1) * len], "request {i}");
            }
        }
        let used = engine.threads.lock().unwrap().len();
        (used, splits.load(Ordering::Relaxed))
    }

    #[test]
    fn large_host_reads_are_split_and_keep_their_order() {
        let min = PARALLEL_READ_MIN;
        // 16 reads of min/8: twice the threshold.
        assert_eq!(run(16, min / 8, 2, true, false), (2, 1));
        assert_eq!(run(16, min / 8, 3, true, false), (3, 1));
        // Exactly the threshold is split; a byte under it is not.
        assert_eq!(run(4, min / 4, 2, true, false), (2, 1));
        assert_eq!(run(4, min / 4 - 1, 2, true, false), (1, 0));
        // One thread, one request, an engine without concurrent submits, writes: not split.
        assert_eq!(run(16, min / 8, 1, true, false), (1, 0));
        assert_eq!(run(1, 2 * min, 2, true, false), (1, 0));
        assert_eq!(run(16, min / 8, 2, false, false), (1, 0));
        assert_eq!(run(16, min / 8, 2, true, true), (1, 0));
    }
}
