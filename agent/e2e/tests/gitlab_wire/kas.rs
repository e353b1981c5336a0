//! A GitLab-shaped kas for the tests, on the tests' own protobuf types: the part of
//! GitLab 16.5's kas an agentk talks to, written from its Go source, sharing no code
//! with podgate's kas.
//!
//! - Transport: h2c, or HTTP/2 inside WebSockets (`internal/tool/wstunnel/server.go`:
//!   subprotocol `ws-tunnel` selected, a socket without it closed).
//! - Authentication: `authorization: Bearer <token>` (scheme case-insensitive, as
//!   `grpc_auth.AuthFromMD(ctx, "bearer")`), `UNAUTHENTICATED` otherwise; GitLab asks
//!   Rails about the token, this kas knows one.
//! - `AgentConfiguration/GetConfiguration`
//!   (`internal/module/agent_configuration/server/server.go`): sends the
//!   configuration only when its commit differs from the request's `commit_id`, then
//!   keeps the stream open and sends each new commit ([`GitlabKas::set_configuration`]).
//! - `AgentRegistrar/Register` (`internal/module/agent_registrar/server/server.go`):
//!   recorded as an event.
//! - `ReverseTunnel/Connect` (`internal/module/reverse_tunnel/tunnel/registry_stripe.go`,
//!   `impl.go`): the first message must be a `Descriptor` (else `INVALID_ARGUMENT`
//!   "Invalid oneof value type"); the tunnel waits until a call needs a method its
//!   descriptor lists; the call is `RequestInfo{method_name, meta}`, `Message`* (raw
//!   gRPC message bytes), `CloseSend`; the agent answers `Header`, `Message`*,
//!   `Trailer`, or `Error`, in the order GitLab's automata allows (checked); the
//!   `Connect` then ends with OK.
//!
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/tunnel/impl.go>

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt as _};
use tonic::codec::CompressionEncoding::Gzip;
use tonic::{Request, Response, Status, Streaming};

use super::agentk::Transport;
use super::proto::gitlab::agent::agent_configuration::rpc::{
    ConfigurationRequest, ConfigurationResponse,
    agent_configuration_server::{AgentConfiguration, AgentConfigurationServer},
};
use super::proto::gitlab::agent::agent_registrar::rpc::{
    RegisterRequest, RegisterResponse,
    agent_registrar_server::{AgentRegistrar, AgentRegistrarServer},
};
use super::proto::gitlab::agent::agentcfg;
use super::proto::gitlab::agent::grpctool::{HttpRequest, HttpResponse};
use super::proto::gitlab::agent::prototool::Values;
use super::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor;
use super::proto::gitlab::agent::reverse_tunnel::rpc::{
    self as tunnel, ConnectRequest, ConnectResponse, connect_request, connect_response,
    reverse_tunnel_server::{ReverseTunnel, ReverseTunnelServer},
};

/// Why the kas could not start. Not retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding its listener failed.
    #[error("binding kas's listener: {0}")]
    Bind(#[source] std::io::Error),
}

/// What the kas saw, for the tests to wait on.
#[derive(Debug)]
pub enum Event {
    /// A `GetConfiguration` call arrived.
    ConfigurationRequested(ConfigurationRequest),
    /// A `Register` call arrived.
    Registered(RegisterRequest),
    /// A tunnel was registered with this descriptor.
    Tunnel(AgentDescriptor),
}

/// What an agent answered to a call through a tunnel.
#[derive(Debug, Default)]
pub struct Reply {
    /// The `Header` frame's metadata.
    pub header: HashMap<String, Values>,
    /// The `Message` frames' data, each a gRPC message.
    pub messages: Vec<Vec<u8>>,
    /// The `Trailer` frame's metadata.
    pub trailer: HashMap<String, Values>,
    /// The `Error` frame's status.
    pub error: Option<super::proto::google::rpc::Status>,
}

struct Tunnel {
    descriptor: AgentDescriptor,
    to_agent: mpsc::Sender<Result<ConnectResponse, Status>>,
    from_agent: Streaming<ConnectRequest>,
}

struct State {
    token: String,
    config: watch::Sender<(String, agentcfg::AgentConfiguration)>,
    tunnels: Mutex<Vec<Tunnel>>,
    tunnel_count: watch::Sender<u64>,
    events: mpsc::UnboundedSender<Event>,
    encodings: Mutex<Vec<String>>,
}

impl State {
    fn authenticate<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let encoding = req
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("identity");
        self.encodings.lock().unwrap().push(encoding.to_owned());
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let (scheme, token) = value.split_once(' ').unwrap_or(("", ""));
        if scheme.eq_ignore_ascii_case("bearer") && token == self.token {
            Ok(())
        } else {
            Err(Status::unauthenticated("invalid agent token"))
        }
    }
}

/// A running GitLab-shaped kas; dropping it stops it.
pub struct GitlabKas {
    /// Its agent listener.
    pub addr: SocketAddr,
    /// What it saw.
    pub events: mpsc::UnboundedReceiver<Event>,
    state: Arc<State>,
    _stop: oneshot::Sender<()>,
}

#[derive(Clone)]
struct Svc(Arc<State>);

impl GitlabKas {
    /// Starts a kas on `127.0.0.1:0` that accepts `token` and serves `config` at
    /// `commit_id`.
    pub async fn start(
        token: &str,
        commit_id: &str,
        config: agentcfg::AgentConfiguration,
    ) -> Result<Self, Error> {
        Self::start_on(Transport::H2c, token, commit_id, config).await
    }

    /// As [`Self::start`], over `transport` (a WebSocket kas accepts gRPC only inside
    /// `ws-tunnel` WebSockets).
    pub async fn start_on(
        transport: Transport,
        token: &str,
        commit_id: &str,
        config: agentcfg::AgentConfiguration,
    ) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let (events_tx, events) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            token: token.to_owned(),
            config: watch::Sender::new((commit_id.to_owned(), config)),
            tunnels: Mutex::new(Vec::new()),
            tunnel_count: watch::Sender::new(0),
            events: events_tx,
            encodings: Mutex::new(Vec::new()),
        });
        let svc = Svc(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let router = tonic::transport::Server::builder()
            .add_service(
                AgentConfigurationServer::new(svc.clone())
                    .accept_compressed(Gzip)
                    .send_compressed(Gzip),
            )
            .add_service(
                AgentRegistrarServer::new(svc.clone())
                    .accept_compressed(Gzip)
                    .send_compressed(Gzip),
            )
            .add_service(
                ReverseTunnelServer::new(svc)
                    .accept_compressed(Gzip)
                    .send_compressed(Gzip),
            );
        let shutdown = async {
            let _ = stopped.await;
        };
        match transport {
            Transport::H2c => {
                tokio::spawn(
                    router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown),
                );
            }
            Transport::WebSocket => {
                let (tx, rx) = mpsc::channel(16);
                let acceptor = tokio::spawn(super::peers::accept_ws(listener, tx));
                let incoming = ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
                tokio::spawn(async move {
                    let _ = router
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await;
                    acceptor.abort();
                });
            }
        }
        Ok(Self {
            addr,
            events,
            state,
            _stop: stop,
        })
    }

    /// The next event; panics if the kas stopped.
    pub async fn next(&mut self) -> Event {
        self.events.recv().await.expect("the kas runs")
    }

    /// The `grpc-encoding` of every call so far (`identity` when absent).
    pub fn encodings(&self) -> Vec<String> {
        self.state.encodings.lock().unwrap().clone()
    }

    /// A new commit of the agent's configuration, sent on every open
    /// `GetConfiguration` stream.
    pub fn set_configuration(&self, commit_id: &str, config: agentcfg::AgentConfiguration) {
        self.state
            .config
            .send_replace((commit_id.to_owned(), config));
    }

    /// Carries one call of `method` (`/package.Service/Method`) through a tunnel whose
    /// descriptor lists it, waiting for one if none is idle: sends `messages` and
    /// `CloseSend`, and collects the agent's answer.
    pub async fn call(
        &self,
        method: &str,
        meta: HashMap<String, Values>,
        messages: Vec<Vec<u8>>,
    ) -> Result<Reply, Status> {
        let mut call = self.open_call(method, meta).await?;
        for m in messages {
            call.send(m).await?;
        }
        call.close_send().await?;
        let mut reply = Reply::default();
        while let Some(frame) = call.next().await? {
            match frame {
                connect_request::Msg::Header(h) => reply.header = h.meta,
                connect_request::Msg::Message(m) => reply.messages.push(m.data),
                connect_request::Msg::Trailer(tr) => reply.trailer = tr.meta,
                connect_request::Msg::Error(e) => reply.error = e.status,
                connect_request::Msg::Descriptor(_) => {
                    return Err(Status::internal("a second Descriptor from the agent"));
                }
            }
        }
        Ok(reply)
    }

    /// Starts a call of `method` through a tunnel that supports it (waiting for one)
    /// and returns it open, for calls that stream both ways.
    pub async fn open_call(
        &self,
        method: &str,
        meta: HashMap<String, Values>,
    ) -> Result<OpenCall, Status> {
        let (service, name) = method
            .trim_start_matches('/')
            .split_once('/')
            .ok_or_else(|| Status::invalid_argument(format!("method {method:?}")))?;
        self.open_call_where(method, meta, |d| supports(d, service, name))
            .await
    }

    /// Starts a call of `method` on any tunnel, whatever its descriptor lists: what
    /// a kas that ignored descriptors would do (GitLab's never does), to see the
    /// agent's answer.
    pub async fn open_call_ignoring_descriptor(
        &self,
        method: &str,
        meta: HashMap<String, Values>,
    ) -> Result<OpenCall, Status> {
        self.open_call_where(method, meta, |_| true).await
    }

    async fn open_call_where(
        &self,
        method: &str,
        meta: HashMap<String, Values>,
        usable: impl Fn(&AgentDescriptor) -> bool,
    ) -> Result<OpenCall, Status> {
        let mut count = self.state.tunnel_count.subscribe();
        let t = loop {
            if let Some(t) = self.take_tunnel(&usable) {
                break t;
            }
            count
                .changed()
                .await
                .map_err(|_| Status::unavailable("kas stopped"))?;
        };
        let call = OpenCall { tunnel: t, last: 1 };
        let info = tunnel::RequestInfo {
            method_name: method.to_owned(),
            meta,
        };
        call.push(connect_response::Msg::RequestInfo(info)).await?;
        Ok(call)
    }

    /// `KubernetesApi/MakeRequest` through a tunnel: `frames` in, the response frames
    /// out, or the agent's `Error` as a status.
    pub async fn make_request(&self, frames: &[HttpRequest]) -> Result<Vec<HttpResponse>, Status> {
        let meta = super::grpctool::values_map([("content-type", "application/grpc")]);
        let messages = frames.iter().map(prost::Message::encode_to_vec).collect();
        let reply = self
            .call(super::agentk::MAKE_REQUEST, meta, messages)
            .await?;
        if let Some(e) = reply.error {
            return Err(Status::new(tonic::Code::from(e.code), e.message));
        }
        reply
            .messages
            .iter()
            .map(|m| {
                HttpResponse::decode(m.as_slice())
                    .map_err(|e| Status::internal(format!("HttpResponse: {e}")))
            })
            .collect()
    }

    fn take_tunnel(&self, usable: impl Fn(&AgentDescriptor) -> bool) -> Option<Tunnel> {
        let mut tunnels = self.state.tunnels.lock().unwrap();
        let i = tunnels.iter().position(|t| usable(&t.descriptor))?;
        Some(tunnels.swap_remove(i))
    }
}

/// One call through a tunnel, open both ways. Dropping it ends the agent's
/// `Connect` with OK.
pub struct OpenCall {
    tunnel: Tunnel,
    /// The field number of the agent's last frame (1: the `Descriptor`), for
    /// GitLab's automata (`rpc.proto`'s `next_allowed_field`, checked by kas's
    /// stream visitor): Descriptor → Header | Error; Header, Message → Message |
    /// Trailer; Trailer → Error | end; Error → end.
    last: i32,
}

impl OpenCall {
    async fn push(&self, msg: connect_response::Msg) -> Result<(), Status> {
        let frame = ConnectResponse { msg: Some(msg) };
        self.tunnel
            .to_agent
            .send(Ok(frame))
            .await
            .map_err(|_| Status::unavailable("the tunnel closed"))
    }

    /// Sends one gRPC message (`Message`).
    pub async fn send(&self, data: Vec<u8>) -> Result<(), Status> {
        self.push(connect_response::Msg::Message(tunnel::Message { data }))
            .await
    }

    /// Half-closes the call (`CloseSend`).
    pub async fn close_send(&self) -> Result<(), Status> {
        self.push(connect_response::Msg::CloseSend(tunnel::CloseSend {}))
            .await
    }

    /// The agent's next frame; `None` once it closed its side. A frame (or end)
    /// GitLab's automata does not allow next is an `INTERNAL` error.
    pub async fn next(&mut self) -> Result<Option<connect_request::Msg>, Status> {
        let msg = self.tunnel.from_agent.message().await?.and_then(|f| f.msg);
        let field = match &msg {
            None => -1,
            Some(connect_request::Msg::Descriptor(_)) => 1,
            Some(connect_request::Msg::Header(_)) => 2,
            Some(connect_request::Msg::Message(_)) => 3,
            Some(connect_request::Msg::Trailer(_)) => 4,
            Some(connect_request::Msg::Error(_)) => 5,
        };
        let allowed: &[i32] = match self.last {
            1 => &[2, 5],
            2 | 3 => &[3, 4],
            4 => &[5, -1],
            _ => &[-1],
        };
        if !allowed.contains(&field) {
            return Err(Status::internal(format!(
                "agent frame {field} after {} (allowed: {allowed:?})",
                self.last
            )));
        }
        self.last = field;
        Ok(msg)
    }
}

/// GitLab's `AgentDescriptor.SupportsServiceAndMethod`
/// (`internal/module/reverse_tunnel/info/info_extra.go`).
pub fn supports(d: &AgentDescriptor, service: &str, method: &str) -> bool {
    d.services
        .iter()
        .any(|s| s.name == service && s.methods.iter().any(|m| m.name == method))
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AgentConfiguration for Svc {
    type GetConfigurationStream = BoxStream<ConfigurationResponse>;

    async fn get_configuration(
        &self,
        req: Request<ConfigurationRequest>,
    ) -> Result<Response<Self::GetConfigurationStream>, Status> {
        self.0.authenticate(&req)?;
        let req = req.into_inner();
        let req_commit = req.commit_id.clone();
        let _ = self.0.events.send(Event::ConfigurationRequested(req));
        // Each change of the configuration; the first look sees the current one.
        let stream = futures_util::stream::unfold(
            (self.0.config.subscribe(), req_commit),
            |(mut rx, mut last)| async move {
                loop {
                    let (commit, config) = rx.borrow_and_update().clone();
                    if commit != last {
                        last.clone_from(&commit);
                        let resp = ConfigurationResponse {
                            configuration: Some(config),
                            commit_id: commit,
                        };
                        return Some((Ok(resp), (rx, last)));
                    }
                    rx.changed().await.ok()?;
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}

#[tonic::async_trait]
impl AgentRegistrar for Svc {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        self.0.authenticate(&req)?;
        let _ = self.0.events.send(Event::Registered(req.into_inner()));
        Ok(Response::new(RegisterResponse {}))
    }
}

#[tonic::async_trait]
impl ReverseTunnel for Svc {
    type ConnectStream = ReceiverStream<Result<ConnectResponse, Status>>;

    async fn connect(
        &self,
        req: Request<Streaming<ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.0.authenticate(&req)?;
        let mut from_agent = req.into_inner();
        let descriptor = match from_agent.message().await? {
            Some(ConnectRequest {
                msg: Some(connect_request::Msg::Descriptor(d)),
            }) => d.agent_descriptor.unwrap_or_default(),
            other => {
                return Err(Status::invalid_argument(format!(
                    "Invalid oneof value type: {:?}",
                    other.and_then(|o| o.msg)
                )));
            }
        };
        let (to_agent, rx) = mpsc::channel(16);
        let _ = self.0.events.send(Event::Tunnel(descriptor.clone()));
        self.0.tunnels.lock().unwrap().push(Tunnel {
            descriptor,
            to_agent,
            from_agent,
        });
        self.0.tunnel_count.send_modify(|n| *n += 1);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
