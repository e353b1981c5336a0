# What the loopback benches of the proxy share (scripts/bench-proxy.sh,
# scripts/instructions-per-request.sh): free ports, the wait for a listener, the nginx
# upstream that answers like a Pod's Workhorse, podgate's keys, tokens and config,
# and the runner's `jobs/request` as a wrk script. Sourced; every file goes under $W.

# A free TCP port on loopback.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Wait until something listens on port $1, up to $2 tries 50 ms apart (default 200).
wait_port() {
  for _ in $(seq 1 "${2:-200}"); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2
  return 1
}

# $W/upstream.conf: one nginx worker on port $1 answering 200 with a small JSON body.
upstream_conf() {
  cat > "$W/upstream.conf" <<EOF
worker_processes 1;
daemon off;
pid $W/upstream.pid;
error_log $W/upstream.err;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $W/b1; proxy_temp_path $W/p1; fastcgi_temp_path $W/f1; uwsgi_temp_path $W/u1; scgi_temp_path $W/s1;
  server { listen 127.0.0.1:$1; location / { return 200 '{"ok":true}'; } }
}
EOF
}

# With podgate binary $1: an Ed25519 key in $W/verify, and JWT and V1, a JWT and a
# GitLab v1 token for Pod 1.
bench_tokens() {
  "$1" token keygen --alg ed25519 --kid bench --out "$W/keys" > /dev/null
  mkdir -p "$W/verify"
  cp "$W/keys/bench.pem" "$W/verify/"
  JWT=$("$1" token mint --kind runner --pod 1 --ttl 1h --key "$W/keys/bench.private.pem")
  V1=$("$1" token mint-gitlab --prefix glrt- --cell 1 --org 1)
}

# A proxy config on stdout: listening on port $1, admin on $2, one worker, Pod 1 at
# the upstream's port $3.
proxy_toml() {
  cat <<EOF
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
threads = 1
grace_period_secs = 0
keys = ["$W/verify"]
[topology]
default_pod = 1
[[topology.pods]]
id = 1
name = "pod-1"
web = ["127.0.0.1:$3"]
EOF
}

# $W/$1.lua: a runner's `jobs/request` with token $2 in the JSON body, and in the
# `Runner-Token` header too when $3 is given.
runner_lua() {
  local header=""
  if [ -n "${3:-}" ]; then header="wrk.headers[\"Runner-Token\"] = \"$2\""; fi
  cat > "$W/$1.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
$header
wrk.body = '{"token":"$2","system_id":"s_0123456789ab","last_update":"0","info":{"name":"gitlab-runner","version":"17.6.0","executor":"docker","features":{"variables":true,"artifacts":true,"cache":true}}}'
EOF
}
