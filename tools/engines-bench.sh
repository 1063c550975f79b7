#!/usr/bin/env bash
# The engines side by side on the same block files, against fio's io_uring engine:
#
# 1. Random reads of whole blocks (64 KiB, 256 KiB), queue depth 1 and 32, buffered and
#    O_DIRECT: fio; tierkv psync; tierkv io_uring with one batch of QD blocks per get_many
#    (a barrier after each batch); tierkv io_uring "streamed" (batches of 8 x QD blocks through
#    a ring of depth QD: QD reads in flight, refilled as each completes, as fio does); and,
#    when the NIXL library is present (tools/fetch-nixl.sh), the nixl engine with its POSIX
#    backend on libaio and on io_uring, batches of QD blocks.
# 2. Random writes of whole blocks, queue depth 32: fio creating and writing one file per
#    block vs tierkv io_uring put_many replacing the blocks of a laid-out tree (temp file,
#    write, rename, batches of 32).
#
# Installs fio if missing. usage: tools/engines-bench.sh [NBLOCKS] [SECONDS]  (default 1000 4)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; SECS=${2:-4}
. tools/bench-common.sh
need_fio
build_bench
W=$(mktemp -d /tmp/tierkv-engines.XXXXXX); trap 'rm -rf "$W"' EXIT
# A run's MiB/s (a run with an error or a miss fails); fio's (read or write); A / max(B, 1).
mibs() {
  python3 "$BENCHSTATS" field bw_bytes_per_sec --scale 1048576 --format .0f --check errors --check misses
}
fio_mibs() { python3 "$BENCHSTATS" fio-mibs "$1"; }
ratio() { python3 "$BENCHSTATS" ratio "$1" "$2"; }
echo "machine: $(nproc) cores, kernel $(uname -r), $(df -T "$W" | awk 'NR==2 {print $2}'), fio $(fio --version)"
echo
echo "Random reads (MiB/s):"
echo
echo "| bs | qd | direct | fio io_uring (before / after) | psync | io_uring | io_uring streamed | nixl libaio | nixl uring | io_uring / fio | streamed / fio |"
echo "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for bs in 64k 256k; do
  d="$W/$bs"
  $B --dir "$d" --rw write --bs $bs --nblocks "$N" >/dev/null
  for direct in 0 1; do
    for qd in 1 32; do
      [ $direct = 1 ] && dflag=--direct || dflag=
      # Buffered rows compare hot page-cache reads (one warm-up pass first); direct rows
      # start from a dropped cache.
      if [ $direct = 1 ]; then
        sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
      else
        $B --dir "$d" --rw read --bs $bs --nblocks "$N" --no-layout --output-format json >/dev/null
      fi
      # fio reads the block files' first bs bytes at random, files chosen at random.
      # Only block files under the directory fio walks: the store's own small files go (the
      # next tierkv run recreates them) and LAYOUT waits aside (the store refuses a tree of
      # block files without it). fio runs before and after the tierkv runs (the host under
      # this VM caches the disk too, so later runs can be faster); ratios use the better fio
      # figure.
      fio_read() {
        local rc=0 mibs
        rm -f "$d/v1/0/STATS.json" "$d/v1/0/.lock"
        mv "$d/v1/0/LAYOUT" "$d/LAYOUT.aside"
        mibs=$(fio --name=blocks --opendir="$d/v1/0" --rw=randread --bs=$bs --ioengine=io_uring \
            --iodepth=$qd --direct=$direct --invalidate=$direct --time_based --runtime="$SECS" --file_service_type=random \
            --openfiles=4096 --output-format=json 2>/dev/null | fio_mibs read) || rc=$?
        mv "$d/LAYOUT.aside" "$d/v1/0/LAYOUT"
        echo "$mibs"
        return $rc
      }
      f1=$(fio_read)
      f=$f1
      # Enough passes over the blocks to run for about SECS seconds at fio's rate.
      loops=$(python3 "$BENCHSTATS" passes "$f" "$SECS" "$N" "$bs")
      t() { $B --dir "$d" --rw randread --bs $bs --nblocks "$N" --loops "$loops" $dflag --verify never --no-layout --output-format json "$@" | mibs; }
      ps=$(t --ioengine psync --batch $qd)
      ur=$(t --ioengine io_uring --batch $qd)
      st=$(t --ioengine io_uring --batch $((qd * 8)) --iodepth $qd)
      if [ $NIXL = 1 ]; then
        na=$(t --ioengine nixl --nixl-posix-queue libaio --batch $qd)
        nu=$(t --ioengine nixl --nixl-posix-queue uring --batch $qd)
      else
        na=-; nu=-
      fi
      f2=$(fio_read)
      f=$(( f1 > f2 ? f1 : f2 ))
      echo "| $bs | $qd | $([ $direct = 1 ] && echo yes || echo no) | $f1 / $f2 | $ps | $ur | $st | $na | $nu | $(ratio "$ur" "$f") | $(ratio "$st" "$f") |"
    done
  done
done
echo
echo "Random writes of whole blocks, qd 32 (MiB/s), $((N * 4)) blocks: fio creates and writes one"
echo "file per block in an empty directory; tierkv replaces every block of a laid-out tree (a temp"
echo "file written, renamed over the old one), 32 blocks per put_many. Both make a new inode per block."
echo
echo "| bs | direct | fio io_uring | tierkv io_uring | tierkv / fio |"
echo "|---:|---|---:|---:|---:|"
NW=$((N * 4))
for bs in 64k 256k; do
  td="$W/tk-w$bs"
  $B --dir "$td" --rw write --bs $bs --nblocks "$NW" --output-format json >/dev/null
  for direct in 0 1; do
    [ $direct = 1 ] && dflag=--direct || dflag=
    fd="$W/fio-w$bs$direct"; mkdir -p "$fd"
    sync
    f=$(fio --name=w --directory="$fd" --nrfiles="$NW" --filesize=$bs --bs=$bs --rw=write \
          --ioengine=io_uring --iodepth=32 --direct=$direct --create_on_open=1 --fallocate=none \
          --file_service_type=sequential --openfiles=32 --output-format=json 2>/dev/null | fio_mibs write)
    rm -rf "$fd"
    sync
    tk=$($B --dir "$td" --rw randwrite --bs $bs --nblocks "$NW" --ioengine io_uring --batch 32 $dflag --output-format json | mibs)
    echo "| $bs | $([ $direct = 1 ] && echo yes || echo no) | $f | $tk | $(ratio "$tk" "$f") |"
  done
  rm -rf "$td"
done
