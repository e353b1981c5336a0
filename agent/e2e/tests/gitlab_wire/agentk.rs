//! A GitLab-shaped agentk for the tests, on the tests' own protobuf types: what
//! GitLab 16.5's agentk sends kas, written from its Go source, sharing no code with
//! podgate's agentk.
//!
//! - Dial (`cmd/agentk/agentkapp/app.go`): every call gzip-compressed
//!   (`grpc.UseCompressor(gzip)`), `authorization: Bearer <token>`
//!   (`internal/tool/grpctool/token_creds.go`), the user agent
//!   `gitlab-agent/<version>/<commit>`; h2c, or a WebSocket with subprotocol
//!   `ws-tunnel` (`internal/tool/wstunnel/`, see [`Transport`]).
//! - Configuration (`internal/module/agent_configuration/rpc/configuration_watcher.go`):
//!   `GetConfiguration{commit_id: last processed, agent_meta, skip_register: true}`,
//!   a response with an empty `commit_id` refused (GitLab's validate rule), a clean
//!   end of stream reconnects at once with the last commit id.
//! - Registration (`internal/module/agent_registrar/agent/module.go`):
//!   `Register{agent_meta, pod_id}`, repeated every `register_interval`.
//! - Reverse tunnels (`internal/module/reverse_tunnel/agent/connection.go`): each
//!   `Connect` sends the `Descriptor` first, then serves the one call kas sends
//!   (`RequestInfo`, `Message`*, `CloseSend`) with `Header`, `Message`*, `Trailer`,
//!   or `Trailer` then `Error`; then reconnects. The only method served is
//!   `KubernetesApi/MakeRequest` (`internal/module/kubernetes_api/agent/server.go`),
//!   forwarded as HTTP to the given Kubernetes API URL; others get `UNIMPLEMENTED`
//!   as grpc-go's server answers an unknown method.
//!
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/agent/connection.go>

use std::collections::HashMap;
use std::time::Duration;

use prost::Message as _;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::CompressionEncoding::Gzip;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::grpctool::{self, TokenCreds};
use super::proto::gitlab::agent::agent_configuration::rpc::{
    ConfigurationRequest, agent_configuration_client::AgentConfigurationClient,
};
use super::proto::gitlab::agent::agent_registrar::rpc::{
    RegisterRequest, agent_registrar_client::AgentRegistrarClient,
};
use super::proto::gitlab::agent::agentcfg::AgentConfiguration;
use super::proto::gitlab::agent::entity::{AgentMeta, KubernetesVersion};
use super::proto::gitlab::agent::grpctool::HttpRequest;
use super::proto::gitlab::agent::reverse_tunnel::info::{AgentDescriptor, Method, Service};
use super::proto::gitlab::agent::reverse_tunnel::rpc::{
    self as tunnel, ConnectRequest, ConnectResponse, connect_request, connect_response,
    reverse_tunnel_client::ReverseTunnelClient,
};
use super::proto::google::rpc::Status;

/// The service GitLab's agentk serves through its tunnels for kas's Kubernetes API
/// proxy.
pub const KUBERNETES_API: &str = "gitlab.agent.kubernetes_api.rpc.KubernetesApi";
/// `KubernetesApi/MakeRequest`'s full method path.
pub const MAKE_REQUEST: &str = "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest";

/// Why the agent could not start. Not retried: the configuration is wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kas URL is not one tonic can dial.
    #[error("kas URL {url:?}: {source}")]
    KasUrl {
        /// The URL given.
        url: String,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
}

/// How the agent reaches kas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// gRPC over cleartext HTTP/2 (`grpc://`).
    H2c,
    /// gRPC over a WebSocket (`ws://`, subprotocol `ws-tunnel`, binary messages).
    WebSocket,
}

/// What the agent is told.
#[derive(Debug, Clone)]
pub struct Config {
    /// kas's agent listener, `host:port`.
    pub kas_address: String,
    /// How to reach it.
    pub transport: Transport,
    /// The agent token.
    pub token: String,
    /// Where `MakeRequest`s go (`http://host:port`).
    pub kube_api_url: String,
    /// How many reverse tunnels to keep open, each reconnecting after its call.
    /// GitLab's agentk keeps 2 idle (`minIdleConnections`) and opens more as they get
    /// busy, up to 500 (`reverse_tunnel/agent/factory.go`); a fixed number is enough
    /// for the tests and makes their counts exact.
    pub tunnels: usize,
    /// The random id of this Pod (`Register.pod_id`).
    pub pod_id: i64,
    /// What the agent says about itself.
    pub agent_meta: AgentMeta,
    /// How often to register again (GitLab: 5 minutes, `registerAttemptInterval`).
    pub register_interval: Duration,
    /// How long to wait before retrying a failed call.
    pub backoff: Duration,
}

impl Config {
    /// Defaults for the tests: 2 tunnels, GitLab's 16.5 metadata.
    pub fn new(kas_address: &str, token: &str, kube_api_url: &str) -> Self {
        Self {
            kas_address: kas_address.to_owned(),
            transport: Transport::H2c,
            token: token.to_owned(),
            kube_api_url: kube_api_url.to_owned(),
            tunnels: 2,
            pod_id: 0x5eed_0001,
            agent_meta: AgentMeta {
                version: "v16.5.0".into(),
                commit_id: "e02ad05f".into(),
                pod_namespace: "gitlab-agent".into(),
                pod_name: "gitlab-agent-0".into(),
                // What the registrar read of the cluster's `/version`
                // (`agent_registrar/agent/module.go`).
                kubernetes_version: Some(KubernetesVersion {
                    major: "1".into(),
                    minor: "28".into(),
                    git_version: "v1.28.2".into(),
                    platform: "linux/amd64".into(),
                }),
            },
            register_interval: Duration::from_secs(300),
            backoff: Duration::from_millis(100),
        }
    }
}

/// What the agent did, in order, for the tests to wait on.
#[derive(Debug)]
pub enum Event {
    /// A configuration arrived and was accepted.
    Configuration {
        /// Its commit id.
        commit_id: String,
        /// The configuration.
        config: Box<AgentConfiguration>,
    },
    /// A `Register` call succeeded.
    Registered,
    /// A call failed (the agent retries it after the back-off).
    Failed {
        /// Which call.
        call: &'static str,
        /// kas's answer.
        status: tonic::Status,
    },
    /// A tunnel served a call.
    Served {
        /// The method kas asked for.
        method: String,
        /// `None` if served, else the error sent to kas.
        error: Option<Status>,
    },
}

/// A running GitLab-shaped agentk; dropping it stops it.
pub struct Agentk {
    /// What it did.
    pub events: mpsc::UnboundedReceiver<Event>,
    _tasks: JoinSet<()>,
}

type Authed = InterceptedService<Channel, TokenCreds>;

/// Starts the agent: configuration watcher, registrar, `cfg.tunnels` tunnels.
pub fn start(cfg: Config) -> Result<Agentk, Error> {
    let channel =
        super::peers::dial(&cfg.kas_address, cfg.transport, &cfg.agent_meta).map_err(|source| {
            Error::KasUrl {
                url: cfg.kas_address.clone(),
                source,
            }
        })?;
    let creds = TokenCreds::new(&cfg.token);
    let authed = InterceptedService::new(channel, creds);
    let (tx, events) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    tasks.spawn(watch_configuration(cfg.clone(), authed.clone(), tx.clone()));
    tasks.spawn(register(cfg.clone(), authed.clone(), tx.clone()));
    for _ in 0..cfg.tunnels {
        tasks.spawn(tunnel_loop(cfg.clone(), authed.clone(), tx.clone()));
    }
    Ok(Agentk {
        events,
        _tasks: tasks,
    })
}

/// The descriptor GitLab's agentk builds from its internal server's services
/// (`reverse_tunnel/agent/module.go`, `agentDescriptor`).
pub fn descriptor() -> AgentDescriptor {
    AgentDescriptor {
        services: vec![Service {
            name: KUBERNETES_API.into(),
            methods: vec![Method {
                name: "MakeRequest".into(),
            }],
        }],
    }
}

async fn watch_configuration(cfg: Config, channel: Authed, events: mpsc::UnboundedSender<Event>) {
    let mut client = AgentConfigurationClient::new(channel)
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    let mut last_commit = String::new();
    loop {
        let req = ConfigurationRequest {
            commit_id: last_commit.clone(),
            agent_meta: Some(cfg.agent_meta.clone()),
            skip_register: true,
        };
        let mut stream = match client.get_configuration(req).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                let _ = events.send(Event::Failed {
                    call: "GetConfiguration",
                    status,
                });
                tokio::time::sleep(cfg.backoff).await;
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) if resp.commit_id.is_empty() => {
                    // GitLab's client validator: `commit_id` min_bytes 1.
                    let status = tonic::Status::internal(
                        "invalid ConfigurationResponse.CommitId: value length must be at least 1 bytes",
                    );
                    let _ = events.send(Event::Failed {
                        call: "GetConfiguration",
                        status,
                    });
                    tokio::time::sleep(cfg.backoff).await;
                    break;
                }
                Ok(Some(resp)) => {
                    last_commit.clone_from(&resp.commit_id);
                    let config = Box::new(resp.configuration.unwrap_or_default());
                    let _ = events.send(Event::Configuration {
                        commit_id: resp.commit_id,
                        config,
                    });
                }
                Ok(None) => break,
                Err(status) => {
                    let _ = events.send(Event::Failed {
                        call: "GetConfiguration",
                        status,
                    });
                    tokio::time::sleep(cfg.backoff).await;
                    break;
                }
            }
        }
    }
}

async fn register(cfg: Config, channel: Authed, events: mpsc::UnboundedSender<Event>) {
    let mut client = AgentRegistrarClient::new(channel)
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    loop {
        let req = RegisterRequest {
            agent_meta: Some(cfg.agent_meta.clone()),
            pod_id: cfg.pod_id,
        };
        match client.register(req).await {
            Ok(_) => {
                let _ = events.send(Event::Registered);
                tokio::time::sleep(cfg.register_interval).await;
            }
            Err(status) => {
                let _ = events.send(Event::Failed {
                    call: "Register",
                    status,
                });
                tokio::time::sleep(cfg.backoff).await;
            }
        }
    }
}

async fn tunnel_loop(cfg: Config, channel: Authed, events: mpsc::UnboundedSender<Event>) {
    let mut client = ReverseTunnelClient::new(channel)
        .send_compressed(Gzip)
        .accept_compressed(Gzip);
    loop {
        if let Err(status) = serve_one(&cfg, &mut client, &events).await {
            let _ = events.send(Event::Failed {
                call: "Connect",
                status,
            });
            tokio::time::sleep(cfg.backoff).await;
        }
    }
}

fn send_msg(msg: connect_request::Msg) -> ConnectRequest {
    ConnectRequest { msg: Some(msg) }
}

/// One `Connect`: Descriptor, then the one call kas sends, if any.
async fn serve_one(
    cfg: &Config,
    client: &mut ReverseTunnelClient<Authed>,
    events: &mpsc::UnboundedSender<Event>,
) -> Result<(), tonic::Status> {
    let (to_kas, rx) = mpsc::channel(16);
    let descriptor = tunnel::Descriptor {
        agent_descriptor: Some(descriptor()),
    };
    to_kas
        .send(send_msg(connect_request::Msg::Descriptor(descriptor)))
        .await
        .expect("receiver alive");
    let mut from_kas = client.connect(ReceiverStream::new(rx)).await?.into_inner();
    let info = match from_kas.message().await? {
        // End of stream first: "nothing to do" (the automata's first_allowed_field -1).
        None => return Ok(()),
        Some(ConnectResponse {
            msg: Some(connect_response::Msg::RequestInfo(info)),
        }) => info,
        Some(other) => {
            return Err(tonic::Status::internal(format!(
                "expected RequestInfo, got {other:?}"
            )));
        }
    };
    if info.method_name != MAKE_REQUEST {
        let status = Status {
            code: tonic::Code::Unimplemented as i32,
            message: format!("unknown method {}", info.method_name),
            details: vec![],
        };
        // grpc-go's answer to an unknown method has no headers: `Header()` gives empty
        // metadata, `RecvMsg` the status, so connection.go sends Header, Trailer, Error.
        let header = tunnel::Header {
            meta: HashMap::new(),
        };
        let _ = to_kas
            .send(send_msg(connect_request::Msg::Header(header)))
            .await;
        let trailer = tunnel::Trailer {
            meta: HashMap::new(),
        };
        let _ = to_kas
            .send(send_msg(connect_request::Msg::Trailer(trailer)))
            .await;
        let _ = to_kas
            .send(send_msg(connect_request::Msg::Error(tunnel::Error {
                status: Some(status.clone()),
            })))
            .await;
        drop(to_kas);
        while from_kas.message().await?.is_some() {}
        let _ = events.send(Event::Served {
            method: info.method_name,
            error: Some(status),
        });
        return Ok(());
    }
    let header = tunnel::Header {
        meta: grpctool::values_map([("content-type", "application/grpc")]),
    };
    let _ = to_kas
        .send(send_msg(connect_request::Msg::Header(header)))
        .await;
    let (req_tx, req_rx) = mpsc::channel(16);
    let (resp_tx, mut resp_rx) = mpsc::channel(16);
    let http = tokio::spawn(super::grpc2http::serve_http(
        cfg.kube_api_url.clone(),
        req_rx,
        resp_tx,
    ));
    let mut req_tx = Some(req_tx);
    let mut kas_open = true;
    loop {
        tokio::select! {
            msg = from_kas.message(), if kas_open => match msg? {
                Some(ConnectResponse { msg: Some(connect_response::Msg::Message(m)) }) => {
                    let frame = HttpRequest::decode(m.data.as_slice())
                        .map_err(|e| tonic::Status::invalid_argument(format!("HttpRequest: {e}")))?;
                    if let Some(tx) = &req_tx {
                        let _ = tx.send(frame).await;
                    }
                }
                Some(ConnectResponse { msg: Some(connect_response::Msg::CloseSend(_)) }) => req_tx = None,
                Some(other) => return Err(tonic::Status::internal(format!("expected Message or CloseSend, got {other:?}"))),
                None => {
                    req_tx = None;
                    kas_open = false;
                }
            },
            resp = resp_rx.recv() => match resp {
                Some(frame) => {
                    let data = tunnel::Message { data: frame.encode_to_vec() };
                    let _ = to_kas.send(send_msg(connect_request::Msg::Message(data))).await;
                }
                None => break,
            },
        }
    }
    let error = match http.await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(Status {
            code: tonic::Code::Unavailable as i32,
            message: format!("gRPC -> HTTP: {e}"),
            details: vec![],
        }),
        Err(e) => Some(Status {
            code: tonic::Code::Internal as i32,
            message: e.to_string(),
            details: vec![],
        }),
    };
    let _ = to_kas
        .send(send_msg(connect_request::Msg::Trailer(tunnel::Trailer {
            meta: HashMap::new(),
        })))
        .await;
    if let Some(status) = &error {
        let _ = to_kas
            .send(send_msg(connect_request::Msg::Error(tunnel::Error {
                status: Some(status.clone()),
            })))
            .await;
    }
    drop(to_kas);
    if kas_open {
        while from_kas.message().await?.is_some() {}
    }
    let _ = events.send(Event::Served {
        method: info.method_name,
        error,
    });
    Ok(())
}

impl Agentk {
    /// The next event; panics if the agent stopped.
    pub async fn next(&mut self) -> Event {
        self.events.recv().await.expect("the agent runs")
    }

    /// Waits for an event `pick` accepts, skipping others; returns what it returned.
    /// Failures it skips are printed, so a test that times out says why.
    pub async fn wait_for<T>(&mut self, mut pick: impl FnMut(Event) -> Option<T>) -> T {
        loop {
            let event = self.next().await;
            if let Event::Failed { call, status } = &event {
                eprintln!(
                    "GitLab agentk: {call} failed: {:?} {}",
                    status.code(),
                    status.message()
                );
            }
            if let Some(t) = pick(event) {
                return t;
            }
        }
    }
}
