//! Routing a tunnelled call to an agent, the one loop every kas API uses (`GetPods`,
//! the Kubernetes API proxy's `MakeRequest`, the Graph API's `WatchGraph`, the
//! Workspaces' `WorkspaceRequest`). A call names its agent, the replica (a
//! connection id, or 0 for any), the method (`/<service>/<method>`) and its request
//! metadata ([`AgentRouter::call`]); it carries request messages and a close, and
//! response header, messages and trailer, then a status ([`Routed`]).
//! [`AgentRouter::open`] is the form for one request message.
//!
//! 1. a reverse tunnel this kas holds to the agent (the replica asked for, or any)
//!    whose descriptor has the method; if the tunnels held serve other methods only,
//!    `Unimplemented`;
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
//! `max_wait`. It accepts once it has decided to serve the call, and says
//! `tunnel_ready` once a tunnel carries it (a tunnel may take a while to free up);
//! if it finds no tunnel in time it ends the stream with `Unavailable` marked
//! [`NO_TUNNEL_KEY`], which the caller reads as "re-route", while an `Unavailable` from
//! agentk itself (its API server is unreachable) goes back to the client as it is.
//! After `tunnel_ready` the stream carries the call's frames both ways, so a call
//! through a second kas behaves as a local one.
//! The caller's remaining wait travels as [`HOP_WAIT_KEY`] so the other kas never waits
//! for a tunnel longer than the caller would. HTTP/2 keep-alive detects a kas that dies
//! mid-stream.
//!
//! GitLab's kas does the same in two steps (the routing kas tries the gateway kas
//! instances the registry lists; a gateway answers "tunnel ready" or "no tunnel") —
//! `internal/module/reverse_tunnel` and `internal/tool/grpctool` in
//! gitlab-org/cluster-integration/gitlab-agent, and its `doc/kas_request_routing.md`
//! (read in the mirror <https://github.com/pluralsh/kubernetes-agent>).
//!
//! Layout: the router and the kas → kas call here; the loop's three phases in
//! `route.rs`; the response it returns in `routed.rs`; the kas → kas channels in `channels.rs`; the receiving side of a
//! kas → kas call in `follower.rs`.

use std::sync::Arc;
use std::time::Duration;

use podgate_registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status};

use super::metrics::{KasMetrics, Outcome};
use super::tunnel::{Meta, Tunnels};
use podgate_agent::auth;
use podgate_agent::proto::kas_internal_client::KasInternalClient;
use podgate_agent::proto::{CallRequest, CallResponse, CallStart, call_request, call_response};

mod channels;
mod follower;
mod route;
mod routed;

pub use channels::MAX_CHANNELS;
pub(super) use follower::{CallStream, Follower};
pub use routed::Routed;

use channels::Channels;
use routed::Body;

/// Most tunnels [`AgentRouter::open`] tries when each breaks before agentk answers.
const MAX_ATTEMPTS: usize = 4;

/// Longest a kas → kas TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest another kas may take to accept or refuse a call (its response headers).
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// gRPC metadata on a kas → kas call: how long (ms) the caller still waits, so the
/// other kas waits no longer for a tunnel.
pub const HOP_WAIT_KEY: &str = "kas-hop-wait-ms";

pub use crate::tunnel::NO_TUNNEL_KEY;

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
    channels: Channels,
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
            channels: Channels::default(),
        }
    }

    /// Send `method(payload)` to agent `agent_id` (replica `connection_id`, or any
    /// when 0) as its only request message, without metadata, and return the call
    /// once its first response message (or its end) is in. A tunnel that breaks
    /// before agentk answers (it died while idle) is left, and the call sent again.
    pub async fn open(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        payload: Vec<u8>,
    ) -> Result<Routed, Status> {
        let mut timer = self.timer(method);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (result, outcome) = self
                .route(&route::Call {
                    agent_id,
                    connection_id,
                    method,
                    meta: &Meta::new(),
                })
                .await;
            timer.outcome = outcome;
            match result?.try_start(payload.clone()).await {
                Ok(r) => return Ok(r),
                // A tunnel that died while idle: the next one (routed afresh).
                Err((e, true)) if attempts < MAX_ATTEMPTS => {
                    tracing::debug!(error = %e.message(), "the tunnel broke before agentk answered; retrying");
                }
                Err((e, _)) => {
                    timer.outcome = Outcome::Error;
                    return Err(e);
                }
            }
        }
    }

    /// Start a call of `method` (`/<service>/<method>`) with request metadata `meta`
    /// on agent `agent_id` (replica `connection_id`, or any when 0): once a tunnel
    /// carries it, the call to send request messages on and read the response from.
    pub async fn call(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        meta: &Meta,
    ) -> Result<Routed, Status> {
        let mut timer = self.timer(method);
        let call = route::Call {
            agent_id,
            connection_id,
            method,
            meta,
        };
        let (result, outcome) = self.route(&call).await;
        timer.outcome = outcome;
        result
    }

    /// Times a call's routing, as cancelled unless told its outcome.
    fn timer<'a>(&'a self, method: &'a str) -> RouteTimer<'a> {
        RouteTimer {
            metrics: &self.metrics,
            // The method's own name: `GetPods` for `/podgate.kas.v1.AgentPods/GetPods`.
            method: method.rsplit('/').next().unwrap_or(method),
            started: std::time::Instant::now(),
            outcome: Outcome::Cancelled,
        }
    }

    /// How many kas → kas channels are kept.
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// The call through kas `kas`'s `KasInternal.Call`, once that kas says a tunnel
    /// carries it.
    async fn remote(
        &self,
        kas: &str,
        instruction: CallStart,
        deadline: Instant,
    ) -> Result<Routed, Attempt> {
        let fail = |what: &str| Attempt::Fail(Status::internal(what.to_owned()));
        let token = auth::mint_internal(&self.internal_secret, 30)
            .map_err(|_| fail("minting an internal token"))?;
        let (requests, rx) = mpsc::channel(4);
        requests
            .try_send(CallRequest {
                msg: Some(call_request::Msg::Start(instruction)),
            })
            .map_err(|_| fail("queueing the call"))?;
        let mut request = Request::new(ReceiverStream::new(rx));
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
        let channel = self.channels.get(kas).map_err(Attempt::Fail)?;
        let accept_by = deadline.min(Instant::now() + ACCEPT_TIMEOUT);
        let mut client = KasInternalClient::new(channel);
        let call = client.call(request);
        let mut responses = match tokio::time::timeout_at(accept_by, call).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(e)) if e.code() == tonic::Code::Unavailable => {
                tracing::debug!(kas, error = %e.message(), "kas did not take the call; re-routing");
                if e.metadata().get(NO_TUNNEL_KEY).is_none() {
                    // Not its answer but the transport's: reconnect next time.
                    self.channels.forget(kas);
                }
                return Err(Attempt::Reroute);
            }
            Ok(Err(e)) => return Err(Attempt::Fail(e)),
            Err(_) => {
                tracing::warn!(
                    kas,
                    "kas did not accept the call within {ACCEPT_TIMEOUT:?}; re-routing"
                );
                self.channels.forget(kas);
                return Err(Attempt::Reroute);
            }
        };
        match responses.message().await {
            Ok(Some(CallResponse {
                msg: Some(call_response::Msg::TunnelReady(ready)),
            })) => Ok(Routed::new(
                ready.connection_id,
                Body::Kas {
                    requests,
                    responses,
                },
            )),
            Ok(_) => Err(fail(
                "the kas carrying the call did not say it had a tunnel",
            )),
            Err(e) if e.metadata().get(NO_TUNNEL_KEY).is_some() => Err(Attempt::Reroute),
            Err(e) => Err(Attempt::Fail(e)),
        }
    }
}
