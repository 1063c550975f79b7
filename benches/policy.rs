//! The cost of the eviction policies at 16Ki and 32Ki cached blocks (where the default's shadows
//! are exact and the real cache mirrors the leader), 64Ki and 1M (where they sample): time per block
//! access (a request of 8 blocks: a 4-block hit prefix, then 4 new blocks, each evicting one),
//! and the policy's state per cached block (heap bytes live, counted by the allocator), for
//! every policy side by side in one run. `cargo bench --bench policy`; docs/eviction.md has the
//! figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierkv::{Access, Policy};
use tierkv::{BlockHash, PolicyKind};

const SIZES: [u64; 4] = [1 << 14, 1 << 15, 1 << 16, 1 << 20];

fn key(i: u64) -> BlockHash {
    BlockHash::chain(None, &[(i >> 32) as u32, i as u32])
}

/// The system allocator, counting the bytes live on the heap.
struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with this layout (above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

/// A policy ordering `blocks` blocks (64-block chains, as the index reports them), and the
/// heap bytes it holds.
fn full_policy(kind: PolicyKind, blocks: u64) -> (Box<dyn Policy>, u64) {
    let before = live_bytes();
    let mut p = kind.build();
    p.set_capacity_hint(blocks as usize);
    for c in 0..blocks / 64 {
        p.on_chain(None);
        for i in 0..64 {
            let h = key(c * 64 + i);
            if p.admit(&h) {
                p.on_access(&[Access {
                    hash: h,
                    inserted: true,
                }]);
            }
        }
    }
    let grew = live_bytes().saturating_sub(before);
    (p, grew)
}

fn policies(c: &mut Criterion) {
    for blocks in SIZES {
        sized(c, blocks);
    }
}

fn sized(c: &mut Criterion, blocks: u64) {
    let mut g = c.benchmark_group(format!("policy_access_{}Ki", blocks >> 10));
    g.throughput(Throughput::Elements(8));
    g.sample_size(20);
    for kind in [
        PolicyKind::Lru,
        PolicyKind::Admit2,
        PolicyKind::Arc,
        PolicyKind::Adaptive,
    ] {
        let (mut p, grew) = full_policy(kind, blocks);
        eprintln!(
            "{kind}: {:.0} heap bytes of policy state per cached block at {blocks} blocks",
            grew as f64 / blocks as f64
        );
        let mut next = blocks;
        let mut req = 0u64;
        g.bench_with_input(BenchmarkId::from_parameter(kind), &kind, |b, _| {
            b.iter(|| {
                // The 4-block prefix of one of the 64-block chains (from its root, as an engine
                // looks a prompt up) is hit, then 4 new blocks follow it, each admitted or not,
                // each evicting one block when admitted (as the index calls).
                req += 1;
                let chain = (req * 7919) % (blocks / 64);
                p.on_chain(None);
                let hits: Vec<Access> = (0..4)
                    .map(|i| Access {
                        hash: key(chain * 64 + i),
                        inserted: false,
                    })
                    .collect();
                p.on_access(&hits);
                p.on_chain(Some(&hits[3].hash));
                for i in 0..4 {
                    let h = key(next + i);
                    if p.admit(&h) {
                        black_box(p.victim(&|_| false));
                        p.on_access(&[Access {
                            hash: h,
                            inserted: true,
                        }]);
                    }
                }
                next += 4;
            })
        });
        if !p.summary().is_empty() {
            eprintln!("{kind} at {blocks} blocks: {}", p.summary());
        }
    }
    g.finish();
}

criterion_group!(benches, policies);
criterion_main!(benches);
