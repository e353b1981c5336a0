//! `GetPods` routing on loopback: two kas instances sharing one real `redis-server`,
//! agentk replicas answering from memory (three fixed pods, no Kubernetes), and
//! GitLab's gRPC client. It measures, one request at a time after a warm-up:
//!
//! 1. **local**: GitLab calls the kas that holds the agent's reverse tunnels;
//! 2. **kas → kas**: GitLab calls kas1, the agent is on kas2, so kas1 looks the agent
//!    up in the registry and calls kas2's internal endpoint (goal: p50 ≤ 2 ms);
//! 3. **wake-up**: a `GetPods` for an agent connected nowhere waits at kas1 (checked
//!    with kas1's `routing_waiting` gauge); then an agentk for it connects to kas2.
//!    The delay runs until the waiting request returns, from the moment agentk is
//!    connected (`Agentk::connected()` resolved: its `GetConfiguration` answered) and
//!    from the moment `Agentk::start_with` was called. A fresh agent id each time
//!    (goal: ≤ 20 ms).
//!
//! Prints p50/p99/max of each as a table, the goal checks, and one JSON line.
//!
//! Run: `cargo bench -p podgate-agent-e2e --bench routing` (5,000 requests per latency
//! case, 50 wake-ups; change with `-- --requests N --wakeups N`). Under
//! `cargo test --benches` it is a smoke run: 50 requests and 3 wake-ups. Every
//! request must succeed with the three pods, or the run panics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use podgate_agent::auth::mint_external;
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_agent::proto::{GetPodsRequest, GetPodsResponse, Pod};
use podgate_agentk::{Agentk, AgentkConfig, Handler, Responses, unary};
use podgate_kas::Kas;
use podgate_registry::testing::RedisServer;
use podgate_registry::{BackendConfig, Registry, RegistryConfig};
use podgate_testkit::fixtures::{AgentTokens, EXTERNAL_SECRET as EXTERNAL, channel, kas_config};
use prost::Message as _;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::Channel;

/// Pods every agentk answers with.
const PODS: [(&str, &str); 3] = [
    ("default", "web-1"),
    ("default", "web-2"),
    ("kube-system", "coredns"),
];

/// Requests sent before each latency case is measured.
const WARMUP: usize = 200;

/// Longest the bench waits for a request to start waiting at kas1.
const SETTLE: Duration = Duration::from_secs(10);

/// What to run: from the command line.
struct Args {
    /// Measured requests per latency case.
    requests: usize,
    /// Wake-ups measured.
    wakeups: usize,
}

impl Args {
    /// `cargo bench` passes `--bench`; `cargo test --benches` does not (smoke run).
    /// `--requests N` and `--wakeups N` override either; other arguments are ignored.
    fn parse() -> Args {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let full = args.iter().any(|a| a == "--bench");
        let mut out = if full {
            Args {
                requests: 5_000,
                wakeups: 50,
            }
        } else {
            Args {
                requests: 50,
                wakeups: 3,
            }
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f, Some(v.to_owned())),
                None => (a.as_str(), None),
            };
            let slot = match flag {
                "--requests" => &mut out.requests,
                "--wakeups" => &mut out.wakeups,
                _ => continue,
            };
            let value = inline.or_else(|| it.next().cloned());
            *slot = value
                .as_deref()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or_else(|| panic!("{flag} takes a positive number, got {value:?}"));
        }
        out
    }
}

/// agentk's request handler for the bench: `GetPods` → [`PODS`], encoded once.
struct FixedPods {
    answer: Vec<u8>,
}

impl FixedPods {
    fn new() -> FixedPods {
        let pods = PODS
            .iter()
            .map(|(namespace, name)| Pod {
                namespace: (*namespace).into(),
                name: (*name).into(),
            })
            .collect();
        FixedPods {
            answer: GetPodsResponse {
                pods,
                connection_id: 0,
            }
            .encode_to_vec(),
        }
    }
}

impl Handler for FixedPods {
    fn handle(&self, method: String, _payload: Vec<u8>) -> Responses {
        let answer = if method == podgate_agent::tunnel::GET_PODS {
            Ok(self.answer.clone())
        } else {
            Err(tonic::Status::unimplemented(method))
        };
        unary(std::future::ready(answer))
    }
}

/// A kas on free loopback ports with its own registry client for `redis_url`.
async fn start_kas(redis_url: &str, keys: podgate_tokens::KeySet) -> Kas {
    let registry = Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis {
            url: redis_url.to_owned(),
        },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let mut config = kas_config(keys, Duration::from_secs(30));
    config.observability_listen = None;
    Kas::start(config, registry).await.unwrap()
}

fn agentk_config(kas: &Kas, token: String) -> AgentkConfig {
    AgentkConfig {
        kas_url: format!("grpc://{}", kas.agent_addr()),
        token,
        pod_namespace: "gitlab-agent".into(),
        pod_name: "agentk-0".into(),
        idle_tunnels: 2,
        max_busy_tunnels: 100,
        observability_listen: None,
        kubeconfig: None,
        ca_file: None,
        graph_sync_timeout: std::time::Duration::from_secs(30),
    }
}

/// Start an agentk for `agent_id` at `kas` and wait until the kas holds its idle
/// tunnels; the replica and its connection id.
async fn connect_agent(kas: &Kas, tokens: &AgentTokens, agent_id: i64) -> (Agentk, i64) {
    let agentk = Agentk::start_with(
        agentk_config(kas, tokens.mint(Some(u64::try_from(agent_id).unwrap()))),
        Arc::new(FixedPods::new()),
    )
    .await
    .unwrap();
    let status = agentk.connected().await;
    assert_eq!(status.agent_id, agent_id);
    let connection_id = status.connection_id.unwrap();
    kas.tunnels().wait_idle(agent_id, connection_id, 2).await;
    (agentk, connection_id)
}

/// GitLab: `KasApi` over one channel to a kas's external listener.
#[derive(Clone)]
struct GitLab {
    client: KasApiClient<Channel>,
    authorization: MetadataValue<Ascii>,
}

impl GitLab {
    async fn connect(kas: &Kas) -> GitLab {
        let channel = channel(kas.external_addr()).await;
        let token = mint_external(&EXTERNAL, "gitlab", 600).unwrap();
        GitLab {
            client: KasApiClient::new(channel),
            authorization: format!("Bearer {token}").parse().unwrap(),
        }
    }

    /// `GetPods` for any replica of `agent_id`.
    async fn call(&mut self, agent_id: i64) -> Result<GetPodsResponse, tonic::Status> {
        let mut request = tonic::Request::new(GetPodsRequest {
            agent_id,
            connection_id: 0,
            namespace: String::new(),
        });
        request
            .metadata_mut()
            .insert("authorization", self.authorization.clone());
        self.client
            .get_pods(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// [`GitLab::call`]; panics unless it answers [`PODS`] from replica
    /// `connection_id`.
    async fn get_pods(&mut self, agent_id: i64, connection_id: i64) {
        match self.call(agent_id).await {
            Ok(response) => check(&response, agent_id, connection_id),
            Err(e) => panic!("GetPods for agent {agent_id} failed: {e}"),
        }
    }
}

fn check(response: &GetPodsResponse, agent_id: i64, connection_id: i64) {
    let pods: Vec<(&str, &str)> = response
        .pods
        .iter()
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    assert_eq!(pods, PODS, "GetPods for agent {agent_id}: wrong pods");
    assert_eq!(
        response.connection_id, connection_id,
        "GetPods for agent {agent_id}: answered by the wrong replica"
    );
}

/// Microseconds, 1 µs to 60 s, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
}

/// One latency case: its histogram, and the Redis commands one request cost.
struct Case {
    latency: Histogram<u64>,
    redis_per_request: f64,
}

/// Commands `redis` has processed so far (`INFO stats`; not counting this one).
fn redis_commands(redis: &RedisServer) -> u64 {
    let info = redis.cli(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total_commands_processed in INFO stats: {info}"))
}

/// `n` sequential `GetPods` through `gitlab`, after [`WARMUP`] unmeasured ones.
async fn latency(
    gitlab: &mut GitLab,
    redis: &RedisServer,
    agent_id: i64,
    connection_id: i64,
    n: usize,
) -> Case {
    let warmup = WARMUP.min(n);
    let before = redis_commands(redis);
    for _ in 0..warmup {
        gitlab.get_pods(agent_id, connection_id).await;
    }
    let mut h = histogram();
    for _ in 0..n {
        let t = Instant::now();
        gitlab.get_pods(agent_id, connection_id).await;
        record(&mut h, t.elapsed());
    }
    // Minus the first INFO; background refreshes (every 30 s) are noise here.
    let commands = redis_commands(redis).saturating_sub(before + 1);
    Case {
        latency: h,
        redis_per_request: commands as f64 / (warmup + n) as f64,
    }
}

/// Wake-up delays: from `connected()` resolving, and from `start_with`.
struct Wakeups {
    from_connected: Histogram<u64>,
    from_start: Histogram<u64>,
    /// Times the request returned before the bench saw `connected()` resolve.
    early: usize,
}

/// `n` wake-ups: a request for a fresh agent waits at `kas1`, then the agent
/// connects to `kas2`.
async fn wakeups(
    kas1: &Kas,
    kas2: &Kas,
    gitlab1: &GitLab,
    tokens: &AgentTokens,
    n: usize,
) -> Wakeups {
    let handler = Arc::new(FixedPods::new());
    let mut out = Wakeups {
        from_connected: histogram(),
        from_start: histogram(),
        early: 0,
    };
    for i in 0..n {
        let agent_id = 10_000 + i64::try_from(i).unwrap();
        let config = agentk_config(kas2, tokens.mint(Some(u64::try_from(agent_id).unwrap())));
        assert_eq!(kas1.metrics().routing_waiting.get(), 0);
        // The answering replica is only known once connected: checked after.
        let mut gitlab = gitlab1.clone();
        let waiter = tokio::spawn(async move {
            let result = gitlab.call(agent_id).await;
            (result, Instant::now())
        });
        let settle = Instant::now() + SETTLE;
        while kas1.metrics().routing_waiting.get() != 1 {
            assert!(
                Instant::now() < settle,
                "the GetPods for agent {agent_id} never started waiting at kas1"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }

        let started = Instant::now();
        let agentk = Agentk::start_with(config, handler.clone()).await.unwrap();
        let status = agentk.connected().await;
        let connected = Instant::now();
        let (result, done) = waiter.await.unwrap();
        let response = match result {
            Ok(r) => r,
            Err(e) => panic!("the waiting GetPods for agent {agent_id} failed: {e}"),
        };
        check(&response, agent_id, status.connection_id.unwrap());
        if done < connected {
            out.early += 1;
        }
        record(
            &mut out.from_connected,
            done.saturating_duration_since(connected),
        );
        record(&mut out.from_start, done - started);
        drop(agentk);
    }
    out
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn row(label: &str, h: &Histogram<u64>) {
    println!(
        "{label:<34} {:>6} {:>9.3} {:>9.3} {:>9.3}",
        h.len(),
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    );
}

fn json(h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({
        "n": h.len(),
        "p50_us": h.value_at_quantile(0.50),
        "p99_us": h.value_at_quantile(0.99),
        "max_us": h.max(),
    })
}

fn goal(what: &str, us: u64, goal_ms: f64) {
    let verdict = if ms(us) <= goal_ms { "met" } else { "MISSED" };
    println!("{what} {:.3} ms (goal <= {goal_ms} ms): {verdict}", ms(us));
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::start();
    rt.block_on(async {
        let tokens = AgentTokens::new(1);
        let kas1 = start_kas(&redis.url(), tokens.keys()).await;
        let kas2 = start_kas(&redis.url(), tokens.keys()).await;
        let mut gitlab1 = GitLab::connect(&kas1).await;
        let mut gitlab2 = GitLab::connect(&kas2).await;

        // One agent on kas2: GitLab calling kas2 is local, calling kas1 is kas → kas.
        let (agentk, connection_id) = connect_agent(&kas2, &tokens, 7).await;
        let local = latency(&mut gitlab2, &redis, 7, connection_id, args.requests).await;
        let via_kas = latency(&mut gitlab1, &redis, 7, connection_id, args.requests).await;
        drop(agentk);

        let woken = wakeups(&kas1, &kas2, &gitlab1, &tokens, args.wakeups).await;

        if cfg!(debug_assertions) {
            println!("(unoptimised build: these numbers say nothing about the goals)");
        }
        println!(
            "{:<34} {:>6} {:>9} {:>9} {:>9}",
            "GetPods (one at a time)", "n", "p50 ms", "p99 ms", "max ms"
        );
        row("local (kas holds the tunnel)", &local.latency);
        row("kas1 -> kas2 (internal endpoint)", &via_kas.latency);
        row("wake-up after connected()", &woken.from_connected);
        row("wake-up after start_with()", &woken.from_start);
        if woken.early > 0 {
            println!(
                "({} wake-ups returned before connected() was seen; counted as 0)",
                woken.early
            );
        }
        println!(
            "Redis commands per GetPods: local {:.2}, kas1 -> kas2 {:.2}",
            local.redis_per_request, via_kas.redis_per_request
        );
        goal(
            "p50 via kas->kas",
            via_kas.latency.value_at_quantile(0.50),
            2.0,
        );
        goal(
            "p50 wake-up after connected",
            woken.from_connected.value_at_quantile(0.50),
            20.0,
        );
        goal(
            "p99 wake-up after connected",
            woken.from_connected.value_at_quantile(0.99),
            20.0,
        );
        println!(
            "{}",
            serde_json::json!({
                "bench": "routing",
                "local": json(&local.latency),
                "kas_to_kas": json(&via_kas.latency),
                "redis_commands_per_request": {
                    "local": local.redis_per_request,
                    "kas_to_kas": via_kas.redis_per_request,
                },
                "wakeup_from_connected": json(&woken.from_connected),
                "wakeup_from_start": json(&woken.from_start),
                "wakeups_returned_before_connected": woken.early,
            })
        );
        kas1.shutdown().await.unwrap();
        kas2.shutdown().await.unwrap();
    });
}
