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

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
  # Under valgrind the proxy takes seconds to start.
  for _ in $(seq 1 1200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2
  return 1
}

UP=$(port)
cat > "$W/upstream.conf" <<EOF
worker_processes 1;
daemon off;
pid $W/upstream.pid;
error_log $W/upstream.err;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $W/b1; proxy_temp_path $W/p1; fastcgi_temp_path $W/f1; uwsgi_temp_path $W/u1; scgi_temp_path $W/s1;
  server { listen 127.0.0.1:$UP; location / { return 200 '{"ok":true}'; } }
}
EOF
nginx -c "$W/upstream.conf" -p "$W" & PIDS+=($!)

"$PODGATE" token keygen --alg ed25519 --kid bench --out "$W/keys" > /dev/null
mkdir -p "$W/verify"
cp "$W/keys/bench.pem" "$W/verify/"
JWT=$("$PODGATE" token mint --kind runner --pod 1 --ttl 1h --key "$W/keys/bench.private.pem")
V1=$("$PODGATE" token mint-gitlab --prefix glrt- --cell 1 --org 1)

script() { # shape -> wrk script
  local tok=$V1 header=""
  [ "$1" = jwt ] && tok=$JWT
  [ "$1" = hdr ] && header="wrk.headers[\"Runner-Token\"] = \"$tok\""
  cat > "$W/$1.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
$header
wrk.body = '{"token":"$tok","system_id":"s_0123456789ab","last_update":"0","info":{"name":"gitlab-runner","version":"17.6.0","executor":"docker","features":{"variables":true,"artifacts":true,"cache":true}}}'
EOF
}

printf '%-6s %-8s %10s %14s %10s\n' shape build requests instructions per_req
for shape in $TOKENS; do
  script "$shape"
  for b in $BUILDS; do
    name=${b%%:*} bin=${b#*:}
    p=$(port) admin=$(port) out="$W/cg.$shape.$name"
    printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\nthreads = 1\ngrace_period_secs = 0\nkeys = ["%s/verify"]\n[topology]\ndefault_pod = 1\n[[topology.pods]]\nid = 1\nname = "pod-1"\nweb = ["127.0.0.1:%s"]\n' \
      "$p" "$admin" "$W" "$UP" > "$W/pg.toml"
    valgrind --tool=callgrind --compress-strings=no --callgrind-out-file="$out" \
      "$bin" proxy --config "$W/pg.toml" > /dev/null 2> "$W/valgrind.err" &
    vg=$!
    PIDS+=("$vg")
    wait_port "$p"
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
