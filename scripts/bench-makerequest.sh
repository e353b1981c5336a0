#!/bin/bash
# MakeRequest latency through kas's Kubernetes API proxy ([k8s_proxy]), local and
# kas -> kas, one request at a time on one keep-alive HTTP/1.1 connection (curl).
# Stack as tests/k8s_proxy.rs (Pod 2): redis-server, `podgate kube-sim` (seed: 2 Pods,
# 1 ConfigMap), `podgate pod-sim` as GitLab (agents 3 and 4 allowed user access; a PAT
# of root), kas2a and kas2b on that Redis, agentk 4 on kas2a, agentk 3 on kas2b.
# Requests go to kas2a's proxy: agent 4 = local tunnel, agent 3 = kas2a -> kas2b.
# usage: scripts/bench-makerequest.sh <podgate binary, built with `sim`> <requests per case>   (200 warm-up each first)
set -u
bin=$1; n=${2:-2000}; warm=200
d=$(mktemp -d /tmp/makereq.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$d"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
waitline() { # file pattern
  for i in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "timeout waiting for '$2' in $1"; cat "$1"; exit 1; }
printf '\007%.0s' {1..32} | base64 > "$d/external"
printf '\011%.0s' {1..32} | base64 > "$d/internal"
"$bin" token keygen --kid agents --out "$d" >/dev/null || exit 1
export PODGATE_LOG=error
rport=$(port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no > "$d/redis.out" 2>&1 & pids+=($!)
waitline "$d/redis.out" "Ready to accept"
cat > "$d/seed.yaml" <<'Y'
apiVersion: v1
kind: Namespace
metadata:
  name: ops
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: default
spec:
  containers:
  - name: c
    image: busybox
---
apiVersion: v1
kind: Pod
metadata:
  name: db-1
  namespace: ops
spec:
  containers:
  - name: c
    image: postgres
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: first
  namespace: default
data:
  key: one
Y
"$bin" kube-sim --listen 127.0.0.1:0 --seed "$d/seed.yaml" --kubeconfig-out "$d/cluster.kubeconfig" > "$d/kube.out" 2>&1 & pids+=($!)
waitline "$d/kube.out" "kube-sim: Kubernetes API on "
"$bin" pod-sim --pod-id 2 --listen 127.0.0.1:0 --job-rate 0 --kas-secret-file "$d/external" --agent 3 --agent 4 > "$d/gitlab.out" 2>&1 & pids+=($!)
waitline "$d/gitlab.out" "pod-sim: Pod 2 listening on http://"
gitlab=$(grep -o "pod-sim: Pod 2 listening on http://[0-9.:]*" "$d/gitlab.out" | head -1 | sed 's|.*http://||')
pat=$(curl -sf -X POST -H 'Content-Type: application/json' -d '{"username":"root","scopes":["k8s_proxy","read_api"]}' "http://$gitlab/-/podsim/personal_access_tokens" | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])') || { echo "no PAT"; exit 1; }
declare -A AG K8S
for k in kas2a kas2b; do
  AG[$k]=$(port); K8S[$k]=$(port)
  cat > "$d/$k.toml" <<T
agent_listen = "127.0.0.1:${AG[$k]}"
external_listen = "127.0.0.1:$(port)"
internal_listen = "127.0.0.1:$(port)"
observability_listen = "off"
external_secret_file = "$d/external"
internal_secret_file = "$d/internal"
agent_keys = ["$d/agents.pem"]
max_wait = "30s"
[k8s_proxy]
listen = "127.0.0.1:${K8S[$k]}"
url_prefix = "/k8s-proxy/"
gitlab_url = "http://$gitlab"
[registry]
backend = { kind = "redis", url = "redis://127.0.0.1:$rport" }
T
  "$bin" kas --config "$d/$k.toml" > "$d/$k.out" 2>&1 & pids+=($!)
  waitline "$d/$k.out" "kas: agents on"
done
for pair in 4:kas2a 3:kas2b; do
  a=${pair%%:*}; k=${pair#*:}
  "$bin" token mint --kind agent --pod 2 --key "$d/agents.private.pem" --agent "$a" --project 42 > "$d/agent-$a.token" || exit 1
  "$bin" agentk --kas "grpc://127.0.0.1:${AG[$k]}" --token-file "$d/agent-$a.token" \
    --kubeconfig "$d/cluster.kubeconfig" --pod-name "agentk-$a" --pod-namespace gitlab-agent \
    --observability-listen "127.0.0.1:$(port)" > "$d/agentk-$a.out" 2>&1 & pids+=($!)
  waitline "$d/agentk-$a.out" "agentk: connected as agent "
done
url="http://127.0.0.1:${K8S[kas2a]}/k8s-proxy/api/v1/namespaces/default/pods"
for case in "local:4" "kas_to_kas:3"; do
  name=${case%%:*}; a=${case#*:}
  # one curl process, one connection, requests one after another
  { echo "header = \"Authorization: Bearer pat:$a:$pat\""; for i in $(seq $((warm+n))); do echo "url = \"$url\""; echo 'output = "/dev/null"'; done; } > "$d/curl.cfg"
  curl -s -K "$d/curl.cfg" -w '%{http_code} %{time_total} %{num_connects}\n' > "$d/$name.times" || { echo "curl failed"; exit 1; }
  tail -n "$n" "$d/$name.times" | python3 -c '
import sys
rows=[l.split() for l in sys.stdin]
bad=[r for r in rows if r[0]!="200"]
t=sorted(float(r[1])*1000 for r in rows)
conns=sum(int(r[2]) for r in rows)
q=lambda p:t[min(len(t)-1,round((len(t)-1)*p))]
print(f"MakeRequest {sys.argv[1]:<11} n={len(t)} p50={q(.5):.3f} ms p99={q(.99):.3f} ms max={t[-1]:.3f} ms non200={len(bad)} new_connections={conns}")
' "$name"
done
