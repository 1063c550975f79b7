#!/usr/bin/env bash
# Makes the virtualenv an engine's integration tests run in, idempotently: nothing is
# installed when the virtualenv already imports everything (a rerun takes seconds).
#
# usage: tools/engines-venv.sh sglang     (the virtualenv: .venv-sglang/, git-ignored;
#                                          ENGINES_VENV overrides the path)
#
# sglang: sglang 0.5.23 --no-deps, the torch it pins (2.14.1, from PyPI: about 3 GB to
# download, 5.5 GB installed; the CUDA build imports on a CPU-only machine) and only the
# packages its HiCache modules import (found by importing them until nothing was missing:
# docs/testing.md has the list's origin and the install times), numpy, pytest and maturin;
# then the tierkv package (python/, `maturin develop --release`, editable: later rebuilds
# into .venv-py by tools/test.sh serve this virtualenv too, the .so is abi3).
set -euo pipefail
cd "$(dirname "$0")/.."

engine="${1:-}"
case "$engine" in
  sglang) ;;
  *)
    echo "usage: tools/engines-venv.sh sglang" >&2
    exit 2
    ;;
esac

VENV="${ENGINES_VENV:-.venv-sglang}"
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PY="$VENV/bin/python"

# What the tests import (python/tests/test_sglang.py and sglang_harness.py): SGLang's
# device and host pools, allocator, controller and backend factory, and tierkv_g3.sglang.
CHECK='
import maturin, numpy, pytest, torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.observability.metrics_collector import StorageMetrics
import tierkv_g3.sglang
assert torch.__version__.startswith("2.14.1"), torch.__version__
'

if [ -x "$PY" ] && "$PY" -W ignore -c "$CHECK" >/dev/null 2>&1; then
  echo "engines-venv: $VENV imports sglang and tierkv_g3.sglang: nothing to do"
  exit 0
fi

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
pip_install() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    # sglang was installed --no-deps: pip lists its uninstalled requirements; not errors.
    grep -v -e "^sglang .* requires" -e "dependency resolver does not currently" \
      -e "^ERROR: pip's dependency resolver" || true
  return "${PIPESTATUS[0]}"
}
# torch and its pins first (one resolver run keeps them consistent), then sglang alone.
pip_install torch==2.14.1 torchvision==0.29.2 numpy pytest maturin ninja \
  transformers==5.19.0 compressed-tensors==0.18.0 apache-tvm-ffi==0.1.11 \
  sentencepiece==0.2.1 orjson psutil pybase64 requests pillow starlette msgspec pydantic \
  pyzmq tqdm IPython aiohttp dill gguf
pip_install --no-deps sglang==0.5.23
# tierkv, editable, as tools/test.sh builds it into .venv-py.
(cd python && VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop -q --release)
"$PY" -W ignore -c "$CHECK"
echo "engines-venv: $VENV ready"
