# Sourced by the benchmark scripts (from the repository root).
# need_fio: installs fio if missing. target_dir: cargo's target directory, as cargo itself
# resolves it (CARGO_TARGET_DIR, build.target-dir, else target/). build_bin BIN [FEATURE]:
# builds BIN in release with the tools feature (and FEATURE) and sets B to its path there.
# build_bench: builds tierkv-bench, with the nixl engine when the NIXL library is present
# (tools/fetch-nixl.sh); sets B (the binary) and NIXL (1 when the nixl engine is available,
# else 0).

need_fio() {
  command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
}

target_dir() {
  cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'
}

build_bin() {
  cargo build --release --quiet --features "tools${2:+,$2}" --bin "$1"
  B="$(target_dir)/release/$1"
}

build_bench() {
  NIXL=0
  if [ -e .nixl/lib/libnixl_capi.so ] || [ -n "${TIERKV_NIXL_DIR:-}" ]; then NIXL=1; fi
  if [ $NIXL = 1 ]; then
    build_bin tierkv-bench nixl
  else
    build_bin tierkv-bench
  fi
}

# ops_per_sec: the ops/s of a tierkv-bench JSON report on stdin.
ops_per_sec() {
  python3 -c 'import json,sys; print(json.load(sys.stdin)["ops_per_sec"])'
}

# median_row A B "X1 X2 ..." "Y1 Y2 ...": a markdown row `| A | B | median X | median Y |
# ratio |` of two sets of rounds measured side by side.
median_row() {
  python3 - "$@" <<'PY'
import statistics, sys
a, b = sys.argv[1], sys.argv[2]
xs, ys = ([float(v) for v in arg.split()] for arg in sys.argv[3:5])
mx, my = statistics.median(xs), statistics.median(ys)
print(f"| {a} | {b} | {mx:,.0f} | {my:,.0f} | {mx/my:.2f}x |")
PY
}
