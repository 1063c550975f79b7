#!/usr/bin/env python3
"""What a put of new files costs this machine buffered and with O_DIRECT, without tierkv.

Per size, interleaved rounds: write 32 MiB (at least 16 files) as new files, one write each,
buffered and with O_DIRECT (from a page-aligned buffer), each file into a fresh name in DIR.
Prints the median milliseconds of each and the median (min-max) of the per-round ratio
buffered / direct: above 1, direct puts are faster. The figures behind
StoreConfig::direct_puts_from's default (docs/benchmarks.md, "Direct puts").

usage: tools/direct-put-probe.py [--dir /var/tmp] [--rounds 7] [SIZE_KIB ...]
"""

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time


def write_files(d, tag, buf, n, direct):
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(os.path.join(d, f"{tag}-{i}"), flags, 0o644)
        try:
            assert os.write(fd, buf) == len(buf)
        finally:
            os.close(fd)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("sizes", nargs="*", type=int, default=[64, 256, 1024, 2048])
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="direct-put-probe.", dir=a.dir)
    try:
        for kib in a.sizes:
            size = kib << 10
            buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
            buf.write(os.urandom(size))
            n = max(16, (32 << 20) // size)
            times = {False: [], True: []}
            for r in range(a.rounds):
                # Alternate which goes first, so neither always meets the other's writeback.
                for direct in (r % 2 == 1, r % 2 == 0):
                    times[direct].append(write_files(d, f"{kib}-{r}-{int(direct)}", buf, n, direct))
            ratios = [b / x for b, x in zip(times[False], times[True])]
            print(
                f"{kib} KiB x {n}: buffered {statistics.median(times[False]) * 1e3:.1f} ms, "
                f"direct {statistics.median(times[True]) * 1e3:.1f} ms, buffered/direct "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"
            )
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
