#!/usr/bin/env bash
# The proxy's user-space instructions per request, counted by valgrind's callgrind:
# the same runner-like `POST /api/v4/jobs/request` as scripts/bench-proxy.sh, through
# podgate (one worker thread) to an nginx upstream.
#
# CPU time per request on a shared machine moves by ±10% from one pass to the next;
# an instruction count does not (two passes of one build agree within a few tenths of
# a percent), so a change to the request path's own code shows here when it is lost
# in bench-proxy.sh's noise. It counts user space only: the kernel's part (three
# quarters of the proxy's CPU on loopback) and cache misses are bench-proxy.sh's.
#
# Per request shape (TOKENS) and build (podgate, and PODGATE_BASELINE when given):
# podgate starts under callgrind, wrk warms it up, the counters are zeroed, wrk runs
# CONNS connections for DURATION s, and the counters are dumped: instructions (Ir)
# divided by the requests wrk counted. TOP=n also prints the n costliest functions
# of each pass, inclusive, per request (the first are the threads' and runtime's own
# frames, which hold everything).
#
#   ./scripts/instructions-per-request.sh
#   PODGATE=path/to/podgate PODGATE_BASELINE=path/to/old/podgate TOKENS=hdr TOP=30 \
#     ./scripts/instructions-per-request.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh
. scripts/lib/loopback.sh

podgate_ensure_rust
podgate_ensure_system_packages
PODGATE_APT_PACKAGES=(wrk nginx valgrind)
podgate_ensure_system_packages

TOKENS=${TOKENS:-hdr jwt v1}
DURATION=${DURATION:-10}
CONNS=${CONNS:-8}
TOP=${TOP:-0}

if [ -z "${PODGATE:-}" ]; then
  cargo build --release --locked --bin podgate >&2
  PODGATE=./target/release/podgate
fi
BUILDS="podgate:$PODGATE"
[ -n "${PODGATE_BASELINE:-}" ] && BUILDS="before:$PODGATE_BASELINE $BUILDS"

W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT

UP=$(port)
upstream_conf "$UP"
nginx -c "$W/upstream.conf" -p "$W" & PIDS+=($!)

bench_tokens "$PODGATE"

runner_lua jwt "$JWT"
runner_lua v1 "$V1"
runner_lua hdr "$V1" header

printf '%-6s %-8s %10s %14s %10s\n' shape build requests instructions per_req
for shape in $TOKENS; do
  for b in $BUILDS; do
    name=${b%%:*} bin=${b#*:}
    p=$(port) admin=$(port) out="$W/cg.$shape.$name"
    proxy_toml "$p" "$admin" "$UP" > "$W/pg.toml"
    valgrind --tool=callgrind --compress-strings=no --callgrind-out-file="$out" \
      "$bin" proxy --config "$W/pg.toml" > /dev/null 2> "$W/valgrind.err" &
    vg=$!
    PIDS+=("$vg")
    # Under valgrind the proxy takes seconds to start.
    wait_port "$p" 1200
    url=http://127.0.0.1:$p/api/v4/jobs/request
    wrk -t1 -c"$CONNS" -d3s -s "$W/$shape.lua" "$url" > /dev/null
    callgrind_control -z "$vg" > /dev/null 2>&1
    reqs=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$W/$shape.lua" "$url" | awk '/requests in/ {print $1}')
    callgrind_control -d "$vg" > /dev/null 2>&1
    kill -INT "$vg"
    wait "$vg" 2> /dev/null || true
    dump=$(grep -l "Trigger: dump" "$out"*)
    ir=$(awk '/^summary:/ {print $2}' "$dump")
    printf '%-6s %-8s %10d %14d %10d\n' "$shape" "$name" "$reqs" "$ir" $((ir / reqs))
    if [ "$TOP" -gt 0 ]; then
      callgrind_annotate --inclusive=yes "$dump" 2> /dev/null \
        | awk -v r="$reqs" -v n="$TOP" '/^ *[0-9,]+ +\(/ && c < n {
            v = $1; gsub(",", "", v); sub(/^ *[0-9,]+ +\([ 0-9.]+%\) +/, "");
            printf "         %8d  %s\n", v / r, substr($0, 1, 140); c++ }'
    fi
  done
done
