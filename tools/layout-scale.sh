#!/usr/bin/env bash
# Metadata scale per layout: creates N block files at shard depth 0, 1 and 2 (fan-out 256),
# then reads every block once in random order with open+read+close per access (--fd-cache 0),
# warm and (as root) after dropping the page cache. Prints a markdown table.
#
# usage: tools/layout-scale.sh N [BS] [DIR]      e.g. tools/layout-scale.sh 1000000 512
# Needs about N * 8 KiB of disk per depth; the trees are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: layout-scale.sh N [BS] [DIR]}
BS=${2:-512}
BASE=${3:-$(mktemp -d /tmp/tierkv-layout.XXXXXX)}
cargo build --release --quiet --bin tierkv-bench
BENCH=target/release/tierkv-bench
trap 'rm -rf "$BASE"' EXIT
ops() { python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.0f %d" % (d["ops_per_sec"], d["misses"] + d["errors"]))'; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(df -T "$BASE" | awk 'NR==2 {print $2}')"
echo "N=$N files of $BS-byte payload per depth"
echo
echo "| files | depth | create files/s | warm open+read files/s | cold open+read files/s |"
echo "|---:|---:|---:|---:|---:|"
for depth in 0 1 2; do
  d="$BASE/d$depth"
  read -r create _ < <($BENCH --dir "$d" --rw write --bs "$BS" --nblocks "$N" --layout-depth "$depth" --output-format json | ops)
  read -r warm bad < <($BENCH --dir "$d" --rw randread --bs "$BS" --nblocks "$N" --fd-cache 0 --no-layout --output-format json | ops)
  [ "$bad" = 0 ] || { echo "depth $depth: $bad misses or errors" >&2; exit 1; }
  cold=n/a
  if drop_caches; then
    # A sample of the blocks, read cold (the full set would take minutes at cold rates).
    read -r cold _ < <($BENCH --dir "$d" --rw randread --bs "$BS" --nblocks "$(( N < 50000 ? N : 50000 ))" --fd-cache 0 --no-layout --output-format json | ops)
  fi
  printf "| %s | %s | %s | %s | %s |\n" "$N" "$depth" "$create" "$warm" "$cold"
done
