#!/usr/bin/env bash
# What path rules add to a request, against `podgate up` (its proxy, its Topology
# Service, its simulated Pods): one connection, one request at a time, wrk's
# latency percentiles, for
#
# - direct:     GET /team-2/project straight to Pod 2 (the baseline);
# - path-warm:  the same through the proxy: a path rule, its owner in the cache;
# - path-cold:  a new top-level path every request through the proxy: every one
#               a Topology Service call (REST classify) before it is forwarded
#               (unclaimed, so the default Pod answers it 404);
# - token:      GET /api/v4/user with a routable PRIVATE-TOKEN of Pod 2 through the
#               proxy (a token rule; no Topology Service), and direct-token, the
#               same straight to Pod 2.
#
# "added" is the proxy's median (and p99) less the direct one of the same shape.
# Each pass runs DURATION seconds (default 5), REPEATS times (default 3); the
# medians over the repeats are printed.
#
#   ./scripts/bench-path-rules.sh
#   PODGATE=target/demo/podgate REPEATS=5 DURATION=10 ./scripts/bench-path-rules.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
PODGATE_APT_PACKAGES=(wrk)
podgate_ensure_system_packages

REPEATS=${REPEATS:-3}
DURATION=${DURATION:-5}
if [ -z "${PODGATE:-}" ]; then
  cargo build --profile demo --locked --bin podgate >&2
  PODGATE=./target/demo/podgate
fi

W=$(mktemp -d)
UP_PID=
cleanup() { [ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
LISTEN=$(port); ADMIN=$(port); TLS=$(port)

"$PODGATE" up --no-fleet --no-kube --listen "127.0.0.1:$LISTEN" --admin "127.0.0.1:$ADMIN" \
  --tls-listen "127.0.0.1:$TLS" >"$W/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 600); do
  grep -q "podgate up: ready" "$W/up.log" && break
  kill -0 "$UP_PID" 2>/dev/null || { cat "$W/up.log" >&2; exit 1; }
  sleep 0.1
done
grep -q "podgate up: ready" "$W/up.log" || { echo "podgate up did not get ready" >&2; exit 1; }
POD2=$(sed -n 's/.*pod id=2 address=http:\/\/\([^ ]*\).*/\1/p' "$W/up.log")
TOKEN=$("$PODGATE" token mint-gitlab --prefix glpat- --cell 2 --org 1)

cat >"$W/cold.lua" <<'LUA'
-- A path no run has asked for (each run's Lua state starts afresh).
math.randomseed(os.time())
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/cold-" .. math.random(1, 1e9) .. "-" .. n .. "/x")
end
LUA
cat >"$W/token.lua" <<LUA
wrk.headers["PRIVATE-TOKEN"] = "$TOKEN"
LUA
: >"$W/empty.lua"

# p50 and p99 in microseconds from wrk's --latency output.
percentiles() {
  awk '
    function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; if (v ~ /s$/) return v * 1000000; return v }
    $1 == "50%" { p50 = us($2) } $1 == "99%" { p99 = us($2) }
    END { printf "%d %d\n", p50, p99 }'
}
run() { # name url script
  wrk -t1 -c1 -d"${DURATION}s" --latency -s "$W/$3.lua" "$2" | percentiles
}

declare -A P50 P99
for r in $(seq 1 "$REPEATS"); do
  for shape in direct path-warm path-cold token direct-token; do
    case $shape in
      direct) out=$(run "$shape" "http://$POD2/team-2/project" empty) ;;
      path-warm) out=$(run "$shape" "http://127.0.0.1:$LISTEN/team-2/project" empty) ;;
      path-cold) out=$(run "$shape" "http://127.0.0.1:$LISTEN/" cold) ;;
      token) out=$(run "$shape" "http://127.0.0.1:$LISTEN/api/v4/user" token) ;;
      direct-token) out=$(run "$shape" "http://$POD2/api/v4/user" token) ;;
    esac
    read -r p50 p99 <<<"$out"
    P50[$shape]+="$p50 "; P99[$shape]+="$p99 "
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-13s %9s %9s %12s %12s\n' shape p50_us p99_us added_p50_us added_p99_us
for shape in direct path-warm path-cold token direct-token; do
  m50=$(echo "${P50[$shape]}" | median); m99=$(echo "${P99[$shape]}" | median)
  base=direct; [ "$shape" = token ] || [ "$shape" = direct-token ] && base=direct-token
  b50=$(echo "${P50[$base]}" | median); b99=$(echo "${P99[$base]}" | median)
  printf '%-13s %9d %9d %12d %12d\n' "$shape" "$m50" "$m99" $((m50 - b50)) $((m99 - b99))
done
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep -E '^podgate_proxy_(path_rules|topology_service_calls|classify_cache)_total' || true
