//! The GitLab-shaped peers against each other: GitLab's agentk and kas as written
//! from GitLab's source agree on the wire (configuration, registration, tunnels,
//! `MakeRequest`, upgrades, gzip, tokens, WebSocket).
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
use super::proto::gitlab::agent::agentcfg::{AgentConfiguration, FluxCf};

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

/// A stand-in for `kubectl exec`'s upgrade: `101` to `Upgrade: echo`, then echoes
/// the first 4 bytes and closes.
async fn echo_upgrade_api() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        let svc = service_fn(
            |mut req: hyper::Request<hyper::body::Incoming>| async move {
                assert_eq!(req.headers()["upgrade"], "echo");
                tokio::spawn(async move {
                    let upgraded = hyper::upgrade::on(&mut req).await.expect("upgraded");
                    let mut io = TokioIo::new(upgraded);
                    let mut buf = [0u8; 4];
                    tokio::io::AsyncReadExt::read_exact(&mut io, &mut buf)
                        .await
                        .expect("4 bytes");
                    tokio::io::AsyncWriteExt::write_all(&mut io, &buf)
                        .await
                        .expect("echo");
                    tokio::io::AsyncWriteExt::shutdown(&mut io)
                        .await
                        .expect("close");
                });
                let resp = hyper::Response::builder()
                    .status(101)
                    .header("connection", "upgrade")
                    .header("upgrade", "echo")
                    .body(Full::new(Bytes::new()))
                    .expect("response");
                Ok::<_, Infallible>(resp)
            },
        );
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), svc)
            .with_upgrades()
            .await;
    });
    addr
}

#[tokio::test]
async fn agentk_carries_an_upgraded_connection_both_ways() {
    use super::proto::gitlab::agent::grpctool::{
        HttpRequest, HttpResponse, http_request, http_response,
    };
    use super::proto::gitlab::agent::reverse_tunnel::rpc::connect_request::Msg;
    use prost::Message as _;

    let kube = echo_upgrade_api().await;
    let kas = GitlabKas::start(TOKEN, "c", config("")).await.expect("kas");
    let mut cfg = Config::new(&kas.addr.to_string(), TOKEN, &format!("http://{kube}"));
    cfg.tunnels = 1;
    let _agent = agentk::start(cfg).expect("agentk");

    let meta = super::grpctool::values_map([("content-type", "application/grpc")]);
    let mut call = kas
        .open_call(agentk::MAKE_REQUEST, meta)
        .await
        .expect("a tunnel");
    // Go's canonical header names: GitLab's agentk looks for the key `Upgrade`.
    let mut frames = request_frames(
        "POST",
        "/exec",
        &[("Upgrade", "echo"), ("Connection", "Upgrade")],
        None,
        b"",
    );
    frames.push(HttpRequest {
        message: Some(http_request::Message::UpgradeData(
            http_request::UpgradeData {
                data: b"ping".to_vec(),
            },
        )),
    });
    for f in &frames {
        call.send(f.encode_to_vec()).await.expect("send");
    }
    let mut responses = Vec::new();
    let mut error = None;
    while let Some(frame) = call.next().await.expect("frames") {
        match frame {
            Msg::Message(m) => {
                responses.push(HttpResponse::decode(m.data.as_slice()).expect("HttpResponse"))
            }
            Msg::Error(e) => error = e.status,
            Msg::Header(_) | Msg::Trailer(_) => {}
            Msg::Descriptor(_) => panic!("a second descriptor"),
        }
        // The agent ends its side once the Kubernetes API closed the connection.
    }
    assert_eq!(error, None);
    let kinds: Vec<_> = responses
        .iter()
        .map(|r| match r.message.as_ref().expect("a frame") {
            http_response::Message::Header(h) => {
                format!("header {}", h.response.as_ref().unwrap().status_code)
            }
            http_response::Message::Data(d) => format!("data {}", d.data.len()),
            http_response::Message::Trailer(_) => "trailer".to_owned(),
            http_response::Message::UpgradeData(u) => {
                format!("upgrade {}", String::from_utf8_lossy(&u.data))
            }
        })
        .collect();
    assert_eq!(kinds, ["header 101", "trailer", "upgrade ping"]);
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
async fn agentk_answers_unimplemented_for_a_method_it_did_not_advertise() {
    use super::proto::gitlab::agent::reverse_tunnel::rpc::connect_request::Msg;

    let kas = GitlabKas::start(TOKEN, "c", config("")).await.expect("kas");
    let mut cfg = Config::new(&kas.addr.to_string(), TOKEN, "http://127.0.0.1:1");
    cfg.tunnels = 1;
    let _agent = agentk::start(cfg).expect("agentk");
    let method = "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/WatchGraph";
    let mut call = kas
        .open_call_ignoring_descriptor(method, Default::default())
        .await
        .expect("a tunnel");
    call.close_send().await.expect("CloseSend");
    let mut frames = Vec::new();
    while let Some(frame) = call.next().await.expect("frames") {
        frames.push(frame);
    }
    // As agentk's connection.go answers grpc-go's unknown method: Header, Trailer,
    // Error (the kas checks GitLab's order).
    assert!(matches!(frames.first(), Some(Msg::Header(_))), "{frames:?}");
    assert!(matches!(frames.get(1), Some(Msg::Trailer(_))), "{frames:?}");
    match frames.get(2) {
        Some(Msg::Error(e)) => assert_eq!(
            e.status.as_ref().unwrap().code,
            tonic::Code::Unimplemented as i32
        ),
        other => panic!("expected an Error, got {other:?}"),
    }
    assert_eq!(frames.len(), 3);
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
