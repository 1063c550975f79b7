#!/usr/bin/env bash
# Puts into fresh trees: `tierkv-bench --rw write` of MIB MiB of blocks
# (default 512) in put_many batches of 16, each run into a new store removed after it, with
# the default layout (whatever a new store picks) against the seed's flat naive mode
# (`--layout-depth 0 --fd-cache 0`), and with BASELINE=path/to/another/tierkv-bench (e.g.
# built from the commit before) that binary's default layout too. Interleaved round by round,
# the order rotating each round, `sync` between runs (no run pays for another's writeback).
# Prints each round's MiB/s and the layout each default run recorded, then per size the
# median of the per-round ratios to naive with their spread (min-max).
#
# usage: tools/fresh-put-bench.sh [ROUNDS] [SIZES...]   (defaults: 5 64k 2m)
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
rounds_and_sizes 5 "64k 2m" "$@"
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-fresh-put.XXXXXX); trap 'rm -rf "$W"' EXIT
machine_line "$W"
echo "binary: $B (commit $(git rev-parse --short HEAD))${BASELINE:+; baseline: $BASELINE}; ${MIB:-512} MiB per run, batches of 16"
# A copy: another build into the same target directory cannot swap it mid-run.
cp "$B" "$W/tierkv-bench"; B="$W/tierkv-bench"
# run NAME BINARY ARGS...: one run into a fresh tree; prints "NAME MiB/s layout".
run() {
  local name=$1 bin=$2; shift 2
  rm -rf "$W/t"; sync
  local bw
  bw=$("$bin" --dir "$W/t" --rw write --bs "$bs" --nblocks "$n" --batch 16 "$@" \
         --output-format json |
       python3 "$BENCHSTATS" field bw_bytes_per_sec --scale 1048576 --check errors)
  local layout
  layout=$(tr '\n' ' ' < "$W/t/v1/0/LAYOUT" | sed 's/depth=\([0-9]*\) fanout=\([0-9]*\) /\1x\2/')
  rm -rf "$W/t"; sync
  echo "$name $bw $layout"
}
for bs in "${SIZES[@]}"; do
  n=$(( ${MIB:-512} * 1024 / ($(size_bytes "$bs") / 1024) ))
  out="$W/rows.$bs"; : > "$out"
  names=(naive default); [ -n "${BASELINE:-}" ] && names+=(baseline)
  for r in $(seq "$ROUNDS"); do
    line=""
    for i in "${!names[@]}"; do
      name=${names[$(( (i + r) % ${#names[@]} ))]}
      case $name in
        naive) res=$(run naive "$B" --layout-depth 0 --fd-cache 0) ;;
        default) res=$(run default "$B") ;;
        baseline) res=$(run baseline "$BASELINE") ;;
      esac
      line="$line $res;"
    done
    echo "$line" >> "$out"
    echo "$bs round $r:$line"
  done
  python3 "$BENCHSTATS" fresh-put-table "$bs" "$n" "$out"
done
