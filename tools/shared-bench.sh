#!/usr/bin/env bash
# The figures of docs/shared.md: shared against exclusive mode (cargo bench --bench shared) on
# a local filesystem and on the GlusterFS volume of tools/dfs.sh (its two nodes' mounts), each
# beside fio on the same mount: puts of block files (create + write, --create_on_open) with
# 1, 2 and 4 writers, and reads of them.
#
#   tools/shared-bench.sh [LOCAL_DIR] [BS] [BLOCKS]      (defaults: /var/tmp, 262144, 256)
#
# The volume part runs when tools/dfs.sh is up (root); it is left as it was found.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCAL=${1:-/var/tmp}
BS=${2:-262144}
BLOCKS=${3:-256}
ROUNDS=${TIERKV_SHARED_ROUNDS:-5}
echo "machine: $(uname -r), $(nproc) cores; local: $(df -T "$LOCAL" | awk 'NR==2 {print $2, $1}')"
source tools/bench-common.sh
cargo bench --bench shared --no-run -q 2>/dev/null
BIN=$(ls -t "$(target_dir)"/release/deps/shared-* | grep -v '\.d$' | head -1)

# fio: create + write BLOCKS files of BS with N jobs (each its own files), then read them.
fio_puts() {
  local dir=$1 jobs=$2 d
  d=$(mktemp -d "$dir/fio.XXXXXX")
  fio --name=put --directory="$d" --ioengine=psync --rw=write --bs="$BS" \
    --filesize="$BS" --nrfiles=$((BLOCKS / jobs)) --create_on_open=1 \
    --file_service_type=sequential --numjobs="$jobs" --group_reporting \
    --output-format=json 2>/dev/null |
    python3 "$BENCHSTATS" fio-mibs write --format .1f
  rm -rf "$d"
}

run_on() {
  local what=$1 dirs=$2 fiodir=$3
  echo
  echo "## $what (TIERKV_SHARED_DIRS=$dirs, bs $BS, $BLOCKS blocks, $ROUNDS rounds)"
  TIERKV_SHARED_DIRS=$dirs TIERKV_SHARED_BS=$BS TIERKV_SHARED_BLOCKS=$BLOCKS \
    TIERKV_SHARED_ROUNDS=$ROUNDS "$BIN" --bench | tail -n +2
  echo
  echo "| fio on the same mount (create + write, psync) | MiB/s |"
  echo "| --- | ---: |"
  for j in 1 2 4; do
    echo "| fio, $j writers | $(fio_puts "$fiodir" "$j") |"
  done
}

run_on "local ($LOCAL)" "$LOCAL" "$LOCAL"
if [ "$(id -u)" = 0 ] && tools/dfs.sh status >/dev/null 2>&1; then
  run_on "GlusterFS, stores on both nodes' mounts" "/mnt/tierkv-dfs/n1:/mnt/tierkv-dfs/n2" /mnt/tierkv-dfs/n1
else
  echo
  echo "(the GlusterFS volume is not up: tools/dfs.sh up, as root, then run this again)"
fi
