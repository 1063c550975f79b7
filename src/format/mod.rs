//! The on-disk format of one block file: a fixed little-endian header, zero padding, then the
//! payload at a 4 KiB-aligned offset (so the payload can be read with `O_DIRECT`).
//!
//! docs/format.md describes the same bytes for readers without this crate.

use crate::key::BlockHash;

/// The first eight bytes of every block file.
pub const MAGIC: [u8; 8] = *b"TKVBLOCK";
/// The format version written in the header and in the tree's top directory name (`v1`).
pub const FORMAT_VERSION: u16 = 1;
/// Bytes of the header that carry fields (the rest of the first 4 KiB is zero).
pub const HEADER_LEN: usize = 128;
/// Where the payload starts: 4 KiB, the `O_DIRECT` alignment of every common device.
pub const PAYLOAD_OFFSET: u64 = 4096;
/// Flag bit 0: the header carries the blake3 checksum of the payload (always set by writers).
pub const FLAG_PAYLOAD_BLAKE3: u32 = 1;
/// Flags a reader of this version understands.
pub const KNOWN_FLAGS: u32 = FLAG_PAYLOAD_BLAKE3;

/// The zero bytes between the header and the payload.
pub(crate) static PADDING: [u8; PAYLOAD_OFFSET as usize - HEADER_LEN] =
    [0; PAYLOAD_OFFSET as usize - HEADER_LEN];

/// A decoded block header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Flag bits (see [`FLAG_PAYLOAD_BLAKE3`]).
    pub flags: u32,
    /// Payload length in bytes. The file is exactly `PAYLOAD_OFFSET + payload_len` bytes.
    pub payload_len: u64,
    /// blake3 of the payload.
    pub checksum: [u8; 32],
    /// The block hash this file stores (it must match the file's name).
    pub key: BlockHash,
}

/// Why a header was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`] bytes.
    #[error("header truncated: {0} bytes")]
    Truncated(usize),
    /// Not a tierkv block file.
    #[error("bad magic")]
    BadMagic,
    /// Written by another format version.
    #[error("unsupported format version {0}")]
    Version(u16),
    /// A field holds a value this version never writes.
    #[error("bad header field: {0}")]
    Field(&'static str),
    /// The header's own check value does not match its fields.
    #[error("header check mismatch")]
    HeaderCheck,
}

impl Header {
    /// The header for `payload` stored under `key`.
    pub fn for_payload(key: BlockHash, payload: &[u8]) -> Header {
        Header {
            flags: FLAG_PAYLOAD_BLAKE3,
            payload_len: payload.len() as u64,
            checksum: *blake3::hash(payload).as_bytes(),
            key,
        }
    }

    /// The exact size of a file with this header.
    pub fn file_len(&self) -> u64 {
        PAYLOAD_OFFSET + self.payload_len
    }

    /// Encodes the header's [`HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..20].copy_from_slice(&(PAYLOAD_OFFSET as u32).to_le_bytes());
        // 20..24 reserved, zero.
        b[24..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b[32..64].copy_from_slice(&self.checksum);
        b[64..96].copy_from_slice(&self.key.0);
        // 96..120 reserved, zero.
        let check = header_check(&b[..120]);
        b[120..128].copy_from_slice(&check);
        b
    }

    /// Decodes a header from the first bytes of a file. Takes arbitrary bytes and never
    /// panics; anything this version did not write is an error.
    pub fn decode(bytes: &[u8]) -> Result<Header, HeaderError> {
        if bytes.len() < HEADER_LEN {
            return Err(HeaderError::Truncated(bytes.len()));
        }
        let b = &bytes[..HEADER_LEN];
        if b[0..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != FORMAT_VERSION {
            return Err(HeaderError::Version(version));
        }
        if header_check(&b[..120]) != b[120..128] {
            return Err(HeaderError::HeaderCheck);
        }
        if u16::from_le_bytes([b[10], b[11]]) as usize != HEADER_LEN {
            return Err(HeaderError::Field("header_len"));
        }
        let flags = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        if flags & !KNOWN_FLAGS != 0 || flags & FLAG_PAYLOAD_BLAKE3 == 0 {
            return Err(HeaderError::Field("flags"));
        }
        if u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")) as u64 != PAYLOAD_OFFSET {
            return Err(HeaderError::Field("payload_offset"));
        }
        if b[20..24] != [0; 4] || b[96..120] != [0; 24] {
            return Err(HeaderError::Field("reserved"));
        }
        let payload_len = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
        if payload_len > u64::MAX - PAYLOAD_OFFSET {
            return Err(HeaderError::Field("payload_len"));
        }
        Ok(Header {
            flags,
            payload_len,
            checksum: b[32..64].try_into().expect("32 bytes"),
            key: BlockHash(b[64..96].try_into().expect("32 bytes")),
        })
    }

    /// True when `payload` matches the checksum.
    pub fn verify(&self, payload: &[u8]) -> bool {
        payload.len() as u64 == self.payload_len
            && blake3::hash(payload).as_bytes() == &self.checksum
    }
}

fn header_check(fields: &[u8]) -> [u8; 8] {
    let h = blake3::hash(fields);
    h.as_bytes()[..8].try_into().expect("8 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header::for_payload(BlockHash([7; 32]), b"hello world")
    }

    #[test]
    fn round_trip_and_fixed_bytes() {
        let h = sample();
        let b = h.encode();
        assert_eq!(&b[..8], b"TKVBLOCK");
        assert_eq!(b[8..10], [1, 0]);
        assert_eq!(b[16..20], 4096u32.to_le_bytes());
        assert_eq!(b[24..32], 11u64.to_le_bytes());
        assert_eq!(Header::decode(&b).unwrap(), h);
        assert!(h.verify(b"hello world"));
        assert!(!h.verify(b"hello worle"));
        assert!(!h.verify(b"hello"));
        assert_eq!(h.file_len(), 4096 + 11);
    }

    #[test]
    fn rejects_each_field() {
        let good = sample().encode();
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Header::decode(&b), Err(HeaderError::BadMagic));
        let mut b = good;
        b[8] = 2;
        assert_eq!(Header::decode(&b), Err(HeaderError::Version(2)));
        let mut b = good;
        b[24] ^= 1; // payload_len changed without the check value
        assert_eq!(Header::decode(&b), Err(HeaderError::HeaderCheck));
        assert_eq!(
            Header::decode(&good[..100]),
            Err(HeaderError::Truncated(100))
        );
    }

    proptest! {
        #[test]
        fn decode_random_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Header::decode(&bytes);
        }

        #[test]
        fn decode_mutated_headers(idx in 0usize..HEADER_LEN, bit in 0u8..8, len in 0u64..1<<40) {
            let mut h = sample();
            h.payload_len = len;
            let mut b = h.encode();
            prop_assert_eq!(Header::decode(&b).unwrap(), h);
            b[idx] ^= 1 << bit;
            // Any single bit flip in the header is detected.
            prop_assert!(Header::decode(&b).is_err());
        }
    }
}
