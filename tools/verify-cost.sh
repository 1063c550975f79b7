#!/usr/bin/env bash
# Hot random reads with each checksum verification mode (always, on-open, never): 2,000
# blocks, 10 passes, median of 3. usage: tools/verify-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-verify.XXXXXX); trap 'rm -rf "$W"' EXIT
echo "| bs | always | on-open (default) | never |"
echo "|---:|---:|---:|---:|"
for bs in 4k 64k 256k; do
  $B --dir "$W/$bs" --rw write --bs $bs --nblocks 2000 >/dev/null
  row="| $bs |"
  for v in always on-open never; do
    vals=""
    for _ in 1 2 3; do
      vals="$vals $($B --dir "$W/$bs" --rw randread --bs $bs --nblocks 2000 --loops 10 --batch 1 --verify $v --no-layout --output-format json | ops_per_sec)"
    done
    # shellcheck disable=SC2086 # $vals: one figure per run
    row="$row $(python3 "$BENCHSTATS" median $vals) |"
  done
  echo "$row"
done
