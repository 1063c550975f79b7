#!/usr/bin/env python3
"""Reusing an evicted block's file for the next put, against unlink + create: a probe of the
filesystem alone (no tierkv code), on fresh ext4 and XFS loop-device filesystems (root).

A "full store" of N block files of 2 MiB + 4 KiB; each round replaces all N with N new blocks,
one at a time, as a store at its bound does (every put evicts one):

- create: unlink the victim, create a temp file (O_CREAT | O_EXCL), write the whole file,
  (fdatasync), rename it to the new block's name;
- reuse:  rename the victim to a temp name, open it, overwrite it in place (same size: no
  truncate, no allocation), (fdatasync), rename it to the new block's name.

Rounds alternate between the two (each takes the other's files as its victims); the output
gives MiB/s of each and the median of the per-round ratios reuse / create, buffered, O_DIRECT
and synced. usage: tools/research/reuse-probe.py [ROUNDS] [N] [FILESYSTEMS...]  (default 5 128 ext4 xfs)
"""
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
N = int(sys.argv[2]) if len(sys.argv) > 2 else 128
FSS = sys.argv[3:] or ["ext4", "xfs"]
SIZE = (2 << 20) + 4096


def sh(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def replace_all(d, victims, names, how, direct, sync, buf):
    flags = os.O_WRONLY | (os.O_DIRECT if direct else 0)
    t = time.perf_counter()
    for i, (v, n) in enumerate(zip(victims, names)):
        tmp = os.path.join(d, f".tmp.{i}")
        if how == "create":
            os.unlink(os.path.join(d, v))
            fd = os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o644)
        else:
            os.rename(os.path.join(d, v), tmp)
            fd = os.open(tmp, flags)
        os.pwrite(fd, buf, 0)
        if sync:
            os.fdatasync(fd)
        os.close(fd)
        os.rename(tmp, os.path.join(d, n))
    return N * SIZE / (time.perf_counter() - t)


def main():
    if os.geteuid() != 0:
        sys.exit("tools/research/reuse-probe.py: needs root (loop devices)")
    print(f"machine: {os.cpu_count()} cores, kernel {os.uname().release}, "
          f"loop devices on {sh('df', '-T', '/tmp').splitlines()[1].split()[1]}, "
          f"N={N} files of 2 MiB + 4 KiB, {ROUNDS} rounds")
    print("| fs | io | create MiB/s | reuse MiB/s | reuse / create (per round) |")
    print("|---|---|---:|---:|---|")
    buf = mmap.mmap(-1, SIZE)
    buf.write(bytes([0xA5]) * SIZE)
    for fs in FSS:
        work = tempfile.mkdtemp(prefix="tierkv-reuse.")
        img, mnt = os.path.join(work, "img"), os.path.join(work, "mnt")
        os.mkdir(mnt)
        with open(img, "wb") as f:
            f.truncate(4 << 30)
        loop = sh("losetup", "--find", "--show", img)
        try:
            sh("mkfs.xfs", "-q", "-f", loop) if fs == "xfs" else sh("mkfs.ext4", "-q", "-F", loop)
            sh("mount", loop, mnt)
            try:
                for io in ["buffered", "direct", "sync"]:
                    d = os.path.join(mnt, io)
                    os.mkdir(d)
                    gen = 0
                    names = [f"b{gen}.{i}" for i in range(N)]
                    for n in names:
                        with open(os.path.join(d, n), "wb") as f:
                            f.write(buf)
                    os.sync()
                    rows = []
                    for _ in range(ROUNDS):
                        pair = {}
                        for how in ["create", "reuse"]:
                            gen += 1
                            new = [f"b{gen}.{i}" for i in range(N)]
                            pair[how] = replace_all(d, names, new, how, io == "direct",
                                                    io == "sync", buf)
                            names = new
                            os.sync()
                        rows.append((pair["create"], pair["reuse"]))
                    c = statistics.median(r[0] for r in rows) / 2**20
                    u = statistics.median(r[1] for r in rows) / 2**20
                    ratios = [r[1] / r[0] for r in rows]
                    per = " ".join(f"{x:.2f}x" for x in ratios)
                    print(f"| {fs} | {io} | {c:.0f} | {u:.0f} | "
                          f"{statistics.median(ratios):.2f}x ({per}) |")
            finally:
                sh("umount", mnt)
        finally:
            sh("losetup", "-d", loop)
            os.unlink(img)
            os.rmdir(mnt)
            os.rmdir(work)


main()
