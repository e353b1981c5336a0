# `podgate up` for the Job Router benchmarks (scripts/bench-job-router.sh,
# scripts/bench-wake.sh): three Pods, each with its kas, the proxy a child of it, no
# fleet, no Kubernetes side, no jobs of its own. Sourced.
# shellcheck shell=bash

bench_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# bench_up BIN DIR: start it, its output in DIR/up.out (the `pod` lines) and
# DIR/up.err; sets LISTEN, ADMIN and UP_PID. Fails if it is not ready in 60 s.
bench_up() {
  local bin=$1 d=$2 _
  LISTEN=$(bench_port); ADMIN=$(bench_port)
  "$bin" up --no-fleet --no-kube --job-rate 0 --duration 30m \
    --listen "127.0.0.1:$LISTEN" --admin "127.0.0.1:$ADMIN" >"$d/up.out" 2>"$d/up.err" &
  UP_PID=$!
  for _ in $(seq 600); do
    grep -q "podgate up: ready" "$d/up.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "podgate up did not start"; cat "$d/up.err"; kill "$UP_PID"
  return 1
}
