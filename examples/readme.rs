//! The library example of README.md: the lines between `// README begin` and `// README end`
//! are README's, word for word (tests/first_contact.rs checks it); tools/test.sh runs it
//! (`cargo run --example readme`). A store in a temp dir, a request's prefix looked up, loaded
//! and stored, then a bounded store on the same worker directory.

use tierkv::{BlockHash, Lookup, Store, StoreConfig, WorkerId};

/// One block's bytes in this example (a real engine's block is its KV tensors, e.g. 2 MiB).
const BLOCK_BYTES: usize = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?; // a real cache lives on an NVMe mount, e.g. /mnt/nvme/kvcache
    let root = dir.path();
    // README begin
    let store = Store::open(root, WorkerId::new("rank0")?, StoreConfig::default())?;

    // Block hashes chain over the prompt: equal prefixes give equal keys.
    let tokens: Vec<u32> = (0..64).collect(); // a prompt's token ids: 4 blocks of 16 tokens
    let keys: Vec<_> = BlockHash::chain_all(&tokens, 16)
        .into_iter()
        .map(|h| store.key(h))
        .collect();

    // How much of this request's prefix is on disk? (Nothing yet.)
    let cached = store.contains_prefix(&keys)?;

    // Load it (one batch), store the rest (each put is atomic: temp file + rename).
    let mut bufs = vec![vec![0u8; BLOCK_BYTES]; cached];
    for r in store.get_many(&keys[..cached], &mut bufs) {
        match r? {
            Lookup::Hit(_len) => { /* the block's bytes are in its buffer */ }
            Lookup::Miss => { /* deleted or corrupt since: recompute it */ }
        }
    }
    let new_blocks: Vec<Vec<u8>> = (cached..keys.len())
        .map(|i| vec![i as u8; BLOCK_BYTES])
        .collect();
    let items: Vec<_> = keys[cached..]
        .iter()
        .cloned()
        .zip(new_blocks.iter().map(Vec::as_slice))
        .collect();
    for r in store.put_many(&items) {
        r?; // NoSpace, Io { path, .. }: nothing partial is left behind
    }
    assert_eq!(store.contains_prefix(&keys)?, 4);

    // One store per worker directory: close this one before reopening the worker bounded.
    drop(store);
    let config = StoreConfig::new().with_capacity_bytes(2 << 40); // 2 TiB per worker
    let store = Store::open(root, WorkerId::new("rank0")?, config)?;
    // After a request's cached prefix: stores absent blocks, touches present ones.
    for r in store.offer_many(&items) {
        r?;
    }
    // README end
    let mut buf = vec![0u8; BLOCK_BYTES];
    let found = store.get_many(&keys[3..], std::slice::from_mut(&mut buf));
    assert!(matches!(found[0], Ok(Lookup::Hit(BLOCK_BYTES))));
    assert_eq!(buf, vec![3u8; BLOCK_BYTES]);
    assert_eq!(store.stats().used_files, 4);
    println!("readme example: 4 blocks stored, reopened bounded, read back");
    Ok(())
}
