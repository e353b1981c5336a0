//! The receiving side of a kas → kas call ([`Follower`]): it follows the calling
//! kas's instruction for a replica connected here, and never discovers.

use std::sync::Arc;
use std::time::Duration;

use podgate_registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::super::tunnel::{Frame, Meta, TunnelCall, Tunnels};
use super::{HOP_WAIT_KEY, NO_TUNNEL_KEY, NO_TUNNELS};
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::{Header, Message, Trailer};
use podgate_agent::proto::{
    CallRequest, CallResponse, CallStart, TunnelReady, call_request, call_response,
};

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
pub(crate) type CallStream = ReceiverStream<Result<CallResponse, Status>>;

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

    /// A tunnel to the replica carrying the call, waiting (until `wait` passes) for
    /// one while the replica is registered here; else [`no_tunnel`]. `Unimplemented`
    /// when the tunnels held do not serve `method`.
    pub(crate) async fn open(
        &self,
        agent_id: i64,
        connection_id: i64,
        method: &str,
        meta: &Meta,
        wait: Duration,
    ) -> Result<TunnelCall, Status> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(c) = self
                .tunnels
                .call(agent_id, connection_id, method, meta)
                .await?
            {
                return Ok(c);
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

    /// `KasInternal.Call`: its first message names the call; accepted (response
    /// headers sent) at once when this kas may serve the replica; then
    /// `tunnel_ready` once a tunnel carries it, or a marked `Unavailable` if none
    /// came in time; then the call's frames both ways.
    pub(crate) async fn call(
        &self,
        mut requests: Streaming<CallRequest>,
        wait: Duration,
    ) -> Result<CallStream, Status> {
        let start = match requests.message().await? {
            Some(CallRequest {
                msg: Some(call_request::Msg::Start(s)),
            }) => s,
            _ => return Err(Status::invalid_argument("a call starts with its CallStart")),
        };
        if !self.accepts(start.agent_id, start.connection_id) {
            return Err(no_tunnel());
        }
        let (tx, rx) = mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = this.carry(start, requests, wait, &tx) => {}
                // The calling kas went away: dropping the call cancels it at agentk.
                () = tx.closed() => {}
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    /// Carry one kas → kas call on a tunnel here, until it ends.
    async fn carry(
        &self,
        start: CallStart,
        mut requests: Streaming<CallRequest>,
        wait: Duration,
        out: &mpsc::Sender<Result<CallResponse, Status>>,
    ) {
        let respond = |msg| CallResponse { msg: Some(msg) };
        let mut call = match self
            .open(
                start.agent_id,
                start.connection_id,
                &start.method,
                &start.meta,
                wait,
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                let _ = out.send(Err(e)).await;
                return;
            }
        };
        let ready = respond(call_response::Msg::TunnelReady(TunnelReady {
            connection_id: call.connection_id().unwrap_or(0),
        }));
        if out.send(Ok(ready)).await.is_err() {
            return;
        }
        let mut sending = true;
        loop {
            tokio::select! {
                r = requests.message(), if sending => {
                    // A tunnel that ended refuses what is sent down it; the response
                    // side (`call.next()`) says how the call ended.
                    let sent = match r {
                        Ok(Some(CallRequest { msg: Some(call_request::Msg::Message(m)) })) => {
                            let _ = call.send(m.data).await;
                            Ok(())
                        }
                        Ok(Some(CallRequest { msg: Some(call_request::Msg::CloseSend(_)) })) => {
                            sending = false;
                            let _ = call.close_send().await;
                            Ok(())
                        }
                        Ok(Some(_)) => Err(Status::invalid_argument(
                            "a call's later messages are request messages and a close",
                        )),
                        // The calling kas went away mid-request: cancel the call.
                        Ok(None) | Err(_) => return,
                    };
                    if let Err(e) = sent {
                        let _ = out.send(Err(e)).await;
                        return;
                    }
                }
                f = call.next() => {
                    let item = match f {
                        Ok(Some(Frame::Header(meta))) => {
                            Ok(respond(call_response::Msg::Header(Header { meta })))
                        }
                        Ok(Some(Frame::Message(data))) => {
                            Ok(respond(call_response::Msg::Message(Message { data })))
                        }
                        Ok(Some(Frame::Trailer(meta))) => {
                            Ok(respond(call_response::Msg::Trailer(Trailer { meta })))
                        }
                        Ok(None) => return,
                        Err(e) => Err(e),
                    };
                    let end = item.is_err();
                    if out.send(item).await.is_err() || end {
                        return;
                    }
                }
            }
        }
    }
}
