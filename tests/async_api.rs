//! The async API runs batches off tokio's worker threads and hands buffers back.

mod common;

use std::io;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use common::*;
use tierkv::engine::{IoEngine, IoRequest, PsyncEngine};
use tierkv::{Lookup, Store, StoreConfig};

/// An engine that records which threads submitted batches.
#[derive(Debug, Default)]
struct Recording {
    threads: Mutex<Vec<ThreadId>>,
}

impl IoEngine for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn submit(&self, batch: &mut [IoRequest<'_>]) -> Vec<io::Result<usize>> {
        self.threads
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        PsyncEngine::new().submit(batch)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn batches_run_off_the_runtime_thread() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Recording::default());
    let store = Store::open_with_engine(
        dir.path(),
        worker("w"),
        StoreConfig::default(),
        engine.clone(),
    )
    .unwrap();
    let ks = keys(&store, 16);
    let items: Vec<_> = ks
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), payload(i as u64, 0, 8192)))
        .collect();
    let (res, items_back) = store.put_many_async(items).await;
    assert!(res.iter().all(Result::is_ok));
    assert_eq!(items_back.len(), 16);

    let bufs = vec![vec![0u8; 8192]; 16];
    let (res, bufs) = store.get_many_async(ks.clone(), bufs).await;
    for (i, (r, b)) in res.into_iter().zip(&bufs).enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit(8192));
        assert_eq!(b, &payload(i as u64, 0, 8192));
    }
    assert_eq!(store.contains_prefix_async(ks.clone()).await.unwrap(), 16);
    assert!(
        store
            .contains_many_async(ks.clone())
            .await
            .into_iter()
            .all(|r| r.unwrap())
    );
    assert!(
        store.remove_many_async(ks[..1].to_vec()).await[0]
            .as_ref()
            .unwrap()
    );
    assert_eq!(store.contains_prefix_async(ks).await.unwrap(), 0);

    let runtime_thread = std::thread::current().id();
    let seen = engine.threads.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "one engine batch per put_many/get_many");
    assert!(
        seen.iter().all(|t| *t != runtime_thread),
        "engine ran on the runtime's worker thread"
    );
}
