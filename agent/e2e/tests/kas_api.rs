//! kas's two gRPC listeners: each takes only its own JWT (missing, wrong, or the other
//! listener's → `Unauthenticated` with no detail), and `ConnectedAgentsById` /
//! `ConnectedAgentsForProject` list the replicas the presence registry holds.

use podgate_agent::auth::{mint_external, mint_internal};
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_agent::proto::kas_internal_client::KasInternalClient;
use podgate_agent::proto::{
    ConnectedAgentsByIdRequest, ConnectedAgentsForProjectRequest, GetPodsRequest,
};
use podgate_kas::Kas;
use podgate_registry::{
    AgentConnection, KasAddress, MemoryBackend, Registry, RegistryConfig, Topology,
};
use podgate_testkit::fixtures::{
    EXTERNAL_SECRET as EXTERNAL, INTERNAL_SECRET as INTERNAL, agent_tokens, bearer, channel,
    configuration_stream, get_pods, http_get, kas_config, memory_registry,
};
use tonic::Code;

fn conn(agent: i64, connection: i64, project: i64, kas: &str) -> AgentConnection {
    AgentConnection {
        agent_id: agent,
        connection_id: connection,
        project_id: project,
        version: "v17.6.0".into(),
        commit: "abc".into(),
        pod_namespace: "gitlab-agent".into(),
        pod_name: format!("agentk-{connection}"),
        kubernetes_version: None,
        connected_at_ms: 1_700_000_000_000,
        kas: KasAddress::from(kas),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listener_authenticates_and_connected_agents_come_from_the_registry() {
    let registry = memory_registry().await;
    registry
        .register_agent(conn(3, 31, 42, "10.0.0.2:8155"))
        .await
        .unwrap();
    registry
        .register_agent(conn(3, 32, 42, "10.0.0.3:8155"))
        .await
        .unwrap();
    registry
        .register_agent(conn(4, 41, 43, "10.0.0.3:8155"))
        .await
        .unwrap();
    let kas = Kas::start(
        kas_config(
            podgate_tokens::KeySet::new(),
            std::time::Duration::from_secs(5),
        ),
        registry,
    )
    .await
    .unwrap();
    let ext = channel(kas.external_addr()).await;
    let int = channel(kas.internal_addr()).await;
    let mut api = KasApiClient::new(ext);
    let mut internal = KasInternalClient::new(int);

    // External: GitLab's token works; nothing else does, and nothing says why.
    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let by_id = |t: Option<&str>| {
        let req = tonic::Request::new(ConnectedAgentsByIdRequest { agent_id: 3 });
        match t {
            Some(t) => bearer(req, t),
            None => req,
        }
    };
    let agents = api
        .connected_agents_by_id(by_id(Some(&gitlab)))
        .await
        .unwrap()
        .into_inner()
        .agents;
    let mut replicas: Vec<(i64, String, u32)> = agents
        .iter()
        .map(|a| {
            let k = a.kas_address.clone().unwrap();
            (a.connection_id, k.ip, k.port)
        })
        .collect();
    replicas.sort();
    assert_eq!(
        replicas,
        [
            (31, "10.0.0.2".to_owned(), 8155),
            (32, "10.0.0.3".to_owned(), 8155)
        ],
        "both replicas with their kas"
    );
    let project = api
        .connected_agents_for_project(bearer(
            tonic::Request::new(ConnectedAgentsForProjectRequest { project_id: 43 }),
            &gitlab,
        ))
        .await
        .unwrap()
        .into_inner()
        .agents;
    assert_eq!(project.iter().map(|a| a.id).collect::<Vec<_>>(), [4]);

    let internal_token = mint_internal(&INTERNAL, 30).unwrap();
    for (what, token) in [
        ("no token", None),
        ("garbage", Some("not-a-jwt".to_owned())),
        (
            "wrong secret",
            Some(mint_external(b"another-secret-of-32-bytes-long!", "gitlab", 60).unwrap()),
        ),
        (
            "wrong issuer",
            Some(mint_external(&EXTERNAL, "not-gitlab", 60).unwrap()),
        ),
        ("the internal token", Some(internal_token.clone())),
    ] {
        let e = api
            .connected_agents_by_id(by_id(token.as_deref()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "external, {what}");
        assert_eq!(
            e.message(),
            "unauthenticated",
            "external, {what}: no detail leaks"
        );
    }

    // Internal: the external secret never opens it.
    let get_pods = |t: Option<&str>| {
        let req = tonic::Request::new(GetPodsRequest {
            agent_id: 3,
            connection_id: 31,
            namespace: String::new(),
        });
        match t {
            Some(t) => bearer(req, t),
            None => req,
        }
    };
    for (what, token) in [
        ("no token", None),
        ("GitLab's token", Some(gitlab.clone())),
        (
            "an internal-shaped token signed with the external secret",
            Some(mint_internal(&EXTERNAL, 30).unwrap()),
        ),
    ] {
        let e = internal
            .get_pods(get_pods(token.as_deref()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "internal, {what}");
    }
    // With its own token the call passes authentication and reaches GetPods, which
    // finds no tunnel to agent 3 on this kas.
    let e = internal
        .get_pods(get_pods(Some(&internal_token)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
}

/// agentk keeps a pool of idle tunnels; GitLab's `GetPods` is answered through one of
/// them, by the replica asked for, and the pool is replenished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pods_is_answered_through_a_reverse_tunnel() {
    use std::sync::Arc;

    use podgate_agent::proto::{GetPodsResponse, Pod};
    use podgate_agentk::{Handler, Responses, TunnelPool, serve_tunnels, unary};
    use prost::Message as _;

    /// Answers GetPods with two pods named after the replica; "Count" streams the
    /// numbers 1, 2, ... until the tunnel is ended, then says so on `stopped`.
    struct Pods(&'static str, Arc<tokio::sync::Notify>);
    struct Stopped(Arc<tokio::sync::Notify>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
    const COUNT: &str = "/podgate.test.Test/Count";
    impl Handler for Pods {
        fn descriptor(
            &self,
        ) -> podgate_agent::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor {
            podgate_agent::tunnel::descriptor(&[podgate_agent::tunnel::GET_PODS, COUNT]).unwrap()
        }

        fn handle(&self, method: String, payload: Vec<u8>) -> Responses {
            if method == COUNT {
                let stopped = Stopped(self.1.clone());
                return Box::pin(futures_util::stream::unfold(
                    (0u32, stopped),
                    |(n, s)| async move { Some((Ok((n + 1).to_be_bytes().to_vec()), (n + 1, s))) },
                ));
            }
            let tag = self.0;
            unary(async move {
                assert_eq!(method, podgate_agent::tunnel::GET_PODS);
                let req = GetPodsRequest::decode(payload.as_slice()).unwrap();
                let namespace = if req.namespace.is_empty() {
                    "default".to_owned()
                } else {
                    req.namespace
                };
                let pods = ["web-1", "db-1"]
                    .iter()
                    .map(|n| Pod {
                        namespace: namespace.clone(),
                        name: format!("{tag}-{n}"),
                    })
                    .collect();
                Ok(GetPodsResponse {
                    pods,
                    connection_id: 0,
                }
                .encode_to_vec())
            })
        }
    }

    let (keys, mint) = agent_tokens();
    let token = mint(Some(3));
    let registry = memory_registry().await;
    let kas = Kas::start(
        kas_config(keys, std::time::Duration::from_millis(200)),
        registry,
    )
    .await
    .unwrap();
    let agent_channel = channel(kas.agent_addr()).await;
    // Two replicas (each its configuration stream, which gives its connection id),
    // each with a pool of 2 idle tunnels.
    let (a, _presence_a) = configuration_stream(agent_channel.clone(), &token)
        .await
        .unwrap();
    let (b, _presence_b) = configuration_stream(agent_channel.clone(), &token)
        .await
        .unwrap();
    let stopped = Arc::new(tokio::sync::Notify::new());
    let replicas = [(a, "a"), (b, "b")].map(|(conn, tag)| {
        tokio::spawn(serve_tunnels(
            agent_channel.clone(),
            token.clone(),
            Some(conn),
            TunnelPool::new(2),
            Arc::new(Pods(tag, stopped.clone())),
        ))
    });
    kas.tunnels().wait_idle(3, a, 2).await;
    kas.tunnels().wait_idle(3, b, 2).await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let ext = channel(kas.external_addr()).await;
    let mut api = KasApiClient::new(ext);
    let call = |agent_id: i64, connection_id: i64, namespace: &str| {
        bearer(
            tonic::Request::new(GetPodsRequest {
                agent_id,
                connection_id,
                namespace: namespace.into(),
            }),
            &gitlab,
        )
    };
    // The replica asked for answers.
    let resp = api.get_pods(call(3, b, "prod")).await.unwrap().into_inner();
    assert_eq!(resp.connection_id, b);
    let names: Vec<String> = resp
        .pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    assert_eq!(names, ["prod/b-web-1", "prod/b-db-1"]);
    // Any replica when none is named.
    let resp = api.get_pods(call(3, 0, "")).await.unwrap().into_inner();
    assert!([a, b].contains(&resp.connection_id));
    // Used tunnels are replaced: the pools are full again.
    kas.tunnels().wait_idle(3, a, 2).await;
    kas.tunnels().wait_idle(3, b, 2).await;
    // An agent connected nowhere: DeadlineExceeded once max_wait has passed.
    let e = api.get_pods(call(99, 0, "")).await.unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert_eq!(kas.metrics().routing_timeouts.get(), 1);
    assert_eq!(kas.metrics().routing_waits.get(), 1);

    // A streaming response: many messages, in order, through one tunnel; ending it
    // early (the caller went away) cancels the handler at agentk.
    let call = kas.tunnels().call(3, a, COUNT, &Default::default()).await;
    let call = call.unwrap().expect("an idle tunnel serves Count");
    let mut counting = podgate_kas::routing::Routed::local(call)
        .start(Vec::new())
        .await
        .unwrap();
    for want in 1u32..=1000 {
        let got = counting.message().await.unwrap().unwrap();
        assert_eq!(got, want.to_be_bytes());
    }
    assert_eq!(kas.metrics().tunnels_busy.get(), 1);
    drop(counting);
    stopped.notified().await;
    assert_eq!(kas.metrics().tunnels_busy.get(), 0);
    kas.tunnels().wait_idle(3, a, 2).await;
    // The observability listener shows the tunnels and the routing.
    let (_, metrics) = http_get(kas.observability_addr().unwrap(), "/metrics").await;
    assert!(
        metrics.contains("podgate_kas_tunnels{state=\"idle\"} 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podgate_kas_routing_duration_seconds_count{outcome=\"local\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("podgate_kas_routing_timeouts_total 1"),
        "{metrics}"
    );
    for r in replicas {
        r.abort();
    }
}

/// kas → kas: GitLab asks kas1 for an agent whose replica (and tunnels) are on kas2;
/// kas1 finds kas2 in the registry and calls its internal endpoint. A request for an
/// agent that connects later waits for it (woken by the registry's event) and is then
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pods_is_routed_to_the_kas_holding_the_agent_and_waits_for_late_agents() {
    use std::sync::Arc;

    use podgate_agent::proto::{GetPodsResponse, Pod};
    use podgate_agentk::{Handler, Responses, TunnelPool, serve_tunnels, unary};
    use prost::Message as _;

    struct Named(String);
    impl Handler for Named {
        fn handle(&self, _method: String, _payload: Vec<u8>) -> Responses {
            let name = self.0.clone();
            unary(async move {
                Ok(GetPodsResponse {
                    pods: vec![Pod {
                        namespace: "default".into(),
                        name,
                    }],
                    connection_id: 0,
                }
                .encode_to_vec())
            })
        }
    }

    let (keys, mint) = agent_tokens();
    let agent_token = |agent: u64| mint(Some(agent));
    let backend = MemoryBackend::new(Topology::default());
    let mut kases = Vec::new();
    for _ in 0..2 {
        let registry = Registry::with_memory(backend.clone(), RegistryConfig::default())
            .await
            .unwrap();
        kases.push(
            Kas::start(
                kas_config(keys.clone(), std::time::Duration::from_secs(30)),
                registry,
            )
            .await
            .unwrap(),
        );
    }
    let (kas1, kas2) = (&kases[0], &kases[1]);
    let kas2_agents = channel(kas2.agent_addr()).await;
    // An agentk replica on kas2: its presence stream and its tunnels.
    let connect = |agent: u64| {
        let (channel, token) = (kas2_agents.clone(), agent_token(agent));
        async move {
            let (conn, stream) = configuration_stream(channel.clone(), &token).await.unwrap();
            let tunnels = tokio::spawn(serve_tunnels(
                channel,
                token,
                Some(conn),
                TunnelPool::new(2),
                Arc::new(Named(format!("agent-{agent}"))),
            ));
            (conn, stream, tunnels)
        }
    };
    let (conn3, _presence3, tunnels3) = connect(3).await;
    kas2.tunnels().wait_idle(3, conn3, 2).await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let ext1 = channel(kas1.external_addr()).await;
    let mut api = KasApiClient::new(ext1);
    let call = move |agent_id: i64| {
        bearer(
            tonic::Request::new(GetPodsRequest {
                agent_id,
                connection_id: 0,
                namespace: String::new(),
            }),
            &gitlab.clone(),
        )
    };
    assert_eq!(
        kas1.tunnels().idle(3, 0),
        0,
        "kas1 holds no tunnel to agent 3"
    );
    let resp = api.get_pods(call(3)).await.unwrap().into_inner();
    assert_eq!(resp.connection_id, conn3, "answered by the replica on kas2");
    assert_eq!(resp.pods[0].name, "agent-3");

    // Agent 5 is not connected anywhere: the request waits, and completes once it
    // connects (to kas2).
    let mut waiting_api = api.clone();
    let request5 = call(5);
    let waiting = tokio::spawn(async move { waiting_api.get_pods(request5).await });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    let (conn5, _presence5, tunnels5) = connect(5).await;
    let resp = waiting.await.unwrap().unwrap().into_inner();
    assert_eq!(
        (resp.connection_id, resp.pods[0].name.as_str()),
        (conn5, "agent-5")
    );

    // The caller's deadline ends the wait (kas's own max_wait is 30 s here), and
    // the request stops waiting: the gauge goes back to 0.
    let waits_before = kas1.metrics().routing_waits.get();
    let started = std::time::Instant::now();
    let mut req = call(77);
    req.set_timeout(std::time::Duration::from_millis(300));
    let e = api.get_pods(req).await.unwrap_err();
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{e:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    podgate_registry::testing::eventually(
        std::time::Duration::from_secs(5),
        "the abandoned request stops waiting",
        || async {
            let m = kas1.metrics();
            let cancelled = m.routing().with_label_values(&["cancelled"]);
            (m.routing_waiting.get() == 0 && cancelled.get_sample_count() == 1).then_some(())
        },
    )
    .await;
    assert_eq!(kas1.metrics().routing_waits.get(), waits_before + 1);
    assert_eq!(
        kas1.metrics().routing_timeouts.get(),
        0,
        "the caller gave up, not kas"
    );
    tunnels3.abort();
    tunnels5.abort();
}

/// Shutdown drops nothing: kas first leaves the registry (and refuses new agents),
/// then lets a GitLab request in flight finish through its tunnel, then stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_removes_this_kas_first_and_lets_requests_in_flight_finish() {
    use std::sync::Arc;

    use podgate_agent::proto::{GetPodsResponse, Pod};
    use podgate_agentk::{Handler, Responses, TunnelPool, serve_tunnels, unary};
    use prost::Message as _;
    use tokio::sync::Notify;

    /// Answers once told to; says when a request arrived.
    struct Held {
        arrived: Arc<Notify>,
        release: Arc<Notify>,
    }
    impl Handler for Held {
        fn handle(&self, _method: String, _payload: Vec<u8>) -> Responses {
            let (arrived, release) = (self.arrived.clone(), self.release.clone());
            unary(async move {
                arrived.notify_one();
                release.notified().await;
                Ok(GetPodsResponse {
                    pods: vec![Pod {
                        namespace: "default".into(),
                        name: "slow".into(),
                    }],
                    connection_id: 0,
                }
                .encode_to_vec())
            })
        }
    }

    let (keys, mint) = agent_tokens();
    let token = mint(Some(3));
    // kas's registry and the test's own view of the same store (kas's shutdown stops
    // its registry's background work, event delivery included).
    let backend = MemoryBackend::new(Topology::default());
    let registry = Registry::with_memory(backend.clone(), RegistryConfig::default())
        .await
        .unwrap();
    let kas = Kas::start(
        kas_config(keys, std::time::Duration::from_secs(30)),
        Registry::with_memory(backend, RegistryConfig::default())
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    let agents = channel(kas.agent_addr()).await;
    let (conn, _presence) = configuration_stream(agents.clone(), &token).await.unwrap();
    let (arrived, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let tunnels = tokio::spawn(serve_tunnels(
        agents.clone(),
        token.clone(),
        Some(conn),
        TunnelPool::new(2),
        Arc::new(Held {
            arrived: arrived.clone(),
            release: release.clone(),
        }),
    ));
    kas.tunnels().wait_idle(3, conn, 2).await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let mut api = KasApiClient::new(channel(kas.external_addr()).await);
    let in_flight = tokio::spawn(async move {
        let req = get_pods(3, 0, &gitlab);
        api.get_pods(req).await
    });
    arrived.notified().await;

    let mut events = registry.subscribe();
    let shutdown = tokio::spawn(kas.shutdown_with_grace(std::time::Duration::from_secs(30)));
    // Gone from the registry while the request is still in flight.
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !matches!(
            events.recv().await.unwrap(),
            podgate_registry::AgentEvent::Disconnected { agent_id: 3, .. }
        ) {}
    })
    .await
    .expect("kas unregisters its agent at shutdown");
    assert!(registry.connections_by_agent(3).await.unwrap().is_empty());
    assert!(registry.kas_instances().await.unwrap().is_empty());
    assert!(!in_flight.is_finished());
    // A new agent is refused meanwhile (it will find another kas).
    let e = configuration_stream(agents.clone(), &token)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    // The request in flight completes, then the shutdown does.
    release.notify_one();
    let resp = in_flight.await.unwrap().unwrap().into_inner();
    assert_eq!(resp.pods[0].name, "slow");
    shutdown.await.unwrap().unwrap();
    tunnels.abort();
}

/// The tunnel pool grows under load, up to its bound: agentk keeps 2 idle tunnels,
/// and a tunnel that takes a request is replaced at once, so 4 requests are
/// answered together (max_busy 4); the 5th and 6th wait at kas for a tunnel, and all
/// six complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tunnel_pool_grows_under_load_up_to_its_bound() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use podgate_agent::proto::GetPodsResponse;
    use podgate_agentk::{Handler, Responses, TunnelPool, serve_tunnels, unary};
    use prost::Message as _;
    use tokio::sync::Semaphore;

    /// Counts arrivals; answers when given a permit.
    struct Gate {
        arrived: Arc<AtomicUsize>,
        release: Arc<Semaphore>,
    }
    impl Handler for Gate {
        fn handle(&self, _method: String, _payload: Vec<u8>) -> Responses {
            let (arrived, release) = (self.arrived.clone(), self.release.clone());
            unary(async move {
                arrived.fetch_add(1, Ordering::SeqCst);
                release.acquire().await.unwrap().forget();
                Ok(GetPodsResponse::default().encode_to_vec())
            })
        }
    }

    let (keys, mint) = agent_tokens();
    let token = mint(Some(3));
    let kas = Kas::start(
        kas_config(keys, std::time::Duration::from_secs(30)),
        memory_registry().await,
    )
    .await
    .unwrap();
    let agents = channel(kas.agent_addr()).await;
    let (conn, _presence) = configuration_stream(agents.clone(), &token).await.unwrap();
    let (arrived, release) = (Arc::new(AtomicUsize::new(0)), Arc::new(Semaphore::new(0)));
    let mut pool = TunnelPool::new(2);
    pool.max_busy = 4;
    let agentk_metrics = pool.metrics.clone();
    let tunnels = tokio::spawn(serve_tunnels(
        agents,
        token,
        Some(conn),
        pool,
        Arc::new(Gate {
            arrived: arrived.clone(),
            release: release.clone(),
        }),
    ));
    kas.tunnels().wait_idle(3, conn, 2).await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let api = KasApiClient::new(channel(kas.external_addr()).await);
    let requests: Vec<_> = (0..6)
        .map(|_| {
            let (mut api, gitlab) = (api.clone(), gitlab.clone());
            tokio::spawn(async move {
                let req = get_pods(3, 0, &gitlab);
                api.get_pods(req).await
            })
        })
        .collect();
    // Four answered at once, two waiting at kas for a tunnel.
    podgate_registry::testing::eventually(
        std::time::Duration::from_secs(10),
        "4 requests at agentk and 2 waiting at kas",
        || async {
            (arrived.load(Ordering::SeqCst) == 4 && kas.metrics().routing_waiting.get() == 2)
                .then_some(())
        },
    )
    .await;
    assert_eq!(kas.metrics().tunnels_busy.get(), 4);
    assert_eq!(agentk_metrics.tunnels_busy.get(), 4);
    assert_eq!(
        kas.tunnels().idle(3, conn),
        0,
        "the bound leaves no idle tunnel"
    );
    release.add_permits(6);
    for r in requests {
        r.await.unwrap().unwrap();
    }
    assert_eq!(arrived.load(Ordering::SeqCst), 6);
    // Back to the idle pool.
    kas.tunnels().wait_idle(3, conn, 2).await;
    tunnels.abort();
}

/// kas sets no bound of its own on an agent's first reply (a Graph API first batch
/// waits for an informer sync); the caller's deadline is the bound. GitLab's call
/// carries `grpc-timeout`: when it passes, tonic ends the call at kas, which drops the
/// tunnel, which ends the handler at agentk, and kas holds no busy tunnel after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_answers_holds_nothing_past_the_callers_deadline() {
    use std::sync::Arc;
    use std::time::Duration;

    use podgate_agentk::{Handler, Responses, TunnelPool, serve_tunnels, unary};
    use tokio::sync::Notify;

    /// Never answers; says when a request arrived and when its handler was dropped.
    struct Silent {
        arrived: Arc<Notify>,
        dropped: Arc<Notify>,
    }
    struct OnDrop(Arc<Notify>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
    impl Handler for Silent {
        fn handle(&self, _method: String, _payload: Vec<u8>) -> Responses {
            let (arrived, guard) = (self.arrived.clone(), OnDrop(self.dropped.clone()));
            unary(async move {
                let _guard = guard;
                arrived.notify_one();
                std::future::pending::<()>().await;
                unreachable!("never answers")
            })
        }
    }

    let (keys, mint) = agent_tokens();
    let token = mint(Some(3));
    let kas = Kas::start(
        kas_config(keys, Duration::from_secs(30)),
        memory_registry().await,
    )
    .await
    .unwrap();
    let agents = channel(kas.agent_addr()).await;
    let (conn, _presence) = configuration_stream(agents.clone(), &token).await.unwrap();
    let (arrived, dropped) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let tunnels = tokio::spawn(serve_tunnels(
        agents,
        token,
        Some(conn),
        TunnelPool::new(2),
        Arc::new(Silent {
            arrived: arrived.clone(),
            dropped: dropped.clone(),
        }),
    ));
    kas.tunnels().wait_idle(3, conn, 2).await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let mut api = KasApiClient::new(channel(kas.external_addr()).await);
    let mut req = get_pods(3, 0, &gitlab);
    req.set_timeout(Duration::from_millis(300));
    let call = tokio::spawn(async move { api.get_pods(req).await });
    arrived.notified().await;
    assert_eq!(kas.metrics().tunnels_busy.get(), 1);
    // The deadline ends the call (tonic's server answers `Cancelled: Timeout
    // expired`, as grpc-go's would `DeadlineExceeded`)…
    let e = call.await.unwrap().unwrap_err();
    assert!(
        matches!(e.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{e:?}"
    );
    // …and with it the handler at agentk and the tunnel at kas.
    dropped.notified().await;
    podgate_registry::testing::eventually(
        Duration::from_secs(5),
        "kas's tunnel is released",
        || async { (kas.metrics().tunnels_busy.get() == 0).then_some(()) },
    )
    .await;
    tunnels.abort();
}
