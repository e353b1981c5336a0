#!/usr/bin/env bash
# Side-by-side benchmark on loopback: the same runner-like `POST /api/v4/jobs/request`
# against the upstream directly, podgate, and HAProxy and nginx as plain passthrough
# proxies (and an older podgate build when PODGATE_BASELINE is given), all from one run.
# Every proxy gets one worker thread; wrk one thread.
#
# Per repeat (REPEATS, default 3; the target order rotates between repeats so slow
# drift on a shared machine does not always hit the same target), per request shape,
# per target:
# - saturation: CONNS connections as fast as they go for DURATION s: req/s, and the
#   proxy process's CPU per request (utime/stime from /proc/<pid>/stat over the pass
#   divided by the requests served; user and system apart);
# - one connection, one request at a time for LAT_DURATION s: the latency a hop adds
#   when nothing queues ("added p50" compares this pass with the direct one of the
#   same repeat). wrk, the proxy and the upstream all run on one CPU (LAT_CPU, default
#   the last; LAT_CPU= to leave them free) for this pass: the chain is serial at one
#   connection, and spread over CPUs the figure jumps between two modes (~40 and
#   ~95 µs here) with which vCPU has to be woken;
# - a shorter pass (STRACE_DURATION s) under `strace -c -f -p <pid>`: syscalls per
#   request, by name (strace slows the process; only the counts are used).
# scripts/lib/bench_report.py then takes the median over the repeats of every figure,
# prints them with the ratios against HAProxy as the headline, and writes all of it,
# every sample included, to JSON (default target/bench-proxy.json).
#
# podgate runs twice: as configured by default (`podgate`: runner requests on the HTTP/1
# fast path) and with `fast_path = false` (`pingora`: every request through
# pingora-proxy), so the two paths are compared in the same run (PINGORA=0 skips it).
#
# Three request shapes (TOKENS): the token in the JSON body as a JWT (`jwt`) and as a
# GitLab v1 token (`v1`), as old runners send it, and a new runner's `RUNNER-TOKEN`
# header with the same token in the body (`hdr`: the proxy reads the body too, to check
# that the two agree).
#
#   ./scripts/bench-proxy.sh                       # 3 repeats, 5 s passes, 32 connections
#   REPEATS=5 DURATION=10 CONNS=64 TOKENS=jwt ./scripts/bench-proxy.sh
#   PODGATE=path/to/podgate ./scripts/bench-proxy.sh          # a binary already built
#   PODGATE_BASELINE=path/to/old/podgate ./scripts/bench-proxy.sh
#                                                  # an older build side by side ("before")
#   JSON=/tmp/bench.json ./scripts/bench-proxy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh
. scripts/lib/loopback.sh

podgate_ensure_rust
podgate_ensure_system_packages
PODGATE_APT_PACKAGES=(wrk haproxy nginx strace)
podgate_ensure_system_packages

REPEATS=${REPEATS:-3}
DURATION=${DURATION:-5}
LAT_DURATION=${LAT_DURATION:-$DURATION}
STRACE_DURATION=${STRACE_DURATION:-2}
CONNS=${CONNS:-32}
LAT_CPU=${LAT_CPU-$(($(nproc) - 1))}
TOKENS=${TOKENS:-jwt v1 hdr}
JSON=${JSON:-target/bench-proxy.json}

if [ -z "${PODGATE:-}" ]; then
  cargo build --release --locked --bin podgate >&2
  PODGATE=./target/release/podgate
fi
BASELINE=${PODGATE_BASELINE:-}

W=$(mktemp -d)
RAW=$W/raw
mkdir -p "$RAW"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

UP=$(port); PG=$(port); HA=$(port); NX=$(port); ADMIN=$(port); PB=$(port); ADMIN_B=$(port)
PP=$(port); ADMIN_P=$(port)
PINGORA=${PINGORA:-1}

# The upstream: nginx answering like a Pod's Workhorse, 200 with a small JSON body.
upstream_conf "$UP"
nginx -c "$W/upstream.conf" -p "$W" & PIDS+=($!); PID_direct=$!

cat > "$W/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 8192
defaults
  mode http
  timeout connect 2s
  timeout client 150s
  timeout server 150s
  http-reuse always
frontend fe
  bind 127.0.0.1:$HA
  default_backend be
backend be
  server pod1 127.0.0.1:$UP
EOF
haproxy -f "$W/haproxy.cfg" -db >/dev/null 2>&1 & PIDS+=($!); PID_haproxy=$!

cat > "$W/nginx-proxy.conf" <<EOF
worker_processes 1;
daemon off;
pid $W/proxy.pid;
error_log $W/proxy.err;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $W/b2; proxy_temp_path $W/p2; fastcgi_temp_path $W/f2; uwsgi_temp_path $W/u2; scgi_temp_path $W/s2;
  upstream pod1 { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$NX;
    location / { proxy_pass http://pod1; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
nginx -c "$W/nginx-proxy.conf" -p "$W" & PIDS+=($!); PID_nginx=$!

# podgate: an Ed25519 key, a JWT and a GitLab v1 token for Pod 1.
bench_tokens "$PODGATE"
proxy_toml "$PG" "$ADMIN" "$UP" > "$W/proxy.toml"
$PODGATE proxy --config "$W/proxy.toml" & PIDS+=($!); PID_podgate=$!
TARGETS="direct:$UP podgate:$PG haproxy:$HA nginx:$NX"
if [ "$PINGORA" = 1 ]; then
  { echo "fast_path = false"
    sed -e "s/127.0.0.1:$PG/127.0.0.1:$PP/" -e "s/127.0.0.1:$ADMIN/127.0.0.1:$ADMIN_P/" "$W/proxy.toml"
  } > "$W/pingora.toml"
  $PODGATE proxy --config "$W/pingora.toml" & PIDS+=($!); PID_pingora=$!
  TARGETS="direct:$UP pingora:$PP podgate:$PG haproxy:$HA nginx:$NX"
fi
if [ -n "$BASELINE" ]; then
  sed -e "s/127.0.0.1:$PG/127.0.0.1:$PB/" -e "s/127.0.0.1:$ADMIN/127.0.0.1:$ADMIN_B/" \
    "$W/proxy.toml" > "$W/baseline.toml"
  "$BASELINE" proxy --config "$W/baseline.toml" & PIDS+=($!); PID_before=$!
  TARGETS="direct:$UP before:$PB ${TARGETS#direct:$UP }"
fi

for t in $TARGETS; do wait_port "${t##*:}"; done

runner_lua jwt "$JWT"
runner_lua v1 "$V1"
runner_lua hdr "$V1" header

# The processes doing a target's work: the one started and its children (nginx's
# worker under its master).
procs() { local p=$1; echo "$p" $(pgrep -P "$p" || true); }
# utime and stime (clock ticks) summed over processes, from /proc/<pid>/stat (fields 14
# and 15, counted after the parenthesised command name).
ticks() {
  local u=0 s=0 p f
  for p in "$@"; do
    read -r -a f <<<"$(sed 's/.*) //' "/proc/$p/stat")"
    u=$((u + f[11])); s=$((s + f[12]))
  done
  echo "$u $s"
}

# Move every thread of the given processes to the CPUs in $1 (no-op when $1 is empty).
pin() {
  local cpus=$1 p; shift
  [ -n "$cpus" ] || return 0
  for p in "$@"; do taskset -a -p -c "$cpus" "$p" > /dev/null; done
}

wrk_run() { # port token conns seconds; on the CPUs in $WRK_CPU if set
  ${WRK_CPU:+taskset -c "$WRK_CPU"} wrk -t1 -c"$3" -d"$4s" --latency -s "$W/$2.lua" "http://127.0.0.1:$1/api/v4/jobs/request"
}

measure() { # repeat token name port
  local f="$RAW/$1.$2.$3" pid="PID_$3" pids before after sp
  pids=$(procs "${!pid}")
  before=$(ticks $pids)
  wrk_run "$4" "$2" "$CONNS" "$DURATION" > "$f.sat.wrk"
  after=$(ticks $pids)
  echo "$before $after $(getconf CLK_TCK)" > "$f.sat.cpu"
  pin "$LAT_CPU" $pids $(procs "$PID_direct")
  WRK_CPU=$LAT_CPU wrk_run "$4" "$2" 1 "$LAT_DURATION" > "$f.lat.wrk"
  pin "0-$(($(nproc) - 1))" $pids $(procs "$PID_direct")
  : > "$f.strace.err"
  strace -c -f $(printf -- '-p %s ' $pids) -o "$f.strace.txt" 2> "$f.strace.err" & sp=$!
  for _ in $(seq 1 100); do grep -q attached "$f.strace.err" && break; sleep 0.02; done
  sleep 0.2
  wrk_run "$4" "$2" "$CONNS" "$STRACE_DURATION" > "$f.strace.wrk"
  kill -INT "$sp"; wait "$sp" || true
  rm -f "$f.strace.err"
  echo "  $1 $2 $3: $(awk '/^Requests\/sec/ { printf "%.0f req/s", $2 }' "$f.sat.wrk")" >&2
}

read -r -a T <<<"$TARGETS"
for t in "${T[@]}"; do wrk_run "${t##*:}" jwt 4 1 > /dev/null; done # warm up
for rep in $(seq 1 "$REPEATS"); do
  echo "repeat $rep/$REPEATS" >&2
  # rotate the target order by one per repeat
  shift_by=$(( (rep - 1) % ${#T[@]} ))
  order=("${T[@]:$shift_by}" "${T[@]:0:$shift_by}")
  for tok in $TOKENS; do
    for t in "${order[@]}"; do measure "$rep" "$tok" "${t%%:*}" "${t##*:}"; done
  done
done

echo
python3 scripts/lib/bench_report.py --dir "$RAW" --json "$JSON" \
  --config "repeats=$REPEATS" --config "duration_s=$DURATION" \
  --config "lat_duration_s=$LAT_DURATION" --config "strace_duration_s=$STRACE_DURATION" \
  --config "conns=$CONNS" --config "lat_cpu=$LAT_CPU" --config "podgate=$PODGATE" --config "baseline=$BASELINE" \
  --config "cpus=$(nproc)" --config "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
