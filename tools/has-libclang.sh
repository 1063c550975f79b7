#!/usr/bin/env bash
# Exits 0 when an `ldconfig -p` listing (on stdin, or this machine's own when stdin is a
# terminal or empty) names a library that bindgen (clang-sys) loads: libclang.so,
# libclang.so.N, libclang-N.so or libclang-N.so.M. libclang-cpp.so.N is a different library
# (the C++ API) that clang-sys never loads, so it does not count. tests/first_contact.rs runs
# this on both listings.
set -euo pipefail
if [ -t 0 ]; then listing=$(ldconfig -p); else listing=$(cat); fi
[ -n "$listing" ] || listing=$(ldconfig -p)
# The library name is the first field of each listing line.
awk '{print $1}' <<<"$listing" | grep -Eq '^libclang(-[0-9][0-9.]*)?\.so(\.[0-9.]+)?$'
