//! The doorkeeper: has a block been offered recently? Admission on second sight: exact for
//! the windows of caches up to [`super::SHADOW_BLOCKS`] blocks, in a few bits per block above.

use std::collections::HashSet;

use crate::key::BlockHash;

/// Windows of up to this many sightings are remembered exactly (a set of 64-bit hashes of the
/// blocks), larger ones in a Bloom filter: 4 x [`super::SHADOW_BLOCKS`], the door window
/// ([`super::DOOR_WINDOW_CAPACITIES`]) of the largest exact shadow, so every door of a shadow
/// and the real cache's up to that size are exact. A Bloom filter takes about 1 % of first
/// sightings for second ones, so which blocks are admitted early depended on the blocks'
/// hashes: the shared trace replayed through the index with the test's counter hashes and
/// through a store with blake3 hashes gave 0.0951 and 0.0931 at 1,000 blocks
/// (docs/eviction.md, "The exact doorkeeper"). Exact, the two agree.
pub const EXACT_DOOR_WINDOW: usize = super::DOOR_WINDOW_CAPACITIES * super::SHADOW_BLOCKS;

/// Bits of filter per remembered sighting (with [`PROBES`] probes: about 1 % false "seen").
const BITS_PER_KEY: usize = 10;
/// Probes per key (double hashing over [`mix`] of the key).
const PROBES: usize = 5;

/// A 64-bit hash of a block hash. Block hashes are blake3 outputs, but a caller may build
/// them from anything (tests use counters), so they are mixed rather than sliced.
pub(crate) fn mix(h: &BlockHash) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for w in h.0.chunks_exact(8) {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        x = (x ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 31;
    }
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 29)
}

/// One generation of sightings: how many, and the blocks sighted.
#[derive(Debug, Clone)]
struct Generation {
    seen: Seen,
    inserted: usize,
}

/// The blocks a generation has sighted.
#[derive(Debug, Clone)]
enum Seen {
    /// Their [`mix`] values: windows up to [`EXACT_DOOR_WINDOW`].
    Exact(HashSet<u64>),
    /// A Bloom filter of `len * 64` bits: larger windows.
    Bloom(Vec<u64>),
}

/// The (word, bit) of each probe of `h` in a Bloom filter of `words` words.
fn probes(words: usize, h: &BlockHash) -> [(usize, u64); PROBES] {
    let m = (words * 64) as u64;
    let x = mix(h);
    let (h1, h2) = (x & 0xFFFF_FFFF, (x >> 32) | 1);
    std::array::from_fn(|i| {
        // Lemire's reduction of a 32-bit value onto 0..m.
        let bit = ((h1.wrapping_add((i as u64).wrapping_mul(h2)) & 0xFFFF_FFFF) * m) >> 32;
        ((bit / 64) as usize, 1u64 << (bit % 64))
    })
}

impl Generation {
    fn new(keys: usize) -> Self {
        let seen = if keys <= EXACT_DOOR_WINDOW {
            Seen::Exact(HashSet::new())
        } else {
            Seen::Bloom(vec![0; (keys * BITS_PER_KEY).div_ceil(64)])
        };
        Generation { seen, inserted: 0 }
    }

    fn contains(&self, h: &BlockHash) -> bool {
        match &self.seen {
            Seen::Exact(set) => set.contains(&mix(h)),
            Seen::Bloom(bits) => probes(bits.len(), h).iter().all(|&(w, b)| bits[w] & b != 0),
        }
    }

    fn insert(&mut self, h: &BlockHash) {
        self.inserted += 1;
        match &mut self.seen {
            Seen::Exact(set) => {
                set.insert(mix(h));
            }
            Seen::Bloom(bits) => {
                for (w, b) in probes(bits.len(), h) {
                    bits[w] |= b;
                }
            }
        }
    }

    /// Heap bytes held: the set's buckets (a 64-bit value and a control byte each, as
    /// hashbrown lays them out), or the filter's words.
    fn heap_bytes(&self) -> usize {
        match &self.seen {
            Seen::Exact(set) => set.capacity() * (std::mem::size_of::<u64>() + 1),
            Seen::Bloom(bits) => bits.len() * 8,
        }
    }
}

/// Remembers the blocks offered recently, to admit a block only on its second offer (as
/// Dynamo's KV block manager does to spare the SSD): two generations, each holding up to
/// `window` sightings; when the current one is full it becomes the previous one and a fresh
/// one starts. So a block is remembered for at least `window` and at most `2 * window` later
/// sightings of other blocks. Up to [`EXACT_DOOR_WINDOW`] sightings a generation is a set of 64-bit
/// hashes (no false "seen", about 9 to 18 bytes a sighting); above, a Bloom filter of about
/// `window * 10` bits, whatever the block size, where about 1 % of first sightings are taken
/// for second ones (a filter's false positive), which only admits a block early.
///
/// Used by the [`Adaptive`](super::Adaptive) policy and reusable on its own (e.g. to decide
/// what is worth writing at all).
#[derive(Debug, Clone)]
pub struct Doorkeeper {
    cur: Generation,
    prev: Generation,
    window: usize,
}

impl Doorkeeper {
    /// A doorkeeper that remembers at least `window` sightings.
    pub fn new(window: usize) -> Self {
        let window = window.max(1);
        Doorkeeper {
            cur: Generation::new(window),
            prev: Generation::new(1),
            window,
        }
    }

    /// Changes the window; the filled generations keep their size until they rotate out.
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
        if self.cur.inserted == 0 {
            self.cur = Generation::new(self.window);
        }
    }

    /// The window, in sightings.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Whether `hash` was seen within the window (without recording a sighting).
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.cur.contains(hash) || self.prev.contains(hash)
    }

    /// Records a sighting of `hash`; true if it was seen before within the window.
    pub fn sight(&mut self, hash: &BlockHash) -> bool {
        if self.contains(hash) {
            return true;
        }
        if self.cur.inserted >= self.window {
            self.prev = std::mem::replace(&mut self.cur, Generation::new(self.window));
        }
        self.cur.insert(hash);
        false
    }

    /// Heap bytes held by the two generations.
    pub fn heap_bytes(&self) -> usize {
        self.cur.heap_bytes() + self.prev.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::h;
    use super::*;

    fn key(i: u64) -> BlockHash {
        h(i)
    }

    #[test]
    fn second_sight_within_the_window() {
        let mut d = Doorkeeper::new(100);
        assert!(!d.sight(&key(1)));
        assert!(d.sight(&key(1)));
        // Remembered for at least a window of other sightings...
        for i in 10..110 {
            d.sight(&key(i));
        }
        assert!(d.contains(&key(1)));
        // ... and forgotten after two.
        for i in 200..420 {
            d.sight(&key(i));
        }
        assert!(!d.contains(&key(1)), "forgotten after two windows");
    }

    #[test]
    fn above_the_exact_window_false_positives_are_rare() {
        let n = EXACT_DOOR_WINDOW as u64 + 1;
        let mut d = Doorkeeper::new(n as usize);
        for i in 0..n {
            d.sight(&key(i));
        }
        let fp = (10_000_000..10_010_000)
            .filter(|&i| d.contains(&key(i)))
            .count();
        assert!(
            (10..300).contains(&fp),
            "{fp} of 10,000 unseen keys taken for seen (a Bloom filter's ~1 %)"
        );
        assert!((0..n).all(|i| d.contains(&key(i))), "no false negative");
        // The filter's bits, and the empty exact generation it started beside.
        assert_eq!(d.heap_bytes(), (n as usize * 10).div_ceil(64) * 8);
    }

    #[test]
    fn up_to_the_exact_window_no_unseen_block_is_taken_for_seen() {
        let n = EXACT_DOOR_WINDOW as u64;
        let mut d = Doorkeeper::new(n as usize);
        for i in 0..n {
            d.sight(&key(i));
        }
        // A Bloom filter of the same size would take about 1,000 of these for seen.
        let fp = (10_000_000..10_100_000)
            .filter(|&i| d.contains(&key(i)))
            .count();
        assert_eq!(fp, 0);
        assert!((0..n).all(|i| d.contains(&key(i))), "no false negative");
        // A set of n 64-bit values: at most 2 x 9 bytes a value (hashbrown grows by doubling).
        let bytes = d.heap_bytes();
        assert!(
            bytes >= n as usize * 9 && bytes <= n as usize * 18 + 64,
            "{bytes}"
        );
    }
}
