#!/usr/bin/env bash
# Every backend beneath its engine, side by side with the engine's own file tier, through the
# engine's own code, in one go (docs/benchmarks.md, "Beneath the engines"):
#
# 1. vLLM: our secondary tier against vLLM's `fs` tier under its TieringOffloadingManager
#    (tools/vllm-tier-bench.py: store, load, lookup call; 2 and 8 MiB chunks).
# 2. SGLang: our HiCache backend against `HiCacheFile` through HiCacheController's page
#    functions (tools/engine-bench-sglang.py: set, get cold and warm, batch_exists, restart,
#    full disk; 2 and 8 MiB pages), and the backend's Python time per batch of 128 pages
#    (tools/sglang-python-time.py).
# 3. LMCache: the plugin against `LocalDiskBackend` through LMCacheEngine, page cache warm and
#    cold (tools/lmcache-bench.py; 2 and 8 MiB chunks).
# 4. LMCache MP: our L2 adapter against LMCache's C++ `fs_native` (tools/lmcache-mp-bench.py).
# 5. vLLM served (unless --no-serve): `vllm serve` with our connector against the server alone
#    (recompute), TTFT and the decodes' latency (tools/vllm-serve-bench.py).
#
# Each tool interleaves its rounds (the backends alternate which goes first) and prints the
# per-round ratios and their median. Before each, the load average is printed: the figures
# rank the backends only on a machine with nothing else running.
#
# The virtualenvs are made if missing (tools/engines-venv.sh; minutes, once). Page-cache-cold
# rows need root (drop_caches).
#
# usage: tools/beneath-engines-bench.sh [--rounds N] [--dir DIR] [--no-serve]
#        (default 3 rounds, DIR /var/tmp/tierkv-beneath: the disk the engines' tiers would use)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
DIR=/var/tmp/tierkv-beneath
SERVE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --no-serve) SERVE=0; shift ;;
    *) echo "usage: $0 [--rounds N] [--dir DIR] [--no-serve]" >&2; exit 2 ;;
  esac
done
tools/engines-venv.sh sglang >/dev/null
tools/engines-venv.sh vllm >/dev/null
mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT

stage() {
  echo
  echo "## $1"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
  echo
}

echo "machine: $(nproc) cores, kernel $(uname -r), $DIR on $(df -T "$DIR" | awk 'NR==2 {print $1, $2}')"

stage "vLLM: the secondary tier against its fs tier"
PYTHONPATH=python .venv-vllm/bin/python tools/vllm-tier-bench.py --dir "$DIR" \
  --sizes-mib 2,8 --rounds "$ROUNDS"

stage "SGLang: the HiCache backend against HiCacheFile"
.venv-engines/bin/python tools/engine-bench-sglang.py --dir "$DIR/sglang" --page-mib 2 8 \
  --pages 32 --rounds "$ROUNDS" --full-mib 48

stage "SGLang: the backend's Python time per batch of 128 pages (cProfile)"
PYTHONPATH=python .venv-engines/bin/python tools/sglang-python-time.py 2>/dev/null

stage "LMCache: the plugin against LocalDiskBackend, page cache warm"
PYTHONPATH=python:python/tests .venv-engines/bin/python tools/lmcache-bench.py \
  --dir "$DIR/lmcache" --chunk-mib 2 8 --mib 256 --rounds "$ROUNDS"

stage "LMCache: the plugin against LocalDiskBackend, page cache cold"
PYTHONPATH=python:python/tests .venv-engines/bin/python tools/lmcache-bench.py \
  --dir "$DIR/lmcache" --chunk-mib 2 8 --mib 256 --rounds "$ROUNDS" --cold

stage "LMCache MP: the L2 adapter against fs_native"
PYTHONPATH=python .venv-engines/bin/python tools/lmcache-mp-bench.py "$DIR/lmcache-mp" \
  --chunk-mib 2 8 --chunks 128 --rounds "$ROUNDS"

if [ "$SERVE" = 1 ]; then
  stage "vLLM served: the connector against the server alone"
  .venv-vllm/bin/python tools/vllm-serve-bench.py --rounds "$ROUNDS" --workdir "$DIR/serve"
fi
stage "done"
