#!/usr/bin/env bash
# The main job. For now: the token demo (every token format classified, with the
# keys it generates). Installs what is missing first, builds in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
podgate_ensure_system_packages

cargo build --release --locked --bin podgate
exec ./target/release/podgate token demo "$@"
