#!/usr/bin/env bash
# What tierkv-bench --verify-data costs: hot random reads (every byte of every hit compared)
# and writes (the stamps are written either way), with and without it, side by side; median
# of 3. usage: tools/verify-data-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-verify-data.XXXXXX); trap 'rm -rf "$W"' EXIT
ops() { ops_per_sec; }
median() { python3 "$BENCHSTATS" median "$@"; }
echo "| bs | blocks | randread ops/s | with --verify-data | write ops/s | with --verify-data |"
echo "|---:|---:|---:|---:|---:|---:|"
for spec in 4k:4000 64k:2000 2MiB:256; do
  bs=${spec%:*}; n=${spec#*:}
  $B --dir "$W/$bs" --rw write --bs "$bs" --nblocks "$n" --verify-data >/dev/null
  r0=(); r1=(); w0=(); w1=()
  for _ in 1 2 3; do
    r0+=("$($B --dir "$W/$bs" --rw randread --bs "$bs" --nblocks "$n" --loops 5 --no-layout --output-format json | ops)")
    r1+=("$($B --dir "$W/$bs" --rw randread --bs "$bs" --nblocks "$n" --loops 5 --no-layout --verify-data --output-format json | ops)")
    w0+=("$($B --dir "$W/$bs" --rw write --bs "$bs" --nblocks "$n" --output-format json | ops)")
    w1+=("$($B --dir "$W/$bs" --rw write --bs "$bs" --nblocks "$n" --verify-data --output-format json | ops)")
  done
  echo "| $bs | $n | $(median "${r0[@]}") | $(median "${r1[@]}") | $(median "${w0[@]}") | $(median "${w1[@]}") |"
done
