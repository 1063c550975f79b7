# Sourced by the benchmark scripts (from the repository root).
# need_fio: installs fio if missing. target_dir: cargo's target directory, as cargo itself
# resolves it (CARGO_TARGET_DIR, build.target-dir, else target/). build_bin BIN [FEATURE]:
# builds BIN in release with the tools feature (and FEATURE) and sets B to its path there.
# build_bench: builds tierkv-bench, with the nixl engine when the NIXL library is present
# (tools/fetch-nixl.sh); sets B (the binary) and NIXL (1 when the nixl engine is available,
# else 0). The statistics (medians, ratios, reports, tables) are tools/benchstats.py's:
# "$BENCHSTATS" is its path, for scripts to call `python3 "$BENCHSTATS" ...` too.

BENCHSTATS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/benchstats.py"

need_fio() {
  command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
}

target_dir() {
  cargo metadata --format-version 1 --no-deps |
    python3 "$BENCHSTATS" field target_directory
}

build_bin() {
  cargo build --release --quiet -p tierkv-tools ${2:+--features "$2"} --bin "$1"
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
  python3 "$BENCHSTATS" ops-per-sec
}

# median_row A B "X1 X2 ..." "Y1 Y2 ...": a markdown row `| A | B | median X | median Y |
# ratio |` of two sets of rounds measured side by side.
median_row() {
  python3 "$BENCHSTATS" median-row "$@"
}

# rounds_and_sizes DEFAULT_ROUNDS "DEFAULT SIZES" ARGS...: sets ROUNDS (the first of ARGS, else
# the default) and the array SIZES (the rest of ARGS, else the default sizes).
rounds_and_sizes() {
  local default_rounds=$1 default_sizes=$2
  shift 2
  ROUNDS=${1:-$default_rounds}
  shift $(( $# > 0 ? 1 : 0 )) || true
  read -r -a SIZES <<< "${*:-$default_sizes}"
}

# machine_line DIR: the cores, the kernel, DIR's filesystem and device, fio's version when it is
# installed, and the date: the line every table's run starts with.
machine_line() {
  local fio=""
  if command -v fio >/dev/null; then fio=", $(fio --version)"; fi
  echo "machine: $(nproc) cores, kernel $(uname -r), $(df -T "$1" | awk 'NR==2 {print $2}') on $(df "$1" | awk 'NR==2 {print $1}')$fio, $(date -u +%F)"
}

# fio_json read|write: from fio's JSON report on stdin, the first job's bandwidth (bytes/s) and
# its completion latency p50, p99 and p99.9 (ns), comma-separated.
fio_json() {
  python3 "$BENCHSTATS" fio-json "$1"
}

# size_bytes SIZE: a size with a k, m or g suffix (4k, 2m, 1g) in bytes.
size_bytes() {
  python3 "$BENCHSTATS" size "$1"
}

# link_block_files TREE DEST BYTES N: hard-links the N block files of BYTES-byte blocks a store
# wrote under TREE into the new flat directory DEST as f0..f(N-1) (a block file's name starts
# with a lower-case hex digit; control files do not, and are smaller); fails unless it finds
# exactly N.
link_block_files() {
  local tree=$1 dest=$2 bytes=$3 n=$4 i=0 f
  mkdir "$dest"
  while IFS= read -r f; do ln "$f" "$dest/f$i"; i=$((i + 1)); done \
    < <(find "$tree" -type f -name '[0-9a-f]*' -size +$(( bytes / 1024 - 1 ))k)
  [ "$i" -eq "$n" ] || { echo "found $i block files in $tree, expected $n" >&2; return 1; }
}
