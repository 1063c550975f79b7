//! Where bytes live: the directory tree of a store.
//!
//! `<root>/v<format version>/<worker id>/<shard dirs>/<64 hex chars of the block hash>`.
//! Shard directories take the leading hex characters of the hash: with `depth` levels and a
//! fan-out of 16, 256 or 4096 (1, 2 or 3 hex characters per level), block `ab12...` lives in
//! `ab/12/ab12...` at depth 2, fan-out 256. Depth 0 is one flat directory per worker.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::key::BlockHash;
#[cfg(test)]
use crate::key::WorkerId;

/// Name of the file in each worker directory that records its layout.
pub const LAYOUT_FILE: &str = "LAYOUT";
/// Name of the lock file in each worker directory (held with `flock` by the open store).
pub const LOCK_FILE: &str = ".lock";
/// Live counters of the open store (JSON, rewritten atomically; docs/stat.md).
pub const STATS_FILE: &str = "STATS.json";
/// Prefix of temporary files: `<prefix><64 hex>.<node>.<pid>.<seq>` for a block being put,
/// and `<prefix><control file>.<node>.<pid>.<seq>` for a control file being rewritten (`node`:
/// 16 hex characters, [`crate::ns::node_id`]; names without it are of earlier versions).
pub const TEMP_PREFIX: &str = ".tmp.";
/// The control files of a worker directory, which the store rewrites through temp names.
pub const CONTROL_FILES: [&str; 6] = [
    LAYOUT_FILE,
    LOCK_FILE,
    STATS_FILE,
    USAGE_FILE,
    FLOCK_FILE,
    EVENTS_FILE,
];
/// The empty file the worker lock is held on besides the worker directory (`flock`), for
/// filesystems whose directory locks do not reach other clients (docs/format.md).
pub const FLOCK_FILE: &str = "FLOCK";
/// Temp names of control files written by earlier versions (swept like any temp file).
const LEGACY_CONTROL_TEMPS: [&str; 2] = [".STATS.json.tmp", ".tmp.layout."];
/// The ledger of a shared worker's usage (bytes and files of its blocks), kept under a lock
/// by every store that shares the worker (docs/format.md).
pub const USAGE_FILE: &str = "USAGE";

/// The worker's event journal: every block stored and removed, in order (`ns::journal`,
/// docs/events.md). Made by a store configured with events; every store of the worker writes
/// to it from then on.
pub const EVENTS_FILE: &str = "EVENTS";
/// Prefix of a shared store's live counters: `STATS.<node>.<pid>.json`, one per store.
pub const INSTANCE_STATS_PREFIX: &str = "STATS.";

/// The process that wrote a temp file or an instance's stats file, as its name says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The node ([`crate::ns::node_id`]): 16 hex characters. `None` for names of earlier
    /// versions.
    pub node: Option<u64>,
    /// Its pid on that node.
    pub pid: u32,
}

fn digits(x: &str) -> bool {
    !x.is_empty() && x.len() <= 20 && x.bytes().all(|c| c.is_ascii_digit())
}

fn node_field(x: &str) -> Option<u64> {
    (x.len() == 16 && x.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| u64::from_str_radix(x, 16).ok())
        .flatten()
}

/// `<TEMP_PREFIX><stem>.<node>.<pid>.<seq>` or `<TEMP_PREFIX><stem>.<pid>.<seq>`: the stem
/// and the owner.
fn parse_temp(name: &str) -> Option<(&str, Owner)> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    let (rest, seq) = rest.rsplit_once('.')?;
    let (rest, pid) = rest.rsplit_once('.')?;
    if !digits(seq) || !digits(pid) {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    if let Some((stem, node)) = rest.rsplit_once('.') {
        if let Some(node) = node_field(node) {
            return (!stem.is_empty()).then_some((
                stem,
                Owner {
                    node: Some(node),
                    pid,
                },
            ));
        }
    }
    (!rest.is_empty()).then_some((rest, Owner { node: None, pid }))
}

/// The owner of a shared store's stats file `STATS.<node>.<pid>.json`, if `name` is one.
pub fn instance_stats_owner(name: &str) -> Option<Owner> {
    let rest = name
        .strip_prefix(INSTANCE_STATS_PREFIX)?
        .strip_suffix(".json")?;
    let (node, pid) = rest.split_once('.')?;
    let node = node_field(node)?;
    digits(pid).then_some(())?;
    Some(Owner {
        node: Some(node),
        pid: pid.parse().ok()?,
    })
}

/// The name of the stats file of the shared store `pid` on `node`.
pub fn instance_stats_name(node: u64, pid: u32) -> String {
    format!("{INSTANCE_STATS_PREFIX}{node:016x}.{pid}.json")
}

/// Deepest supported shard tree.
pub const MAX_DEPTH: u8 = 4;

/// The shape of a worker's shard tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Number of shard directory levels (0 = flat).
    pub depth: u8,
    /// Directories per level: 16, 256 or 4096.
    pub fanout: u32,
}

impl Default for Layout {
    /// Depth 2, fan-out 256 (65,536 leaf directories): chosen from the measurements in
    /// docs/layout.md, for a store whose size is unknown or above `SMALL_TREE_FILES`
    /// ([`Layout::for_files`]).
    fn default() -> Self {
        Layout {
            depth: 2,
            fanout: 256,
        }
    }
}

/// The files a leaf directory is sized for when a new worker's layout is chosen from the
/// store's size ([`Layout::for_files`]): a couple of thousand, where ext4 lookups, creates
/// and scans stay fast (docs/layout.md: depth 1 beats depth 2 on every measure at 100k files,
/// about 400 per leaf, and loses on creates and lookups at 1M, about 3,900 per leaf).
pub const LEAF_FILES: u64 = 2048;
/// The block size assumed when a store's size is known in bytes only (a byte capacity, or the
/// filesystem's free space): 256 KiB. Real KV blocks are 0.5-8 MiB per block of 16 tokens for
/// the models in docs/benchmarks.md; a store of smaller blocks fills its leaves with more
/// files (64 KiB blocks: 4x `LEAF_FILES`, about 8,000), which ext4 still handles well.
pub const TYPICAL_BLOCK_BYTES: u64 = 256 << 10;
/// The most files a new worker gets the small tree for: depth 1, fan-out 256, 256 leaves of
/// up to [`LEAF_FILES`] files each (524,288).
pub const SMALL_TREE_FILES: u64 = 256 * LEAF_FILES;
/// A tree of at most this many leaf directories has them all created when a store opens
/// (256 `mkdir`s take tens of milliseconds), so no put pays for a directory.
pub const EAGER_LEAVES_MAX: u64 = 4096;

/// What a directory entry of a worker tree is, judged by its name alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryName {
    /// A block file named by its hash.
    Block(BlockHash),
    /// A temporary file of an unfinished put.
    Temp,
    /// A temporary file of a control file being rewritten (in the worker directory).
    ControlTemp,
    /// The store's own bookkeeping (layout and lock files).
    Meta,
    /// Anything else: left alone and counted.
    Foreign,
}

impl Layout {
    /// Validates the layout.
    pub fn new(depth: u8, fanout: u32) -> Result<Layout> {
        let l = Layout { depth, fanout };
        l.validate()?;
        Ok(l)
    }

    /// Checks depth and fan-out.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.fanout, 16 | 256 | 4096) {
            return Err(Error::Config(format!(
                "layout fan-out must be 16, 256 or 4096, got {}",
                self.fanout
            )));
        }
        if self.depth > MAX_DEPTH {
            return Err(Error::Config(format!(
                "layout depth must be at most {MAX_DEPTH}, got {}",
                self.depth
            )));
        }
        Ok(())
    }

    /// Hex characters per directory level.
    pub fn chars_per_level(&self) -> usize {
        match self.fanout {
            16 => 1,
            256 => 2,
            _ => 3,
        }
    }

    /// The path of a block relative to its worker directory.
    pub fn rel_path(&self, hash: &BlockHash) -> RelPath {
        let mut hex = [0u8; 64];
        hash.write_hex(&mut hex);
        let mut p = RelPath {
            buf: [0; REL_PATH_MAX],
            len: 0,
            dir_len: 0,
        };
        let w = self.chars_per_level();
        for level in 0..self.depth as usize {
            p.push(&hex[level * w..(level + 1) * w]);
            p.push(b"/");
        }
        p.dir_len = p.len.saturating_sub(1);
        p.push(&hex);
        p
    }

    /// The shard directories of one level below `parent` (relative path, `""` for the worker
    /// directory). Used to create the tree eagerly and to scan it.
    pub fn level_names(&self) -> impl Iterator<Item = String> {
        let w = self.chars_per_level();
        (0..self.fanout).map(move |i| format!("{i:0w$x}"))
    }

    /// The layout of a new worker that will hold at most `files` block files (`None`:
    /// unknown): depth 1, fan-out 256 up to `SMALL_TREE_FILES` (256 leaves, created when the
    /// store opens), else [`Layout::default`] (depth 2, 65,536 leaves, created by the puts
    /// that need them). A worker's recorded `LAYOUT` always wins over this.
    pub fn for_files(files: Option<u64>) -> Layout {
        match files {
            Some(f) if f <= SMALL_TREE_FILES => Layout {
                depth: 1,
                fanout: 256,
            },
            _ => Layout::default(),
        }
    }

    /// The number of leaf directories (1 at depth 0: the worker directory).
    pub fn leaves(&self) -> u64 {
        u64::from(self.fanout).saturating_pow(u32::from(self.depth))
    }

    /// Every leaf directory's relative path (`ab` at depth 1, `ab/cd` at depth 2), in order;
    /// empty at depth 0. Only for trees of at most `EAGER_LEAVES_MAX` leaves.
    pub fn leaf_dirs(&self) -> Vec<String> {
        if self.depth == 0 || self.leaves() > EAGER_LEAVES_MAX {
            return Vec::new();
        }
        let mut dirs = vec![String::new()];
        for _ in 0..self.depth {
            dirs = dirs
                .iter()
                .flat_map(|d| {
                    self.level_names()
                        .map(move |n| if d.is_empty() { n } else { format!("{d}/{n}") })
                })
                .collect();
        }
        dirs
    }

    /// True if `name` is a valid shard directory name at any level.
    pub fn is_shard_dir(&self, name: &str) -> bool {
        name.len() == self.chars_per_level()
            && name.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// Classifies a file name found in the tree.
    pub fn classify(name: &str) -> EntryName {
        if CONTROL_FILES.contains(&name) || instance_stats_owner(name).is_some() {
            return EntryName::Meta;
        }
        if name == LEGACY_CONTROL_TEMPS[0]
            || name
                .strip_prefix(LEGACY_CONTROL_TEMPS[1])
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|c| c.is_ascii_digit()))
        {
            return EntryName::ControlTemp;
        }
        if name.starts_with(TEMP_PREFIX) {
            return match parse_temp(name) {
                Some((stem, _)) if BlockHash::from_hex(stem).is_ok() => EntryName::Temp,
                Some((stem, _))
                    if CONTROL_FILES.contains(&stem) || instance_stats_owner(stem).is_some() =>
                {
                    EntryName::ControlTemp
                }
                _ => EntryName::Foreign,
            };
        }
        match BlockHash::from_hex(name) {
            Ok(h) => EntryName::Block(h),
            Err(_) => EntryName::Foreign,
        }
    }

    /// Who wrote a temp file (a block's or a control file's), from its name: the node (for
    /// names written since shared mode, `<stem>.<node>.<pid>.<seq>`) and the pid. `None` for
    /// a name that is not a temp file, or an old one (`<stem>.<pid>.<seq>`, `.STATS.json.tmp`,
    /// `.tmp.layout.<pid>`) that says no node.
    pub fn temp_owner(name: &str) -> Option<Owner> {
        parse_temp(name).map(|(_, owner)| owner)
    }

    /// The text of the layout file.
    pub fn to_file_text(&self) -> String {
        format!("depth={}\nfanout={}\n", self.depth, self.fanout)
    }

    /// Parses the layout file.
    pub fn from_file_text(text: &str) -> Option<Layout> {
        let mut depth = None;
        let mut fanout = None;
        for line in text.lines() {
            match line.split_once('=') {
                Some(("depth", v)) => depth = v.trim().parse().ok(),
                Some(("fanout", v)) => fanout = v.trim().parse().ok(),
                _ => {}
            }
        }
        let l = Layout {
            depth: depth?,
            fanout: fanout?,
        };
        l.validate().ok().map(|_| l)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "depth {} fan-out {}", self.depth, self.fanout)
    }
}

impl FromStr for Layout {
    type Err = Error;
    /// `DEPTH` or `DEPTHxFANOUT`, e.g. `2` or `1x4096`.
    fn from_str(s: &str) -> Result<Layout> {
        let (d, f) = s.split_once('x').unwrap_or((s, "256"));
        let depth = d
            .parse()
            .map_err(|_| Error::Config(format!("bad layout depth {d:?}")))?;
        let fanout = f
            .parse()
            .map_err(|_| Error::Config(format!("bad layout fan-out {f:?}")))?;
        Layout::new(depth, fanout)
    }
}

/// The directory of a format version under a root: `<root>/v1`.
pub fn version_dir(root: &Path) -> PathBuf {
    root.join(format!("v{FORMAT_VERSION}"))
}

/// The directory of a worker: `<root>/v1/<worker>`.
#[cfg(test)]
pub fn worker_dir(root: &Path, worker: &WorkerId) -> PathBuf {
    version_dir(root).join(worker.as_str())
}

const REL_PATH_MAX: usize = (MAX_DEPTH as usize) * 4 + 64;

/// A block's path relative to its worker directory, built without allocating.
#[derive(Clone, Copy)]
pub struct RelPath {
    buf: [u8; REL_PATH_MAX],
    len: usize,
    dir_len: usize,
}

impl RelPath {
    fn push(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    /// The whole relative path, e.g. `ab/ab12...`.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("ascii")
    }

    /// The shard directory part (empty at depth 0).
    pub fn dir(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.dir_len]).expect("ascii")
    }

    /// The file name part (64 hex characters).
    pub fn file_name(&self) -> &str {
        std::str::from_utf8(&self.buf[self.len - 64..self.len]).expect("ascii")
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_per_depth() {
        let h = BlockHash::from_hex(&format!("abc{}", "0".repeat(61))).unwrap();
        let flat = Layout::new(0, 256).unwrap().rel_path(&h);
        assert_eq!(flat.as_str(), h.to_hex());
        assert_eq!(flat.dir(), "");
        let two = Layout::new(2, 256).unwrap().rel_path(&h);
        assert_eq!(two.as_str(), format!("ab/c0/{}", h.to_hex()));
        assert_eq!(two.dir(), "ab/c0");
        assert_eq!(two.file_name(), h.to_hex());
        assert_eq!(format!("{two:?}"), two.as_str());
        let wide = Layout::new(1, 4096).unwrap().rel_path(&h);
        assert_eq!(wide.as_str(), format!("abc/{}", h.to_hex()));
        let deep = Layout::new(4, 4096).unwrap().rel_path(&h);
        assert_eq!(deep.dir(), "abc/000/000/000");
    }

    #[test]
    fn level_names_are_every_shard_directory_of_a_level() {
        for (fanout, w) in [(16u32, 1usize), (256, 2), (4096, 3)] {
            let l = Layout::new(1, fanout).unwrap();
            let names: Vec<String> = l.level_names().collect();
            assert_eq!(names.len(), fanout as usize);
            assert_eq!(names[0], "0".repeat(w));
            assert_eq!(names[fanout as usize - 1], "f".repeat(w));
            assert!(names.iter().all(|n| l.is_shard_dir(n)), "{fanout}");
            let unique: std::collections::HashSet<_> = names.iter().collect();
            assert_eq!(unique.len(), names.len());
        }
    }

    #[test]
    fn small_stores_get_one_level_of_256_leaves() {
        let small = Layout::new(1, 256).unwrap();
        assert_eq!(Layout::for_files(Some(1)), small);
        assert_eq!(Layout::for_files(Some(SMALL_TREE_FILES)), small);
        assert_eq!(
            Layout::for_files(Some(SMALL_TREE_FILES + 1)),
            Layout::default()
        );
        assert_eq!(Layout::for_files(None), Layout::default());
        assert_eq!(small.leaves(), 256);
        assert_eq!(Layout::default().leaves(), 65_536);
        assert_eq!(Layout::new(0, 256).unwrap().leaves(), 1);
        let dirs = small.leaf_dirs();
        assert_eq!(
            (dirs.len(), dirs[0].as_str(), dirs[255].as_str()),
            (256, "00", "ff")
        );
        let two = Layout::new(2, 16).unwrap().leaf_dirs();
        assert_eq!((two.len(), two[17].as_str()), (256, "1/1"));
        assert!(Layout::default().leaf_dirs().is_empty());
        assert!(Layout::new(0, 256).unwrap().leaf_dirs().is_empty());
    }

    #[test]
    fn shard_dir_names_are_w_lower_case_hex_characters() {
        let l = Layout::new(2, 256).unwrap();
        for ok in ["00", "ab", "f9"] {
            assert!(l.is_shard_dir(ok), "{ok}");
        }
        for bad in ["", "a", "abc", "AB", "g0", "a/", ".."] {
            assert!(!l.is_shard_dir(bad), "{bad:?}");
        }
        assert!(Layout::new(1, 16).unwrap().is_shard_dir("e"));
        assert!(!Layout::new(1, 16).unwrap().is_shard_dir("ee"));
        assert!(Layout::new(1, 4096).unwrap().is_shard_dir("e0f"));
    }

    #[test]
    fn names_of_layouts_and_directories() {
        assert_eq!(
            Layout::new(2, 256).unwrap().to_string(),
            "depth 2 fan-out 256"
        );
        let w = WorkerId::new("rank0").unwrap();
        assert_eq!(version_dir(Path::new("/r")), Path::new("/r/v1"));
        assert_eq!(worker_dir(Path::new("/r"), &w), Path::new("/r/v1/rank0"));
    }

    #[test]
    fn classify_names() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(matches!(Layout::classify(&hex), EntryName::Block(_)));
        assert_eq!(
            Layout::classify(&format!(".tmp.{hex}.12.3")),
            EntryName::Temp
        );
        assert_eq!(
            Layout::classify(&format!(".tmp.{hex}.12")),
            EntryName::Foreign
        );
        assert_eq!(Layout::classify(&hex.to_uppercase()), EntryName::Foreign);
        assert_eq!(Layout::classify("notes.txt"), EntryName::Foreign);
        assert_eq!(Layout::classify("LAYOUT"), EntryName::Meta);
        assert_eq!(
            Layout::classify(".tmp.STATS.json.12.0"),
            EntryName::ControlTemp
        );
        assert_eq!(Layout::classify(".tmp.LAYOUT.1.22"), EntryName::ControlTemp);
        assert_eq!(Layout::classify(".tmp.layout.77"), EntryName::ControlTemp);
        assert_eq!(Layout::classify(".tmp.layout."), EntryName::Foreign);
        assert_eq!(Layout::classify(".tmp.layout.7x"), EntryName::Foreign);
        assert_eq!(Layout::classify(".STATS.json.tmp"), EntryName::ControlTemp);
        assert_eq!(Layout::classify(".tmp.LAYOUT.1."), EntryName::Foreign);
        assert_eq!(Layout::classify(".tmp.notes.1.2"), EntryName::Foreign);
    }

    #[test]
    fn names_of_shared_stores_say_their_owner() {
        let hex = "0123456789abcdef".repeat(4);
        let node = "00ff00ff00ff00ff";
        let t = format!(".tmp.{hex}.{node}.12.3");
        assert_eq!(Layout::classify(&t), EntryName::Temp);
        let owner = Layout::temp_owner(&t).unwrap();
        assert_eq!(owner.node, Some(0x00ff00ff00ff00ff));
        assert_eq!(owner.pid, 12);
        // Earlier names: no node.
        let old = Layout::temp_owner(&format!(".tmp.{hex}.12.3")).unwrap();
        assert_eq!((old.node, old.pid), (None, 12));
        // A node field that is not 16 lowercase hex characters is not one.
        for bad in ["00FF00FF00FF00FF", "00ff00ff00ff00f", "00ff00ff00ff00ffa"] {
            let n = format!(".tmp.{hex}.{bad}.12.3");
            assert_eq!(Layout::classify(&n), EntryName::Foreign, "{n}");
        }
        let stats = instance_stats_name(0x00ff00ff00ff00ff, 77);
        assert_eq!(stats, format!("STATS.{node}.77.json"));
        assert_eq!(Layout::classify(&stats), EntryName::Meta);
        assert_eq!(
            instance_stats_owner(&stats),
            Some(Owner {
                node: Some(0x00ff00ff00ff00ff),
                pid: 77
            })
        );
        assert_eq!(
            Layout::classify(&format!(".tmp.{stats}.{node}.77.0")),
            EntryName::ControlTemp
        );
        assert_eq!(
            Layout::classify(&format!(".tmp.USAGE.{node}.7.0")),
            EntryName::ControlTemp
        );
        assert_eq!(Layout::classify("USAGE"), EntryName::Meta);
        assert_eq!(Layout::classify("STATS.x.77.json"), EntryName::Foreign);
        assert_eq!(
            Layout::classify("STATS.00ff00ff00ff00ff.json"),
            EntryName::Foreign
        );
        assert_eq!(Layout::temp_owner("notes"), None);
    }

    #[test]
    fn layout_text_and_parse() {
        let l = Layout::new(2, 4096).unwrap();
        assert_eq!(Layout::from_file_text(&l.to_file_text()), Some(l));
        assert_eq!(Layout::from_file_text("depth=9\nfanout=256\n"), None);
        assert_eq!(
            "1x16".parse::<Layout>().unwrap(),
            Layout::new(1, 16).unwrap()
        );
        assert_eq!("0".parse::<Layout>().unwrap(), Layout::new(0, 256).unwrap());
        assert!("1x100".parse::<Layout>().is_err());
        assert!(Layout::new(5, 256).is_err());
    }
}
