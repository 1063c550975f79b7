#!/usr/bin/env python3
"""The statistics and tables of the benchmark scripts (stdlib only).

Every script under tools/ that compares runs takes its figures from here: sizes like 4k / 2m /
1g in bytes, fio's and tierkv-bench's JSON reports, the checks that fail a run (an error, a
miss, a verify error), medians of columns and of per-round ratios with their spread (the
min-max of the per-round ratios), and the markdown rows and tables of docs/benchmarks.md.
tools/fio-compare.py imports it; the shell scripts call its command line:

  tools/benchstats.py size 2m                          2097152
  tools/benchstats.py fio-json read < report           bw_bytes,p50,p99,p99.9 (ns) of job 0
  tools/benchstats.py fio-mibs write [--format .1f]    job 0's MiB/s
  tools/benchstats.py bench-json read [--check errors --check misses] [--extra evictions]
                                                        bw_bytes_per_sec,p50,p99,p99.9[,extra]
  tools/benchstats.py ops-per-sec [--format .0f] < report
  tools/benchstats.py field PATH [--format F] [--scale D] [--check P] < json
  tools/benchstats.py median [--format ,.0f] X...      median of the values
  tools/benchstats.py median-row A B "1 2 3" "4 5 6"   | A | B | med X | med Y | ratio |
  tools/benchstats.py ratio A B / elapsed T0 T1 / passes MIBS SECS NBLOCKS BS
  tools/benchstats.py rounds-table ROWS --keys bs=2m ... COLS...
  tools/benchstats.py full-store-row / replay-row / ttft-row (one script's row each)

A rows file has one line per round and one space-separated cell per column, each cell the
comma-separated figures of one run: bandwidth (bytes/s), then p50, p99 and p99.9 latency (ns),
then anything else the script records. Every check or parse failure exits 1 with a message.
"""
import argparse
import json
import math
import statistics
import sys

MIB = 1 << 20
SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# fio's completion-latency percentile keys (tierkv-bench reports the same ones).
PERCENTILES = ("50.000000", "99.000000", "99.900000")
# Bandwidth units of a table: (divisor of bytes/s, a table cell's format, a round's format).
BW_UNITS = {"MiB/s": (MIB, "{:.0f}", "{:7.0f}"), "GB/s": (1e9, "{:.2f}", "{:6.2f}")}
# Latency units of a table: the divisor of nanoseconds.
LAT_UNITS = {"us": 1e3, "ms": 1e6}


class BenchError(Exception):
    """A report that cannot be read, or a run that failed one of its checks."""


def size_bytes(text):
    """A size in bytes: `4096`, `4k`, `2m`, `1g` (also `2M`, `2MiB`, `2mb`); powers of 1024."""
    s = text.strip().lower()
    for tail in ("ib", "b"):
        if s.endswith(tail) and len(s) > len(tail) and s[-len(tail) - 1] in SIZE_SUFFIXES:
            s = s[: -len(tail)]
            break
    try:
        if s and s[-1] in SIZE_SUFFIXES:
            return int(s[:-1]) * SIZE_SUFFIXES[s[-1]]
        return int(s)
    except ValueError:
        raise BenchError(f"not a size: {text!r} (expected e.g. 4096, 4k, 2m, 1g)") from None


def parse_json(text, want=None):
    """The first JSON object in `text` (fio may print warnings before its report); with
    `want`, the first one that has that key."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            doc, _ = decoder.raw_decode(text, start)
            if isinstance(doc, dict) and (want is None or want in doc):
                return doc
        except ValueError:
            pass
        start = text.find("{", start + 1)
    head = text.strip()[:200]
    raise BenchError(f"no JSON report{' with ' + repr(want) if want else ''} in: {head!r}")


def dig(doc, path, default=None):
    """doc's value at a dotted path (`store.misses`); `default` when a key is absent (None:
    a missing key is an error)."""
    cur = doc
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            if default is not None:
                return default
            raise BenchError(f"the report has no {path!r}")
        cur = cur[key]
    return cur


def check_zero(doc, paths, what="run"):
    """Raises BenchError unless every dotted path in `paths` is 0 in `doc` (a run with an
    error, a miss or a verify error fails)."""
    bad = [f"{p}={dig(doc, p)}" for p in paths if dig(doc, p) != 0]
    if bad:
        first = dig(doc, "read.first_error", "") or dig(doc, "write.first_error", "")
        more = f" (first error: {first})" if first else ""
        raise BenchError(f"{what} failed its checks: {', '.join(bad)}{more}")


def fio_figures(text, rw):
    """From fio's JSON report: the first job's `rw` ("read" or "write") bandwidth (bytes/s)
    and completion latency p50, p99 and p99.9 (ns). A job that reports an error fails."""
    job = parse_json(text, want="jobs")["jobs"][0]
    if job.get("error", 0):
        raise BenchError(f"fio job {job.get('jobname', '?')} reported error {job['error']}")
    r = job[rw]
    p = r["clat_ns"]["percentile"]
    return [float(r["bw_bytes"])] + [float(p[k]) for k in PERCENTILES]


def bench_figures(doc, direction, extra=()):
    """From tierkv-bench's JSON report: its bandwidth (bytes/s), the `direction` ("read" or
    "write") per-call latency p50, p99 and p99.9 (ns), then each `extra` dotted path
    (`PATH=DEFAULT` for one that may be absent)."""
    p = doc[direction]["clat_ns"]["percentile"]
    out = [float(doc["bw_bytes_per_sec"])] + [float(p[k]) for k in PERCENTILES]
    for e in extra:
        path, _, default = e.partition("=")
        out.append(float(dig(doc, path, float(default) if default else None)))
    return out


def figures_cell(figures):
    """One run's figures as a rows-file cell."""
    return ",".join(repr(float(v)) for v in figures)


def read_rows(path):
    """A rows file: per round, per column, the list of that run's figures."""
    with open(path) as f:
        return [[[float(x) for x in cell.split(",")] for cell in line.split()]
                for line in f if line.strip()]


def median(values):
    return statistics.median(float(v) for v in values)


def column_medians(rows, i):
    """The median of each figure of column `i` over the rounds."""
    return [median(r[i][k] for r in rows) for k in range(len(rows[0][i]))]


def ratios(rows, i, ref, k=0):
    """Per round, column i's figure k over column ref's (rows of figure lists or of numbers)."""
    pick = (lambda c: c[k]) if isinstance(rows[0][0], list) else (lambda c: c)
    return [pick(r[i]) / pick(r[ref]) for r in rows]


def median_ratio(rows, i, ref, k=0):
    """The median of the per-round ratios of column i to column ref, and their spread:
    (median, min, max)."""
    rs = ratios(rows, i, ref, k)
    return median(rs), min(rs), max(rs)


def ratio_cell(stats, spread=True):
    """`0.98x`, with the spread of the rounds when there are several: `0.98x (0.85-1.12x)`."""
    med, lo, hi = stats
    return f"{med:.2f}x" + (f" ({lo:.2f}-{hi:.2f}x)" if spread and lo != hi else "")


def md_row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_header(headers, aligns):
    """A markdown header and its rule; `aligns` holds "r" (right) or "l" per column."""
    return [md_row(headers), "|" + "|".join("---:" if a == "r" else "---" for a in aligns) + "|"]


def rounds_lines(title, cols, rows, bw="MiB/s", label="ratios", ref=0, pairs=()):
    """The per-round lines a table follows: every column's bandwidth, its ratio to column
    `ref`, and each (name, i, j) of `pairs` as `name {i/j}`."""
    div, _, fmt = BW_UNITS[bw]
    lines = [f"\n{title} ({', '.join(cols)})"]
    for r in rows:
        line = "  " + "  ".join(fmt.format(c[0] / div) for c in r)
        line += f"   {label} " + "  ".join(f"{c[0] / r[ref][0]:.2f}x" for c in r[1:])
        line += "".join(f"   {name} {r[i][0] / r[j][0]:.2f}x" for name, i, j in pairs)
        lines.append(line)
    return lines


def rounds_table(keys, name, cols, rows, bw="MiB/s", lat="ms", lat_digits=1,
                 ratio_cols=(("ratio to fio", 0),), spread=True):
    """The markdown table of interleaved rounds: per column (a row each), the key cells
    (`keys`: (header, value) pairs, the first right-aligned), the column's name under header
    `name`, its median bandwidth, the median of its per-round ratios to each (header, ref) of
    `ratio_cols` (with their spread), and its median p50, p99 and p99.9 latency."""
    div, cell, _ = BW_UNITS[bw]
    headers = [h for h, _ in keys] + [name, bw] + [h for h, _ in ratio_cols]
    headers += [f"{p} {lat}" for p in ("p50", "p99", "p99.9")]
    aligns = ["r"] + ["l"] * len(keys) + ["r"] * (len(headers) - len(keys) - 1)
    lines = md_header(headers, aligns)
    for i, col in enumerate(cols):
        med = column_medians(rows, i)
        cells = [v for _, v in keys] + [col, cell.format(med[0] / div)]
        cells += [ratio_cell(median_ratio(rows, i, ref), spread and i != ref)
                  for _, ref in ratio_cols]
        cells += [f"{v / LAT_UNITS[lat]:.{lat_digits}f}" for v in med[1:4]]
        lines.append(md_row(cells))
    return lines


def median_row(a, b, xs, ys):
    """`| a | b | median xs | median ys | ratio |` of two sets of rounds run side by side."""
    mx, my = median(xs), median(ys)
    return md_row([a, b, f"{mx:,.0f}", f"{my:,.0f}", f"{mx / my:.2f}x"])


def ratio(a, b):
    """`a / b` as `1.23x`, the denominator floored at 1 (rates and times in whole units)."""
    return f"{float(a) / max(float(b), 1):.2f}x"


def passes(mibs, secs, nblocks, bs):
    """Passes over `nblocks` blocks of `bs` that take about `secs` at `mibs` MiB/s (>= 1)."""
    return max(1, math.ceil(float(mibs) * MIB * float(secs) / (int(nblocks) * size_bytes(bs))))


def full_store_row(fs, mode, bs, rows):
    """tools/full-store-bench.sh's row: empty and full median MiB/s, the median full/empty
    ratio with every round's, p50 / p99 / p99.9 ms of each, evictions and reused files."""
    med = [column_medians(rows, 0), column_medians(rows, 1)]
    per = "  ".join(f"{x:.2f}x" for x in ratios(rows, 1, 0))
    lat = [" / ".join(f"{v / 1e6:.1f}" for v in m[1:4]) for m in med]
    return md_row([fs, bs, mode, f"{med[0][0] / MIB:.0f}", f"{med[1][0] / MIB:.0f}",
                   f"{median_ratio(rows, 1, 0)[0]:.2f}x ({per})", lat[0], lat[1],
                   f"{med[1][4]:.0f} ({med[1][5]:.0f} reused)"])


def replay_row(name, cap, lru, adm, arc, adaptive, belady):
    """tools/replay-table.sh's row: each policy's hit ratio, the default's lead over the best
    simple policy and its gap to Belady."""
    lru, adm, arc, ad, bel = (float(x) for x in (lru, adm, arc, adaptive, belady))
    best = max(lru, adm, arc)
    return md_row([name, f"{int(cap):,}"] + [f"{v:.4f}" for v in (lru, adm, arc, ad, bel)]
                  + [f"{ad - best:+.4f}", f"{bel - ad:.4f}"])


def ttft_row(doc, mode):
    """tools/engine-ttft.sh's row, from engine_e2e's JSON report."""
    r = doc["request2"]
    return md_row([doc["prompt_tokens"], doc["shared_tokens"], mode, doc["cached_blocks"],
                   "%.0f" % doc["ttft_cold_ms"], "%.0f" % doc["ttft_cached_ms"],
                   "%.2f" % r["load_ms"], "%.2f" % r["rebuild_ms"],
                   "%.0f" % r["prefill_rest_ms"],
                   "%.2fx" % (doc["ttft_cold_ms"] / doc["ttft_cached_ms"]),
                   "%g" % doc["logits_max_abs_diff"], doc["continuation_identical"]])


def fresh_put_table(bs, n, path):
    """tools/fresh-put-bench.sh's table: per round, `NAME MiB/s LAYOUT;` runs; each run's
    median MiB/s and median ratio to the flat naive mode with its spread, and the default
    against a baseline build when there is one."""
    rounds = []
    for line in open(path):
        runs = [x.split() for x in line.split(";") if x.strip()]
        rounds.append({name: (float(bw), lay) for name, bw, lay in runs})
    if not rounds:
        raise BenchError(f"{path}: no rounds")
    lines = [md_row(["bs", "blocks", "run", "layout", "median MiB/s",
                     "ratio to naive (median)", "spread"]),
             "|---:|---:|---|---|---:|---:|---|",
             md_row([bs, n, "naive (flat)", "0x256",
                     f"{median(r['naive'][0] for r in rounds):,.0f}", "1.00x", ""])]
    for k in [k for k in ("default", "baseline") if k in rounds[0]]:
        rs = [r[k][0] / r["naive"][0] for r in rounds]
        lay = ",".join(sorted({r[k][1] for r in rounds}))
        lines.append(md_row([bs, n, k, lay, f"{median(r[k][0] for r in rounds):,.0f}",
                             f"{median(rs):.2f}x", f"{min(rs):.2f}-{max(rs):.2f}x"]))
    if "baseline" in rounds[0]:
        rs = [r["default"][0] / r["baseline"][0] for r in rounds]
        lines.append(f"\n{bs}: default / baseline {median(rs):.2f}x "
                     f"(spread {min(rs):.2f}-{max(rs):.2f}x)")
    return "\n".join(lines)


def _stdin_json():
    return parse_json(sys.stdin.read())


def _fmt(value, spec):
    return format(value, spec) if spec else str(value)


def _cmd_field(a):
    doc = _stdin_json()
    check_zero(doc, a.check)
    v = dig(doc, a.path, a.default)
    print(_fmt(v / a.scale if a.scale else v, a.format))


def _cmd_bench_json(a):
    doc = _stdin_json()
    check_zero(doc, a.check, "tierkv-bench")
    print(figures_cell(bench_figures(doc, a.direction, a.extra)))


def _cmd_fio_mibs(a):
    print(format(fio_figures(sys.stdin.read(), a.rw)[0] / MIB, a.format))


def _cmd_rounds_table(a):
    rows = read_rows(a.rows)
    if not rows:
        raise BenchError(f"{a.rows}: no rounds")
    cols = a.cols[: len(rows[0])]
    keys = [tuple(k.split("=", 1)) for k in a.keys]
    lines = rounds_lines(a.title, cols, rows, a.bw, a.round_label) if a.title else []
    lines += rounds_table(keys, a.name, cols, rows, a.bw, a.lat, a.lat_digits,
                          [(a.ratio_header, 0)])
    print("\n".join(lines))


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("size", help="a size (4k, 2m, 1g) in bytes")
    s.add_argument("size")
    s.set_defaults(run=lambda a: print(size_bytes(a.size)))
    s = sub.add_parser("fio-json", help="fio report on stdin: bw,p50,p99,p99.9")
    s.add_argument("rw", choices=["read", "write"])
    s.set_defaults(run=lambda a: print(figures_cell(fio_figures(sys.stdin.read(), a.rw))))
    s = sub.add_parser("fio-mibs", help="fio report on stdin: job 0's MiB/s")
    s.add_argument("rw", choices=["read", "write"])
    s.add_argument("--format", default=".0f")
    s.set_defaults(run=_cmd_fio_mibs)
    s = sub.add_parser("bench-json", help="tierkv-bench report on stdin: bw,p50,p99,p99.9")
    s.add_argument("direction", choices=["read", "write"])
    s.add_argument("--check", action="append", default=[], help="a path that must be 0")
    s.add_argument("--extra", action="append", default=[], help="PATH[=DEFAULT] to append")
    s.set_defaults(run=_cmd_bench_json)
    for name, path in (("field", None), ("ops-per-sec", "ops_per_sec")):
        s = sub.add_parser(name, help=f"a JSON report's {path or 'PATH'} (from stdin)")
        if path is None:
            s.add_argument("path", help="dotted: store.misses")
        s.add_argument("--format", default="")
        s.add_argument("--scale", type=float, default=0, help="divide by this first")
        s.add_argument("--default", type=float, help="when the path is absent")
        s.add_argument("--check", action="append", default=[], help="a path that must be 0")
        s.set_defaults(run=_cmd_field, path=path)
    return _more_commands(p, sub)


def _more_commands(p, sub):
    s = sub.add_parser("median", help="the median of the values")
    s.add_argument("values", nargs="+", type=float)
    s.add_argument("--format", default=",.0f")
    s.set_defaults(run=lambda a: print(format(median(a.values), a.format)))
    s = sub.add_parser("median-row", help="| A | B | median X | median Y | ratio |")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("xs", type=lambda v: [float(x) for x in v.split()])
    s.add_argument("ys", type=lambda v: [float(x) for x in v.split()])
    s.set_defaults(run=lambda a: print(median_row(a.a, a.b, a.xs, a.ys)))
    s = sub.add_parser("ratio", help="A / max(B, 1) as 1.23x")
    s.add_argument("a", type=float)
    s.add_argument("b", type=float)
    s.set_defaults(run=lambda a: print(ratio(a.a, a.b)))
    s = sub.add_parser("elapsed", help="T1 - T0 (seconds)")
    s.add_argument("t0", type=float)
    s.add_argument("t1", type=float)
    s.add_argument("--format", default=".2f")
    s.set_defaults(run=lambda a: print(format(a.t1 - a.t0, a.format)))
    s = sub.add_parser("passes", help="passes over the blocks that take about SECS")
    for name in ("mibs", "secs", "nblocks", "bs"):
        s.add_argument(name)
    s.set_defaults(run=lambda a: print(passes(a.mibs, a.secs, a.nblocks, a.bs)))
    return _row_commands(p, sub)


def _row_commands(p, sub):
    s = sub.add_parser("rounds-table", help="per-round lines and the table of a rows file")
    s.add_argument("rows")
    s.add_argument("cols", nargs="+")
    s.add_argument("--keys", nargs="*", default=[], help="HEADER=VALUE cells before the name")
    s.add_argument("--name", default="reader", help="the header of the column names")
    s.add_argument("--title", default="", help="the per-round lines' title (none: no lines)")
    s.add_argument("--round-label", default="ratios")
    s.add_argument("--ratio-header", default="ratio to fio")
    s.add_argument("--bw", choices=list(BW_UNITS), default="MiB/s")
    s.add_argument("--lat", choices=list(LAT_UNITS), default="ms")
    s.add_argument("--lat-digits", type=int, default=1)
    s.set_defaults(run=_cmd_rounds_table)
    s = sub.add_parser("full-store-row", help="tools/full-store-bench.sh's row")
    for name in ("fs", "mode", "bs", "rows"):
        s.add_argument(name)
    s.set_defaults(run=lambda a: print(full_store_row(a.fs, a.mode, a.bs, read_rows(a.rows))))
    s = sub.add_parser("replay-row", help="tools/replay-table.sh's row")
    s.add_argument("values", nargs=7, metavar="NAME CAP LRU ADMIT2 ARC ADAPTIVE BELADY")
    s.set_defaults(run=lambda a: print(replay_row(*a.values)))
    s = sub.add_parser("fresh-put-table", help="tools/fresh-put-bench.sh's table")
    s.add_argument("bs")
    s.add_argument("n")
    s.add_argument("rows")
    s.set_defaults(run=lambda a: print(fresh_put_table(a.bs, a.n, a.rows)))
    s = sub.add_parser("ttft-row", help="tools/engine-ttft.sh's row (engine_e2e JSON on stdin)")
    s.add_argument("mode")
    s.set_defaults(run=lambda a: print(ttft_row(_stdin_json(), a.mode)))
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        args.run(args)
    except (BenchError, KeyError, IndexError, ValueError, ZeroDivisionError) as e:
        print(f"benchstats {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
