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
        kubernetes_version: None,
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

/// A registry with default settings on `server`.
async fn standalone(server: &RedisServer) -> Registry {
    Registry::connect(RegistryConfig {
        backend: BackendConfig::Redis { url: server.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap()
}

/// The four fields one registration writes, as (key, field): its membership in the
/// project index; its connection, expiry and kas holding in the agent hash.
fn fields(agent: i64) -> [(String, String); 4] {
    let [project, agent_key] = keys(agent);
    let connection = agent * 10;
    [
        (project, format!("{agent}:{connection}")),
        (agent_key.clone(), format!("conn:{connection}")),
        (agent_key.clone(), format!("exp:{connection}")),
        (agent_key, "kas:grpc://kas-a:8155".into()),
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
    for (key, field) in fields(agent) {
        p.cmd("HEXISTS").arg(key).arg(field);
    }
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
        let [member, _, expiry, holding] = fields(agent);
        let mut p = redis::pipe();
        p.atomic();
        for (key, field) in [member, expiry, holding] {
            p.cmd("HGET").arg(key).arg(field);
        }
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
    let registry = standalone(&server).await;
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
    let errors_before = kas.metrics().backend_errors_total();

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
        kas.metrics().backend_errors_total() >= errors_before + 20,
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
    let registry = standalone(&server).await;
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

/// A registration whose write fails is not owned: nothing refreshes it into Redis
/// later, where it would be a connection no stream stands behind (a ghost that
/// `GetPods` is routed to). The caller got the error and dropped the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_registration_is_not_owned_and_never_published() {
    let mut server = RedisServer::start();
    let registry = standalone(&server).await;
    registry.register_agent(conn(1)).await.unwrap();
    server.kill();
    let err = registry.register_agent(conn(2)).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(registry.owned_connections(), 1, "only the registered one");
    assert_eq!(registry.owned_by_agent(1).len(), 1);
    assert!(registry.owned_by_agent(2).is_empty());
    assert_eq!(registry.metrics().owned_connections(), 1);
    server.restart_empty();
    eventually(Duration::from_secs(10), "a refresh to succeed", || async {
        registry.refresh().await.ok()
    })
    .await;
    assert_eq!(registry.connections_by_agent(1).await.unwrap().len(), 1);
    assert!(
        registry.connections_by_agent(2).await.unwrap().is_empty(),
        "the failed registration was published by a refresh"
    );
}

/// A registration cancelled mid-write (the gRPC handler's future dropped: agentk
/// went away, kas is stopping) is not owned either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_cancelled_mid_write_is_not_owned() {
    use futures_util::FutureExt as _;
    let server = RedisServer::start();
    let registry = standalone(&server).await;
    // Writes are held by the server, so the registration cannot complete.
    assert_eq!(
        server.cli(&["CLIENT", "PAUSE", "60000", "WRITE"]).trim(),
        "OK"
    );
    // One poll: the write is sent and the future waits for Redis; then dropped.
    assert!(registry.register_agent(conn(3)).now_or_never().is_none());
    assert_eq!(
        registry.owned_connections(),
        0,
        "a cancelled registration stays owned"
    );
    assert_eq!(registry.metrics().owned_connections(), 0);
    assert_eq!(server.cli(&["CLIENT", "UNPAUSE"]).trim(), "OK");
    // A later registration of the same replica is owned as usual.
    registry.register_agent(conn(3)).await.unwrap();
    assert_eq!(registry.owned_by_agent(3)[0].connection_id, 30);
    registry.refresh().await.unwrap();
    assert_eq!(registry.connections_by_agent(3).await.unwrap().len(), 1);
}

/// Topology changes racing from many processes either land or fail with the
/// transient `Contention` error, never a configuration error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_topology_changes_land_or_fail_as_contention() {
    let server = RedisServer::start();
    let config = RegistryConfig {
        backend: BackendConfig::Redis { url: server.url() },
        ..RegistryConfig::default()
    };
    let mut writers = Vec::new();
    for w in 0..8u64 {
        let registry = Registry::connect(config.clone()).await.unwrap();
        writers.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for i in 0..25u64 {
                let pod = Pod::new(
                    PodId::new(1 + (w * 25 + i) % 50).unwrap(),
                    format!("pod-{w}-{i}"),
                    format!("pod-{w}-{i}:8080"),
                );
                results.push(registry.put_pod(pod).await.map(|t| t.version));
            }
            results
        }));
    }
    let mut landed = 0u64;
    for w in writers {
        for r in w.await.unwrap() {
            match r {
                Ok(_) => landed += 1,
                Err(e @ Error::Contention { .. }) => assert!(e.is_transient()),
                Err(e) => panic!("not a contention error: {e:?}"),
            }
        }
    }
    assert!(landed > 0);
    // Every change that landed made exactly one new version: none lost, none twice.
    let check = Registry::connect(config).await.unwrap();
    assert_eq!(check.reload_topology().await.unwrap().version, landed);
}

#[test]
fn contention_is_transient_and_says_so() {
    let e = Error::Contention {
        what: "the topology",
        attempts: 16,
    };
    assert!(e.is_transient());
    assert!(e.to_string().contains("try again"), "{e}");
}
