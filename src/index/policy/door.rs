//! The doorkeeper: has a block been offered recently? Admission on second sight: exact for
//! the windows of caches up to [`super::SHADOW_BLOCKS`] blocks, in a few bits per block above.

use super::Set;
use crate::key::BlockHash;

/// Windows of up to this many sightings are remembered exactly (a set of 64-bit hashes), larger
/// ones in a Bloom filter. Why this size: the door window of the largest exact shadow, so every
/// exact shadow's door and the real cache's are exact; a Bloom filter's 1 % false sightings made
/// admission depend on the blocks' hashes (two hash schemes gave 0.0951 and 0.0931).
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
    Exact(Set<u64>),
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
            Seen::Exact(Set::default())
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

    #[cfg(test)]
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
    #[cfg(test)]
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

    #[cfg(test)]
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

    const GOLDEN_MIX: [u64; 4] = [
        0xc043_b17c_0a76_3363,
        0xb1af_1262_d972_26b4,
        0x41b1_e9d5_5f46_1fac,
        0x327e_7187_ab32_3841,
    ];
    const GOLDEN_PROBES: [[(usize, u64); PROBES]; 3] = [
        [
            (849, 1 << 25),
            (543, 1 << 30),
            (237, 1 << 35),
            (931, 1 << 40),
            (625, 1 << 45),
        ],
        [
            (372, 1 << 10),
            (628, 1 << 50),
            (885, 1 << 25),
            (142, 1 << 1),
            (398, 1 << 41),
        ],
        [
            (154, 1 << 41),
            (606, 1 << 13),
            (57, 1 << 49),
            (509, 1 << 21),
            (960, 1 << 58),
        ],
    ];

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
    fn a_new_window_keeps_what_was_seen_and_remembers_as_long_as_it_says() {
        // A cache's doorkeeper starts before the capacity is known (a window of 1) and is
        // given its window when it is.
        let mut d = Doorkeeper::new(1);
        assert_eq!(d.window(), 1);
        d.set_window(100);
        assert_eq!(d.window(), 100);
        for i in 0..50 {
            d.sight(&key(i));
        }
        // Resized again with sightings in it: they stay.
        d.set_window(200);
        assert_eq!(d.window(), 200);
        assert!(
            (0..50).all(|i| d.contains(&key(i))),
            "sightings lost on resize"
        );
        // And the new window holds: key 0 is still remembered 150 sightings later.
        for i in 1000..1150 {
            d.sight(&key(i));
        }
        assert!(d.contains(&key(0)), "forgotten within the window of 200");
    }

    #[test]
    fn heap_bytes_count_both_generations() {
        let mut d = Doorkeeper::new(1000);
        for i in 0..1000 {
            d.sight(&key(i));
        }
        let one = d.heap_bytes();
        for i in 1000..1010 {
            d.sight(&key(i));
        }
        // The full generation went to `prev`, a fresh one holds the last ten.
        assert!(d.heap_bytes() > one, "{} then {one}", d.heap_bytes());
    }

    #[test]
    fn the_door_of_the_largest_exact_shadow_is_exact() {
        // The shadows are exact up to SHADOW_BLOCKS blocks, and their doors remember
        // DOOR_WINDOW_CAPACITIES capacities' worth of sightings: those doors are sets.
        let window = super::super::DOOR_WINDOW_CAPACITIES * super::super::SHADOW_BLOCKS;
        let d = Doorkeeper::new(window);
        assert!(matches!(d.cur.seen, Seen::Exact(_)), "window {window}");
        let d = Doorkeeper::new(window + 1);
        assert!(
            matches!(d.cur.seen, Seen::Bloom(_)),
            "window {}",
            window + 1
        );
    }

    #[test]
    fn mix_and_the_probes_are_what_the_figures_were_made_with() {
        // Sampled shadows follow the chains whose root's mix is 0 modulo the sample, and a
        // filter's false positives depend on the probes: the figures of docs/eviction.md
        // above 32,768 blocks were made with these values. Another hash is a choice to make
        // with those figures rerun, not a refactoring.
        let got: Vec<u64> = [0, 1, 2, 1 << 40].iter().map(|&i| mix(&key(i))).collect();
        assert_eq!(got, GOLDEN_MIX, "{got:#x?}");
        // key(1)'s upper half is even, key(2)'s odd: the step is made odd (nonzero) either
        // way; a step one less moves a probe by a fraction of a bit, which key(1324)'s last
        // probe shows.
        let keys = [1, 2, 1324].map(|i| probes(1000, &key(i)));
        assert_eq!(keys, GOLDEN_PROBES);
    }

    #[test]
    fn mix_spreads_counters_over_every_bit() {
        // Tests build block hashes from counters; the shadows sample chains by a root's mix
        // (its low bits after a rotation) and the filter probes with both halves, so every
        // bit of mix must be about as often 1 as 0, counters or not.
        let n = 20_000u32;
        let mut ones = [0u32; 64];
        for i in 0..u64::from(n) {
            let x = mix(&key(i));
            for (b, c) in ones.iter_mut().enumerate() {
                *c += u32::from(x >> b & 1 == 1);
            }
        }
        for (b, &c) in ones.iter().enumerate() {
            // 20,000 fair coins: a standard deviation of about 71; 5 of them is 354.
            assert!(c.abs_diff(n / 2) < 360, "bit {b}: {c} ones of {n}");
        }
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
