//! The async API, for tokio callers: each call moves owned buffers to tokio's blocking pool,
//! runs the batch there, and hands the buffers back with the results, so tokio's worker
//! threads never block on file I/O.

use super::{Lookup, Store};
use crate::error::Result;
use crate::key::BlockKey;

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("tierkv blocking task cancelled: {e}"),
    }
}

impl Store {
    /// [`Store::put_many`] for async callers. Returns the results and the items, so their
    /// buffers can be reused.
    pub async fn put_many_async<D>(
        &self,
        items: Vec<(BlockKey, D)>,
    ) -> (Vec<Result<()>>, Vec<(BlockKey, D)>)
    where
        D: AsRef<[u8]> + Send + 'static,
    {
        let store = self.clone();
        blocking(move || {
            let r = store.put_many(&items);
            (r, items)
        })
        .await
    }

    /// [`Store::get_many`] for async callers: takes the buffers by value and hands them back
    /// with the results (the `BufResult` shape of io_uring APIs).
    pub async fn get_many_async<B>(
        &self,
        keys: Vec<BlockKey>,
        mut bufs: Vec<B>,
    ) -> (Vec<Result<Lookup>>, Vec<B>)
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        let store = self.clone();
        blocking(move || {
            let r = store.get_many(&keys, &mut bufs);
            (r, bufs)
        })
        .await
    }

    /// [`Store::contains_many`] for async callers.
    pub async fn contains_many_async(&self, keys: Vec<BlockKey>) -> Vec<Result<bool>> {
        let store = self.clone();
        blocking(move || store.contains_many(&keys)).await
    }

    /// [`Store::contains_prefix`] for async callers.
    pub async fn contains_prefix_async(&self, keys: Vec<BlockKey>) -> Result<usize> {
        let store = self.clone();
        blocking(move || store.contains_prefix(&keys)).await
    }

    /// [`Store::remove_many`] for async callers.
    pub async fn remove_many_async(&self, keys: Vec<BlockKey>) -> Vec<Result<bool>> {
        let store = self.clone();
        blocking(move || store.remove_many(&keys)).await
    }
}
