//! Reverse tunnels on the kas side. agentk opens `ReverseTunnel.Open` streams and
//! leaves them idle; kas takes one to send a request back to that agentk replica and
//! reads one response, then the tunnel ends (agentk replaces it).
//!
//! A tunnel is held only by the kas that holds its connection (the configuration
//! stream it names): calls are routed by the registry to that kas, so a tunnel that
//! lands elsewhere (a load balancer that spreads an agentk's streams) is refused
//! with `FailedPrecondition`, counted, and agentk opens it again. GitLab's kas
//! registers each tunnel in Redis instead; podgate's proxy keeps one agentk's
//! streams on one kas (consistent hashing on its token), so this is rare.
//!
//! A tunnel's arrival wakes only the calls waiting for that agent, and at most
//! `max_idle_tunnels_per_agent` idle tunnels are held per agent: more are refused with
//! `ResourceExhausted` (agentk retries with back-off), so a misbehaving agent cannot
//! hold a stream per request it never sends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::agent_auth::AgentAuth;
use super::metrics::KasMetrics;
use podgate_agent::proto::reverse_tunnel_server::ReverseTunnel;
use podgate_agent::proto::{TunnelDown, TunnelRequest, TunnelUp, tunnel_up};

/// An idle tunnel to one agentk replica.
struct Idle {
    connection_id: i64,
    down: mpsc::Sender<Result<TunnelDown, Status>>,
    up: Streaming<TunnelUp>,
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

    /// Idle tunnels held for `agent_id` (replica `connection_id`, or any when 0).
    pub fn idle(&self, agent_id: i64, connection_id: i64) -> usize {
        self.lock().get(&agent_id).map_or(0, |q| {
            q.iter()
                .filter(|t| connection_id == 0 || t.connection_id == connection_id)
                .count()
        })
    }

    fn take(&self, agent_id: i64, connection_id: i64) -> Option<Idle> {
        let mut idle = self.lock();
        let q = idle.get_mut(&agent_id)?;
        let mut found = None;
        while let Some(i) = q
            .iter()
            .position(|t| connection_id == 0 || t.connection_id == connection_id)
        {
            let Some(t) = q.remove(i) else { break };
            self.metrics.tunnels_idle.dec();
            // A tunnel whose Open call agentk ended is skipped.
            if !t.down.is_closed() {
                found = Some(t);
                break;
            }
        }
        if q.is_empty() {
            idle.remove(&agent_id);
        }
        found
    }

    /// Drop the idle tunnels of replica `connection_id` of `agent_id` (its
    /// configuration stream ended: the replica is gone).
    pub fn forget(&self, agent_id: i64, connection_id: i64) {
        let mut idle = self.lock();
        if let Some(q) = idle.get_mut(&agent_id) {
            let before = q.len();
            q.retain(|t| t.connection_id != connection_id);
            self.metrics.tunnels_idle.sub((before - q.len()) as i64);
            if q.is_empty() {
                idle.remove(&agent_id);
            }
        }
    }

    /// Send `method(payload)` to agent `agent_id` (replica `connection_id`, or any when
    /// 0) through an idle tunnel and return its response as it comes: `None` when this
    /// kas holds no usable tunnel to it. A tunnel that fails before any response comes
    /// up it (agentk went away while it was idle) is dropped and the next one tried.
    pub async fn open(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        payload: Vec<u8>,
    ) -> Option<ResponseStream> {
        while let Some(mut t) = self.take(agent_id, connection_id) {
            let request = TunnelDown {
                request: Some(TunnelRequest {
                    method: method.to_owned(),
                    payload: payload.clone(),
                }),
            };
            // Busy from the moment agentk has the request.
            let busy = Busy::new(self.metrics.clone());
            if t.down.send(Ok(request)).await.is_err() {
                continue;
            }
            let first = match t.up.message().await {
                Ok(Some(TunnelUp { msg: Some(m) })) => m,
                _ => continue,
            };
            return Some(ResponseStream {
                connection_id: t.connection_id,
                first: Some(first),
                up: t.up,
                _down: t.down,
                _busy: busy,
                done: false,
            });
        }
        None
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

#[tonic::async_trait]
impl ReverseTunnel for TunnelService {
    type OpenStream = ReceiverStream<Result<TunnelDown, Status>>;

    async fn open(
        &self,
        request: Request<Streaming<TunnelUp>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        let who = self.auth.authenticate(request.metadata()).await?;
        let mut up = request.into_inner();
        let connection_id = match up.message().await {
            Ok(Some(TunnelUp {
                msg: Some(tunnel_up::Msg::Hello(h)),
            })) => h.connection_id,
            _ => return Err(Status::invalid_argument("a tunnel starts with a hello")),
        };
        // Calls are routed to the kas the registry names for a connection: a tunnel
        // elsewhere would never be used (and would starve the kas that is named).
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
        let (down, rx) = mpsc::channel(1);
        {
            let mut idle = self.tunnels.lock();
            let q = idle.entry(who.agent_id).or_default();
            if q.len() >= self.tunnels.max_idle_per_agent {
                // Tunnels agentk closed while idle go first; then, if still full, no.
                let before = q.len();
                q.retain(|t| !t.down.is_closed());
                self.tunnels
                    .metrics
                    .tunnels_idle
                    .sub((before - q.len()) as i64);
            }
            if q.len() >= self.tunnels.max_idle_per_agent {
                self.tunnels.metrics.tunnels_refused.inc();
                tracing::debug!(
                    agent_id = who.agent_id,
                    connection_id,
                    "refusing a tunnel: the agent already holds the most idle tunnels allowed"
                );
                return Err(Status::resource_exhausted(
                    "too many idle tunnels for this agent",
                ));
            }
            q.push_back(Idle {
                connection_id,
                down,
                up,
            });
        }
        self.tunnels.metrics.tunnels_idle.inc();
        self.tunnels.arrived(who.agent_id);
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Counts a tunnel as busy while its response is being read.
struct Busy(Arc<KasMetrics>);

impl Busy {
    fn new(metrics: Arc<KasMetrics>) -> Busy {
        metrics.tunnels_busy.inc();
        Busy(metrics)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.tunnels_busy.dec();
    }
}

/// A unary call's response from its `first` message and whether `more` followed:
/// the message, or the error for none or more than one.
pub(crate) fn unary_message(first: Option<Vec<u8>>, more: bool) -> Result<Vec<u8>, Status> {
    match first {
        None => Err(Status::internal("agentk sent no response message")),
        Some(_) if more => Err(Status::internal(
            "agentk sent more than one response message",
        )),
        Some(message) => Ok(message),
    }
}

/// A response coming up a tunnel: its messages, then its status. Dropping it ends
/// the tunnel, which cancels the request at agentk.
pub struct ResponseStream {
    connection_id: i64,
    first: Option<tunnel_up::Msg>,
    up: Streaming<TunnelUp>,
    _down: mpsc::Sender<Result<TunnelDown, Status>>,
    _busy: Busy,
    done: bool,
}

impl ResponseStream {
    /// The agentk replica answering.
    pub fn connection_id(&self) -> i64 {
        self.connection_id
    }

    /// A unary call's one message: `Err` for none, for more than one, or a non-OK
    /// status.
    pub async fn unary(mut self) -> Result<Vec<u8>, Status> {
        let first = self.message().await?;
        let more = first.is_some() && self.message().await?.is_some();
        unary_message(first, more)
    }

    /// The next response message; `None` once agentk ended the response with OK;
    /// an error for any other status, or when the tunnel broke mid-response.
    pub async fn message(&mut self) -> Result<Option<Vec<u8>>, Status> {
        if self.done {
            return Ok(None);
        }
        let msg = match self.first.take() {
            Some(m) => m,
            None => match self.up.message().await {
                Ok(Some(TunnelUp { msg: Some(m) })) => m,
                Ok(_) => {
                    self.done = true;
                    return Err(Status::unavailable("the tunnel ended mid-response"));
                }
                Err(e) => {
                    self.done = true;
                    return Err(Status::unavailable(format!(
                        "the tunnel broke mid-response: {}",
                        e.message()
                    )));
                }
            },
        };
        match msg {
            tunnel_up::Msg::Message(m) => Ok(Some(m.payload)),
            tunnel_up::Msg::Status(s) => {
                self.done = true;
                if s.code == 0 {
                    Ok(None)
                } else {
                    Err(Status::new(tonic::Code::from(s.code), s.message))
                }
            }
            tunnel_up::Msg::Hello(_) => {
                self.done = true;
                Err(Status::internal("agentk sent a second hello"))
            }
        }
    }
}
