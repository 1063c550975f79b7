#!/usr/bin/env bash
# Puts at real block sizes: tierkv put_many of --batch blocks streaming through an io_uring
# ring of depth 32 (each block: a temp file created, header and payload written in one
# vectored write, renamed into place), buffered and O_DIRECT, against fio writing the same
# files (one per block, created when fio opens it: --create_on_open, the same size as a block
# file, one write each, io_uring at iodepth 32, from a page-aligned buffer as the store's are:
# --iomem_align=4096) and fio writing one large file of the same
# total size. Interleaved round by round; fio writes into a fresh directory, tierkv into a tree
# whose shard directories exist (a store in steady state: the previous round's block files
# removed, the directories kept); a last column gives tierkv into a fresh tree (each block's
# shard directories created as well). The table gives the median of
# the per-round ratios to fio on the same files, and per-call latency percentiles (tierkv: one
# put_many; fio: one write).
#
# usage: tools/put-bench.sh [ROUNDS] [SIZES...]   (defaults: 3 2m 8m 32m; 64k 256k also work)
# Each run writes MIB MiB (default 512), removed after it. BASELINE=path/to/another/tierkv-bench
# adds a column: that binary (e.g. one built from an earlier commit) into the same steady tree,
# in the same rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
rounds_and_sizes 3 "2m 8m 32m" "$@"
need_fio
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-put.XXXXXX); trap 'rm -rf "$W"' EXIT
machine_line "$W"
t_json() {
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["errors"]==0, d; p=d["write"]["clat_ns"]["percentile"]; print("%s,%s,%s,%s" % (d["bw_bytes_per_sec"], p["50.000000"], p["99.000000"], p["99.900000"]))'
}
# One run of binary $1 into the tree $2 (the loop's size, count, batch and I/O mode).
puts() {
  "$1" --dir "$2" --rw write --bs "$bs" --nblocks "$n" --batch "$batch" --iodepth 32 \
    --ioengine io_uring "${dflag[@]}" --output-format json | t_json
}
# The steady tree: the previous run's block files removed, its shard directories kept.
empty_tree() {
  find "$W/t/v1/0" -mindepth 2 -type f -delete
  rm -f "$W/t/v1/0/STATS.json"
}
for bs in "${SIZES[@]}"; do
  kib=$(( $(size_bytes "$bs") / 1024 ))
  file_kib=$(( kib + 4 ))
  n=$(( ${MIB:-512} * 1024 / kib ))
  batch=$(( n < 64 ? n : 64 )); [ "$kib" -ge 32768 ] && batch=16
  for direct in 0 1; do
    out="$W/rows.$bs.$direct"; : > "$out"
    dflag=(); [ $direct = 1 ] && dflag=(--direct)
    rm -rf "$W/t"
    $B --dir "$W/t" --rw write --bs "$bs" --nblocks "$n" --batch "$batch" --output-format json >/dev/null
    for r in $(seq "$ROUNDS"); do
      empty_tree
      rm -rf "$W/f" "$W/big" "$W/fresh"; mkdir -p "$W/f"; sync
      same=$(fio --name=files --directory="$W/f" --nrfiles="$n" --filesize="${file_kib}k" \
               --bs="${file_kib}k" --rw=write --create_on_open=1 --fallocate=none \
               --ioengine=io_uring --iodepth=32 --direct=$direct --iomem_align=4096 --output-format=json 2>/dev/null | fio_json write)
      rm -rf "$W/f"; sync
      big=$(fio --name=big --filename="$W/big" --size="$(( n * file_kib ))k" --bs="${file_kib}k" \
              --rw=write --fallocate=none --ioengine=io_uring --iodepth=32 --direct=$direct --iomem_align=4096 \
              --output-format=json 2>/dev/null | fio_json write)
      rm -f "$W/big"; sync
      t=$(puts "$B" "$W/t")
      sync
      base=""
      if [ -n "${BASELINE:-}" ]; then
        empty_tree; sync
        base=" $(puts "$BASELINE" "$W/t")"
        sync
      fi
      fresh=$(puts "$B" "$W/fresh")
      rm -rf "$W/fresh"; sync
      echo "$same $big $t $fresh$base" >> "$out"
    done
    python3 - "$bs" "$direct" "$n" "$batch" "$out" <<'PY'
import statistics, sys
bs, direct, n, batch, path = sys.argv[1:6]
cols = ["fio, the same files", "fio, one file", "tierkv io_uring", "tierkv, fresh tree", "baseline tierkv"]
rows = [[[float(x) for x in c.split(",")] for c in l.split()] for l in open(path) if l.strip()]
cols = cols[:len(rows[0])]
mib = lambda v: v / 1048576
mode = "O_DIRECT" if direct == "1" else "buffered"
print(f"\n{bs} {mode}: {n} blocks, put_many of {batch}; MiB/s per round ({', '.join(cols)})")
for r in rows:
    print("  " + "  ".join(f"{mib(c[0]):6.0f}" for c in r) + "   ratios to fio on the same files " + "  ".join(f"{c[0] / r[0][0]:.2f}x" for c in r[1:]))
print("| bs | io | writer | MiB/s | ratio to fio, same files | p50 ms | p99 ms | p99.9 ms |")
print("|---:|---|---|---:|---:|---:|---:|---:|")
for i, m in enumerate(cols):
    med = lambda k: statistics.median(r[i][k] for r in rows)
    ratio = statistics.median(r[i][0] / r[0][0] for r in rows)
    print(f"| {bs} | {mode} | {m} | {mib(med(0)):.0f} | {ratio:.2f}x | {med(1) / 1e6:.2f} | {med(2) / 1e6:.2f} | {med(3) / 1e6:.2f} |")
PY
  done
done
