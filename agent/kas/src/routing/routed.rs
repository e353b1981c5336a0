//! A routed call ([`Routed`]): on a tunnel this kas holds, or through the kas → kas
//! stream of the kas that holds one. The caller sends request messages and closes
//! its side, and reads the response's header, messages and trailer, then its status.

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::NO_TUNNEL_KEY;
use crate::tunnel::{Frame, Meta, TunnelCall};
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::{CloseSend, Message};
use podgate_agent::proto::{CallRequest, CallResponse, call_request, call_response};

/// A routed call. Dropping it before its end cancels the call at agentk (the tunnel,
/// or the kas → kas stream that holds it, ends).
pub struct Routed {
    connection_id: i64,
    /// A response message read ahead ([`Routed::start`]).
    first: Option<Vec<u8>>,
    header: Option<Meta>,
    trailer: Option<Meta>,
    body: Body,
    /// The path broke before agentk answered (a tunnel dead while idle): the call
    /// may be tried again.
    unanswered: bool,
}

/// Where the call goes.
pub(super) enum Body {
    /// A tunnel this kas holds.
    Local(TunnelCall),
    /// Another kas's `KasInternal.Call` stream.
    Kas {
        requests: mpsc::Sender<CallRequest>,
        responses: Streaming<CallResponse>,
    },
    /// Nowhere: the response has ended.
    Done,
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

impl Routed {
    pub(super) fn new(connection_id: i64, body: Body) -> Routed {
        Routed {
            connection_id,
            first: None,
            header: None,
            trailer: None,
            body,
            unanswered: false,
        }
    }

    /// A call on a tunnel this kas holds.
    pub fn local(call: TunnelCall) -> Routed {
        Routed::new(call.connection_id().unwrap_or(0), Body::Local(call))
    }

    /// The agentk replica answering (0: a tunnel that named none).
    pub fn connection_id(&self) -> i64 {
        self.connection_id
    }

    /// agentk's response headers, once read.
    pub fn header(&self) -> Option<&Meta> {
        self.header.as_ref()
    }

    /// agentk's response trailers, once read.
    pub fn trailer(&self) -> Option<&Meta> {
        self.trailer.as_ref()
    }

    /// Send one request message. A call whose far end has already ended takes it
    /// without error: the response says how the call ended (as GitLab's tunnel
    /// forwarding leaves the error to the receiving side,
    /// `internal/module/reverse_tunnel/agent/connection.go`).
    pub async fn send(&self, data: Vec<u8>) -> Result<(), Status> {
        self.request(call_request::Msg::Message(Message { data }))
            .await
    }

    /// End the request messages (half-close); as [`Routed::send`], no error when the
    /// far end has already ended.
    pub async fn close_send(&self) -> Result<(), Status> {
        self.request(call_request::Msg::CloseSend(CloseSend {}))
            .await
    }

    async fn request(&self, msg: call_request::Msg) -> Result<(), Status> {
        match &self.body {
            Body::Local(c) => {
                let _ = match msg {
                    call_request::Msg::Message(m) => c.send(m.data).await,
                    _ => c.close_send().await,
                };
                Ok(())
            }
            Body::Kas { requests, .. } => {
                let _ = requests.send(CallRequest { msg: Some(msg) }).await;
                Ok(())
            }
            Body::Done => Err(Status::failed_precondition("the call has ended")),
        }
    }

    /// The next response frame: `None` at the OK end; `Err` for a non-OK status
    /// (from agentk, or the path to it breaking). Header and trailer are also kept
    /// for [`Routed::header`] and [`Routed::trailer`].
    pub async fn next(&mut self) -> Result<Option<Frame>, Status> {
        if let Some(m) = self.first.take() {
            return Ok(Some(Frame::Message(m)));
        }
        let next = match &mut self.body {
            Body::Done => return Ok(None),
            Body::Local(c) => c.next().await,
            Body::Kas { responses, .. } => loop {
                match responses.message().await {
                    Ok(Some(CallResponse { msg: Some(m) })) => match m {
                        call_response::Msg::Header(h) => break Ok(Some(Frame::Header(h.meta))),
                        call_response::Msg::Message(m) => break Ok(Some(Frame::Message(m.data))),
                        call_response::Msg::Trailer(t) => {
                            break Ok(Some(Frame::Trailer(t.meta)));
                        }
                        call_response::Msg::TunnelReady(_) => {}
                    },
                    Ok(Some(CallResponse { msg: None })) => {}
                    Ok(None) => break Ok(None),
                    Err(e) => break Err(e),
                }
            },
        };
        match &next {
            Ok(Some(Frame::Header(h))) => self.header = Some(h.clone()),
            Ok(Some(Frame::Trailer(t))) => self.trailer = Some(t.clone()),
            Ok(Some(Frame::Message(_))) => {}
            Ok(None) => self.body = Body::Done,
            Err(e) => {
                self.unanswered = e.metadata().get(NO_TUNNEL_KEY).is_some();
                self.body = Body::Done;
            }
        }
        next.map_err(strip_hop_metadata)
    }

    /// The next response message (header and trailer are kept, not returned);
    /// `None` at the OK end; `Err` for a non-OK status.
    pub async fn message(&mut self) -> Result<Option<Vec<u8>>, Status> {
        loop {
            match self.next().await? {
                Some(Frame::Message(m)) => return Ok(Some(m)),
                Some(_) => {}
                None => return Ok(None),
            }
        }
    }

    /// A unary call's one message: `Err` for none, for more than one, or a non-OK
    /// status.
    pub async fn unary(mut self) -> Result<Vec<u8>, Status> {
        let first = self.message().await?;
        let more = first.is_some() && self.message().await?.is_some();
        unary_message(first, more)
    }

    /// Send `payload` as the only request message, close, and read ahead to the
    /// first response message (or the end): an error status comes back here.
    pub async fn start(self, payload: Vec<u8>) -> Result<Routed, Status> {
        self.try_start(payload).await.map_err(|(e, _)| e)
    }

    /// [`Routed::start`], and on error whether the path broke before agentk
    /// answered (so the call may be tried on another tunnel).
    pub(super) async fn try_start(mut self, payload: Vec<u8>) -> Result<Routed, (Status, bool)> {
        let started = async {
            self.send(payload).await?;
            self.close_send().await?;
            self.message().await
        };
        match started.await {
            Ok(first) => {
                self.first = first;
                Ok(self)
            }
            Err(e) => Err((e, self.unanswered)),
        }
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
