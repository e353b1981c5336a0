//! The client against in-process fakes ([`super::fakes`]), as gitlab-runner's
//! `router/client_test.go` (d79f3e7b) tests its own: what reaches the router, each
//! answer's outcome, the fallbacks, and the breaker driven by paused time.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use http::StatusCode;
use serde_json::json;
use tokio::time::{Duration, advance};
use tonic::Code;

use super::breaker::{FAILURE_GRACE, FAILURE_THRESHOLD, OPEN_TIMEOUT, State};
use super::client::{Client, Discovery, Fallback, Options, Polled, Via};
use super::fakes::{FakeGitLab, FakeRouter};
use super::gitlab::RunnerConfig;
use super::wstunnel::SUBPROTOCOL;

const TOKEN: &str = "glrt-fake-runner-token";

/// A client of `gitlab` with no keepalive pings (their timers would move paused time).
fn client(gitlab: &FakeGitLab) -> Client {
    Client::with_options(
        RunnerConfig::new(&gitlab.url, TOKEN),
        Options {
            keepalive: None,
            ..Options::default()
        },
    )
}

/// What the fake GitLab's `jobs/request` answers: job `n`, by REST.
fn rest_job(n: u64) -> Option<serde_json::Value> {
    Some(json!({ "id": n, "source": "rest" }))
}

fn assert_router(p: &Polled, want: Code) {
    match &p.via {
        Via::Router { code, .. } => assert_eq!(*code, want, "{p:?}"),
        Via::Rest { .. } => panic!("REST, not the router: {p:?}"),
    }
}

fn assert_rest(p: &Polled, want: Fallback) {
    match &p.via {
        Via::Rest { reason, status } => {
            assert_eq!((*reason, *status), (want, Some(201)), "{p:?}");
        }
        Via::Router { .. } => panic!("the router, not REST: {p:?}"),
    }
}

#[tokio::test]
async fn get_job_carries_the_runners_metadata_and_echoes_the_last_update() {
    let router = FakeRouter::grpc().await;
    router.last_update("queue-v1");
    let gitlab = FakeGitLab::start(Some(format!("grpc://{}", router.addr))).await;
    let c = client(&gitlab);

    let first = c.request_job().await;
    assert!(first.job.is_none() && first.healthy, "{first:?}");
    assert_router(&first, Code::Ok);
    router.answer_job(Some(json!({ "id": 1223 })));
    let second = c.request_job().await;
    assert_eq!(second.job, Some(json!({ "id": 1223 })), "{second:?}");
    match &second.via {
        Via::Router { correlation_id, .. } => assert_eq!(correlation_id, "from-router"),
        other => panic!("{other:?}"),
    }

    let seen = router.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        let md = |k: &str| s.metadata.get(k).map(String::as_str);
        assert_eq!(
            md("authorization"),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        assert_eq!(md("gitlab-agent-type"), Some("runner"));
        let id = md("x-request-id").unwrap_or_default();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id:?}"
        );
        assert!(
            md("user-agent")
                .unwrap_or_default()
                .starts_with("gitlab-runner ")
        );
        assert_eq!(s.job_request["token"], TOKEN);
        assert_eq!(s.job_request["info"]["executor"], "shell");
        assert!(
            s.job_request["system_id"]
                .as_str()
                .unwrap()
                .starts_with("s_")
        );
    }
    // Nothing stored before the first answer; its queue version after.
    assert!(seen[0].job_request.get("last_update").is_none(), "{seen:?}");
    assert_eq!(seen[1].job_request["last_update"], "queue-v1");
    assert_eq!(c.gitlab().last_update().as_deref(), Some("queue-v1"));
    assert_eq!(gitlab.discovery_calls.load(Ordering::SeqCst), 1, "cached");
    assert_eq!(gitlab.rest_calls.load(Ordering::SeqCst), 0);
    assert!(c.fallbacks().is_empty());
}

#[tokio::test]
async fn a_ws_router_is_reached_through_a_ws_tunnel_websocket() {
    let router = FakeRouter::ws().await;
    router.answer_job(Some(json!({ "id": 7 })));
    let url = format!("ws://{}/-/kubernetes-agent/", router.addr);
    let gitlab = FakeGitLab::start(Some(url.clone())).await;
    let c = client(&gitlab);

    for _ in 0..2 {
        let p = c.request_job().await;
        assert_eq!(p.job, Some(json!({ "id": 7 })), "{p:?}");
    }
    assert_eq!(c.discovery(), Discovery::Router(url));
    // Both calls on one WebSocket (the factory's one connection).
    let upgrades = router.upgrades();
    assert_eq!(upgrades.len(), 1, "{upgrades:?}");
    let h = |k: &str| upgrades[0].get(k).map(String::as_str);
    assert_eq!(h("sec-websocket-protocol"), Some(SUBPROTOCOL));
    assert_eq!(h("authorization"), Some(format!("Bearer {TOKEN}").as_str()));
    assert!(
        h("user-agent")
            .unwrap_or_default()
            .starts_with("gitlab-runner ")
    );
    assert_eq!(router.seen().len(), 2);
}

#[tokio::test]
async fn unimplemented_drops_the_discovery_and_falls_back_then_rediscovers() {
    let router = FakeRouter::grpc().await;
    router.fail_with(Code::Unimplemented);
    let gitlab = FakeGitLab::start(Some(format!("grpc://{}", router.addr))).await;
    let c = client(&gitlab);

    let p = c.request_job().await;
    assert_rest(&p, Fallback::RouterDisabled);
    assert_eq!(p.job, rest_job(1));
    assert_eq!(c.discovery(), Discovery::Unknown, "dropped");
    assert_eq!(c.breaker().state(), State::Closed);

    // GitLab no longer names a router: the next poll asks again and goes to REST.
    gitlab.set_router(None);
    let p = c.request_job().await;
    assert_rest(&p, Fallback::NoDiscovery);
    assert_eq!(c.discovery(), Discovery::NoRouter);
    let p = c.request_job().await;
    assert_rest(&p, Fallback::NoDiscovery);
    assert_eq!(
        gitlab.discovery_calls.load(Ordering::SeqCst),
        2,
        "no router is cached too"
    );
    assert_eq!(c.get_job_calls(), 1);
    assert_eq!(
        c.fallbacks(),
        BTreeMap::from([(Fallback::NoDiscovery, 2), (Fallback::RouterDisabled, 1)])
    );
}

#[tokio::test]
async fn other_codes_leave_the_runner_unhealthy_without_a_fallback() {
    let router = FakeRouter::grpc().await;
    let gitlab = FakeGitLab::start(Some(format!("grpc://{}", router.addr))).await;
    let c = client(&gitlab);
    for code in [
        Code::PermissionDenied,
        Code::Unauthenticated,
        Code::Internal,
    ] {
        router.fail_with(code);
        let p = c.request_job().await;
        assert!(p.job.is_none() && !p.healthy, "{p:?}");
        assert_router(&p, code);
        assert!(
            matches!(&p.via, Via::Router { message, .. } if message == "fake router"),
            "{p:?}"
        );
    }
    assert_eq!(c.breaker().state(), State::Closed);
    assert!(c.fallbacks().is_empty());
    assert_eq!(gitlab.rest_calls.load(Ordering::SeqCst), 0);
}

/// A plain HTTP answer (an edge refusing the call before any gRPC server) gets the
/// code grpc-go gives its HTTP status, not tonic's `INTERNAL` for a body it cannot
/// read as gRPC.
#[tokio::test]
async fn plain_http_refusals_get_grpc_gos_codes() {
    let router = FakeRouter::grpc().await;
    let gitlab = FakeGitLab::start(Some(format!("grpc://{}", router.addr))).await;
    let c = client(&gitlab);
    for (status, code, healthy) in [
        (StatusCode::UNAUTHORIZED, Code::Unauthenticated, false),
        (StatusCode::FORBIDDEN, Code::PermissionDenied, false),
        (StatusCode::BAD_GATEWAY, Code::Unavailable, true),
        (StatusCode::IM_A_TEAPOT, Code::Unknown, false),
    ] {
        router.refuse_with_http(status);
        let p = c.request_job().await;
        assert!(p.job.is_none() && p.healthy == healthy, "{p:?}");
        assert_router(&p, code);
        let Via::Router { message, .. } = &p.via else {
            unreachable!()
        };
        assert!(
            message.starts_with(&format!(
                "unexpected HTTP status code received from server: {}",
                status.as_u16()
            )) && message.contains(r#"unexpected content-type "application/json""#),
            "{message}"
        );
    }
    assert!(c.fallbacks().is_empty());
}

/// `TestRequestJob_SustainedRouterFailure_TripsAndFallsBack` and
/// `TestRequestJob_CircuitBreakerRecoversAfterCooldown`, on paused time.
#[tokio::test(start_paused = true)]
async fn a_sustained_outage_trips_the_breaker_to_rest_until_a_trial_succeeds() {
    let router = FakeRouter::grpc().await;
    router.fail_with(Code::Unavailable);
    let gitlab = FakeGitLab::start(Some(format!("grpc://{}", router.addr))).await;
    let c = client(&gitlab);

    // Inside the grace, failures are transient even past the threshold: no job,
    // healthy, the router asked every time.
    for _ in 0..=FAILURE_THRESHOLD {
        let p = c.request_job().await;
        assert!(p.job.is_none() && p.healthy, "{p:?}");
        assert_router(&p, Code::Unavailable);
    }
    assert_eq!(gitlab.rest_calls.load(Ordering::SeqCst), 0);

    // Persisting past it, the next failure trips the breaker and that poll goes to REST.
    advance(FAILURE_GRACE + Duration::from_secs(1)).await;
    let p = c.request_job().await;
    assert_rest(&p, Fallback::BreakerTripped);
    assert_eq!(c.breaker().state(), State::Open);
    let calls_at_trip = c.get_job_calls();

    // Open: REST, the router left alone, for 30 s.
    advance(OPEN_TIMEOUT - Duration::from_secs(1)).await;
    let p = c.request_job().await;
    assert_rest(&p, Fallback::BreakerOpen);
    assert_eq!(c.get_job_calls(), calls_at_trip);

    // The router recovers; after the timeout one trial reaches it and closes the breaker.
    router.answer_job(Some(json!({ "id": 1223 })));
    advance(Duration::from_secs(1)).await;
    let p = c.request_job().await;
    assert_eq!(p.job, Some(json!({ "id": 1223 })), "{p:?}");
    assert_router(&p, Code::Ok);
    assert_eq!(c.get_job_calls(), calls_at_trip + 1);
    assert_eq!(c.breaker().state(), State::Closed);
    assert_eq!(
        c.fallbacks(),
        BTreeMap::from([(Fallback::BreakerOpen, 1), (Fallback::BreakerTripped, 1)])
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_trial_reopens_the_breaker_and_goes_to_rest() {
    let router = FakeRouter::grpc().await;
    router.fail_with(Code::DeadlineExceeded);
    let gitlab = FakeGitLab::start(Some(format!("grpc://{}", router.addr))).await;
    let c = client(&gitlab);
    for _ in 0..FAILURE_THRESHOLD {
        c.request_job().await;
    }
    advance(FAILURE_GRACE).await;
    assert_rest(&c.request_job().await, Fallback::BreakerTripped);
    advance(OPEN_TIMEOUT).await;
    let calls = c.get_job_calls();
    let p = c.request_job().await;
    assert_eq!(c.get_job_calls(), calls + 1, "the trial reached the router");
    assert_rest(&p, Fallback::BreakerTripped);
    assert_eq!(c.breaker().state(), State::Open);
    assert_rest(&c.request_job().await, Fallback::BreakerOpen);
}

/// Test 6 of the brief. Dialling is lazy, as in gitlab-runner: a router on a closed
/// port is an `UNAVAILABLE` call (a breaker failure, no job, healthy), not a dial
/// failure; `dial_failed` is for a URL the factory cannot dial, here gitlab-runner's
/// "unsupported scheme in kas address".
#[tokio::test]
async fn a_closed_port_is_unavailable_and_an_undiallable_url_falls_back_dial_failed() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let gitlab = FakeGitLab::start(Some(format!("grpc://{closed}"))).await;
    let c = client(&gitlab);
    let p = c.request_job().await;
    assert!(p.job.is_none() && p.healthy, "{p:?}");
    assert_router(&p, Code::Unavailable);
    assert!(c.fallbacks().is_empty());
    assert_eq!(c.get_job_calls(), 1);

    let gitlab = FakeGitLab::start(Some(format!("http://{closed}"))).await;
    let c = client(&gitlab);
    let p = c.request_job().await;
    assert_rest(&p, Fallback::DialFailed);
    assert_eq!(p.job, rest_job(1));
    assert_eq!(c.get_job_calls(), 0);
    assert_eq!(c.fallbacks(), BTreeMap::from([(Fallback::DialFailed, 1)]));
}
