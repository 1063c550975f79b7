#!/usr/bin/env bash
# Makes the virtualenv the engines' integration tests run in, idempotently: nothing is
# installed when the virtualenv already imports everything (a rerun takes seconds).
#
# usage: tools/engines-venv.sh sglang|lmcache
#        (both: the one virtualenv .venv-engines/, git-ignored; ENGINES_VENV overrides the
#        path; TIERKV_BUILD_LOCK=FILE runs the tierkv build under `flock FILE`)
#
# sglang 0.5.23 and lmcache 0.5.6 pin the same torch (2.14.1, from PyPI: about 3 GB to
# download, 5.5 GB installed; the CUDA build imports on a CPU-only machine), so they share
# one virtualenv: both --no-deps, with only the packages their tested modules import (found
# by importing them until nothing was missing: docs/testing.md has the lists' origin and the
# install times), numpy, pytest and maturin; then the tierkv package (python/, `maturin
# develop --release`, editable: later rebuilds into .venv-py by tools/test.sh serve this
# virtualenv too, the .so is abi3), unless tierkv_g3 already imports (PYTHONPATH=python).
set -euo pipefail
cd "$(dirname "$0")/.."

engine="${1:-}"
case "$engine" in
  sglang | lmcache) ;;
  *)
    echo "usage: tools/engines-venv.sh sglang|lmcache" >&2
    exit 2
    ;;
esac

VENV="${ENGINES_VENV:-.venv-engines}"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PY="$VENV/bin/python"

# What the tests import: python/tests/test_sglang.py and sglang_harness.py (SGLang's device
# and host pools, allocator, controller and backend factory, tierkv_g3.sglang);
# python/tests/test_lmcache.py and lmcache_harness.py (LMCache's engine, config, metadata,
# storage backends, tierkv_g3.lmcache); and LMCache's multiprocess server (its MP-mode
# native_plugin L2 adapter).
CHECK='
import maturin, numpy, pytest, torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import NativePluginL2AdapterConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.multiprocess import server
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.observability.metrics_collector import StorageMetrics
import tierkv_g3.lmcache, tierkv_g3.sglang
assert torch.__version__.startswith("2.14.1"), torch.__version__
'

if [ -x "$PY" ] && "$PY" -W ignore -c "$CHECK" >/dev/null 2>&1; then
  echo "engines-venv: $VENV imports sglang, lmcache and tierkv_g3's backends: nothing to do"
  exit 0
fi

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
pip_install() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    # The engines are installed --no-deps: pip lists their uninstalled requirements (and
    # lmcache's numpy/setuptools pins, unused by the modules tested); not errors.
    grep -v -e "^sglang .* requires" -e "^lmcache .* requires" -e "dependency resolver does not currently" \
      -e "^ERROR: pip's dependency resolver" || true
  return "${PIPESTATUS[0]}"
}
# torch and its pins first (one resolver run keeps them consistent), then the engines alone.
# The second line is LMCache's: numba at sglang's pin (0.65.1; lmcache takes any), the
# rest what its engine, storage backends and multiprocess server import.
pip_install torch==2.14.1 torchvision==0.29.2 numpy pytest maturin ninja \
  transformers==5.19.0 compressed-tensors==0.18.0 apache-tvm-ffi==0.1.11 \
  sentencepiece==0.2.1 orjson psutil pybase64 requests pillow starlette msgspec pydantic \
  pyzmq tqdm IPython aiohttp dill gguf \
  numba==0.65.1 prometheus_client py-cpuinfo cachetools sortedcontainers aiofile \
  cryptography "opentelemetry-api<=1.40.0" opentelemetry-sdk httpx fastapi uvicorn
pip_install --no-deps sglang==0.5.23 lmcache==0.5.6
# tierkv, editable, as tools/test.sh builds it into .venv-py (unless it already imports).
if ! "$PY" -c "import tierkv_g3" >/dev/null 2>&1; then
  (cd python && VIRTUAL_ENV="$VENV" ${TIERKV_BUILD_LOCK:+flock "$TIERKV_BUILD_LOCK"} \
    "$VENV/bin/maturin" develop -q --release)
fi
"$PY" -W ignore -c "$CHECK"
echo "engines-venv: $VENV ready"
