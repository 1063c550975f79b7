#!/usr/bin/env bash
# The TTFT table of docs/engine-api.md: candle's Llama 2 (--model small, random weights) beneath
# tierkv, per prompt length, 3/4 of the prompt shared with an earlier request; the prefix
# warm in the page cache, then cold (O_DIRECT reads of files dropped from the page cache).
# Usage: tools/engine-ttft.sh [PROMPT_TOKENS...]   (default 1024 2048 4096)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p engine_e2e
. tools/bench-common.sh
bin="$(target_dir)/release/engine_e2e"
lengths=("${@:-1024 2048 4096}")
# shellcheck disable=SC2068
for p in ${lengths[@]}; do
  s=$((p * 3 / 4))
  for mode in warm cold; do
    extra=()
    [ "$mode" = cold ] && extra=(--direct --invalidate)
    "$bin" --model small --prompt-tokens "$p" --shared-tokens "$s" --output-format json "${extra[@]}" |
      python3 "$BENCHSTATS" ttft-row "$mode"
  done
done
