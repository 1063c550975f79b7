#!/usr/bin/env bash
# Cold reads at the disk's limit: O_DIRECT get_many of one request's blocks through the
# io_uring engine (--batch blocks per get_many streaming through a ring of depth 32) against
# fio's randread, direct, io_uring, iodepth 32, on one large file of the same disk (the
# physical limit) and across the block files themselves (--opendir); with NIXL's POSIX
# backend (libaio, io_uring queues) too when its library is present (tools/fetch-nixl.sh).
# Interleaved round by round (this VM's disk drifts by 30 % between runs); the table gives
# the median of the per-round ratios to fio on the large file, and per-call latency
# percentiles (tierkv: one get_many; fio: one I/O).
#
# usage: tools/cold-read-bench.sh [ROUNDS] [SECONDS] [SIZES...]   (defaults: 5 4 2m 8m 32m)
# Writes 1 GiB of block files and a 1 GiB file per size, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}; SECS=${2:-4}
shift $(( $# > 1 ? 2 : $# )) || true
SIZES=("${@:-2m 8m 32m}")
read -r -a SIZES <<< "${SIZES[*]}"
. tools/bench-common.sh
need_fio
build_bench
W=$(mktemp -d /tmp/tierkv-cold.XXXXXX); trap 'rm -rf "$W"' EXIT
machine_line "$W"
t_json() {
  python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["errors"]==0 and d["misses"]==0, d; p=d["read"]["clat_ns"]["percentile"]; print("%s,%s,%s,%s" % (d["bw_bytes_per_sec"], p["50.000000"], p["99.000000"], p["99.900000"]))'
}
for bs in "${SIZES[@]}"; do
  bytes=$(size_bytes "$bs")
  n=$(( (1 << 30) / bytes ))
  batch=64; [ "$bytes" -ge $((32 << 20)) ] && batch=32
  d="$W/tree"; rm -rf "$d" "$W/big"
  $B --dir "$d" --rw write --bs "$bs" --nblocks "$n" --output-format json >/dev/null
  fio --name=lay --filename="$W/big" --size=1g --rw=write --bs=2m --direct=1 >/dev/null
  sync
  out="$W/rows.$bs"; : > "$out"
  cols="fio-1-file fio-block-files io_uring"
  [ "$NIXL" = 1 ] && cols+=" nixl-libaio nixl-uring"
  for r in $(seq "$ROUNDS"); do
    rm -f "$d/v1/0/STATS.json" "$d/v1/0/.lock"
    big=$(fio --name=big --filename="$W/big" --rw=randread --bs="$bs" --ioengine=io_uring \
            --iodepth=32 --direct=1 --time_based --runtime="$SECS" --output-format=json 2>/dev/null | fio_json read)
    mv "$d/v1/0/LAYOUT" "$W/LAYOUT"
    files=$(fio --name=blocks --opendir="$d/v1/0" --rw=randread --bs="$bs" --ioengine=io_uring \
            --iodepth=32 --direct=1 --time_based --runtime="$SECS" --file_service_type=random \
            --openfiles=4096 --output-format=json 2>/dev/null | fio_json read)
    mv "$W/LAYOUT" "$d/v1/0/LAYOUT"
    t() {
      $B --dir "$d" --rw randread --bs "$bs" --nblocks "$n" --direct --no-layout \
         --runtime "${SECS}s" --batch "$batch" --output-format json "$@" | t_json
    }
    line="$big $files $(t --ioengine io_uring --iodepth 32)"
    if [ "$NIXL" = 1 ]; then
      line+=" $(t --ioengine nixl --nixl-posix-queue libaio --iodepth 32)"
      line+=" $(t --ioengine nixl --nixl-posix-queue uring --iodepth 32)"
    fi
    echo "$line" >> "$out"
  done
  python3 - "$bs" "$n" "$batch" "$out" $cols <<'PY'
import statistics, sys
bs, n, batch, path, cols = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
rows = [[[float(x) for x in c.split(",")] for c in l.split()] for l in open(path) if l.strip()]
mib = lambda v: v / 1048576
print(f"\n{bs}: {n} block files, get_many of {batch}; MiB/s per round ({', '.join(cols)})")
for r in rows:
    print("  " + "  ".join(f"{mib(c[0]):6.0f}" for c in r) + "   ratios to fio on one file " + "  ".join(f"{c[0] / r[0][0]:.2f}x" for c in r[1:]))
print("| bs | reader | MiB/s | ratio to fio, one file | p50 ms | p99 ms | p99.9 ms |")
print("|---:|---|---:|---:|---:|---:|---:|")
for i, m in enumerate(cols):
    med = lambda k: statistics.median(r[i][k] for r in rows)
    ratio = statistics.median(r[i][0] / r[0][0] for r in rows)
    print(f"| {bs} | {m} | {mib(med(0)):.0f} | {ratio:.2f}x | {med(1) / 1e6:.1f} | {med(2) / 1e6:.1f} | {med(3) / 1e6:.1f} |")
PY
done
