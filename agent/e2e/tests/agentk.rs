//! agentk as a library against the in-process Kubernetes API server and an
//! in-process kas: pods listed with kube-rs and returned to GitLab through a reverse
//! tunnel, over h2c and over a WebSocket; its observability endpoints; a refused
//! token; and kas's `agent_info` backend for opaque tokens, with its caches.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use podgate_agent::auth::mint_external;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::ConfigurationRequest;
use podgate_agent::proto::gitlab::agent::agent_configuration::rpc::agent_configuration_client::AgentConfigurationClient;
use podgate_agent::proto::kas_api_client::KasApiClient;
use podgate_agent::proto::{ConnectedAgentsByIdRequest, GetPodsRequest};
use podgate_agentk::{Agentk, AgentkConfig};
use podgate_kas::Kas;
use podgate_kas::agent_auth::AgentInfoConfig;
use podgate_testkit::fixtures::{
    EXTERNAL_SECRET as EXTERNAL, agent_tokens, bearer, channel, http_get, kas_config,
    memory_registry, pod_names,
};
use podgate_testkit::kube::KubeTestServer;
use serde_json::json;
use tonic::Code;

async fn start_kas(keys: podgate_tokens::KeySet, agent_info: Option<AgentInfoConfig>) -> Kas {
    let registry = memory_registry().await;
    let mut config = kas_config(keys, std::time::Duration::from_secs(10));
    config.agent_info = agent_info;
    Kas::start(config, registry).await.unwrap()
}

fn agentk_config(kas_url: String, token: String, kubeconfig: &std::path::Path) -> AgentkConfig {
    AgentkConfig {
        kas_url,
        token,
        pod_namespace: "gitlab-agent".into(),
        pod_name: "agentk-0".into(),
        idle_tunnels: 2,
        max_busy_tunnels: 10,
        observability_listen: Some("127.0.0.1:0".parse().unwrap()),
        kubeconfig: Some(kubeconfig.to_owned()),
        ca_file: None,
        graph_sync_timeout: std::time::Duration::from_secs(30),
    }
}

fn pod(ns: &str, name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentk_lists_pods_with_kube_rs_over_h2c_and_over_a_websocket() {
    let kube = KubeTestServer::start(100).await.unwrap();
    for (ns, name) in [
        ("default", "web-1"),
        ("default", "web-2"),
        ("kube-system", "coredns"),
    ] {
        kube.put("pods", ns, pod(ns, name));
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();

    let (keys, mint) = agent_tokens();
    let kas = start_kas(keys, None).await;
    let h2c = Agentk::start(agentk_config(
        format!("grpc://{}", kas.agent_addr()),
        mint(Some(3)),
        &kubeconfig,
    ))
    .await
    .unwrap();
    let ws = Agentk::start(agentk_config(
        format!("ws://{}/-/kubernetes-agent/", kas.agent_addr()),
        mint(Some(4)),
        &kubeconfig,
    ))
    .await
    .unwrap();
    let (s3, s4) = (h2c.connected().await, ws.connected().await);
    assert_eq!((s3.agent_id, s4.agent_id), (3, 4));
    kas.tunnels()
        .wait_idle(3, s3.connection_id.unwrap(), 2)
        .await;
    kas.tunnels()
        .wait_idle(4, s4.connection_id.unwrap(), 2)
        .await;

    let gitlab = mint_external(&EXTERNAL, "gitlab", 60).unwrap();
    let ext = channel(kas.external_addr()).await;
    let mut api = KasApiClient::new(ext);
    let get_pods = |agent_id: i64, namespace: &str| {
        bearer(
            tonic::Request::new(GetPodsRequest {
                agent_id,
                connection_id: 0,
                namespace: namespace.into(),
            }),
            &gitlab,
        )
    };
    for (agent, status) in [(3, s3), (4, s4)] {
        let resp = api
            .get_pods(get_pods(agent, ""))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(Some(resp.connection_id), status.connection_id);
        assert_eq!(
            pod_names(&resp),
            ["default/web-1", "default/web-2", "kube-system/coredns"],
            "agent {agent}"
        );
        let resp = api
            .get_pods(get_pods(agent, "kube-system"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.pods.len(), 1);
        assert_eq!(resp.pods[0].name, "coredns");
    }
    // A pod created now is listed on the next call: agentk asks the API each time.
    kube.put("pods", "default", pod("default", "web-3"));
    let resp = api
        .get_pods(get_pods(4, "default"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.pods.len(), 3);

    // Presence carries what agentk reported.
    let by_id = api
        .connected_agents_by_id(bearer(
            tonic::Request::new(ConnectedAgentsByIdRequest { agent_id: 4 }),
            &gitlab,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id.agents.len(), 1);
    assert_eq!(by_id.agents[0].pod_name, "agentk-0");
    assert_eq!(by_id.agents[0].pod_namespace, "gitlab-agent");

    // agentk's observability listener.
    let obs = ws.observability_addr().unwrap();
    assert_eq!(http_get(obs, "/healthz").await.0, 200);
    assert_eq!(http_get(obs, "/readyz").await.0, 200);
    let (_, metrics) = http_get(obs, "/metrics").await;
    assert!(metrics.contains("podgate_agentk_connected 1"), "{metrics}");
    assert!(
        metrics.contains("podgate_agentk_requests_total{code=\"Ok\",method=\"GetPods\"} 3"),
        "{metrics}"
    );

    // The Kubernetes API gone: GitLab gets Unavailable, not a hang or an empty list.
    kube.stop().await;
    let e = api.get_pods(get_pods(3, "")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agentk_whose_token_is_refused_is_not_ready_and_keeps_trying() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let kube = KubeTestServer::start(10).await.unwrap();
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let (keys, _) = agent_tokens();
    // Signed by a key this kas does not trust.
    let (_, stranger) = agent_tokens();
    let kas = start_kas(keys, None).await;
    let agentk = Agentk::start(agentk_config(
        format!("grpc://{}", kas.agent_addr()),
        stranger(Some(3)),
        &kubeconfig,
    ))
    .await
    .unwrap();
    let status = agentk
        .wait_for(|s| s.last_error.is_some() && s.attempts >= 2)
        .await;
    assert_eq!(status.last_error, Some(Code::Unauthenticated));
    assert_eq!(status.connection_id, None);
    let obs = agentk.observability_addr().unwrap();
    let (code, body) = http_get(obs, "/readyz").await;
    assert_eq!(code, 503);
    assert!(body.contains("not connected to kas"), "{body}");
    assert_eq!(http_get(obs, "/healthz").await.0, 200);
    let (_, metrics) = http_get(obs, "/metrics").await;
    assert!(
        metrics.contains("podgate_agentk_connects_total{result=\"unauthenticated\"}"),
        "{metrics}"
    );
    // A bad kas URL is a configuration error naming the field.
    let mut bad = agentk_config("ftp://kas".into(), "t".into(), &kubeconfig);
    bad.idle_tunnels = 1;
    bad.ca_file = Some("/nonexistent/ca.pem".into());
    let err = bad.validate().unwrap_err().to_string();
    for field in ["kas: ", "idle_tunnels", "ca_file"] {
        assert!(err.contains(field), "{field}: {err}");
    }
    // A kubeconfig that cannot be read is named, with the reason kept as the
    // error's source.
    let missing = std::path::PathBuf::from("/nonexistent/kubeconfig");
    let err = match Agentk::start(agentk_config(
        "grpc://127.0.0.1:1".into(),
        "t".into(),
        &missing,
    ))
    .await
    {
        Err(e) => e,
        Ok(_) => panic!("started without a kubeconfig"),
    };
    assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
}

/// GitLab's `agent_info` answer for agent 7 of project 70, shaped as Rails'
/// `lib/api/internal/kubernetes.rb` sends it (gitlabhq/gitlabhq).
const AGENT_INFO: &str = r#"{"project_id":70,"agent_id":7,"agent_name":"prod","gitaly_info":{"address":"unix:/var/opt/gitlab/gitaly/gitaly.socket","token":"","features":{}},"gitaly_repository":{"storage_name":"default","relative_path":"@hashed/aa/bb/aabb.git","gl_repository":"project-70","gl_project_path":"group/agents"},"default_branch":"main"}"#;

/// A stub of GitLab's `GET /api/v4/internal/kubernetes/agent_info`: 200 for
/// `glagent-good…`, 401 for `glagent-bad…`, 500 for anything else; counts calls and
/// checks kas's `Gitlab-Kas-Api-Request` JWT.
async fn gitlab_stub(calls: Arc<AtomicUsize>) -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let calls = calls.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let calls = calls.clone();
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(req.uri().path(), "/api/v4/internal/kubernetes/agent_info");
                        let api_jwt = req.headers()["gitlab-kas-api-request"].to_str().unwrap();
                        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
                        v.set_issuer(&["gitlab-kas"]);
                        v.set_audience(&["gitlab"]);
                        jsonwebtoken::decode::<serde_json::Value>(
                            api_jwt,
                            &jsonwebtoken::DecodingKey::from_secret(&EXTERNAL),
                            &v,
                        )
                        .expect("kas signs its API requests with the shared secret");
                        let auth = req.headers()["authorization"].to_str().unwrap();
                        let (status, body) = if auth.starts_with("Bearer glagent-good") {
                            (200, AGENT_INFO)
                        } else if auth.starts_with("Bearer glagent-bad") {
                            (401, r#"{"message":"401 Unauthorized"}"#)
                        } else {
                            (500, "oops")
                        };
                        let mut r = hyper::Response::new(Full::new(bytes::Bytes::from(body)));
                        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_agent_tokens_are_asked_of_gitlab_and_the_answers_cached() {
    let calls = Arc::new(AtomicUsize::new(0));
    let gitlab = gitlab_stub(calls.clone()).await;
    let (keys, _) = agent_tokens();
    let (_, stranger) = agent_tokens();
    let kas = start_kas(
        keys,
        Some(AgentInfoConfig {
            url: format!("http://{gitlab}"),
            secret: EXTERNAL.to_vec(),
            positive_ttl: std::time::Duration::from_secs(300),
            negative_ttl: std::time::Duration::from_secs(60),
            timeout: std::time::Duration::from_secs(5),
        }),
    )
    .await;
    let channel = channel(kas.agent_addr()).await;
    let connect = |token: String| {
        let channel = channel.clone();
        async move {
            let req = bearer(tonic::Request::new(ConfigurationRequest::default()), &token);
            let mut stream = AgentConfigurationClient::new(channel)
                .get_configuration(req)
                .await?
                .into_inner();
            Ok::<_, tonic::Status>(stream.message().await?.unwrap())
        }
    };
    let good = "glagent-good-0123456789abcdefghij".to_owned();
    let bad = "glagent-bad-0123456789abcdefghijk".to_owned();
    // Yes: the identity GitLab gave; asked once, then cached.
    for _ in 0..3 {
        let cfg = connect(good.clone()).await.unwrap();
        let cfg = cfg.configuration.unwrap();
        assert_eq!((cfg.agent_id, cfg.project_id), (7, 70));
        assert_eq!(cfg.project_path, "group/agents");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // No: Unauthenticated with no detail; asked once, then cached.
    for _ in 0..3 {
        let e = connect(bad.clone()).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        assert_eq!(e.message(), "unauthenticated");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // GitLab failing is not a no: Unavailable, and asked again next time.
    for n in 3..=4 {
        let e = connect("glagent-other-0123456789abcdefghi".into())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), n);
    }
    // A signed token that fails verification is refused without asking GitLab.
    let e = connect(stranger(Some(3))).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let metrics = kas.metrics().render();
    for line in [
        "podgate_kas_agent_info_lookups_total{result=\"cached_yes\"} 2",
        "podgate_kas_agent_info_lookups_total{result=\"cached_no\"} 2",
        "podgate_kas_agent_info_lookups_total{result=\"error\"} 2",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
}

/// Concurrent callers with the same uncached opaque token share one `agent_info`
/// call: GitLab's answer is held back until every other caller is waiting for it,
/// and it is asked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_of_one_token_ask_gitlab_once() {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use podgate_kas::agent_auth::AgentAuth;
    let calls = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gitlab = listener.local_addr().unwrap();
    let (c, r) = (calls.clone(), release.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (calls, release) = (c.clone(), r.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                    let (calls, release) = (calls.clone(), release.clone());
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        release.acquire().await.unwrap().forget();
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            bytes::Bytes::from(r#"{"agent_id":7,"project_id":70}"#),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let metrics = prometheus::Registry::new();
    let auth = Arc::new(AgentAuth::new(
        Arc::new(podgate_tokens::Classifier::with_keys(
            podgate_tokens::KeySet::new(),
        )),
        Some(AgentInfoConfig {
            url: format!("http://{gitlab}"),
            secret: EXTERNAL.to_vec(),
            positive_ttl: std::time::Duration::from_secs(300),
            negative_ttl: std::time::Duration::from_secs(60),
            timeout: std::time::Duration::from_secs(30),
        }),
        &metrics,
    ));
    let count = |result: &str| {
        metrics
            .gather()
            .iter()
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| m.get_label().iter().any(|l| l.value() == result))
            .map(|m| m.get_counter().get_value() as u64)
            .sum::<u64>()
    };
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let auth = auth.clone();
            tokio::spawn(async move {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert(
                    "authorization",
                    "Bearer glagent-shared-0123456789abcdefgh".parse().unwrap(),
                );
                auth.authenticate(&md).await
            })
        })
        .collect();
    podgate_registry::testing::eventually(
        std::time::Duration::from_secs(20),
        "the first lookup to reach GitLab",
        || async { (calls.load(Ordering::SeqCst) >= 1).then_some(()) },
    )
    .await;
    // Let the other callers arrive while GitLab holds its answer.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    release.add_permits(1000);
    for c in callers {
        let who = c.await.unwrap().unwrap();
        assert_eq!((who.agent_id, who.project_id), (7, 70));
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "GitLab was asked more than once"
    );
    assert_eq!(count("yes"), 1);
    // Those that came while it was asked waited for it; any later read the cache.
    assert_eq!(count("joined") + count("cached_yes"), 19);
}
