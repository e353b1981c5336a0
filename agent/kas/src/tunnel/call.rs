//! One call carried by a reverse tunnel this kas holds ([`TunnelCall`]): kas has sent
//! `RequestInfo` down it; the caller sends request `Message`s and `CloseSend`, and
//! reads agentk's `Header`, `Message`s and `Trailer`, ended by the tunnel's end (OK)
//! or an `Error` (that status).
//!
//! GitLab's kas side of a call: `ForwardStream` in
//! `internal/module/reverse_tunnel/tunnel/impl.go`
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/tunnel/impl.go>):
//! an `Error` frame becomes the caller's status and the tunnel is read to its end;
//! the caller going away aborts the tunnel with an error, which cancels the call at
//! agentk (`internal/module/reverse_tunnel/agent/connection.go`).

use std::collections::HashMap;
use std::sync::Arc;

use prost::Message as _;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::super::metrics::KasMetrics;
use podgate_agent::proto::gitlab::agent::prototool::Values;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::{
    CloseSend, ConnectRequest, ConnectResponse, Message, connect_request, connect_response,
};

/// Metadata on the `Unavailable` a kas answers when it holds no tunnel to the
/// replica named, or when a tunnel broke before agentk answered (as opposed to an
/// `Unavailable` agentk sent): the caller re-routes the call (`crate::routing`).
pub const NO_TUNNEL_KEY: &str = "kas-hop-no-tunnel";

/// gRPC metadata in the tunnel's form.
pub type Meta = HashMap<String, Values>;

/// One frame of a call's response.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// agentk's response headers.
    Header(Meta),
    /// A response message (protobuf-encoded).
    Message(Vec<u8>),
    /// agentk's response trailers (the status follows: the end, or an `Error`).
    Trailer(Meta),
}

/// One frame kas sends down a tunnel, boxed: a channel allocates its first 32 slots
/// when it is made, and every idle tunnel has one (a slot of the frame itself would
/// be a few hundred bytes; a box is a pointer).
pub(super) type DownFrame = Box<Result<ConnectResponse, Status>>;

/// The sending half of a tunnel, as kas holds it.
pub(super) type Down = mpsc::Sender<DownFrame>;

/// Counts a tunnel as busy while a call uses it.
pub(super) struct Busy(Arc<KasMetrics>);

impl Busy {
    pub(super) fn new(metrics: Arc<KasMetrics>) -> Busy {
        metrics.tunnels_busy.inc();
        Busy(metrics)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.tunnels_busy.dec();
    }
}

/// Where a call is in agentk's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CallState {
    /// Nothing came up yet. A tunnel that breaks now was dead while idle: the call
    /// may be tried on another.
    Waiting,
    /// agentk answered (a header or a message came up); no trailer yet, so the
    /// tunnel ending now breaks the call.
    Answering,
    /// agentk's trailer came up: the tunnel's end is the call's OK.
    Trailed,
    /// Ended (OK, agentk's error, or the tunnel broke): nothing more to read, and
    /// nothing to abort when the call is dropped.
    Done,
}

/// A call on a tunnel this kas holds. Dropping it before its end aborts the tunnel
/// with `Cancelled`, which cancels the call at agentk.
pub struct TunnelCall {
    pub(super) connection_id: Option<i64>,
    pub(super) down: Down,
    pub(super) up: Streaming<ConnectRequest>,
    pub(super) state: CallState,
    pub(super) _busy: Busy,
}

/// A `google.rpc.Status` from agentk's `Error` frame as the caller's status; its
/// details travel as tonic's details (the encoded `google.rpc.Status`).
fn status_from_proto(s: podgate_agent::proto::google::rpc::Status) -> Status {
    let code = tonic::Code::from(s.code);
    if s.details.is_empty() {
        Status::new(code, s.message)
    } else {
        let encoded = s.encode_to_vec();
        Status::with_details(code, s.message, encoded.into())
    }
}

impl TunnelCall {
    /// The `Unavailable` of a tunnel that broke: marked [`NO_TUNNEL_KEY`] when
    /// agentk had not answered yet, so the call may be tried on another tunnel.
    fn broken(&self, why: &str) -> Status {
        if self.state != CallState::Waiting {
            return Status::unavailable(why.to_owned());
        }
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert(
            NO_TUNNEL_KEY,
            tonic::metadata::MetadataValue::from_static("1"),
        );
        Status::with_metadata(tonic::Code::Unavailable, why.to_owned(), md)
    }

    /// The agentk connection the tunnel named (`None`: a GitLab agentk's tunnel).
    pub fn connection_id(&self) -> Option<i64> {
        self.connection_id
    }

    async fn down(&self, msg: connect_response::Msg) -> Result<(), Status> {
        self.down
            .send(Box::new(Ok(ConnectResponse { msg: Some(msg) })))
            .await
            .map_err(|_| Status::unavailable("the tunnel to the agent ended"))
    }

    /// Send one request message.
    pub async fn send(&self, data: Vec<u8>) -> Result<(), Status> {
        self.down(connect_response::Msg::Message(Message { data }))
            .await
    }

    /// End the request messages (half-close).
    pub async fn close_send(&self) -> Result<(), Status> {
        self.down(connect_response::Msg::CloseSend(CloseSend {}))
            .await
    }

    /// The next response frame; `None` once the call ended OK; `Err` for agentk's
    /// error, or the tunnel breaking.
    pub async fn next(&mut self) -> Result<Option<Frame>, Status> {
        if self.state == CallState::Done {
            return Ok(None);
        }
        let read = self.up.message().await;
        let (state, frame) = match read {
            Ok(Some(ConnectRequest { msg: Some(m) })) => self.frame(m),
            Ok(Some(ConnectRequest { msg: None })) => (
                CallState::Done,
                Err(Status::internal("agentk sent an empty tunnel frame")),
            ),
            Ok(None) if self.state == CallState::Trailed => (CallState::Done, Ok(None)),
            Ok(None) => (
                CallState::Done,
                Err(self.broken("the tunnel ended mid-call")),
            ),
            Err(e) => (
                CallState::Done,
                Err(self.broken(&format!("the tunnel broke mid-call: {}", e.message()))),
            ),
        };
        self.state = state;
        frame
    }

    /// The state a frame from agentk leads to, and what the caller reads of it.
    fn frame(&self, msg: connect_request::Msg) -> (CallState, Result<Option<Frame>, Status>) {
        let answering = match self.state {
            CallState::Trailed => CallState::Trailed,
            _ => CallState::Answering,
        };
        match msg {
            connect_request::Msg::Header(h) => (answering, Ok(Some(Frame::Header(h.meta)))),
            connect_request::Msg::Message(m) => (answering, Ok(Some(Frame::Message(m.data)))),
            connect_request::Msg::Trailer(t) => {
                (CallState::Trailed, Ok(Some(Frame::Trailer(t.meta))))
            }
            connect_request::Msg::Error(e) => (
                CallState::Done,
                Err(e.status.map_or_else(
                    || Status::internal("agentk sent an error without a status"),
                    status_from_proto,
                )),
            ),
            connect_request::Msg::Descriptor(_) => (
                CallState::Done,
                Err(Status::internal("agentk sent a descriptor mid-call")),
            ),
        }
    }
}

impl Drop for TunnelCall {
    fn drop(&mut self) {
        if self.state != CallState::Done {
            // The caller went away: abort the tunnel so agentk cancels the call. If
            // the frame cannot be queued, dropping `down` still ends the tunnel.
            let _ = self
                .down
                .try_send(Box::new(Err(Status::cancelled("the caller went away"))));
        }
    }
}
