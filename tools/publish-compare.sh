#!/usr/bin/env bash
# Create rate of the two ways a put publishes a file (O_TMPFILE + linkat vs temp file +
# rename), alternating rounds in fresh directories of one run.
# usage: tools/publish-compare.sh [NBLOCKS] [ROUNDS] [BS]     (defaults: 50000 3 4k)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-50000}; ROUNDS=${2:-3}; BS=${3:-4k}
. tools/bench-common.sh
build_bin tierkv-bench
BENCH=$B
WORK=$(mktemp -d /tmp/tierkv-publish.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "| round | publish | files/s |"
echo "|---:|---|---:|"
for r in $(seq "$ROUNDS"); do
  for p in tmpfile rename; do
    ops=$($BENCH --dir "$WORK/$p$r" --rw write --bs "$BS" --nblocks "$N" --batch 1 --publish $p --output-format json | python3 "$BENCHSTATS" ops-per-sec --format .0f)
    echo "| $r | $p | $ops |"
  done
done
