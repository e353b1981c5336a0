//! Routing a tunnelled call to an agent, the one loop every kas API uses (`GetPods`,
//! the Kubernetes API proxy's `MakeRequest`, the Graph API's `WatchGraph`):
//!
//! 1. a reverse tunnel this kas holds to the agent (the replica asked for, or any);
//! 2. else the kas the registry names for each of the agent's replicas, through its
//!    streaming `KasInternal.Call`: that kas only follows the instruction (answers from
//!    its own tunnel to that replica, waiting for one if the replica is registered to
//!    it) and otherwise says `Unavailable`, and the next kas is tried (re-routed);
//! 3. else wait — woken by the registry's connect event, or a tunnel arriving here,
//!    never polling — until `max_wait` passes: `DeadlineExceeded`.
//!
//! kas → kas calls are bounded: a connect timeout, and the other kas must *accept* the
//! call (answer its response headers, or refuse it) within [`ACCEPT_TIMEOUT`] and never
//! after the routing deadline, so a blackholed kas cannot hold a request past
//! `max_wait`. It accepts once it has decided to serve the call, before agentk's first
//! message (a `WatchGraph`'s first batch may take as long as an informer sync); if it
//! then finds no tunnel in time it ends the stream with `Unavailable` marked
//! [`NO_TUNNEL_KEY`], which the caller reads as "re-route", while an `Unavailable` from
//! agentk itself (its API server is unreachable) goes back to the client as it is.
//! The caller's remaining wait travels as [`HOP_WAIT_KEY`] so the other kas never waits
//! for a tunnel longer than the caller would. HTTP/2 keep-alive detects a kas that dies
//! mid-stream.
//!
//! GitLab's kas does the same in two steps (the routing kas tries the gateway kas
//! instances the registry lists; a gateway answers "tunnel ready" or "no tunnel") —
//! `internal/module/reverse_tunnel` and `internal/tool/grpctool` in
//! gitlab-org/cluster-integration/gitlab-agent; see `shared/reference/kas-anchor.md`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use podgate_registry::Registry;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

use super::metrics::{KasMetrics, Outcome};
use super::tunnel::{ResponseStream, Tunnels};
use crate::auth;
use crate::proto::kas_internal_client::KasInternalClient;
use crate::proto::{TunnelCallRequest, TunnelMessage};

/// Longest a kas → kas TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest another kas may take to accept or refuse a call (its response headers).
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 keep-alive pings on kas → kas channels: a silent peer is dropped after
/// `KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT`, ending the calls on it.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// gRPC metadata on a kas → kas call: how long (ms) the caller still waits, so the
/// other kas waits no longer for a tunnel.
pub const HOP_WAIT_KEY: &str = "kas-hop-wait-ms";

/// Metadata on the `Unavailable` a kas answers when it holds no tunnel to the
/// replica named (as opposed to an `Unavailable` agentk sent): re-route.
pub const NO_TUNNEL_KEY: &str = "kas-hop-no-tunnel";

pub(super) const NO_TUNNELS: &str = "this kas holds no tunnel to the agent";

const NOT_CONNECTED: &str = "agent connection not found: is the agent up to date and connected?";

/// Sends a tunnelled call to an agent: a local tunnel; else the kas the registry
/// names (`KasInternal.Call`, streaming, with connect and accept timeouts); else wait
/// (woken by the registry's connect event) until `max_wait`.
pub struct AgentRouter {
    me: String,
    tunnels: Arc<Tunnels>,
    registry: Registry,
    internal_secret: Vec<u8>,
    max_wait: Duration,
    metrics: Arc<KasMetrics>,
    channels: Mutex<HashMap<String, Channel>>,
}

/// A routed call's response: its messages, then its status. Dropping it cancels the
/// call at agentk (the tunnel, or the kas → kas stream that holds it, ends).
pub struct Routed {
    connection_id: i64,
    first: Option<Vec<u8>>,
    body: Body,
}

enum Body {
    Local(ResponseStream),
    Kas(Streaming<TunnelMessage>),
    Done,
}

impl Routed {
    /// The agentk replica answering.
    pub fn connection_id(&self) -> i64 {
        self.connection_id
    }

    /// Next response message; `None` at the OK end; `Err` for a non-OK status (from
    /// agentk, or the path to it breaking).
    pub async fn message(&mut self) -> Result<Option<Vec<u8>>, Status> {
        if let Some(m) = self.first.take() {
            return Ok(Some(m));
        }
        let next = match &mut self.body {
            Body::Done => return Ok(None),
            Body::Local(r) => r.message().await,
            Body::Kas(s) => s.message().await.map(|m| m.map(|m| m.payload)),
        };
        if !matches!(next, Ok(Some(_))) {
            self.body = Body::Done;
        }
        next.map_err(strip_hop_metadata)
    }

    /// A unary call's one message: `Err` for none, for more than one, or a non-OK
    /// status.
    pub async fn unary(mut self) -> Result<Vec<u8>, Status> {
        let message = self
            .message()
            .await?
            .ok_or_else(|| Status::internal("agentk sent no response message"))?;
        if self.message().await?.is_some() {
            return Err(Status::internal(
                "agentk sent more than one response message",
            ));
        }
        Ok(message)
    }

    /// A response whose first message has been read (`None`: it ended OK at once).
    async fn start(connection_id: i64, mut body: Body) -> Result<Routed, Status> {
        let first = match &mut body {
            Body::Local(r) => r.message().await?,
            Body::Kas(s) => s.message().await?.map(|m| m.payload),
            Body::Done => None,
        };
        Ok(Routed {
            connection_id,
            body: if first.is_some() { body } else { Body::Done },
            first,
        })
    }
}

/// A status passed on to the client, without kas-to-kas metadata.
fn strip_hop_metadata(s: Status) -> Status {
    if s.metadata().get(NO_TUNNEL_KEY).is_some() {
        Status::new(s.code(), s.message())
    } else {
        s
    }
}

/// Records a routed call's routing time when dropped: with its outcome, or as
/// cancelled when the caller went away first (the routing future is dropped).
struct RouteTimer<'a> {
    metrics: &'a KasMetrics,
    method: &'a str,
    started: std::time::Instant,
    outcome: Outcome,
}

impl Drop for RouteTimer<'_> {
    fn drop(&mut self) {
        self.metrics.routed(
            self.method,
            self.outcome,
            self.started.elapsed().as_secs_f64(),
        );
    }
}

/// Counts a call as waiting for its agent while it lives; `counted` makes a call
/// that waits more than once count once in `routing_waits`.
struct Waiting<'a>(&'a KasMetrics);

impl<'a> Waiting<'a> {
    fn new(metrics: &'a KasMetrics, counted: &mut bool) -> Self {
        if !std::mem::replace(counted, true) {
            metrics.routing_waits.inc();
        }
        metrics.routing_waiting.inc();
        Waiting(metrics)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.routing_waiting.dec();
    }
}

/// How a kas → kas attempt ended when it did not route the call.
enum Attempt {
    /// That kas holds no tunnel to the replica, or cannot be reached: try the next.
    Reroute,
    /// A final answer (agentk's error, or kas refused the call).
    Fail(Status),
}

impl AgentRouter {
    pub(super) fn new(
        me: String,
        tunnels: Arc<Tunnels>,
        registry: Registry,
        internal_secret: Vec<u8>,
        max_wait: Duration,
        metrics: Arc<KasMetrics>,
    ) -> AgentRouter {
        AgentRouter {
            me,
            tunnels,
            registry,
            internal_secret,
            max_wait,
            metrics,
            channels: Mutex::default(),
        }
    }

    /// Send `method(payload)` to agent `agent_id` (replica `connection_id`, or any
    /// when 0) and return its response once the first message (or the end) is in.
    pub async fn open(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        payload: Vec<u8>,
    ) -> Result<Routed, Status> {
        let mut timer = RouteTimer {
            metrics: &self.metrics,
            method,
            started: std::time::Instant::now(),
            outcome: Outcome::Cancelled,
        };
        let (result, outcome) = self.route(agent_id, connection_id, method, payload).await;
        timer.outcome = outcome;
        result
    }

    async fn route(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        payload: Vec<u8>,
    ) -> (Result<Routed, Status>, Outcome) {
        let deadline = Instant::now() + self.max_wait;
        // Subscribed before the first look, so a connect in between is not missed.
        let mut events = self.registry.subscribe();
        // A closed event channel (the registry is gone) would wake the wait at once,
        // forever: then only a tunnel here or the deadline ends it.
        let mut events_open = true;
        let mut waited = false;
        let timeout = |metrics: &KasMetrics| {
            metrics.routing_timeouts.inc();
            (
                Err(Status::deadline_exceeded(NOT_CONNECTED)),
                Outcome::Timeout,
            )
        };
        loop {
            if let Some(r) = self
                .tunnels
                .open(agent_id, connection_id, method, payload.clone())
                .await
            {
                let id = r.connection_id();
                return match Routed::start(id, Body::Local(r)).await {
                    Ok(r) => (Ok(r), Outcome::Local),
                    Err(e) => (Err(e), Outcome::Error),
                };
            }
            let conns = match self.registry.connections_by_agent(agent_id).await {
                Ok(c) => c,
                Err(e) => {
                    self.metrics.registry_error("connections_by_agent");
                    tracing::warn!(error = %e, "registry lookup failed; waiting for an event");
                    Vec::new()
                }
            };
            let conns = if conns.is_empty() {
                // Connected nowhere: wait for the connect event (no polling).
                let _waiting = Waiting::new(&self.metrics, &mut waited);
                match self.registry.wait_for_agent(agent_id, deadline).await {
                    Ok(c) => c,
                    Err(_) => return timeout(&self.metrics),
                }
            } else {
                conns
            };
            let mut held_here = false;
            for c in conns
                .iter()
                .filter(|c| connection_id == 0 || c.connection_id == connection_id)
            {
                if c.kas.0 == self.me {
                    held_here = true;
                    continue;
                }
                let instruction = TunnelCallRequest {
                    agent_id,
                    connection_id: c.connection_id,
                    method: method.to_owned(),
                    payload: payload.clone(),
                };
                match self.remote(&c.kas.0, instruction, deadline).await {
                    Ok(r) => return (Ok(r), Outcome::Kas),
                    Err(Attempt::Reroute) => {
                        self.metrics.reroutes.inc();
                    }
                    Err(Attempt::Fail(e)) => return (Err(e), Outcome::Error),
                }
            }
            if Instant::now() >= deadline {
                return timeout(&self.metrics);
            }
            // Nothing answered yet: wait for the next change (a tunnel here, or an
            // agent event anywhere), never past the deadline.
            let _waiting = Waiting::new(&self.metrics, &mut waited);
            tokio::select! {
                _ = self.tunnels.wait_idle(agent_id, connection_id, 1), if held_here => {}
                r = events.recv(), if events_open => {
                    events_open = !matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed));
                }
                _ = tokio::time::sleep_until(deadline) => return timeout(&self.metrics),
            }
        }
    }

    /// The channel to kas `kas` (made once, lazily connected, with timeouts).
    fn channel(&self, kas: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(kas) {
            return Ok(c.clone());
        }
        let c = Endpoint::from_shared(format!("http://{kas}"))
            .map_err(|_| Status::internal("a kas address in the registry is not a URI"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .connect_lazy();
        channels.insert(kas.to_owned(), c.clone());
        Ok(c)
    }

    /// Forget the channel to a kas that failed (a new one reconnects from scratch).
    fn forget_channel(&self, kas: &str) {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(kas);
    }

    /// The call through kas `kas`'s `KasInternal.Call`.
    async fn remote(
        &self,
        kas: &str,
        instruction: TunnelCallRequest,
        deadline: Instant,
    ) -> Result<Routed, Attempt> {
        let fail = |what: &str| Attempt::Fail(Status::internal(what.to_owned()));
        let token = auth::mint_internal(&self.internal_secret, 30)
            .map_err(|_| fail("minting an internal token"))?;
        let connection_id = instruction.connection_id;
        let mut request = Request::new(instruction);
        let wait_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .to_string();
        let md = request.metadata_mut();
        md.insert(
            "authorization",
            format!("Bearer {token}")
                .parse()
                .map_err(|_| fail("token is not a header value"))?,
        );
        md.insert(
            HOP_WAIT_KEY,
            wait_ms.parse().map_err(|_| fail("wait is not a header"))?,
        );
        let channel = self.channel(kas).map_err(Attempt::Fail)?;
        let accept_by = deadline.min(Instant::now() + ACCEPT_TIMEOUT);
        let mut client = KasInternalClient::new(channel);
        let call = client.call(request);
        let stream = match tokio::time::timeout_at(accept_by, call).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(e)) if e.code() == tonic::Code::Unavailable => {
                tracing::debug!(kas, error = %e.message(), "kas did not take the call; re-routing");
                if e.metadata().get(NO_TUNNEL_KEY).is_none() {
                    // Not its answer but the transport's: reconnect next time.
                    self.forget_channel(kas);
                }
                return Err(Attempt::Reroute);
            }
            Ok(Err(e)) => return Err(Attempt::Fail(e)),
            Err(_) => {
                tracing::warn!(
                    kas,
                    "kas did not accept the call within {ACCEPT_TIMEOUT:?}; re-routing"
                );
                self.forget_channel(kas);
                return Err(Attempt::Reroute);
            }
        };
        match Routed::start(connection_id, Body::Kas(stream)).await {
            Ok(r) => Ok(r),
            Err(e) if e.metadata().get(NO_TUNNEL_KEY).is_some() => Err(Attempt::Reroute),
            Err(e) => Err(Attempt::Fail(e)),
        }
    }
}

/// The `Unavailable` a kas answers when it holds no tunnel to the replica named.
pub(super) fn no_tunnel() -> Status {
    let mut md = tonic::metadata::MetadataMap::new();
    md.insert(
        NO_TUNNEL_KEY,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    Status::with_metadata(tonic::Code::Unavailable, NO_TUNNELS, md)
}

/// A response stream sent back to the kas that routed the call.
pub(super) type CallStream = Pin<Box<dyn Stream<Item = Result<TunnelMessage, Status>> + Send>>;

/// The receiving side of a kas → kas call: follows the instruction, never discovers.
#[derive(Clone)]
pub(super) struct Follower {
    pub(super) tunnels: Arc<Tunnels>,
    pub(super) registry: Registry,
    pub(super) me: String,
    pub(super) max_wait: Duration,
}

impl Follower {
    /// Whether replica `connection_id` (any when 0) of `agent_id` is registered to
    /// this kas. A registry failure reads as "not ours": the caller re-routes.
    async fn ours(&self, agent_id: i64, connection_id: i64) -> bool {
        match self.registry.connections_by_agent(agent_id).await {
            Ok(conns) => conns.iter().any(|c| {
                c.kas.0 == self.me && (connection_id == 0 || c.connection_id == connection_id)
            }),
            Err(e) => {
                tracing::warn!(error = %e, "registry lookup failed; answering no tunnel");
                false
            }
        }
    }

    /// How long to wait for a tunnel: this kas's `max_wait`, or less if the caller
    /// said so.
    pub(super) fn wait(&self, metadata: &tonic::metadata::MetadataMap) -> Duration {
        metadata
            .get(HOP_WAIT_KEY)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map_or(self.max_wait, |ms| {
                self.max_wait.min(Duration::from_millis(ms))
            })
    }

    /// Whether to take the call at all: a tunnel is held here, or the replica is
    /// registered here (its tunnels may be busy or not open yet).
    pub(super) async fn accepts(&self, agent_id: i64, connection_id: i64) -> bool {
        self.tunnels.idle(agent_id, connection_id) > 0 || self.ours(agent_id, connection_id).await
    }

    /// A tunnel to the replica with the call sent down it, waiting (until `wait`
    /// passes) for one while the replica is registered here; else [`no_tunnel`].
    pub(super) async fn open(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        payload: Vec<u8>,
        wait: Duration,
    ) -> Result<ResponseStream, Status> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(r) = self
                .tunnels
                .open(agent_id, connection_id, method, payload.clone())
                .await
            {
                return Ok(r);
            }
            if !self.ours(agent_id, connection_id).await {
                return Err(no_tunnel());
            }
            tokio::select! {
                _ = self.tunnels.wait_idle(agent_id, connection_id, 1) => {}
                _ = tokio::time::sleep_until(deadline) => return Err(no_tunnel()),
            }
        }
    }

    /// `KasInternal.Call`: accepted (response headers sent) at once when this kas
    /// may serve the replica, then agentk's response, or a marked `Unavailable` if no
    /// tunnel came in time.
    pub(super) async fn call(
        &self,
        request: TunnelCallRequest,
        wait: Duration,
    ) -> Result<CallStream, Status> {
        if !self.accepts(request.agent_id, request.connection_id).await {
            return Err(no_tunnel());
        }
        enum State {
            Start(Follower, TunnelCallRequest, Duration),
            Forward(ResponseStream),
            Done,
        }
        let stream = futures_util::stream::unfold(
            State::Start(self.clone(), request, wait),
            |state| async move {
                let mut response = match state {
                    State::Done => return None,
                    State::Forward(r) => r,
                    State::Start(this, req, wait) => {
                        match this
                            .open(
                                req.agent_id,
                                req.connection_id,
                                &req.method,
                                req.payload,
                                wait,
                            )
                            .await
                        {
                            Ok(r) => r,
                            Err(e) => return Some((Err(e), State::Done)),
                        }
                    }
                };
                match response.message().await {
                    Ok(Some(payload)) => {
                        Some((Ok(TunnelMessage { payload }), State::Forward(response)))
                    }
                    Ok(None) => None,
                    Err(e) => Some((Err(e), State::Done)),
                }
            },
        );
        Ok(Box::pin(stream))
    }
}
