//! `AgentRouter` and `KasInternal.Call`: tunnelled calls routed kas → kas stream
//! message by message and are cancelled at agentk when the caller drops them; an
//! agent's own `Unavailable` reaches the caller as it is while a kas without the
//! tunnel answers a marked `Unavailable` (the caller re-routes); a blackholed kas holds
//! nothing past `max_wait`; and agentk's `MakeRequest` against kube-sim through two
//! kas instances ([`make_request`]).

mod make_request;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use podgate_agent::proto::kas_internal_client::KasInternalClient;
use podgate_agent::proto::{CallRequest, CallStart, call_request};
use podgate_agentk::{Handler, Responses, TunnelPool, serve_tunnels};
use podgate_kas::Kas;
use podgate_kas::routing::{HOP_WAIT_KEY, NO_TUNNEL_KEY};
use podgate_registry::{
    AgentConnection, AgentEvent, KasAddress, MemoryBackend, Registry, RegistryConfig,
};
use podgate_testkit::fixtures::{
    INTERNAL_SECRET, agent_tokens, bearer, channel, configuration_stream, http_get, kas_config,
};
use tonic::Code;

/// Two kas instances on one in-memory registry.
async fn two_kas(
    max_wait: Duration,
) -> (
    Kas,
    Kas,
    podgate_tokens::KeySet,
    impl Fn(Option<u64>) -> String,
) {
    let (keys, mint) = agent_tokens();
    let backend = MemoryBackend::new(podgate_registry::Topology::default());
    let mut kases = Vec::new();
    for _ in 0..2 {
        let registry = Registry::with_memory(backend.clone(), RegistryConfig::default())
            .await
            .unwrap();
        kases.push(
            Kas::start(kas_config(keys.clone(), max_wait), registry)
                .await
                .unwrap(),
        );
    }
    let kas2 = kases.pop().unwrap();
    let kas1 = kases.pop().unwrap();
    (kas1, kas2, keys, mint)
}

/// An agentk replica of agent `agent` on `kas` answering with `handler`: its
/// connection id, its configuration stream (connected while held), its tunnels.
async fn replica<H: Handler>(
    kas: &Kas,
    token: String,
    agent: i64,
    handler: Arc<H>,
) -> (i64, impl Sized, tokio::task::JoinHandle<()>) {
    let ch = channel(kas.agent_addr()).await;
    let (conn, stream) = configuration_stream(ch.clone(), &token).await.unwrap();
    let tunnels = tokio::spawn(serve_tunnels(
        ch,
        token,
        Some(conn),
        TunnelPool::new(2),
        handler,
    ));
    kas.tunnels().wait_idle(agent, conn, 2).await;
    (conn, stream, tunnels)
}

/// The test handler's methods.
const COUNT: &str = "/podgate.test.Test/Count";
const FAIL: &str = "/podgate.test.Test/Fail";

/// A kas → kas `Call` request stream: its start, and nothing more while it is open.
fn start_call(
    agent_id: i64,
    connection_id: i64,
    method: &str,
) -> impl futures_util::Stream<Item = CallRequest> + Send + 'static {
    let start = CallRequest {
        msg: Some(call_request::Msg::Start(CallStart {
            agent_id,
            connection_id,
            method: method.into(),
            meta: Default::default(),
        })),
    };
    futures_util::stream::iter([start]).chain(futures_util::stream::pending())
}

/// "Count" streams 1, 2, … until the tunnel ends, then notifies; "Fail" answers
/// agentk's own `Unavailable`.
struct Test(Arc<tokio::sync::Notify>);
struct Stopped(Arc<tokio::sync::Notify>);
impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}
impl Handler for Test {
    fn descriptor(
        &self,
    ) -> podgate_agent::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor {
        podgate_agent::tunnel::descriptor(&[COUNT, FAIL]).unwrap()
    }

    fn handle(&self, method: String, _payload: Vec<u8>) -> Responses {
        match method.as_str() {
            COUNT => {
                let stopped = Stopped(self.0.clone());
                Box::pin(futures_util::stream::unfold(
                    (0u32, stopped),
                    |(n, s)| async move { Some((Ok((n + 1).to_be_bytes().to_vec()), (n + 1, s))) },
                ))
            }
            _ => Box::pin(futures_util::stream::once(async {
                Err(tonic::Status::unavailable("kubernetes API unreachable"))
            })),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kas_to_kas_calls_stream_cancel_and_pass_agent_errors_through() {
    let (kas1, kas2, _keys, mint) = two_kas(Duration::from_secs(5)).await;
    let stopped = Arc::new(tokio::sync::Notify::new());
    let (conn, _presence, tunnels) =
        replica(&kas2, mint(Some(3)), 3, Arc::new(Test(stopped.clone()))).await;
    let router = kas1.router();
    assert_eq!(kas1.tunnels().idle(3, 0), 0, "kas1 holds no tunnel");

    // Streamed through kas2, in order, by the replica there.
    let mut counting = router.open(3, 0, COUNT, Vec::new()).await.unwrap();
    assert_eq!(counting.connection_id(), conn);
    for want in 1u32..=500 {
        assert_eq!(
            counting.message().await.unwrap().unwrap(),
            want.to_be_bytes()
        );
    }
    assert_eq!(kas2.metrics().tunnels_busy.get(), 1);
    // Dropping the response at kas1 ends the handler at agentk.
    drop(counting);
    stopped.notified().await;
    podgate_registry::testing::eventually(
        Duration::from_secs(5),
        "kas2's tunnel is released",
        || async { (kas2.metrics().tunnels_busy.get() == 0).then_some(()) },
    )
    .await;

    // agentk's own Unavailable is an answer, not "no tunnel": no re-route, no wait.
    let e = router.open(3, conn, FAIL, Vec::new()).await.err().unwrap();
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(e.message(), "kubernetes API unreachable");
    assert!(e.metadata().get(NO_TUNNEL_KEY).is_none());
    assert_eq!(kas1.metrics().reroutes.get(), 0);
    assert_eq!(kas1.metrics().routing_waits.get(), 0);

    let (_, metrics) = http_get(kas1.observability_addr().unwrap(), "/metrics").await;
    for line in [
        r#"podgate_kas_routed_total{method="Count",outcome="kas"} 1"#,
        r#"podgate_kas_routed_total{method="Fail",outcome="error"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    tunnels.abort();
}

/// The receiving side follows the instruction only: no tunnel and no replica here
/// is refused at once (trailers only); a replica registered here without a free
/// tunnel is accepted, then refused once the caller's wait has passed; both refusals
/// carry the no-tunnel mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kas_internal_call_marks_no_tunnel() {
    let (_kas1, kas2, _keys, mint) = two_kas(Duration::from_secs(30)).await;
    let token = podgate_agent::auth::mint_internal(&INTERNAL_SECRET, 30).unwrap();
    let mut internal = KasInternalClient::new(channel(kas2.internal_addr()).await);
    let call = |agent_id: i64, connection_id: i64, wait_ms: &str| {
        let mut r = bearer(
            tonic::Request::new(start_call(agent_id, connection_id, COUNT)),
            &token,
        );
        r.metadata_mut()
            .insert(HOP_WAIT_KEY, wait_ms.parse().unwrap());
        r
    };
    let e = internal.call(call(9, 0, "30000")).await.err().unwrap();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.metadata().get(NO_TUNNEL_KEY).is_some(), "{e:?}");

    // Agent 4's replica is connected to kas2 but serves no tunnels.
    let (conn, _presence) = configuration_stream(channel(kas2.agent_addr()).await, &mint(Some(4)))
        .await
        .unwrap();
    let mut stream = internal
        .call(call(4, conn, "200"))
        .await
        .expect("accepted: the replica is registered here")
        .into_inner();
    let e = stream.message().await.err().unwrap();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.metadata().get(NO_TUNNEL_KEY).is_some(), "{e:?}");
}

/// A kas the registry names that accepts TCP connections and never answers: the
/// call ends with `DeadlineExceeded` at `max_wait` instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_kas_holds_nothing_past_max_wait() {
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            sockets.push(s);
        }
    });
    let registry = podgate_testkit::fixtures::memory_registry().await;
    put(&registry, 7, 71, &hole_addr.to_string()).await;
    let kas1 = Kas::start(
        kas_config(podgate_tokens::KeySet::new(), Duration::from_millis(500)),
        registry,
    )
    .await
    .unwrap();
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        kas1.router().open(7, 0, COUNT, Vec::new()),
    )
    .await
    .expect("the call ends")
    .err()
    .unwrap();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(kas1.metrics().reroutes.get() >= 1);
    assert_eq!(kas1.metrics().routing_timeouts.get(), 1);
    held.abort();
}

/// Register replica `conn` of `agent` as held by the kas at `kas_addr`.
async fn put(registry: &Registry, agent: i64, conn: i64, kas_addr: &str) {
    registry
        .register_agent(AgentConnection {
            agent_id: agent,
            connection_id: conn,
            project_id: 42,
            version: String::new(),
            commit: String::new(),
            pod_namespace: String::new(),
            pod_name: String::new(),
            kubernetes_version: None,
            connected_at_ms: 0,
            kas: KasAddress::from(kas_addr),
        })
        .await
        .unwrap();
}

/// kas2 answers kas1's `KasInternal.Call` for a replica connected to it from its own
/// state: with Redis down it still takes the call (and waits for a tunnel) instead of
/// reading the failed lookup as "not mine" and sending kas1 elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_is_answered_from_the_kas_own_state_while_redis_is_down() {
    let mut redis = podgate_registry::testing::RedisServer::start();
    let registry = Registry::connect(RegistryConfig {
        backend: podgate_registry::BackendConfig::Redis { url: redis.url() },
        ..RegistryConfig::default()
    })
    .await
    .unwrap();
    let (keys, mint) = agent_tokens();
    let kas2 = Kas::start(kas_config(keys, Duration::from_secs(30)), registry)
        .await
        .unwrap();
    // Agent 4's replica is connected to kas2 but serves no tunnels yet.
    let (conn, _presence) = configuration_stream(channel(kas2.agent_addr()).await, &mint(Some(4)))
        .await
        .unwrap();
    redis.kill();
    let token = podgate_agent::auth::mint_internal(&INTERNAL_SECRET, 30).unwrap();
    let mut internal = KasInternalClient::new(channel(kas2.internal_addr()).await);
    let mut request = bearer(tonic::Request::new(start_call(4, conn, COUNT)), &token);
    request
        .metadata_mut()
        .insert(HOP_WAIT_KEY, "200".parse().unwrap());
    let mut stream = internal
        .call(request)
        .await
        .expect("accepted: the replica is connected here, whatever Redis says")
        .into_inner();
    // No tunnel came within the caller's wait: now it is "no tunnel".
    let e = stream.message().await.err().unwrap();
    assert!(e.metadata().get(NO_TUNNEL_KEY).is_some(), "{e:?}");
}

/// A call waiting for its agent is woken by that agent's events only: other agents
/// connecting and disconnecting anywhere make it re-run no lookup and call no kas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrelated_agents_events_wake_no_waiting_call() {
    let registry = podgate_testkit::fixtures::memory_registry().await;
    let (keys, mint) = agent_tokens();
    let kas1 = Kas::start(kas_config(keys, Duration::from_secs(60)), registry.clone())
        .await
        .unwrap();
    // Agent 7 is registered to a kas that refuses connections: every look at it is
    // one re-route.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    // The registration's own event delivered before the call subscribes: on a
    // loaded machine it could otherwise reach the call late and wake it once more
    // (CI at 07c2992).
    let mut events = registry.subscribe();
    put(&registry, 7, 71, &closed_addr).await;
    loop {
        let e = tokio::time::timeout(Duration::from_secs(20), events.recv())
            .await
            .expect("the registration's event")
            .unwrap();
        if matches!(
            e,
            AgentEvent::Connected {
                agent_id: 7,
                connection_id: 71,
                ..
            }
        ) {
            break;
        }
    }
    let router = kas1.router();
    let call = tokio::spawn(async move { router.open(7, 0, COUNT, Vec::new()).await });
    podgate_registry::testing::eventually(Duration::from_secs(20), "a first re-route", || async {
        (kas1.metrics().reroutes.get() >= 1).then_some(())
    })
    .await;
    let before = kas1.metrics().reroutes.get();
    for round in 0..10 {
        put(&registry, 8, 800 + round, "127.0.0.1:1").await;
        assert!(registry.unregister_agent(8, 800 + round).await.unwrap());
    }
    // Then agent 7 connects here (its events come after agent 8's): the call is
    // served by it.
    let stopped = Arc::new(tokio::sync::Notify::new());
    let (_conn, _stream, _tunnels) =
        replica(&kas1, mint(Some(7)), 7, Arc::new(Test(stopped))).await;
    let routed = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("served once agent 7 connected")
        .unwrap()
        .expect("a response");
    drop(routed);
    let extra = kas1.metrics().reroutes.get() - before;
    // At most one more look at the refusing kas (agent 7's connect may wake the
    // call before its tunnels are in); 20 events of agent 8 would have made 20.
    assert!(extra <= 1, "{extra} re-routes after unrelated events");
}

/// A waiter for one agent's tunnels is not woken when another agent's arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_arriving_wakes_only_its_agents_waiters() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    struct Counting(AtomicUsize);
    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let (keys, mint) = agent_tokens();
    let kas = Kas::start(
        kas_config(keys, Duration::from_secs(5)),
        podgate_testkit::fixtures::memory_registry().await,
    )
    .await
    .unwrap();
    let wakes = Arc::new(Counting(AtomicUsize::new(0)));
    let waker = Waker::from(wakes.clone());
    let mut waiting_for_5 = Box::pin(kas.tunnels().wait_idle(5, 0, 1));
    assert!(matches!(
        waiting_for_5
            .as_mut()
            .poll(&mut Context::from_waker(&waker)),
        Poll::Pending
    ));
    assert_eq!(kas.tunnels().agents_waited_for(), 1);
    // Agent 6's replica brings two tunnels.
    let stopped = Arc::new(tokio::sync::Notify::new());
    let _six = replica(&kas, mint(Some(6)), 6, Arc::new(Test(stopped.clone()))).await;
    assert_eq!(
        wakes.0.load(Ordering::SeqCst),
        0,
        "agent 6's tunnels woke agent 5's waiter"
    );
    // Agent 5's do.
    let _five = replica(&kas, mint(Some(5)), 5, Arc::new(Test(stopped))).await;
    assert!(wakes.0.load(Ordering::SeqCst) >= 1);
    assert!(matches!(
        waiting_for_5
            .as_mut()
            .poll(&mut Context::from_waker(&waker)),
        Poll::Ready(())
    ));
    drop(waiting_for_5);
    assert_eq!(
        kas.tunnels().agents_waited_for(),
        0,
        "the waiter's entry stays"
    );
}

/// kas holds at most `max_idle_tunnels_per_agent` idle tunnels per agent and refuses
/// the rest (counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnels_per_agent_are_capped() {
    let (keys, mint) = agent_tokens();
    let kas = Kas::start(
        podgate_kas::KasConfig {
            max_idle_tunnels_per_agent: 2,
            ..kas_config(keys, Duration::from_secs(5))
        },
        podgate_testkit::fixtures::memory_registry().await,
    )
    .await
    .unwrap();
    let token = mint(Some(9));
    let ch = channel(kas.agent_addr()).await;
    let (conn, _stream) = configuration_stream(ch.clone(), &token).await.unwrap();
    let stopped = Arc::new(tokio::sync::Notify::new());
    let _tunnels = tokio::spawn(serve_tunnels(
        ch,
        token,
        Some(conn),
        TunnelPool::new(5),
        Arc::new(Test(stopped)),
    ));
    podgate_registry::testing::eventually(Duration::from_secs(20), "tunnels refused", || async {
        (kas.metrics().tunnels_refused.get() >= 3).then_some(())
    })
    .await;
    assert_eq!(kas.tunnels().idle(9, 0), 2);
    assert_eq!(kas.metrics().tunnels_idle.get(), 2);
}

/// Refused credentials on the GitLab → kas, kas → kas and agent listeners are
/// counted by listener and reason (and logged with a fingerprint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_counted_by_listener_and_reason() {
    use podgate_agent::proto::kas_api_client::KasApiClient;
    let (kas1, _kas2, _keys, _mint) = two_kas(Duration::from_secs(5)).await;
    // GitLab → kas with a token signed by another secret (a mismatched secret).
    let wrong = podgate_agent::auth::mint_external(&[7u8; 32], "gitlab", 60).unwrap();
    let mut api = KasApiClient::new(channel(kas1.external_addr()).await);
    let e = api
        .get_pods(podgate_testkit::fixtures::get_pods(1, 0, &wrong))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    // kas → kas with no token at all.
    let mut internal = KasInternalClient::new(channel(kas1.internal_addr()).await);
    let e = internal.call(start_call(0, 0, COUNT)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    // An agent with a token no kas key signed.
    let (_, stranger) = agent_tokens();
    let e = configuration_stream(channel(kas1.agent_addr()).await, &stranger(Some(3)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let m = kas1.metrics();
    assert_eq!(m.auth_failures("external"), 1);
    assert_eq!(m.auth_failures("internal"), 1);
    assert_eq!(m.auth_failures("agent"), 1);
    let text = m.render();
    for line in [
        r#"podgate_kas_auth_failures_total{listener="external",reason="signature"} 1"#,
        r#"podgate_kas_auth_failures_total{listener="internal",reason="missing"} 1"#,
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// A tunnel that names a connection another kas holds is refused (and counted): calls
/// for that connection are routed to the kas that holds it, so a tunnel held here
/// would never be used while that kas starves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_for_a_connection_held_elsewhere_is_refused() {
    let (kas1, kas2, _keys, mint) = two_kas(Duration::from_secs(5)).await;
    let token = mint(Some(12));
    let (conn, _stream) = configuration_stream(channel(kas1.agent_addr()).await, &token)
        .await
        .unwrap();
    let stopped = Arc::new(tokio::sync::Notify::new());
    let _tunnels = tokio::spawn(serve_tunnels(
        channel(kas2.agent_addr()).await,
        token,
        Some(conn),
        TunnelPool::new(2),
        Arc::new(Test(stopped)),
    ));
    podgate_registry::testing::eventually(Duration::from_secs(20), "tunnels refused", || async {
        (kas2.metrics().tunnels_misplaced.get() >= 2).then_some(())
    })
    .await;
    assert_eq!(kas2.tunnels().idle(12, 0), 0);
    assert_eq!(kas1.tunnels().idle(12, 0), 0);
}
