#!/bin/bash
# Idle runners on GitLab's Job Router beside the same runners on REST with edge holds:
# what reaches the Pods' `jobs/request`, CPU per idle runner per minute, and the
# memory a held call costs.
# usage: scripts/bench-job-router.sh <podgate binary, built with `sim`> [runners, default 1000] [seconds, default 60]
#
# For each mode (`router`: every runner on the Job Router; `rest`: every runner polls
# `jobs/request`, held at the proxy's edge) it starts `podgate up --no-fleet --no-kube
# --job-rate 0` (3 Pods, each with its kas, in one process; the proxy a child of it),
# then `podgate loadtest runners` with N runners (new ones: token in a header too)
# through the proxy. Once every runner is held (the kas `held` gauges, or the proxy's
# edge `held` gauge, reach 95% of N) it reads, over the next SECONDS:
# - the Pods' `jobs/request` requests (podsim_requests_total{endpoint="jobs_request"});
# - CPU (utime + stime, /proc/PID/stat) of `podgate up` (Pods, their Redis watches,
#   kas) and of the proxy;
# - VmRSS of `podgate up` at the start of the window.
# One line per mode:
#   mode= runners= held= pod_jobs_request_before= pod_jobs_request_window= up_cpu_ms= proxy_cpu_ms=
#   cpu_ms_per_runner_minute= up_rss_kb= proxy_rss_kb=
# The memory a held GetJob costs kas is (up_rss_kb(router) - up_rss_kb(rest)) / held:
# both runs hold the same runners' state in the Pods.
set -u
bin=$1; n=${2:-1000}; secs=${3:-60}
tick=$(getconf CLK_TCK)
. "$(dirname "$0")/lib/bench_up.sh"
cpu_ms() { awk -v t="$tick" '{print int(($14+$15)*1000/t)}' "/proc/$1/stat"; }
rss_kb() { awk '$1=="VmRSS:"{print $2}' "/proc/$1/status"; }
metric_sum() { curl -s "$1" | awk -v m="$2" 'index($0,m)==1{s+=$NF} END{print s+0}'; }

run() {
  local mode=$1 share d listen admin up_pid proxy_pid load_pid
  [ "$mode" = router ] && share=1 || share=0
  d=$(mktemp -d /tmp/jrbench.XXXXXX)
  bench_up "$bin" "$d" || return 1
  listen=$LISTEN admin=$ADMIN up_pid=$UP_PID
  proxy_pid=$(pgrep -P "$up_pid" | head -n1)
  mapfile -t pods < <(grep -o 'address=http://[^ ]*' "$d/up.out" | cut -d= -f2)
  mapfile -t kas < <(grep -o 'kas_metrics=[^ ]*' "$d/up.out" | cut -d= -f2)
  toks=(); for t in $(grep -o 'registration_token=[^ ]*' "$d/up.out" | cut -d= -f2); do toks+=(--registration-token "$t"); done
  "$bin" loadtest runners --target "http://127.0.0.1:$listen" "${toks[@]}" --runners "$n" \
    --old-share 0 --job-router-share "$share" --duration $((secs + 180))s > "$d/load.out" 2> "$d/load.err" &
  load_pid=$!
  local held=0 want=$((n * 95 / 100))
  for _ in $(seq 1800); do
    if [ "$mode" = router ]; then
      held=0; for k in "${kas[@]}"; do held=$((held + $(metric_sum "$k" "podgate_kas_job_router_held "))); done
    else
      held=$(metric_sum "http://127.0.0.1:$admin/metrics" "podgate_proxy_edge_polls_held{")
    fi
    [ "$held" -ge "$want" ] && break
    sleep 0.1
  done
  local before=0 after=0 p
  for p in "${pods[@]}"; do before=$((before + $(metric_sum "$p/metrics" 'podsim_requests_total{endpoint="jobs_request"'))); done
  local c0 pc0 rss prss
  c0=$(cpu_ms "$up_pid"); pc0=$(cpu_ms "$proxy_pid"); rss=$(rss_kb "$up_pid"); prss=$(rss_kb "$proxy_pid")
  sleep "$secs"
  local c1 pc1
  c1=$(cpu_ms "$up_pid"); pc1=$(cpu_ms "$proxy_pid")
  for p in "${pods[@]}"; do after=$((after + $(metric_sum "$p/metrics" 'podsim_requests_total{endpoint="jobs_request"'))); done
  local cpu=$((c1 - c0)) pcpu=$((pc1 - pc0))
  echo "mode=$mode runners=$n held=$held pod_jobs_request_before=$before pod_jobs_request_window=$((after - before)) up_cpu_ms=$cpu proxy_cpu_ms=$pcpu cpu_ms_per_runner_minute=$(python3 -c "print(round(($cpu+$pcpu)/$n*60/$secs,3))") up_rss_kb=$rss proxy_rss_kb=$prss"
  kill "$load_pid" "$up_pid" 2>/dev/null; wait "$load_pid" "$up_pid" 2>/dev/null
  rm -rf "$d"
}

run router
run rest
