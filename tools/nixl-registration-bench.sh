#!/usr/bin/env bash
# Hot reads through the nixl engine: the store (open-file cache; FILE registration kept with
# each cached descriptor) vs the naive dynamic mode (flat directory, open + register +
# transfer + deregister + close per access), alternating rounds; median ops/s.
# usage: tools/nixl-registration-bench.sh [NBLOCKS] [ROUNDS]     (needs tools/fetch-nixl.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}; ROUNDS=${2:-5}
. tools/bench-common.sh
build_bin tierkv-bench nixl
W=$(mktemp -d /tmp/tierkv-nixl.XXXXXX); trap 'rm -rf "$W"' EXIT
echo "| bs | iodepth | store ops/s | naive ops/s | ratio |"
echo "|---:|---:|---:|---:|---:|"
for bs in 4k 64k; do
  $B --dir "$W/c$bs" --rw write --bs $bs --nblocks "$N" >/dev/null
  $B --dir "$W/n$bs" --rw write --bs $bs --nblocks "$N" --layout-depth 0 >/dev/null
  for qd in 1 32; do
    c=(); n=()
    for _ in $(seq "$ROUNDS"); do
      c+=("$($B --dir "$W/c$bs" --rw randread --bs $bs --nblocks "$N" --loops 10 --no-layout --ioengine nixl --batch $qd --verify never --output-format json 2>/dev/null | ops_per_sec)")
      n+=("$($B --dir "$W/n$bs" --rw randread --bs $bs --nblocks "$N" --loops 10 --no-layout --ioengine nixl --batch $qd --verify never --fd-cache 0 --output-format json 2>/dev/null | ops_per_sec)")
    done
    median_row "$bs" "$qd" "${c[*]}" "${n[*]}"
  done
done
