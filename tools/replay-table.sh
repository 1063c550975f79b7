#!/usr/bin/env bash
# Hit ratios of every policy on a trace at several capacities, each a full replay through a
# real store (real files of BS bytes). Prints a markdown table.
# usage: tools/replay-table.sh [TRACE] [DIR] [BS] [CAPACITIES...]
#   defaults: tests/data/mooncake_synthetic_trace.jsonl, a temp dir, 4k, 1000 4000 16000
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
echo "trace: $TRACE; bs=$BS; dir on $(df -T "$BASE" | awk 'NR==2 {print $2}')"
echo
echo "| capacity (blocks) | lru | admit2 | arc (default) | belady | arc vs best simple | gap to belady |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for cap in "${CAPS[@]}"; do
  declare -A hr=()
  for p in lru admit2 arc belady; do
    d="$BASE/$p-$cap"
    hr[$p]=$($BENCH --dir "$d" --rw replay --trace "$TRACE" --capacity-blocks "$cap" --policy $p --bs "$BS" --output-format json \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["errors"]==0 and d["read_misses"]==0, d; print("%.4f" % d["hit_ratio"])')
    rm -rf "$d"
  done
  python3 - "$cap" "${hr[lru]}" "${hr[admit2]}" "${hr[arc]}" "${hr[belady]}" <<'PY'
import sys
cap, lru, adm, arc, bel = sys.argv[1], *map(float, sys.argv[2:])
best = max(lru, adm)
print(f"| {int(cap):,} | {lru:.4f} | {adm:.4f} | {arc:.4f} | {bel:.4f} | {arc - best:+.4f} | {bel - arc:.4f} |")
PY
done
