#!/usr/bin/env bash
# Puts into fresh trees (issue 28 part 2): `tierkv-bench --rw write` of MIB MiB of blocks
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
       python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["errors"]==0, d; print(d["bw_bytes_per_sec"] / 1048576)')
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
  python3 - "$bs" "$n" "$out" <<'PY'
import statistics, sys
bs, n, path = sys.argv[1:4]
rounds = []
for l in open(path):
    runs = [x.split() for x in l.split(";") if x.strip()]
    rounds.append({name: (float(bw), lay) for name, bw, lay in runs})
names = [k for k in ("default", "baseline") if k in rounds[0]]
print(f"| bs | blocks | run | layout | median MiB/s | ratio to naive (median) | spread |")
print("|---:|---:|---|---|---:|---:|---|")
med = statistics.median(r["naive"][0] for r in rounds)
print(f"| {bs} | {n} | naive (flat) | 0x256 | {med:,.0f} | 1.00x | |")
for k in names:
    ratios = [r[k][0] / r["naive"][0] for r in rounds]
    lay = ",".join(sorted({r[k][1] for r in rounds}))
    m = statistics.median(r[k][0] for r in rounds)
    print(f"| {bs} | {n} | {k} | {lay} | {m:,.0f} | {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x |")
if "baseline" in names:
    ratios = [r["default"][0] / r["baseline"][0] for r in rounds]
    print(f"\n{bs}: default / baseline {statistics.median(ratios):.2f}x (spread {min(ratios):.2f}-{max(ratios):.2f}x)")
PY
done
