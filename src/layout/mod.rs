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
use crate::key::{BlockHash, WorkerId};

/// Name of the file in each worker directory that records its layout.
pub const LAYOUT_FILE: &str = "LAYOUT";
/// Name of the lock file in each worker directory (held with `flock` by the open store).
pub const LOCK_FILE: &str = ".lock";
/// Live counters of the open store (JSON, rewritten atomically; docs/stat.md).
pub const STATS_FILE: &str = "STATS.json";
/// Prefix of temporary files: `<prefix><64 hex>.<pid>.<seq>` for a block being put, and
/// `<prefix><control file>.<pid>.<seq>` for a control file being rewritten.
pub const TEMP_PREFIX: &str = ".tmp.";
/// The control files of a worker directory, which the store rewrites through temp names.
pub const CONTROL_FILES: [&str; 3] = [LAYOUT_FILE, LOCK_FILE, STATS_FILE];
/// Temp names of control files written by earlier versions (swept like any temp file).
const LEGACY_CONTROL_TEMPS: [&str; 2] = [".STATS.json.tmp", ".tmp.layout."];
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
    /// docs/layout.md.
    fn default() -> Self {
        Layout {
            depth: 2,
            fanout: 256,
        }
    }
}

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

    /// True if `name` is a valid shard directory name at any level.
    pub fn is_shard_dir(&self, name: &str) -> bool {
        name.len() == self.chars_per_level()
            && name.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// Classifies a file name found in the tree.
    pub fn classify(name: &str) -> EntryName {
        if CONTROL_FILES.contains(&name) {
            return EntryName::Meta;
        }
        if name == LEGACY_CONTROL_TEMPS[0]
            || name
                .strip_prefix(LEGACY_CONTROL_TEMPS[1])
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|c| c.is_ascii_digit()))
        {
            return EntryName::ControlTemp;
        }
        if let Some(rest) = name.strip_prefix(TEMP_PREFIX) {
            // <control file>.<pid>.<seq>
            for c in CONTROL_FILES {
                if let Some((pid, seq)) = rest
                    .strip_prefix(c)
                    .and_then(|r| r.strip_prefix('.'))
                    .and_then(|r| r.split_once('.'))
                {
                    let digits = |x: &str| !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit());
                    if digits(pid) && digits(seq) {
                        return EntryName::ControlTemp;
                    }
                }
            }
            // <64 hex>.<pid>.<seq>
            let mut parts = rest.split('.');
            let ok = matches!(
                (parts.next(), parts.next(), parts.next(), parts.next()),
                (Some(h), Some(pid), Some(seq), None)
                    if BlockHash::from_hex(h).is_ok()
                        && !pid.is_empty() && pid.bytes().all(|c| c.is_ascii_digit())
                        && !seq.is_empty() && seq.bytes().all(|c| c.is_ascii_digit())
            );
            return if ok {
                EntryName::Temp
            } else {
                EntryName::Foreign
            };
        }
        match BlockHash::from_hex(name) {
            Ok(h) => EntryName::Block(h),
            Err(_) => EntryName::Foreign,
        }
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
