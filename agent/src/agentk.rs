//! agentk's side of the reverse tunnels: keep `pool` idle `Open` streams open to
//! kas, answer the one request each carries with `handler`, and open a new one,
//! backing off while kas is unreachable.
//!
//! Built so far: the tunnel loop. The agentk program (kube-rs access, its
//! configuration stream, metrics) is still to come.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::Channel;

use crate::proto::reverse_tunnel_client::ReverseTunnelClient;
use crate::proto::{TunnelHello, TunnelResponse, TunnelUp, tunnel_up};

/// Answers one tunnelled request: `(method, payload)` → response payload.
pub trait Handler: Send + Sync + 'static {
    /// Handle one request.
    fn handle(
        &self,
        method: String,
        payload: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, Status>> + Send;
}

/// Serve tunnels for replica `connection_id` forever: `pool` at a time.
pub async fn serve_tunnels<H: Handler>(
    channel: Channel,
    token: String,
    connection_id: i64,
    pool: usize,
    handler: Arc<H>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..pool.max(1) {
        let (channel, token, handler) = (channel.clone(), token.clone(), handler.clone());
        tasks.spawn(async move {
            let mut backoff = Duration::from_millis(100);
            loop {
                match one_tunnel(channel.clone(), &token, connection_id, &*handler).await {
                    Ok(()) => backoff = Duration::from_millis(100),
                    Err(e) => {
                        tracing::debug!(error = %e, "tunnel failed; backing off");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Open one tunnel, wait for its request, answer it.
async fn one_tunnel<H: Handler>(
    channel: Channel,
    token: &str,
    connection_id: i64,
    handler: &H,
) -> Result<(), Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(TunnelUp {
        msg: Some(tunnel_up::Msg::Hello(TunnelHello { connection_id })),
    })
    .await
    .map_err(|_| Status::internal("tunnel closed"))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}")
            .parse()
            .map_err(|_| Status::internal("token is not a header value"))?,
    );
    let mut down = ReverseTunnelClient::new(channel)
        .open(request)
        .await?
        .into_inner();
    let Some(msg) = down.message().await? else {
        return Ok(());
    };
    let Some(req) = msg.request else {
        return Ok(());
    };
    let response = match handler.handle(req.method, req.payload).await {
        Ok(payload) => TunnelResponse {
            payload,
            code: 0,
            message: String::new(),
        },
        Err(s) => TunnelResponse {
            payload: Vec::new(),
            code: s.code() as i32,
            message: s.message().to_owned(),
        },
    };
    tx.send(TunnelUp {
        msg: Some(tunnel_up::Msg::Response(response)),
    })
    .await
    .map_err(|_| Status::internal("tunnel closed"))?;
    // The tunnel ends when kas drops it.
    while down.message().await.ok().flatten().is_some() {}
    Ok(())
}
