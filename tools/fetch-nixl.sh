#!/usr/bin/env bash
# Fetches the NIXL libraries (libnixl_capi.so, libnixl.so, plugins/ with POSIX, GDS, GDS_MT,
# and their own dependencies) from the PyPI wheel nixl-cu12 into .nixl/lib, if they are not
# there yet. The nixl engine finds them there (or through $TIERKV_NIXL_DIR). Idempotent.
#
# --gpu: also the CUDA libraries the GDS plugins load (libcufile.so.0 from nvidia-cufile-cu12,
# libcudart.so.12 from nvidia-cuda-runtime-cu12), beside the NIXL libraries. The GPU driver
# (libcuda.so.1) comes from the machine. Run it where PyPI is reachable before copying .nixl
# to a GPU machine that has no network.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${NIXL_VERSION:-1.5.1}
DEST=.nixl
GPU=0
[ "${1:-}" = --gpu ] && GPU=1
download() { python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 "$1" -d "$2"; }
if ! { [ -f "$DEST/lib/libnixl_capi.so" ] && [ -f "$DEST/lib/plugins/libplugin_POSIX.so" ]; }; then
  mkdir -p "$DEST/wheel"
  download "nixl-cu12==$VERSION" "$DEST/wheel"
  rm -rf "$DEST/unz"
  python3 -m zipfile -e "$DEST"/wheel/nixl_cu12-"$VERSION"-*.whl "$DEST/unz"
  # The wheel keeps the C API, the core and plugins/ together; their own dependencies
  # (libaio, liburing, ...) sit in nixl_cu12.libs and resolve through $ORIGIN.
  ln -sfn "unz/.nixl_cu12.mesonpy.libs" "$DEST/lib"
  test -f "$DEST/lib/libnixl_capi.so"
  test -f "$DEST/lib/plugins/libplugin_POSIX.so"
  rm -rf "$DEST/wheel"
  echo "NIXL $VERSION libraries in $DEST/lib"
fi
if [ $GPU = 1 ] && ! { [ -f "$DEST/lib/libcufile.so.0" ] && [ -f "$DEST/lib/libcudart.so.12" ]; }; then
  # The GDS plugins find them through their RUNPATH ($ORIGIN/.., i.e. $DEST/lib).
  W="$DEST/gpu-wheels"; rm -rf "$W"; mkdir -p "$W"
  download "nvidia-cufile-cu12==${CUFILE_VERSION:-1.14.1.1}" "$W"
  download "nvidia-cuda-runtime-cu12==${CUDART_VERSION:-12.9.79}" "$W"
  for whl in "$W"/*.whl; do python3 -m zipfile -e "$whl" "$W/unz"; done
  cp "$W/unz/nvidia/cufile/lib/libcufile.so.0" "$W/unz/nvidia/cuda_runtime/lib/libcudart.so.12" "$DEST/lib/"
  rm -rf "$W"
  echo "CUDA libraries for GDS in $DEST/lib"
fi
