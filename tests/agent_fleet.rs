//! The agent acceptance test, as processes: one Redis, three `podgate kas`, agent 3
//! with two `podgate agentk` replicas (on kas2 and kas3) listing pods with kube-rs
//! from the in-process Kubernetes API server.
//!
//! - GitLab → kas1 `GetPods(3)` is answered through a tunnel (kas1 holds none: it is
//!   routed kas → kas), for either replica.
//! - `ConnectedAgentsById(3)` lists both replicas with their kas addresses.
//! - Stopping kas2 removes its entries at shutdown; requests keep working via kas3.
//! - A request for agent 5, which connects 2 s later, completes once it connects,
//!   and kas sends Redis no command at all while it waits (`INFO commandstats`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use podgate_agent::auth::mint_external;
use podgate_agent::proto::ConnectedAgentsByIdRequest;
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_registry::testing::{RedisServer, eventually, free_port};
use podgate_testkit::fixtures::{self, AgentTokens, get_pods, pod_names};
use podgate_testkit::kube::KubeTestServer;
use serde_json::json;
use tonic::transport::Channel;

use crate::common::process::Procs;

const EXTERNAL: [u8; 32] = [7; 32];

struct KasProc {
    external: u16,
    internal: u16,
    agent: u16,
    observability: u16,
    index: usize,
}

/// Start `podgate kas` with its own ports, sharing Redis and the secrets in `dir`;
/// returns once it serves.
fn start_kas(procs: &mut Procs, dir: &Path, name: &str, redis: &str) -> KasProc {
    let k = KasProc {
        external: free_port(),
        internal: free_port(),
        agent: free_port(),
        observability: free_port(),
        index: procs.0.len(),
    };
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "agent_listen = \"127.0.0.1:{agent}\"\n\
             external_listen = \"127.0.0.1:{ext}\"\n\
             internal_listen = \"127.0.0.1:{int}\"\n\
             observability_listen = \"127.0.0.1:{obs}\"\n\
             external_secret_file = \"{d}/external\"\n\
             internal_secret_file = \"{d}/internal\"\n\
             agent_keys = [\"{d}/agents.pem\"]\n\
             max_wait = \"30s\"\n\
             [registry]\n\
             backend = {{ kind = \"redis\", url = \"{redis}\" }}\n\
             # Periodic upkeep (refresh, gc, the topology safety net) is spaced out so\n\
             # that none falls in the test's 2 s window: what that window measures is\n\
             # whether a waiting request polls, and nothing else may talk to Redis.\n\
             ttl = \"10m\"\n\
             refresh_interval = \"5m\"\n\
             gc_interval = \"10m\"\n\
             topology_resync_interval = \"10m\"\n",
            agent = k.agent,
            ext = k.external,
            int = k.internal,
            obs = k.observability,
            d = dir.display(),
        ),
    )
    .unwrap();
    let (child, lines) =
        crate::common::spawn_podgate(["kas", "--config", config.to_str().unwrap()]);
    let first = lines.recv().unwrap();
    assert!(first.starts_with("kas: agents on"), "{name}: {first}");
    procs.0.push(child);
    k
}

/// Start `podgate agentk` for the token in `token_file` against `kas_agent_port`;
/// returns once connected, with its connection id.
fn start_agentk(
    procs: &mut Procs,
    kas_agent_port: u16,
    token_file: &Path,
    kubeconfig: &Path,
    pod_name: &str,
) -> i64 {
    // agentk warns while kas2 is gone; only errors are worth a test log.
    let (child, lines) = crate::common::spawn_podgate([
        "agentk",
        "--kas",
        &format!("grpc://127.0.0.1:{kas_agent_port}"),
        "--token-file",
        token_file.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--observability-listen",
        &format!("127.0.0.1:{}", free_port()),
        "--pod-name",
        pod_name,
        "--pod-namespace",
        "gitlab-agent",
    ]);
    procs.0.push(child);
    // A replica that never connects fails the test after a minute instead of
    // hanging it.
    crate::common::first_line(
        &lines,
        Duration::from_secs(60),
        &format!("{pod_name}: connected to kas"),
        |line| {
            let rest = line.strip_prefix("agentk: connected as agent ")?;
            let (_, conn) = rest.split_once(", connection ").unwrap();
            Some(conn.parse::<i64>().unwrap())
        },
    )
}

/// Redis's per-command call counts (`INFO commandstats`), without `info` itself.
fn commandstats(redis: &RedisServer) -> BTreeMap<String, u64> {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (name != "info").then(|| (name.to_owned(), calls))
        })
        .collect()
}

async fn http_get(port: u16, path: &str) -> String {
    fixtures::http_get(([127, 0, 0, 1], port).into(), path)
        .await
        .1
}

fn write_agent_token(dir: &Path, tokens: &AgentTokens, agent: u64) -> PathBuf {
    let path = dir.join(format!("agent-{agent}.token"));
    std::fs::write(&path, format!("{}\n", tokens.mint(Some(agent)))).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kas_route_to_agent_replicas_survive_a_kas_stopping_and_wait_without_polling() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    std::fs::write(d.join("external"), b64(&EXTERNAL)).unwrap();
    std::fs::write(d.join("internal"), b64(&[9u8; 32])).unwrap();
    let tokens = AgentTokens::new(1);
    std::fs::write(d.join("agents.pem"), tokens.public_pem()).unwrap();

    let kube = KubeTestServer::start(100).await.unwrap();
    for (ns, name) in [("default", "web-1"), ("default", "web-2"), ("ops", "db-1")] {
        kube.put(
            "pods",
            ns,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": ns},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        );
    }
    let kubeconfig = d.join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let want = ["default/web-1", "default/web-2", "ops/db-1"];

    let mut procs = Procs(Vec::new());
    let kas1 = start_kas(&mut procs, d, "kas1", &redis.url());
    let kas2 = start_kas(&mut procs, d, "kas2", &redis.url());
    let kas3 = start_kas(&mut procs, d, "kas3", &redis.url());
    let token3 = write_agent_token(d, &tokens, 3);
    let on_kas2 = start_agentk(&mut procs, kas2.agent, &token3, &kubeconfig, "agentk-a");
    let on_kas3 = start_agentk(&mut procs, kas3.agent, &token3, &kubeconfig, "agentk-b");

    let gitlab = mint_external(&EXTERNAL, "gitlab", 600).unwrap();
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", kas1.external))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut api = KasApiClient::new(channel);

    // kas1 holds no tunnel to agent 3: it routes to kas2 or kas3, which answer
    // through agentk, which lists the pods with kube-rs.
    let resp = api
        .get_pods(get_pods(3, 0, &gitlab))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pod_names(&resp), want);
    assert!([on_kas2, on_kas3].contains(&resp.connection_id));
    // Each replica, by its connection id.
    for conn in [on_kas2, on_kas3] {
        let resp = api
            .get_pods(get_pods(3, conn, &gitlab))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.connection_id, conn);
        assert_eq!(pod_names(&resp), want);
    }
    let metrics = http_get(kas1.observability, "/metrics").await;
    assert!(
        metrics.contains("podgate_kas_routing_duration_seconds_count{outcome=\"kas\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podgate_kas_tunnels{state=\"idle\"} 0"),
        "{metrics}"
    );
    let (status, body) =
        fixtures::http_get(([127, 0, 0, 1], kas1.observability).into(), "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    // Both replicas, each with the kas that holds it.
    let by_id = |api: &mut KasApiClient<Channel>| {
        let mut r = tonic::Request::new(ConnectedAgentsByIdRequest { agent_id: 3 });
        r.metadata_mut()
            .insert("authorization", format!("Bearer {gitlab}").parse().unwrap());
        let mut api = api.clone();
        async move {
            let mut agents: Vec<(i64, u32, String)> = api
                .connected_agents_by_id(r)
                .await
                .unwrap()
                .into_inner()
                .agents
                .into_iter()
                .map(|a| {
                    let kas = a.kas_address.unwrap();
                    assert_eq!(kas.ip, "127.0.0.1");
                    (a.connection_id, kas.port, a.pod_name)
                })
                .collect();
            agents.sort();
            agents
        }
    };
    let mut expected = vec![
        (on_kas2, u32::from(kas2.internal), "agentk-a".to_owned()),
        (on_kas3, u32::from(kas3.internal), "agentk-b".to_owned()),
    ];
    expected.sort();
    assert_eq!(by_id(&mut api).await, expected);

    // Stop kas2: at shutdown it removes itself and the replica it held.
    let kas2_child = &mut procs.0[kas2.index];
    crate::common::process::terminate(kas2_child.id());
    let status = kas2_child.wait().unwrap();
    assert!(status.success(), "kas2 exited with {status}");
    assert_eq!(
        by_id(&mut api).await,
        [(on_kas3, u32::from(kas3.internal), "agentk-b".to_owned())]
    );
    // Requests keep working, via kas3.
    for _ in 0..20 {
        let resp = api
            .get_pods(get_pods(3, 0, &gitlab))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.connection_id, on_kas3);
        assert_eq!(pod_names(&resp), want);
    }

    // Agent 5 connects 2 s after GitLab asks for it.
    let token5 = write_agent_token(d, &tokens, 5);
    let asked = Instant::now();
    let mut waiting_api = api.clone();
    let request = {
        let gitlab = gitlab.clone();
        tokio::spawn(async move {
            let r = waiting_api.get_pods(get_pods(5, 0, &gitlab)).await;
            (r, Instant::now())
        })
    };
    // The request is waiting at kas1 (its gauge says so): from here until agent 5
    // connects, nothing may ask Redis anything.
    eventually(
        Duration::from_secs(10),
        "the request waits at kas1",
        || async {
            http_get(kas1.observability, "/metrics")
                .await
                .contains("podgate_kas_routing_waiting 1")
                .then_some(())
        },
    )
    .await;
    let before = commandstats(&redis);
    tokio::time::sleep_until((asked + Duration::from_secs(2)).into()).await;
    let after = commandstats(&redis);
    assert_eq!(
        before, after,
        "Redis commands while the request waited (polling?)"
    );
    assert!(!request.is_finished());
    let on_kas3_5 = start_agentk(&mut procs, kas3.agent, &token5, &kubeconfig, "agentk-5");
    let connected = Instant::now();
    let (resp, answered) = request.await.unwrap();
    let resp = resp.unwrap().into_inner();
    assert_eq!(resp.connection_id, on_kas3_5);
    assert_eq!(pod_names(&resp), want);
    let served = commandstats(&redis);
    let used: u64 = served.values().sum::<u64>() - after.values().sum::<u64>();
    eprintln!(
        "late agent: asked at 0 ms, agentk connected at {} ms, answered at {} ms \
         ({} ms after the connect was seen); Redis commands meanwhile: 0 while waiting, \
         {used} for the connect and the routed request",
        connected.duration_since(asked).as_millis(),
        answered.duration_since(asked).as_millis(),
        answered.saturating_duration_since(connected).as_millis(),
    );
    let metrics = http_get(kas1.observability, "/metrics").await;
    assert!(
        metrics.contains("podgate_kas_routing_waits_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podgate_kas_routing_waiting 0"),
        "{metrics}"
    );
}
