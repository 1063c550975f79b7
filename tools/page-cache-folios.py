#!/usr/bin/env python3
"""How files sit in the page cache: their folio sizes and physical contiguity (root only).

usage: tools/page-cache-folios.py LABEL FILE...

Maps each file read-only, touches every page (a read fault: pages not cached are read in),
finds each page's frame in /proc/self/pagemap and its flags in /proc/kpageflags, and prints
one line for all the files together: pages, folios (a large folio's head counts once, its tail
pages not at all; a base page once), the mean folio size, how many pages sit in large folios,
and the mean length of the physically contiguous runs of their pages.

Why: a hot read is a copy out of the page cache, and its speed follows how the cache holds the
file. On this VM the same 256 block files of 2 MiB read at 22 GB/s while each sat in one 2 MiB
folio and at 13-15 GB/s once the folios had been split into 4 KiB pages (docs/benchmarks.md,
"Hot reads"); fio's one large file and the store's files need not be in the same state.
"""
import mmap
import os
import struct
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
KPF_COMPOUND_HEAD = 1 << 15
KPF_COMPOUND_TAIL = 1 << 16
PFN_MASK = (1 << 55) - 1


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if os.geteuid() != 0:
        sys.exit("tools/page-cache-folios.py: needs root (/proc/kpageflags, frame numbers)")
    label, paths = sys.argv[1], sys.argv[2:]
    pagemap = open("/proc/self/pagemap", "rb", buffering=0)
    kflags = open("/proc/kpageflags", "rb", buffering=0)
    pages = folios = in_large = runs = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        n = (size + PAGE - 1) // PAGE
        view = memoryview(m)
        # Where it is mapped: the line of /proc/self/maps naming this inode and path.
        ino = os.stat(path).st_ino
        start = None
        for line in open("/proc/self/maps"):
            fields = line.rstrip("\n").split(maxsplit=5)
            if len(fields) == 6 and int(fields[4]) == ino and os.path.samefile(fields[5], path):
                start = int(fields[0].split("-")[0], 16)
                break
        if start is None:
            sys.exit(f"{path}: its mapping is not in /proc/self/maps")
        pfns = []
        for i in range(n):
            view[i * PAGE]  # fault the page in
            pagemap.seek((start // PAGE + i) * 8)
            entry = struct.unpack("<Q", pagemap.read(8))[0]
            pfns.append(entry & PFN_MASK if entry >> 63 else None)
        view.release()
        m.close()
        for pfn in pfns:
            if pfn is None:
                folios += 1
                continue
            kflags.seek(pfn * 8)
            flags = struct.unpack("<Q", kflags.read(8))[0]
            if flags & KPF_COMPOUND_TAIL:
                in_large += 1
            elif flags & KPF_COMPOUND_HEAD:
                in_large += 1
                folios += 1
            else:
                folios += 1
        runs += 1 + sum(
            1 for a, b in zip(pfns, pfns[1:]) if a is None or b is None or b != a + 1
        )
        pages += n
    kib = PAGE // 1024
    print(
        f"page cache, {label}: {len(paths)} files, {pages} pages, {folios} folios "
        f"(mean {pages * kib / max(folios, 1):.0f} KiB), {100 * in_large / max(pages, 1):.0f}% "
        f"of pages in large folios, physically contiguous runs of {pages * kib / max(runs, 1):.0f} "
        f"KiB on average"
    )


if __name__ == "__main__":
    main()
