//! Redis-only guarantees: atomic registrations (standalone and Cluster) and recovery
//! from a Redis restart that lost everything.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podgate_registry::testing::{RedisCluster, RedisServer, eventually};
use podgate_registry::{
    AgentConnection, BackendConfig, Error, KasInstance, Pod, Registry, RegistryConfig,
};
use podgate_tokens::PodId;
use redis::aio::ConnectionLike;

const AGENTS: i64 = 200;

fn conn(agent: i64) -> AgentConnection {
    AgentConnection {
        agent_id: agent,
        connection_id: agent * 10,
        // One project per agent, so every registration writes fresh keys.
        project_id: 10_000 + agent,
        version: "v1".into(),
        commit: "c".into(),
        pod_namespace: "ns".into(),
        pod_name: "agentk".into(),
        connected_at_ms: 0,
        kas: "grpc://kas-a:8155".into(),
    }
}

/// The keys one registration writes in its transaction: the project index and the
/// agent hash (connection and kas holding).
fn keys(agent: i64) -> [String; 2] {
    let p = 10_000 + agent;
    [
        format!("podgate:{{p:{p}}}:project"),
        format!("podgate:{{p:{p}}}:agent:{agent}"),
    ]
}

#[derive(Default, Debug)]
struct Seen {
    none: usize,
    partial: usize,
    full: usize,
    unequal_ttl: usize,
}

/// One atomic look at a registration: how many of its four fields exist (project
/// membership; connection, expiry and kas holding in the agent hash) and the PTTLs
/// of its two keys.
async fn look<C: ConnectionLike>(c: &mut C, agent: i64) -> (i64, Vec<i64>) {
    let [project, agent_key] = keys(agent);
    let mut p = redis::pipe();
    p.atomic();
    p.cmd("HEXISTS")
        .arg(&project)
        .arg(format!("{agent}:{}", agent * 10));
    p.cmd("HEXISTS")
        .arg(&agent_key)
        .arg(format!("conn:{}", agent * 10));
    p.cmd("HEXISTS")
        .arg(&agent_key)
        .arg(format!("exp:{}", agent * 10));
    p.cmd("HEXISTS")
        .arg(&agent_key)
        .arg("kas:grpc://kas-a:8155");
    p.cmd("PTTL").arg(&project);
    p.cmd("PTTL").arg(&agent_key);
    let (a, b, e, k, t1, t2): (i64, i64, i64, i64, i64, i64) = p.query_async(c).await.unwrap();
    (a + b + e + k, vec![t1, t2])
}

async fn registrations_are_atomic<C: ConnectionLike + Clone + Send + 'static>(
    registry: Registry,
    reader: C,
) {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = done.clone();
    let mut rc = reader.clone();
    let watcher = tokio::spawn(async move {
        let mut seen = Seen::default();
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            for agent in 0..AGENTS {
                let (exists, ttls) = look(&mut rc, agent).await;
                match exists {
                    0 => seen.none += 1,
                    4 => {
                        seen.full += 1;
                        if ttls.iter().max().unwrap() - ttls.iter().min().unwrap() > 1 {
                            seen.unequal_ttl += 1;
                        }
                    }
                    _ => seen.partial += 1,
                }
            }
        }
        seen
    });
    for agent in 0..AGENTS {
        registry.register_agent(conn(agent)).await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let seen = watcher.await.unwrap();
    assert!(
        seen.none > 0 && seen.full > 0,
        "the reader overlapped the writes: {seen:?}"
    );
    assert_eq!(
        seen.partial, 0,
        "a registration was seen half-written: {seen:?}"
    );
    assert_eq!(
        seen.unequal_ttl, 0,
        "keys of one registration had different expiry: {seen:?}"
    );

    // Afterwards: every registration complete, TTLs equal, stored expiries equal.
    let mut rc = reader;
    for agent in 0..AGENTS {
        let (exists, ttls) = look(&mut rc, agent).await;
        assert_eq!(exists, 4);
        assert!(
            ttls.iter().max().unwrap() - ttls.iter().min().unwrap() <= 1,
            "{ttls:?}"
        );
        let [project, agent_key] = keys(agent);
        let mut p = redis::pipe();
        p.atomic();
        p.cmd("HGET")
            .arg(&project)
            .arg(format!("{agent}:{}", agent * 10));
        p.cmd("HGET")
            .arg(&agent_key)
            .arg(format!("exp:{}", agent * 10));
        p.cmd("HGET").arg(&agent_key).arg("kas:grpc://kas-a:8155");
        let values: (String, String, String) = p.query_async(&mut rc).await.unwrap();
        let exp = |s: &str| {
            serde_json::from_str::<serde_json::Value>(s).unwrap()["expires_at_ms"].as_u64()
        };
        // The membership and the holding carry their expiry in JSON; the connection's
        // expiry is its own field. All three are one value.
        assert!(exp(&values.0).is_some());
        assert_eq!(exp(&values.0), values.1.parse::<u64>().ok());
        assert_eq!(exp(&values.0), exp(&values.2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_registration_keys_appear_together_with_equal_expiry() {
    let server = RedisServer::start();
    let registry = Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url: server.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let reader = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    registrations_are_atomic(registry, reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_registration_keys_appear_together_with_equal_expiry() {
    let cluster = RedisCluster::start();
    let registry = Registry::connect(RegistryConfig {
        backend: BackendConfig::RedisCluster {
            nodes: cluster.urls(),
        },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let reader = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    registrations_are_atomic(registry, reader).await;
}

/// Log lines captured from this test's (single) thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn backend_errors_total() -> f64 {
    prometheus::gather()
        .iter()
        .filter(|f| f.name() == "podgate_registry_backend_errors_total")
        .flat_map(|f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_counter().get_value())
                .collect::<Vec<_>>()
        })
        .sum()
}

// One thread, so every task's log line lands in the captured buffer.
#[tokio::test(flavor = "current_thread")]
async fn redis_restarting_empty_gets_everything_back_within_one_refresh_period() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut server = RedisServer::start();
    let refresh = Duration::from_secs(2);
    let config = RegistryConfig {
        backend: BackendConfig::Redis { url: server.url() },
        ttl: Duration::from_secs(10),
        refresh_interval: refresh,
        backoff_max: Duration::from_millis(200),
        topology_resync_interval: Duration::from_millis(300),
        ..RegistryConfig::default()
    };
    let kas = Registry::connect(config.clone()).await.unwrap();
    kas.put_pod(Pod::new(PodId::new(1).unwrap(), "legacy", "127.0.0.1:9001"))
        .await
        .unwrap();
    kas.set_default_pod(PodId::new(1)).await.unwrap();
    kas.register_kas(KasInstance {
        address: "grpc://kas-a:8155".into(),
        version: "v1".into(),
        commit: "c".into(),
        pod_id: Some(1),
        started_at_ms: 0,
    })
    .await
    .unwrap();
    for agent in 0..50 {
        kas.register_agent(conn(agent)).await.unwrap();
    }
    let topology = kas.topology();
    let errors_before = backend_errors_total();

    server.kill();
    // While Redis is down: typed, transient errors; the topology snapshot stays.
    for _ in 0..20 {
        let err = kas.connections_by_agent(1).await.unwrap_err();
        assert!(
            matches!(err, Error::Backend { .. }) && err.is_transient(),
            "{err}"
        );
    }
    assert_eq!(kas.topology(), topology);
    assert!(!kas.backend_up());
    assert!(
        backend_errors_total() >= errors_before + 20.0,
        "failures are counted"
    );

    server.restart_empty();
    let restarted = tokio::time::Instant::now();
    let observer = Registry::connect(config).await.unwrap();
    eventually(refresh * 3, "owned entries back in Redis", || async {
        let kas_back = observer.kas_instances().await.ok()?.len() == 1;
        let first = observer.connections_by_agent(0).await.ok()?.len() == 1;
        let last = observer.connections_by_agent(49).await.ok()?.len() == 1;
        (kas_back && first && last).then_some(())
    })
    .await;
    let took = restarted.elapsed();
    eprintln!("entries back {took:?} after the restart");
    assert!(
        took <= refresh,
        "back after {took:?}, more than one refresh period ({refresh:?})"
    );
    for agent in 0..50 {
        assert_eq!(
            observer.connections_by_agent(agent).await.unwrap().len(),
            1,
            "agent {agent}"
        );
    }
    assert!(kas.backend_up());
    // Redis lost the topology; routing keeps the last good snapshot.
    assert_eq!(kas.topology().pods, topology.pods);
    assert!(observer.topology().pods.is_empty());

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let down = text.matches("registry backend unreachable").count();
    let up = text.matches("registry backend reachable again").count();
    assert!(
        (1..=3).contains(&down),
        "one warning per outage, not per call: {down}\n{text}"
    );
    assert!((1..=3).contains(&up), "{up}\n{text}");
    assert!(text.lines().count() < 20, "no log storm:\n{text}");
}

/// Keys lost without any reconnect (evicted, flushed, deleted by hand) come back with
/// the next refresh: `HSET` reports the fields it had to create, and the registry
/// writes those agents' connection data again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_repairs_keys_lost_without_a_reconnect() {
    let server = RedisServer::start();
    let registry = Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url: server.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    for agent in 0..3 {
        registry.register_agent(conn(agent)).await.unwrap();
    }
    let [project, agent_key] = keys(1);
    assert_eq!(server.cli(&["DEL", &project, &agent_key]).trim(), "2");
    assert!(registry.connections_by_agent(1).await.unwrap().is_empty());
    assert!(
        registry
            .connections_by_project(10_001)
            .await
            .unwrap()
            .is_empty()
    );

    assert_eq!(registry.refresh().await.unwrap(), 3);
    assert_eq!(
        registry.connections_by_agent(1).await.unwrap(),
        vec![conn(1)]
    );
    assert_eq!(
        registry.connections_by_project(10_001).await.unwrap(),
        vec![conn(1)]
    );
    // The others were untouched and still complete.
    assert_eq!(
        registry.connections_by_agent(2).await.unwrap(),
        vec![conn(2)]
    );
    // Wiping everything works the same way.
    server.cli(&["FLUSHALL"]);
    registry.refresh().await.unwrap();
    for agent in 0..3 {
        assert_eq!(
            registry.connections_by_agent(agent).await.unwrap(),
            vec![conn(agent)]
        );
    }
}
