//! Where a host get puts a block's payload: one caller buffer, or several filled in order
//! ([`Store::get_many_vectored`](super::Store::get_many_vectored): an MHA page's K and V
//! regions, which are not contiguous).

use std::io::IoSliceMut;

use crate::buf::DIRECT_ALIGN;
use crate::format::Header;

/// A get's host destination: the payload's bytes go to the parts in order.
pub(super) enum Scatter<'a> {
    /// One buffer (`Store::get_many`).
    One(&'a mut [u8]),
    /// Several, filled in order (`Store::get_many_vectored`).
    Many(Vec<&'a mut [u8]>),
}

impl Scatter<'_> {
    /// The bytes the parts hold in all.
    pub(super) fn len(&self) -> usize {
        match self {
            Scatter::One(b) => b.len(),
            Scatter::Many(parts) => parts.iter().map(|p| p.len()).sum(),
        }
    }

    /// True when an `O_DIRECT` read can go straight into the parts: every part starts on the
    /// alignment, and every part but the last is a whole number of aligned blocks (so the
    /// payload's aligned blocks never straddle two parts).
    pub(super) fn aligned(&self) -> bool {
        let starts = |p: &[u8]| p.as_ptr() as usize % DIRECT_ALIGN == 0;
        match self {
            Scatter::One(b) => starts(b),
            Scatter::Many(parts) => {
                let last = parts.len().saturating_sub(1);
                parts
                    .iter()
                    .enumerate()
                    .all(|(i, p)| starts(p) && (i == last || p.len() % DIRECT_ALIGN == 0))
            }
        }
    }

    /// Appends to `out` the slices of the parts' first `n` bytes (at most their length).
    pub(super) fn push_slices<'b>(&'b mut self, n: usize, out: &mut Vec<IoSliceMut<'b>>) {
        match self {
            Scatter::One(b) => out.push(IoSliceMut::new(&mut b[..n])),
            Scatter::Many(parts) => {
                let mut left = n;
                for p in parts.iter_mut() {
                    if left == 0 {
                        break;
                    }
                    let take = left.min(p.len());
                    out.push(IoSliceMut::new(&mut p[..take]));
                    left -= take;
                }
            }
        }
    }

    /// Copies `src` into the parts' first `src.len()` bytes (at most their length).
    pub(super) fn copy_from(&mut self, src: &[u8]) {
        match self {
            Scatter::One(b) => b[..src.len()].copy_from_slice(src),
            Scatter::Many(parts) => {
                let mut at = 0;
                for p in parts.iter_mut() {
                    if at == src.len() {
                        break;
                    }
                    let take = (src.len() - at).min(p.len());
                    p[..take].copy_from_slice(&src[at..at + take]);
                    at += take;
                }
            }
        }
    }

    /// True when the parts' first `len` bytes are the payload `header` describes (its length
    /// and checksum).
    pub(super) fn matches(&self, header: &Header, len: usize) -> bool {
        match self {
            Scatter::One(b) => header.verify(&b[..len]),
            Scatter::Many(parts) => {
                let mut left = len;
                let mut firsts = Vec::with_capacity(parts.len());
                for p in parts {
                    let take = left.min(p.len());
                    firsts.push(&p[..take]);
                    left -= take;
                }
                header.verify_parts(&firsts)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::AlignedBuf;
    use crate::key::BlockHash;

    fn split<'a>(buf: &'a mut [u8], at: &[usize]) -> Vec<&'a mut [u8]> {
        let mut out = Vec::new();
        let mut rest = buf;
        let mut prev = 0;
        for &a in at {
            let (head, tail) = rest.split_at_mut(a - prev);
            out.push(head);
            rest = tail;
            prev = a;
        }
        out.push(rest);
        out
    }

    #[test]
    fn slices_copies_and_checksums_follow_the_parts_in_order() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let header = Header::for_payload(BlockHash::chain(None, &[1]), &data, None);
        let mut whole = vec![0u8; 12_000];
        let mut s = Scatter::Many(split(&mut whole, &[3, 5000, 9_999]));
        assert_eq!(s.len(), 12_000);
        s.copy_from(&data);
        assert!(s.matches(&header, data.len()));
        let mut out = Vec::new();
        s.push_slices(6000, &mut out);
        let lens: Vec<usize> = out.iter().map(|x| x.len()).collect();
        assert_eq!(lens, [3, 4997, 1000]);
        drop(out);
        drop(s);
        assert_eq!(&whole[..10_000], &data[..]);
        assert!(whole[10_000..].iter().all(|&b| b == 0));
        // One byte changed anywhere is a mismatch, and so is a shorter length.
        whole[5001] ^= 1;
        let s = Scatter::Many(split(&mut whole, &[3, 5000, 9_999]));
        assert!(!s.matches(&header, data.len()));
        let mut one = data.clone();
        let s = Scatter::One(&mut one);
        assert!(s.matches(&header, data.len()));
        assert!(!s.matches(&header, data.len() - 1));
    }

    #[test]
    fn aligned_needs_every_start_aligned_and_whole_blocks_but_the_last() {
        let mut a = AlignedBuf::zeroed(4 * DIRECT_ALIGN);
        assert!(Scatter::Many(split(&mut a, &[DIRECT_ALIGN, 3 * DIRECT_ALIGN])).aligned());
        // The last part may end anywhere; a part that starts unaligned may not.
        assert!(
            Scatter::Many(split(&mut a[..4 * DIRECT_ALIGN - 7], &[2 * DIRECT_ALIGN])).aligned()
        );
        assert!(!Scatter::Many(split(&mut a, &[2 * DIRECT_ALIGN, 4 * DIRECT_ALIGN - 7])).aligned());
        assert!(!Scatter::Many(split(&mut a, &[DIRECT_ALIGN + 512])).aligned());
        assert!(Scatter::One(&mut a[..]).aligned());
        assert!(!Scatter::One(&mut a[1..]).aligned());
    }
}
