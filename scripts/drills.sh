#!/usr/bin/env bash
# Fault drills (issue 15): break one part of the podgate system while a runner fleet
# works through it, print the figures, and check the ledger.
#
#   ./scripts/drills.sh                 # every drill: R2 R3 R4 R5 R7 R8 R9 R10
#   ./scripts/drills.sh R4 R5           # a subset
#   ./scripts/drills.sh --smoke         # each drill for seconds (tests/drills_smoke.rs)
#   SOAK=30m ./scripts/drills.sh R7     # the soak's length (default 2m; --soak 30m too)
#   SOAK_PCT=25 ./scripts/drills.sh R7  # its load, percent of the measured capacity (50)
#   PODGATE=target/debug/podgate ./scripts/drills.sh   # a binary already built
#
# How the system is run: as separate processes, not `podgate up` (which runs its Pods
# inside its own process, so none could be killed alone). Per drill, on ephemeral
# loopback ports, all children stopped on exit (trap):
#   - redis-server: the registry's topology and the Pods' runner queue keys (the
#     Redis the proxy watches to hold long polls at the edge), as `podgate up --redis`;
#   - `podgate pod-sim` x3 (Pods 1-3, Pod 1 the default), each with a registration
#     token minted here, so a restarted Pod takes the same one;
#   - `podgate loadtest drill topology-owner`: writes the topology into Redis and
#     again whenever Redis holds none (what owns the topology in production);
#   - `podgate proxy` with `[registry]` in that Redis and active health checks every
#     HEALTH_MS with rise = fall = 1 (so "one health interval" is one check; R7
#     keeps fall = rise = 3 and a 1 s timeout, so a busy CPU takes no Pod out);
#   - for R2 and R3 also two `podgate kas` (Pod 1's kas pool), `podgate kube-sim`
#     and one `podgate agentk` dialling kas through the proxy;
#   - `podgate loadtest runners`: the fleet (its JSON report is what the ledger
#     check reads), and `podgate loadtest drill probe`: one runner per Pod asking
#     `runners/verify` through the proxy in turn, each request logged with its time.
# After each drill `podgate loadtest drill ledger-check` reads every Pod's ledger
# (`GET /-/podsim/ledger`) and the fleet's report: every job the fleet picked up
# finished exactly once, on the Pod that issued it; no request answered by a Pod
# that does not own its token. Its last line, `ledger check: ok`, is what the smoke
# test looks for; this script exits 1 when any drill fails.
#
# Drills:
#   R2  Redis killed (SIGKILL) and restarted empty: the proxy keeps routing on its
#       last topology, kas answers GetPods for the agent it holds; the topology
#       owner writes the topology again, kas re-registers its agent (refresh
#       after resync) and answers GetPods for it again (within GETPODS_WAIT s);
#       figures: requests and failures during the outage, time until each is back.
#   R3  the kas holding the agent SIGKILLed: agentk reconnects through the proxy to
#       the other kas; GitLab's GetPods (`drill get-pods`) through the surviving kas
#       answers again; the killed kas's registry entries expire within the TTL.
#   R4  Pod 3 SIGKILLed: its requests get 503 + Retry-After within one health
#       interval, Pods 1 and 2 see no failure, and it serves again once restarted.
#   R5  the proxy upgraded under load (a new `podgate proxy --upgrade`, SIGQUIT to
#       the old one, as tests/proxy_ops.rs does): zero failed requests; the idle
#       client connections the old one handed to the new one are counted.
#   R8  a Cell's kas SIGKILLed while the fleet's runners (all on GitLab's Job Router:
#       every Pod has its kas, jr_prepare) hold GetJob calls there: that Pod's
#       runners see UNAVAILABLE, their breaker trips and they poll jobs/request
#       (REST, held at the proxy's edge) and still get that Pod's jobs; the other
#       Pods' runners see nothing; the kas restarted, they come back to it once
#       their breaker lets a call through (30 s, gitlab-runner's).
#   R9  Redis (the Cells' runner queue keys, and the topology) SIGKILLed and
#       restarted empty while runners hold GetJob at every kas: kas stops holding
#       (each call goes to Rails at once) and holds again once the Redis is back
#       and the Pods write the keys again; the fleet loses nothing.
#   R10 the Topology Service stopped under the fleet, with path-routed requests
#       flowing (`drill path-probe`: each Pod's group and organization pages, and a
#       namespace no cache holds): hung (SIGSTOP) for half the outage, then killed,
#       then restarted on the same claims (in the drill's Redis). No path-routed
#       request fails or reaches a Pod other than its namespace's (owners known
#       keep routing past their cache time); uncached ones fall through to the
#       default Pod within the deadline (TS_DEADLINE_MS); the token probe and the
#       fleet see nothing; once it is back the proxy gets owners again, and a group
#       claimed after the restart reaches its Pod at its first request.
#   R7  soak: capacity measured beside the fleet (`podgate loadtest http` on
#       runners/verify, 64 in flight, CAP_S s: 2xx per second; at most CAP_RATE
#       requests a second, since the generator sends CAP_RATE * CAP_S requests in all
#       and waits for them: 2000 with --smoke, or a busy machine's run outlasts
#       the smoke test), then half of it for SOAK; VmRSS of every process (not the
#       load generator's) sampled every RSS_EVERY s, the first quarter's mean
#       against the last's (`drill rss-check`: at most 20 % or 8 MiB more); no
#       failed request. The fleet is mixed: every Pod has its kas, and half the
#       runners take jobs through the Job Router (JR_SHARE, default 0.5); every
#       kas's RSS is sampled with the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/deps.sh

SMOKE=0
DRILLS=()
SOAK=${SOAK:-2m}
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --soak) SOAK=$2; shift ;;
    --soak=*) SOAK=${1#--soak=} ;;
    R2|R3|R4|R5|R7|R8|R9|R10) DRILLS+=("$1") ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "drills.sh: unknown argument $1 (R2 R3 R4 R5 R7 R8 R9 R10 --smoke --soak DURATION)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#DRILLS[@]} -gt 0 ] || DRILLS=(R2 R3 R4 R5 R7 R8 R9 R10)

if [ -z "${PODGATE:-}" ]; then
  podgate_ensure_rust
  PODGATE_APT_PACKAGES+=(jq curl)
  podgate_ensure_system_packages
  cargo build --release --locked --bin podgate >&2
  PODGATE=./target/release/podgate
else
  for tool in redis-server jq curl; do
    command -v "$tool" >/dev/null || { echo "drills.sh: $tool is missing" >&2; exit 1; }
  done
fi
PODGATE=$(realpath "$PODGATE")

secs() { # 90, 90s, 5m, 1h -> seconds
  case "$1" in
    *h) echo $(( ${1%h} * 3600 )) ;;
    *m) echo $(( ${1%m} * 60 )) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}

# Lengths (seconds): full run, or --smoke.
if [ "$SMOKE" = 1 ]; then
  RUN=12 OUTAGE=3 SOAK_S=10 CAP_S=2 CAP_RATE=2000 RUNNERS=12 JOB_RATE=4 RSS_EVERY=1 GETPODS_WAIT=${GETPODS_WAIT:-20}
else
  RUN=${RUN:-90} OUTAGE=${OUTAGE:-15} SOAK_S=$(secs "$SOAK") CAP_S=${CAP_S:-5} CAP_RATE=${CAP_RATE:-100000}
  RUNNERS=${RUNNERS:-30} JOB_RATE=${JOB_RATE:-5} RSS_EVERY=${RSS_EVERY:-5}
fi
HEALTH_MS=${HEALTH_MS:-1000}
GETPODS_WAIT=${GETPODS_WAIT:-120}
SOAK_PCT=${SOAK_PCT:-50}   # R7's load, percent of the measured capacity
LONG_POLL=${LONG_POLL:-10}
# Jobs pending per Pod at most: the generator (JOB_RATE) pauses there, so a soak's
# Pods hold a steady backlog rather than every job the fleet had no time for.
MAX_PENDING=${MAX_PENDING:-200}

W=$(mktemp -d /tmp/podgate-drills.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "drills.sh: logs kept in $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. scripts/lib/drills_system.sh

FAILED=()
check() { # check NAME CONDITION-RESULT MESSAGE
  if [ "$2" = ok ]; then say "  check $1: ok"; else say "  check $1: FAILED ($3)"; DRILL_OK=0; fi
}

# --- drills ----------------------------------------------------------------------

drill_R2() {
  system_up R2 --kas
  fleet_start "$RUN"; probe_start
  sleep $(( RUN / 3 ))
  local held local_kas=1 k
  held=$(agent_kas | head -1)
  for k in 1 2; do if [ "$held" = "127.0.0.1:${KAS_INT[$k]}" ]; then local_kas=$k; fi; done
  local kill_ms restart_ms back_ms=0 up_ms=0 agent_ms=0 _ during_outage
  kill_ms=$(now_ms)
  kill -KILL "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true
  sleep $(( OUTAGE / 2 ))
  # kas serves the agent it holds without Redis.
  during_outage=$(get_pods "$local_kas" 5s)
  sleep $(( OUTAGE - OUTAGE / 2 ))
  restart_ms=$(now_ms)
  redis_start
  # Recovered: the topology owner wrote it again, and the proxy's registry is up.
  for _ in $(seq 1 600); do
    if [ "$back_ms" = 0 ] && grep -q 'wrote the topology' <(awk -v t="$restart_ms" '$1 >= t' "$D/owner.log"); then
      back_ms=$(awk -v t="$restart_ms" '$1 >= t && /wrote the topology/ {print $1; exit}' "$D/owner.log")
    fi
    if [ "$up_ms" = 0 ] && curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -q '^podgate_registry_backend_up 1'; then
      up_ms=$(now_ms)
    fi
    if [ "$agent_ms" = 0 ] && [ -n "$(agent_kas)" ]; then agent_ms=$(now_ms); fi
    [ "$back_ms" != 0 ] && [ "$up_ms" != 0 ] && [ "$agent_ms" != 0 ] && break
    sleep 0.1
  done
  fleet_wait; probe_stop
  local outage after
  outage=$(probe_stats --from "$kill_ms" --to "$restart_ms")
  after=$(probe_stats --from "$restart_ms")
  say "  outage ${OUTAGE}s: probe requests $(jq .requests <<<"$outage"), failed $(jq .failed <<<"$outage") (statuses $(jq -c .statuses <<<"$outage"))"
  say "  after restart: probe requests $(jq .requests <<<"$after"), failed $(jq .failed <<<"$after")"
  say "  recovery after Redis restarted empty: topology rewritten in $(( back_ms > 0 ? back_ms - restart_ms : -1 )) ms, proxy registry up again in $(( up_ms > 0 ? up_ms - restart_ms : -1 )) ms, agent $AGENT_ID registered again in $(( agent_ms > 0 ? agent_ms - restart_ms : -1 )) ms"
  say "  kas$local_kas during the outage, GetPods for its own agent: $during_outage"
  # GetPods on the same kas once Redis is back, each call given 25 s, until one is
  # answered (asking for at most GETPODS_WAIT s).
  local after_get="" get_ms=0 stalled=0 get_until get_start
  get_start=$(now_ms)
  get_until=$(( get_start + GETPODS_WAIT * 1000 ))
  while [ "$(now_ms)" -lt "$get_until" ]; do
    after_get=$(get_pods "$local_kas" 25s)
    if [ "$(jq -r .ok <<<"$after_get")" = true ]; then get_ms=$(( $(now_ms) - restart_ms )); break; fi
    stalled=$(( stalled + 1 ))
  done
  say "  GetPods on kas$local_kas after the restart (asked once the fleet's run ended, $(( get_start - restart_ms )) ms after it): $([ "$get_ms" != 0 ] && echo "answered in $(jq .ms <<<"$after_get") ms; $stalled calls before it unanswered in 25 s" || echo "not answered within ${GETPODS_WAIT} s"): $after_get"
  say "  fleet: $(jq -c '{jobs_done, misroutes, unexpected, jobs_request}' "$D/fleet.json")"
  check "routing during the outage" "$([ "$(jq .failed <<<"$outage")" = 0 ] && [ "$(jq .requests <<<"$outage")" -gt 0 ] && echo ok)" "failed or no probe requests during the outage"
  check "recovered without an operator" "$([ "$back_ms" != 0 ] && [ "$up_ms" != 0 ] && [ "$agent_ms" != 0 ] && echo ok)" "topology, registry or agent presence not back"
  check "GetPods after recovery" "$([ "$get_ms" != 0 ] && echo ok)" "$after_get"
  check "kas served its agent during the outage" "$([ "$(jq -r .ok <<<"$during_outage")" = true ] && echo ok)" "$during_outage"
  ledger_check || DRILL_OK=0
}

drill_R3() {
  system_up R3 --kas
  fleet_start "$RUN"; probe_start
  sleep $(( RUN / 4 ))
  local held victim="" survivor="" k
  held=$(agent_kas | head -1)
  for k in 1 2; do
    if [ "$held" = "127.0.0.1:${KAS_INT[$k]}" ]; then victim=$k; else survivor=$k; fi
  done
  if [ -z "$victim" ]; then say "  the agent is on no known kas ($held)"; DRILL_OK=0; fleet_wait; probe_stop; return; fi
  local before; before=$(get_pods "$survivor")
  say "  agent $AGENT_ID on kas$victim; GetPods through kas$survivor before the kill (kas->kas): $before"
  local kill_ms ok_ms=0 gone_ms=0 inst_ms=0 answer="" _
  kill_ms=$(now_ms)
  kill -KILL "${KAS_PID[$victim]}"; wait "${KAS_PID[$victim]}" 2>/dev/null || true
  # GetPods through the survivor until the agent, reconnected through the proxy, answers.
  for _ in $(seq 1 60); do
    answer=$(get_pods "$survivor" 5s)
    if [ "$(jq -r .ok <<<"$answer")" = true ]; then ok_ms=$(now_ms); break; fi
    sleep 0.2
  done
  # The killed kas's registry entries expire (it could not remove them).
  for _ in $(seq 1 $(( (KAS_TTL * 3 + 10) * 10 ))); do
    if [ "$gone_ms" = 0 ] && ! agent_kas | grep -qx "127.0.0.1:${KAS_INT[$victim]}"; then gone_ms=$(now_ms); fi
    if [ "$inst_ms" = 0 ] && ! kas_instances | grep -qx "127.0.0.1:${KAS_INT[$victim]}"; then inst_ms=$(now_ms); fi
    [ "$gone_ms" != 0 ] && [ "$inst_ms" != 0 ] && break
    sleep 0.1
  done
  local now_on; now_on=$(agent_kas | tr '\n' ' ')
  fleet_wait; probe_stop
  say "  kas$victim SIGKILLed: GetPods through kas$survivor answered again after $(( ok_ms > 0 ? ok_ms - kill_ms : -1 )) ms: $answer"
  say "  registry: the agent's entry on kas$victim gone after $(( gone_ms > 0 ? gone_ms - kill_ms : -1 )) ms, kas$victim's instance after $(( inst_ms > 0 ? inst_ms - kill_ms : -1 )) ms (TTL ${KAS_TTL}s); agent now on: $now_on"
  check "GetPods re-routed" "$([ "$ok_ms" != 0 ] && echo ok)" "GetPods never answered after the kill"
  check "entries expired within the TTL" "$([ "$gone_ms" != 0 ] && [ "$inst_ms" != 0 ] && [ $(( inst_ms - kill_ms )) -le $(( KAS_TTL * 1000 + KAS_TTL * 1000 / 3 + 1000 )) ] && echo ok)" "entries of the killed kas still there"
  check "agent on the surviving kas" "$(grep -q "127.0.0.1:${KAS_INT[$survivor]}" <<<"$now_on" && echo ok)" "agent on: $now_on"
  ledger_check || DRILL_OK=0
}

drill_R4() {
  system_up R4
  fleet_start "$RUN"; probe_start
  sleep $(( RUN / 3 ))
  local kill_ms restart_ms down up others _
  kill_ms=$(now_ms)
  kill -KILL "${POD_PID[3]}"; wait "${POD_PID[3]}" 2>/dev/null || true
  # 503 + Retry-After for Pod 3, within one health interval.
  for _ in $(seq 1 300); do
    [ "$(probe_stats --pod 3 --from "$kill_ms" | jq .first_503_retry_after_ms)" != null ] && break
    sleep 0.1
  done
  sleep "$OUTAGE"
  restart_ms=$(now_ms)
  pod_start 3
  for _ in $(seq 1 300); do
    [ "$(probe_stats --pod 3 --from "$restart_ms" | jq .first_ok_ms)" != null ] && break
    sleep 0.1
  done
  sleep 1
  fleet_wait; probe_stop
  down=$(probe_stats --pod 3 --from "$kill_ms" --to "$restart_ms")
  up=$(probe_stats --pod 3 --from "$restart_ms")
  local o1 o2
  o1=$(probe_stats --pod 1 --from "$kill_ms")
  o2=$(probe_stats --pod 2 --from "$kill_ms")
  local d503 dfirst dup
  d503=$(jq .first_503_retry_after_ms <<<"$down")
  dup=$(jq .first_ok_ms <<<"$up")
  dfirst=$(jq .first_failure_ms <<<"$down")
  say "  Pod 3 killed: first failure after ${dfirst} ms, first 503 + Retry-After after ${d503} ms (health interval ${HEALTH_MS} ms); while down: $(jq -c .statuses <<<"$down"), 503 without Retry-After: $(jq .unanswered_503_without_retry_after <<<"$down")"
  say "  Pod 3 restarted: serving again after ${dup} ms"
  say "  Pods 1 and 2 from the kill on: $(jq .requests <<<"$o1")+$(jq .requests <<<"$o2") probe requests, failed $(jq .failed <<<"$o1")+$(jq .failed <<<"$o2")"
  check "503 + Retry-After within one health interval" "$([ "$d503" != null ] && [ "$d503" -le $(( HEALTH_MS + 500 )) ] && echo ok)" "first 503 + Retry-After after $d503 ms"
  check "Pod 3 back after restart" "$([ "$dup" != null ] && echo ok)" "no answer from Pod 3 after its restart"
  check "Pods 1 and 2 unaffected" "$([ "$(jq .failed <<<"$o1")" = 0 ] && [ "$(jq .failed <<<"$o2")" = 0 ] && echo ok)" "failures on Pods 1 or 2"
  ledger_check --restarted 3 || DRILL_OK=0
}

drill_R5() {
  system_up R5
  fleet_start "$RUN"; probe_start
  sleep $(( RUN / 3 ))
  local old=$PROXY_PID t0 t1
  t0=$(now_ms)
  proxy_start --upgrade
  sleep 0.5
  kill -QUIT "$old"
  wait "$old" 2>/dev/null || true
  t1=$(now_ms)
  sleep 1
  kill -0 "$PROXY_PID" 2>/dev/null || { say "  the new proxy is not running"; DRILL_OK=0; }
  fleet_wait; probe_stop
  local all during
  all=$(probe_stats)
  during=$(probe_stats --from "$t0" --to "$t1")
  local handed
  handed=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | sed -n 's/^podgate_proxy_upgrade_connections_total{result="received"} //p')
  say "  upgrade: old proxy (pid $old) gone $(( t1 - t0 )) ms after the new one (pid $PROXY_PID) started; idle client connections it handed over: ${handed:-0}"
  say "  probe: $(jq .requests <<<"$all") requests, failed $(jq .failed <<<"$all"); during the hand-over $(jq .requests <<<"$during"), failed $(jq .failed <<<"$during")"
  check "zero failed probe requests" "$([ "$(jq .failed <<<"$all")" = 0 ] && echo ok)" "$(jq -c .statuses <<<"$all")"
  ledger_check --no-failed-requests || DRILL_OK=0
}

drill_R7() {
  JR_SHARE=${JR_SHARE_R7:-0.5}
  system_up R7 --job-router
  local token
  token=$(curl -s -X POST "http://127.0.0.1:$PROXY_PORT/api/v4/runners" -H 'content-type: application/json' \
    -d "{\"token\":\"${REG[2]}\"}" | jq -r .token)
  local url="http://127.0.0.1:$PROXY_PORT/api/v4/runners/verify" body="{\"token\":\"$token\"}"
  # The fleet and the probe run throughout: capacity is measured beside them.
  fleet_start $(( CAP_S + SOAK_S + 3 )); probe_start
  "$PODGATE" loadtest http --url "$url" --method POST --header 'content-type: application/json' \
    --body "$body" --rate "$CAP_RATE" --max-in-flight 64 --duration "${CAP_S}s" --json "$D/capacity.json" >"$D/capacity.log" 2>&1
  local cap rate
  # 2xx answers per second of the run (64 requests in flight, as fast as they go).
  cap=$(jq '(([.statuses | to_entries[] | select(.key | test("^2")) | .value] | add // 0) / .sent * .achieved_rate) | floor' "$D/capacity.json")
  rate=$(( cap * SOAK_PCT / 100 ))
  [ "$rate" -ge 1 ] || rate=1
  say "  capacity: $cap req/s of runners/verify through the proxy (2xx/s, 64 in flight, ${CAP_S} s, beside the fleet); soak at $rate req/s ($SOAK_PCT %) for ${SOAK_S} s"
  "$PODGATE" loadtest http --url "$url" --method POST --header 'content-type: application/json' \
    --body "$body" --rate "$rate" --duration "${SOAK_S}s" --json "$D/soak.json" >"$D/soak.log" 2>&1 &
  local soak_pid=$!
  PIDS+=("$soak_pid")
  # Every process of the system, and the fleet and probe (not the load generator,
  # whose queue is the measurement's own).
  local names=(redis pod1 pod2 pod3 kas1 kas2 kas3 proxy owner fleet probe)
  local pids=("$REDIS_PID" "${POD_PID[1]}" "${POD_PID[2]}" "${POD_PID[3]}" "${JR_PID[1]}" "${JR_PID[2]}" "${JR_PID[3]}" "$PROXY_PID" "$OWNER_PID" "$FLEET_PID" "$PROBE_PID")
  : >"$D/rss.txt"; : >"$D/rss-anon.txt"; : >"$D/rss-file.txt"
  local k kb t r a f
  : >"$D/steal.txt"
  while kill -0 "$soak_pid" 2>/dev/null; do
    t=$(now_ms)
    # CPU time the hypervisor took from this VM (`/proc/stat`, 8th cpu field, in
    # USER_HZ ticks): tells a host's stall from ours.
    echo "$t $(awk '/^cpu / {print $9; exit}' /proc/stat)" >>"$D/steal.txt"
    for k in "${!names[@]}"; do
      kb=$(rss_kb "${pids[$k]}")
      if [ -n "$kb" ]; then
        read -r r a f <<<"$kb"
        echo "$t ${names[$k]} $r" >>"$D/rss.txt"
        echo "$t ${names[$k]} $a" >>"$D/rss-anon.txt"
        echo "$t ${names[$k]} $f" >>"$D/rss-file.txt"
      fi
    done
    sleep "$RSS_EVERY"
  done
  wait "$soak_pid" || true
  fleet_wait; probe_stop
  local soak_failed
  soak_failed=$(jq '[.statuses | to_entries[] | select((.key | tonumber) == 0 or (.key | tonumber) >= 500) | .value] | add // 0' "$D/soak.json")
  say "  soak load: $(jq -c '{sent, achieved_rate, p50_ms, p99_ms, max_ms, statuses}' "$D/soak.json")"
  say "  steal (CPU time the host took): $(awk -v hz="$(getconf CLK_TCK)" 'NR > 1 { d = $2 - s; if (d > m) { m = d; at = $1 } } { if (NR == 1) first = $2; s = $2 } END { if (NR < 2) print "no samples"; else printf "%.2f s in all, at most %.2f s in one sample interval (at unix ms %s)\n", (s - first) / hz, m / hz, at }' "$D/steal.txt")"
  say "  probe: $(probe_stats | jq -c '{requests, failed, statuses}')"
  say "  fleet: $(jq -c '{jobs_done, misroutes, unexpected, jobs_request, job_router_share: .config.job_router_share}' "$D/fleet.json"); Job Router per Pod: $(jq -c '[.job_router_by_pod[] | {get_job, jobs, empty, errors, fallbacks: (.fallbacks | add)}]' "$D/fleet.json")"
  "$PODGATE" loadtest drill rss-check --samples "$D/rss.txt" | sed 's/^/  /' || DRILL_OK=0
  say "  of which anonymous (heap, stacks):"
  "$PODGATE" loadtest drill rss-check --samples "$D/rss-anon.txt" | sed 's/^/    /' || true
  say "  of which file-backed (the executable's pages):"
  "$PODGATE" loadtest drill rss-check --samples "$D/rss-file.txt" | sed 's/^/    /' || true
  check "no failed soak request" "$([ "$soak_failed" = 0 ] && [ "$(probe_stats | jq .failed)" = 0 ] && echo ok)" "$soak_failed soak requests failed"
  ledger_check --no-failed-requests || DRILL_OK=0
}

# Waits for a condition, up to $1 tenths of a second: until "$2" (a command) succeeds.
wait_for() {
  local n=$1 _; shift
  for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.1; done
  return 1
}
held_at() { [ "$(jr_metric "$1" "podgate_kas_job_router_held ")" -ge 1 ]; }

# Picked jobs in Pod $1's ledger.
picked() { curl -s "http://127.0.0.1:${POD_PORT[$1]}/-/podsim/ledger/summary" | jq '.summary.picked'; }

drill_R8() {
  JR_SHARE=1
  # Fewer jobs than the runners can run: they wait for jobs, held at kas.
  local JOB_RATE=${JR_JOB_RATE:-1}
  # Long enough for the breaker's 30 s after the outage, in a smoke run too.
  local run=$(( RUN > OUTAGE + 50 ? RUN : OUTAGE + 50 ))
  system_up R8 --job-router
  fleet_start "$run"; probe_start
  wait_for 300 held_at 2 || say "  no GetJob held at Pod 2's kas within 30 s"
  local calls_before kill_ms restart_ms back_ms=0 rest_before rest_during
  calls_before=$(jr_metric 2 "podgate_kas_job_router_calls_total{")
  local picked_kill picked_end
  picked_kill=$(picked 2)
  rest_before=$(curl -s "http://127.0.0.1:${POD_PORT[2]}/metrics" | awk 'index($0, "podsim_requests_total{endpoint=\"jobs_request\"") == 1 { s += $NF } END { print s + 0 }')
  kill_ms=$(now_ms)
  kill -KILL "${JR_PID[2]}"; wait "${JR_PID[2]}" 2>/dev/null || true
  sleep "$OUTAGE"
  rest_during=$(( $(curl -s "http://127.0.0.1:${POD_PORT[2]}/metrics" | awk 'index($0, "podsim_requests_total{endpoint=\"jobs_request\"") == 1 { s += $NF } END { print s + 0 }') - rest_before ))
  restart_ms=$(now_ms)
  jr_kas_start 2
  # Back on the router: the restarted kas answers GetJob calls.
  if wait_for $(( (run - OUTAGE) * 10 )) eval '[ "$(jr_metric 2 "podgate_kas_job_router_calls_total{")" -ge 1 ]'; then
    back_ms=$(now_ms)
  fi
  fleet_wait; probe_stop
  picked_end=$(picked 2)
  local pod2 others
  pod2=$(jq -c '.job_router_by_pod[1] | {get_job, jobs, errors, errors_by_code, fallbacks}' "$D/fleet.json")
  others=$(jq '[.job_router_by_pod[0], .job_router_by_pod[2]] | map(.errors) | add' "$D/fleet.json")
  say "  Pod 2's kas held calls ($calls_before answered before the kill), SIGKILLed; ${OUTAGE} s down: Pod 2 answered $rest_during jobs/request (REST) meanwhile"
  say "  restarted: its first GetJob answered after $(( back_ms > 0 ? back_ms - restart_ms : -1 )) ms (the runners' breaker: 30 s open)"
  say "  fleet, Pod 2's runners: $pod2"
  say "  fleet, Pods 1 and 3's runners: $others GetJob errors; jobs by Pod: $(jq -c '[.jobs_by_pod[] | .done]' "$D/fleet.json")"
  local codes; codes=$(jq -c '.job_router_by_pod[1].errors_by_code | keys' "$D/fleet.json")
  check "Pod 2's runners saw UNAVAILABLE" "$([ "$codes" = '["Unavailable"]' ] && echo ok)" "error codes: $codes"
  # gitlab-runner's breaker trips on failures that last 5 s (routerBreakerFailureGrace):
  # a shorter outage (--smoke) is retried on the router, not fallen back from.
  if [ "$OUTAGE" -gt 6 ]; then
    check "Pod 2's runners fell back to REST" "$([ "$(jq '.job_router_by_pod[1].fallbacks | .breaker_open + .breaker_tripped' "$D/fleet.json")" -gt 0 ] && [ "$rest_during" -gt 0 ] && echo ok)" "no fallback, or no jobs/request at Pod 2 during the outage"
  fi
  say "  Pod 2's jobs picked: $picked_kill at the kill, $picked_end when the fleet stopped"
  check "Pod 2's jobs kept coming" "$([ "$picked_end" -gt "$picked_kill" ] && echo ok)" "no job of Pod 2 picked after the kill"
  check "Pods 1 and 3 unaffected" "$([ "$others" = 0 ] && echo ok)" "$others GetJob errors on Pods 1 and 3"
  check "back on the restarted kas" "$([ "$back_ms" != 0 ] && echo ok)" "no GetJob reached Pod 2's restarted kas"
  ledger_check || DRILL_OK=0
}

drill_R9() {
  JR_SHARE=1
  local JOB_RATE=${JR_JOB_RATE:-1}
  local run=$(( RUN > OUTAGE + 30 ? RUN : OUTAGE + 30 ))
  system_up R9 --job-router
  fleet_start "$run"; probe_start
  local i
  for i in 1 2 3; do wait_for 300 held_at "$i" || say "  no GetJob held at Pod $i's kas within 30 s"; done
  local kill_ms restart_ms up_ms=0 held_ms=0 down_seen=0
  kill_ms=$(now_ms)
  kill -KILL "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true
  # kas notices: its queue Redis is down, and nothing is held.
  if wait_for $(( OUTAGE * 10 )) eval '[ "$(jr_metric 1 "podgate_kas_job_router_queue_redis_up ")" = 0 ]'; then down_seen=1; fi
  local held_during; held_during=$(( $(jr_metric 1 "podgate_kas_job_router_held ") + $(jr_metric 2 "podgate_kas_job_router_held ") + $(jr_metric 3 "podgate_kas_job_router_held ") ))
  sleep "$OUTAGE"
  restart_ms=$(now_ms)
  redis_start
  up_all() { local k; for k in 1 2 3; do [ "$(jr_metric "$k" "podgate_kas_job_router_queue_redis_up ")" = 1 ] || return 1; done; }
  if wait_for 300 up_all; then up_ms=$(now_ms); fi
  if wait_for 300 held_at 1; then held_ms=$(now_ms); fi
  fleet_wait; probe_stop
  local outage; outage=$(probe_stats --from "$kill_ms" --to "$restart_ms")
  say "  Redis SIGKILLed: kas saw it down: $([ "$down_seen" = 1 ] && echo yes || echo no); calls held meanwhile: $held_during; restarted empty after ${OUTAGE} s"
  say "  every kas watching again after $(( up_ms > 0 ? up_ms - restart_ms : -1 )) ms, holding again after $(( held_ms > 0 ? held_ms - restart_ms : -1 )) ms"
  say "  probe during the outage: $(jq -c '{requests, failed, statuses}' <<<"$outage")"
  say "  fleet: $(jq -c '{jobs_done, misroutes, unexpected}' "$D/fleet.json"); Job Router per Pod: $(jq -c '[.job_router_by_pod[] | {get_job, jobs, errors, errors_by_code, fallbacks: (.fallbacks | add)}]' "$D/fleet.json")"
  check "kas stopped holding" "$([ "$down_seen" = 1 ] && echo ok)" "kas never reported its queue Redis down"
  check "kas holds again" "$([ "$up_ms" != 0 ] && [ "$held_ms" != 0 ] && echo ok)" "queue Redis up at every kas: $up_ms, held again: $held_ms"
  check "no GetJob failed" "$([ "$(jq '[.job_router_by_pod[] | .errors] | add' "$D/fleet.json")" = 0 ] && echo ok)" "GetJob errors"
  ledger_check || DRILL_OK=0
}

drill_R10() {
  system_up R10 --topology
  fleet_start "$RUN"; probe_start; path_probe_start
  sleep $(( RUN / 3 ))
  local stop_ms kill_ms restart_ms back_ms=0 owner_before late
  stop_ms=$(now_ms)
  # Hung first (SIGSTOP: connections open, nothing answers, every call waits out
  # the deadline), then gone (SIGKILL: calls refused).
  kill -STOP "$TS_PID"
  sleep $(( OUTAGE / 2 ))
  kill_ms=$(now_ms)
  kill -KILL "$TS_PID"; wait "$TS_PID" 2>/dev/null || true
  sleep $(( OUTAGE - OUTAGE / 2 ))
  restart_ms=$(now_ms)
  owner_before=$(proxy_metric 'podgate_proxy_topology_service_calls_total{result="owner"}')
  ts_start
  # Routing by claims resumes: the proxy's calls are answered with owners again.
  if wait_for 300 eval '[ "$(proxy_metric "podgate_proxy_topology_service_calls_total{result=\"owner\"}")" -gt "$owner_before" ]'; then
    back_ms=$(now_ms)
  fi
  # A group Pod 3 creates once the service is back, which no cache has seen: its
  # first request reaches Pod 3.
  "$PODGATE" loadtest drill claim --topology-service "127.0.0.1:$TS_PORT" --pod 3 --namespace team-3-late >>"$D/claims.log" 2>&1 || true
  late=$(curl -s --max-time 5 "http://127.0.0.1:$PROXY_PORT/team-3-late/project" | jq -r '.pod // "none"' 2>/dev/null || echo none)
  sleep 1
  fleet_wait; probe_stop; path_probe_stop
  local before hung gone after tokens
  before=$(path_probe_stats --to "$stop_ms")
  hung=$(path_probe_stats --from "$stop_ms" --to "$kill_ms")
  gone=$(path_probe_stats --from "$kill_ms" --to "$restart_ms")
  after=$(path_probe_stats --from "$restart_ms")
  tokens=$(probe_stats --from "$stop_ms" --to "$restart_ms")
  local calls; calls=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^podgate_proxy_(topology_service_calls|classify_cache)_total' | sed 's/^podgate_proxy_//' | tr '\n' ' ')
  say "  path probe before the outage: $(jq -c 'map_values({requests, failed, wrong, p50_ms, p99_ms})' <<<"$before")"
  say "  Topology Service hung (SIGSTOP) $(( (kill_ms - stop_ms) / 1000 )) s: $(jq -c 'map_values({requests, failed, wrong, p50_ms, p99_ms, max_ms})' <<<"$hung") (deadline ${TS_DEADLINE_MS} ms)"
  say "  Topology Service gone (SIGKILL) $(( (restart_ms - kill_ms) / 1000 )) s: $(jq -c 'map_values({requests, failed, wrong, p50_ms, p99_ms, max_ms})' <<<"$gone")"
  say "  restarted: answers with owners again after $(( back_ms > 0 ? back_ms - restart_ms : -1 )) ms; team-3-late (claimed after the restart) first reached Pod $late; after: $(jq -c 'map_values({requests, failed, wrong})' <<<"$after")"
  say "  token probe during the outage: $(jq -c '{requests, failed, statuses}' <<<"$tokens"); fleet: $(jq -c '{jobs_done, misroutes, unexpected}' "$D/fleet.json")"
  say "  proxy: $calls"
  local bad_paths=0 k w
  for w in "$before" "$hung" "$gone" "$after"; do
    for k in route org fresh; do
      [ "$(jq ".$k.failed" <<<"$w")" = 0 ] && [ "$(jq ".$k.wrong" <<<"$w")" = 0 ] || bad_paths=1
    done
  done
  check "no path-routed request failed or misrouted" "$([ "$bad_paths" = 0 ] && echo ok)" "failures or wrong Pods in the path probe"
  check "path requests during the outage" "$([ "$(jq '.route.requests + .fresh.requests' <<<"$hung")" -gt 0 ] && [ "$(jq '.route.requests + .fresh.requests' <<<"$gone")" -gt 0 ] && echo ok)" "no path probe requests while it was down"
  check "the deadline was met and calls refused" "$([ "$(proxy_metric 'podgate_proxy_topology_service_calls_total{result="deadline"}')" -gt 0 ] && [ "$(proxy_metric 'podgate_proxy_topology_service_calls_total{result="error"}')" -gt 0 ] && echo ok)" "$calls"
  # The deadline bounds what a request waits for the service (a CI machine's
  # scheduling aside: checked on full runs only).
  if [ "$SMOKE" = 0 ]; then
    check "fall-through within the deadline" "$([ "$(jq '.fresh.max_ms // 0 | floor' <<<"$hung")" -le $(( TS_DEADLINE_MS + 250 )) ] && echo ok)" "slowest uncached path request while hung: $(jq .fresh.max_ms <<<"$hung") ms"
  fi
  check "token-routed traffic untouched" "$([ "$(jq .failed <<<"$tokens")" = 0 ] && [ "$(jq .requests <<<"$tokens")" -gt 0 ] && echo ok)" "$(jq -c .statuses <<<"$tokens")"
  check "routing by claims resumed" "$([ "$back_ms" != 0 ] && [ "$late" = 3 ] && echo ok)" "owners again: $back_ms; team-3-late reached Pod $late"
  ledger_check --no-failed-requests || DRILL_OK=0
}

say "drills: ${DRILLS[*]}$([ "$SMOKE" = 1 ] && echo ' (smoke)') with $PODGATE"
for d in "${DRILLS[@]}"; do
  DRILL_OK=1
  started=$(date +%s)
  say "== $d"
  JR_SHARE=0
  "drill_$d"
  system_down
  if [ "$DRILL_OK" = 1 ]; then
    say "== $d ok ($(( $(date +%s) - started )) s)"
  else
    say "== $d FAILED ($(( $(date +%s) - started )) s)"
    FAILED+=("$d")
  fi
done
if [ ${#FAILED[@]} -gt 0 ]; then
  say "drills failed: ${FAILED[*]}"
  exit 1
fi
say "drills: all passed"
