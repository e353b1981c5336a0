//! GitLab's Job Router end to end: a gitlab-runner-shaped client through the podgate
//! proxy to each Pod's kas, on `podgate up --no-fleet`.
//!
//! The client ([`client`]) is gitlab-runner's `router.Client` with `FF_USE_JOB_ROUTER`
//! on, written from gitlab-runner's own source, not from podgate's: `router/client.go`,
//! `router/client_conn_factory.go`, `router/token_creds.go`,
//! `router/internal/wstunnel/{client,netconn}.go`, `router/rpc/rpc.proto`,
//! `helpers/circuitbreaker/circuitbreaker.go` and `network/gitlab.go`'s
//! `GetRouterDiscovery`, `PrepareJobRequest`, `RequestJob` and `SetLastUpdate`
//! (repository gitlabhq/gitlab-runner, commit d79f3e7b). It shares no wire code with
//! podgate's crates: its two protobuf messages are written by hand ([`rpc`]), its
//! WebSocket tunnel is its own ([`wstunnel`]), and REST is plain hyper ([`gitlab`]).
//!
//! Where it differs from gitlab-runner (each file says more): one runner per client;
//! no TLS (`grpcs`, `wss`) and no proxy from the environment; `grpc://` dials its one
//! address (no DNS round robin); for `ws://` the HTTP/2 `:authority` is the URL's
//! `host:port` where grpc-go sends the whole URL; outcomes and fallbacks are values
//! to assert on, not log lines and Prometheus counters.
//!
//! Two readings of gitlab-runner's behaviour that matter here: dialling is lazy, as
//! grpc-go's `grpc.NewClient` is, so a router on a closed port is an `UNAVAILABLE`
//! call counted by the breaker, and only a URL the factory cannot dial at all is
//! `dial_failed`; and an answer that is not gRPC (a plain HTTP `401` or `502`) gets
//! the code grpc-go gives its HTTP status ([`rpc`]), not tonic's `INTERNAL`.
//!
//! Layout: [`breaker`] (with its paused-time tests), [`gitlab`], [`rpc`],
//! [`wstunnel`], [`client`]; [`fakes`] and [`client_tests`] test the client in
//! process (the fallbacks, the breaker on paused time, the dial failure); [`up`]
//! starts `podgate up`, which the tests below run against.

mod breaker;
pub mod client;
mod client_tests;
mod fakes;
pub mod gitlab;
mod rpc;
mod up;
mod wstunnel;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use podgate_registry::testing::eventually;
use serde_json::Value;
use tonic::Code;

use client::{Client, Discovery, Fallback, Polled, Via};
use gitlab::RunnerConfig;
use up::{Pod, Runner, Up, pod_of};

/// How long any one poll may take to be answered once its answer is due.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// `podgate_kas_job_router_calls_total`.
const CALLS: &str = "podgate_kas_job_router_calls_total";
/// `podgate_kas_job_router_held`.
const HELD: &str = "podgate_kas_job_router_held";

/// `fut`, which must finish within [`ANSWER_WITHIN`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(ANSWER_WITHIN, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {ANSWER_WITHIN:?}"))
}

/// A runner's poll loop: `RequestJob` again after each "no job, healthy" answer from
/// the router, until a job comes. Anything else fails the test.
async fn poll_until_job(client: Arc<Client>) -> Polled {
    for _ in 0..100 {
        let p = client.request_job().await;
        if p.job.is_some() {
            return p;
        }
        match &p.via {
            Via::Router { code: Code::Ok, .. } if p.healthy => {}
            _ => panic!("neither a job nor a held call's empty answer: {p:?}"),
        }
    }
    panic!("100 empty answers: GetJob is not held");
}

/// `p` is a job from the router, named `name`, made by `pod` with id `id`.
fn assert_routed_job(p: &Polled, pod: &Pod, id: u64, name: &str) {
    let job: &Value = p.job.as_ref().expect("a job");
    let context = format!("Pod {}: {p:?}", pod.id);
    assert!(
        matches!(p.via, Via::Router { code: Code::Ok, .. }),
        "{context}"
    );
    assert_eq!(job["id"].as_u64(), Some(id), "{context}");
    assert_eq!(job["job_info"]["name"], name, "{context}");
    assert_eq!(pod_of(job), Some(pod.id), "{context}");
}

/// The control API says `runner` picked job `id` of `pod`.
async fn assert_picked_by(pod: &Pod, id: u64, runner: &Runner) {
    let job = pod.job(id).await;
    assert_eq!(job["runner_id"].as_u64(), Some(runner.id), "{job}");
    assert_eq!(job["state"], "running", "{job}");
}

/// Tests 1 and 2: a runner of each Pod discovers `scheme`'s router, its GetJob is held
/// by its own Pod's kas, and a job queued on its Pod (and on no other) wakes it with
/// that job. Pods are woken one at a time, so a runner still held when another
/// Pod's job was queued and taken was not woken by it.
async fn runners_are_held_until_their_own_pod_has_a_job(scheme: &str) {
    let up = Up::start(&["--job-router-scheme", scheme]).await;
    let mut runners = Vec::new();
    for pod in &up.pods {
        let runner = up.register_runner(pod).await;
        let client = Arc::new(Client::new(RunnerConfig::new(&up.proxy, &runner.token)));
        runners.push((pod, runner, client));
    }
    let mut polls: Vec<_> = runners
        .iter()
        .map(|(_, _, c)| Some(tokio::spawn(poll_until_job(c.clone()))))
        .collect();

    for (pod, _, client) in &runners {
        eventually(
            ANSWER_WITHIN,
            &format!("Pod {}'s kas to hold a GetJob", pod.id),
            || async { (pod.kas_metric(HELD).await >= 1.0).then_some(()) },
        )
        .await;
        assert_eq!(client.discovery(), Discovery::Router(up.router_url(scheme)));
    }
    for (i, (pod, runner, client)) in runners.iter().enumerate() {
        for later in polls.iter().skip(i) {
            let later = later.as_ref().unwrap();
            assert!(
                !later.is_finished(),
                "a poll ended before Pod {}'s job",
                pod.id
            );
        }
        let name = format!("job-router-{scheme}-pod-{}", pod.id);
        let id = pod.queue_job(&name).await;
        let poll = polls[i].take().unwrap();
        let p = within(&format!("Pod {}'s runner", pod.id), poll)
            .await
            .unwrap();
        assert_routed_job(&p, pod, id, &name);
        assert_picked_by(pod, id, runner).await;
        assert!(client.fallbacks().is_empty(), "{:?}", client.fallbacks());
    }
    for (pod, _, _) in &runners {
        let jobs = pod.kas_metric(&format!(r#"{CALLS}{{result="job"}}"#)).await;
        assert_eq!(
            jobs, 1.0,
            "Pod {}'s kas answered one GetJob with a job",
            pod.id
        );
        eventually(
            ANSWER_WITHIN,
            &format!("Pod {}'s kas to hold nothing", pod.id),
            || async { (pod.kas_metric(HELD).await == 0.0).then_some(()) },
        )
        .await;
    }
}

#[tokio::test]
async fn grpc_runners_are_held_by_their_pods_kas_until_their_pod_has_a_job() {
    runners_are_held_until_their_own_pod_has_a_job("grpc").await;
}

#[tokio::test]
async fn ws_runners_are_held_by_their_pods_kas_until_their_pod_has_a_job() {
    runners_are_held_until_their_own_pod_has_a_job("ws").await;
}

/// Test 3: Pod 3's router off (`--job-router-off 3`). Its discovery answers 501, so its
/// runner polls REST; a client that has the router cached gets `UNIMPLEMENTED`, drops
/// it and polls REST, and then discovers again. Pod 1's router stays on.
#[tokio::test]
async fn a_pod_with_the_router_off_serves_its_runners_over_rest() {
    let up = Up::start(&["--job-router-off", "3"]).await;
    let (pod1, pod3) = (&up.pods[0], &up.pods[2]);

    let runner1 = up.register_runner(pod1).await;
    let on = Client::new(RunnerConfig::new(&up.proxy, &runner1.token));
    let id = pod1.queue_job("router-on").await;
    let p = within("Pod 1's runner", on.request_job()).await;
    assert_routed_job(&p, pod1, id, "router-on");
    assert!(on.fallbacks().is_empty());

    let runner3 = up.register_runner(pod3).await;
    let off = Client::new(RunnerConfig::new(&up.proxy, &runner3.token));
    let id = pod3.queue_job("no-discovery").await;
    let p = within("Pod 3's runner", off.request_job()).await;
    assert_rest_job(&p, pod3, id, Fallback::NoDiscovery);
    assert_eq!(off.discovery(), Discovery::NoRouter);
    assert_eq!(off.get_job_calls(), 0);
    assert_picked_by(pod3, id, &runner3).await;

    let cached = Client::new(RunnerConfig::new(&up.proxy, &runner3.token));
    cached.set_discovery(&up.router_url("grpc"));
    let id = pod3.queue_job("router-disabled").await;
    let p = within("Pod 3's runner, router cached", cached.request_job()).await;
    assert_rest_job(&p, pod3, id, Fallback::RouterDisabled);
    assert_eq!(cached.get_job_calls(), 1);
    assert_eq!(cached.discovery(), Discovery::Unknown, "dropped");
    assert_eq!(cached.breaker().state(), breaker::State::Closed);
    let unimplemented = pod3
        .kas_metric(&format!(r#"{CALLS}{{result="unimplemented"}}"#))
        .await;
    assert_eq!(unimplemented, 1.0);

    let id = pod3.queue_job("rediscovered").await;
    let p = within("Pod 3's runner, discovering again", cached.request_job()).await;
    assert_rest_job(&p, pod3, id, Fallback::NoDiscovery);
    assert_eq!(cached.discovery(), Discovery::NoRouter);
    assert_eq!(cached.get_job_calls(), 1);
    assert_eq!(
        cached.fallbacks(),
        BTreeMap::from([(Fallback::NoDiscovery, 1), (Fallback::RouterDisabled, 1)])
    );
}

/// `p` is Pod `pod`'s job `id`, by REST `jobs/request` for `reason`.
fn assert_rest_job(p: &Polled, pod: &Pod, id: u64, reason: Fallback) {
    let context = format!("Pod {}: {p:?}", pod.id);
    assert!(
        matches!(p.via, Via::Rest { reason: r, status: Some(201) } if r == reason),
        "{context}"
    );
    let job = p.job.as_ref().expect("a job");
    assert_eq!(job["id"].as_u64(), Some(id), "{context}");
    assert_eq!(pod_of(job), Some(pod.id), "{context}");
}

/// `token` with one character of its base64 part changed: the CRC no longer holds.
fn altered(token: &str) -> String {
    let dot = token.find('.').expect("a v1 routable token");
    let at = "glrt-".len() + (dot - "glrt-".len()) / 2;
    let mut bytes = token.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// Test 4: a GetJob whose runner token is a routable token with one character
/// changed is refused at the edge with `UNAUTHENTICATED`; no kas sees it. The same
/// call with the token as issued reaches Pod 2's kas and gets its job.
#[tokio::test]
async fn a_get_job_with_an_altered_routable_token_is_refused_at_the_edge() {
    let up = Up::start(&[]).await;
    let pod2 = &up.pods[1];
    let runner = up.register_runner(pod2).await;
    let bad = altered(&runner.token);
    let decoded = podgate_tokens::gitlab::decode(&runner.token).expect("a v1 token");
    assert_eq!(decoded.keys.cell, Some(pod2.id));
    assert!(podgate_tokens::gitlab::decode(&bad).is_err(), "still valid");

    let refused = Client::new(RunnerConfig::new(&up.proxy, &bad));
    refused.set_discovery(&up.router_url("grpc"));
    let p = within("the altered token's GetJob", refused.request_job()).await;
    assert!(p.job.is_none() && !p.healthy, "{p:?}");
    assert!(
        matches!(
            p.via,
            Via::Router {
                code: Code::Unauthenticated,
                ..
            }
        ),
        "{p:?}"
    );
    assert!(refused.fallbacks().is_empty());
    for pod in &up.pods {
        assert_eq!(
            pod.kas_metric(CALLS).await,
            0.0,
            "Pod {}'s kas saw it",
            pod.id
        );
    }

    let id = pod2.queue_job("good-token").await;
    let good = Client::new(RunnerConfig::new(&up.proxy, &runner.token));
    good.set_discovery(&up.router_url("grpc"));
    let p = within("the issued token's GetJob", good.request_job()).await;
    assert_routed_job(&p, pod2, id, "good-token");
    for pod in &up.pods {
        let want = if pod.id == pod2.id { 1.0 } else { 0.0 };
        assert_eq!(pod.kas_metric(CALLS).await, want, "Pod {}", pod.id);
    }
}

/// `podgate loadtest wake` (the wake-latency benchmark, `scripts/bench-wake.sh`):
/// with every runner held at its Pod's kas, each job it queues for one runner comes
/// back to that runner, and each is timed.
#[tokio::test]
async fn the_wake_benchmark_times_every_job_it_queues_on_the_router() {
    let up = Up::start(&[]).await;
    let mut args: Vec<String> = [
        "loadtest",
        "wake",
        "--target",
        &up.proxy,
        "--runners",
        "6",
        "--samples",
        "6",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for pod in &up.pods {
        args.extend([
            "--pod".to_owned(),
            pod.registration_token.clone(),
            format!("http://{}", pod.address),
            "--held".to_owned(),
            pod.kas_metrics.clone(),
            format!("{HELD} "),
        ]);
    }
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_podgate"))
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    assert_eq!(report["mode"], "router", "{report}");
    assert_eq!(report["held"], 6, "{report}");
    assert_eq!(report["samples"], 6, "{report}");
    assert_eq!(report["lost"], 0, "{report}");
    assert_eq!(report["poll_errors"], 0, "{report}");
    // Each runner's first answer, and one job per sample.
    assert!(report["polls"].as_u64().unwrap() >= 12, "{report}");
    assert!(report["p50_ms"].as_f64().unwrap() > 0.0, "{report}");
}
