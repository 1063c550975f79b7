//! Admission filters: which offered blocks enter the write-behind queue at all.
//!
//! Writing every block an engine computes wears the SSD and spends its bandwidth on blocks
//! that are never read again. A [`WriteFilter`] sees each block offered to an
//! [`Offloader`](super::Offloader) before it is queued and says whether to write it.
//! [`AdmitAll`] writes everything; [`SecondOffer`] writes a block only when it is offered a
//! second time within a window (the doorkeeper Dynamo's KV block manager uses to spare disk
//! writes). docs/engine-api.md gives their hit ratios and bytes written on the shared trace.

use std::fmt;

use crate::index::policy::Doorkeeper;
use crate::key::BlockHash;

/// One block offered for writing, as a [`WriteFilter`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Candidate<'a> {
    /// The block's chain hash.
    pub hash: &'a BlockHash,
    /// Its chain parent (`None` for a chain's root).
    pub parent: Option<&'a BlockHash>,
    /// Its position in the offer (0 for the first block offered in this call; the offer
    /// continues a cached prefix when `parent` is set on position 0).
    pub position: usize,
    /// Payload bytes.
    pub bytes: usize,
}

/// Decides which offered blocks are written. Called on the engine's thread for every block
/// of an offer, root first, under the offloader's queue lock: keep it cheap (a hash lookup)
/// and never block.
///
/// Every block of an offer is shown to the filter, also those after a block it declined, so
/// that a filter that counts offers sees them all; but a chain is stored only as a prefix:
/// once a block is declined, the blocks after it in the same offer are not written either
/// (their parent would be missing). Blocks already stored or already queued are not shown
/// (they are deduplicated first).
///
/// Object-safe: an offloader holds a `Box<dyn WriteFilter>`.
pub trait WriteFilter: Send + fmt::Debug {
    /// A short name for reports (`all`, `second-offer`).
    fn name(&self) -> &'static str;

    /// True to write `block` (queue it), false to drop it (counted as filtered).
    fn admit(&mut self, block: &Candidate<'_>) -> bool;
}

/// Writes every offered block.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdmitAll;

impl WriteFilter for AdmitAll {
    fn name(&self) -> &'static str {
        "all"
    }

    fn admit(&mut self, _block: &Candidate<'_>) -> bool {
        true
    }
}

/// Writes a block only on its second offer within a window: the first offer of a hash is
/// remembered and dropped, a second offer while it is still remembered is written.
///
/// The window counts offers, not time, so a replay gives the same result on any machine:
/// the filter remembers the last `window` to `2 * window` blocks it was shown. It is the
/// eviction policy's doorkeeper ([`Doorkeeper`], the same admission logic the default
/// `adaptive` policy uses): two generations, each a set of 64-bit hashes for a window of up
/// to `EXACT_DOOR_WINDOW` (src/index/policy/door.rs) blocks (no false "seen", about 9 to 18
/// bytes per block of the window), above that a Bloom filter of about 10 bits per block of
/// the window, whatever the block size, where about 1 % of first offers are taken for second
/// ones (a filter's false positive), which only writes a block early.
#[derive(Clone, Debug)]
pub struct SecondOffer {
    door: Doorkeeper,
}

impl SecondOffer {
    /// A doorkeeper over a window of `window` offered blocks (at least 1).
    pub fn new(window: usize) -> Self {
        SecondOffer {
            door: Doorkeeper::new(window.max(1)),
        }
    }

    /// The window, in offered blocks.
    #[cfg(test)]
    pub fn window(&self) -> usize {
        self.door.window()
    }
}

impl WriteFilter for SecondOffer {
    fn name(&self) -> &'static str {
        "second-offer"
    }

    fn admit(&mut self, block: &Candidate<'_>) -> bool {
        self.door.sight(block.hash)
    }
}

/// Which filter to build, as the tools spell it: `all`, or `second-offer[:WINDOW]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FilterKind {
    /// `AdmitAll`.
    All,
    /// `SecondOffer` with this window (in offered blocks).
    SecondOffer(usize),
}

/// The window [`FilterKind::SecondOffer`] gets when none is named.
pub const DEFAULT_SECOND_OFFER_WINDOW: usize = 100_000;

impl FilterKind {
    /// Builds the filter.
    pub fn build(self) -> Box<dyn WriteFilter> {
        match self {
            FilterKind::All => Box::new(AdmitAll),
            FilterKind::SecondOffer(w) => Box::new(SecondOffer::new(w)),
        }
    }
}

impl std::str::FromStr for FilterKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "all" => Ok(FilterKind::All),
            None if s == "second-offer" => Ok(FilterKind::SecondOffer(DEFAULT_SECOND_OFFER_WINDOW)),
            Some(("second-offer", w)) => match w.parse::<usize>() {
                Ok(w) if w > 0 => Ok(FilterKind::SecondOffer(w)),
                _ => Err(format!(
                    "second-offer window {w:?} is not a positive number"
                )),
            },
            _ => Err(format!(
                "unknown write filter {s:?} (expected all or second-offer[:WINDOW])"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(h: &BlockHash) -> Candidate<'_> {
        Candidate {
            hash: h,
            parent: None,
            position: 0,
            bytes: 1,
        }
    }

    #[test]
    fn second_offer_admits_the_second_sighting_within_the_window() {
        let hs: Vec<BlockHash> = (0..10u32).map(|i| BlockHash::chain(None, &[i])).collect();
        let mut f = SecondOffer::new(3);
        assert!(!f.admit(&cand(&hs[0])));
        assert!(f.admit(&cand(&hs[0])), "second offer");
        assert!(f.admit(&cand(&hs[0])), "and later ones");
        // 0 is in the current generation with 1, 2; 3 rotates it to the previous one: still
        // remembered; 4, 5, 6 rotate again: forgotten.
        for h in &hs[1..4] {
            assert!(!f.admit(&cand(h)));
        }
        assert!(f.admit(&cand(&hs[0])), "within 2 * window");
        for h in &hs[4..7] {
            assert!(!f.admit(&cand(h)));
        }
        assert!(!f.admit(&cand(&hs[0])), "forgotten past 2 * window");
        assert_eq!(f.window(), 3);
        assert!(AdmitAll.admit(&cand(&hs[9])));
    }

    #[test]
    fn filter_kinds_parse() {
        assert_eq!("all".parse::<FilterKind>(), Ok(FilterKind::All));
        assert_eq!(
            "second-offer".parse::<FilterKind>(),
            Ok(FilterKind::SecondOffer(DEFAULT_SECOND_OFFER_WINDOW))
        );
        assert_eq!(
            "second-offer:7".parse::<FilterKind>(),
            Ok(FilterKind::SecondOffer(7))
        );
        assert!("second-offer:0".parse::<FilterKind>().is_err());
        assert!("lru".parse::<FilterKind>().is_err());
        assert_eq!(FilterKind::All.build().name(), "all");
        assert_eq!(FilterKind::SecondOffer(2).build().name(), "second-offer");
    }
}
