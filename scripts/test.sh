#!/usr/bin/env bash
# Every check CI runs, in the order a failure is cheapest to report: formatting,
# lints, docs, then all tests (unit and integration under cargo-nextest, doc tests,
# and each benchmark run once in test mode), then every fuzz target briefly.
# Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh
. scripts/lib/product_build.sh

podgate_ensure_rust
podgate_ensure_nextest
podgate_ensure_system_packages
podgate_ensure_kubectl
# tests/third_party_runner.rs: gitlab-python-runner from PyPI, pinned (exports
# PODGATE_PY_RUNNER_VENV).
podgate_ensure_py_runner

# Every crate this machine builds, downloaded once, here, where a network failure is
# reported first; every later step runs offline on what this fetched, so none of them
# depends on what an earlier run left in the cargo cache ($CARGO_HOME).
echo "==> cargo fetch (the host's crates)"
cargo fetch --locked --target "$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_NET_OFFLINE=true

# A clean CI clone builds everything once: incremental compilation's caches would only
# cost time and disk (a developer's run keeps them for the next edit).
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "==> cargo doc (broken links fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

echo "==> the production binary: no simulators (tests/product_binary.rs)"
built=$(mktemp)
trap 'rm -f "$built" "$built".*' EXIT
podgate_build_product "$built"

echo "==> build: every test, benchmark and binary, in one cargo call"
podgate_build_tests_checking_drift "$built" --workspace --locked --tests --bench '*' --no-run

echo "==> tests: cargo nextest, each test in its own process (.config/nextest.toml)"
# Two tests per core: most of them wait on processes, sockets and timers.
cargo nextest run --workspace --locked --test-threads "$(( $(nproc) * 2 ))"

echo "==> doc tests"
cargo test --workspace --locked --doc

echo "==> benchmarks, once each in test mode"
cargo test --workspace --locked --bench '*'

echo "==> fuzzing, every target for 5 s (scripts/fuzz.sh --quick; long runs: fuzz/README.md)"
scripts/fuzz.sh --quick 5
