#!/usr/bin/env bash
# Metadata scale per layout: `tierkv-bench --rw metadata` creates N block files at shard depth
# 0, 1 and 2 (fan-out 256) in fresh trees, reopens each (index rebuild), looks every block up
# and reads every block with open+read+close, and as root reads them again after dropping the
# kernel's caches. Prints the tool's table.
#
# usage: tools/layout-scale.sh N [BS] [DIR]      e.g. tools/layout-scale.sh 1000000 512
# Needs about N * 8 KiB of disk per depth; the trees are removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?usage: layout-scale.sh N [BS] [DIR]}
BS=${2:-512}
BASE=${3:-$(mktemp -d /tmp/tierkv-layout.XXXXXX)}
. tools/bench-common.sh
build_bin tierkv-bench
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(df -T "$BASE" | awk 'NR==2 {print $2}')"
cold=()
[ "$(id -u)" = 0 ] && cold=(--invalidate)
"$B" --dir "$BASE" --rw metadata --bs "$BS" --nblocks "$N" \
  --layout-depths 0,1,2 --numjobs 2 --batch 32 "${cold[@]}"
