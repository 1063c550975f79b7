#!/usr/bin/env bash
# Restart: how long a store takes to open on a tree of N block files (the index is rebuilt
# from the tree: a scan of every shard directory and an fstatat of every file), warm (dentry
# and inode caches hot) and cold (after `echo 3 > /proc/sys/vm/drop_caches`, root). Times the
# whole process `tierkv-bench --rw read --nblocks 1 --no-layout` (open, one read, close) and
# reports the store's own "index rebuilt" figure (RUST_LOG=tierkv=debug).
#
# usage: tools/restart-bench.sh [NBLOCKS] [ROUNDS] [PARENT]   (defaults: 1000000 3 /tmp)
# BASELINE=path/to/another/tierkv-bench: each round also opens the same tree with that binary
# (e.g. one built from an earlier commit), interleaved, and prints the per-round ratio.
# 1-byte blocks: each file takes 8 KiB (8 GB for a million), removed at the end. PARENT is the
# directory the tree goes under (e.g. a freshly made filesystem: on a disk that has just had
# many files deleted, ext4 creates files at a fraction of its usual rate for minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}; ROUNDS=${2:-3}; PARENT=${3:-/tmp}
. tools/bench-common.sh
build_bin tierkv-bench
W=$(mktemp -d "$PARENT/tierkv-restart.XXXXXX"); trap 'rm -rf "$W"' EXIT
machine_line "$W"
t0=$(date +%s.%N)
$B --dir "$W/t" --rw write --bs 1 --nblocks "$N" --batch 1024 --output-format json >/dev/null
t1=$(date +%s.%N)
echo "created $N files in $(python3 "$BENCHSTATS" elapsed "$t0" "$t1" --format .1f) s"
sync
open_once() {
  local bin=$1 s e log
  s=$(date +%s.%N)
  log=$(RUST_LOG=tierkv=debug $bin --dir "$W/t" --rw read --bs 1 --nblocks 1 --no-layout --output-format json 2>&1 >/dev/null | grep "index rebuilt" | grep -o 'elapsed_ms=[0-9]*' | cut -d= -f2)
  e=$(date +%s.%N)
  echo "$(python3 "$BENCHSTATS" elapsed "$s" "$e") ${log:-0}"
}
round() {
  local what=$1 new old
  [ "$what" = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
  read -r np nr <<<"$(open_once "$B")"
  line="$what $r: ${np} s process, index rebuilt in ${nr} ms"
  if [ -n "${BASELINE:-}" ]; then
    [ "$what" = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
    read -r op or <<<"$(open_once "$BASELINE")"
    line="$line; baseline ${op} s, ${or} ms; rebuild ratio baseline/this $(python3 "$BENCHSTATS" ratio "$or" "$nr")"
  fi
  echo "$line"
}
$B --dir "$W/t" --rw read --bs 1 --nblocks 1 --no-layout >/dev/null 2>&1
for r in $(seq "$ROUNDS"); do round warm; done
if [ "$(id -u)" = 0 ]; then
  for r in $(seq "$ROUNDS"); do round cold; done
else
  echo "cold: not run (drop_caches needs root)"
fi
