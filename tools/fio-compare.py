#!/usr/bin/env python3
"""tierkv-bench against fio, interleaved round by round: the tables of docs/benchmarks.md
("Hot reads", "Cold reads at the disk's limit", "Streamed puts") and docs/io-engines.md
("Against fio, and NIXL's queues"), one subcommand per section. Each size's figures are
medians over the rounds; ratios are medians of the per-round ratios (this VM's disk drifts
by 30 % between runs, so only runs within one round are compared), with their spread.

  tools/fio-compare.py hot-read  [--rounds 3] [--runtime 3] [--ramp 1] [SIZES...]
  tools/fio-compare.py cold-read [--rounds 5] [--seconds 4] [--total 1g] [SIZES...]
  tools/fio-compare.py put       [--rounds 3] [--mib 512] [--baseline BIN] [SIZES...]
  tools/fio-compare.py direct-qd [--rounds 5] [--seconds 4] [--nblocks 1000] [SIZES...]

`tools/fio-compare.py SUBCOMMAND --help` says what each runs. Installs fio if missing and
builds tierkv-bench through tools/bench-common.sh. A run that exits non-zero, reports an
error, a miss or a verify error fails the whole comparison (exit 1). Statistics and tables:
tools/benchstats.py.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchstats as st  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
READ_CHECKS = ("errors", "misses")
HOT_CHECKS = ("errors", "misses", "verify_errors", "store.misses", "store.corrupt")


class RunFailed(Exception):
    """A command that exited non-zero or a run that failed its checks."""


def common(script, *args):
    """Runs `script` in bash after sourcing tools/bench-common.sh (from the repository
    root), with `args` as $1...; returns its stdout. Its stderr passes through."""
    cmd = ["bash", "-c", ". tools/bench-common.sh && " + script, "bench-common", *args]
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RunFailed(f"tools/bench-common.sh: `{script}` exited {done.returncode}")
    return done.stdout


def build(with_nixl):
    """tierkv-bench built by bench-common (build_bench: with the nixl engine when its library
    is present; else build_bin): its path, and whether the nixl engine is in it."""
    if with_nixl:
        b, nixl = common('build_bench >&2 && echo "$B" && echo "$NIXL"').split()
        return b, nixl == "1"
    return common('build_bin tierkv-bench >&2 && echo "$B"').strip(), False


def prepare(args, with_nixl=False):
    """fio installed (bench-common's need_fio) and tierkv-bench built, or the --bench binary
    (no nixl columns then): the binary's path and whether it has the nixl engine."""
    common("need_fio")
    if args.bench:
        return args.bench, False
    return build(with_nixl)


def run(cmd, quiet=False):
    """Runs cmd; its stdout. Non-zero exit raises RunFailed (quiet: its stderr is dropped,
    as the scripts dropped fio's, and shown only when it fails)."""
    done = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, text=True,
                          stderr=subprocess.PIPE if quiet else None)
    if done.returncode != 0:
        err = (done.stderr or "").strip()[-2000:] if quiet else ""
        raise RunFailed(f"exit {done.returncode}: {' '.join(map(str, cmd))}\n{err}".rstrip())
    return done.stdout


def fio(rw, *args):
    """fio's figures of one job (bw, p50, p99, p99.9): fio --output-format=json ARGS."""
    cmd = ["fio", *args, "--output-format=json"]
    try:
        return st.fio_figures(run(cmd, quiet=True), rw)
    except (st.BenchError, KeyError, IndexError) as e:
        raise RunFailed(f"{' '.join(cmd)}: {e}") from None


def fio_on_blocks(shard, *args):
    """fio reading the block files of the tree's shard directory `shard` (--opendir): only
    block files under it (STATS.json and the lock go, LAYOUT waits aside: the store refuses
    a tree of block files without it)."""
    clear(shard / "STATS.json", shard / ".lock")
    aside = shard.parent.parent / "LAYOUT.aside"
    os.rename(shard / "LAYOUT", aside)
    try:
        return fio("read", "--name=blocks", f"--opendir={shard}", *args,
                   "--file_service_type=random", "--openfiles=4096")
    finally:
        os.rename(aside, shard / "LAYOUT")


def bench(binary, direction, checks, *args):
    """tierkv-bench's figures of one run (bw, p50, p99, p99.9), after its checks."""
    cmd = [binary, *args, "--output-format", "json"]
    try:
        doc = st.parse_json(run(cmd))
        st.check_zero(doc, checks, "tierkv-bench")
        return st.bench_figures(doc, direction)
    except (st.BenchError, KeyError, IndexError) as e:
        raise RunFailed(f"{' '.join(map(str, cmd))}: {e}") from None


def layout(binary, d, bs, n, *more):
    """Writes the tree of n blocks of bs under d (not timed)."""
    run([binary, "--dir", d, "--rw", "write", "--bs", bs, "--nblocks", n, *more,
         "--output-format", "json"])


def sync():
    subprocess.run(["sync"], check=True)


def clear(*paths):
    """rm -rf each path."""
    for p in map(Path, paths):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def workdir(name):
    d = tempfile.mkdtemp(prefix=f"tierkv-{name}.", dir="/tmp")
    print(common('machine_line "$1"', d), end="", flush=True)
    return d


def emit(lines):
    print("\n".join(lines), flush=True)


# --- hot-read ----------------------------------------------------------------------------

HOT_COLS = ["fio, one cached file", "fio, the block files", "tierkv (default verify)",
            "tierkv --verify always", "naive (open+read+close)"]


def ms(seconds):
    return round(float(seconds) * 1000)


def hot_blocks(nbytes, nblocks):
    """Hot reads' block count: 16 MiB below 64 KiB blocks, else 512 MiB, in 16 to 2,000."""
    if nblocks:
        return nblocks
    total = (16 << 20) if nbytes < (64 << 10) else (512 << 20)
    return min(2000, max(16, total // nbytes))


def hot_trees(b, w, bs, nbytes, n):
    """The store's tree, the naive flat one, fio's one file and the block files hard-linked
    into w/links; synced and read once (cached)."""
    clear(*Path(w).iterdir())
    layout(b, f"{w}/s", bs, n)
    layout(b, f"{w}/n", bs, n, "--layout-depth", 0)
    run(["fio", "--name=lay", f"--filename={w}/big", f"--size={n * nbytes}", "--rw=write",
         f"--bs={bs}"])
    common('link_block_files "$@"', f"{w}/s", f"{w}/links", str(nbytes), str(n))
    sync()
    for f in [Path(w, "big")] + sorted(Path(w, "links").iterdir()):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def hot_folios(w, when):
    """How the page cache holds each reader's files (root only: /proc/kpageflags)."""
    if os.geteuid() != 0:
        return
    tool = str(ROOT / "tools/page-cache-folios.py")
    links = sorted(str(p) for p in Path(w, "links").iterdir())
    naive = [str(p) for p in Path(w, "n").rglob("*")
             if p.is_file() and len(p.name) == 64 and all(c in "0123456789abcdef" for c in p.name)]
    for label, files in ((f"fio's file, {when}", [f"{w}/big"]),
                         (f"the store's block files, {when}", links),
                         (f"the naive files, {when}", naive)):
        print(run([tool, label, *files]), end="", flush=True)


def hot_round(a, b, w, bs, nbytes, n):
    """One round: the five readers, each time-based with the same ramp; their figures."""
    rt, rp = f"{ms(a.runtime)}ms", ms(a.ramp)
    fio_ramp = [f"--ramp_time={rp}ms"] if rp > 0 else []
    t_ramp = ["--ramp-time", f"{rp}ms"] if rp > 0 else []
    common_fio = ["--rw=randread", f"--bs={bs}", "--ioengine=psync", "--invalidate=0",
                  "--iomem_align=4096", "--time_based", *fio_ramp, f"--runtime={rt}"]
    f = fio("read", "--name=hot", f"--filename={w}/big", *common_fio)
    fb = fio("read", "--name=hotfiles", f"--opendir={w}/links", "--file_service_type=random",
             "--offset=4096", f"--size={n * nbytes}", *common_fio)

    def t(*more):
        return bench(b, "read", HOT_CHECKS, "--rw", "randread", "--no-layout", "--bs", bs,
                     "--nblocks", n, *t_ramp, "--runtime", rt, "--batch", 1, *more)
    s = t("--dir", f"{w}/s")
    al = t("--dir", f"{w}/s", "--verify", "always")
    nv = t("--dir", f"{w}/n", "--fd-cache", 0, "--verify", "never", "--read-threads", 1)
    return [f, fb, s, al, nv]


def hot_read(a):
    b, _ = prepare(a)
    w = workdir("hot")
    try:
        print(f"each reader: {a.ramp} s ramp (untimed), then {a.runtime} s timed", flush=True)
        for bs in a.sizes:
            nbytes = st.size_bytes(bs)
            n = hot_blocks(nbytes, a.nblocks)
            hot_trees(b, w, bs, nbytes, n)
            hot_folios(w, "before the rounds")
            rows = [hot_round(a, b, w, bs, nbytes, n) for _ in range(a.rounds)]
            hot_folios(w, "after the rounds")
            emit(st.rounds_lines(f"{bs}: {n} blocks; MiB/s per round", HOT_COLS, rows,
                                 label="ratios to fio", pairs=[("store/naive", 2, 4)]))
            emit(st.rounds_table([("bs", bs)], "reader", HOT_COLS, rows, lat="us",
                                 ratio_cols=[("ratio to fio", 0), ("ratio to naive", 4)]))
    finally:
        shutil.rmtree(w, ignore_errors=True)


# --- cold-read ---------------------------------------------------------------------------


def cold_round(a, b, nixl, w, d, bs, n, batch):
    """One round: fio on one file, fio on the block files, tierkv io_uring (and nixl)."""
    clear(Path(d, "v1/0/STATS.json"), Path(d, "v1/0/.lock"))
    rand = ["--rw=randread", f"--bs={bs}", "--ioengine=io_uring", "--iodepth=32", "--direct=1",
            "--time_based", f"--runtime={ms(a.seconds)}ms"]
    row = [fio("read", "--name=big", f"--filename={w}/big", *rand),
           fio_on_blocks(Path(d, "v1/0"), *rand)]

    def t(*more):
        return bench(b, "read", READ_CHECKS, "--dir", d, "--rw", "randread", "--bs", bs,
                     "--nblocks", n, "--direct", "--no-layout", "--runtime", f"{ms(a.seconds)}ms",
                     "--batch", batch, *more)
    row.append(t("--ioengine", "io_uring", "--iodepth", 32))
    if nixl:
        for q in ("libaio", "uring"):
            row.append(t("--ioengine", "nixl", "--nixl-posix-queue", q, "--iodepth", 32))
    return row


def cold_read(a):
    b, nixl = prepare(a, with_nixl=True)
    w = workdir("cold")
    cols = ["fio-1-file", "fio-block-files", "io_uring"] + (
        ["nixl-libaio", "nixl-uring"] if nixl else [])
    try:
        total = st.size_bytes(a.total)
        for bs in a.sizes:
            nbytes = st.size_bytes(bs)
            n = a.nblocks or total // nbytes
            batch = 32 if nbytes >= (32 << 20) else 64
            d = f"{w}/tree"
            clear(d, f"{w}/big")
            layout(b, d, bs, n)
            run(["fio", "--name=lay", f"--filename={w}/big", f"--size={total}", "--rw=write",
                 "--bs=2m", "--direct=1"])
            sync()
            rows = [cold_round(a, b, nixl, w, d, bs, n, batch) for _ in range(a.rounds)]
            emit(st.rounds_lines(f"{bs}: {n} block files, get_many of {batch}; MiB/s per round",
                                 cols, rows, label="ratios to fio on one file"))
            emit(st.rounds_table([("bs", bs)], "reader", cols, rows,
                                 ratio_cols=[("ratio to fio, one file", 0)]))
    finally:
        shutil.rmtree(w, ignore_errors=True)


# --- put ---------------------------------------------------------------------------------

PUT_COLS = ["fio, the same files", "fio, one file", "tierkv io_uring", "tierkv, fresh tree",
            "baseline tierkv"]


def empty_tree(w):
    """The steady tree: the previous run's block files removed, its shard directories kept."""
    shard = Path(w, "t/v1/0")
    for p in shard.glob("*/**/*"):
        if p.is_file() or p.is_symlink():
            p.unlink()
    clear(shard / "STATS.json")


def put_fio(w, n, file_kib, direct):
    """fio writing the same files (one per block, created on open), then one large file."""
    io = ["--fallocate=none", "--ioengine=io_uring", "--iodepth=32", f"--direct={direct}",
          "--iomem_align=4096"]
    clear(f"{w}/f", f"{w}/big", f"{w}/fresh")
    os.mkdir(f"{w}/f")
    sync()
    same = fio("write", "--name=files", f"--directory={w}/f", f"--nrfiles={n}",
               f"--filesize={file_kib}k", f"--bs={file_kib}k", "--rw=write",
               "--create_on_open=1", *io)
    clear(f"{w}/f")
    sync()
    big = fio("write", "--name=big", f"--filename={w}/big", f"--size={n * file_kib}k",
              f"--bs={file_kib}k", "--rw=write", *io)
    clear(f"{w}/big")
    sync()
    return [same, big]


def put_round(a, b, w, bs, n, batch, direct):
    """One round: fio (same files, one file), tierkv into the steady tree, the baseline
    binary into it too (BASELINE), tierkv into a fresh tree."""
    def puts(binary, tree):
        return bench(binary, "write", ("errors",), "--dir", tree, "--rw", "write", "--bs", bs,
                     "--nblocks", n, "--batch", batch, "--iodepth", 32, "--ioengine",
                     "io_uring", *(["--direct"] if direct else []))
    empty_tree(w)
    row = put_fio(w, n, st.size_bytes(bs) // 1024 + 4, direct)
    row.append(puts(b, f"{w}/t"))
    sync()
    base = []
    if a.baseline:
        empty_tree(w)
        sync()
        base = [puts(a.baseline, f"{w}/t")]
        sync()
    row.append(puts(b, f"{w}/fresh"))
    clear(f"{w}/fresh")
    sync()
    return row + base


def put(a):
    b, _ = prepare(a)
    w = workdir("put")
    try:
        for bs in a.sizes:
            kib = st.size_bytes(bs) // 1024
            n = a.nblocks or a.mib * 1024 // kib
            batch = 16 if kib >= 32768 else min(n, 64)
            for direct in (0, 1):
                clear(f"{w}/t")
                layout(b, f"{w}/t", bs, n, "--batch", batch)
                rows = [put_round(a, b, w, bs, n, batch, direct) for _ in range(a.rounds)]
                cols = PUT_COLS[: len(rows[0])]
                mode = "O_DIRECT" if direct else "buffered"
                emit(st.rounds_lines(f"{bs} {mode}: {n} blocks, put_many of {batch}; MiB/s "
                                     "per round", cols, rows,
                                     label="ratios to fio on the same files"))
                emit(st.rounds_table([("bs", bs), ("io", mode)], "writer", cols, rows,
                                     lat_digits=2,
                                     ratio_cols=[("ratio to fio, same files", 0)]))
    finally:
        shutil.rmtree(w, ignore_errors=True)


# --- direct-qd ---------------------------------------------------------------------------

QD_COLS = ["fio", "batch 32", "streamed 8x32", "streamed 32x32", "nixl libaio", "nixl uring"]


def qd_round(a, b, nixl, d, bs):
    """One round's MiB/s: fio at depth 32 on the block files, then tierkv io_uring in
    batches of 32, 256 and 1,024 through a ring of depth 32, and nixl (0 without it)."""
    f = fio_on_blocks(Path(d, "v1/0"), "--rw=randread", f"--bs={bs}", "--ioengine=io_uring",
                      "--iodepth=32", "--direct=1", "--time_based",
                      f"--runtime={ms(a.seconds)}ms")

    def t(*more):
        return bench(b, "read", READ_CHECKS, "--dir", d, "--rw", "randread", "--bs", bs,
                     "--nblocks", a.nblocks, "--direct", "--verify", "never", "--no-layout",
                     "--runtime", f"{ms(a.seconds)}ms", *more)[0]
    row = [f[0]] + [t("--ioengine", "io_uring", "--batch", k, "--iodepth", 32)
                    for k in (32, 256, 1024)]
    for q in ("libaio", "uring"):
        row.append(t("--batch", 32, "--ioengine", "nixl", "--nixl-posix-queue", q) if nixl else 0)
    return row


def qd_lines(bs, rows, nixl):
    """The per-round lines and the row `| bs | fio MiB/s (median) | ratios... |` (nixl's
    cells empty without it)."""
    mib = st.MIB
    lines = [f"\n{bs}: per round MiB/s ({', '.join(QD_COLS)})"]
    for r in rows:
        lines.append("  " + "  ".join(f"{v / mib:7.0f}" for v in r) + "   ratios "
                     + "  ".join(f"{v / r[0]:.2f}x" for v in r[1:]))
    used = len(QD_COLS) if nixl else 4
    cells = [bs, f"{st.median(r[0] for r in rows) / mib:.0f}"]
    cells += [st.ratio_cell(st.median_ratio(rows, i, 0)) for i in range(1, used)]
    return lines + [st.md_row(cells + [""] * (len(QD_COLS) - used))]


def direct_qd(a):
    b, nixl = prepare(a, with_nixl=True)
    w = workdir("qd")
    try:
        for bs in a.sizes:
            d = f"{w}/{bs}"
            run([b, "--dir", d, "--rw", "write", "--bs", bs, "--nblocks", a.nblocks])
            sync()
            rows = [qd_round(a, b, nixl, d, bs) for _ in range(a.rounds)]
            emit(qd_lines(bs, rows, nixl))
    finally:
        shutil.rmtree(w, ignore_errors=True)


# --- command line ------------------------------------------------------------------------


def env(name, default):
    return os.environ.get(name) or default


def subcommand(sub, name, fn, doc, rounds, sizes):
    s = sub.add_parser(name, help=doc.split("\n")[0], description=doc,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("sizes", nargs="*", default=sizes.split(), metavar="SIZE",
                   help=f"block sizes (default: {sizes})")
    s.add_argument("--rounds", type=int, default=rounds, help=f"default {rounds}")
    s.add_argument("--bench", help="this tierkv-bench binary, not built (no nixl columns)")
    s.set_defaults(run=fn)
    return s


def parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = subcommand(sub, "hot-read", hot_read, HOT_DOC, 3, "4k 64k 256k 2m 8m 32m")
    s.add_argument("--runtime", type=float, default=float(env("RUNTIME", 3)),
                   help="timed seconds per reader (env RUNTIME; default 3)")
    s.add_argument("--ramp", type=float, default=float(env("RAMP", 1)),
                   help="untimed seconds first (env RAMP; default 1; 0: none)")
    s.add_argument("--nblocks", type=int, help="blocks (default: 16 or 512 MiB, 16-2,000)")
    s = subcommand(sub, "cold-read", cold_read, COLD_DOC, 5, "2m 8m 32m")
    s.add_argument("--seconds", type=float, default=4, help="per run (default 4)")
    s.add_argument("--total", default="1g", help="bytes of block files and fio's file (1g)")
    s.add_argument("--nblocks", type=int, help="blocks (default: TOTAL / size)")
    s = subcommand(sub, "put", put, PUT_DOC, 3, "2m 8m 32m")
    s.add_argument("--mib", type=int, default=int(env("MIB", 512)),
                   help="MiB per run (env MIB; default 512)")
    s.add_argument("--nblocks", type=int, help="blocks per run (default: MIB / size)")
    s.add_argument("--baseline", default=env("BASELINE", None),
                   help="another tierkv-bench, a column of its own (env BASELINE)")
    s = subcommand(sub, "direct-qd", direct_qd, QD_DOC, 5, "64k 256k")
    s.add_argument("--seconds", type=float, default=4, help="per run (default 4)")
    s.add_argument("--nblocks", type=int, default=1000, help="blocks per size (default 1000)")
    return p


HOT_DOC = """Hot reads (page cache) of whole blocks, one at a time (psync), time-based like fio.

tierkv through its open-file cache (default verify mode and --verify always) against fio
reading one cached file of the same total size with the same block size (--rw=randread
--ioengine=psync into a page-aligned buffer, --iomem_align=4096, as the store's are), fio
reading the store's own block files (each payload, 4 KiB into its file, through hard links in
one flat directory), and the naive mode (flat directory, open + read + close per access, no
checksum). Each tree is written once and synced; every reader runs RAMP seconds untimed
(fio's ramp_time, tierkv-bench --ramp-time), then RUNTIME seconds, interleaved round by
round. As root it also prints the page cache's folios of each reader's files
(tools/page-cache-folios.py) before and after the rounds. Ratios: to fio on one file and to
naive; latency per read (us)."""

COLD_DOC = """Cold reads at the disk's limit: O_DIRECT get_many through io_uring against fio.

get_many of one request's blocks (64, or 32 of 32 MiB and more) streaming through an io_uring
ring of depth 32, against fio's randread, direct, io_uring, iodepth 32, on one large file of
the same disk (the physical limit) and across the block files (--opendir); with NIXL's POSIX
backend (libaio, io_uring queues) too when its library is present (tools/fetch-nixl.sh).
Writes TOTAL of block files and a TOTAL file per size, removed at the end. Latency: tierkv's
per get_many, fio's per I/O (ms)."""

PUT_DOC = """Puts at real block sizes: put_many through io_uring against fio writing files.

tierkv put_many of --batch blocks (64, 16 of 32 MiB) streaming through an io_uring ring of
depth 32, buffered and O_DIRECT, against fio writing the same files (one per block, created
on open, the size of a block file, one write each, io_uring at iodepth 32, page-aligned
buffers) and fio writing one large file of the same total size. tierkv writes into a steady
tree (the previous round's block files removed, the shard directories kept); "fresh tree"
also creates the shard directories. --baseline adds that binary into the same steady tree in
the same rounds. Latency: tierkv's per put_many, fio's per write (ms)."""

QD_DOC = """O_DIRECT random reads at queue depth 32: fio's io_uring against tierkv io_uring.

Per round: fio on the block files (--opendir, io_uring, iodepth 32); tierkv get_many of 32
blocks (a barrier every 32 reads), of 256 and of 1,024 streamed through a ring of depth 32;
the nixl engine (NIXL's POSIX backend on libaio and io_uring, get_many of 32) when its
library is present (tools/fetch-nixl.sh). Prints each round's MiB/s and the row of
docs/io-engines.md: fio's median MiB/s and the median of each per-round ratio to fio."""


def main(argv=None):
    a = parser().parse_args(argv)
    try:
        a.run(a)
    except (RunFailed, st.BenchError, OSError, subprocess.CalledProcessError) as e:
        print(f"tools/fio-compare.py {a.cmd}: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
