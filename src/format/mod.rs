//! The on-disk format of one block file: a fixed little-endian header, zero padding, then the
//! payload at a 4 KiB-aligned offset (so the payload can be read with `O_DIRECT`).
//!
//! docs/format.md describes the same bytes for readers without this crate.

use crate::key::BlockHash;

/// The first eight bytes of every block file.
pub const MAGIC: [u8; 8] = *b"TKVBLOCK";
/// The tree's version: the name of its top directory (`v1`). The tree's layout (directories,
/// names, control files) has not changed since version 1.
pub const FORMAT_VERSION: u16 = 1;
/// The block file version writers write into the header: 2 adds the writer's boot id
/// ([`FLAG_WRITER_BOOT`]). Readers accept 1 and 2.
pub const BLOCK_VERSION: u16 = 2;
/// The oldest block file version readers accept.
pub const OLDEST_BLOCK_VERSION: u16 = 1;
/// Bytes of the header that carry fields (the rest of the first 4 KiB is zero).
pub const HEADER_LEN: usize = 128;
/// Where the payload starts: 4 KiB, the `O_DIRECT` alignment of every common device.
pub const PAYLOAD_OFFSET: u64 = 4096;
/// Flag bit 0: the header's checksum field is the blake3 of the payload (32 bytes): every
/// version 1 file, and version 2 files of writers that chose it.
pub const FLAG_PAYLOAD_BLAKE3: u32 = 1;
/// Flag bit 2 (version 2): the header's checksum field is the XXH3-128 of the payload (seed 0,
/// 16 bytes little-endian, then 16 zero bytes). What version 2 writers write: a torn payload
/// (zeros or stale pages) is caught as surely, at several times blake3's speed; the key is the
/// content address already, so the checksum needs no cryptographic strength.
pub const FLAG_PAYLOAD_XXH3: u32 = 4;
/// Flag bit 1 (version 2): bytes 96..112 hold the boot id of the machine that wrote the file
/// (`/proc/sys/kernel/random/boot_id`). A file written since the current boot cannot have
/// been torn by a machine crash (docs/format.md#which-crashes-need-the-checksum).
pub const FLAG_WRITER_BOOT: u32 = 2;
/// Flags a reader of this version understands (version 1 files know bit 0 alone). Exactly one
/// checksum bit (0 or 2) is set.
pub const KNOWN_FLAGS: u32 = FLAG_PAYLOAD_BLAKE3 | FLAG_WRITER_BOOT | FLAG_PAYLOAD_XXH3;
/// Payloads from this size up are hashed on several threads (blake3's `rayon` support): on
/// the 2-core VM of docs/benchmarks.md it was faster from 256 KiB up.
pub const PARALLEL_HASH_MIN: usize = 256 * 1024;

/// The checksum field of a payload as version 2 writers write it: its XXH3-128
/// ([`FLAG_PAYLOAD_XXH3`]).
pub fn payload_xxh3(payload: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&twox_hash::XxHash3_128::oneshot(payload).to_le_bytes());
    out
}

/// XXH3-128 of a payload held in several buffers, in their order: the same sum as
/// [`payload_xxh3`] of their concatenation.
pub fn parts_xxh3(parts: &[&[u8]]) -> [u8; 32] {
    if let [one] = parts {
        return payload_xxh3(one);
    }
    let mut h = twox_hash::XxHash3_128::new();
    for p in parts {
        h.write(p);
    }
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&h.finish_128().to_le_bytes());
    out
}

/// blake3 of a payload: on several threads for large payloads ([`PARALLEL_HASH_MIN`]).
pub fn payload_blake3(payload: &[u8]) -> [u8; 32] {
    if payload.len() >= PARALLEL_HASH_MIN {
        *blake3::Hasher::new()
            .update_rayon(payload)
            .finalize()
            .as_bytes()
    } else {
        *blake3::hash(payload).as_bytes()
    }
}

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
    /// The boot id of the machine that wrote the file ([`FLAG_WRITER_BOOT`]); `None` for a
    /// version 1 file, or a writer that could not read its boot id.
    pub writer_boot: Option<[u8; 16]>,
}

pub use crate::error::HeaderError;

/// Checks the first [`PAYLOAD_OFFSET`] bytes of a block file named `name` (fewer if the file
/// is shorter): a valid header naming that block, and zero padding. The error is why the file
/// is corrupt. The store's reads and `tierkv-stat` both judge files with it.
pub fn check_head(name: &BlockHash, head: &[u8]) -> Result<Header, crate::error::CorruptReason> {
    use crate::error::CorruptReason;
    let header = Header::decode(head)?;
    if head.len() < PAYLOAD_OFFSET as usize || head[HEADER_LEN..].iter().any(|&b| b != 0) {
        return Err(CorruptReason::Padding);
    }
    if &header.key != name {
        return Err(CorruptReason::OtherBlock(header.key.to_string()));
    }
    Ok(header)
}

/// Reads and checks the open block file `fd`, of `len` bytes by its `fstat`, named `name`:
/// its header ([`check_head`]), its length against the header's (so a header claiming 1 TiB
/// is corrupt, never an allocation), and with `verify` its payload against the header's
/// checksum, streamed in pieces of 1 MiB. `Ok(Err(reason))` is a corrupt file; `Err` is an
/// error reading it, never a judgement.
pub fn check_file(
    fd: std::os::fd::BorrowedFd<'_>,
    name: &BlockHash,
    len: u64,
    verify: bool,
) -> std::io::Result<Result<Header, crate::error::CorruptReason>> {
    use crate::error::CorruptReason;
    let read = |buf: &mut [u8], off: u64| {
        crate::sys::read_full(fd, off, &mut [std::io::IoSliceMut::new(buf)])
    };
    let mut head = vec![0u8; PAYLOAD_OFFSET as usize];
    let n = read(&mut head, 0)?;
    let header = match check_head(name, &head[..n]) {
        Ok(h) => h,
        Err(reason) => return Ok(Err(reason)),
    };
    let short = |file: u64| CorruptReason::Length {
        file,
        header: header.file_len(),
    };
    if len != header.file_len() {
        return Ok(Err(short(len)));
    }
    if verify {
        let mut hasher = header.hasher();
        let mut chunk = vec![0u8; 1 << 20];
        let mut off = PAYLOAD_OFFSET;
        while off < len {
            let want = ((len - off) as usize).min(chunk.len());
            let got = read(&mut chunk[..want], off)?;
            if got < want {
                return Ok(Err(short(off + got as u64)));
            }
            hasher.update(&chunk[..got]);
            off += got as u64;
        }
        if !hasher.matches(&header) {
            return Ok(Err(CorruptReason::Checksum));
        }
    }
    Ok(Ok(header))
}

impl Header {
    /// The header for `payload` stored under `key`, written on the machine booted as
    /// `writer_boot` (see `crate::ns::boot_id`).
    pub fn for_payload(key: BlockHash, payload: &[u8], writer_boot: Option<[u8; 16]>) -> Header {
        Header::for_parts(key, &[payload], writer_boot)
    }

    /// As [`Header::for_payload`], for a payload held in several buffers, in their order.
    pub fn for_parts(key: BlockHash, parts: &[&[u8]], writer_boot: Option<[u8; 16]>) -> Header {
        Header {
            flags: FLAG_PAYLOAD_XXH3 | writer_boot.map_or(0, |_| FLAG_WRITER_BOOT),
            payload_len: parts.iter().map(|p| p.len() as u64).sum(),
            checksum: parts_xxh3(parts),
            key,
            writer_boot,
        }
    }

    /// True when the file was written on this machine since its current boot (`boot`), so no
    /// machine crash can have torn it since.
    pub fn written_in_boot(&self, boot: Option<&[u8; 16]>) -> bool {
        matches!((self.writer_boot, boot), (Some(w), Some(b)) if &w == b)
    }

    /// The exact size of a file with this header.
    pub fn file_len(&self) -> u64 {
        PAYLOAD_OFFSET + self.payload_len
    }

    /// Encodes the header's [`HEADER_LEN`] bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&BLOCK_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..20].copy_from_slice(&(PAYLOAD_OFFSET as u32).to_le_bytes());
        // 20..24 reserved, zero.
        b[24..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b[32..64].copy_from_slice(&self.checksum);
        b[64..96].copy_from_slice(&self.key.0);
        if let Some(boot) = &self.writer_boot {
            b[96..112].copy_from_slice(boot);
        }
        // 112..120 reserved, zero.
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
        if !(OLDEST_BLOCK_VERSION..=BLOCK_VERSION).contains(&version) {
            return Err(HeaderError::Version(version));
        }
        if header_check(&b[..120]) != b[120..128] {
            return Err(HeaderError::HeaderCheck);
        }
        if u16::from_le_bytes([b[10], b[11]]) as usize != HEADER_LEN {
            return Err(HeaderError::Field("header_len"));
        }
        let flags = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        let known = if version == 1 {
            FLAG_PAYLOAD_BLAKE3
        } else {
            KNOWN_FLAGS
        };
        let sums = flags & (FLAG_PAYLOAD_BLAKE3 | FLAG_PAYLOAD_XXH3);
        if flags & !known != 0 || (sums != FLAG_PAYLOAD_BLAKE3 && sums != FLAG_PAYLOAD_XXH3) {
            return Err(HeaderError::Field("flags"));
        }
        if u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")) as u64 != PAYLOAD_OFFSET {
            return Err(HeaderError::Field("payload_offset"));
        }
        let has_boot = flags & FLAG_WRITER_BOOT != 0;
        if b[20..24] != [0; 4] || b[112..120] != [0; 8] || (!has_boot && b[96..112] != [0; 16]) {
            return Err(HeaderError::Field("reserved"));
        }
        if sums == FLAG_PAYLOAD_XXH3 && b[48..64] != [0; 16] {
            return Err(HeaderError::Field("checksum"));
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
            writer_boot: has_boot.then(|| b[96..112].try_into().expect("16 bytes")),
        })
    }

    /// As [`Header::verify`], for a payload held in several buffers, in their order.
    pub fn verify_parts(&self, parts: &[&[u8]]) -> bool {
        if let [one] = parts {
            return self.verify(one);
        }
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut h = self.hasher();
        for p in parts {
            h.update(p);
        }
        len == self.payload_len && h.matches(self)
    }

    /// True when `payload` matches the checksum.
    pub fn verify(&self, payload: &[u8]) -> bool {
        payload.len() as u64 == self.payload_len
            && if self.flags & FLAG_PAYLOAD_XXH3 != 0 {
                payload_xxh3(payload) == self.checksum
            } else {
                payload_blake3(payload) == self.checksum
            }
    }

    /// A hasher for this file's checksum, for payloads read in pieces
    /// ([`PayloadHasher::matches`] compares).
    pub fn hasher(&self) -> PayloadHasher {
        if self.flags & FLAG_PAYLOAD_XXH3 != 0 {
            PayloadHasher::Xxh3(Box::new(twox_hash::XxHash3_128::new()))
        } else {
            PayloadHasher::Blake3(Box::default())
        }
    }
}

/// The checksum of a payload fed in pieces, of the kind a header names ([`Header::hasher`]).
#[derive(Clone)]
pub enum PayloadHasher {
    /// blake3 ([`FLAG_PAYLOAD_BLAKE3`]).
    Blake3(Box<blake3::Hasher>),
    /// XXH3-128 ([`FLAG_PAYLOAD_XXH3`]).
    Xxh3(Box<twox_hash::XxHash3_128>),
}

impl PayloadHasher {
    /// Feeds the next bytes of the payload.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            PayloadHasher::Blake3(h) => {
                h.update(bytes);
            }
            PayloadHasher::Xxh3(h) => h.write(bytes),
        }
    }

    /// A hasher of the checksum that version 2 writers write (XXH3-128), for a payload hashed
    /// before its header is read ([`PayloadHasher::check`] compares).
    pub fn xxh3() -> PayloadHasher {
        PayloadHasher::Xxh3(Box::new(twox_hash::XxHash3_128::new()))
    }

    /// Whether the bytes fed match `header`'s checksum, when it is of this hasher's kind
    /// (`None`: the header's checksum is of the other kind, and these bytes cannot tell).
    pub fn check(&self, header: &Header) -> Option<bool> {
        let xxh3 = header.flags & FLAG_PAYLOAD_XXH3 != 0;
        (xxh3 == matches!(self, PayloadHasher::Xxh3(_))).then(|| self.matches(header))
    }

    /// True when the bytes fed match `header`'s checksum.
    pub fn matches(&self, header: &Header) -> bool {
        let mut sum = [0u8; 32];
        match self {
            PayloadHasher::Blake3(h) => sum = *h.finalize().as_bytes(),
            PayloadHasher::Xxh3(h) => sum[..16].copy_from_slice(&h.finish_128().to_le_bytes()),
        }
        sum == header.checksum
    }
}

/// A block file's payload hashed as the file is read from its start, piece by piece
/// ([`FileHasher::feed`]; the store hands it the pieces an engine reads): the bytes after the
/// header page go to an XXH3-128 hasher (version 2 files' checksum), and every byte is counted.
#[derive(Debug)]
pub struct FileHasher {
    hasher: PayloadHasher,
    fed: usize,
}

impl FileHasher {
    /// A hasher that has seen nothing.
    pub fn new() -> FileHasher {
        FileHasher {
            hasher: PayloadHasher::xxh3(),
            fed: 0,
        }
    }

    /// Whether the payload of a file read in `n` bytes from its start matches `header`'s
    /// checksum, when this hasher can tell: it was fed exactly those `n` bytes and the header's
    /// checksum is XXH3 (`None` otherwise: an engine that did not feed, a blake3 file).
    pub fn verdict(&self, header: &Header, n: usize) -> Option<bool> {
        if self.fed != n {
            return None;
        }
        self.hasher.check(header)
    }
}

impl Default for FileHasher {
    fn default() -> Self {
        FileHasher::new()
    }
}

impl FileHasher {
    /// The file's next bytes, in order from its first.
    pub fn feed(&mut self, bytes: &[u8]) {
        let skip = (PAYLOAD_OFFSET as usize)
            .saturating_sub(self.fed)
            .min(bytes.len());
        self.hasher.update(&bytes[skip..]);
        self.fed += bytes.len();
    }
}

impl std::fmt::Debug for PayloadHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PayloadHasher::Blake3(_) => "PayloadHasher::Blake3",
            PayloadHasher::Xxh3(_) => "PayloadHasher::Xxh3",
        })
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
        Header::for_payload(BlockHash([7; 32]), b"hello world", Some([9; 16]))
    }

    /// Fed a whole file in pieces of any size, the hasher matches the payload's checksum and
    /// only the payload's (the header page is skipped, wherever a piece boundary falls); it
    /// tells nothing for another byte count or a blake3 header.
    #[test]
    fn a_file_hasher_fed_in_pieces_checks_the_payload_only() {
        let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 249) as u8).collect();
        let h = Header::for_payload(BlockHash([3; 32]), &payload, None);
        let mut file = vec![0u8; PAYLOAD_OFFSET as usize];
        file[..HEADER_LEN].copy_from_slice(&h.encode());
        file.extend_from_slice(&payload);
        for piece in [1usize, 100, 4095, 4096, 4097, 6000, file.len()] {
            let fed = |bytes: &[u8]| {
                let mut f = FileHasher::default();
                for c in bytes.chunks(piece) {
                    f.feed(c);
                }
                f
            };
            assert_eq!(
                fed(&file).verdict(&h, file.len()),
                Some(true),
                "pieces of {piece}"
            );
            assert_eq!(
                fed(&file).verdict(&h, file.len() - 1),
                None,
                "pieces of {piece}"
            );
            let mut changed = file.clone();
            *changed.last_mut().unwrap() ^= 1;
            assert_eq!(
                fed(&changed).verdict(&h, file.len()),
                Some(false),
                "pieces of {piece}"
            );
            // A change inside the header page is not the payload's.
            let mut head = file.clone();
            head[PAYLOAD_OFFSET as usize - 1] ^= 1;
            assert_eq!(
                fed(&head).verdict(&h, file.len()),
                Some(true),
                "pieces of {piece}"
            );
            let mut b3 = h;
            b3.flags &= !FLAG_PAYLOAD_XXH3;
            b3.flags |= FLAG_PAYLOAD_BLAKE3;
            assert_eq!(
                fed(&file).verdict(&b3, file.len()),
                None,
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn round_trip_and_fixed_bytes() {
        let h = sample();
        let b = h.encode();
        assert_eq!(&b[..8], b"TKVBLOCK");
        assert_eq!(b[8..10], [2, 0]);
        assert_eq!(b[12..16], 6u32.to_le_bytes());
        assert_eq!(
            b[32..48],
            twox_hash::XxHash3_128::oneshot(b"hello world").to_le_bytes()
        );
        assert_eq!(b[48..64], [0; 16]);
        assert_eq!(b[16..20], 4096u32.to_le_bytes());
        assert_eq!(b[96..112], [9; 16]);
        assert_eq!(b[112..120], [0; 8]);
        assert_eq!(b[24..32], 11u64.to_le_bytes());
        assert_eq!(Header::decode(&b).unwrap(), h);
        assert!(h.verify(b"hello world"));
        assert!(!h.verify(b"hello worle"));
        assert!(!h.verify(b"hello"));
        assert_eq!(h.file_len(), 4096 + 11);
        assert!(h.written_in_boot(Some(&[9; 16])));
        assert!(!h.written_in_boot(Some(&[8; 16])));
        assert!(!h.written_in_boot(None));
        // A writer without a boot id writes the checksum bit alone and zeros.
        let anon = Header::for_payload(BlockHash([7; 32]), b"x", None);
        let b = anon.encode();
        assert_eq!(b[12..16], 4u32.to_le_bytes());
        assert_eq!(b[96..120], [0; 24]);
        assert_eq!(Header::decode(&b).unwrap(), anon);
        assert!(!anon.written_in_boot(Some(&[0; 16])));
    }

    #[test]
    fn large_payloads_hash_on_threads_to_the_same_blake3() {
        let big: Vec<u8> = (0..PARALLEL_HASH_MIN * 3 + 17).map(|i| i as u8).collect();
        assert_eq!(payload_blake3(&big), *blake3::hash(&big).as_bytes());
        // A blake3 file (version 1, or 2 with bit 0) verifies with blake3.
        let mut h = Header::for_payload(BlockHash([1; 32]), &big, None);
        h.flags = FLAG_PAYLOAD_BLAKE3;
        h.checksum = *blake3::hash(&big).as_bytes();
        assert!(h.verify(&big));
        let mut bad = big.clone();
        bad[PARALLEL_HASH_MIN * 2 + 5] ^= 1;
        assert!(!h.verify(&bad));
    }

    #[test]
    fn both_checksums_verify_whole_and_streamed() {
        let data: Vec<u8> = (0..300_001u32).map(|i| (i * 7) as u8).collect();
        let x = Header::for_payload(BlockHash([1; 32]), &data, None);
        let mut b = x;
        b.flags = FLAG_PAYLOAD_BLAKE3;
        b.checksum = *blake3::hash(&data).as_bytes();
        let mut torn = data.clone();
        torn[8192..12288].fill(0);
        for h in [x, b] {
            assert!(h.verify(&data));
            assert!(!h.verify(&torn));
            assert!(!h.verify(&data[..data.len() - 1]));
            for (bytes, good) in [(&data, true), (&torn, false)] {
                let mut s = h.hasher();
                for piece in bytes.chunks(65_536) {
                    s.update(piece);
                }
                assert_eq!(s.matches(&h), good, "{:?}", h.hasher());
            }
        }
    }

    #[test]
    fn rejects_each_field() {
        let good = sample().encode();
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Header::decode(&b), Err(HeaderError::BadMagic));
        let mut b = good;
        b[8] = 3;
        assert_eq!(Header::decode(&b), Err(HeaderError::Version(3)));
        let mut b = good;
        b[24] ^= 1; // payload_len changed without the check value
        assert_eq!(Header::decode(&b), Err(HeaderError::HeaderCheck));
        assert_eq!(
            Header::decode(&good[..100]),
            Err(HeaderError::Truncated(100))
        );
    }

    /// Header fields as raw values, any of them possibly wrong.
    #[derive(Debug, Clone)]
    struct RawHeader {
        version: u16,
        header_len: u16,
        flags: u32,
        payload_offset: u32,
        reserved_a: [u8; 4],
        payload_len: u64,
        checksum: [u8; 32],
        key: [u8; 32],
        /// Bytes 96..112: the writer's boot id in version 2 with flag bit 1, else reserved.
        boot: [u8; 16],
        reserved_b: [u8; 8],
        /// Store a wrong header check (the first byte flipped).
        bad_check: bool,
    }

    impl RawHeader {
        /// The 128 bytes, with a valid magic and (unless `bad_check`) a valid header check,
        /// laid out as docs/format.md gives them.
        fn bytes(&self) -> [u8; HEADER_LEN] {
            let mut b = [0u8; HEADER_LEN];
            b[0..8].copy_from_slice(b"TKVBLOCK");
            b[8..10].copy_from_slice(&self.version.to_le_bytes());
            b[10..12].copy_from_slice(&self.header_len.to_le_bytes());
            b[12..16].copy_from_slice(&self.flags.to_le_bytes());
            b[16..20].copy_from_slice(&self.payload_offset.to_le_bytes());
            b[20..24].copy_from_slice(&self.reserved_a);
            b[24..32].copy_from_slice(&self.payload_len.to_le_bytes());
            b[32..64].copy_from_slice(&self.checksum);
            b[64..96].copy_from_slice(&self.key);
            b[96..112].copy_from_slice(&self.boot);
            b[112..120].copy_from_slice(&self.reserved_b);
            let check = *blake3::hash(&b[..120]).as_bytes();
            b[120..128].copy_from_slice(&check[..8]);
            if self.bad_check {
                b[120] ^= 1;
            }
            b
        }

        /// What decode must say, in the order docs/format.md gives: version, header check,
        /// then each field.
        fn expected(&self) -> Result<Header, HeaderError> {
            if self.version != 1 && self.version != 2 {
                return Err(HeaderError::Version(self.version));
            }
            if self.bad_check {
                return Err(HeaderError::HeaderCheck);
            }
            if self.header_len != 128 {
                return Err(HeaderError::Field("header_len"));
            }
            // Version 1 knows flag bit 0 alone (always set); version 2 bits 1 and 2 too, with
            // exactly one checksum bit (0: blake3, 2: XXH3-128).
            let flags_ok =
                self.flags == 1 || (self.version == 2 && [3, 4, 6].contains(&self.flags));
            if !flags_ok {
                return Err(HeaderError::Field("flags"));
            }
            let has_boot = self.flags & 2 != 0;
            if self.payload_offset != 4096 {
                return Err(HeaderError::Field("payload_offset"));
            }
            if self.reserved_a != [0; 4]
                || self.reserved_b != [0; 8]
                || (!has_boot && self.boot != [0; 16])
            {
                return Err(HeaderError::Field("reserved"));
            }
            if self.flags & 4 != 0 && self.checksum[16..] != [0; 16] {
                return Err(HeaderError::Field("checksum"));
            }
            if self.payload_len > u64::MAX - 4096 {
                return Err(HeaderError::Field("payload_len"));
            }
            Ok(Header {
                flags: self.flags,
                payload_len: self.payload_len,
                checksum: self.checksum,
                key: BlockHash(self.key),
                writer_boot: has_boot.then_some(self.boot),
            })
        }
    }

    /// Mostly the valid value, sometimes a near miss, sometimes anything.
    fn field<T: Arbitrary + Copy + std::fmt::Debug + 'static>(
        valid: T,
        near: Vec<T>,
    ) -> BoxedStrategy<T> {
        prop_oneof![
            6 => Just(valid),
            2 => proptest::sample::select(near),
            1 => any::<T>(),
        ]
        .boxed()
    }

    fn one_byte_set<const N: usize>() -> BoxedStrategy<[u8; N]> {
        prop_oneof![
            6 => Just([0u8; N]),
            2 => (0..N, 1u8..).prop_map(|(i, v)| {
                let mut a = [0u8; N];
                a[i] = v;
                a
            }),
            1 => any::<[u8; N]>(),
        ]
        .boxed()
    }

    fn raw_header() -> impl Strategy<Value = RawHeader> {
        (
            field(2u16, vec![0, 1, 3, 256, 258, u16::MAX]),
            field(128u16, vec![0, 64, 127, 129, 256, 128 + 256]),
            field(
                6u32,
                vec![0, 1, 2, 3, 4, 5, 7, 1 << 31, 6 | 1 << 31, u32::MAX],
            ),
            field(4096u32, vec![0, 128, 4095, 4097, 8192, 4096 + (1 << 24)]),
            one_byte_set::<4>(),
            field(
                100u64,
                vec![0, 1 << 40, u64::MAX - 4096, u64::MAX - 4095, u64::MAX],
            ),
            prop_oneof![
                3 => any::<[u8; 16]>().prop_map(|a| {
                    let mut c = [0u8; 32];
                    c[..16].copy_from_slice(&a);
                    c
                }),
                1 => any::<[u8; 32]>(),
            ],
            any::<[u8; 32]>(),
            prop_oneof![Just([0u8; 16]), any::<[u8; 16]>()],
            one_byte_set::<8>(),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|t| RawHeader {
                version: t.0,
                header_len: t.1,
                flags: t.2,
                payload_offset: t.3,
                reserved_a: t.4,
                payload_len: t.5,
                checksum: t.6,
                key: t.7,
                boot: t.8,
                reserved_b: t.9,
                bad_check: t.10,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Structured fuzzing: a valid magic and header check around random fields; decode
        /// gives exactly the error the document's order of checks gives.
        #[test]
        fn decode_gives_the_exact_error_for_each_field(h in raw_header()) {
            let b = h.bytes();
            prop_assert_eq!(Header::decode(&b), h.expected());
            // The same with trailing bytes (a read of the first 4 KiB).
            let mut long = b.to_vec();
            long.resize(4096, 0);
            prop_assert_eq!(Header::decode(&long), h.expected());
            // And what decodes encodes back to the same bytes (a version 1 header encodes as
            // the version 2 header with the same fields, which decodes to the same header).
            if let Ok(d) = Header::decode(&b) {
                if h.version == BLOCK_VERSION {
                    prop_assert_eq!(d.encode(), b);
                } else {
                    prop_assert_eq!(Header::decode(&d.encode()), Ok(d));
                }
            }
        }

        #[test]
        fn decode_truncated_is_truncated(h in raw_header(), cut in 0usize..HEADER_LEN) {
            prop_assert_eq!(Header::decode(&h.bytes()[..cut]), Err(HeaderError::Truncated(cut)));
        }

        #[test]
        fn decode_bad_magic(h in raw_header(), i in 0usize..8, x in 1u8..) {
            let mut b = h.bytes();
            b[i] ^= x;
            prop_assert_eq!(Header::decode(&b), Err(HeaderError::BadMagic));
        }

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
