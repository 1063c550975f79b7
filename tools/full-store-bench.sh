#!/usr/bin/env bash
# A full store against an empty one: put throughput and per-call latency of N new blocks into
# an empty store bounded at N blocks, and into the same store when it holds N blocks already
# (every put evicts one: --key-offset gives new keys), buffered, O_DIRECT and synced
# (--sync-writes), on ext4 and XFS, each a fresh loop-device filesystem (root: losetup, mkfs,
# mount). Rounds interleave empty and full; the table gives the median of the per-round ratios
# full / empty.
#
# usage: tools/full-store-bench.sh [ROUNDS] [BS] [NBLOCKS] [FILESYSTEMS...]
#        (defaults: 3 2m 128 ext4 xfs; each filesystem image is 4 GiB, removed at the end)
# A filesystem given as dir:PATH runs in a fresh directory under PATH on the filesystem already
# there (e.g. dir:/var/tmp, the VM's own disk) instead of a loop device. TYPE:OPTIONS mounts the
# loop device with those mount options (e.g. ext4:discard, online discard: each freed extent is
# trimmed when the journal commits).
# Each mode's first row is the store's default: evicted files reused (each eviction inline in
# the put that needs the room, its file taken for the new block) where the filesystem grants
# write leases; the last column says how many evictions reused their file. UNLINK=1 adds, after
# each mode, rows with --reuse-evicted false (evicted files unlinked, the background evictor at
# the default watermarks 0.95,0.90), and INLINE=1 rows with --reuse-evicted false --watermarks
# 1,1 (unlinked, every eviction inline), rounds of their own. MODES="direct" (any of buffered,
# direct, sync) runs only those modes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${REUSE:-}" ]; then
  echo "tools/full-store-bench.sh: REUSE=1 is gone: reuse is the store's default now (each mode's first row); UNLINK=1 and INLINE=1 add the unlinking rows" >&2
  exit 2
fi
ROUNDS=${1:-3}; BS=${2:-2m}; N=${3:-128}
shift $(( $# > 2 ? 3 : $# )) || true
FSS=("${@:-ext4 xfs}")
read -r -a FSS <<< "${FSS[*]}"
[ "$(id -u)" = 0 ] || { echo "tools/full-store-bench.sh: needs root (loop devices)" >&2; exit 1; }
. tools/bench-common.sh
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-full.XXXXXX)
LOOP=""
cleanup() {
  if mountpoint -q "$W/mnt" 2>/dev/null; then umount "$W/mnt"; fi
  if [ -n "$LOOP" ]; then losetup -d "$LOOP" 2>/dev/null || true; fi
  if [ -n "${M:-}" ] && [ "$M" != "$W/mnt" ]; then rm -rf "$M"; fi
  rm -rf "$W"
}
trap cleanup EXIT
echo "machine: $(nproc) cores, kernel $(uname -r), loop devices on $(df -T "$W" | awk 'NR==2 {print $2}') on $(df "$W" | awk 'NR==2 {print $1}') (dir:PATH: that filesystem itself), $(date -u +%F)"
echo "bs=$BS nblocks=$N (capacity $N blocks), put_many of 32 through io_uring at depth 32"
# A run's figures (bw, p50, p99, p99.9, evictions, reused files); a run with an error fails.
t_json() {
  python3 "$BENCHSTATS" bench-json write --check errors --extra evictions --extra store.reused_files=0
}
MODES=${MODES:-buffered direct sync}
MODES=$(for m in $MODES; do
  echo "$m"
  if [ "${UNLINK:-0}" = 1 ]; then echo "$m-unlink"; fi
  if [ "${INLINE:-0}" = 1 ]; then echo "$m-inline"; fi
done | xargs)
for fs in "${FSS[@]}"; do
  if [ "${fs#dir:}" != "$fs" ]; then
    # M is where the trees go: a directory on an existing filesystem, or the loop mount.
    M=$(mktemp -d "${fs#dir:}/tierkv-full.XXXXXX")
  else
    truncate -s 4G "$W/img"
    LOOP=$(losetup --find --show "$W/img")
    fstype=${fs%%:*}; opts=""
    if [ "$fstype" != "$fs" ]; then opts="-o ${fs#*:}"; fi
    if [ "$fstype" = xfs ]; then mkfs.xfs -q -f "$LOOP"; else mkfs.ext4 -q -F "$LOOP"; fi
    # shellcheck disable=SC2086 # $opts is empty or one -o OPTIONS pair
    mkdir -p "$W/mnt"; mount $opts "$LOOP" "$W/mnt"
    M="$W/mnt"
  fi
  for mode in $MODES; do
    flags=(--ioengine io_uring --iodepth 32 --batch 32 --capacity-blocks "$N")
    case $mode in direct*) flags+=(--direct) ;; sync*) flags+=(--sync-writes) ;; esac
    case $mode in
      *-unlink) flags+=(--reuse-evicted false) ;;
      *-inline) flags+=(--reuse-evicted false --watermarks 1,1) ;;
    esac
    out="$W/rows.${fs//[^a-z0-9]/_}.$mode"; : > "$out"
    for r in $(seq "$ROUNDS"); do
      rm -rf "$M/e" "$M/f"; sync
      # Full: N blocks first (not timed), then N new ones, each evicting one.
      $B --dir "$M/f" --rw write --bs "$BS" --nblocks "$N" "${flags[@]}" --output-format json >/dev/null
      sync
      e=$($B --dir "$M/e" --rw write --bs "$BS" --nblocks "$N" "${flags[@]}" --output-format json | t_json)
      sync
      f=$($B --dir "$M/f" --rw write --bs "$BS" --nblocks "$N" --key-offset "$N" "${flags[@]}" --output-format json | t_json)
      echo "$e $f" >> "$out"
    done
    python3 "$BENCHSTATS" full-store-row "$fs" "$mode" "$BS" "$out"
  done
  if [ -n "$LOOP" ]; then
    umount "$W/mnt"; losetup -d "$LOOP"; LOOP=""; rm -f "$W/img"
  else
    rm -rf "$M"
  fi
done
