//! Property test: the store against a simple model (a map), over random sequences of puts,
//! gets, removes, deletions behind the store's back, corruption, and reopening.

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use tierkv::{Layout, Lookup, Publish, Store, StoreConfig, VerifyMode};

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u8, u16),
    Get(u8),
    Remove(u8),
    DeleteBehind(u8),
    CorruptBehind(u8),
    Prefix,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, any::<u8>(), 0u16..6000).prop_map(|(k, v, n)| Op::Put(k, v, n)),
        4 => (0u8..12).prop_map(Op::Get),
        1 => (0u8..12).prop_map(Op::Remove),
        1 => (0u8..12).prop_map(Op::DeleteBehind),
        1 => (0u8..12).prop_map(Op::CorruptBehind),
        1 => Just(Op::Prefix),
        1 => Just(Op::Reopen),
    ]
}

fn config(fd_cache: usize, depth: u8, rename: bool) -> StoreConfig {
    StoreConfig::new()
        .with_publish(if rename {
            Publish::Rename
        } else {
            Publish::Tmpfile
        })
        .with_fd_cache(fd_cache)
        .with_layout(Layout::new(depth, 16).unwrap())
        .with_verify(VerifyMode::OnOpen)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..60), fd_cache in 0usize..4, depth in 0u8..3, rename in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), worker("m"), config(fd_cache, depth, rename)).unwrap();
        // Some(data): a valid block; None: a corrupt file is on disk (a miss once read).
        let mut model: HashMap<u8, Option<Vec<u8>>> = HashMap::new();
        let key = |s: &Store, k: u8| s.key(hash(k as u64));
        for op in ops {
            match op {
                Op::Put(k, v, n) => {
                    let data = payload(k as u64, v, n as usize);
                    store.put(&key(&store, k), &data).unwrap();
                    model.insert(k, Some(data));
                }
                Op::Get(k) => {
                    let mut b = vec![0u8; 6000];
                    let r = store.get(&key(&store, k), &mut b).unwrap();
                    match model.get(&k) {
                        Some(Some(d)) => {
                            prop_assert_eq!(r, Lookup::Hit(d.len()));
                            prop_assert_eq!(&b[..d.len()], &d[..]);
                        }
                        Some(None) => {
                            // Corrupt: a miss, and the file is removed.
                            prop_assert_eq!(r, Lookup::Miss);
                            prop_assert!(!store.path_of(&hash(k as u64)).exists());
                            model.remove(&k);
                        }
                        None => prop_assert_eq!(r, Lookup::Miss),
                    }
                }
                Op::Remove(k) => {
                    let r = store.remove_many(&[key(&store, k)]).pop().unwrap().unwrap();
                    prop_assert_eq!(r, model.remove(&k).is_some());
                }
                Op::DeleteBehind(k) => {
                    let _ = std::fs::remove_file(store.path_of(&hash(k as u64)));
                    model.remove(&k);
                }
                Op::CorruptBehind(k) => {
                    // Rewrite the file (new inode, as another process would) one byte short:
                    // the next read must detect it, even if a descriptor was cached.
                    let p = store.path_of(&hash(k as u64));
                    if let Ok(mut bytes) = std::fs::read(&p) {
                        bytes.pop();
                        let tmp = p.with_extension("x");
                        std::fs::write(&tmp, &bytes).unwrap();
                        std::fs::rename(&tmp, &p).unwrap();
                        model.insert(k, None);
                    }
                }
                Op::Prefix => {
                    let chain: Vec<_> = (0..12).map(|k| key(&store, k)).collect();
                    // contains does not read contents: a corrupt file counts until read.
                    let expect = (0..12).take_while(|k| model.contains_key(k)).count();
                    prop_assert_eq!(store.contains_prefix(&chain).unwrap(), expect);
                }
                Op::Reopen => {
                    drop(store);
                    store = Store::open(dir.path(), worker("m"), config(fd_cache, depth, rename)).unwrap();
                }
            }
        }
        // Final full check.
        for k in 0..12u8 {
            let mut b = vec![0u8; 6000];
            let r = store.get(&key(&store, k), &mut b).unwrap();
            prop_assert_eq!(r.hit_len(), model.get(&k).and_then(|d| d.as_ref().map(Vec::len)));
        }
        prop_assert!(temp_files_under(store.dir()).is_empty());
    }
}
