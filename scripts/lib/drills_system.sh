# The system scripts/drills.sh breaks, as functions: ports, processes started in
# the background (their pids in PIDS, stopped by drills.sh's cleanup), Redis, the
# Pod simulators, the proxy, two kas with kube-sim and an agentk, the fleet and the
# probe, and the ledger check. Sourced by scripts/drills.sh, which sets the
# variables these read (W, D, PODGATE, the lengths and counts).
# shellcheck shell=bash

say() { printf '%s\n' "$*"; }
now_ms() { date +%s%3N; }
# A free port below the kernel's ephemeral range (32768 and up): a port from there
# (what binding port 0 gives) may be taken by any client socket on the machine, a
# test's running beside this script included, before the server meant for it binds.
# 10000-14999: podgate-registry's test servers and the tests' own ports
# (`podgate_registry::testing::free_port`) take 15000-31999, and a port one of them
# picked could be bound by the drill before the test binds it. A port this run has
# handed out already is never handed out again: a drill picks a dozen ports before
# its servers bind them, and two equal picks once had kas bind the proxy's port.
DRILL_PORTS="${W:-${TMPDIR:-/tmp}}/ports.$$"
port() {
  python3 -c 'import os, random, socket, sys
taken = set()
if os.path.exists(sys.argv[1]):
    taken = set(open(sys.argv[1]).read().split())
for _ in range(1000):
    p = random.randrange(10000, 15000)
    if str(p) in taken:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
    open(sys.argv[1], "a").write(f"{p}\n")
    print(p)
    break
else:
    raise SystemExit("drills.sh: no free port in 10000-14999")' "$DRILL_PORTS"
}
wait_port() { # wait_port PORT [LOG]: until something listens on PORT (LOG shown if not)
  local _
  for _ in $(seq 1 400); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "drills.sh: nothing listens on $1" >&2
  [ -z "${2:-}" ] || tail -n 20 "$2" >&2
  return 1
}
spawn() { # spawn LOG CMD… : start in the background, remember the pid in $SPAWNED
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  SPAWNED=$!
  PIDS+=("$SPAWNED")
}
# Resident memory of pid $1 in kB: "VmRSS RssAnon RssFile" (the whole, the anonymous
# part: heap and stacks, and the file-backed part: pages of the mapped executable).
rss_kb() { awk '/^VmRSS:/ {r=$2} /^RssAnon:/ {a=$2} /^RssFile:/ {f=$2} END {if (r != "") print r, a, f}' "/proc/$1/status" 2>/dev/null || true; }

# --- the system ------------------------------------------------------------------

redis_start() {
  spawn "$D/redis.log" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no
  REDIS_PID=$SPAWNED
  wait_port "$REDIS_PORT" "$D/redis.log"
}

pod_start() { # pod_start I
  local i=$1
  spawn "$D/pod$i.log" "$PODGATE" pod-sim --pod-id "$i" --listen "127.0.0.1:${POD_PORT[$i]}" \
    --registration-token "${REG[$i]}" --job-rate "$JOB_RATE" --max-pending "$MAX_PENDING" --long-poll "${LONG_POLL}s" \
    --redis "$REDIS_URL" --external-url "http://127.0.0.1:$PROXY_PORT" "${POD_EXTRA[@]}"
  POD_PID[$i]=$SPAWNED
  wait_port "${POD_PORT[$i]}" "$D/pod$i.log"
}

proxy_start() { # proxy_start [--upgrade]
  spawn "$D/proxy.$(now_ms).log" "$PODGATE" proxy --config "$D/proxy.toml" "$@"
  PROXY_PID=$SPAWNED
}

wait_ready() { # up to 60 s: a CI machine running the test suite beside it is slow
  local _
  for _ in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$ADMIN_PORT/readyz")" = 200 ] && return 0
    sleep 0.05
  done
  echo "drills.sh: the proxy is not ready; /readyz says:" >&2
  curl -s "http://127.0.0.1:$ADMIN_PORT/readyz" >&2 || true
  local log
  for log in "$D"/proxy.*.log; do tail -n 20 "$log" >&2; done
  return 1
}

system_up() { # system_up NAME [--kas] [--job-router] [--topology]: with --kas, also two
  # kas, kube-sim and an agentk (kas_up); with --job-router, each Pod's kas with
  # GitLab's Job Router (jr_prepare), for the fleet's JR_SHARE of runners; with
  # --topology, the Topology Service, each Pod's claims, and path rules at the proxy
  # (ts_up)
  local name=$1 with_kas=0 with_jr=0 with_ts=0 flag
  for flag in "${@:2}"; do
    case "$flag" in
      --kas) with_kas=1 ;;
      --job-router) with_jr=1 ;;
      --topology) with_ts=1 ;;
    esac
  done
  D=$W/$name
  mkdir -p "$D"
  REDIS_PORT=$(port) PROXY_PORT=$(port) ADMIN_PORT=$(port)
  OWNER_EXTRA=() PROXY_EXTRA="" PROXY_TABLES="" POD_EXTRA=() JR_PID=()
  # One check decides (R4 measures "within one health interval"); the soak keeps
  # the defaults, since a CPU-saturated check must not take a Pod out.
  if [ "$name" = R7 ]; then HEALTH_TIMEOUT_MS=1000 HEALTH_RISE_FALL=3; else HEALTH_TIMEOUT_MS=500 HEALTH_RISE_FALL=1; fi
  if [ "$with_kas" = 1 ]; then kas_prepare; fi
  if [ "$with_jr" = 1 ]; then jr_prepare; fi
  REDIS_URL=redis://127.0.0.1:$REDIS_PORT
  POD_PORT=() POD_PID=() REG=()
  local i
  for i in 1 2 3; do
    POD_PORT[$i]=$(port)
    REG[$i]=$("$PODGATE" token mint-gitlab --prefix glrt- --cell "$i" --org 1 --runner-type 1)
  done
  redis_start
  for i in 1 2 3; do pod_start "$i"; done
  if [ "$with_jr" = 1 ]; then for i in 1 2 3; do jr_kas_start "$i"; done; fi
  if [ "$with_ts" = 1 ]; then ts_up; fi
  spawn "$D/owner.log" "$PODGATE" loadtest drill topology-owner --redis "$REDIS_URL" \
    --queue-redis "$REDIS_URL" --pod "1=127.0.0.1:${POD_PORT[1]}" \
    --pod "2=127.0.0.1:${POD_PORT[2]}" --pod "3=127.0.0.1:${POD_PORT[3]}" "${OWNER_EXTRA[@]}"
  OWNER_PID=$SPAWNED
  cat >"$D/proxy.toml" <<EOF
listen = "127.0.0.1:$PROXY_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
grace_period_secs = 2
upgrade_sock = "$D/upgrade.sock"
edge_poll_hold_secs = $LONG_POLL
$PROXY_EXTRA
[health]
interval_ms = $HEALTH_MS
timeout_ms = $HEALTH_TIMEOUT_MS
rise = $HEALTH_RISE_FALL
fall = $HEALTH_RISE_FALL
[registry]
backend = { kind = "redis", url = "$REDIS_URL" }
$PROXY_TABLES
EOF
  proxy_start
  wait_ready
  if [ "$with_kas" = 1 ]; then kas_up; fi
}

# --- each Pod's kas with GitLab's Job Router (R8, R9, and R7's mixed fleet) ------
# Pod i's kas serves the Job Router only: it answers GetJob from Pod i's Rails (the
# simulator) and holds calls on the runner queue keys in the drill's Redis (where
# the Pods mirror them). The topology names it Pod i's kas pool, so the proxy routes
# each runner's GetJob to its own Pod's kas; every Pod's discovery names
# grpc://<proxy>.
jr_prepare() {
  head -c 32 /dev/urandom | base64 >"$D/jr-external"
  head -c 32 /dev/urandom | base64 >"$D/jr-internal"
  local i
  for i in 1 2 3; do
    JR_AGENT[$i]=$(port) JR_EXT[$i]=$(port) JR_INT[$i]=$(port) JR_OBS[$i]=$(port)
    OWNER_EXTRA+=(--kas "$i=127.0.0.1:${JR_AGENT[$i]}")
  done
  POD_EXTRA=(--job-router-url "grpc://127.0.0.1:$PROXY_PORT")
}
jr_kas_start() { # jr_kas_start I
  local i=$1 log
  cat >"$D/jrkas$i.toml" <<EOF
agent_listen = "127.0.0.1:${JR_AGENT[$i]}"
external_listen = "127.0.0.1:${JR_EXT[$i]}"
internal_listen = "127.0.0.1:${JR_INT[$i]}"
observability_listen = "127.0.0.1:${JR_OBS[$i]}"
external_secret_file = "$D/jr-external"
internal_secret_file = "$D/jr-internal"
[gitlab]
url = "http://127.0.0.1:${POD_PORT[$i]}"
[job_router]
runner_queue_redis = "$REDIS_URL"
hold = "${LONG_POLL}s"
EOF
  log="$D/jrkas$i.$(now_ms).log"
  spawn "$log" "$PODGATE" kas --config "$D/jrkas$i.toml" --shutdown-grace 1s
  JR_PID[$i]=$SPAWNED
  wait_port "${JR_AGENT[$i]}" "$log"
}
# jr_metric I PREFIX: the sum of Pod I's kas's samples whose line starts with PREFIX
# (0 when it does not answer).
jr_metric() {
  curl -s --max-time 2 "http://127.0.0.1:${JR_OBS[$1]}/metrics" 2>/dev/null |
    awk -v m="$2" 'index($0, m) == 1 { s += $NF } END { print s + 0 }'
}

# --- the Topology Service and path rules (R10) -----------------------------------
# `podgate topology-service` with a Cell per Pod (its address the Pod's web
# listener, the Pod's `cell_address` in the topology) and its claims in the drill's
# Redis, so a restarted service still has them; each Pod claims its group
# `team-<i>` and organization `org-<i>` as its Rails does at start. The proxy asks
# it with a TS_DEADLINE_MS deadline and keeps an owner TS_TTL s.
TS_DEADLINE_MS=${TS_DEADLINE_MS:-250}
TS_TTL=${TS_TTL:-2}
ts_up() {
  TS_PORT=$(port)
  {
    echo "listen = \"127.0.0.1:$TS_PORT\""
    echo "[claims]"
    echo "backend = { kind = \"redis\", url = \"$REDIS_URL\" }"
    local i
    for i in 1 2 3; do
      echo "[[cells]]"
      echo "id = $i"
      echo "address = \"127.0.0.1:${POD_PORT[$i]}\""
      echo "session_prefix = \"cell-$i\""
      echo "sequence_ranges = [{ minval = $(( (i - 1) * 1000000000000 + 1 )), maxval = $(( i * 1000000000000 ))}]"
    done
  } >"$D/ts.toml"
  ts_start
  for i in 1 2 3; do
    "$PODGATE" loadtest drill claim --topology-service "127.0.0.1:$TS_PORT" --pod "$i" >>"$D/claims.log" 2>&1 ||
      { echo "drills.sh: Pod $i's claims failed" >&2; cat "$D/claims.log" >&2; return 1; }
  done
  OWNER_EXTRA+=(--cell-addresses)
  PROXY_TABLES="[topology_service]
address = \"127.0.0.1:$TS_PORT\"
deadline_ms = $TS_DEADLINE_MS
cache_ttl_secs = $TS_TTL
retry_after_ms = 500"
}
ts_start() {
  local log="$D/ts.$(now_ms).log"
  spawn "$log" "$PODGATE" topology-service --config "$D/ts.toml"
  TS_PID=$SPAWNED
  wait_port "$TS_PORT" "$log"
}
# proxy_metric PREFIX: the sum of the proxy's samples whose line starts with PREFIX.
proxy_metric() {
  curl -s --max-time 2 "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null |
    awk -v m="$1" 'index($0, m) == 1 { s += $NF } END { print s + 0 }'
}
path_probe_start() {
  spawn "$D/paths.out" "$PODGATE" loadtest drill path-probe --target "127.0.0.1:$PROXY_PORT" \
    --pods 3 --out "$D/paths.log"
  PATH_PROBE_PID=$SPAWNED
  local _
  for _ in $(seq 1 200); do [ -s "$D/paths.log" ] && return 0; sleep 0.05; done
  echo "drills.sh: the path probe did not start" >&2; cat "$D/paths.out" >&2; return 1
}
path_probe_stop() { kill -TERM "$PATH_PROBE_PID" 2>/dev/null || true; wait "$PATH_PROBE_PID" 2>/dev/null || true; }
path_probe_stats() { "$PODGATE" loadtest drill path-probe-stats --probe-log "$D/paths.log" "$@"; }

# --- kas and an agent (R2, R3) ---------------------------------------------------
# Two kas of Pod 1 sharing the registry's Redis (short TTL: KAS_TTL), both in the
# topology as Pod 1's kas pool; kube-sim; one agentk (agent $AGENT_ID, a JWT the kas
# and the proxy verify) dialling kas through the proxy, as `podgate up` connects it.
AGENT_ID=7
KAS_TTL=${KAS_TTL:-6}
kas_prepare() {
  mkdir -p "$D/keys"
  "$PODGATE" token keygen --alg ed25519 --kid drill --out "$D/keys/" >/dev/null
  head -c 32 /dev/urandom | base64 >"$D/external"
  head -c 32 /dev/urandom | base64 >"$D/internal"
  "$PODGATE" token mint --kind agent --pod 1 --agent "$AGENT_ID" --project 1001 --ttl 1h \
    --key "$D/keys/drill.private.pem" --prefix auto >"$D/agent-token"
  local k
  for k in 1 2; do
    KAS_AGENT[$k]=$(port) KAS_EXT[$k]=$(port) KAS_INT[$k]=$(port)
    OWNER_EXTRA+=(--kas "1=127.0.0.1:${KAS_AGENT[$k]}")
  done
  PROXY_EXTRA="keys = [\"$D/keys/drill.pem\"]"
}
kas_start() { # kas_start K
  local k=$1
  cat >"$D/kas$k.toml" <<EOF
agent_listen = "127.0.0.1:${KAS_AGENT[$k]}"
external_listen = "127.0.0.1:${KAS_EXT[$k]}"
internal_listen = "127.0.0.1:${KAS_INT[$k]}"
observability_listen = "127.0.0.1:$(port)"
external_secret_file = "$D/external"
internal_secret_file = "$D/internal"
agent_keys = ["$D/keys/drill.pem"]
max_wait = "20s"
[registry]
backend = { kind = "redis", url = "$REDIS_URL" }
ttl = "${KAS_TTL}s"
refresh_interval = "$(( KAS_TTL / 3 ))s"
gc_interval = "$(( KAS_TTL / 3 ))s"
topology_resync_interval = "2s"
EOF
  spawn "$D/kas$k.log" "$PODGATE" kas --config "$D/kas$k.toml" --shutdown-grace 1s
  KAS_PID[$k]=$SPAWNED
  wait_port "${KAS_EXT[$k]}" "$D/kas$k.log"
}
kas_up() {
  kas_start 1; kas_start 2
  local kube_port; kube_port=$(port)
  spawn "$D/kube-sim.log" "$PODGATE" kube-sim --listen "127.0.0.1:$kube_port" --objects 50 \
    --kubeconfig-out "$D/kubeconfig"
  wait_port "$kube_port" "$D/kube-sim.log"
  local _
  for _ in $(seq 1 100); do [ -s "$D/kubeconfig" ] && break; sleep 0.05; done
  spawn "$D/agentk.log" env PODGATE_LOG=${AGENTK_LOG:-warn} "$PODGATE" agentk --kas "grpc://127.0.0.1:$PROXY_PORT" \
    --token-file "$D/agent-token" --kubeconfig "$D/kubeconfig" --observability-listen off
  AGENTK_PID=$SPAWNED
  for _ in $(seq 1 400); do [ -n "$(agent_kas)" ] && return 0; sleep 0.05; done
  echo "drills.sh: agentk did not register" >&2; tail -n 5 "$D/agentk.log" "$D/kas1.log" "$D/kas2.log" >&2; return 1
}
# The kas (internal address) holding agent $AGENT_ID's connections, one per line.
agent_kas() {
  "$PODGATE" registry --redis "$REDIS_URL" --json agents --agent-id "$AGENT_ID" 2>/dev/null | jq -r '.[].kas' 2>/dev/null | sort -u
}
kas_instances() {
  "$PODGATE" registry --redis "$REDIS_URL" --json kas 2>/dev/null | jq -r '.[].address' 2>/dev/null
}
get_pods() { # get_pods K [timeout]: GitLab's GetPods on kas K
  "$PODGATE" loadtest drill get-pods --kas "127.0.0.1:${KAS_EXT[$1]}" --secret-file "$D/external" \
    --agent-id "$AGENT_ID" --timeout "${2:-10s}" || true
}

# The fleet for $1 seconds in the background ($FLEET_PID, report $D/fleet.json).
fleet_start() {
  spawn "$D/fleet.log" "$PODGATE" loadtest runners --target "http://127.0.0.1:$PROXY_PORT" \
    --registration-token "${REG[1]}" --registration-token "${REG[2]}" --registration-token "${REG[3]}" \
    --runners "$RUNNERS" --duration "${1}s" --check-interval 1s --job-router-share "${JR_SHARE:-0}" --json "$D/fleet.json"
  FLEET_PID=$SPAWNED
}
fleet_wait() { wait "$FLEET_PID" || true; [ -s "$D/fleet.json" ] || { echo "drills.sh: no fleet report" >&2; tail -5 "$D/fleet.log" >&2; return 1; }; }

probe_start() {
  spawn "$D/probe.out" "$PODGATE" loadtest drill probe --target "127.0.0.1:$PROXY_PORT" \
    --registration-token "${REG[1]}" --registration-token "${REG[2]}" --registration-token "${REG[3]}" \
    --out "$D/probe.log"
  PROBE_PID=$SPAWNED
  local _
  for _ in $(seq 1 200); do [ -s "$D/probe.log" ] && return 0; sleep 0.05; done
  echo "drills.sh: the probe did not start" >&2; cat "$D/probe.out" >&2; return 1
}
probe_stop() { kill -TERM "$PROBE_PID" 2>/dev/null || true; wait "$PROBE_PID" 2>/dev/null || true; }
probe_stats() { "$PODGATE" loadtest drill probe-stats --probe-log "$D/probe.log" "$@"; }

# ledger_check [ledger-check flags…]: prints its lines; fails when the check does.
ledger_check() {
  "$PODGATE" loadtest drill ledger-check --pod "127.0.0.1:${POD_PORT[1]}" \
    --pod "127.0.0.1:${POD_PORT[2]}" --pod "127.0.0.1:${POD_PORT[3]}" --fleet "$D/fleet.json" "$@" | sed 's/^/  /'
}

system_down() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
