//! The receiving side of a kas → kas call ([`Follower`]): it follows the calling
//! kas's instruction for a replica connected here, and never discovers.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use podgate_registry::Registry;
use tokio::time::Instant;
use tonic::Status;

use super::super::tunnel::{ResponseStream, Tunnels};
use super::{HOP_WAIT_KEY, NO_TUNNEL_KEY, NO_TUNNELS};
use podgate_agent::proto::{TunnelCallRequest, TunnelMessage};

/// The `Unavailable` a kas answers when it holds no tunnel to the replica named.
pub(crate) fn no_tunnel() -> Status {
    let mut md = tonic::metadata::MetadataMap::new();
    md.insert(
        NO_TUNNEL_KEY,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    Status::with_metadata(tonic::Code::Unavailable, NO_TUNNELS, md)
}

/// A response stream sent back to the kas that routed the call.
pub(crate) type CallStream = Pin<Box<dyn Stream<Item = Result<TunnelMessage, Status>> + Send>>;

/// The receiving side of a kas → kas call: follows the instruction, never discovers.
#[derive(Clone)]
pub(crate) struct Follower {
    pub(crate) tunnels: Arc<Tunnels>,
    pub(crate) registry: Registry,
    pub(crate) me: String,
    pub(crate) max_wait: Duration,
}

impl Follower {
    /// Whether replica `connection_id` (any when 0) of `agent_id` is connected to
    /// this kas: its configuration stream is open here. Answered from this kas's own
    /// state, not the registry's backend: Redis being down must not turn away the
    /// calls for the agents this kas holds.
    fn ours(&self, agent_id: i64, connection_id: i64) -> bool {
        self.registry
            .owned_by_agent(agent_id)
            .iter()
            .any(|c| c.kas.0 == self.me && (connection_id == 0 || c.connection_id == connection_id))
    }

    /// How long to wait for a tunnel: this kas's `max_wait`, or less if the caller
    /// said so.
    pub(crate) fn wait(&self, metadata: &tonic::metadata::MetadataMap) -> Duration {
        metadata
            .get(HOP_WAIT_KEY)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map_or(self.max_wait, |ms| {
                self.max_wait.min(Duration::from_millis(ms))
            })
    }

    /// Whether to take the call at all: a tunnel is held here, or the replica is
    /// registered here (its tunnels may be busy or not open yet).
    pub(crate) fn accepts(&self, agent_id: i64, connection_id: i64) -> bool {
        self.tunnels.idle(agent_id, connection_id) > 0 || self.ours(agent_id, connection_id)
    }

    /// A tunnel to the replica with the call sent down it, waiting (until `wait`
    /// passes) for one while the replica is registered here; else [`no_tunnel`].
    pub(crate) async fn open(
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
            if !self.ours(agent_id, connection_id) {
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
    pub(crate) async fn call(
        &self,
        request: TunnelCallRequest,
        wait: Duration,
    ) -> Result<CallStream, Status> {
        if !self.accepts(request.agent_id, request.connection_id) {
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
