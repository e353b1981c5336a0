//! The Job Router service called as tonic calls it, against a Rails stand-in (an
//! HTTP server answering `jobs/request` as `lib/api/ci/runner.rb` does: 204 with
//! `X-GitLab-Last-Update` while the runner's queue value equals its `last_update`,
//! else 201 with a queued job) and a real `redis-server` holding the queue keys as
//! GitLab writes them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use podgate_registry::testing::{RedisServer, eventually};
use tonic::Code;

use super::metrics::{CallResult, HoldOutcome};
use super::*;

/// A runner token routable to Pod 2 (GitLab's routable token format).
fn runner_token() -> String {
    let keys = podgate_tokens::gitlab::RoutingKeys {
        cell: Some(2),
        organization: Some(1),
        ..Default::default()
    };
    podgate_tokens::gitlab::encode("glrt-", &keys, &podgate_tokens::gitlab::random_bytes()).unwrap()
}

#[derive(Default)]
struct RailsState {
    /// The runner's queue value (`ensure_runner_queue_value`).
    queue_value: String,
    jobs: VecDeque<u64>,
    requests: u64,
    request_ids: Vec<String>,
}

/// Rails' `POST /api/v4/jobs/request`, enough of it.
struct Rails {
    addr: SocketAddr,
    state: Arc<Mutex<RailsState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Rails {
    async fn start() -> Rails {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(RailsState::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((io, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(answer(&st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                        .await;
                });
            }
        });
        Rails { addr, state, task }
    }

    fn requests(&self) -> u64 {
        self.state.lock().unwrap().requests
    }
}

impl Drop for Rails {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    st: &Mutex<RailsState>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Full<Bytes>> {
    assert_eq!(req.uri().path(), "/api/v4/jobs/request");
    let id = req
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let mut st = st.lock().unwrap();
    st.requests += 1;
    st.request_ids.push(id);
    let last_update = body["last_update"].as_str().unwrap_or_default();
    let response = http::Response::builder();
    if last_update != st.queue_value
        && let Some(job) = st.jobs.pop_front()
    {
        return response
            .status(201)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(r#"{{"id":{job}}}"#))))
            .unwrap();
    }
    response
        .status(204)
        .header("X-GitLab-Last-Update", st.queue_value.clone())
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// The runner's queue value moves on: in Redis (as Rails writes it) and in Rails.
async fn tick(redis: &RedisServer, rails: &Rails, token: &str, value: &str) {
    rails.state.lock().unwrap().queue_value = value.to_owned();
    podgate_registry::testing::set_runner_queue_key(&redis.url(), token, value).await;
}

struct Setup {
    redis: RedisServer,
    rails: Rails,
    service: JobRouterService,
}

async fn setup(config: JobRouterConfig) -> Setup {
    let redis = RedisServer::start();
    let rails = Rails::start().await;
    let service = JobRouterService::new(
        Some(JobRouterConfig {
            runner_queue_redis: Some(redis.url()),
            ..config
        }),
        Some(Arc::new(GitlabClient::new(
            &format!("http://{}", rails.addr),
            vec![0; 32],
        ))),
        Arc::new(Classifier::with_keys(podgate_tokens::KeySet::new())),
        JobRouterMetrics::new(&prometheus::Registry::new()),
    );
    eventually(Duration::from_secs(10), "the queue watch", || async {
        (service.queue_watch_up() == Some(true)).then_some(())
    })
    .await;
    Setup {
        redis,
        rails,
        service,
    }
}

/// A `GetJob` as gitlab-runner sends it (`router/client.go`, `router/token_creds.go`).
fn call(token: &str, last_update: &str, request_id: &str) -> Request<GetJobRequest> {
    let body = serde_json::json!({
        "info": {"name": "gitlab-runner", "features": {}},
        "token": token,
        "system_id": "s_0123456789ab",
        "last_update": last_update,
    });
    let mut r = Request::new(GetJobRequest {
        job_request: serde_json::to_vec(&body).unwrap(),
    });
    let md = r.metadata_mut();
    md.insert("authorization", format!("Bearer {token}").parse().unwrap());
    md.insert("gitlab-agent-type", "runner".parse().unwrap());
    md.insert("x-request-id", request_id.parse().unwrap());
    r
}

async fn get_job(
    s: &JobRouterService,
    r: Request<GetJobRequest>,
) -> Result<Response<GetJobResponse>, Status> {
    JobRouter::get_job(s, r).await
}

async fn held(s: &JobRouterService, n: i64) {
    eventually(Duration::from_secs(5), "calls to be held", || async {
        (s.metrics.held() == n).then_some(())
    })
    .await;
}

fn md(r: &Response<GetJobResponse>, name: &str) -> String {
    r.metadata().get(name).unwrap().to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_current_ticket_is_held_off_rails_until_its_queue_key_changes() {
    let s = setup(JobRouterConfig::default()).await;
    let token = runner_token();
    tick(&s.redis, &s.rails, &token, "v1").await;

    // No ticket yet: Rails answers at once, with the value to hold on next time.
    let r = get_job(&s.service, call(&token, "", "id-0")).await.unwrap();
    assert!(r.get_ref().job_response.is_empty());
    assert_eq!(md(&r, "x-gitlab-last-update"), "v1");
    assert_eq!(md(&r, "x-request-id"), "id-0");
    assert_eq!(s.rails.requests(), 1);

    // The current ticket: held, Rails not asked, until a job changes the key.
    let (r, ()) = tokio::join!(get_job(&s.service, call(&token, "v1", "id-1")), async {
        held(&s.service, 1).await;
        assert_eq!(s.rails.requests(), 1, "a held call does not reach Rails");
        s.rails.state.lock().unwrap().jobs.push_back(7);
        tick(&s.redis, &s.rails, &token, "v2").await;
    });
    let r = r.unwrap();
    assert_eq!(r.get_ref().job_response, br#"{"id":7}"#);
    assert_eq!(md(&r, "x-request-id"), "id-1");
    assert_eq!(s.rails.requests(), 2);
    assert_eq!(
        s.rails.state.lock().unwrap().request_ids,
        ["id-0", "id-1"],
        "the runner's correlation id reaches Rails"
    );
    let m = &s.service.metrics;
    assert_eq!(m.holds_of(HoldOutcome::Changed), 1);
    assert_eq!(m.holds_of(HoldOutcome::Ineligible), 1);
    assert_eq!(m.calls_of(CallResult::Job), 1);
    assert_eq!(m.calls_of(CallResult::Empty), 1);
    assert_eq!(m.held(), 0);
}

#[tokio::test]
async fn a_hold_ends_empty_with_the_same_ticket_and_before_the_deadline() {
    let s = setup(JobRouterConfig {
        hold: Duration::from_millis(100),
        ..JobRouterConfig::default()
    })
    .await;
    let token = runner_token();
    tick(&s.redis, &s.rails, &token, "v1").await;
    let r = get_job(&s.service, call(&token, "v1", "a")).await.unwrap();
    assert!(r.get_ref().job_response.is_empty());
    assert_eq!(md(&r, "x-gitlab-last-update"), "v1");
    assert_eq!(s.rails.requests(), 0, "the hold ended at kas");
    assert_eq!(s.service.metrics.holds_of(HoldOutcome::Timeout), 1);

    // A deadline too close for a hold: Rails answers at once.
    let mut c = call(&token, "v1", "b");
    c.metadata_mut()
        .insert("grpc-timeout", "900m".parse().unwrap());
    let r = get_job(&s.service, c).await.unwrap();
    assert_eq!(md(&r, "x-gitlab-last-update"), "v1");
    assert_eq!(s.rails.requests(), 1);
}

#[tokio::test]
async fn over_a_limit_a_call_goes_to_rails_at_once_and_a_gone_client_frees_everything() {
    let s = setup(JobRouterConfig {
        max_held_per_runner: 1,
        ..JobRouterConfig::default()
    })
    .await;
    let token = runner_token();
    tick(&s.redis, &s.rails, &token, "v1").await;
    let mut held_call = Box::pin(get_job(&s.service, call(&token, "v1", "first")));
    // Poll the first call until it is held, then ask again with the same token.
    tokio::select! {
        _ = &mut held_call => panic!("the first call was answered"),
        () = held(&s.service, 1) => {}
    }
    let r = get_job(&s.service, call(&token, "v1", "second"))
        .await
        .unwrap();
    assert_eq!(md(&r, "x-gitlab-last-update"), "v1");
    assert_eq!(s.rails.requests(), 1, "the second call went to Rails");
    assert_eq!(s.service.metrics.holds_of(HoldOutcome::OverLimit), 1);

    // The first call's client goes: tonic drops its future.
    drop(held_call);
    assert_eq!(s.service.metrics.held(), 0);
    assert_eq!(s.service.metrics.calls_of(CallResult::ClientGone), 1);
    assert_eq!(s.service.limits.held(), 0, "its slot is free");
    assert_eq!(s.service.watch.as_ref().unwrap().waiting(), 0);
}

#[tokio::test]
async fn refusals_name_their_reason_and_never_reach_rails() {
    let s = setup(JobRouterConfig::default()).await;
    let token = runner_token();
    let code = |r: Result<Response<GetJobResponse>, Status>| r.unwrap_err().code();

    let mut not_runner = call(&token, "", "x");
    not_runner.metadata_mut().remove("gitlab-agent-type");
    assert_eq!(
        code(get_job(&s.service, not_runner).await),
        Code::Unauthenticated
    );

    let mut no_token = call(&token, "", "x");
    no_token.metadata_mut().remove("authorization");
    assert_eq!(
        code(get_job(&s.service, no_token).await),
        Code::Unauthenticated
    );

    // One character changed: the routable token's CRC fails.
    let mut bad = token.clone().into_bytes();
    let i = bad.len() - 3;
    bad[i] = if bad[i] == b'a' { b'b' } else { b'a' };
    let bad = String::from_utf8(bad).unwrap();
    let e = get_job(&s.service, call(&bad, "", "x")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().starts_with("invalid runner token"), "{e:?}");

    let mut other = call(&token, "", "x");
    other.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", runner_token()).parse().unwrap(),
    );
    assert_eq!(
        code(get_job(&s.service, other).await),
        Code::Unauthenticated
    );

    let mut not_json = call(&token, "", "x");
    not_json.get_mut().job_request = b"token=abc".to_vec();
    assert_eq!(
        code(get_job(&s.service, not_json).await),
        Code::InvalidArgument
    );

    assert_eq!(s.rails.requests(), 0);
    assert_eq!(s.service.metrics.calls_of(CallResult::Unauthenticated), 4);
}

#[tokio::test]
async fn off_is_unimplemented_and_rails_gone_is_unavailable() {
    let off = JobRouterService::new(
        Some(JobRouterConfig {
            enabled: false,
            ..JobRouterConfig::default()
        }),
        Some(Arc::new(GitlabClient::new(
            "http://127.0.0.1:1",
            vec![0; 32],
        ))),
        Arc::new(Classifier::with_keys(podgate_tokens::KeySet::new())),
        JobRouterMetrics::new(&prometheus::Registry::new()),
    );
    let token = runner_token();
    let e = get_job(&off, call(&token, "", "x")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    let s = setup(JobRouterConfig::default()).await;
    let Setup { rails, service, .. } = s;
    let addr = rails.addr;
    drop(rails);
    // Nothing listens at Rails' address any more.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let e = get_job(&service, call(&token, "", "x")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
}

#[tokio::test]
async fn shutdown_answers_held_calls_empty() {
    let s = setup(JobRouterConfig::default()).await;
    let token = runner_token();
    tick(&s.redis, &s.rails, &token, "v1").await;
    let (r, ()) = tokio::join!(get_job(&s.service, call(&token, "v1", "z")), async {
        held(&s.service, 1).await;
        s.service.shutdown();
    });
    let r = r.unwrap();
    assert!(r.get_ref().job_response.is_empty());
    assert_eq!(md(&r, "x-gitlab-last-update"), "v1");
    assert_eq!(s.rails.requests(), 0);
}

#[test]
fn holds_end_a_margin_before_the_calls_deadline() {
    let hold = Duration::from_secs(50);
    assert_eq!(parse_grpc_timeout("30S"), Some(Duration::from_secs(30)));
    assert_eq!(
        parse_grpc_timeout("1500m"),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
    assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
    assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
    assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
    for bad in ["", "S", "123456789S", "-1S", "10s", "1.5S", "10"] {
        assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
    }
    assert_eq!(hold_for(hold, None), hold);
    assert_eq!(hold_for(hold, Some("nonsense")), hold);
    assert_eq!(hold_for(hold, Some("120S")), hold);
    assert_eq!(hold_for(hold, Some("30S")), Duration::from_secs(29));
    assert_eq!(hold_for(hold, Some("900m")), Duration::ZERO);
}
