#!/usr/bin/env bash
# Prefix loads: the first read of each block after it is opened, page cache warm, each pass a
# fresh process (what every real prefix load is: no descriptor is cached yet). The store (its
# sharded tree and open-file cache, each --verify mode) against the seed's naive mode (one
# flat directory, open + read + close on one thread, no checksum: `--layout-depth 0 --fd-cache 0 --read-threads 1 --verify
# never`), interleaved round by round; the table gives the median of the per-round ratios to
# naive and the median bandwidth and per-call latency percentiles of each. Mode on-open-1t is
# on-open with every read on the calling thread (--read-threads 1).
#
# usage: tools/prefix-load-bench.sh [ROUNDS] [SIZES...]   (defaults: 5 64k 256k 2m 8m 32m)
# Each size writes about 600 MiB twice (store and naive trees), removed at the end.
# BASELINE=path/to/another/tierkv-bench adds the mode "baseline": that binary (e.g. one built
# from an earlier commit) reading the store's tree in every round, in its default verify mode
# or in BASELINE_VERIFY's.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bench-common.sh
rounds_and_sizes 5 "64k 256k 2m 8m 32m" "$@"
build_bin tierkv-bench
W=$(mktemp -d /tmp/tierkv-prefix.XXXXXX); trap 'rm -rf "$W"' EXIT
machine_line "$W"
echo "rounds=$ROUNDS; per round each mode is one fresh process reading every block once (--rw read --loops 1)"
MODES="naive on-open on-open-1t after-reboot never always"
if [ -n "${BASELINE:-}" ]; then MODES+=" baseline"; fi
for bs in "${SIZES[@]}"; do
  bytes=$(size_bytes "$bs")
  n=$(( (600 << 20) / bytes )); [ "$n" -lt 16 ] && n=16
  batch=$(( n < 64 ? n : 64 )); [ "$bytes" -ge $((32 << 20)) ] && batch=16
  rm -rf "$W"/s "$W"/n
  $B --dir "$W/s" --rw write --bs "$bs" --nblocks "$n" --output-format json >/dev/null
  $B --dir "$W/n" --rw write --bs "$bs" --nblocks "$n" --layout-depth 0 --output-format json >/dev/null
  # Warm: every file read once (the page cache holds both trees).
  find "$W" -type f -exec cat {} + >/dev/null
  out="$W/rows.$bs"; : > "$out"
  for r in $(seq "$ROUNDS"); do
    line=""
    for m in $MODES; do
      bin=$B
      if [ "$m" = naive ]; then
        args=(--dir "$W/n" --fd-cache 0 --verify never --read-threads 1)
      elif [ "$m" = on-open-1t ]; then
        args=(--dir "$W/s" --verify on-open --read-threads 1)
      elif [ "$m" = baseline ]; then
        bin=$BASELINE; args=(--dir "$W/s" ${BASELINE_VERIFY:+--verify "$BASELINE_VERIFY"})
      else
        args=(--dir "$W/s" --verify "$m")
      fi
      line+=" $($bin "${args[@]}" --rw read --bs "$bs" --nblocks "$n" --loops 1 --batch "$batch" --no-layout --output-format json |
        python3 "$BENCHSTATS" bench-json read --check errors --check misses)"
    done
    echo "$line" >> "$out"
  done
  # shellcheck disable=SC2086 # $MODES: one column name each
  python3 "$BENCHSTATS" rounds-table "$out" $MODES --keys "bs=$bs" --name mode \
    --title "$bs: $n blocks, get_many of $batch; GB/s per round" --round-label "ratios to naive" \
    --ratio-header "ratio to naive (median of rounds)" --bw GB/s --lat ms --lat-digits 2
done
