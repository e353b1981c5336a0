#!/usr/bin/env bash
# Every check CI runs, in the order a failure is cheapest to report:
# formatting, lints, docs, then all tests (unit, integration, doc, and each benchmark
# run once in test mode), then every fuzz target briefly. Installs what is missing
# first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
podgate_ensure_system_packages
podgate_ensure_kubectl
# tests/third_party_runner.rs: gitlab-python-runner from PyPI, pinned (exports
# PODGATE_PY_RUNNER_VENV).
podgate_ensure_py_runner

echo "==> cargo fmt --check"
cargo fmt --all --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

echo "==> cargo doc (broken links fail)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

echo "==> cargo test"
cargo test --workspace --locked

echo "==> benchmarks, once each in test mode"
cargo test --workspace --benches --locked

echo "==> fuzzing, every target for 5 s (scripts/fuzz.sh --quick; long runs: fuzz/README.md)"
scripts/fuzz.sh --quick 5
