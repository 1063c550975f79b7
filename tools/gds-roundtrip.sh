#!/usr/bin/env bash
# The GDS round trip on a GPU machine: blocks from GPU memory to files and back through the
# nixl engine (NIXL GDS_MT, else GDS), checked byte for byte (tools/gds-roundtrip/main.rs).
#
# Needs: an NVIDIA GPU and driver (libcuda.so.1), and the NIXL and CUDA libraries in .nixl/lib
# (tools/fetch-nixl.sh --gpu, run where PyPI is reachable). Without the nvidia-fs kernel module
# cuFile runs in compat mode (POSIX I/O through bounce buffers), which this script allows in
# the cufile.json it writes; with nvidia-fs, GDS moves the bytes by DMA.
#
# usage: tools/gds-roundtrip.sh [DIR] [-- gds-roundtrip options]
#   DIR: a directory on the filesystem to test (default: a temporary one under /tmp).
#   GDS_BIN: a prebuilt gds-roundtrip binary (for a machine without a Rust toolchain; build
#   it with `cargo build --release -p tierkv-tools --features nixl --bin gds-roundtrip`).
#   TIERKV_NIXL_DIR: the NIXL and CUDA libraries already there (for a machine without PyPI:
#   copy .nixl/lib's files, and the nixl_cu12.libs beside it that they load); else
#   tools/fetch-nixl.sh --gpu fetches them into .nixl/lib.
#   GDS_UDEV_STUB=1: cuFile looks up the filesystem's block device in the udev database,
#   even in compat mode; where udev does not run (a VM or container) every file registration
#   fails (CU_FILE_INTERNAL_ERROR; cufile.log: "udev property not found: ID_FS_USAGE"). This
#   writes the entry udev would have written for DIR's device into /run/udev/data (root only).
#   Prints the tool's JSON (backend used, rates); exit status 0 when every block matched.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-}; [ $# -gt 0 ] && shift; [ "${1:-}" = -- ] && shift
if [ -n "${GDS_BIN:-}" ]; then
  BIN=$GDS_BIN
else
  . tools/bench-common.sh
  build_bin gds-roundtrip nixl
  BIN=$B
fi
[ -n "${TIERKV_NIXL_DIR:-}" ] || bash tools/fetch-nixl.sh --gpu
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if lsmod 2>/dev/null | grep -q '^nvidia_fs'; then echo "nvidia-fs: loaded (GDS DMA)"; else echo "nvidia-fs: absent (cuFile compat mode)"; fi
W=$(mktemp -d /tmp/tierkv-gds.XXXXXX); trap 'rm -rf "$W"' EXIT
cat > "$W/cufile.json" <<JSON
{
  "logging": { "dir": "$W", "level": "ERROR" },
  "properties": {
    "allow_compat_mode": true,
    "io_batchsize": 128,
    "max_direct_io_size_kb": 16384,
    "per_buffer_cache_size_kb": 1024,
    "max_device_cache_size_kb": 131072
  }
}
JSON
export CUFILE_ENV_PATH_JSON="$W/cufile.json"
[ -n "$DIR" ] || DIR="$W/store"
if [ "${GDS_UDEV_STUB:-0}" = 1 ]; then
  mkdir -p "$DIR"
  DEV=$(mountpoint -d "$(df --output=target "$DIR" | tail -1)")
  ENTRY=/run/udev/data/b$DEV
  if [ ! -e "$ENTRY" ]; then
    mkdir -p /run/udev/data
    printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(df --output=fstype "$DIR" | tail -1)" > "$ENTRY"
    echo "udev stub: wrote $ENTRY"
  fi
fi
status=0
RUST_LOG=${RUST_LOG:-info} "$BIN" --dir "$DIR" "$@" || status=$?
if [ $status != 0 ] && [ -f "$W/cufile.log" ]; then
  echo "--- cufile.log"; tail -50 "$W/cufile.log"
fi
exit $status
