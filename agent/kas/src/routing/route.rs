//! The routing loop ([`AgentRouter::route`]) in its three phases, tried in turn
//! until one routes the call or the deadline passes: a tunnel here
//! ([`AgentRouter::local`]), the kas the registry names for the agent's replicas
//! ([`AgentRouter::holders`], [`AgentRouter::ask_holders`]), then a wait for the
//! next change that concerns the agent ([`AgentRouter::wait_for_change`]).

use podgate_registry::{AgentConnection, AgentEvent};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tonic::Status;

use super::super::metrics::Outcome;
use super::super::tunnel::Meta;
use super::{AgentRouter, Attempt, NOT_CONNECTED, Routed, Waiting};
use podgate_agent::proto::CallStart;

/// The call being routed.
pub(super) struct Call<'a> {
    pub(super) agent_id: i64,
    /// The replica asked for, or 0 for any.
    pub(super) connection_id: i64,
    pub(super) method: &'a str,
    pub(super) meta: &'a Meta,
}

/// What one routing of a call waits on, across its attempts.
struct Wait {
    deadline: Instant,
    /// Subscribed before the first look, so a connect in between is not missed.
    events: broadcast::Receiver<AgentEvent>,
    /// A closed event channel (the registry is gone) would wake the wait at once,
    /// forever: then only a tunnel here or the deadline ends it.
    events_open: bool,
    /// Whether this call has waited yet (counted once in `routing_waits`).
    waited: bool,
}

/// How a phase ended.
enum Phase<T> {
    /// Go on to the next phase with this.
    Next(T),
    /// Start over from the first phase (something changed).
    Again,
    /// The routing's end (boxed: a routed call is large, and ends a routing once).
    Done(Box<(Result<Routed, Status>, Outcome)>),
}

impl AgentRouter {
    /// Route `call`: phase by phase, until one routes it or the routing deadline
    /// (`max_wait`) passes: `DeadlineExceeded`.
    pub(super) async fn route(&self, call: &Call<'_>) -> (Result<Routed, Status>, Outcome) {
        let mut wait = Wait {
            deadline: Instant::now() + self.max_wait,
            events: self.registry.subscribe(),
            events_open: true,
            waited: false,
        };
        loop {
            if let Some(done) = self.local(call).await {
                return done;
            }
            let conns = match self.holders(call, &mut wait).await {
                Phase::Next(conns) => conns,
                Phase::Again => continue,
                Phase::Done(done) => return *done,
            };
            let held_here = match self.ask_holders(call, &conns, wait.deadline).await {
                Phase::Next(held_here) => held_here,
                Phase::Again => continue,
                Phase::Done(done) => return *done,
            };
            if Instant::now() >= wait.deadline {
                return self.timed_out();
            }
            if let Some(done) = self.wait_for_change(call, held_here, &mut wait).await {
                return done;
            }
        }
    }

    /// Phase 1: a tunnel this kas holds to the agent (the replica asked for, or
    /// any) whose descriptor has the method. `None`: no such tunnel here.
    async fn local(&self, call: &Call<'_>) -> Option<(Result<Routed, Status>, Outcome)> {
        match self
            .tunnels
            .call(call.agent_id, call.connection_id, call.method, call.meta)
            .await
        {
            Ok(Some(c)) => Some((Ok(Routed::local(c)), Outcome::Local)),
            Ok(None) => None,
            Err(e) => Some((Err(e), Outcome::Error)),
        }
    }

    /// Phase 2a: the agent's connections, as the registry lists them. Registered
    /// nowhere: wait for its connect event (no polling), or a tunnel here (a GitLab
    /// agentk's tunnels serve any replica), then start over.
    async fn holders(&self, call: &Call<'_>, wait: &mut Wait) -> Phase<Vec<AgentConnection>> {
        let conns = match self.registry.connections_by_agent(call.agent_id).await {
            Ok(c) => c,
            Err(e) => {
                self.metrics.registry_error("connections_by_agent");
                tracing::warn!(error = %e, "registry lookup failed; waiting for an event");
                Vec::new()
            }
        };
        if !conns.is_empty() {
            return Phase::Next(conns);
        }
        let _waiting = Waiting::new(&self.metrics, &mut wait.waited);
        tokio::select! {
            r = self.registry.wait_for_agent(call.agent_id, wait.deadline) => match r {
                Ok(c) => Phase::Next(c),
                Err(_) => Phase::Done(Box::new(self.timed_out())),
            },
            _ = self.tunnels.wait_idle(call.agent_id, call.connection_id, 1) => Phase::Again,
        }
    }

    /// Phase 2b: each other kas holding a replica asked for, once each (asked for
    /// any replica, a kas answers for all it holds), through its `KasInternal.Call`;
    /// a kas without a tunnel for it re-routes to the next. `Next(held_here)`: none
    /// routed it, and whether this kas holds one of those replicas itself.
    async fn ask_holders(
        &self,
        call: &Call<'_>,
        conns: &[AgentConnection],
        deadline: Instant,
    ) -> Phase<bool> {
        let mut held_here = false;
        let mut asked: Vec<&str> = Vec::new();
        for c in conns
            .iter()
            .filter(|c| call.connection_id == 0 || c.connection_id == call.connection_id)
        {
            if c.kas.0 == self.me {
                held_here = true;
                continue;
            }
            if asked.contains(&c.kas.0.as_str()) {
                continue;
            }
            asked.push(&c.kas.0);
            // The replica asked for, or any: that kas may hold tunnels naming no
            // connection (GitLab's agentk), which serve any replica.
            let instruction = CallStart {
                agent_id: call.agent_id,
                connection_id: call.connection_id,
                method: call.method.to_owned(),
                meta: call.meta.clone(),
            };
            match self.remote(&c.kas.0, instruction, deadline).await {
                Ok(r) => return Phase::Done(Box::new((Ok(r), Outcome::Kas))),
                Err(Attempt::Reroute) => self.metrics.reroutes.inc(),
                Err(Attempt::Fail(e)) => return Phase::Done(Box::new((Err(e), Outcome::Error))),
            }
        }
        Phase::Next(held_here)
    }

    /// Phase 3: nothing answered yet. Wait for the next change that concerns this
    /// agent (a tunnel to it here, its connects and disconnects anywhere, or a
    /// resync), never past the deadline; other agents' events wake nothing. `None`:
    /// something changed, start over.
    async fn wait_for_change(
        &self,
        call: &Call<'_>,
        held_here: bool,
        wait: &mut Wait,
    ) -> Option<(Result<Routed, Status>, Outcome)> {
        let _waiting = Waiting::new(&self.metrics, &mut wait.waited);
        let tunnel_here = held_here || call.connection_id == 0;
        loop {
            tokio::select! {
                _ = self.tunnels.wait_idle(call.agent_id, call.connection_id, 1), if tunnel_here => return None,
                r = wait.events.recv(), if wait.events_open => match r {
                    Ok(AgentEvent::Connected { agent_id: a, .. }
                    | AgentEvent::Disconnected { agent_id: a, .. })
                        if a != call.agent_id => {}
                    Err(RecvError::Closed) => {
                        wait.events_open = false;
                        return None;
                    }
                    _ => return None,
                },
                _ = tokio::time::sleep_until(wait.deadline) => return Some(self.timed_out()),
            }
        }
    }

    fn timed_out(&self) -> (Result<Routed, Status>, Outcome) {
        self.metrics.routing_timeouts.inc();
        (
            Err(Status::deadline_exceeded(NOT_CONNECTED)),
            Outcome::Timeout,
        )
    }
}
