#!/usr/bin/env bash
# The proxy's memory per held long poll: RSS with POLLS (default 10,000) concurrent
# `jobs/request` long polls, over its idle RSS. By default the Pod holds them, so each
# is one client and one upstream connection; EDGE=1 holds them at the edge (a
# redis-server with every runner's queue key, no upstream connection), one client
# connection each. The fd limit is raised first.
#
#   ./scripts/measure-held-polls.sh
#   POLLS=20000 ./scripts/measure-held-polls.sh
#   EDGE=1 ./scripts/measure-held-polls.sh     # as many edge-held polls as fit
#   PINGORA=1 ./scripts/measure-held-polls.sh  # with fast_path = false (pingora-proxy)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
podgate_ensure_system_packages

# A forwarded poll costs the proxy 2 fds and this bench 2 (client and Pod side); an
# edge-held one costs each 1 (the wake-up forwards them in waves of 500).
per=2 edge=()
if [ -n "${EDGE:-}" ]; then per=1 edge=(--edge); fi
if [ -n "${PINGORA:-}" ]; then edge+=(--pingora); fi
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ]; then
  fit=$(( (hard - 2048) / per ))
  if [ -z "${POLLS:-}" ] && [ -n "${EDGE:-}" ]; then POLLS=$fit; fi
  if [ "${POLLS:-10000}" -gt "$fit" ]; then
    echo "the hard open-files limit is $hard: at most $fit polls fit" >&2
    POLLS=$fit
  fi
fi
POLLS=${POLLS:-10000}
ulimit -n "$hard" 2>/dev/null || true
echo "polls: $POLLS${EDGE:+ (edge)}, open files limit: $(ulimit -n)" >&2
exec cargo bench --locked --bench held_polls -- --polls "$POLLS" "${edge[@]}"
