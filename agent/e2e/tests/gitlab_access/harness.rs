//! The harness of the GitLab access tests, shared with other modules: a fake GitLab
//! that records what it received, kas and agentk started against it, raw
//! `MakeRequest` calls, and kas's metrics.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest as Request, http_request as request, http_response as response,
};
use podgate_agent::proto::gitlab::agent::prototool::{HttpRequest, Values};
use podgate_agent::proto::gitlab_access::HeaderExtra;
use podgate_agent::proto::gitlab_access::gitlab_access_client::GitlabAccessClient;
use podgate_agentk::{Agentk, AgentkConfig, Handler, Responses, unary};
use podgate_kas::agent_config::AgentConfigSource;
use podgate_kas::{Kas, KasConfig};
use podgate_testkit::fixtures::{EXTERNAL_SECRET, bearer, channel, kas_config, memory_registry};
use podgate_testkit::workspaces::agentk_config;
use tokio::sync::mpsc;

/// What the fake GitLab received.
#[derive(Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// A fake GitLab: records every request; answers `agent_configuration` posts with
/// 204 and everything else with the status in `x-answer-status` (201 by default),
/// a body of `x-answer-size` bytes (else `answer:<status>`) and `x-answered: yes`.
pub struct FakeGitlab {
    addr: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitlab {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `n` bytes of a pattern that shows misplaced chunks.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i % 251) as u8 ^ seed ^ (i / 65_536) as u8)
        .collect()
}

impl FakeGitlab {
    pub async fn start() -> FakeGitlab {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, seen) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let tx = tx.clone();
                            async move {
                                let (parts, body) = req.into_parts();
                                let body = body.collect().await?.to_bytes();
                                let header = |name: &str| {
                                    parts
                                        .headers
                                        .get(name)
                                        .and_then(|v| v.to_str().ok())
                                        .map(str::to_owned)
                                };
                                let config = parts.uri.path()
                                    == "/api/v4/internal/kubernetes/agent_configuration";
                                let status: u16 = if config {
                                    204
                                } else {
                                    header("x-answer-status").map_or(201, |s| s.parse().unwrap())
                                };
                                let answer = match header("x-answer-size") {
                                    Some(n) => Bytes::from(pattern(n.parse().unwrap(), 7)),
                                    None if status == 204 => Bytes::new(),
                                    None => Bytes::from(format!("answer:{status}")),
                                };
                                let _ = tx.send(Seen {
                                    method: parts.method.to_string(),
                                    path: parts.uri.path().to_owned(),
                                    query: parts.uri.query().map(str::to_owned),
                                    headers: parts.headers,
                                    body,
                                });
                                Ok::<_, hyper::Error>(
                                    hyper::Response::builder()
                                        .status(status)
                                        .header("x-answered", "yes")
                                        .header("content-type", "application/json")
                                        .body(Full::new(answer))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeGitlab { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The body of the next request, as JSON.
    pub async fn next_json(&mut self) -> serde_json::Value {
        serde_json::from_slice(&self.next().await.body).expect("a JSON body")
    }

    pub async fn next(&mut self) -> Seen {
        tokio::time::timeout(Duration::from_secs(20), self.seen.recv())
            .await
            .expect("GitLab got no request in time")
            .expect("the fake GitLab stopped")
    }

    /// The next request to a path other than `agent_configuration`'s.
    pub async fn next_module(&mut self) -> Seen {
        loop {
            let s = self.next().await;
            if !s.path.ends_with("/agent_configuration") {
                return s;
            }
        }
    }

    /// Nothing received so far.
    pub fn nothing(&mut self) -> bool {
        self.seen.try_recv().is_err()
    }
}

/// A handler for tunnelled calls that none of these tests make.
pub struct NoCalls;

impl Handler for NoCalls {
    fn handle(&self, _method: String, _payload: Vec<u8>) -> Responses {
        unary(async { Err(tonic::Status::unimplemented("not in this test")) })
    }
}

pub async fn start_kas(
    keys: podgate_tokens::KeySet,
    gitlab: Option<String>,
    agent_config: Option<AgentConfigSource>,
) -> Kas {
    let config = KasConfig {
        gitlab_url: gitlab,
        agent_config,
        ..kas_config(keys, Duration::from_secs(10))
    };
    Kas::start(config, memory_registry().await).await.unwrap()
}

pub async fn start_agentk(kas: &Kas, token: String) -> Agentk {
    let agentk = Agentk::start_with(
        AgentkConfig {
            pod_namespace: "gitlab-agent".into(),
            ..agentk_config(kas, token, None)
        },
        Arc::new(NoCalls),
    )
    .await
    .unwrap();
    agentk.connected().await;
    agentk
}

/// Check the `Gitlab-Kas-Api-Request` JWT as GitLab does: HS256 with the shared
/// secret, issuer `gitlab-kas`, audience `gitlab`.
pub fn assert_kas_jwt(headers: &http::HeaderMap) {
    let jwt = headers
        .get("gitlab-kas-api-request")
        .expect("the kas JWT header")
        .to_str()
        .unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.set_issuer(&["gitlab-kas"]);
    validation.set_audience(&["gitlab"]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(
        jwt,
        &jsonwebtoken::DecodingKey::from_secret(&EXTERNAL_SECRET),
        &validation,
    )
    .expect("a valid kas JWT")
    .claims;
    assert_eq!(claims["iss"], "gitlab-kas");
    assert_eq!(claims["aud"], "gitlab");
}

/// What `Header.extra` holds, packed as GitLab's agentk packs it (`anypb.New`).
pub const HEADER_EXTRA: &str = "gitlab.agent.gitlab_access.rpc.HeaderExtra";

pub fn values(v: &[&str]) -> Values {
    Values {
        value: v.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// A raw `MakeRequest`: header (with `headers`), `body` in `chunk`-byte pieces, a
/// trailer.
pub fn raw_request(
    module: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    chunk: usize,
) -> Vec<Request> {
    let mut messages = vec![Request {
        message: Some(request::Message::Header(request::Header {
            request: Some(HttpRequest {
                method: "POST".into(),
                header: headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), values(&[v])))
                    .collect(),
                url_path: path.into(),
                query: HashMap::new(),
            }),
            extra: Some(podgate_agent::any::pack(
                HEADER_EXTRA,
                &HeaderExtra {
                    module_name: module.into(),
                },
            )),
            content_length: Some(body.len() as i64),
        })),
    }];
    for c in body.chunks(chunk) {
        messages.push(Request {
            message: Some(request::Message::Data(request::Data { data: c.to_vec() })),
        });
    }
    messages.push(Request {
        message: Some(request::Message::Trailer(request::Trailer {})),
    });
    messages
}

/// Send `messages` with `token`; the response messages, or kas's status.
pub async fn raw_call(
    kas: &Kas,
    token: &str,
    messages: Vec<Request>,
) -> Result<Vec<response::Message>, tonic::Status> {
    let mut client = GitlabAccessClient::new(channel(kas.agent_addr()).await);
    let mut stream = client
        .make_request(bearer(
            tonic::Request::new(tokio_stream::iter(messages)),
            token,
        ))
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.next().await {
        out.push(m?.message.expect("a message"));
    }
    Ok(out)
}

/// Replace `path`'s contents at once (kas never reads a half-written file).
pub fn write(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub fn metric(kas: &Kas, line_prefix: &str) -> u64 {
    kas.metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}
