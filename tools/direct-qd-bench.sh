#!/usr/bin/env bash
# O_DIRECT random reads of whole blocks at queue depth 32: fio's io_uring engine against the
# tierkv io_uring engine, interleaved round by round (this VM's disk drifts by 30 % between
# runs, so only ratios within a round are compared); median ratio over the rounds.
#   batch 32:       get_many of 32 blocks, ring depth 64: a barrier after every 32 reads;
#   streamed 8x32:  get_many of 256 blocks through a ring of depth 32 (32 reads in flight,
#                   each slot refilled as its read completes, as fio does), barrier every 256;
#   streamed 32x32: the same with 1,024 blocks per get_many;
#   nixl libaio / nixl uring: the nixl engine (NIXL's POSIX backend on each queue), get_many
#   of 32 blocks, one transfer each (when the NIXL library is present: tools/fetch-nixl.sh).
# Installs fio if missing. usage: tools/direct-qd-bench.sh [NBLOCKS] [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; SECS=${2:-4}; ROUNDS=${3:-5}
. tools/bench-common.sh
need_fio
build_bench
W=$(mktemp -d /tmp/tierkv-qd.XXXXXX); trap 'rm -rf "$W"' EXIT
echo "machine: $(nproc) cores, kernel $(uname -r), $(df -T "$W" | awk 'NR==2 {print $2}'), fio $(fio --version)"
for bs in 64k 256k; do
  d="$W/$bs"
  $B --dir "$d" --rw write --bs $bs --nblocks "$N" >/dev/null
  sync
  out="$W/r$bs"; : > "$out"
  for r in $(seq "$ROUNDS"); do
    rm -f "$d/v1/0/LAYOUT" "$d/v1/0/STATS.json" "$d/v1/0/.lock"
    f=$(fio --name=blocks --opendir="$d/v1/0" --rw=randread --bs=$bs --ioengine=io_uring \
          --iodepth=32 --direct=1 --time_based --runtime="$SECS" --file_service_type=random \
          --openfiles=4096 --output-format=json 2>/dev/null \
        | python3 -c 'import json,sys; t=sys.stdin.read(); print(json.loads(t[t.index("{"):])["jobs"][0]["read"]["bw_bytes"])')
    t() {
      $B --dir "$d" --rw randread --bs $bs --nblocks "$N" --direct --verify never --no-layout \
         --runtime "${SECS}s" --output-format json "$@" \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["errors"] == 0 and d["misses"] == 0; print(d["bw_bytes_per_sec"])'
    }
    b=$(t --ioengine io_uring --batch 32 --iodepth 32)
    s8=$(t --ioengine io_uring --batch 256 --iodepth 32)
    s32=$(t --ioengine io_uring --batch 1024 --iodepth 32)
    if [ $NIXL = 1 ]; then
      na=$(t --batch 32 --ioengine nixl --nixl-posix-queue libaio)
      nu=$(t --batch 32 --ioengine nixl --nixl-posix-queue uring)
    else
      na=0; nu=0
    fi
    echo "$f $b $s8 $s32 $na $nu" >> "$out"
  done
  python3 - "$bs" "$out" <<'PY'
import statistics, sys
bs, path = sys.argv[1], sys.argv[2]
rows = [[float(x) for x in l.split()] for l in open(path) if l.strip()]
mib = lambda v: v / 1048576
print(f"\n{bs}: per round MiB/s (fio, batch 32, streamed 8x32, streamed 32x32, nixl libaio, nixl uring)")
for r in rows:
    print("  " + "  ".join(f"{mib(v):7.0f}" for v in r) + "   ratios " + "  ".join(f"{v / r[0]:.2f}x" for v in r[1:]))
med = [statistics.median(r[i] / r[0] for r in rows) for i in range(1, len(rows[0]))]
print(f"| {bs} | {statistics.median(mib(r[0]) for r in rows):.0f} | " + " | ".join(f"{m:.2f}x" for m in med) + " |")
PY
done
