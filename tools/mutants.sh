#!/usr/bin/env bash
# Mutation testing with cargo-mutants (installed here if missing), one source file at a time,
# each mutant tested only by the test binaries that guard that file (so one mutant costs one
# incremental build and a few seconds of tests). Writes each file's outcomes under
# target/mutants/<file>/ and a summary table to target/mutants/summary.txt (docs/testing.md
# records the figures).
#
#   tools/mutants.sh                  the files docs/testing.md requires (format, layout, key)
#   tools/mutants.sh FILE...          these files (e.g. src/store/write.rs)
#   tools/mutants.sh --all            every file of src/ (hours on 2 cores: docs/testing.md)
#   tools/mutants.sh --in-diff BASE   only mutants on lines changed since git revision BASE
#
# Environment: MUTANTS_TIMEOUT (test timeout per mutant, seconds, default 120),
# MUTANTS_BUDGET (stop starting new files after this many seconds, default none).
# It runs under `nice -n 19` and without the cargo lock of tools/test.sh: a mutant build must
# not block other builds on this machine for long.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo mutants --version >/dev/null 2>&1; then
  cargo install --locked cargo-mutants
fi

# The test binaries that guard each file ("--lib" = the crate's unit tests). Files not
# listed get the unit tests plus the behaviour tests that need no tools.
tests_for() {
  case "$1" in
    # check_file is tierkv-stat's block check (stat_cli).
    src/format/*) echo "--lib --test oracle --test stat_cli" ;;
    src/key.rs) echo "--lib --test oracle" ;;
    src/layout/*) echo "--lib --test oracle --test semantics" ;;
    src/store/write.rs) echo "--lib --test oracle --test semantics --test faults --test engines --test device --test capacity --test reuse --test bound" ;;
    src/store/read.rs) echo "--lib --test oracle --test semantics --test faults --test engines --test device --test reuse" ;;
    src/ns/mod.rs | src/ns/control.rs | src/ns/lease.rs) echo "--lib --test oracle --test semantics --test faults --test engines --test capacity --test reuse" ;;
    # The worker lock, the shared ledger and node ids: their unit tests, and the suites that
    # share workers between stores and processes.
    src/ns/lock.rs | src/ns/ledger.rs | src/ns/node.rs) echo "--lib --test semantics --test capacity --test shared --test hostile" ;;
    src/store/sweep.rs) echo "--lib --test oracle --test semantics --test hostile --test shared --test stat_cli" ;;
    src/store/shared.rs) echo "--lib --test semantics --test capacity --test shared" ;;
    src/store/evict.rs) echo "--lib --test semantics --test capacity --test bound --test reuse" ;;
    src/store/periodic.rs | src/store/statsfile.rs) echo "--lib --test semantics --test hostile --test stat_cli" ;;
    # The policies' behaviour is shown by their unit tests (the trace replays are optimised
    # only, and the store's suites add minutes a mutant without exercising more of them).
    src/index/policy/*) echo "--lib" ;;
    # The system-call loops and file kinds: their unit tests read and write across buffers and
    # the end of a file, and stat real files of each kind.
    src/sys.rs) echo "--lib" ;;
    # Splitting a get between threads: its unit tests read through it with every condition.
    src/store/split.rs) echo "--lib" ;;
    src/store/scatter.rs) echo "--lib --test engines" ;;
    src/offload/*) echo "--lib --test offload" ;;
    # The engine API: its behaviour tests alone.
    src/transfer/*) echo "--test transfer" ;;
    # The queue has no unit tests: its behaviour tests alone (the lib's take 30 s a mutant).
    # The runner under both queues: their behaviour tests.
    src/queue/runner.rs) echo "--test queue --test transfer" ;;
    src/queue/*) echo "--test queue" ;;
    # The one walker: the sweep's suites and tierkv-stat's (its other visitor).
    src/ns/walk.rs) echo "--lib --test oracle --test semantics --test hostile --test shared --test stat_cli" ;;
    src/store/config.rs) echo "--lib --test oracle --test semantics --test faults --test engines --test capacity --test reuse --test shared" ;;
    src/store/mod.rs | src/store/stats.rs) echo "--lib --test oracle --test semantics --test faults --test engines --test capacity --test offload --test reuse --test shared --test hostile" ;;
    *) echo "--lib --test oracle --test semantics --test faults --test engines --test capacity" ;;
  esac
}
# Arguments for the test binaries: the eviction policies' trace test (20 s, nothing but
# the policies) is skipped except for the files it guards.
filters_for() {
  case "$1" in
    src/index/policy/*) echo "index::" ;;
    src/sys.rs) echo "sys::" ;;
    src/store/split.rs) echo "store::split::" ;;
    # Its unit tests and the vectored round trip over every engine.
    src/store/scatter.rs) echo "store::scatter:: vectored_puts_and_gets" ;;
    src/index/*) echo "" ;;
    *) echo "--skip trace_hit_ratios" ;;
  esac
}
# Files whose tests run the tools' binaries: those tests are the tools crate's (tools/tests/),
# so both packages' tests run (cargo-mutants tests only the mutated package by default).
packages_for() {
  case "$(tests_for "$1")" in
    *hostile* | *crash* | *bench_cli* | *stat_cli* | *shared* | *processes*) echo "--test-package=tierkv,tierkv-tools" ;;
    *) echo "" ;;
  esac
}

OUT=target/mutants
# The mutants build without the nixl feature: the tests must not require NIXL (.ci/run sets
# this for the test command before running this script).
unset TIERKV_REQUIRE_NIXL
# One target directory for every run (the copies cargo-mutants builds in share the compiled
# dependencies).
# MUTANTS_TARGET_DIR: another one, for a second run at the same time.
export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-$PWD/target/mutants-target}"
mkdir -p "$OUT"
TIMEOUT=${MUTANTS_TIMEOUT:-120}
DIFF=""
case "${1:-}" in
  --all) mapfile -t FILES < <(git ls-files 'src/*.rs') ;;
  --in-diff)
    base=${2:?--in-diff needs a git revision}
    DIFF="$OUT/changes.diff"
    git diff "$base" -- src >"$DIFF"
    mapfile -t FILES < <(git diff --name-only "$base" -- 'src/*.rs')
    if [ ${#FILES[@]} -eq 0 ]; then
      echo "tools/mutants.sh: no source file changed since $base: nothing to mutate"
      exit 0
    fi
    ;;
  "") FILES=(src/format/mod.rs src/layout/mod.rs src/key.rs) ;;
  *) FILES=("$@") ;;
esac

SUMMARY="$OUT/summary.txt"
printf '%-26s %6s %6s %6s %8s %8s %8s\n' file caught missed unviable timeout seconds s/mutant >"$SUMMARY.new"
start_all=$(date +%s)
status=0
for f in "${FILES[@]}"; do
  if [ -n "${MUTANTS_BUDGET:-}" ] && [ $(($(date +%s) - start_all)) -ge "$MUTANTS_BUDGET" ]; then
    echo "tools/mutants.sh: budget of ${MUTANTS_BUDGET}s spent; not run: $f"
    continue
  fi
  name=${f//\//_}
  dir="$OUT/$name"
  rm -rf "$dir"
  t0=$(date +%s)
  echo "== cargo mutants on $f (tests: $(tests_for "$f"))"
  diffarg=()
  [ -n "$DIFF" ] && diffarg=(--in-diff "$DIFF")
  # The test selection goes to both the build (`cargo test --no-run`) and the test run, so a
  # mutant builds only the binaries that test it.
  testargs=()
  for a in $(tests_for "$f"); do testargs+=(--cargo-arg="$a"); done
  # shellcheck disable=SC2046
  nice -n 19 cargo mutants --no-shuffle -f "$f" "${diffarg[@]}" $(packages_for "$f") \
    --timeout "$TIMEOUT" --build-timeout 900 --output "$dir" "${testargs[@]}" \
    -- -- $(filters_for "$f") || status=1
  t1=$(date +%s)
  # A file with no mutant in the diff leaves no output directory.
  mkdir -p "$dir"
  o="$dir/mutants.out"
  count() {
    local n=0
    if [ -f "$o/$1.txt" ]; then n=$(grep -c . "$o/$1.txt" || true); fi
    echo "${n:-0}"
  }
  n=$(($(count caught) + $(count missed) + $(count unviable) + $(count timeout)))
  per=-
  [ "$n" -gt 0 ] && per=$(((t1 - t0) / n))
  {
    printf '%-26s %6s %6s %6s %8s %8s %8s\n' "$f" "$(count caught)" "$(count missed)" \
      "$(count unviable)" "$(count timeout)" $((t1 - t0)) "$per"
    if [ -s "$o/missed.txt" ]; then
      echo "missed in $f:"
      sed 's/^/  /' "$o/missed.txt"
    fi
  } >"$dir/summary-row.txt"
done
# Every file run so far (this run and earlier ones), one row each.
cat "$OUT"/*/summary-row.txt >>"$SUMMARY.new" 2>/dev/null || true
mv "$SUMMARY.new" "$SUMMARY"
cat "$SUMMARY"
exit $status
