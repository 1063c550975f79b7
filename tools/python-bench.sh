#!/usr/bin/env bash
# The Python package's benchmark (docs/python.md): builds the package (release, into the
# .venv-py/ that tools/test.sh makes) and the Rust side (examples/interop.rs, release), then
# runs python/examples/bench.py: a 2 MiB get from Python vs from Rust, and thread scaling.
#   tools/python-bench.sh [bench.py options, e.g. --rounds 9 --dir /mnt/nvme]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/bench-common.sh
VENV=.venv-py
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c "import maturin, numpy" 2>/dev/null ||
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check maturin numpy
(cd python && VIRTUAL_ENV="$PWD/../$VENV" "../$VENV/bin/maturin" develop -q --release)
cargo build --release --quiet --example interop
"$VENV/bin/python" python/examples/bench.py --rust "$(target_dir)/release/examples/interop" "$@"
