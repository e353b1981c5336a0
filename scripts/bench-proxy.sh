#!/usr/bin/env bash
# Side-by-side benchmark on loopback: the same runner-like `POST /api/v4/jobs/request`
# (token in the JSON body, as old runners send it) against the upstream directly,
# podgate, and HAProxy and nginx as plain passthrough proxies. Prints req/s, p50, p99
# and the ratios. Every proxy gets one worker thread; wrk one thread.
#
# Two passes per target:
# - saturation: CONNS connections as fast as they go (req/s; latency there is mostly
#   queueing behind a busy CPU, as 3 processes share 2 cores);
# - one connection, one request at a time (the latency a proxy hop adds when nothing
#   queues): "added p50" compares this pass with the direct one.
#
# Three request shapes: the token in the JSON body as a JWT (`jwt`) and as a GitLab v1
# token (`v1`), as old runners send it, and a new runner's `RUNNER-TOKEN` header with
# the same token in the body (`hdr`: the proxy reads the body too, to check that the
# two agree).
#
#   ./scripts/bench-proxy.sh                 # 10 s per run, 32 connections
#   DURATION=30 CONNS=64 ./scripts/bench-proxy.sh
#   PODGATE=path/to/podgate ./scripts/bench-proxy.sh          # a binary already built
#   PODGATE_BASELINE=path/to/old/podgate ./scripts/bench-proxy.sh
#                                            # an older build side by side ("before")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

podgate_ensure_rust
podgate_ensure_system_packages
PODGATE_APT_PACKAGES=(wrk haproxy nginx)
podgate_ensure_system_packages

DURATION=${DURATION:-10}
CONNS=${CONNS:-32}

if [ -z "${PODGATE:-}" ]; then
  cargo build --release --locked --bin podgate >&2
  PODGATE=./target/release/podgate
fi
BASELINE=${PODGATE_BASELINE:-}

W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2
  return 1
}
UP=$(port); PG=$(port); HA=$(port); NX=$(port); ADMIN=$(port); PB=$(port); ADMIN_B=$(port)

# The upstream: nginx answering like a Pod's Workhorse, 200 with a small JSON body.
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
haproxy -f "$W/haproxy.cfg" -db >/dev/null 2>&1 & PIDS+=($!)

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
nginx -c "$W/nginx-proxy.conf" -p "$W" & PIDS+=($!)

# podgate: an Ed25519 key, a JWT and a GitLab v1 token for Pod 1.
$PODGATE token keygen --alg ed25519 --kid bench --out "$W/keys" >/dev/null
mkdir -p "$W/verify" && cp "$W/keys/bench.pem" "$W/verify/"
JWT=$($PODGATE token mint --kind runner --pod 1 --ttl 1h --key "$W/keys/bench.private.pem")
V1=$($PODGATE token mint-gitlab --prefix glrt- --cell 1 --org 1)
cat > "$W/proxy.toml" <<EOF
listen = "127.0.0.1:$PG"
admin_listen = "127.0.0.1:$ADMIN"
threads = 1
grace_period_secs = 0
keys = ["$W/verify"]
[topology]
default_pod = 1
[[topology.pods]]
id = 1
name = "pod-1"
web = ["127.0.0.1:$UP"]
EOF
$PODGATE proxy --config "$W/proxy.toml" & PIDS+=($!)
TARGETS="direct:$UP podgate:$PG haproxy:$HA nginx:$NX"
if [ -n "$BASELINE" ]; then
  sed -e "s/127.0.0.1:$PG/127.0.0.1:$PB/" -e "s/127.0.0.1:$ADMIN/127.0.0.1:$ADMIN_B/" \
    "$W/proxy.toml" > "$W/baseline.toml"
  "$BASELINE" proxy --config "$W/baseline.toml" & PIDS+=($!)
  TARGETS="direct:$UP before:$PB podgate:$PG haproxy:$HA nginx:$NX"
fi

for t in $TARGETS; do wait_port "${t##*:}"; done

lua() { # name token [header]
  local header=""
  if [ -n "${3:-}" ]; then header="wrk.headers[\"Runner-Token\"] = \"$2\""; fi
  cat > "$W/$1.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
$header
wrk.body = '{"token":"$2","system_id":"s_0123456789ab","last_update":"0","info":{"name":"gitlab-runner","version":"17.6.0","executor":"docker","features":{"variables":true,"artifacts":true,"cache":true}}}'
EOF
}
lua jwt "$JWT"
lua v1 "$V1"
lua hdr "$V1" header
TOKENS="jwt v1 hdr"

# Latency "312.00us" / "1.20ms" / "2.00s" → microseconds.
to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'; }

run() { # target port token [conns] → "rps p50 p99"
  local out
  out=$(wrk -t1 -c"${4:-$CONNS}" -d"${DURATION}s" --latency -s "$W/$3.lua" "http://127.0.0.1:$2/api/v4/jobs/request")
  local rps p50 p99 non2xx
  rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
  p50=$(to_us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
  p99=$(to_us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
  non2xx=$(awk '/Non-2xx/ { print $5 }' <<<"$out")
  if [ -n "$non2xx" ]; then echo "warning: $1 answered $non2xx non-2xx responses" >&2; fi
  echo "$rps $p50 $p99"
}

printf '%-6s %-9s %10s %8s %8s   %9s %8s %8s\n' token target "req/s" p50_us p99_us "1conn_r/s" p50_us p99_us
declare -A R L
for tok in $TOKENS; do
  for t in $TARGETS; do
    name=${t%%:*}; p=${t##*:}
    read -r rps p50 p99 < <(run "$name" "$p" "$tok")
    read -r lrps lp50 lp99 < <(run "$name" "$p" "$tok" 1)
    R[$tok.$name]="$rps $p50 $p99"
    L[$tok.$name]="$lrps $lp50 $lp99"
    printf '%-6s %-9s %10.0f %8.0f %8.0f   %9.0f %8.0f %8.0f\n' "$tok" "$name" "$rps" "$p50" "$p99" "$lrps" "$lp50" "$lp99"
  done
done
echo
for tok in $TOKENS; do
  if [ -n "$BASELINE" ]; then
    read -r g_rps _ _ <<<"${R[$tok.podgate]}"
    read -r b_rps _ _ <<<"${R[$tok.before]}"
    read -r _ d_p50 _ <<<"${L[$tok.direct]}"
    read -r _ g_p50 _ <<<"${L[$tok.podgate]}"
    read -r _ b_p50 _ <<<"${L[$tok.before]}"
    awk -v t="$tok" -v g="$g_rps" -v b="$b_rps" -v gp="$g_p50" -v bp="$b_p50" -v dp="$d_p50" 'BEGIN {
      printf "%-4s podgate/before req/s %.2fx; added p50 at one connection: podgate %.0f us, before %.0f us\n", t, g / b, gp - dp, bp - dp }'
  fi
  read -r g_rps _ _ <<<"${R[$tok.podgate]}"
  read -r h_rps _ _ <<<"${R[$tok.haproxy]}"
  read -r n_rps _ _ <<<"${R[$tok.nginx]}"
  read -r _ d_p50 _ <<<"${L[$tok.direct]}"
  read -r _ g_p50 _ <<<"${L[$tok.podgate]}"
  read -r _ h_p50 _ <<<"${L[$tok.haproxy]}"
  awk -v t="$tok" -v g="$g_rps" -v h="$h_rps" -v n="$n_rps" -v gp="$g_p50" -v dp="$d_p50" -v hp="$h_p50" 'BEGIN {
    printf "%-4s podgate/haproxy req/s %.2fx (goal >= 1.2x), podgate/nginx %.2fx; added p50 at one connection: podgate %.0f us (goal <= 100 us), haproxy %.0f us\n", t, g / h, g / n, gp - dp, hp - dp }'
done
