//! The completion queue (`tierkv::Completions`): batches submitted without waiting, their
//! results and buffers collected by polling, blocking or an eventfd.

mod common;

use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use tierkv::engine::{EngineKind, IoEngine, IoRequest};
use tierkv::{Completion, Completions, Error, Lookup, Outcome, Store};

/// An engine whose transfers wait until the test opens its gate.
#[derive(Debug)]
struct Gated {
    inner: Arc<dyn IoEngine>,
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl IoEngine for Gated {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<std::io::Result<usize>> {
        let (m, cv) = &*self.open;
        let mut open = m.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        drop(open);
        self.inner.submit(batch)
    }
}

/// Opens its gate when dropped, so a test that fails before opening it does not leave the
/// queue's threads waiting there (declare it after the queue: it is dropped first).
struct OpenOnDrop<F: Fn()>(F);

impl<F: Fn()> Drop for OpenOnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A store whose I/O waits at a gate, and the gate's opener.
fn gated_store(root: &std::path::Path) -> (Store, impl Fn()) {
    let open = Arc::new((Mutex::new(false), Condvar::new()));
    let engine = Arc::new(Gated {
        inner: EngineKind::Psync.build().unwrap(),
        open: open.clone(),
    });
    let store = Store::open_with_engine(root, worker("0"), quiet(), engine).unwrap();
    let opener = move || {
        *open.0.lock().unwrap() = true;
        open.1.notify_all();
    };
    (store, opener)
}

/// True if `fd` is readable now.
fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).unwrap() == 1
}

/// Waits for the one completion of `id`.
fn one(q: &Completions, id: u64) -> Completion<Vec<u8>> {
    let mut done = q.wait(Some(Duration::from_secs(5)));
    assert_eq!(done.len(), 1, "{done:?}");
    let c = done.pop().unwrap();
    assert_eq!(c.id, id);
    c
}

#[test]
fn blocks_set_then_got_come_back_byte_for_byte_with_their_buffers() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
        let keys = keys(&store, 8);
        let q: Completions = Completions::new(store, 2).unwrap();
        let items: Vec<_> = (0..8u64)
            .map(|i| (keys[i as usize].clone(), payload(i, 0, 10_000 + i as usize)))
            .collect();
        let id = q.submit_set(items);
        let Outcome::Set { results, items } = one(&q, id).outcome else {
            panic!("not a set")
        };
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(items.len(), 8, "the items come back");

        let bufs = vec![vec![0u8; 20_000]; 8];
        let id = q.submit_get(keys.clone(), bufs);
        let Outcome::Get { results, bufs } = one(&q, id).outcome else {
            panic!("not a get")
        };
        for (i, (r, b)) in results.iter().zip(&bufs).enumerate() {
            let len = 10_000 + i;
            assert_eq!(r.as_ref().unwrap(), &Lookup::Hit(len));
            assert_eq!(&b[..len], &payload(i as u64, 0, len)[..], "block {i}");
        }
        assert_eq!(q.pending(), 0);
    });
}

#[test]
fn exists_and_prefix_answer_per_key() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
        let keys = keys(&store, 4);
        store.put(&keys[0], &[1u8; 100]).unwrap();
        store.put(&keys[1], &[2u8; 100]).unwrap();
        store.put(&keys[3], &[3u8; 100]).unwrap();
        let q: Completions = Completions::new(store, 1).unwrap();
        let id = q.submit_exists(keys.clone());
        let Outcome::Exists { results } = one(&q, id).outcome else {
            panic!("not exists")
        };
        let got: Vec<bool> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, [true, true, false, true]);
        let id = q.submit_prefix(keys);
        let Outcome::Prefix { result } = one(&q, id).outcome else {
            panic!("not prefix")
        };
        assert_eq!(result.unwrap(), 2);
    });
}

#[test]
fn remove_answers_per_key_and_the_blocks_are_gone() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
        let keys = keys(&store, 3);
        store.put(&keys[0], &[1u8; 100]).unwrap();
        store.put(&keys[2], &[3u8; 100]).unwrap();
        let q: Completions = Completions::new(store, 1).unwrap();
        let id = q.submit_remove(keys.clone());
        let Outcome::Remove { results } = one(&q, id).outcome else {
            panic!("not remove")
        };
        let got: Vec<bool> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, [true, false, true]);
        let exists = q.store().contains_many(&keys);
        assert!(exists.iter().all(|r| !r.as_ref().unwrap()), "{exists:?}");
    });
}

#[test]
fn a_submission_returns_while_the_disk_is_busy_and_the_eventfd_says_when_it_is_done() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let (store, open_gate) = gated_store(root.path());
        let key = store.key(hash(1));
        let q: Completions = Completions::new(store, 1).unwrap();
        let open_gate = OpenOnDrop(open_gate);
        let open_gate = || (open_gate.0)();
        // The engine holds the put at its gate: the submission has returned all the same.
        let id = q.submit_set(vec![(key.clone(), vec![7u8; 4096])]);
        assert_eq!(q.pending(), 1);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!readable(q.event_fd()), "readable before anything finished");
        assert!(q.drain().is_empty());
        open_gate();
        let event = q.event_fd();
        let mut fds = [rustix::event::PollFd::new(
            &event,
            rustix::event::PollFlags::IN,
        )];
        assert_eq!(rustix::event::poll(&mut fds, None).unwrap(), 1);
        let done = q.drain();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id, id);
        assert!(!readable(q.event_fd()), "still readable after the drain");
        assert_eq!(q.pending(), 0);
        assert!(q.store().contains_many(&[key])[0].as_ref().unwrap());
    });
}

#[test]
fn closing_runs_every_batch_already_submitted() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let (store, open_gate) = gated_store(root.path());
        let keys = keys(&store, 12);
        let q: Completions = Completions::new(store.clone(), 2).unwrap();
        let ids: Vec<u64> = keys
            .iter()
            .map(|k| q.submit_set(vec![(k.clone(), vec![9u8; 8192])]))
            .collect();
        let mut unique = ids.clone();
        unique.dedup();
        assert_eq!(unique.len(), 12, "ids are distinct");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(q.close()));
        std::thread::sleep(Duration::from_millis(50));
        open_gate();
        let closed = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("close hung");
        let mut done: Vec<u64> = closed.iter().map(|c| c.id).collect();
        done.sort_unstable();
        assert_eq!(done, ids, "every batch completed");
        assert_eq!(store.contains_prefix(&keys).unwrap(), 12);
    });
}

#[test]
fn store_errors_are_results_and_the_buffers_still_come_back() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
        let keys = keys(&store, 2);
        store.put(&keys[0], &[5u8; 10_000]).unwrap();
        let q: Completions = Completions::new(store, 1).unwrap();
        // A buffer too small for the block, and a miss.
        let id = q.submit_get(keys, vec![vec![0u8; 100], vec![0u8; 100]]);
        let Outcome::Get { results, bufs } = one(&q, id).outcome else {
            panic!("not a get")
        };
        assert!(
            matches!(results[0], Err(Error::BufferTooSmall { .. })),
            "{results:?}"
        );
        assert_eq!(results[1].as_ref().unwrap(), &Lookup::Miss);
        assert_eq!(bufs.len(), 2);
    });
}

#[test]
fn a_wait_with_nothing_pending_returns_at_once() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path(), worker("0"), quiet()).unwrap();
        let q: Completions = Completions::new(store, 1).unwrap();
        assert!(q.wait(None).is_empty());
        assert!(q.wait(Some(Duration::ZERO)).is_empty());
        let _ = q.event_fd().as_fd();
        let shown = format!("{q:?}");
        assert!(
            shown.contains("threads: 1") && shown.contains("pending: 0"),
            "{shown}"
        );
    });
}

#[test]
fn dropping_the_queue_runs_every_batch_already_submitted_first() {
    within(20, "the test", || {
        let root = tempfile::tempdir().unwrap();
        let (store, open_gate) = gated_store(root.path());
        let keys = keys(&store, 6);
        let q: Completions = Completions::new(store.clone(), 2).unwrap();
        for k in &keys {
            q.submit_set(vec![(k.clone(), vec![3u8; 4096])]);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(q);
            let _ = tx.send(());
        });
        // The drop waits for the batches, which wait at the gate.
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        open_gate();
        rx.recv_timeout(Duration::from_secs(10)).expect("drop hung");
        assert_eq!(store.contains_prefix(&keys).unwrap(), 6);
    });
}
