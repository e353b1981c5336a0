#!/bin/bash
# Wake latency: the time from a job queued to its runner's held poll answered, with
# N runners held, on GitLab's Job Router (GetJob held at each Pod's kas) beside REST
# (jobs/request held at the proxy's edge). Same machine, same `podgate up`.
# usage: scripts/bench-wake.sh <podgate binary, built with `sim`> [runners, default 1000] [samples, default 300]
#
# Per mode it starts `podgate up --no-fleet --no-kube --job-rate 0` (3 Pods, each with
# its kas), then `podgate loadtest wake` (loadtest/src/wake.rs): N runners, each with
# its own tag so a job queued for it wakes it alone, every one held; then SAMPLES jobs
# queued one at a time through the Pods' control API. One JSON line per mode:
# {"mode","runners","held","samples","lost","p50_ms","p90_ms","p99_ms","max_ms",…}
set -u
bin=$1; n=${2:-1000}; samples=${3:-300}
. "$(dirname "$0")/lib/bench_up.sh"

run() {
  local mode=$1 d args=() held=()
  d=$(mktemp -d /tmp/wakebench.XXXXXX)
  bench_up "$bin" "$d" || return 1
  while read -r addr tok kas; do
    args+=(--pod "$tok" "$addr")
    [ "$mode" = router ] && held+=(--held "$kas" "podgate_kas_job_router_held ")
  done < <(grep ' pod id=' "$d/up.out" | sed -E 's/.*address=([^ ]*) registration_token=([^ ]*) .*kas_metrics=([^ ]*).*/\1 \2 \3/')
  [ "$mode" = rest ] && held+=(--held "http://127.0.0.1:$ADMIN/metrics" "podgate_proxy_edge_polls_held{")
  "$bin" loadtest wake --target "http://127.0.0.1:$LISTEN" "${args[@]}" "${held[@]}" \
    --runners "$n" --samples "$samples" --mode "$mode" 2> "$d/wake.err" | tail -n1
  kill "$UP_PID" 2>/dev/null; wait "$UP_PID" 2>/dev/null
  rm -rf "$d"
}

run router
run rest
