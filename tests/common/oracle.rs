//! An independent reader of a tierkv tree, written from docs/format.md alone: it does not use
//! `tierkv::format`, `tierkv::layout` or `tierkv::key` (only the blake3 crate, and xxhash-rust
//! for XXH3-128, another implementation than the library's twox-hash), so a change of
//! the store's writer *and* its reader (fields swapped in both, a wrong shard width in both)
//! still fails the tests that inspect trees with it.
//!
//! It checks every byte of every block file (magic, each header field, the header check, the
//! padding, the payload checksum, the file length, the name) and that the block sits in the
//! shard directory its name and `LAYOUT` give, and it reports every name it does not
//! understand instead of skipping it.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The magic of a block file (docs/format.md, "The block file").
const MAGIC: &[u8; 8] = b"TKVBLOCK";
/// The header's fields end at 128; the payload starts at 4096.
const HEADER_END: usize = 128;
const PAYLOAD_AT: usize = 4096;
/// Control files of a worker directory.
const CONTROLS: [&str; 6] = ["LAYOUT", ".lock", "STATS.json", "USAGE", "FLOCK", "EVENTS"];

/// What a tree holds, name by name, as the document classifies it.
#[derive(Debug, Default)]
pub struct Tree {
    /// Valid block files in their own shard directory.
    pub blocks: Vec<PathBuf>,
    /// Files named and placed like a block whose bytes break the format, with the reason.
    pub bad_blocks: Vec<(PathBuf, String)>,
    /// Files named like a block but not in the directory the layout puts that block in.
    pub misplaced: Vec<PathBuf>,
    /// Temp files of puts and of control files (including the legacy names).
    pub temps: Vec<PathBuf>,
    /// Control files present (`LAYOUT`, `.lock`, `STATS.json`).
    pub controls: Vec<PathBuf>,
    /// Names the document calls foreign (other names, other file types, symlinks), with what
    /// they are.
    pub foreign: Vec<(PathBuf, String)>,
    /// Trouble that is not one file: a worker without a readable `LAYOUT`, an unreadable
    /// directory.
    pub problems: Vec<String>,
}

impl Tree {
    fn merge(&mut self, o: Tree) {
        self.blocks.extend(o.blocks);
        self.bad_blocks.extend(o.bad_blocks);
        self.misplaced.extend(o.misplaced);
        self.temps.extend(o.temps);
        self.controls.extend(o.controls);
        self.foreign.extend(o.foreign);
        self.problems.extend(o.problems);
    }

    /// Panics, listing them, unless the tree has nothing but valid blocks, temp files and
    /// control files.
    pub fn assert_clean(&self, what: &Path) {
        let bad = !self.bad_blocks.is_empty()
            || !self.misplaced.is_empty()
            || !self.foreign.is_empty()
            || !self.problems.is_empty();
        fn few<T: std::fmt::Debug>(v: &[T]) -> String {
            let shown: Vec<_> = v.iter().take(3).collect();
            format!(
                "{} {shown:?}{}",
                v.len(),
                if v.len() > 3 { " ..." } else { "" }
            )
        }
        assert!(
            !bad,
            "{}: bad blocks {}; misplaced {}; names not understood {}; problems {}",
            what.display(),
            few(&self.bad_blocks),
            few(&self.misplaced),
            few(&self.foreign),
            few(&self.problems)
        );
    }
}

/// A worker's layout, from its `LAYOUT` text: `key=value` lines, `depth` 0 to 4, `fanout` 16,
/// 256 or 4096; other lines ignored.
pub fn parse_layout(text: &str) -> Option<(usize, usize)> {
    let (mut depth, mut fanout) = (None, None);
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            match k {
                "depth" => depth = v.trim().parse::<usize>().ok(),
                "fanout" => fanout = v.trim().parse::<usize>().ok(),
                _ => {}
            }
        }
    }
    let depth = depth.filter(|d| *d <= 4)?;
    let width = match fanout? {
        16 => 1,
        256 => 2,
        4096 => 3,
        _ => return None,
    };
    Some((depth, width))
}

/// Reads `dir`: a cache root (it has `v1/`), or one worker directory (it has `LAYOUT`).
pub fn read_tree(dir: &Path) -> Tree {
    let v1 = dir.join("v1");
    if fs::symlink_metadata(&v1).is_ok_and(|m| m.is_dir()) {
        let mut t = Tree::default();
        for e in fs::read_dir(&v1).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let ft = e.file_type().unwrap();
            if ft.is_dir() && valid_worker_id(&name) {
                t.merge(read_worker(&e.path()));
            } else {
                t.foreign.push((e.path(), kind_of(&ft).into()));
            }
        }
        return t;
    }
    read_worker(dir)
}

/// Reads one worker directory: its layout from `LAYOUT`, then every entry.
pub fn read_worker(wdir: &Path) -> Tree {
    let layout = fs::read_to_string(wdir.join("LAYOUT")).ok();
    match layout.as_deref().map(parse_layout) {
        Some(Some((depth, width))) => read_with_layout(wdir, depth, width),
        Some(None) => Tree {
            problems: vec![format!("{}: LAYOUT is not a layout file", wdir.display())],
            ..Tree::default()
        },
        None => {
            // No layout: a new worker holds nothing but control files and their temps.
            let mut t = Tree::default();
            for e in fs::read_dir(wdir).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                let regular = e.file_type().unwrap().is_file();
                if regular && is_control(&name) {
                    t.controls.push(e.path());
                } else if regular && is_control_temp(&name) {
                    t.temps.push(e.path());
                } else {
                    t.problems.push(format!(
                        "{}: no LAYOUT, yet it holds {name:?}",
                        wdir.display()
                    ));
                }
            }
            t
        }
    }
}

/// Reads a directory laid out with `depth` levels of `width` hex characters (a worker
/// directory without its control files: the tests' moved shard directories).
pub fn read_with_layout(wdir: &Path, depth: usize, width: usize) -> Tree {
    let mut t = Tree::default();
    walk(wdir, "", 0, depth, width, &mut t);
    t
}

/// `rel`: the shard path so far, without slashes ("" at the worker directory), e.g. "ab12".
fn walk(dir: &Path, rel: &str, level: usize, depth: usize, width: usize, t: &mut Tree) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            t.problems.push(format!("{}: {e}", dir.display()));
            return;
        }
    };
    for e in entries {
        let Ok(e) = e else { continue };
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        // A file may vanish between the listing and the look (a live tree).
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            if level < depth && name.len() == width && is_lower_hex(&name) {
                walk(&path, &format!("{rel}{name}"), level + 1, depth, width, t);
            } else {
                t.foreign.push((path, "directory".into()));
            }
            continue;
        }
        if !ft.is_file() {
            t.foreign.push((path, kind_of(&ft).into()));
            continue;
        }
        let leaf = level == depth;
        if name.len() == 64 && is_lower_hex(&name) {
            // Where the document puts it: level i is hex[i*w..(i+1)*w].
            if leaf && name[..depth * width] == *rel {
                match check_block_file(&path, &name) {
                    Ok(()) => t.blocks.push(path),
                    Err(why) if why == VANISHED => {}
                    Err(why) => t.bad_blocks.push((path, why)),
                }
            } else {
                t.misplaced.push(path);
            }
        } else if level == 0 && is_control(&name) {
            t.controls.push(path);
        } else if (level == 0 && is_control_temp(&name)) || (leaf && is_block_temp(&name)) {
            t.temps.push(path);
        } else {
            t.foreign.push((path, "file".into()));
        }
    }
}

const VANISHED: &str = "vanished";

/// Checks every byte of a block file named `name` against docs/format.md.
pub fn check_block_file(path: &Path, name: &str) -> Result<(), String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(VANISHED.into()),
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    check_block_bytes(&bytes, name)
}

/// Checks the bytes of a block file named `name` (64 lower-case hex characters).
pub fn check_block_bytes(b: &[u8], name: &str) -> Result<(), String> {
    if b.len() < PAYLOAD_AT {
        return Err(format!(
            "{} bytes, shorter than header and padding",
            b.len()
        ));
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    if &b[0..8] != MAGIC {
        return Err(format!("magic {:02x?}", &b[0..8]));
    }
    // Version 1: flags 1 (blake3), bytes 96..120 zero. Version 2: one checksum bit (1 blake3,
    // 4 XXH3-128), bit 2 (value 2) with the writer's boot id in 96..112 (zero without it),
    // 112..120 zero.
    let version = u16_at(8);
    if version != 1 && version != 2 {
        return Err(format!("format version {version}"));
    }
    if blake3::hash(&b[0..120]).as_bytes()[0..8] != b[120..128] {
        return Err("header check mismatch".into());
    }
    if u16_at(10) != 128 {
        return Err(format!("header length {}", u16_at(10)));
    }
    let flags = u32_at(12);
    if !(flags == 1 || (version == 2 && [3, 4, 6].contains(&flags))) {
        return Err(format!("flags {flags:#x} in version {version}"));
    }
    if u32_at(16) != 4096 {
        return Err(format!("payload offset {}", u32_at(16)));
    }
    if b[20..24] != [0; 4] {
        return Err(format!("reserved bytes 20..24 {:02x?}", &b[20..24]));
    }
    if flags & 2 == 0 && b[96..112] != [0; 16] {
        return Err(format!("reserved bytes 96..112 {:02x?}", &b[96..112]));
    }
    if b[112..120] != [0; 8] {
        return Err(format!("reserved bytes 112..120 {:02x?}", &b[112..120]));
    }
    let xxh3 = flags & 4 != 0;
    if xxh3 && b[48..64] != [0; 16] {
        return Err(format!("XXH3 checksum tail 48..64 {:02x?}", &b[48..64]));
    }
    let len = u64_at(24);
    if b.len() as u64 != PAYLOAD_AT as u64 + len {
        return Err(format!(
            "file is {} bytes, the header says 4096 + {len}",
            b.len()
        ));
    }
    match decode_hex(name) {
        Some(h) if h == b[64..96] => {}
        _ => {
            return Err(format!(
                "block hash field {:02x?} is not the name",
                &b[64..96]
            ));
        }
    }
    if let Some(i) = b[HEADER_END..PAYLOAD_AT].iter().position(|&x| x != 0) {
        return Err(format!("padding byte {} is not zero", HEADER_END + i));
    }
    let sum_ok = if xxh3 {
        xxhash_rust::xxh3::xxh3_128(&b[PAYLOAD_AT..]).to_le_bytes()[..] == b[32..48]
    } else {
        blake3::hash(&b[PAYLOAD_AT..]).as_bytes()[..] == b[32..64]
    };
    if !sum_ok {
        return Err("payload checksum mismatch".into());
    }
    Ok(())
}

/// Reads the whole tree under `dir` (a root or a worker directory), panics on anything but
/// valid blocks, temp and control files, and returns the number of valid blocks.
pub fn check_tree(dir: &Path) -> usize {
    let t = read_tree(dir);
    t.assert_clean(dir);
    t.blocks.len()
}

fn is_lower_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

/// A node id in a temp or stats name: 16 lowercase hex characters.
fn is_node(s: &str) -> bool {
    s.len() == 16 && is_lower_hex(s)
}

/// `<pid>.<seq>` or `<node>.<pid>.<seq>` after a temp file's stem and a dot.
fn is_owner_suffix(rest: &str) -> bool {
    let parts: Vec<&str> = rest.split('.').collect();
    match parts.as_slice() {
        [pid, seq] => is_digits(pid) && is_digits(seq),
        [node, pid, seq] => is_node(node) && is_digits(pid) && is_digits(seq),
        _ => false,
    }
}

/// `.tmp.<64 hex>.<node>.<pid>.<seq>`, or of earlier versions `.tmp.<64 hex>.<pid>.<seq>`.
fn is_block_temp(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(".tmp.") else {
        return false;
    };
    rest.len() > 65
        && rest[..64]
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        && rest.as_bytes()[64] == b'.'
        && is_owner_suffix(&rest[65..])
}

/// A shared store's stats file: `STATS.<node>.<pid>.json`.
fn is_instance_stats(name: &str) -> bool {
    let Some(mid) = name
        .strip_prefix("STATS.")
        .and_then(|r| r.strip_suffix(".json"))
    else {
        return false;
    };
    mid.split_once('.')
        .is_some_and(|(node, pid)| is_node(node) && is_digits(pid))
}

/// A control file of a worker directory.
fn is_control(name: &str) -> bool {
    CONTROLS.contains(&name) || is_instance_stats(name)
}

/// `.tmp.<control>.<node>.<pid>.<seq>` (or without the node, of earlier versions), or a
/// legacy `.STATS.json.tmp` / `.tmp.layout.<pid>`.
fn is_control_temp(name: &str) -> bool {
    if name == ".STATS.json.tmp" {
        return true;
    }
    if let Some(pid) = name.strip_prefix(".tmp.layout.") {
        return is_digits(pid);
    }
    let Some(rest) = name.strip_prefix(".tmp.") else {
        return false;
    };
    // The control name is everything before the owner suffix; try each split point.
    rest.match_indices('.').any(|(i, _)| {
        let (stem, suffix) = (&rest[..i], &rest[i + 1..]);
        is_control(stem) && is_owner_suffix(suffix)
    })
}

fn valid_worker_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 || !is_lower_hex(s) {
        return None;
    }
    (0..32)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn kind_of(ft: &fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device"
    } else if ft.is_dir() {
        "directory"
    } else {
        "file"
    }
}

/// The path the document gives block `hex` in a worker directory laid out with `depth`
/// levels of `width` characters: `hex[0..w]/hex[w..2w]/.../hex`.
pub fn block_path(wdir: &Path, hex: &str, depth: usize, width: usize) -> PathBuf {
    let mut p = wdir.to_path_buf();
    for i in 0..depth {
        p.push(&hex[i * width..(i + 1) * width]);
    }
    p.push(hex);
    p
}

/// Where block `hex` lives in the worker directory `wdir` by the layout its `LAYOUT` records
/// (a new store chooses its depth from its size, docs/layout.md).
pub fn block_path_by_layout(wdir: &Path, hex: &str) -> PathBuf {
    let text = fs::read_to_string(wdir.join("LAYOUT")).expect("the worker's LAYOUT");
    let (depth, width) = parse_layout(&text).expect("a layout file");
    block_path(wdir, hex, depth, width)
}

/// The writer's boot id a version 2 file records (bytes 96..112), if it has one.
pub fn writer_boot(b: &[u8]) -> Option<[u8; 16]> {
    (b.len() >= 128 && u16::from_le_bytes([b[8], b[9]]) == 2 && b[12] & 2 != 0)
        .then(|| b[96..112].try_into().unwrap())
}

/// This machine's boot id as docs/format.md says to read it: the 32 hex digits of
/// `/proc/sys/kernel/random/boot_id` (dashes left out), as 16 bytes.
pub fn this_boot() -> [u8; 16] {
    let text = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    assert_eq!(hex.len(), 32, "boot id {text:?}");
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    id
}

/// A version 2 block file for `payload` under `hex` as tierkv writes it, on the machine
/// booted as `boot`: flags 6 (XXH3-128 in bytes 32..48, 48..64 zero; the boot id in 96..112).
pub fn encode_block_v2(hex: &str, payload: &[u8], boot: [u8; 16]) -> Vec<u8> {
    let mut b = encode_block(hex, payload);
    b[8..10].copy_from_slice(&2u16.to_le_bytes());
    b[12..16].copy_from_slice(&6u32.to_le_bytes());
    b[32..48].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(payload).to_le_bytes());
    b[48..64].fill(0);
    b[96..112].copy_from_slice(&boot);
    let check = *blake3::hash(&b[0..120]).as_bytes();
    b[120..128].copy_from_slice(&check[..8]);
    b
}

/// The bytes of a version 1 block file for `payload` under `hex`, built from the document
/// (for tests that plant files behind the store).
pub fn encode_block(hex: &str, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; PAYLOAD_AT + payload.len()];
    b[0..8].copy_from_slice(MAGIC);
    b[8..10].copy_from_slice(&1u16.to_le_bytes());
    b[10..12].copy_from_slice(&128u16.to_le_bytes());
    b[12..16].copy_from_slice(&1u32.to_le_bytes());
    b[16..20].copy_from_slice(&4096u32.to_le_bytes());
    b[24..32].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    b[32..64].copy_from_slice(blake3::hash(payload).as_bytes());
    b[64..96].copy_from_slice(&decode_hex(hex).expect("64 lower-case hex"));
    let check = *blake3::hash(&b[0..120]).as_bytes();
    b[120..128].copy_from_slice(&check[..8]);
    b[PAYLOAD_AT..].copy_from_slice(payload);
    b
}

/// One record of a worker's event journal, as docs/events.md describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRecord {
    pub seq: u64,
    /// 1 stored, 2 removed.
    pub kind: u8,
    /// 1 put, 2 evicted, 3 removed, 4 corrupt, 5 missing, 6 repair.
    pub cause: u8,
    pub pid: u32,
    pub node: u64,
    pub unix_ms: u64,
    /// The block's name (64 lowercase hex digits).
    pub hex: String,
}

/// Reads the event journal `path` as docs/events.md describes it ("The journal file"): the
/// header page (magic, version, record size, capacity, next seq, id, check), then the records
/// the ring still holds, oldest first, each checked (its seq, its check). Returns the next
/// seq, the id and the records; panics on anything the document does not allow.
pub fn read_journal(path: &Path) -> (u64, u64, Vec<JournalRecord>) {
    let b = fs::read(path).unwrap();
    let le = |at: usize, n: usize| -> u64 {
        b[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
    };
    assert!(
        b.len() >= 4096 && b.len() % 4096 == 0,
        "{}: {} bytes",
        path.display(),
        b.len()
    );
    assert_eq!(&b[0..8], b"TKVEVTS1", "magic");
    assert_eq!((le(8, 2), le(10, 2)), (1, 128), "version, record size");
    assert_eq!(b[12..16], [0; 4], "reserved");
    assert_eq!(
        &blake3::hash(&b[0..40]).as_bytes()[0..4],
        &b[40..44],
        "header check"
    );
    let (capacity, next, id) = (le(16, 8), le(24, 8), le(32, 8));
    assert!(capacity > 0 && capacity % 32 == 0, "capacity {capacity}");
    let mut out = Vec::new();
    for seq in next.saturating_sub(capacity)..next {
        let at = 4096 + (seq % capacity) as usize * 128;
        let r = b.get(at..at + 128).expect("a record inside the file");
        assert_eq!(
            &blake3::hash(&r[0..124]).as_bytes()[0..4],
            &r[124..128],
            "record {seq}'s check"
        );
        assert_eq!(le(at, 8), seq, "record at slot {}", seq % capacity);
        let (kind, cause) = (r[8], r[9]);
        assert!(
            matches!(kind, 1 | 2) && (1..=6).contains(&cause),
            "record {seq}: {kind} {cause}"
        );
        assert_eq!(r[10..12], [0; 2], "record {seq}: reserved");
        assert!(
            r[64..124].iter().all(|&x| x == 0),
            "record {seq}: reserved tail"
        );
        out.push(JournalRecord {
            seq,
            kind,
            cause,
            pid: le(at + 12, 4) as u32,
            node: le(at + 16, 8),
            unix_ms: le(at + 24, 8),
            hex: r[32..64].iter().fold(String::new(), |mut h, x| {
                use std::fmt::Write;
                let _ = write!(h, "{x:02x}");
                h
            }),
        });
    }
    (next, id, out)
}
