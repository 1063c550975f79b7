#!/usr/bin/env bash
# Hot reads (page cache) of whole blocks, one at a time (psync), time-based like fio: tierkv
# through its open-file cache (default verify mode and --verify always) against
#   - fio reading one cached file of the same total size with the same block size (the target's
#     baseline: --rw=randread --ioengine=psync, into a page-aligned buffer, --iomem_align=4096,
#     as the store's are; fio's default alignment copies several times slower on this VM),
#   - fio reading the store's own block files (each block's payload, 4 KiB into its file, through
#     hard links in a flat directory: what the kernel can do with the files as laid out), and
#   - the naive mode (flat directory, open + read + close per access, no checksum).
# Each tree is written once and synced before the rounds, so no round reads while writeback of
# its own writes runs; every reader runs for RAMP seconds untimed (fio's ramp_time, default 1:
# tierkv's first pass opens and checks every file, which the prefix-load benchmark measures)
# and then RUNTIME seconds (default 3), interleaved round by round. The table gives the median
# of the per-round ratios and per-read latency percentiles.
#
# usage: [RUNTIME=S] [RAMP=S] tools/hot-read-bench.sh [ROUNDS] [SIZES...]
#        (defaults: 3 4k 64k 256k 2m 8m 32m)
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
rounds_and_sizes 3 "4k 64k 256k 2m 8m 32m" "$@"
RUNTIME=${RUNTIME:-3}
RAMP=${RAMP:-1}
# Both as milliseconds, which fio and tierkv-bench both take ("1500ms").
ms() { python3 -c "import sys; print(round(float(sys.argv[1]) * 1000))" "$1"; }
RT="$(ms "$RUNTIME")ms"
# fio's and tierkv's ramp options, none for RAMP=0 (tierkv-bench takes no zero duration).
FIO_RAMP=(); T_RAMP=(); rp=$(ms "$RAMP")
if [ "$rp" -gt 0 ]; then
  FIO_RAMP=(--ramp_time="${rp}ms"); T_RAMP=(--ramp-time "${rp}ms")
fi
echo "each reader: ${RAMP} s ramp (untimed), then ${RUNTIME} s timed"
need_fio
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-hot.XXXXXX); trap 'rm -rf "$W"' EXIT
machine_line "$W"
# A time-based randread run of an existing tree (no layout): its first pass opens every file,
# the passes after it read through cached descriptors (with --fd-cache 0, the naive mode, every
# read opens and closes its file). A run with an error, a miss or a verify error fails, or with a
# miss or a corrupt block in the store's counters, which cover the ramp too.
t_json() {
  python3 -c 'import json,sys; d=json.load(sys.stdin); r=d["read"]; assert r["errors"]==0 and d["misses"]==0 and d["verify_errors"]==0 and d["store"]["misses"]==0 and d["store"]["corrupt"]==0, d; p=r["lat_us"]; print("%s,%s,%s,%s" % (r["bw_bytes"], p["p50"] * 1e3, p["p99"] * 1e3, p["p99.9"] * 1e3))'
}
for bs in "${SIZES[@]}"; do
  bytes=$(size_bytes "$bs")
  total=$(( bytes < (64 << 10) ? (16 << 20) : (512 << 20) ))
  n=$(( total / bytes )); [ "$n" -gt 2000 ] && n=2000; [ "$n" -lt 16 ] && n=16
  rm -rf "${W:?}"/*
  $B --dir "$W/s" --rw write --bs "$bs" --nblocks "$n" --output-format json >/dev/null
  $B --dir "$W/n" --rw write --bs "$bs" --nblocks "$n" --layout-depth 0 --output-format json >/dev/null
  fio --name=lay --filename="$W/big" --size=$(( n * bytes )) --rw=write --bs="$bs" >/dev/null
  # The store's block files, hard-linked into one flat directory that fio reads whole
  # (--opendir: its --filename takes at most 4096 characters).
  link_block_files "$W/s" "$W/links" "$bytes" "$n"
  sync
  cat "$W/big" "$W/links"/* > /dev/null
  # How the page cache holds each reader's files (folio sizes), before and after the rounds:
  # a hot read's speed follows it (root only).
  folios() {
    if [ "$(id -u)" = 0 ]; then
      tools/page-cache-folios.py "fio's file, $1" "$W/big"
      tools/page-cache-folios.py "the store's block files, $1" "$W/links"/*
      mapfile -t naive < <(find "$W/n" -type f -regextype posix-extended -regex '.*/[0-9a-f]{64}')
      tools/page-cache-folios.py "the naive files, $1" "${naive[@]}"
    fi
  }
  folios "before the rounds"
  out="$W/rows"; : > "$out"
  for r in $(seq "$ROUNDS"); do
    f=$(fio --name=hot --filename="$W/big" --rw=randread --bs="$bs" --ioengine=psync --invalidate=0 --iomem_align=4096 \
          --time_based "${FIO_RAMP[@]}" --runtime="$RT" --output-format=json 2>/dev/null | fio_json read)
    fb=$(fio --name=hotfiles --opendir="$W/links" --file_service_type=random --offset=4096 --size=$(( n * bytes )) \
          --rw=randread --bs="$bs" --ioengine=psync --invalidate=0 --iomem_align=4096 \
          --time_based "${FIO_RAMP[@]}" --runtime="$RT" --output-format=json 2>/dev/null | fio_json read)
    t() { $B --rw randread --no-layout --bs "$bs" --nblocks "$n" "${T_RAMP[@]}" --runtime "$RT" --batch 1 --output-format json "$@" | t_json; }
    s=$(t --dir "$W/s")
    a=$(t --dir "$W/s" --verify always)
    nv=$(t --dir "$W/n" --fd-cache 0 --verify never --read-threads 1)
    echo "$f $fb $s $a $nv" >> "$out"
  done
  folios "after the rounds"
  python3 - "$bs" "$n" "$out" <<'PY'
import statistics, sys
bs, n, path = sys.argv[1:4]
cols = ["fio, one cached file", "fio, the block files", "tierkv (default verify)", "tierkv --verify always", "naive (open+read+close)"]
rows = [[[float(x) for x in c.split(",")] for c in l.split()] for l in open(path) if l.strip()]
print(f"\n{bs}: {n} blocks; MiB/s per round ({', '.join(cols)})")
for r in rows:
    print("  " + "  ".join(f"{c[0] / 1048576:7.0f}" for c in r) + "   ratios to fio " + "  ".join(f"{c[0] / r[0][0]:.2f}x" for c in r[1:]) + f"   store/naive {r[2][0] / r[4][0]:.2f}x")
print("| bs | reader | MiB/s | ratio to fio | ratio to naive | p50 us | p99 us | p99.9 us |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for i, m in enumerate(cols):
    med = lambda k: statistics.median(r[i][k] for r in rows)
    rf = statistics.median(r[i][0] / r[0][0] for r in rows)
    rn = statistics.median(r[i][0] / r[4][0] for r in rows)
    print(f"| {bs} | {m} | {med(0) / 1048576:.0f} | {rf:.2f}x | {rn:.2f}x | {med(1) / 1e3:.1f} | {med(2) / 1e3:.1f} | {med(3) / 1e3:.1f} |")
PY
done
