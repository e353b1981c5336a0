//! The GitLab-shaped peers against each other: GitLab's agentk and kas as written
//! from GitLab's source agree on the wire (configuration, registration, tunnels,
//! `MakeRequest`, gzip, tokens), and the Rails client's JWT is what Rails signs.
//! This proves the test pieces before they are pointed at podgate's kas and agentk.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::agentk::{self, Config, Event, Transport};
use super::grpctool::{collect_response, request_frames};
use super::kas::{Event as KasEvent, GitlabKas};
use super::proto::gitlab::agent::agent_tracker::ConnectedAgentInfo;
use super::proto::gitlab::agent::agent_tracker::rpc::{
    GetConnectedAgentsRequest, GetConnectedAgentsResponse,
    agent_tracker_server::{AgentTracker, AgentTrackerServer},
    get_connected_agents_request::Request,
};
use super::proto::gitlab::agent::agentcfg::{AgentConfiguration, FluxCf};
use super::proto::gitlab::agent::notifications::rpc::{
    GitPushEventRequest, GitPushEventResponse,
    notifications_server::{Notifications, NotificationsServer},
};
use super::rails::RailsClient;

const TOKEN: &str = "glagent-test-token-0123456789";

fn config(flux_url: &str) -> AgentConfiguration {
    AgentConfiguration {
        agent_id: 42,
        project_id: 7,
        project_path: "group/agents".into(),
        flux: Some(FluxCf {
            webhook_receiver_url: flux_url.into(),
        }),
        ..AgentConfiguration::default()
    }
}

/// A stand-in Kubernetes API: answers every request with JSON naming its method,
/// path, query and body.
async fn kube_api() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let method = req.method().to_string();
                    let uri = req.uri().to_string();
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let json = serde_json::json!({
                        "method": method,
                        "uri": uri,
                        "body": String::from_utf8_lossy(&body),
                    });
                    let resp = hyper::Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(json.to_string())))
                        .expect("response");
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn agentk_gets_configuration_registers_and_serves_make_request() {
    let kube = kube_api().await;
    let mut kas = GitlabKas::start(TOKEN, "commit-1", config("http://flux/1"))
        .await
        .expect("kas");
    let mut cfg = Config::new(&kas.addr.to_string(), TOKEN, &format!("http://{kube}"));
    cfg.tunnels = 2;
    let mut agent = agentk::start(cfg).expect("agentk");

    let (commit, flux) = agent
        .wait_for(|e| match e {
            Event::Configuration { commit_id, config } => {
                Some((commit_id, config.flux.unwrap_or_default()))
            }
            _ => None,
        })
        .await;
    assert_eq!(commit, "commit-1");
    assert_eq!(flux.webhook_receiver_url, "http://flux/1");

    // kas saw GitLab 16.5 agentk's request and registration, and two tunnels.
    let mut requested = None;
    let mut registered = None;
    let mut tunnels = 0;
    while requested.is_none() || registered.is_none() || tunnels < 2 {
        match kas.next().await {
            KasEvent::ConfigurationRequested(r) => requested = Some(r),
            KasEvent::Registered(r) => registered = Some(r),
            KasEvent::Tunnel(d) => {
                assert!(
                    super::kas::supports(&d, agentk::KUBERNETES_API, "MakeRequest"),
                    "{d:?}"
                );
                tunnels += 1;
            }
        }
    }
    let requested = requested.unwrap();
    assert!(requested.skip_register);
    assert_eq!(requested.commit_id, "");
    assert_eq!(requested.agent_meta.expect("agent_meta").version, "v16.5.0");
    let registered = registered.unwrap();
    assert_eq!(registered.pod_id, 0x5eed_0001);

    let frames = request_frames(
        "POST",
        "/api/v1/namespaces",
        &[("Content-Type", "application/json")],
        None,
        b"{\"x\":1}",
    );
    let resp =
        collect_response(&kas.make_request(&frames).await.expect("MakeRequest")).expect("frames");
    assert_eq!(resp.status, 200);
    let body: serde_json::Value = serde_json::from_slice(&resp.body).expect("json");
    assert_eq!(body["method"], "POST");
    assert_eq!(body["uri"], "/api/v1/namespaces");
    assert_eq!(body["body"], "{\"x\":1}");
    assert_eq!(resp.headers["content-type"].value, ["application/json"]);
    let served = agent
        .wait_for(|e| {
            if let Event::Served { method, error } = e {
                Some((method, error))
            } else {
                None
            }
        })
        .await;
    assert_eq!(served, (agentk::MAKE_REQUEST.to_owned(), None));

    // A new commit reaches the open stream; every call was gzip-compressed.
    kas.set_configuration("commit-2", config("http://flux/2"));
    let commit = agent
        .wait_for(|e| {
            if let Event::Configuration { commit_id, .. } = e {
                Some(commit_id)
            } else {
                None
            }
        })
        .await;
    assert_eq!(commit, "commit-2");
    let encodings = kas.encodings();
    assert!(encodings.len() >= 4, "{encodings:?}");
    assert!(encodings.iter().all(|e| e == "gzip"), "{encodings:?}");
}

#[tokio::test]
async fn agentk_over_websocket_serves_make_request() {
    let kube = kube_api().await;
    let kas = GitlabKas::start_on(Transport::WebSocket, TOKEN, "commit-ws", config(""))
        .await
        .expect("kas");
    let mut cfg = Config::new(&kas.addr.to_string(), TOKEN, &format!("http://{kube}"));
    cfg.transport = Transport::WebSocket;
    cfg.tunnels = 1;
    let mut agent = agentk::start(cfg).expect("agentk");
    let commit = agent
        .wait_for(|e| {
            if let Event::Configuration { commit_id, .. } = e {
                Some(commit_id)
            } else {
                None
            }
        })
        .await;
    assert_eq!(commit, "commit-ws");
    let frames = request_frames("GET", "/api/v1/pods", &[], None, b"");
    let resp =
        collect_response(&kas.make_request(&frames).await.expect("MakeRequest")).expect("frames");
    assert_eq!(resp.status, 200);
    let body: serde_json::Value = serde_json::from_slice(&resp.body).expect("json");
    assert_eq!(body["uri"], "/api/v1/pods");
    assert!(kas.encodings().iter().all(|e| e == "gzip"));
}

#[tokio::test]
async fn websocket_kas_closes_a_socket_without_ws_tunnel() {
    let kas = GitlabKas::start_on(Transport::WebSocket, TOKEN, "c", config(""))
        .await
        .expect("kas");
    let (mut ws, resp) = tokio_tungstenite::connect_async(format!("ws://{}", kas.addr))
        .await
        .expect("handshake");
    assert!(resp.headers().get("sec-websocket-protocol").is_none());
    let next = futures_util::StreamExt::next(&mut ws).await;
    assert!(
        matches!(
            next,
            None | Some(Ok(tokio_tungstenite::tungstenite::Message::Close(_))) | Some(Err(_))
        ),
        "{next:?}"
    );
}

#[tokio::test]
async fn agentk_reports_an_http_failure_as_a_tunnel_error() {
    // A port nothing listens on: bind, note, drop.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let kas = GitlabKas::start(TOKEN, "c", config("")).await.expect("kas");
    let mut cfg = Config::new(&kas.addr.to_string(), TOKEN, &format!("http://{closed}"));
    cfg.tunnels = 1;
    let mut agent = agentk::start(cfg).expect("agentk");
    let frames = request_frames("GET", "/version", &[], None, b"");
    let err = kas
        .make_request(&frames)
        .await
        .expect_err("the Kubernetes API is down");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().starts_with("gRPC -> HTTP"), "{err:?}");
    let (method, error) = agent
        .wait_for(|e| {
            if let Event::Served { method, error } = e {
                Some((method, error))
            } else {
                None
            }
        })
        .await;
    assert_eq!(method, agentk::MAKE_REQUEST);
    assert_eq!(
        error.expect("an error").code,
        tonic::Code::Unavailable as i32
    );
}

#[tokio::test]
async fn kas_refuses_a_wrong_token() {
    let kas = GitlabKas::start(TOKEN, "c", config("")).await.expect("kas");
    let mut cfg = Config::new(&kas.addr.to_string(), "not-the-token", "http://127.0.0.1:1");
    cfg.tunnels = 0;
    let mut agent = agentk::start(cfg).expect("agentk");
    let (call, status) = agent
        .wait_for(|e| {
            if let Event::Failed { call, status } = e {
                Some((call, status))
            } else {
                None
            }
        })
        .await;
    assert!(["GetConfiguration", "Register"].contains(&call), "{call}");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
}

const KAS_SECRET: &[u8] = b"kas-secret-32-bytes-long-enough!";

/// An `AgentTracker` that checks the JWT as GitLab's kas checks Rails'
/// (`cmd/kas/kasapp/app_api_server.go`: HS256 with the shared secret, audience
/// `gitlab-kas`, any issuer) and answers one agent for project 7 and agent 42.
struct Tracker;

#[tonic::async_trait]
impl AgentTracker for Tracker {
    async fn get_connected_agents(
        &self,
        req: tonic::Request<GetConnectedAgentsRequest>,
    ) -> Result<tonic::Response<GetConnectedAgentsResponse>, tonic::Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let token = value.strip_prefix("bearer ").ok_or_else(|| {
            tonic::Status::unauthenticated(format!("not a lowercase bearer: {value:.10}"))
        })?;
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_audience(&["gitlab-kas"]);
        let claims = jsonwebtoken::decode::<serde_json::Value>(
            token,
            &jsonwebtoken::DecodingKey::from_secret(KAS_SECRET),
            &validation,
        )
        .map_err(|e| tonic::Status::unauthenticated(e.to_string()))?
        .claims;
        assert_eq!(claims["iss"], "gitlab.example.com");
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            60
        );
        assert_eq!(
            claims["iat"].as_u64().unwrap() - claims["nbf"].as_u64().unwrap(),
            5
        );
        assert_eq!(claims["jti"].as_str().unwrap().len(), 36);
        let agent = ConnectedAgentInfo {
            agent_id: 42,
            project_id: 7,
            connection_id: 5,
            ..Default::default()
        };
        let agents = match req.into_inner().request {
            Some(Request::ProjectId(7) | Request::AgentId(42)) => vec![agent],
            _ => vec![],
        };
        Ok(tonic::Response::new(GetConnectedAgentsResponse { agents }))
    }
}

/// Rails' `Notifications/GitPushEvent`, checked as [`Tracker`] checks.
struct Pushes(tokio::sync::mpsc::UnboundedSender<(i64, String)>);

#[tonic::async_trait]
impl Notifications for Pushes {
    async fn git_push_event(
        &self,
        req: tonic::Request<GitPushEventRequest>,
    ) -> Result<tonic::Response<GitPushEventResponse>, tonic::Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(value.starts_with("bearer "), "{value:.10}");
        let project = req
            .into_inner()
            .event
            .and_then(|e| e.project)
            .expect("a project");
        let _ = self.0.send((project.id, project.full_path));
        Ok(tonic::Response::new(GitPushEventResponse {}))
    }
}

#[tokio::test]
async fn rails_client_lists_agents_with_rails_jwt() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (pushes_tx, mut pushes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentTrackerServer::new(Tracker))
            .add_service(NotificationsServer::new(Pushes(pushes_tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let rails =
        RailsClient::new(&addr.to_string(), KAS_SECRET, "gitlab.example.com").expect("client");
    let by_project = rails
        .connected_agents_by_project(7)
        .await
        .expect("by project");
    assert_eq!(
        by_project.iter().map(|a| a.agent_id).collect::<Vec<_>>(),
        [42]
    );
    let by_agent = rails.connected_agents_by_agent(42).await.expect("by agent");
    assert_eq!(
        by_agent.iter().map(|a| a.connection_id).collect::<Vec<_>>(),
        [5]
    );
    assert!(
        rails
            .connected_agents_by_agent(43)
            .await
            .expect("none")
            .is_empty()
    );
    rails
        .git_push_event(7, "group/agents")
        .await
        .expect("GitPushEvent");
    assert_eq!(pushes.recv().await, Some((7, "group/agents".to_owned())));
    // Signed with another secret, kas refuses it.
    let wrong = RailsClient::new(
        &addr.to_string(),
        b"another-secret-32-bytes-long-xx!",
        "gitlab.example.com",
    )
    .expect("client");
    let err = wrong
        .connected_agents_by_project(7)
        .await
        .expect_err("wrong secret");
    assert!(
        matches!(&err, super::rails::Error::Status(s) if s.code() == tonic::Code::Unauthenticated),
        "{err:?}"
    );
}
