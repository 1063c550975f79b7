//! The Rust side of the Python package's interoperability tests (python/tests/test_interop.py):
//! a store written here is read by Python and the reverse, on the same tree with the same
//! hashes, and Python's `chain_hashes` is checked against `BlockHash::chain_all_from`.
//!
//! ```text
//! interop write ROOT WORKER N   store N chained blocks (tokens 0..16N, 16 per block)
//! interop read ROOT WORKER N    read and check them; exit 1 on a miss or a wrong byte
//! interop hash                  per stdin line "BLOCK_TOKENS PARENT|- TOKEN...", the hashes
//! interop bench ROOT WORKER N ITERS BATCH ENGINE
//!                               times ITERS get_many calls of BATCH of the N blocks (a
//!                               read-only store, hot, page-aligned buffers), prints
//!                               "median_ns mean_ns"
//! ```
//!
//! `bench` is the Rust side of python/examples/bench.py (docs/python.md).
//!
//! `write` and `read` print the block hashes, one per line. Block `i` holds
//! `interop_len(i)` bytes, byte `j` being `(i * 131 + j * 7) % 256` (python/tests/conftest.py
//! has the same two functions).

use std::io::BufRead;
use std::process::ExitCode;

use tierkv::{BlockHash, Lookup, Store, StoreConfig, WorkerId};

const BLOCK_TOKENS: usize = 16;

fn interop_len(i: usize) -> usize {
    1000 + i * 4097
}

fn interop_payload(i: usize) -> Vec<u8> {
    (0..interop_len(i))
        .map(|j| ((i * 131 + j * 7) % 256) as u8)
        .collect()
}

fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [op @ ("write" | "read"), root, worker, n] => {
            let n: usize = n.parse()?;
            let config = StoreConfig::new().with_stats_interval(None);
            let store = Store::open(root, WorkerId::new(worker)?, config)?;
            let tokens: Vec<u32> = (0..(n * BLOCK_TOKENS) as u32).collect();
            let keys: Vec<_> = BlockHash::chain_all(&tokens, BLOCK_TOKENS)
                .into_iter()
                .map(|h| store.key(h))
                .collect();
            let mut ok = true;
            if op == "write" {
                let blocks: Vec<Vec<u8>> = (0..n).map(interop_payload).collect();
                let items: Vec<_> = keys.iter().cloned().zip(blocks.iter()).collect();
                for r in store.put_many(&items) {
                    r?;
                }
            } else {
                let mut bufs = vec![vec![0u8; interop_len(n)]; n];
                for (i, r) in store.get_many(&keys, &mut bufs).into_iter().enumerate() {
                    let want = interop_payload(i);
                    match r? {
                        Lookup::Hit(len) if bufs[i][..len] == want[..] => {}
                        other => {
                            eprintln!("block {i} ({}): {other:?}, not its bytes", keys[i].hash);
                            ok = false;
                        }
                    }
                }
            }
            for k in &keys {
                println!("{}", k.hash);
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        ["bench", root, worker, n, iters, batch, engine] => {
            let (n, iters, batch): (usize, usize, usize) =
                (n.parse()?, iters.parse()?, batch.parse()?);
            let config = StoreConfig::new()
                .with_read_only(true)
                .with_engine(engine.parse()?);
            let store = Store::open(root, WorkerId::new(worker)?, config)?;
            let tokens: Vec<u32> = (0..(n * BLOCK_TOKENS) as u32).collect();
            let keys: Vec<_> = BlockHash::chain_all(&tokens, BLOCK_TOKENS)
                .into_iter()
                .map(|h| store.key(h))
                .collect();
            // Page-aligned, as an engine's page pool (and bench.py's arrays) are: the kernel
            // copies into a buffer off a 64-byte line several times slower (docs/python.md).
            let mut bufs: Vec<_> = (0..batch)
                .map(|_| tierkv::AlignedBuf::zeroed(2 << 20))
                .collect();
            let mut times = Vec::with_capacity(iters);
            for i in 0..n.div_ceil(batch) + iters {
                let at = (i * batch) % (n - batch + 1);
                let t = std::time::Instant::now();
                let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                let r = store.get_many(&keys[at..at + batch], &mut dsts);
                let dt = t.elapsed().as_nanos() as u64;
                for x in r {
                    if !x?.is_hit() {
                        return Err("bench: a miss".into());
                    }
                }
                if i >= n.div_ceil(batch) {
                    times.push(dt); // after one warm-up pass over the blocks
                }
            }
            times.sort_unstable();
            let mean = times.iter().sum::<u64>() / times.len().max(1) as u64;
            println!("{} {mean}", times[times.len() / 2]);
            Ok(ExitCode::SUCCESS)
        }
        ["hash"] => {
            for line in std::io::stdin().lock().lines() {
                let line = line?;
                let mut words = line.split_whitespace();
                let block_tokens: usize = words.next().ok_or("empty line")?.parse()?;
                let parent = match words.next().ok_or("no parent")? {
                    "-" => None,
                    hex => Some(BlockHash::from_hex(hex)?),
                };
                let tokens = words.map(str::parse).collect::<Result<Vec<u32>, _>>()?;
                let hashes = BlockHash::chain_all_from(parent.as_ref(), &tokens, block_tokens);
                let hex: Vec<String> = hashes.iter().map(BlockHash::to_hex).collect();
                println!("{}", hex.join(" "));
            }
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!("usage: interop write|read ROOT WORKER N | interop hash");
            Ok(ExitCode::from(2))
        }
    }
}
