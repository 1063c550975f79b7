#!/usr/bin/env bash
# Hit ratios of every policy on a trace at several capacities, each a full replay through a
# real store (real files of BS bytes). Prints a markdown table.
# usage: tools/replay-table.sh [TRACE|all] [DIR] [BS] [CAPACITIES...]
#   defaults: tests/data/mooncake_synthetic_trace.jsonl, a temp dir, 4k, 1000 4000 16000
#   all: the shared trace and every shape of tools/gen-trace.py (seed 1, 4,000 requests), a
#   row per shape and capacity
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE=${1:-tests/data/mooncake_synthetic_trace.jsonl}
BASE=${2:-$(mktemp -d /tmp/tierkv-replay.XXXXXX)}
BS=${3:-4k}
shift $(( $# > 3 ? 3 : $# )) || true
CAPS=("$@"); [ ${#CAPS[@]} -gt 0 ] || CAPS=(1000 4000 16000)
. tools/bench-common.sh
build_bin tierkv-bench
BENCH=$B
declare -A TRACES=()
if [ "$TRACE" = all ]; then
  mkdir -p "$BASE/traces"
  TRACES[mooncake]=tests/data/mooncake_synthetic_trace.jsonl
  for s in $(python3 tools/gen-trace.py --list); do
    python3 tools/gen-trace.py "$s" --seed 1 --requests 4000 >"$BASE/traces/$s.jsonl"
    TRACES[$s]=$BASE/traces/$s.jsonl
  done
else
  TRACES[$(basename "$TRACE" .jsonl)]=$TRACE
fi
echo "bs=$BS; dir on $(df -T "$BASE" | awk 'NR==2 {print $2}'); $(uname -r); $(nproc) CPUs"
echo
echo "| trace | capacity (blocks) | lru | admit2 | arc | adaptive (default) | belady | default vs best simple | gap to belady |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for name in $(printf '%s\n' "${!TRACES[@]}" | sort); do
  for cap in "${CAPS[@]}"; do
    declare -A hr=()
    for p in lru admit2 arc adaptive belady; do
      d="$BASE/$p-$cap"
      hr[$p]=$($BENCH --dir "$d" --rw replay --trace "${TRACES[$name]}" --capacity-blocks "$cap" --policy $p --bs "$BS" --output-format json \
        | python3 "$BENCHSTATS" field hit_ratio --format .4f --check errors --check read_misses)
      rm -rf "$d"
    done
    python3 "$BENCHSTATS" replay-row "$name" "$cap" "${hr[lru]}" "${hr[admit2]}" "${hr[arc]}" "${hr[adaptive]}" "${hr[belady]}"
  done
done
