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
//! gitlab-org/cluster-integration/gitlab-agent, and its `doc/kas_request_routing.md`
//! (read in the mirror <https://github.com/pluralsh/kubernetes-agent>).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use podgate_registry::{AgentEvent, Registry};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

use super::metrics::{KasMetrics, Outcome};
use super::tunnel::{ResponseStream, Tunnels};
use podgate_agent::auth;
use podgate_agent::proto::kas_internal_client::KasInternalClient;
use podgate_agent::proto::{TunnelCallRequest, TunnelMessage};

mod follower;

pub(super) use follower::{CallStream, Follower};

/// Longest a kas → kas TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest another kas may take to accept or refuse a call (its response headers).
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// kas → kas channels kept at most; past it the least recently made one is dropped
/// (a kas that left the fleet is never asked again, so its channel would stay).
pub const MAX_CHANNELS: usize = 256;

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
    channels: Mutex<Channels>,
}

/// kas → kas channels by address, with the order they were made in (for eviction).
#[derive(Default)]
struct Channels {
    by_kas: HashMap<String, Channel>,
    made: std::collections::VecDeque<String>,
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
            // Nothing answered yet: wait for the next change that concerns this
            // agent (a tunnel to it here, its connects and disconnects anywhere, or a
            // resync), never past the deadline. Other agents' events wake nothing.
            let _waiting = Waiting::new(&self.metrics, &mut waited);
            loop {
                tokio::select! {
                    _ = self.tunnels.wait_idle(agent_id, connection_id, 1), if held_here => break,
                    r = events.recv(), if events_open => match r {
                        Ok(AgentEvent::Connected { agent_id: a, .. }
                        | AgentEvent::Disconnected { agent_id: a, .. })
                            if a != agent_id => {}
                        Err(RecvError::Closed) => {
                            events_open = false;
                            break;
                        }
                        _ => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => return timeout(&self.metrics),
                }
            }
        }
    }

    /// The channel to kas `kas` (made once, lazily connected, with timeouts). At
    /// most [`MAX_CHANNELS`] are kept.
    fn channel(&self, kas: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.by_kas.get(kas) {
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
        while channels.by_kas.len() >= MAX_CHANNELS {
            let Some(oldest) = channels.made.pop_front() else {
                break;
            };
            channels.by_kas.remove(&oldest);
        }
        channels.by_kas.insert(kas.to_owned(), c.clone());
        channels.made.push_back(kas.to_owned());
        Ok(c)
    }

    /// How many kas → kas channels are kept.
    pub fn channels(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_kas
            .len()
    }

    /// Forget the channel to a kas that failed (a new one reconnects from scratch).
    fn forget_channel(&self, kas: &str) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if channels.by_kas.remove(kas).is_some() {
            channels.made.retain(|k| k != kas);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Channels to kas instances that come and go are not kept forever.
    #[tokio::test]
    async fn kas_channels_are_bounded() {
        let metrics = Arc::new(KasMetrics::new());
        let registry = Registry::with_memory(
            podgate_registry::MemoryBackend::default(),
            podgate_registry::RegistryConfig::default(),
        )
        .await
        .unwrap();
        let router = AgentRouter::new(
            "127.0.0.1:1".into(),
            Arc::new(Tunnels::new(metrics.clone(), 4)),
            registry,
            vec![0; 32],
            Duration::from_secs(1),
            metrics,
        );
        for i in 0..(MAX_CHANNELS + 50) {
            router
                .channel(&format!("10.0.{}.{}:8155", i / 250, i % 250))
                .unwrap();
        }
        assert_eq!(router.channels(), MAX_CHANNELS);
        // The oldest went first; the newest is kept.
        let newest = format!(
            "10.0.{}.{}:8155",
            (MAX_CHANNELS + 49) / 250,
            (MAX_CHANNELS + 49) % 250
        );
        assert!(router.channels.lock().unwrap().by_kas.contains_key(&newest));
        assert!(
            !router
                .channels
                .lock()
                .unwrap()
                .by_kas
                .contains_key("10.0.0.0:8155")
        );
        router.forget_channel(&newest);
        assert_eq!(router.channels(), MAX_CHANNELS - 1);
    }
}
