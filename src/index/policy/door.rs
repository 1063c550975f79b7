//! The doorkeeper: has a block been offered recently? Admission on second sight, in a few bits
//! per block.

use crate::key::BlockHash;

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

/// One generation of the filter: a Bloom filter of `bits.len() * 64` bits.
#[derive(Debug, Clone)]
struct Generation {
    bits: Vec<u64>,
    inserted: usize,
}

impl Generation {
    fn new(keys: usize) -> Self {
        let words = (keys.max(1) * BITS_PER_KEY).div_ceil(64);
        Generation {
            bits: vec![0; words],
            inserted: 0,
        }
    }

    /// The (word, bit) of each probe of `h`.
    fn probes(&self, h: &BlockHash) -> [(usize, u64); PROBES] {
        let m = (self.bits.len() * 64) as u64;
        let x = mix(h);
        let (h1, h2) = (x & 0xFFFF_FFFF, (x >> 32) | 1);
        std::array::from_fn(|i| {
            // Lemire's reduction of a 32-bit value onto 0..m.
            let bit = ((h1.wrapping_add((i as u64).wrapping_mul(h2)) & 0xFFFF_FFFF) * m) >> 32;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        })
    }

    fn contains(&self, h: &BlockHash) -> bool {
        self.probes(h).iter().all(|&(w, b)| self.bits[w] & b != 0)
    }

    fn insert(&mut self, h: &BlockHash) {
        for (w, b) in self.probes(h) {
            self.bits[w] |= b;
        }
        self.inserted += 1;
    }
}

/// Remembers the blocks offered recently, to admit a block only on its second offer (as
/// Dynamo's KV block manager does to spare the SSD): two generations of a Bloom filter, each
/// holding up to `window` sightings; when the current one is full it becomes the previous one
/// and a fresh one starts. So a block is remembered for at least `window` and at most
/// `2 * window` later sightings of other blocks, in about `2 * window * 10` bits, whatever the
/// block size; about 1 % of first sightings are taken for second ones (a filter's false
/// positive), which only admits a block early.
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

    /// Bytes of filter held.
    pub fn heap_bytes(&self) -> usize {
        (self.cur.bits.len() + self.prev.bits.len()) * 8
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
    fn false_positives_are_rare() {
        let mut d = Doorkeeper::new(10_000);
        for i in 0..10_000 {
            d.sight(&key(i));
        }
        let fp = (1_000_000..1_010_000)
            .filter(|&i| d.contains(&key(i)))
            .count();
        assert!(fp < 300, "{fp} of 10,000 unseen keys taken for seen");
        assert!(
            (0..10_000).all(|i| d.contains(&key(i))),
            "no false negative"
        );
        assert_eq!(d.heap_bytes(), (10_000 * 10usize).div_ceil(64) * 8 + 8);
    }
}
