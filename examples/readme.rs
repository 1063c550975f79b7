//! The library example of README.md: the lines between `// README begin` and `// README end`
//! are README's, word for word (tests/first_contact.rs checks it); tools/test.sh runs it
//! (`cargo run --example readme`). A store in a temp dir with the write-behind offloader in
//! front: a request's prefix looked up, loaded and offered, then a bounded store on the same
//! worker directory.

use tierkv::{BlockHash, BlockKey, Lookup, OffloadConfig, Offloader, Store, StoreConfig, WorkerId};

/// One block's bytes in this example (a real engine's block is its KV tensors, e.g. 2 MiB).
const BLOCK_BYTES: usize = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?; // a real cache lives on an NVMe mount, e.g. /mnt/nvme/kvcache
    let root = dir.path();
    // README begin
    let store = Store::open(root, WorkerId::new("rank0")?, StoreConfig::default())?;
    // The engine writes behind: its thread hands blocks over and never waits on the disk.
    let offload = Offloader::new(store.clone(), OffloadConfig::default())?;

    // Block hashes chain over the prompt: equal prefixes give equal keys.
    let tokens: Vec<u32> = (0..64).collect(); // a prompt's token ids: 4 blocks of 16 tokens
    let keys: Vec<_> = BlockHash::chain_all(&tokens, 16)
        .into_iter()
        .map(|h| store.key(h))
        .collect();

    // How much of this request's prefix is cached (on disk or still queued)? Nothing yet.
    let cached = offload.contains_prefix(&keys)?;

    // Load it (one batch; a block still queued is served from the queue).
    let mut bufs = vec![vec![0u8; BLOCK_BYTES]; cached];
    for r in offload.get_many(&keys[..cached], &mut bufs) {
        match r? {
            Lookup::Hit(_len) => { /* the block's bytes are in its buffer */ }
            Lookup::Miss => { /* deleted or corrupt since: recompute it */ }
        }
    }
    // Offer the blocks computed after the prefix (owned buffers): returns at once. A full
    // queue drops the newest offer (counted); blocks stored or queued already are skipped.
    let new_blocks: Vec<(BlockKey, Vec<u8>)> = (cached..keys.len())
        .map(|i| (keys[i].clone(), vec![i as u8; BLOCK_BYTES]))
        .collect();
    let offered = offload.offer(cached.checked_sub(1).map(|i| &keys[i]), new_blocks);
    assert_eq!(offered.queued, 4);
    offload.flush(); // an engine need not wait: closing writes what is queued
    assert_eq!(store.contains_prefix(&keys)?, 4);
    println!("{:?}", store.stats().offload); // queued, written, dropped by reason, queue wait
    // README end

    // The store's own calls are synchronous: put_many writes each block atomically (temp
    // file + rename) before it returns; NoSpace, Io { path, .. } leave nothing partial.
    let block = vec![0u8; BLOCK_BYTES];
    for r in store.put_many(&[(keys[0].clone(), &block[..])]) {
        r?;
    }
    // One store per worker directory: close this one before reopening the worker bounded.
    drop(offload);
    drop(store);
    let config = StoreConfig::new().with_capacity_bytes(2 << 40); // 2 TiB per worker
    let store = Store::open(root, WorkerId::new("rank0")?, config)?;
    let mut buf = vec![0u8; BLOCK_BYTES];
    let found = store.get_many(&keys[3..], std::slice::from_mut(&mut buf));
    assert!(matches!(found[0], Ok(Lookup::Hit(BLOCK_BYTES))));
    assert_eq!(buf, vec![3u8; BLOCK_BYTES]);
    assert_eq!(store.stats().used_files, 4);
    println!("readme example: 4 blocks offloaded, reopened bounded, read back");
    Ok(())
}
