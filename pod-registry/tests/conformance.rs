//! One conformance suite, run unchanged against every backend: in memory, a real
//! `redis-server`, and a real 3-master Redis Cluster.

use std::time::Duration;

use podgate_registry::testing::{RedisCluster, RedisServer, eventually};
use podgate_registry::{
    AgentConnection, AgentEvent, BackendConfig, Error, KasAddress, KasInstance, MemoryBackend, Pod,
    PodState, Registry, RegistryConfig,
};
use podgate_tokens::PodId;
use tokio::sync::broadcast;

/// A place registries share: a memory store, a server or a cluster.
enum Env {
    Memory(MemoryBackend),
    Redis(RedisServer),
    Cluster(RedisCluster),
}

impl Env {
    fn memory() -> Env {
        Env::Memory(MemoryBackend::default())
    }
    fn redis() -> Env {
        Env::Redis(RedisServer::start())
    }
    fn cluster() -> Env {
        Env::Cluster(RedisCluster::start())
    }

    fn config(&self) -> RegistryConfig {
        let backend = match self {
            Env::Memory(_) => BackendConfig::Memory,
            Env::Redis(s) => BackendConfig::Redis { url: s.url() },
            Env::Cluster(c) => BackendConfig::RedisCluster { nodes: c.urls() },
        };
        RegistryConfig {
            backend,
            ..RegistryConfig::default()
        }
    }

    /// A new registry (a new "process") on this environment.
    async fn registry_with(&self, config: RegistryConfig) -> Registry {
        match self {
            Env::Memory(m) => Registry::with_memory(m.clone(), config).await.unwrap(),
            _ => Registry::connect(config).await.unwrap(),
        }
    }

    async fn registry(&self) -> Registry {
        self.registry_with(self.config()).await
    }

    /// For tests on tokio's paused clock: Redis calls never time out (the clock may
    /// jump while a reply is on its way); TTLs, refreshes and GC follow the clock.
    fn paused_config(&self) -> RegistryConfig {
        RegistryConfig {
            response_timeout: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(3600),
            ..self.config()
        }
    }
}

/// On Redis, keeps tokio's paused clock moving in 10 ms steps while the runtime
/// waits: the clock jumps to the next timer whenever nothing is ready, and without
/// this a wait for a Redis reply could jump a whole refresh interval. A test still
/// goes through minutes of TTL in a second or two. In memory nothing waits on I/O.
struct Ticker(Option<tokio::task::JoinHandle<()>>);

impl Ticker {
    fn start(env: &Env) -> Ticker {
        if matches!(env, Env::Memory(_)) {
            return Ticker(None);
        }
        Ticker(Some(tokio::spawn(async {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
            }
        })))
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

fn pod(n: u64) -> PodId {
    PodId::new(n).unwrap()
}

fn conn(agent: i64, connection: i64, project: i64, kas: &str) -> AgentConnection {
    AgentConnection {
        agent_id: agent,
        connection_id: connection,
        project_id: project,
        version: "v17.0.0".into(),
        commit: "abc123".into(),
        pod_namespace: "gitlab-agent".into(),
        pod_name: format!("agentk-{connection}"),
        kubernetes_version: None,
        connected_at_ms: 1_700_000_000_000,
        kas: KasAddress::from(kas),
    }
}

/// The next event that is not `Resync`, within 10 s.
async fn next_event(rx: &mut broadcast::Receiver<AgentEvent>) -> AgentEvent {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await.unwrap() {
                AgentEvent::Resync => continue,
                e => return e,
            }
        }
    })
    .await
    .expect("an event within 10 s")
}

async fn topology_crud_and_watch(env: Env) {
    let writer = env.registry().await;
    let reader = env.registry().await;
    let mut watch = reader.watch_topology();

    writer
        .put_pod(Pod::new(pod(1), "legacy", "127.0.0.1:8001"))
        .await
        .unwrap();
    let mut p2 = Pod::new(pod(2), "pod-2", "127.0.0.1:8002");
    p2.kas.push("127.0.0.1:8152".into());
    writer.put_pod(p2).await.unwrap();
    writer.set_default_pod(Some(pod(1))).await.unwrap();
    writer
        .set_pod_state(pod(2), PodState::Draining)
        .await
        .unwrap();
    let t = writer.topology();
    assert_eq!(t.pods.len(), 2);
    assert_eq!(t.legacy_pod().unwrap().name, "legacy");
    assert_eq!(t.pod(pod(2)).unwrap().state, PodState::Draining);
    assert_eq!(t.version, 4, "one version per change");

    // The other registry sees the same snapshot, woken by the change event.
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if watch.borrow_and_update().version == 4 {
                return watch.borrow().clone();
            }
            watch.changed().await.unwrap();
        }
    })
    .await
    .expect("watch sees version 4");
    assert_eq!(*seen, *t);
    assert_eq!(
        *reader.topology(),
        *t,
        "the lock-free load agrees with the watch"
    );

    writer.remove_pod(pod(2)).await.unwrap();
    assert!(writer.topology().pod(pod(2)).is_none());
    assert!(matches!(
        writer.remove_pod(pod(2)).await,
        Err(Error::NoSuchPod(_))
    ));
    assert!(matches!(
        writer.set_pod_state(pod(9), PodState::Down).await,
        Err(Error::NoSuchPod(_))
    ));
    let bad = Pod::new(pod(3), "", "nowhere");
    let err = writer.put_pod(bad).await.unwrap_err().to_string();
    assert!(err.contains("name") && err.contains("web[0]"), "{err}");
    assert_eq!(writer.topology().version, 5, "failed changes write nothing");
}

async fn presence_register_lookup_unregister(env: Env) {
    let kas1 = env.registry().await;
    let kas2 = env.registry().await;
    kas1.register_agent(conn(3, 100, 42, "grpc://kas1:8155"))
        .await
        .unwrap();
    kas2.register_agent(conn(3, 200, 42, "grpc://kas2:8155"))
        .await
        .unwrap();
    kas2.register_agent(conn(4, 300, 42, "grpc://kas2:8155"))
        .await
        .unwrap();
    kas2.register_agent(conn(5, 400, 7, "grpc://kas2:8155"))
        .await
        .unwrap();
    kas1.register_kas(KasInstance {
        address: "grpc://kas1:8155".into(),
        version: "v1".into(),
        commit: "c".into(),
        pod_id: Some(2),
        started_at_ms: 1,
    })
    .await
    .unwrap();

    for r in [&kas1, &kas2] {
        let by_agent = r.connections_by_agent(3).await.unwrap();
        assert_eq!(
            by_agent,
            vec![
                conn(3, 100, 42, "grpc://kas1:8155"),
                conn(3, 200, 42, "grpc://kas2:8155")
            ]
        );
        let by_project: Vec<(i64, i64)> = r
            .connections_by_project(42)
            .await
            .unwrap()
            .iter()
            .map(|c| (c.agent_id, c.connection_id))
            .collect();
        assert_eq!(by_project, [(3, 100), (3, 200), (4, 300)]);
        assert_eq!(
            r.kas_for_agent(3).await.unwrap(),
            [
                KasAddress::from("grpc://kas1:8155"),
                KasAddress::from("grpc://kas2:8155")
            ]
        );
        assert_eq!(r.kas_instances().await.unwrap().len(), 1);
        assert!(r.connections_by_agent(999).await.unwrap().is_empty());
        assert!(r.kas_for_agent(999).await.unwrap().is_empty());
    }

    assert!(kas1.unregister_agent(3, 100).await.unwrap());
    assert!(
        !kas1.unregister_agent(3, 100).await.unwrap(),
        "not owned any more"
    );
    assert!(
        !kas1.unregister_agent(4, 300).await.unwrap(),
        "owned by kas2, not kas1"
    );
    assert_eq!(kas2.connections_by_agent(3).await.unwrap().len(), 1);
    assert_eq!(
        kas2.kas_for_agent(3).await.unwrap(),
        [KasAddress::from("grpc://kas2:8155")]
    );
    // kas2 holds two agents: dropping one keeps its holding of the other.
    assert!(kas2.unregister_agent(3, 200).await.unwrap());
    assert!(kas2.kas_for_agent(3).await.unwrap().is_empty());
    assert_eq!(kas2.kas_for_agent(4).await.unwrap().len(), 1);
}

async fn ttl_expiry_when_refresh_stops(env: Env) {
    let _ticker = Ticker::start(&env);
    let ttl = Duration::from_secs(60);
    let short = RegistryConfig {
        ttl,
        refresh_interval: Duration::from_secs(20),
        ..env.paused_config()
    };
    let alive = env.registry_with(short.clone()).await;
    let doomed = env.registry_with(short).await;
    // On Redis, each registry's event pump reloads and refreshes everything owned
    // once its pub/sub subscription is up (as after a Redis restart), holding the
    // registry while it does. On a loaded machine that can come after the
    // registration below and keep the dropped registry alive through a periodic
    // refresh (the paused clock races while replies are on their way: CI at
    // 0585da7). A dying kas has no such pass in flight; wait for it to be over.
    eventually(
        Duration::from_secs(600),
        "the doomed registry's first resync",
        || async { (refreshes(&doomed) >= 1).then_some(()) },
    )
    .await;
    alive
        .register_agent(conn(1, 1, 1, "grpc://alive:1"))
        .await
        .unwrap();
    let registering = tokio::time::Instant::now();
    doomed
        .register_agent(conn(2, 2, 1, "grpc://doomed:1"))
        .await
        .unwrap();
    // The doomed process dies without cleanup: its refresh stops. (A periodic
    // refresh in flight at the drop wrote the expiry it computed before it.)
    drop(doomed);
    let registered = tokio::time::Instant::now();
    assert_eq!(
        alive.connections_by_agent(2).await.unwrap().len(),
        1,
        "still within ttl"
    );
    assert!(
        registering.elapsed() < ttl,
        "the lookup above ran before the ttl passed"
    );
    // Once the ttl has passed since the last write it could have made (a refresh
    // loop still running would have pushed the expiry a whole ttl further), it is
    // gone.
    tokio::time::sleep_until(registered + ttl).await;
    assert!(
        alive.connections_by_agent(2).await.unwrap().is_empty(),
        "the unrefreshed entry outlived its ttl"
    );
    assert!(alive.kas_for_agent(2).await.unwrap().is_empty());
    assert!(
        alive
            .connections_by_project(1)
            .await
            .unwrap()
            .iter()
            .all(|c| c.agent_id == 1)
    );
    // The refreshed entry outlives several ttls.
    tokio::time::sleep(3 * ttl).await;
    assert_eq!(
        alive.connections_by_agent(1).await.unwrap().len(),
        1,
        "refreshed entry lives"
    );
    assert!(refreshes(&alive) >= 9);
}

/// How many refreshes `registry` has completed.
fn refreshes(registry: &Registry) -> u64 {
    registry
        .metrics()
        .gather()
        .iter()
        .find(|f| f.name() == "podgate_registry_refresh_duration_seconds")
        .map_or(0, |f| f.get_metric()[0].get_histogram().get_sample_count())
}

async fn gc_removes_expired_entries(env: Env) {
    let _ticker = Ticker::start(&env);
    let short = RegistryConfig {
        ttl: Duration::from_secs(60),
        refresh_interval: Duration::from_secs(20),
        // GC only when asked, so the test sees the count.
        gc_interval: Duration::from_secs(24 * 3600),
        ..env.paused_config()
    };
    let survivor = env.registry_with(short.clone()).await;
    let dead = env.registry_with(short).await;
    // Same agent, same project: the survivor's keys hold the dead one's fields too.
    survivor
        .register_agent(conn(8, 1, 5, "grpc://survivor:1"))
        .await
        .unwrap();
    dead.register_agent(conn(8, 2, 5, "grpc://dead:1"))
        .await
        .unwrap();
    drop(dead);
    eventually(
        Duration::from_secs(120),
        "the dead entry to expire",
        || async { (survivor.connections_by_agent(8).await.unwrap().len() == 1).then_some(()) },
    )
    .await;
    // Expired but still stored: project field, agent field, kas holding.
    assert_eq!(survivor.gc().await.unwrap(), 3);
    assert_eq!(survivor.gc().await.unwrap(), 0, "nothing left to collect");
    assert_eq!(survivor.connections_by_agent(8).await.unwrap().len(), 1);
    assert_eq!(
        survivor.kas_for_agent(8).await.unwrap(),
        [KasAddress::from("grpc://survivor:1")]
    );
}

async fn shutdown_cleans_up_everything_owned(env: Env) {
    let leaving = env.registry().await;
    let staying = env.registry().await;
    let mut events = staying.subscribe();
    leaving
        .register_agent(conn(1, 10, 1, "grpc://leaving:1"))
        .await
        .unwrap();
    leaving
        .register_agent(conn(2, 20, 1, "grpc://leaving:1"))
        .await
        .unwrap();
    leaving
        .register_kas(KasInstance {
            address: "grpc://leaving:1".into(),
            version: String::new(),
            commit: String::new(),
            pod_id: None,
            started_at_ms: 0,
        })
        .await
        .unwrap();
    staying
        .register_agent(conn(3, 30, 1, "grpc://staying:1"))
        .await
        .unwrap();
    assert_eq!(staying.connections_by_project(1).await.unwrap().len(), 3);

    leaving.shutdown().await.unwrap();
    assert_eq!(leaving.owned_connections(), 0);
    let left: Vec<i64> = staying
        .connections_by_project(1)
        .await
        .unwrap()
        .iter()
        .map(|c| c.agent_id)
        .collect();
    assert_eq!(left, [3]);
    assert!(staying.kas_for_agent(1).await.unwrap().is_empty());
    assert!(staying.kas_instances().await.unwrap().is_empty());
    let mut disconnected = Vec::new();
    while disconnected.len() < 2 {
        if let AgentEvent::Disconnected { connection_id, .. } = next_event(&mut events).await {
            disconnected.push(connection_id);
        }
    }
    disconnected.sort();
    assert_eq!(disconnected, [10, 20]);
}

async fn events_reach_other_registries(env: Env) {
    let a = env.registry().await;
    let b = env.registry().await;
    let mut rx = b.subscribe();
    a.register_agent(conn(11, 5, 1, "grpc://a:1"))
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        AgentEvent::Connected {
            agent_id: 11,
            connection_id: 5,
            kas: "grpc://a:1".into()
        }
    );
    a.unregister_agent(11, 5).await.unwrap();
    assert_eq!(
        next_event(&mut rx).await,
        AgentEvent::Disconnected {
            agent_id: 11,
            connection_id: 5,
            kas: "grpc://a:1".into()
        }
    );
}

async fn wait_for_agent_wakes_on_the_event(env: Env) {
    let _ticker = Ticker::start(&env);
    let waiting = env
        .registry_with(RegistryConfig {
            // The safety re-check would take an hour: only the event can wake us.
            wait_recheck_interval: Duration::from_secs(3600),
            ..env.paused_config()
        })
        .await;
    let connecting = env.registry_with(env.paused_config()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let w = waiting.clone();
    let mut waiter = tokio::spawn(async move { w.wait_for_agent(77, deadline).await });
    // The agent is not there: the waiter must still be waiting.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiter)
            .await
            .is_err(),
        "wait_for_agent returned before the agent connected"
    );
    let registered_at = tokio::time::Instant::now();
    connecting
        .register_agent(conn(77, 1, 9, "grpc://other-kas:1"))
        .await
        .unwrap();
    let conns = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("woken well before the deadline")
        .unwrap()
        .unwrap();
    assert_eq!(conns, vec![conn(77, 1, 9, "grpc://other-kas:1")]);
    assert!(registered_at.elapsed() < Duration::from_secs(20));

    // And the deadline is honoured when the agent never comes.
    let err = waiting
        .wait_for_agent(78, tokio::time::Instant::now() + Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::AgentNotConnected { agent_id: 78, .. }),
        "{err}"
    );
}

macro_rules! conformance {
    ($backend:ident, $env:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn topology_crud_and_watch() {
                super::topology_crud_and_watch($env).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn presence_register_lookup_unregister() {
                super::presence_register_lookup_unregister($env).await;
            }
            // On tokio's paused clock: TTLs pass without waiting for them.
            #[tokio::test(flavor = "current_thread", start_paused = true)]
            async fn ttl_expiry_when_refresh_stops() {
                super::ttl_expiry_when_refresh_stops($env).await;
            }
            // On tokio's paused clock: TTLs pass without waiting for them.
            #[tokio::test(flavor = "current_thread", start_paused = true)]
            async fn gc_removes_expired_entries() {
                super::gc_removes_expired_entries($env).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shutdown_cleans_up_everything_owned() {
                super::shutdown_cleans_up_everything_owned($env).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn events_reach_other_registries() {
                super::events_reach_other_registries($env).await;
            }
            // On tokio's paused clock: TTLs pass without waiting for them.
            #[tokio::test(flavor = "current_thread", start_paused = true)]
            async fn wait_for_agent_wakes_on_the_event() {
                super::wait_for_agent_wakes_on_the_event($env).await;
            }
        }
    };
}

conformance!(memory, Env::memory());
conformance!(redis_standalone, Env::redis());
conformance!(redis_cluster, Env::cluster());

/// Two registries in one process (a kas and a proxy in a test, two kas in `podgate
/// up`) keep their own metrics: neither overwrites the other's gauges.
#[tokio::test]
async fn each_registry_has_its_own_metrics() {
    let env = Env::memory();
    let a = env.registry().await;
    let b = env.registry().await;
    a.register_agent(conn(1, 1, 1, "grpc://a:1")).await.unwrap();
    a.register_agent(conn(2, 2, 1, "grpc://a:1")).await.unwrap();
    b.register_agent(conn(3, 3, 1, "grpc://b:1")).await.unwrap();
    assert_eq!(a.metrics().owned_connections(), 2);
    assert_eq!(b.metrics().owned_connections(), 1);
    b.put_pod(Pod::new(pod(1), "one", "127.0.0.1:1"))
        .await
        .unwrap();
    let version = |r: &Registry| {
        r.metrics()
            .gather()
            .iter()
            .find(|f| f.name() == "podgate_registry_topology_version")
            .map(|f| f.get_metric()[0].get_gauge().get_value())
    };
    assert_eq!(version(&b), Some(1.0));
    // Both can be served from one process's Prometheus registry only if they are
    // told apart there: a second registration of the same names is refused.
    let served = prometheus::Registry::new();
    a.register_metrics(&served).unwrap();
    assert!(b.register_metrics(&served).is_err());
}
