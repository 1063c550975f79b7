//! `cargo +nightly fuzz run header`: the block header parser on arbitrary bytes, with the
//! magic and header check made valid half the time so the fields behind them are reached.
//! Whatever decodes must encode back to the same 128 bytes; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierkv::format::{HEADER_LEN, Header};

fuzz_target!(|data: &[u8]| {
    let mut b = data.to_vec();
    if b.first().is_some_and(|x| x & 1 == 1) && b.len() >= HEADER_LEN {
        b[0..8].copy_from_slice(b"TKVBLOCK");
        let check = *blake3::hash(&b[..120]).as_bytes();
        b[120..128].copy_from_slice(&check[..8]);
    }
    if let Ok(h) = Header::decode(&b) {
        assert_eq!(h.encode()[..], b[..HEADER_LEN]);
    }
});
