//! A routed call's response ([`Routed`]): from a tunnel this kas holds, or from the
//! kas → kas stream of the kas that holds one.

use tonic::{Status, Streaming};

use super::NO_TUNNEL_KEY;
use crate::tunnel::{ResponseStream, unary_message};
use podgate_agent::proto::TunnelMessage;

/// A routed call's response: its messages, then its status. Dropping it cancels the
/// call at agentk (the tunnel, or the kas → kas stream that holds it, ends).
pub struct Routed {
    connection_id: i64,
    first: Option<Vec<u8>>,
    body: Body,
}

/// Where the rest of a response comes from.
pub(super) enum Body {
    /// A tunnel this kas holds.
    Local(ResponseStream),
    /// Another kas's `KasInternal.Call` stream.
    Kas(Streaming<TunnelMessage>),
    /// Nowhere: the response has ended.
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
        let first = self.message().await?;
        let more = first.is_some() && self.message().await?.is_some();
        unary_message(first, more)
    }

    /// A response whose first message has been read (`None`: it ended OK at once).
    pub(super) async fn start(connection_id: i64, mut body: Body) -> Result<Routed, Status> {
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
