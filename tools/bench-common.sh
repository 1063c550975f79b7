# Sourced by the side-by-side benchmark scripts (from the repository root).
# need_fio: installs fio if missing. build_bench: builds tierkv-bench in release, with the nixl
# engine when the NIXL library is present (tools/fetch-nixl.sh); sets B (the binary) and NIXL
# (1 when the nixl engine is available, else 0).

need_fio() {
  command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
}

build_bench() {
  NIXL=0
  if [ -e .nixl/lib/libnixl_capi.so ] || [ -n "${TIERKV_NIXL_DIR:-}" ]; then NIXL=1; fi
  if [ $NIXL = 1 ]; then
    cargo build --release --quiet --features nixl --bin tierkv-bench
  else
    cargo build --release --quiet --bin tierkv-bench
  fi
  B=target/release/tierkv-bench
}
