#!/usr/bin/env bash
# The proxy's memory per held long poll: RSS with POLLS (default 10,000) concurrent
# `jobs/request` long polls held by a Pod, over its idle RSS. Each poll is one client
# connection and one upstream connection, so the fd limit is raised first.
#
#   ./scripts/measure-held-polls.sh
#   POLLS=20000 ./scripts/measure-held-polls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
podgate_ensure_system_packages

# Each held poll costs the proxy 2 fds and this bench 2 (client and Pod side).
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt 21024 ]; then
  fit=$(( (hard - 1024) / 2 ))
  echo "the hard open-files limit is $hard: at most $fit polls fit (10,000 need 21,024)" >&2
  POLLS=${POLLS:-$fit}
fi
POLLS=${POLLS:-10000}
ulimit -n "$hard" 2>/dev/null || true
echo "polls: $POLLS, open files limit: $(ulimit -n)" >&2
exec cargo bench --locked --bench held_polls -- --polls "$POLLS"
