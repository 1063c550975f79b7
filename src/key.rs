//! Keys: a worker id (one tensor-parallel rank) plus a 32-byte blake3 hash of a block chain.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest accepted worker id, in bytes.
pub const MAX_WORKER_ID_LEN: usize = 64;

/// The id of one worker (a tensor-parallel rank, or any engine process that must not share
/// blocks with another). It names a directory, so it is validated: 1 to 64 characters out of
/// `[A-Za-z0-9_.-]`, and never `.` or `..`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(Arc<str>);

impl WorkerId {
    /// Validates `id`; anything that is not a plain directory name is [`Error::InvalidKey`].
    pub fn new(id: &str) -> Result<Self> {
        validate_worker_id(id)?;
        Ok(WorkerId(Arc::from(id)))
    }

    /// The id as a string (also its directory name).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The worker id of an engine's configuration: `<prefix>.<16 hex>`, the hex the first 8
    /// bytes of a blake3 (key-derivation context `"tierkv worker description v1"`) of
    /// `description` written as canonical JSON (object keys sorted by their bytes, no
    /// whitespace, strings and numbers as `serde_json` writes them). `prefix` is the readable
    /// part (an engine's name, model, rank): cut to its first 47 bytes, so the id fits in 64.
    /// Two descriptions that differ in any field give two ids; the same description gives the
    /// same id in every process and on every node, whatever its keys' order.
    pub fn from_description(prefix: &str, description: &serde_json::Value) -> Result<Self> {
        let mut text = String::new();
        canonical_json(description, &mut text);
        let mut h = blake3::Hasher::new_derive_key("tierkv worker description v1");
        h.update(text.as_bytes());
        let hex = BlockHash(*h.finalize().as_bytes()).to_hex();
        let cut = prefix
            .char_indices()
            .nth(47)
            .map_or(prefix.len(), |(i, _)| i);
        WorkerId::new(&format!("{}.{}", &prefix[..cut], &hex[..16]))
    }
}

/// `v` as canonical JSON into `out`: object keys sorted by their bytes (whatever order the
/// map keeps them in), no whitespace, scalars as `serde_json` writes them.
fn canonical_json(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Checks a worker id without allocating.
pub(crate) fn validate_worker_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_WORKER_ID_LEN {
        return Err(Error::invalid_key(format!(
            "worker id must be 1 to {MAX_WORKER_ID_LEN} bytes, got {} bytes",
            id.len()
        )));
    }
    if id == "." || id == ".." {
        return Err(Error::invalid_key(format!("worker id {id:?} is reserved")));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(Error::invalid_key(format!(
            "worker id {id:?} contains {c:?}; allowed are [A-Za-z0-9_.-]"
        )));
    }
    Ok(())
}

impl FromStr for WorkerId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        WorkerId::new(s)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkerId({:?})", &*self.0)
    }
}

/// A 32-byte blake3 hash naming one block's content chain.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

/// Feeds a hasher one word folded from the four: the bytes are a blake3 output, so a word of
/// them spreads keys as well as all 32 do, and a keyed hasher (std's, the `lru` crate's) takes a
/// quarter of the rounds. The index and the default policy's shadows hash a key dozens of times
/// per access, where this was a fifth of the policy's time (`cargo bench --bench policy`). Keys
/// built from other bytes (tests, `From<[u8; 32]>`) still spread: every word counts.
impl std::hash::Hash for BlockHash {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let w = |i: usize| {
            u64::from_le_bytes(self.0[i * 8..i * 8 + 8].try_into().expect("8 of 32 bytes"))
        };
        state.write_u64(w(0) ^ w(1).rotate_left(16) ^ w(2).rotate_left(32) ^ w(3).rotate_left(48));
    }
}

/// Domain separation for [`BlockHash::chain`], so chain hashes never collide with other blake3
/// uses of the same bytes.
const CHAIN_DOMAIN: &[u8] = b"tierkv.block-chain.v1";

impl BlockHash {
    /// The block hash of an inference engine's own key (LMCache's key string, vLLM's offload
    /// key): blake3 in key-derivation mode (context `"tierkv engine key v1"`) over the length
    /// of `context` (a little-endian `u64`), `context` (which engine, and what its keys are
    /// relative to: a model's identity), then `key`. Keys of two contexts never name the same
    /// block, and the length prefix keeps `(ab, c)` apart from `(a, bc)`.
    pub fn of_engine_key(context: &[u8], key: &[u8]) -> BlockHash {
        let mut h = blake3::Hasher::new_derive_key("tierkv engine key v1");
        h.update(&(context.len() as u64).to_le_bytes());
        h.update(context);
        h.update(key);
        BlockHash(*h.finalize().as_bytes())
    }

    /// The hash of one block of a prefix chain: blake3 over a domain tag, the parent block's
    /// hash (32 zero bytes for the first block), the number of tokens, and the token ids as
    /// little-endian `u32`. Equal prefixes give equal hashes; a block's hash depends on every
    /// token before it. docs/format.md gives the exact bytes.
    pub fn chain(parent: Option<&BlockHash>, tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(CHAIN_DOMAIN);
        h.update(parent.map_or(&[0u8; 32], |p| &p.0));
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockHash(*h.finalize().as_bytes())
    }

    /// The hashes of every *full* block of `tokens`, `block_tokens` tokens each, chained from
    /// the first. A trailing partial block gets no hash (engines do not cache it).
    ///
    /// # Panics
    /// If `block_tokens` is 0.
    pub fn chain_all(tokens: &[u32], block_tokens: usize) -> Vec<BlockHash> {
        BlockHash::chain_all_from(None, tokens, block_tokens)
    }

    /// As [`BlockHash::chain_all`], for tokens that continue a chain: the first block's parent
    /// is `parent` (the last block of the prefix before `tokens`), so
    /// `chain_all_from(Some(&h[k - 1]), &tokens[k * n..], n)` is `h[k..]` of
    /// `h = chain_all(tokens, n)`.
    ///
    /// # Panics
    /// If `block_tokens` is 0.
    pub fn chain_all_from(
        parent: Option<&BlockHash>,
        tokens: &[u32],
        block_tokens: usize,
    ) -> Vec<BlockHash> {
        assert!(block_tokens > 0, "block_tokens must be positive");
        let mut out = Vec::with_capacity(tokens.len() / block_tokens);
        let mut parent: Option<BlockHash> = parent.copied();
        for block in tokens.chunks_exact(block_tokens) {
            let h = BlockHash::chain(parent.as_ref(), block);
            out.push(h);
            parent = Some(h);
        }
        out
    }

    /// Lower-case hex, 64 characters (the block's file name).
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 15) as usize] as char);
        }
        s
    }

    /// Writes the 64 hex characters into `out`.
    pub(crate) fn write_hex(&self, out: &mut [u8; 64]) {
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = HEX[(b >> 4) as usize];
            out[2 * i + 1] = HEX[(b & 15) as usize];
        }
    }

    /// Parses 64 lower-case hex characters (the only spelling the store writes).
    pub fn from_hex(s: &str) -> Result<BlockHash> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(Error::invalid_key(format!(
                "block hash must be 64 hex characters, got {}",
                b.len()
            )));
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]);
            let lo = hex_val(pair[1]);
            match (hi, lo) {
                (Some(hi), Some(lo)) => out[i] = (hi << 4) | lo,
                _ => {
                    return Err(Error::invalid_key(format!(
                        "block hash {s:?} is not lower-case hex"
                    )));
                }
            }
        }
        Ok(BlockHash(out))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", self.to_hex())
    }
}

impl From<[u8; 32]> for BlockHash {
    fn from(b: [u8; 32]) -> Self {
        BlockHash(b)
    }
}

/// The key of one stored block: which worker, and which block chain.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct BlockKey {
    /// The worker (rank) that owns the block.
    pub worker: WorkerId,
    /// The block's chain hash.
    pub hash: BlockHash,
}

impl BlockKey {
    /// A key from its parts.
    pub fn new(worker: WorkerId, hash: BlockHash) -> Self {
        BlockKey { worker, hash }
    }
}

impl fmt::Display for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.worker, self.hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The hash a map sees moves with every byte of the key, not only the first word's
    /// (keys built from counters vary in their last bytes).
    #[test]
    fn a_key_hashes_every_byte() {
        use std::hash::BuildHasher;
        let s =
            std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        let base = BlockHash([7; 32]);
        for i in 0..32 {
            let mut other = base;
            other.0[i] ^= 1;
            assert_ne!(s.hash_one(base), s.hash_one(other), "byte {i}");
        }
    }

    /// Known answers from another implementation (Python's `blake3` package, its
    /// `derive_key_context`, and `json.dumps(sort_keys=True, separators=(",", ":"))`).
    #[test]
    fn engine_keys_and_worker_descriptions_have_known_answers() {
        let key: Vec<u8> = (0..36).collect();
        assert_eq!(
            BlockHash::of_engine_key(b"vllm.tier", &key).to_string(),
            "f5d41f586dd49661937122d38a2298459ec4803b8b2a1eef9f785c4134e308f6"
        );
        // Keys written in another order: the same canonical text, the same id.
        let d: serde_json::Value = serde_json::from_str(
            r#"{"tp": [0, 1], "nested": {"b": 2, "a": "x"}, "model": "org/tiny", "dtype": "float16"}"#,
        )
        .unwrap();
        let w = WorkerId::from_description("vllm.tiny", &d).unwrap();
        assert_eq!(w.as_str(), "vllm.tiny.e7aa3121b3550f97");
    }

    #[test]
    fn engine_keys_and_worker_ids_keep_their_inputs_apart() {
        assert_ne!(
            BlockHash::of_engine_key(b"ab", b"c"),
            BlockHash::of_engine_key(b"a", b"bc")
        );
        assert_ne!(
            BlockHash::of_engine_key(b"lmcache", b"k"),
            BlockHash::of_engine_key(b"vllm", b"k")
        );
        let d = |v: serde_json::Value| WorkerId::from_description("p", &v).unwrap();
        let base = d(serde_json::json!({"a": 1, "b": [1, 2]}));
        assert_ne!(base, d(serde_json::json!({"a": 1, "b": [2, 1]})));
        assert_ne!(base, d(serde_json::json!({"a": "1", "b": [1, 2]})));
        assert_ne!(base, d(serde_json::json!({"a": 1, "b": [1, 2], "c": null})));
        // A long readable part is cut, never the digest: the id stays valid.
        let long = WorkerId::from_description(&"m".repeat(80), &serde_json::json!({})).unwrap();
        assert_eq!(long.as_str().len(), 47 + 17);
        assert!(WorkerId::from_description("bad/prefix", &serde_json::json!({})).is_err());
    }

    #[test]
    fn worker_ids() {
        for ok in ["0", "rank-3", "tp_0.pp_1", "A", &"x".repeat(64)] {
            WorkerId::new(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            "a b",
            "é",
            "a\0",
            &"x".repeat(65),
        ] {
            let e = WorkerId::new(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidKey { .. }), "{bad:?}: {e}");
        }
    }

    #[test]
    fn how_keys_print_and_parse() {
        let w: WorkerId = "rank0".parse().unwrap();
        assert_eq!(w, WorkerId::new("rank0").unwrap());
        assert!("a/b".parse::<WorkerId>().is_err());
        assert_eq!(w.to_string(), "rank0");
        assert_eq!(format!("{w:?}"), "WorkerId(\"rank0\")");
        let h = BlockHash::from([0xab; 32]);
        assert_eq!(h.0, [0xab; 32]);
        assert_eq!(h.to_string(), "ab".repeat(32));
        assert_eq!(format!("{h:?}"), format!("BlockHash({})", "ab".repeat(32)));
        let k = BlockKey::new(w.clone(), h);
        assert_eq!((k.worker.clone(), k.hash), (w, h));
        assert_eq!(k.to_string(), format!("rank0/{}", "ab".repeat(32)));
    }

    #[test]
    fn equal_prefixes_equal_keys() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 9999;
        let ha = BlockHash::chain_all(&a, 16);
        let hb = BlockHash::chain_all(&b, 16);
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(ha[3], hb[3], "a change propagates down the chain");
        // A partial trailing block has no hash.
        assert_eq!(BlockHash::chain_all(&a[..47], 16).len(), 2);
        // The chain is the documented composition.
        assert_eq!(ha[1], BlockHash::chain(Some(&ha[0]), &a[16..32]));
        // A continuation from a parent is the rest of the chain.
        assert_eq!(
            BlockHash::chain_all_from(Some(&ha[1]), &a[32..], 16),
            ha[2..]
        );
        assert_eq!(BlockHash::chain_all_from(None, &a, 16), ha);
        assert_ne!(
            BlockHash::chain_all_from(Some(&ha[0]), &a[32..], 16),
            ha[2..],
            "the parent is hashed in"
        );
    }

    #[test]
    fn chain_hash_is_stable() {
        // Pinned so that a change of the documented byte layout cannot go unnoticed: stored
        // trees would stop hitting.
        let h = BlockHash::chain(None, &[1, 2, 3]);
        let mut manual = blake3::Hasher::new();
        manual.update(b"tierkv.block-chain.v1");
        manual.update(&[0u8; 32]);
        manual.update(&3u64.to_le_bytes());
        for t in [1u32, 2, 3] {
            manual.update(&t.to_le_bytes());
        }
        assert_eq!(h.0, *manual.finalize().as_bytes());
    }

    proptest! {
        #[test]
        fn hex_round_trip(bytes in any::<[u8; 32]>()) {
            let h = BlockHash(bytes);
            let s = h.to_hex();
            prop_assert_eq!(BlockHash::from_hex(&s).unwrap(), h);
            let mut buf = [0u8; 64];
            h.write_hex(&mut buf);
            prop_assert_eq!(std::str::from_utf8(&buf).unwrap(), s.as_str());
        }

        #[test]
        fn from_hex_never_panics(s in ".{0,80}") {
            let _ = BlockHash::from_hex(&s);
        }
    }
}
