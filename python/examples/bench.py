"""The Python package's benchmark (docs/python.md): what the binding adds to a get, and how
gets scale with threads.

1. A get of one 2 MiB block (and a batch of 8) into a numpy array from Python vs the same
   get from Rust (examples/interop.rs `bench`, a read-only store on the same tree), hot
   (page cache and open-file cache), the two interleaved round by round; the medians of the
   per-call times and their difference.
2. Threads: T Python threads each issuing batches of 8 x 2 MiB gets on one store; the total
   bandwidth for T = 1, 2, 4 (the GIL is released during the I/O, so threads add up until
   the cores or the memory bandwidth are spent).

    tools/python-bench.sh          # builds both sides in release, then runs this
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import tierkv_g3

MiB = 1 << 20
BLOCK = 2 * MiB


def python_get_ns(store, keys, iters, batch, misalign=0):
    # Page-aligned, as the Rust side's; `misalign` bytes off for the alignment row.
    bufs = [tierkv_g3.aligned_array(BLOCK + 64)[misalign : misalign + BLOCK]
            for _ in range(batch)]
    n = len(keys)
    times = []
    for i in range(-(-n // batch) + iters):
        at = (i * batch) % (n - batch + 1)
        ks = keys[at : at + batch]
        t = time.perf_counter_ns()
        r = store.get_many_into(ks, bufs)
        dt = time.perf_counter_ns() - t
        assert None not in r
        if i >= -(-n // batch):
            times.append(dt)
    return statistics.median(times), statistics.fmean(times)


def rust_get_ns(rust, root, n, iters, batch, engine, worker="rank0"):
    out = subprocess.run(
        [rust, "bench", root, worker, str(n), str(iters), str(batch), engine],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def threads_gib_s(store, keys, threads, seconds):
    done = [0] * threads
    stop = threading.Event()

    def work(t):
        bufs = [tierkv_g3.aligned_array(BLOCK) for _ in range(8)]
        i = t
        while not stop.is_set():
            at = (i * 8) % (len(keys) - 7)
            store.get_many_into(keys[at : at + 8], bufs)
            done[t] += 8 * BLOCK
            i += threads

    ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in ths:
        th.join()
    return sum(done) / (time.perf_counter() - t0) / (1 << 30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rust", required=True, help="examples/interop built in release")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--thread-seconds", type=float, default=2.0)
    ap.add_argument("--dir", default=None, help="where the tree goes (default: a temp dir)")
    args = ap.parse_args()

    print("| engine | get | Rust median us | Python median us | difference us | ratio |")
    print(f"machine: {os.cpu_count()} CPUs, {platform.machine()}, "
          f"Linux {platform.release()}, Python {platform.python_version()}, numpy "
          f"{np.__version__}; {args.blocks} blocks of 2 MiB, hot")
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        keys = tierkv_g3.chain_hashes(list(range(16 * args.blocks)), 16)
        for engine in ["psync", "io_uring"]:
            with tierkv_g3.Store(root, "rank0", engine=engine, stats_interval=None) as store:
                if not store.contains_prefix(keys) == len(keys):
                    store.put_many(keys, [np.full(BLOCK, i % 251, np.uint8)
                                          for i in range(len(keys))])
                for batch in [1, 8]:
                    py, rs = [], []
                    for _ in range(args.rounds):
                        py.append(python_get_ns(store, keys, args.iters, batch)[0])
                        rs.append(rust_get_ns(args.rust, root, args.blocks, args.iters,
                                              batch, engine)[0])
                    p, r = statistics.median(py), statistics.median(rs)
                    print(f"| {engine} | {batch} x 2 MiB | {r / 1000:.1f} | {p / 1000:.1f} | "
                          f"{(p - r) / 1000:+.1f} | {p / r:.3f}x |  "
                          f"(per round: rust {[round(x / 1000, 1) for x in rs]}, "
                          f"python {[round(x / 1000, 1) for x in py]})")
                if engine == "psync":
                    # The binding's own cost, where the copy is small: 4 KiB blocks.
                    with tierkv_g3.Store(root, "rank1", engine=engine, stats_interval=None) as s1:
                        s1.put_many(keys, [np.full(4096, 7, np.uint8)] * len(keys))
                        py, rs = [], []
                        for _ in range(args.rounds):
                            py.append(python_get_ns(s1, keys, args.iters * 10, 1)[0])
                            rs.append(rust_get_ns(args.rust, root, args.blocks, args.iters * 10,
                                                  1, engine, "rank1")[0])
                        p, r = statistics.median(py), statistics.median(rs)
                        print(f"| {engine} | 1 x 4 KiB | {r / 1000:.2f} | {p / 1000:.2f} | "
                              f"{(p - r) / 1000:+.2f} | {p / r:.3f}x |")
                    for off in [16, 64]:
                        m = statistics.median(
                            python_get_ns(store, keys, args.iters, 1, off)[0]
                            for _ in range(args.rounds))
                        print(f"| python, buffer {off} bytes past a page | 1 x 2 MiB | "
                              f"{m / 1000:.1f} |")
                    base = None
                    for t in [1, 2, 4]:
                        bw = threads_gib_s(store, keys, t, args.thread_seconds)
                        base = base or bw
                        print(f"| threads {t} | {bw:.2f} GiB/s | {bw / base:.2f}x |")


if __name__ == "__main__":
    main()
