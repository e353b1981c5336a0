#!/bin/bash
# kas memory per connected agent.
# usage: scripts/bench-kas-memory.sh <podgate binary, built with `sim`> <agents> [idle tunnels, default 2]
# Starts one `podgate kas` (in-memory registry, config as tests/cli_kas.rs), reads its
# /proc VmRSS and RssAnon with 0 agents, then runs `podgate loadtest agents` with N
# agents (idle tunnels each), waits until kas's /metrics shows them all and their
# tunnels, reads VmRSS/RssAnon again, and prints one line:
#   agents=N rss0_kb= rss_kb= anon0_kb= anon_kb= per_agent_rss_kb= per_agent_anon_kb=
set -u
bin=$1; n=$2; tun=${3:-2}
d=$(mktemp -d /tmp/kasmem.XXXXXX)
trap 'kill $load_pid $kas_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$d"' EXIT
load_pid=; kas_pid=
printf '\001%.0s' {1..32} | base64 > "$d/ext"
printf '\002%.0s' {1..32} | base64 > "$d/int"
"$bin" token keygen --kid agents --out "$d" >/dev/null || exit 1
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
agent=$(port); obs=$(port)
cat > "$d/kas.toml" <<T
agent_listen = "127.0.0.1:$agent"
external_listen = "127.0.0.1:0"
internal_listen = "127.0.0.1:0"
observability_listen = "127.0.0.1:$obs"
external_secret_file = "$d/ext"
internal_secret_file = "$d/int"
agent_keys = ["$d/agents.pem"]
T
"$bin" kas --config "$d/kas.toml" > "$d/kas.out" 2> "$d/kas.err" &
kas_pid=$!
for i in $(seq 100); do grep -q "kas: agents on" "$d/kas.out" 2>/dev/null && break; sleep 0.1; done
grep -q "kas: agents on" "$d/kas.out" || { echo "kas did not start"; cat "$d/kas.err"; exit 1; }
sleep 3
st() { awk -v k="$1:" '$1==k{print $2}' /proc/$kas_pid/status; }
rss0=$(st VmRSS); anon0=$(st RssAnon)
"$bin" loadtest agents --kas "grpc://127.0.0.1:$agent" --key "$d/agents.private.pem" \
  --agents "$n" --idle-tunnels "$tun" --duration 60s > "$d/load.out" 2> "$d/load.err" &
load_pid=$!
want_t=$((n*tun)); ok=
for i in $(seq 1200); do
  m=$(curl -s "http://127.0.0.1:$obs/metrics")
  if grep -qx "podgate_kas_connected_agents $n" <<<"$m" && grep -qx "podgate_kas_tunnels{state=\"idle\"} $want_t" <<<"$m"; then ok=1; break; fi
  kill -0 $load_pid 2>/dev/null || break
  sleep 0.5
done
[ -n "$ok" ] || { echo "agents/tunnels never all seen"; grep -E "connected_agents|kas_tunnels" <<<"$m"; cat "$d/load.out" "$d/load.err" | tail; exit 1; }
sleep 5
rss=$(st VmRSS); anon=$(st RssAnon); hwm=$(st VmHWM)
conn=$(head -1 "$d/load.out")
awk -v n=$n -v t=$tun -v r0=$rss0 -v r=$rss -v h=$hwm -v a0=$anon0 -v a=$anon -v c="$conn" 'BEGIN{printf "agents=%d tunnels=%d rss0_kb=%d rss_kb=%d hwm_kb=%d anon0_kb=%d anon_kb=%d per_agent_rss_kb=%.1f per_agent_anon_kb=%.1f | %s\n",n,t,r0,r,h,a0,a,(r-r0)/n,(a-a0)/n,c}'
