#!/usr/bin/env bash
# The main job: `podgate up`. Three simulated Pods, the proxy in front of them and a
# small runner fleet on loopback, with a live table of requests per Pod, per token
# source, and misroutes; its `console url=…` line is the web console to open in a
# browser. Ctrl-C stops everything. Installs what is missing first, builds with the
# `demo` profile (Cargo.toml: release, with what only the simulators, kas and agentk
# run optimised less, for a shorter first build). Flags pass through:
# ./scripts/run.sh --no-fleet
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
podgate_ensure_system_packages

cargo build --profile demo --locked --bin podgate
exec ./target/demo/podgate up "$@"
