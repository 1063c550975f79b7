//! `--verify-data`, like fio's `--verify`: every block's payload is derived from its key, its
//! index and a write generation, and every hit is compared with it in full, so a torn, stale
//! (an older generation) or swapped block (another key's) is found, not only a corrupt one.
//!
//! The payload: `FILL` bytes, with a 32-byte stamp at the start of every 4 KiB page:
//! `index` (u64 LE), `generation` (u64 LE), the page number (u64 LE), the first 8 bytes of the
//! block hash (a payload shorter than 32 bytes holds the start of the first stamp). Writing it
//! costs a stamp per page (the buffer keeps its `FILL` bytes), so every run writes it, and a
//! later run with `--verify-data` can check the blocks of an earlier one.
//!
//! Generations: each write of a block takes the next generation of that block. With
//! `--verify-data` a run loads the generations the last verifying run left in
//! `<root>/tierkv-bench.gens/<worker>` (u64 LE per block index) and saves its own at the end,
//! so a later run knows which generation each block must have; a hit of an older generation
//! is stale. A run that writes without `--verify-data` removes the file (the generations are
//! no longer known, and any generation is accepted).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tierkv::BlockHash;

/// The bytes between stamps (the bench's buffers start filled with them).
pub(crate) const FILL: u8 = 0xA5;
const PAGE: usize = 4096;
const STAMP: usize = 32;

fn stamp(hash: &BlockHash, index: u64, generation: u64, page: u64) -> [u8; STAMP] {
    let mut s = [0u8; STAMP];
    s[0..8].copy_from_slice(&index.to_le_bytes());
    s[8..16].copy_from_slice(&generation.to_le_bytes());
    s[16..24].copy_from_slice(&page.to_le_bytes());
    s[24..32].copy_from_slice(&hash.0[..8]);
    s
}

/// Writes the stamps of block `index` (hash `hash`) at `generation` into `buf`, whose other
/// bytes must be [`FILL`] (a buffer that only ever held payloads of this module).
pub(crate) fn fill(buf: &mut [u8], hash: &BlockHash, index: u64, generation: u64) {
    for (page, chunk) in buf.chunks_mut(PAGE).enumerate() {
        let s = stamp(hash, index, generation, page as u64);
        let n = chunk.len().min(STAMP);
        chunk[..n].copy_from_slice(&s[..n]);
    }
}

/// Checks a whole payload against block `index`: returns its generation, or what is wrong.
pub(crate) fn check(buf: &[u8], hash: &BlockHash, index: u64) -> Result<u64, String> {
    let generation = if buf.len() >= 16 {
        u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"))
    } else {
        0
    };
    for (page, chunk) in buf.chunks(PAGE).enumerate() {
        let s = stamp(hash, index, generation, page as u64);
        let n = chunk.len().min(STAMP);
        if chunk[..n] != s[..n] {
            let other = (chunk.len() >= 8)
                .then(|| u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes")));
            return Err(match other {
                Some(i) if i != index && page == 0 => {
                    format!("holds block {i}'s data, not block {index}'s")
                }
                _ => format!("page {page}: its stamp is not block {index}'s"),
            });
        }
        if let Some(off) = chunk[n..].iter().position(|&b| b != FILL) {
            return Err(format!("byte {} differs", page * PAGE + n + off));
        }
    }
    Ok(generation)
}

/// The generations of one worker's blocks.
pub(crate) struct Gens {
    /// Highest generation a put of each block has started.
    started: Vec<AtomicU64>,
    /// Highest generation of each block known to be published (0: unknown).
    committed: Vec<AtomicU64>,
    /// Where they are kept between runs.
    path: PathBuf,
    /// Shared mode: every payload is generation 0 (its key's alone), nothing is saved.
    fixed: bool,
}

impl Gens {
    /// The generations of `worker`'s `n` blocks under `root`: those saved by the last
    /// verifying run when `load`, else unknown.
    pub(crate) fn new(root: &Path, worker: &str, n: usize, load: bool) -> Gens {
        let path = root.join("tierkv-bench.gens").join(worker);
        let saved = if load {
            std::fs::read(&path).unwrap_or_default()
        } else {
            Vec::new()
        };
        let at = |i: usize| {
            saved
                .get(i * 8..i * 8 + 8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        Gens {
            started: (0..n).map(|i| AtomicU64::new(at(i))).collect(),
            committed: (0..n).map(|i| AtomicU64::new(at(i))).collect(),
            path,
            fixed: false,
        }
    }

    /// Shared mode: a block's payload is its key's (generation 0) whoever wrote it, since a
    /// put never replaces a present block; a hit of any other generation is wrong.
    pub(crate) fn content_addressed(n: usize) -> Gens {
        Gens {
            started: (0..n).map(|_| AtomicU64::new(0)).collect(),
            committed: (0..n).map(|_| AtomicU64::new(0)).collect(),
            path: PathBuf::new(),
            fixed: true,
        }
    }

    /// The generation a new write of block `i` stamps.
    pub(crate) fn next(&self, i: usize) -> u64 {
        if self.fixed {
            return 0;
        }
        self.started[i].fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Records that generation `g` of block `i` was published.
    pub(crate) fn commit(&self, i: usize, g: u64) {
        self.committed[i].fetch_max(g, Ordering::Relaxed);
    }

    /// The oldest generation block `i` may have now (0: any), taken before a read.
    pub(crate) fn floor(&self, i: usize) -> u64 {
        self.committed[i].load(Ordering::Relaxed)
    }

    /// Checks a read's generation `g` of block `i` against `floor` (taken before the read)
    /// and the newest write started since.
    pub(crate) fn check(&self, i: usize, floor: u64, g: u64) -> Result<(), String> {
        if self.fixed {
            return if g == 0 {
                Ok(())
            } else {
                Err(format!(
                    "generation {g}: in shared mode every block is generation 0"
                ))
            };
        }
        let newest = self.started[i].load(Ordering::Relaxed);
        if g < floor {
            return Err(format!(
                "stale: generation {g}, but generation {floor} was written"
            ));
        }
        if newest > 0 && g > newest {
            return Err(format!(
                "generation {g} was never written (the newest is {newest})"
            ));
        }
        Ok(())
    }

    /// Saves the published generations for the next verifying run.
    pub(crate) fn save(&self) -> std::io::Result<()> {
        if self.fixed {
            return Ok(());
        }
        let mut b = Vec::with_capacity(self.committed.len() * 8);
        for c in &self.committed {
            b.extend_from_slice(&c.load(Ordering::Relaxed).to_le_bytes());
        }
        std::fs::create_dir_all(self.path.parent().expect("a parent"))?;
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, &b)?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Forgets the saved generations (a run wrote without tracking them).
    pub(crate) fn forget(&self) -> std::io::Result<()> {
        if self.fixed {
            return Ok(());
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_checks_only_as_its_own_block_and_generation() {
        let h = BlockHash([9; 32]);
        for len in [0usize, 5, 31, 32, 100, 4096, 4097, 3 * 4096 + 7] {
            let mut b = vec![FILL; len];
            fill(&mut b, &h, 7, 3);
            let g = check(&b, &h, 7).unwrap();
            assert_eq!(g, if len >= 16 { 3 } else { 0 }, "{len}");
            if len >= 32 {
                assert!(check(&b, &h, 8).is_err(), "another index, {len}");
                assert!(check(&b, &BlockHash([8; 32]), 7).is_err(), "another hash");
                let mut c = b.clone();
                *c.last_mut().unwrap() ^= 1;
                assert!(check(&c, &h, 7).is_err(), "last byte, {len}");
            }
            if len > 4096 + 16 {
                // A page from another generation.
                let mut other = vec![FILL; len];
                fill(&mut other, &h, 7, 4);
                let mut c = b.clone();
                c[4096..].copy_from_slice(&other[4096..]);
                assert!(check(&c, &h, 7).is_err(), "a torn mix, {len}");
            }
        }
    }

    #[test]
    fn stale_generations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let g = Gens::new(dir.path(), "0", 2, true);
        assert_eq!(g.floor(0), 0);
        assert!(g.check(0, 0, 5).is_ok(), "unknown: anything goes");
        let n = g.next(0);
        g.commit(0, n);
        assert_eq!(g.floor(0), 1);
        g.save().unwrap();
        let g = Gens::new(dir.path(), "0", 2, true);
        let n = g.next(0);
        assert_eq!(n, 2);
        g.commit(0, n);
        assert!(g.check(0, g.floor(0), 1).is_err(), "stale");
        assert!(g.check(0, g.floor(0), 2).is_ok());
        assert!(g.check(0, g.floor(0), 3).is_err(), "never written");
        g.forget().unwrap();
        assert_eq!(Gens::new(dir.path(), "0", 2, true).floor(0), 0);
    }

    #[test]
    fn content_addressed_blocks_have_generation_zero_only() {
        let g = Gens::content_addressed(2);
        assert_eq!(g.next(0), 0);
        assert_eq!(g.next(0), 0, "no generations");
        assert!(g.check(0, g.floor(0), 0).is_ok());
        assert!(g.check(0, g.floor(0), 1).is_err());
    }
}
