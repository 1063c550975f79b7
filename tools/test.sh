#!/usr/bin/env bash
# The test command of README.md, and what .ci/run runs. Idempotent: installs what the tests
# need when it is missing, then runs formatting, lints and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# In CI (CI=true, root) the tests that need privileges (a tmpfs for a real ENOSPC) must run,
# not skip.
if [ "${CI:-}" = "true" ]; then
  export TIERKV_REQUIRE_PRIVILEGED_TESTS=1
fi

for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$c"
  fi
done

cargo fmt --all -- --check
cargo clippy --all-targets --all-features -- -D warnings
cargo test --all-features
