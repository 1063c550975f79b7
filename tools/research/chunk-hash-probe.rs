//! How to hash a block's payload on its first read at the speed of the read (docs/benchmarks.md,
//! "Verified prefix loads"): 300 files of 2 MiB + 4 KiB, page cache warm, each opened and read
//! into its own slot of a touched buffer pool, five rounds of four ways:
//! `plain` (read only), `after` (read whole, then XXH3-128 over the payload), `chunked` (read
//! in pieces of CHUNK bytes, each hashed as it lands), `thread` (the same pieces hashed by a
//! second, persistent thread while the next is read). Prints GB/s per way and round.
//!
//! Run it as an example of the crate (it uses the crate's twox-hash and rustix):
//! ```text
//! mkdir -p /tmp/probe; for i in $(seq 300); do head -c 2101248 /dev/urandom > /tmp/probe/f$i; done
//! cp tools/research/chunk-hash-probe.rs examples/ && cargo run --release --example chunk-hash-probe -- /tmp/probe 2097152 262144
//! rm examples/chunk-hash-probe.rs
//! ```
//! The AVX-512 figure: the `chunked` hasher swapped for `xxhash_rust::xxh3::Xxh3` (a dev
//! dependency), built with `RUSTFLAGS="-C target-cpu=native"`.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};
use std::time::Instant;

fn read_at(fd: BorrowedFd<'_>, off: u64, buf: &mut [u8]) -> usize {
    rustix::io::preadv(fd, &mut [IoSliceMut::new(buf)], off).unwrap()
}

/// A persistent hashing thread: pieces (address, length) in, one digest per `None` out.
fn hasher_thread() -> (SyncSender<Option<(usize, usize)>>, Receiver<u128>) {
    let (tx, rx) = sync_channel::<Option<(usize, usize)>>(64);
    let (dtx, drx) = channel::<u128>();
    std::thread::spawn(move || {
        let mut h = twox_hash::XxHash3_128::new();
        while let Ok(m) = rx.recv() {
            match m {
                // SAFETY: the reader does not touch a piece again until the file's digest is
                // back (it waits on the digest before the next file), and the pool outlives it.
                Some((p, n)) => h.write(unsafe { std::slice::from_raw_parts(p as *const u8, n) }),
                None => {
                    dtx.send(h.finish_128()).unwrap();
                    h = twox_hash::XxHash3_128::new();
                }
            }
        }
    });
    (tx, drx)
}

fn main() {
    let mut a = std::env::args().skip(1);
    let dir = a.next().expect("DIR");
    let bs: usize = a.next().expect("BS").parse().unwrap();
    let chunk: usize = a.next().expect("CHUNK").parse().unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    let slot = bs + 4096;
    let mut pool = vec![1u8; files.len() * slot];
    let (tx, digests) = hasher_thread();
    for round in 0..5 {
        let mut line = format!("{round}");
        for way in ["plain", "after", "chunked", "thread"] {
            let t = Instant::now();
            let mut acc = 0u128;
            for (i, p) in files.iter().enumerate() {
                let f = std::fs::File::open(p).unwrap();
                let buf = &mut pool[i * slot..(i + 1) * slot];
                match way {
                    "plain" => {
                        read_at(f.as_fd(), 0, buf);
                    }
                    "after" => {
                        read_at(f.as_fd(), 0, buf);
                        acc ^= twox_hash::XxHash3_128::oneshot(&buf[4096..]);
                    }
                    _ => {
                        let mut h = twox_hash::XxHash3_128::new();
                        let mut off = 0;
                        while off < buf.len() {
                            let end = (off + chunk).min(buf.len());
                            let k = read_at(f.as_fd(), off as u64, &mut buf[off..end]);
                            if off >= 4096 {
                                if way == "chunked" {
                                    h.write(&buf[off..off + k]);
                                } else {
                                    tx.send(Some((buf[off..].as_ptr() as usize, k))).unwrap();
                                }
                            }
                            if k < end - off {
                                break;
                            }
                            off = end;
                        }
                        if way == "chunked" {
                            acc ^= h.finish_128();
                        } else {
                            tx.send(None).unwrap();
                            acc ^= digests.recv().unwrap();
                        }
                    }
                }
            }
            let gbs = (files.len() * bs) as f64 / t.elapsed().as_secs_f64() / 1e9;
            line += &format!(" {way}={gbs:.2}GB/s");
            std::hint::black_box(acc);
        }
        println!("{line}");
    }
}
