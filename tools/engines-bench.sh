#!/usr/bin/env bash
# Random reads of whole blocks through tierkv's psync and io_uring engines and through fio's
# io_uring engine, on the same block files, side by side: 64 KiB and 256 KiB blocks, queue
# depth (tierkv: blocks per get_many) 1 and 32, buffered and O_DIRECT. Installs fio if missing.
# usage: tools/engines-bench.sh [NBLOCKS] [SECONDS]      (defaults: 1000 4)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}; SECS=${2:-4}
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
cargo build --release --quiet --bin tierkv-bench
B=target/release/tierkv-bench
W=$(mktemp -d /tmp/tierkv-engines.XXXXXX); trap 'rm -rf "$W"' EXIT
mibs() { python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["bw_bytes_per_sec"] / 1048576))'; }
echo "machine: $(nproc) cores, kernel $(uname -r), $(df -T "$W" | awk 'NR==2 {print $2}'), fio $(fio --version)"
echo
echo "| bs | qd | direct | fio io_uring MiB/s | tierkv psync MiB/s | tierkv io_uring MiB/s | io_uring / fio |"
echo "|---:|---:|---|---:|---:|---:|---:|"
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
      # next tierkv run recreates them).
      rm -f "$d/v1/0/LAYOUT" "$d/v1/0/STATS.json" "$d/v1/0/.lock"
      f=$(fio --name=blocks --opendir="$d/v1/0" --rw=randread --bs=$bs --ioengine=io_uring \
            --iodepth=$qd --direct=$direct --invalidate=$direct --time_based --runtime="$SECS" --file_service_type=random \
            --openfiles=4096 --output-format=json 2>/dev/null \
          | python3 -c 'import json,sys; t=sys.stdin.read(); print("%.0f" % (json.loads(t[t.index("{"):])["jobs"][0]["read"]["bw_bytes"] / 1048576))')
      res=()
      for eng in psync io_uring; do
        # Enough passes over the blocks to run for about SECS seconds at fio's rate.
        loops=$(python3 -c "import math; print(max(1, math.ceil($f * 1048576 * $SECS / ($N * $(numfmt --from=iec ${bs^^})))))")
        res+=("$($B --dir "$d" --rw randread --bs $bs --nblocks "$N" --loops "$loops" --iodepth $qd \
                 --ioengine $eng $dflag --verify never --no-layout --output-format json | mibs)")
      done
      python3 -c "print('| $bs | $qd | $([ $direct = 1 ] && echo yes || echo no) | $f | ${res[0]} | ${res[1]} | %.2fx |' % (${res[1]} / max($f, 1)))"
    done
  done
done
