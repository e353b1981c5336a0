//! kas's Kubernetes API proxy in front of a real Pod simulator (GitLab's internal API:
//! `authorize_proxy_user`, `job/allowed_agents`) and a real agentk, whose cluster is
//! a capturing HTTP server that records what reaches it: docs/graph-api.md §12 items 3–7
//! (every 401 with `Gitlab-Unauthorized: true` and a `Status` body, the cookie with
//! query parameters or headers, the Origin check, stripped credentials), the other
//! refusals of §2, GitLab's answers cached (counted at the Pod simulator), CORS, and
//! the impersonation of a user. Requests are sent with hyper's HTTP client.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use podgate_agentk::{Agentk, AgentkConfig};
use podgate_kas::Kas;
use podgate_kas::k8s_proxy::K8sProxyConfig;
use podgate_loadtest::pod_sim::kubernetes::{PathRef, UserAccessConfig};
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig, sum_samples};
use podgate_testkit::fixtures::{EXTERNAL_SECRET, agent_tokens, kas_config, memory_registry};
use podgate_testkit::workspaces::agentk_config;
use podgate_tokens::PodId;
use serde_json::{Value, json};

const ORIGIN: &str = "https://gitlab.example.com";

/// What reached the cluster.
#[derive(Clone, Debug)]
struct Seen {
    uri: String,
    headers: HeaderMap,
}

/// An HTTP server standing in for the cluster's API server: records every request but
/// agentk's own `/version`, answers an empty `PodList` with CORS headers of its own
/// (kas must drop them).
async fn capturing_upstream() -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: Request<hyper::body::Incoming>| {
                        // agentk's own read of the cluster's version (before each
                        // `Register`) is not a request kas proxied.
                        if req.uri().path() != "/version" {
                            record.lock().unwrap().push(Seen {
                                uri: req.uri().to_string(),
                                headers: req.headers().clone(),
                            });
                        }
                        async move {
                            let body = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []});
                            let resp = http::Response::builder()
                                .header("content-type", "application/json")
                                .header("access-control-allow-origin", "*")
                                .header("vary", "Accept")
                                .body(Full::new(Bytes::from(body.to_string())))
                                .unwrap();
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

struct Stack {
    sim: PodSim,
    kas: Kas,
    _agentk: Agentk,
    upstream: Arc<Mutex<Vec<Seen>>>,
    client: Client<HttpConnector, Full<Bytes>>,
    _dir: tempfile::TempDir,
}

/// Pod 1's simulator with agents 1 (user access as the user, for the project), 2
/// (user access as the agent, for the group) and 3 (no user access); kas with the
/// proxy asking that simulator; agentk for agent 1 whose cluster is the capturing
/// upstream.
async fn stack() -> Stack {
    stack_with(None).await
}

/// [`stack`], agentk's cluster at `cluster_url` when given.
async fn stack_with(cluster_url: Option<String>) -> Stack {
    let pod = PodId::new(1).unwrap();
    let mut as_agent = AgentSpec::with_user_access(2, pod);
    as_agent.user_access = Some(UserAccessConfig {
        access_as: Some([("agent".to_owned(), json!({}))].into_iter().collect()),
        projects: Vec::new(),
        groups: vec![PathRef { id: "group".into() }],
    });
    let no_user_access = AgentSpec {
        id: 3,
        name: "agent-3".into(),
        user_access: None,
        ci_access: None,
    };
    let mut sim_config = PodSimConfig::new(pod, "127.0.0.1:0".parse().unwrap());
    sim_config.kas_secret = Some(EXTERNAL_SECRET.to_vec());
    sim_config.agents = vec![
        AgentSpec::with_user_access(1, pod),
        as_agent,
        no_user_access,
    ];
    let sim = PodSim::start(sim_config).await.unwrap();

    let (keys, mint) = agent_tokens();
    let mut config = kas_config(keys, Duration::from_secs(5));
    let mut proxy = K8sProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        &format!("http://{}", sim.addr()),
    );
    proxy.allowed_origins = vec![ORIGIN.into()];
    config.k8s_proxy = Some(proxy);
    let kas = Kas::start(config, memory_registry().await).await.unwrap();

    let (upstream_addr, upstream) = capturing_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        podgate_kube_sim::kubeconfig(
            &cluster_url.unwrap_or_else(|| format!("http://{upstream_addr}")),
        ),
    )
    .unwrap();
    let agentk = Agentk::start(AgentkConfig {
        pod_namespace: "gitlab-agent".into(),
        ..agentk_config(&kas, mint(Some(1)), Some(kubeconfig))
    })
    .await
    .unwrap();
    Stack {
        sim,
        kas,
        _agentk: agentk,
        upstream,
        client: Client::builder(TokioExecutor::new()).build_http(),
        _dir: dir,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// A kas `Status` with `code`, whose message is `GitLab Agent Server: <msg>…`;
    /// `Gitlab-Unauthorized: true` exactly on a 401.
    #[track_caller]
    fn assert_status(&self, code: u16, msg: &str) {
        assert_eq!(
            self.status.as_u16(),
            code,
            "{:?}",
            String::from_utf8_lossy(&self.body)
        );
        let v = self.json();
        assert_eq!(v["kind"], "Status", "{v}");
        assert_eq!(v["apiVersion"], "v1", "{v}");
        assert_eq!(v["status"], "Failure", "{v}");
        assert_eq!(v["code"], code, "{v}");
        let message = v["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("GitLab Agent Server: {msg}")),
            "{message:?} should start with {msg:?}"
        );
        let reason = match code {
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            400 => "BadRequest",
            500 => "InternalError",
            _ => "",
        };
        assert_eq!(v["reason"], reason, "{v}");
        let unauthorized = self.headers.get("gitlab-unauthorized");
        if code == 401 {
            assert_eq!(unauthorized.unwrap(), "true");
        } else {
            assert!(unauthorized.is_none(), "{:?}", self.headers);
        }
    }
}

impl Stack {
    fn proxy(&self) -> SocketAddr {
        self.kas.k8s_proxy_addr().expect("the proxy listens")
    }

    async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.proxy()));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::new())).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        self.send(Method::GET, path, headers).await
    }

    /// GitLab calls the Pod simulator answered, by endpoint.
    fn gitlab_calls(&self, endpoint: &str) -> u64 {
        sum_samples(
            &self.sim.metrics().render(),
            "podsim_requests_total{",
            |l| l.contains(&format!("endpoint=\"{endpoint}\"")),
        )
    }

    fn upstream(&self) -> Vec<Seen> {
        self.upstream.lock().unwrap().clone()
    }

    fn pat(&self, scopes: &[&str]) -> String {
        self.sim
            .create_personal_access_token("root", scopes)
            .unwrap()
    }

    /// A running job's token (a runner registered and picked it).
    fn running_job_token(&self) -> String {
        self.sim.enqueue().unwrap();
        let (runner, _) = self.sim.state().register().unwrap();
        match self.sim.state().pick(runner) {
            podgate_loadtest::pod_sim::state::Pick::Job(job) => job.token,
            other => panic!("no job to pick: {other:?}"),
        }
    }
}

const PODS: &str = "/k8s-proxy/api/v1/namespaces/default/pods";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_a_status_and_every_401_says_gitlab_unauthorized() {
    let s = stack().await;
    // §12.3: no credentials.
    s.get(PODS, &[])
        .await
        .assert_status(401, "Unauthorized: no valid credentials provided");
    // §12.4: malformed bearer values, two Authorization headers.
    for (value, why) in [
        (
            "Bearer pat:abc:tok",
            "Unauthorized: Authorization header: failed to parse",
        ),
        (
            "Bearer xyz:1:tok",
            "Unauthorized: Authorization header: unknown token type",
        ),
        (
            "Bearer pat:1:",
            "Unauthorized: Authorization header: empty token",
        ),
        (
            "Bearer pat1tok",
            "Unauthorized: Authorization header: invalid value",
        ),
        (
            "Basic cm9vdDpwYXNz",
            "Unauthorized: Authorization header: expecting Bearer token",
        ),
    ] {
        s.get(PODS, &[("authorization", value)])
            .await
            .assert_status(401, why);
    }
    let pat = s.pat(&["k8s_proxy"]);
    let bearer = format!("Bearer pat:1:{pat}");
    s.get(
        PODS,
        &[("authorization", &bearer), ("authorization", &bearer)],
    )
    .await
    .assert_status(
        401,
        "Unauthorized: Authorization header: expecting a single header, got 2",
    );
    // §12.5: the cookie with two Gitlab-Agent-Id headers; without an agent id; without
    // a CSRF token; with an empty value.
    s.get(
        PODS,
        &[
            ("cookie", "_gitlab_kas=s"),
            ("gitlab-agent-id", "1"),
            ("gitlab-agent-id", "1"),
            ("x-csrf-token", "c"),
        ],
    )
    .await
    .assert_status(
        401,
        "Unauthorized: Gitlab-Agent-Id header must have exactly one value",
    );
    s.get(PODS, &[("cookie", "_gitlab_kas=s"), ("x-csrf-token", "c")])
        .await
        .assert_status(401, "Unauthorized: exactly one agent id must be provided");
    s.get(
        &format!("{PODS}?gitlab-agent-id=1"),
        &[("cookie", "_gitlab_kas=s")],
    )
    .await
    .assert_status(401, "Unauthorized: exactly one CSRF token must be provided");
    s.get(PODS, &[("cookie", "_gitlab_kas=")])
        .await
        .assert_status(
            401,
            "Unauthorized: _gitlab_kas cookie value must not be empty",
        );
    // GitLab's refusals: an unknown session, a wrong CSRF token, a PAT without the
    // k8s_proxy scope, an agent that does not exist, one without user_access: 401.
    let session: Value = serde_json::from_slice(
        &post_json(&s, "/-/podsim/sessions", json!({"username": "root"})).await,
    )
    .unwrap();
    let cookie = session["cookie"].as_str().unwrap();
    s.get(
        &format!("{PODS}?gitlab-agent-id=1&gitlab-csrf-token=wrong"),
        &[("cookie", cookie)],
    )
    .await
    .assert_status(401, "Unauthorized");
    s.get(
        &format!("{PODS}?gitlab-agent-id=1&gitlab-csrf-token=c"),
        &[("cookie", "_gitlab_kas=nosuchsession")],
    )
    .await
    .assert_status(401, "Unauthorized");
    let no_scope = s.pat(&["read_api"]);
    s.get(
        PODS,
        &[("authorization", &format!("Bearer pat:1:{no_scope}"))],
    )
    .await
    .assert_status(401, "Unauthorized");
    s.get(PODS, &[("authorization", &format!("Bearer pat:99:{pat}"))])
        .await
        .assert_status(401, "Unauthorized");
    s.get(PODS, &[("authorization", &format!("Bearer pat:3:{pat}"))])
        .await
        .assert_status(401, "Unauthorized");
    // Rails answers an unknown PAT with 400 ("Unable to get user from request
    // data"): kas's "any other failure".
    s.get(PODS, &[("authorization", "Bearer pat:1:glpat-not-a-token")])
        .await
        .assert_status(500, "Failed to authorize user session");
    // CI job tokens: unknown → 401; a finished job's → 401; an agent the job may not
    // use → 403.
    s.get(PODS, &[("authorization", "Bearer ci:1:glcbt-unknown")])
        .await
        .assert_status(401, "Unauthorized: CI job token");
    let job = s.running_job_token();
    s.get(PODS, &[("authorization", &format!("Bearer ci:999:{job}"))])
        .await
        .assert_status(403, "Forbidden: agentId is not allowed");
    // The prefix.
    s.get("/api/v1/pods", &[("authorization", &bearer)])
        .await
        .assert_status(400, "Bad request: URL does not start with expected prefix");
    // §12.6: an Origin not allowed → 403 before anything else, even an upgrade.
    let refused = s
        .get(
            "/k8s-proxy/graph",
            &[
                ("origin", "https://evil.example.com"),
                ("authorization", &bearer),
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("sec-websocket-protocol", "gitlab-agent-graph-api"),
            ],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.is_empty());
    assert!(refused.headers.get("access-control-allow-origin").is_none());
    // Nothing of it reached the cluster.
    assert!(s.upstream().is_empty(), "{:?}", s.upstream());
}

async fn post_json(s: &Stack, path: &str, body: Value) -> Bytes {
    let req = Request::post(format!("http://{}{path}", s.sim.addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = s.client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    resp.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_stripped_and_the_user_impersonated() {
    let s = stack().await;
    let session: Value = serde_json::from_slice(
        &post_json(&s, "/-/podsim/sessions", json!({"username": "root"})).await,
    )
    .unwrap();
    let (cookie, csrf) = (
        session["cookie"].as_str().unwrap(),
        session["csrf_token"].as_str().unwrap(),
    );
    // §12.5: the cookie with query parameters (the browser WebSocket form).
    let by_query = s
        .get(
            &format!("{PODS}?limit=5&gitlab-agent-id=1&gitlab-csrf-token={csrf}&watch=0"),
            &[("cookie", cookie)],
        )
        .await;
    assert_eq!(by_query.status, StatusCode::OK, "{:?}", by_query.body);
    assert_eq!(by_query.json()["kind"], "PodList");
    // The cookie with the header forms.
    let by_header = s
        .get(
            PODS,
            &[
                ("cookie", &format!("{cookie}; other=1")),
                ("gitlab-agent-id", "1"),
                ("x-csrf-token", csrf),
                ("accept", "application/json"),
            ],
        )
        .await;
    assert_eq!(by_header.status, StatusCode::OK);
    // A PAT.
    let pat = s.pat(&["k8s_proxy", "read_api"]);
    let by_pat = s
        .get(PODS, &[("authorization", &format!("Bearer pat:1:{pat}"))])
        .await;
    assert_eq!(by_pat.status, StatusCode::OK);
    assert!(
        by_pat
            .headers
            .get_all("via")
            .iter()
            .any(|v| v.to_str().unwrap().contains("podgate-kas")),
        "{:?}",
        by_pat.headers
    );

    // §12.7: none of GitLab's credentials reached the cluster.
    let seen = s.upstream();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for r in &seen {
        for h in ["authorization", "cookie", "gitlab-agent-id", "x-csrf-token"] {
            assert!(r.headers.get(h).is_none(), "{h} reached the cluster: {r:?}");
        }
        assert!(
            !r.uri.contains("gitlab-agent-id") && !r.uri.contains("gitlab-csrf-token"),
            "{}",
            r.uri
        );
        assert!(
            r.uri.starts_with("/api/v1/namespaces/default/pods"),
            "{}",
            r.uri
        );
        let via: Vec<&str> = r
            .headers
            .get_all("via")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert!(via.iter().any(|v| v.contains("podgate-kas")), "{via:?}");
        // Agent 1's user_access is as the user: root, owner of the project.
        assert_eq!(r.headers["impersonate-user"], "gitlab:user:root");
        let groups: Vec<&str> = r
            .headers
            .get_all("impersonate-group")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert!(groups.contains(&"gitlab:user"), "{groups:?}");
        assert!(
            groups.contains(&"gitlab:project_role:1001:owner"),
            "{groups:?}"
        );
    }
    assert_eq!(
        seen[0].uri,
        "/api/v1/namespaces/default/pods?limit=5&watch=0"
    );
    assert_eq!(seen[1].headers["accept"], "application/json");
    let access_type = |r: &Seen| {
        r.headers
            .get("impersonate-extra-agent.gitlab.com%2faccess_type")
            .or_else(|| {
                r.headers
                    .get("impersonate-extra-agent.gitlab.com%2Faccess_type")
            })
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        access_type(&seen[0]).as_deref(),
        Some("session_cookie"),
        "{:?}",
        seen[0].headers
    );
    assert_eq!(
        access_type(&seen[2]).as_deref(),
        Some("personal_access_token")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_answers_are_cached() {
    let s = stack().await;
    let pat = s.pat(&["k8s_proxy"]);
    let bearer = format!("Bearer pat:1:{pat}");
    assert_eq!(s.gitlab_calls("k8s_authorize_proxy_user"), 0);
    assert_eq!(
        s.get(PODS, &[("authorization", &bearer)]).await.status,
        StatusCode::OK
    );
    assert_eq!(s.gitlab_calls("k8s_authorize_proxy_user"), 1);
    assert_eq!(
        s.get(PODS, &[("authorization", &bearer)]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        s.gitlab_calls("k8s_authorize_proxy_user"),
        1,
        "the yes was not cached"
    );
    // A no is cached too.
    let no_scope = format!("Bearer pat:1:{}", s.pat(&["read_api"]));
    for _ in 0..2 {
        s.get(PODS, &[("authorization", &no_scope)])
            .await
            .assert_status(401, "Unauthorized");
    }
    assert_eq!(
        s.gitlab_calls("k8s_authorize_proxy_user"),
        2,
        "the no was not cached"
    );
    // Concurrent first requests with one new token: one GitLab call.
    let fresh = format!("Bearer pat:1:{}", s.pat(&["k8s_proxy"]));
    let headers = [("authorization", fresh.as_str())];
    let answers = futures_util::future::join_all((0..6).map(|_| s.get(PODS, &headers))).await;
    assert!(answers.iter().all(|a| a.status == StatusCode::OK));
    assert_eq!(
        s.gitlab_calls("k8s_authorize_proxy_user"),
        3,
        "concurrent misses were not coalesced"
    );
    // CI job tokens: allowed_agents once per token; the job runs as root, agent 1
    // has no ci_access entry, so the job acts as the agent (no impersonation).
    let job = format!("Bearer ci:1:{}", s.running_job_token());
    for _ in 0..2 {
        assert_eq!(
            s.get(PODS, &[("authorization", &job)]).await.status,
            StatusCode::OK
        );
    }
    assert_eq!(s.gitlab_calls("k8s_allowed_agents"), 1);
    let last = s.upstream().pop().unwrap();
    assert!(last.headers.get("impersonate-user").is_none(), "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflight_and_allowed_origins() {
    let s = stack().await;
    let pre = s
        .send(
            Method::OPTIONS,
            PODS,
            &[
                ("origin", ORIGIN),
                ("access-control-request-method", "GET"),
                (
                    "access-control-request-headers",
                    "x-csrf-token, gitlab-agent-id",
                ),
            ],
        )
        .await;
    assert_eq!(pre.status, StatusCode::OK);
    assert_eq!(pre.headers["access-control-allow-origin"], ORIGIN);
    assert_eq!(pre.headers["access-control-allow-credentials"], "true");
    assert_eq!(pre.headers["vary"], "Origin");
    assert_eq!(pre.headers["access-control-max-age"], "86400");
    assert_eq!(
        pre.headers["access-control-allow-headers"],
        "x-csrf-token, gitlab-agent-id"
    );
    assert!(
        pre.headers["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("PATCH")
    );
    // An error answer to an allowed origin carries the CORS headers too.
    let err = s.get(PODS, &[("origin", ORIGIN)]).await;
    err.assert_status(401, "Unauthorized");
    assert_eq!(err.headers["access-control-allow-origin"], ORIGIN);
    // A proxied answer: kas's CORS headers, not the cluster's; Vary merged.
    let pat = s.pat(&["k8s_proxy"]);
    let ok = s
        .get(
            PODS,
            &[
                ("origin", ORIGIN),
                ("authorization", &format!("Bearer pat:1:{pat}")),
            ],
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    let origins: Vec<_> = ok
        .headers
        .get_all("access-control-allow-origin")
        .iter()
        .collect();
    assert_eq!(origins, [ORIGIN]);
    assert_eq!(ok.headers["access-control-allow-credentials"], "true");
    let vary: Vec<_> = ok
        .headers
        .get_all("vary")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(
        vary.contains(&"Origin") && vary.contains(&"Accept"),
        "{vary:?}"
    );
    // No Origin: no CORS headers.
    let plain = s.get(PODS, &[]).await;
    assert!(plain.headers.get("access-control-allow-origin").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_never_connects_is_a_bad_gateway() {
    let s = stack().await;
    // Agent 2 authorises root (as the agent) but has no agentk: the router gives up
    // after kas's max_wait.
    let pat = s.pat(&["k8s_proxy"]);
    let a = s
        .get(PODS, &[("authorization", &format!("Bearer pat:2:{pat}"))])
        .await;
    a.assert_status(
        502,
        "HTTP->gRPC: failed to read gRPC response: rpc error: code = DeadlineExceeded",
    );
    assert_eq!(s.gitlab_calls("k8s_authorize_proxy_user"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_streams_events_while_the_client_keeps_it_open() {
    let kube = podgate_testkit::kube::KubeTestServer::start(100)
        .await
        .unwrap();
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    };
    kube.put("pods", "default", pod("web-1"));
    let s = stack_with(Some(kube.url())).await;
    let pat = s.pat(&["k8s_proxy"]);
    let rv = kube.resource_version();
    let req = Request::get(format!(
        "http://{}{PODS}?watch=1&resourceVersion={rv}",
        s.proxy()
    ))
    .header("authorization", format!("Bearer pat:1:{pat}"))
    .body(Full::new(Bytes::new()))
    .unwrap();
    let resp = s.client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    // The header came before any event: the watch is open. An object created now
    // arrives as an event on the same response.
    kube.put("pods", "default", pod("web-2"));
    let mut seen = String::new();
    while !seen.contains("web-2") {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the event arrives while the watch is open")
            .expect("the watch is still open")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    assert!(seen.contains("\"ADDED\""), "{seen}");
    // kube-sim served it as the user GitLab named.
    let watch = kube
        .sim()
        .audit()
        .into_iter()
        .find(|e| e.verb == "watch")
        .expect("a watch reached the cluster");
    assert_eq!(watch.user.as_deref(), Some("gitlab:user:root"));
    assert!(
        watch
            .groups
            .contains(&"gitlab:project_role:1001:owner".to_owned())
    );
    assert_eq!(
        watch.extra.get("agent.gitlab.com/access_type"),
        Some(&vec!["personal_access_token".to_owned()])
    );
}

/// A cluster whose every answer is a stream the test feeds: each request's sender
/// comes out of the returned channel (but `/version`'s, which ends at once).
async fn streaming_upstream() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<tokio::sync::mpsc::Sender<Bytes>>,
) {
    let (senders, streams) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let senders = senders.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
                        // agentk's own read of the cluster's version (before each
                        // `Register`) is answered at once, an empty stream.
                        if req.uri().path() != "/version" {
                            let _ = senders.send(tx);
                        }
                        let body = http_body_util::StreamBody::new(futures_util::StreamExt::map(
                            tokio_stream::wrappers::ReceiverStream::new(rx),
                            |b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)),
                        ));
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(body)
                                    .unwrap(),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, streams)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_ends_the_request_at_the_cluster() {
    let (addr, mut streams) = streaming_upstream().await;
    let s = stack_with(Some(format!("http://{addr}"))).await;
    let pat = s.pat(&["k8s_proxy"]);
    let req = Request::get(format!("http://{}{PODS}?watch=1", s.proxy()))
        .header("authorization", format!("Bearer pat:1:{pat}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = s.client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let tx = streams.recv().await.unwrap();
    let mut body = resp.into_body();
    tx.send(Bytes::from_static(b"{\"type\":\"ADDED\"}\n"))
        .await
        .unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "{\"type\":\"ADDED\"}\n");
    drop(body);
    // The cluster keeps sending; its stream is dropped once the cancellation has
    // travelled kas → agentk → the API server connection.
    let keep_sending = async {
        loop {
            if tx.send(Bytes::from_static(b"{}\n")).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        tokio::select! {
            _ = tx.closed() => {}
            _ = keep_sending => {}
        }
    })
    .await
    .expect("the request ended at the cluster");
}
