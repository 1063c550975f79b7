#!/usr/bin/env bash
# Repeated hot reads through the store (sharded tree, open-file cache) against the naive
# dynamic mode (one flat directory, open+read+close per access), side by side in one run.
# Rounds alternate between the two so that machine noise hits both alike; the table gives the
# median ops/s of each and their ratio.
#
# usage: tools/compare-naive.sh [NBLOCKS] [ROUNDS] [SIZES...]   (defaults: 2000 5 4k 64k 256k)
set -euo pipefail
cd "$(dirname "$0")/.."
NBLOCKS=${1:-2000}
ROUNDS=${2:-5}
shift $(( $# > 2 ? 2 : $# )) || true
SIZES=("${@:-4k 64k 256k}")
read -r -a SIZES <<< "${SIZES[*]}"
. tools/bench-common.sh
build_bin tierkv-bench
BENCH=$B
WORK=$(mktemp -d /tmp/tierkv-naive.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(df -T "$WORK" | awk 'NR==2 {print $2}') at $WORK"
echo "nblocks=$NBLOCKS loops=10 rounds=$ROUNDS (median of rounds)"
echo
echo "| bs | verify | store ops/s | naive ops/s | ratio |"
echo "|---:|---|---:|---:|---:|"
for bs in "${SIZES[@]}"; do
  rm -rf "$WORK"/*
  $BENCH --dir "$WORK/store" --rw write --bs "$bs" --nblocks "$NBLOCKS" --output-format json > /dev/null
  $BENCH --dir "$WORK/naive" --rw write --bs "$bs" --nblocks "$NBLOCKS" --layout-depth 0 --output-format json > /dev/null
  for verify in on-open never; do
    s=(); n=()
    for _ in $(seq "$ROUNDS"); do
      s+=("$($BENCH --dir "$WORK/store" --rw randread --bs "$bs" --nblocks "$NBLOCKS" --loops 10 --batch 1 --verify $verify --no-layout --output-format json | ops_per_sec)")
      n+=("$($BENCH --dir "$WORK/naive" --rw randread --bs "$bs" --nblocks "$NBLOCKS" --loops 10 --batch 1 --verify $verify --no-layout --fd-cache 0 --output-format json | ops_per_sec)")
    done
    median_row "$bs" "$verify" "${s[*]}" "${n[*]}"
  done
done
