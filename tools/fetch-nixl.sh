#!/usr/bin/env bash
# Fetches the NIXL libraries (libnixl_capi.so, libnixl.so, plugins/ with POSIX, and their own
# dependencies) from the PyPI wheel nixl-cu12 into .nixl/lib, if they are not there yet.
# The nixl engine finds them there (or through $TIERKV_NIXL_DIR). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${NIXL_VERSION:-1.5.1}
DEST=.nixl
if [ -f "$DEST/lib/libnixl_capi.so" ] && [ -f "$DEST/lib/plugins/libplugin_POSIX.so" ]; then
  exit 0
fi
mkdir -p "$DEST/wheel"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 "nixl-cu12==$VERSION" -d "$DEST/wheel"
rm -rf "$DEST/unz"
python3 -m zipfile -e "$DEST"/wheel/nixl_cu12-"$VERSION"-*.whl "$DEST/unz"
# The wheel keeps the C API, the core and plugins/ together; their own dependencies
# (libaio, liburing, ...) sit in nixl_cu12.libs and resolve through $ORIGIN.
ln -sfn "unz/.nixl_cu12.mesonpy.libs" "$DEST/lib"
test -f "$DEST/lib/libnixl_capi.so"
test -f "$DEST/lib/plugins/libplugin_POSIX.so"
rm -rf "$DEST/wheel"
echo "NIXL $VERSION libraries in $DEST/lib"
