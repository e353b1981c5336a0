//! Reverse tunnels on the kas side, GitLab's `ReverseTunnel/Connect`: agentk opens
//! `Connect` streams, sends its `Descriptor` (the services and methods it serves),
//! and leaves them idle; kas takes one that serves a call's method to carry that one
//! call ([`TunnelCall`], `call.rs`), then the tunnel ends (agentk replaces it).
//!
//! GitLab's kas: `HandleTunnel` and `FindTunnel` in
//! `internal/module/reverse_tunnel/tunnel/registry_stripe.go`
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/tunnel/registry_stripe.go>):
//! the first frame must be the `Descriptor` (else `InvalidArgument`, "Invalid oneof
//! value type"), and a call takes a tunnel whose descriptor
//! `SupportsServiceAndMethod`. Where GitLab's kas would wait for such a tunnel until
//! the call's deadline, this kas answers `Unimplemented` when it holds idle tunnels
//! to the agent and none serves the method: an older agent that does not serve it
//! gets a clear answer at once.
//!
//! GitLab's `Connect` carries no connection id. podgate's agentk names its
//! connection in the [`CONNECTION_ID_KEY`] metadata; such a tunnel is held only by
//! the kas that holds its connection (its configuration stream): calls for a
//! replica are routed by the registry to that kas, so a tunnel that lands elsewhere
//! is refused with `FailedPrecondition`, counted, and agentk opens it again. A
//! tunnel without one (a GitLab agentk) is always accepted, and serves calls for
//! any replica of its agent.
//!
//! A tunnel's arrival wakes only the calls waiting for that agent, and at most
//! `max_idle_tunnels_per_agent` idle tunnels are held per agent: more are refused with
//! `ResourceExhausted` (agentk retries with back-off), so a misbehaving agent cannot
//! hold a stream per request it never sends.

mod call;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::agent_auth::AgentAuth;
use super::metrics::KasMetrics;
use call::{Busy, CallState, Down, DownFrame};
pub use call::{Frame, Meta, NO_TUNNEL_KEY, TunnelCall};
use podgate_agent::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::reverse_tunnel_server::ReverseTunnel;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::{
    ConnectRequest, ConnectResponse, RequestInfo, connect_request, connect_response,
};
use podgate_agent::tunnel::{CONNECTION_ID_KEY, supports, validate_descriptor};

/// An idle tunnel to one agentk replica.
struct Idle {
    /// The connection it named (`None`: any replica).
    connection_id: Option<i64>,
    descriptor: AgentDescriptor,
    down: Down,
    up: Streaming<ConnectRequest>,
}

impl Idle {
    /// Whether it may carry a call for replica `connection_id` (any when 0).
    fn for_replica(&self, connection_id: i64) -> bool {
        connection_id == 0 || self.connection_id == Some(connection_id)
    }
}

/// This kas's idle tunnels, by agent.
pub struct Tunnels {
    idle: Mutex<HashMap<i64, VecDeque<Idle>>>,
    /// Per agent, what its waiters wait on, and how many wait.
    waiters: Mutex<HashMap<i64, (Arc<Notify>, usize)>>,
    max_idle_per_agent: usize,
    metrics: Arc<KasMetrics>,
}

/// One waiter for an agent's tunnels; the agent's entry goes with its last waiter.
struct Waiter<'a> {
    tunnels: &'a Tunnels,
    agent_id: i64,
    notify: Arc<Notify>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut w = self.tunnels.waiters();
        if let Some((_, n)) = w.get_mut(&self.agent_id) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.agent_id);
            }
        }
    }
}

impl Tunnels {
    /// No tunnels yet; at most `max_idle_per_agent` idle ones per agent; counted in
    /// `metrics`.
    pub fn new(metrics: Arc<KasMetrics>, max_idle_per_agent: usize) -> Tunnels {
        Tunnels {
            idle: Mutex::default(),
            waiters: Mutex::default(),
            max_idle_per_agent: max_idle_per_agent.max(1),
            metrics,
        }
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<i64, (Arc<Notify>, usize)>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn waiter(&self, agent_id: i64) -> Waiter<'_> {
        let mut w = self.waiters();
        let entry = w
            .entry(agent_id)
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiter {
            tunnels: self,
            agent_id,
            notify: entry.0.clone(),
        }
    }

    /// Wake the calls waiting for `agent_id`'s tunnels (only those).
    fn arrived(&self, agent_id: i64) {
        if let Some((n, _)) = self.waiters().get(&agent_id) {
            n.notify_waiters();
        }
    }

    /// Agents some call is waiting for a tunnel of (for tests and metrics).
    pub fn agents_waited_for(&self) -> usize {
        self.waiters().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, VecDeque<Idle>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep the tunnels of `q` for which `keep` holds; the idle gauge follows.
    fn retain(&self, q: &mut VecDeque<Idle>, keep: impl FnMut(&Idle) -> bool) {
        let before = q.len();
        q.retain(keep);
        self.metrics.tunnels_idle.sub((before - q.len()) as i64);
    }

    /// Take a new idle tunnel of `agent_id` in, and wake whoever waits for one; a
    /// tunnel over the agent's limit (`max_idle_per_agent`, counted once the ones
    /// agentk closed while idle are gone) is refused. The other half is
    /// [`Tunnels::take`], when a call takes a tunnel out.
    fn admit(&self, agent_id: i64, tunnel: Idle) -> Result<(), Status> {
        {
            let mut idle = self.lock();
            let q = idle.entry(agent_id).or_default();
            if q.len() >= self.max_idle_per_agent {
                self.retain(q, |t| !t.down.is_closed());
            }
            if q.len() >= self.max_idle_per_agent {
                self.metrics.tunnels_refused.inc();
                tracing::debug!(
                    agent_id,
                    connection_id = ?tunnel.connection_id,
                    "refusing a tunnel: the agent already holds the most idle tunnels allowed"
                );
                return Err(Status::resource_exhausted(
                    "too many idle tunnels for this agent",
                ));
            }
            q.push_back(tunnel);
        }
        self.metrics.tunnels_idle.inc();
        self.arrived(agent_id);
        Ok(())
    }

    /// Idle tunnels held for `agent_id` (replica `connection_id`, or any when 0).
    pub fn idle(&self, agent_id: i64, connection_id: i64) -> usize {
        self.lock().get(&agent_id).map_or(0, |q| {
            q.iter().filter(|t| t.for_replica(connection_id)).count()
        })
    }

    /// An idle tunnel for replica `connection_id` (any when 0) whose descriptor has
    /// `method`: `Ok(None)` when none is idle; `Unimplemented` when some are and
    /// none serves the method.
    fn take(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
    ) -> Result<Option<Idle>, Status> {
        let mut idle = self.lock();
        let Some(q) = idle.get_mut(&agent_id) else {
            return Ok(None);
        };
        // Tunnels whose Connect call agentk ended are dropped first.
        self.retain(q, |t| !t.down.is_closed());
        let mut for_replica = false;
        let mut found = None;
        for (i, t) in q.iter().enumerate() {
            if !t.for_replica(connection_id) {
                continue;
            }
            for_replica = true;
            if supports(&t.descriptor, method) {
                found = Some(i);
                break;
            }
        }
        let taken = found.and_then(|i| q.remove(i));
        if taken.is_some() {
            self.metrics.tunnels_idle.dec();
        }
        if q.is_empty() {
            idle.remove(&agent_id);
        }
        match taken {
            Some(t) => Ok(Some(t)),
            None if for_replica => Err(Status::unimplemented(format!(
                "the agent does not serve {method}: upgrade the agent to a version that does"
            ))),
            None => Ok(None),
        }
    }

    /// Drop the idle tunnels of replica `connection_id` of `agent_id` (its
    /// configuration stream ended: the replica is gone).
    pub fn forget(&self, agent_id: i64, connection_id: i64) {
        let mut idle = self.lock();
        if let Some(q) = idle.get_mut(&agent_id) {
            self.retain(q, |t| t.connection_id != Some(connection_id));
            if q.is_empty() {
                idle.remove(&agent_id);
            }
        }
    }

    /// Start a call of `method` (`/<service>/<method>`) with request metadata
    /// `meta` on agent `agent_id` (replica `connection_id`, or any when 0) through an
    /// idle tunnel that serves it: `Ok(None)` when this kas holds no usable idle
    /// tunnel to it, `Unimplemented` when it holds some and none serves `method`.
    /// A tunnel that ended while idle is skipped.
    pub async fn call(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        meta: &Meta,
    ) -> Result<Option<TunnelCall>, Status> {
        while let Some(t) = self.take(agent_id, connection_id, method)? {
            let info = ConnectResponse {
                msg: Some(connect_response::Msg::RequestInfo(RequestInfo {
                    method_name: method.to_owned(),
                    meta: meta.clone(),
                })),
            };
            // Busy from the moment agentk has the call.
            let busy = Busy::new(self.metrics.clone());
            if t.down.send(Box::new(Ok(info))).await.is_err() {
                continue;
            }
            return Ok(Some(TunnelCall {
                connection_id: t.connection_id,
                down: t.down,
                up: t.up,
                state: CallState::Waiting,
                _busy: busy,
            }));
        }
        Ok(None)
    }

    /// Wait until at least `n` idle tunnels to `agent_id` (replica `connection_id`, or
    /// any when 0) are held.
    pub async fn wait_idle(&self, agent_id: i64, connection_id: i64, n: usize) {
        let waiter = self.waiter(agent_id);
        loop {
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so an arrival in between is not missed.
            notified.as_mut().enable();
            if self.idle(agent_id, connection_id) >= n {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) struct TunnelService {
    pub(crate) tunnels: Arc<Tunnels>,
    pub(crate) auth: Arc<AgentAuth>,
    /// Which connections are this kas's (their configuration streams are open here).
    pub(crate) registry: podgate_registry::Registry,
    /// This kas's internal address, as its registrations name it.
    pub(crate) me: String,
}

/// The connection a `Connect` call names in its metadata, if any.
fn named_connection(md: &tonic::metadata::MetadataMap) -> Result<Option<i64>, Status> {
    let Some(v) = md.get(CONNECTION_ID_KEY) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(Some)
        .ok_or_else(|| {
            Status::invalid_argument(format!("{CONNECTION_ID_KEY} is not a connection id"))
        })
}

/// The tunnel's first frame, which must be a valid `Descriptor`.
async fn read_descriptor(up: &mut Streaming<ConnectRequest>) -> Result<AgentDescriptor, Status> {
    let first = up.message().await?;
    let msg = first.and_then(|m| m.msg);
    let Some(connect_request::Msg::Descriptor(d)) = msg else {
        let what = match msg {
            None => "none",
            Some(connect_request::Msg::Header(_)) => "Header",
            Some(connect_request::Msg::Message(_)) => "Message",
            Some(connect_request::Msg::Trailer(_)) => "Trailer",
            Some(connect_request::Msg::Error(_)) => "Error",
            Some(connect_request::Msg::Descriptor(_)) => "Descriptor",
        };
        return Err(Status::invalid_argument(format!(
            "Invalid oneof value type: {what} (a tunnel starts with its Descriptor)"
        )));
    };
    let descriptor = d.agent_descriptor.ok_or_else(|| {
        Status::invalid_argument("invalid Descriptor.AgentDescriptor: value is required")
    })?;
    validate_descriptor(&descriptor)
        .map_err(|e| Status::invalid_argument(format!("invalid Descriptor: {e}")))?;
    Ok(descriptor)
}

#[tonic::async_trait]
impl ReverseTunnel for TunnelService {
    type ConnectStream = futures_util::stream::Map<
        ReceiverStream<DownFrame>,
        fn(DownFrame) -> Result<ConnectResponse, Status>,
    >;

    async fn connect(
        &self,
        request: Request<Streaming<ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let who = self.auth.authenticate(request.metadata()).await?;
        let connection_id = named_connection(request.metadata())?;
        let mut up = request.into_inner();
        let descriptor = read_descriptor(&mut up).await?;
        // Calls for a replica are routed to the kas the registry names for its
        // connection: a tunnel naming it elsewhere would never be used.
        if let Some(connection_id) = connection_id {
            let ours = self
                .registry
                .owned_by_agent(who.agent_id)
                .iter()
                .any(|c| c.connection_id == connection_id && c.kas.0 == self.me);
            if !ours {
                self.tunnels.metrics.tunnels_misplaced.inc();
                tracing::debug!(
                    agent_id = who.agent_id,
                    connection_id,
                    "refusing a tunnel for a connection this kas does not hold"
                );
                return Err(Status::failed_precondition(
                    "this kas does not hold the agent connection the tunnel names: open tunnels on the kas that has its configuration stream",
                ));
            }
        }
        let (down, rx) = mpsc::channel(4);
        let tunnel = Idle {
            connection_id,
            descriptor,
            down,
            up,
        };
        self.tunnels.admit(who.agent_id, tunnel)?;
        let unbox: fn(DownFrame) -> Result<ConnectResponse, Status> = |frame| *frame;
        Ok(Response::new(futures_util::StreamExt::map(
            ReceiverStream::new(rx),
            unbox,
        )))
    }
}
