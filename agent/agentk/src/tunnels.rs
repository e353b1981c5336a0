//! agentk's side of the reverse tunnels: keep `idle` `Open` streams waiting at kas,
//! and when one carries a request, answer it with a [`Handler`] while a new idle
//! tunnel takes its place. So the idle pool stays full under load and the tunnels in
//! use grow with it, up to `max_busy`; past that, new requests wait for a free slot.
//! While kas cannot be reached, each slot backs off from 100 ms to 10 s.
//!
//! A response is a stream: zero or more messages, then a status. Each tunnel is its
//! own HTTP/2 stream, so a reader at kas that falls behind slows only the handler
//! writing to that tunnel. kas ending a tunnel mid-response cancels the handler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures_util::{Stream, StreamExt as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use super::metrics::AgentkMetrics;
use podgate_agent::proto::reverse_tunnel_client::ReverseTunnelClient;
use podgate_agent::proto::{
    TunnelDown, TunnelHello, TunnelMessage, TunnelStatus, TunnelUp, tunnel_up,
};

/// A tunnelled request's response: its messages; the stream's end is OK, an error
/// item ends it with that status.
pub type Responses = Pin<Box<dyn Stream<Item = Result<Vec<u8>, Status>> + Send>>;

/// Answers tunnelled requests: `(method, payload)` → response messages.
pub trait Handler: Send + Sync + 'static {
    /// Handle one request.
    fn handle(&self, method: String, payload: Vec<u8>) -> Responses;
}

/// A response of exactly one message (a unary RPC).
pub fn unary<F>(answer: F) -> Responses
where
    F: Future<Output = Result<Vec<u8>, Status>> + Send + 'static,
{
    Box::pin(futures_util::stream::once(answer))
}

/// How many tunnels a replica keeps.
#[derive(Clone)]
pub struct TunnelPool {
    /// Idle tunnels kept waiting at kas (at least 1; agentk uses 2 or more).
    pub idle: usize,
    /// Most requests answered at once.
    pub max_busy: usize,
    /// Where tunnel counts go.
    pub metrics: Arc<AgentkMetrics>,
}

impl TunnelPool {
    /// `idle` idle tunnels, up to 500 busy, counted in fresh metrics.
    pub fn new(idle: usize) -> TunnelPool {
        TunnelPool {
            idle,
            max_busy: 500,
            metrics: Arc::new(AgentkMetrics::new()),
        }
    }
}

/// Waits after a tunnel failed: 100 ms doubling to 10 s, again from 100 ms once a
/// tunnel worked.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(10))
    .with_factor(2.0)
    .without_max_times();

/// Serve tunnels for replica `connection_id` until dropped (cancelling it stops
/// every tunnel and the requests in flight).
pub async fn serve_tunnels<H: Handler>(
    channel: Channel,
    token: String,
    connection_id: i64,
    pool: TunnelPool,
    handler: Arc<H>,
) {
    let busy = Arc::new(Semaphore::new(pool.max_busy.max(1)));
    let (answering_tx, mut answering_rx) = mpsc::unbounded_channel();
    let mut slots = tokio::task::JoinSet::new();
    for _ in 0..pool.idle.max(1) {
        let (channel, token, handler) = (channel.clone(), token.clone(), handler.clone());
        let (busy, metrics, answering) = (busy.clone(), pool.metrics.clone(), answering_tx.clone());
        slots.spawn(async move {
            let mut delays = BACKOFF.build();
            loop {
                // A free slot first: past max_busy the idle pool stops refilling.
                let Ok(permit) = busy.clone().acquire_owned().await else {
                    return;
                };
                match wait_for_request(channel.clone(), &token, connection_id, &metrics).await {
                    Ok(Some(request)) => {
                        delays = BACKOFF.build();
                        let task = answer(request, handler.clone(), metrics.clone(), permit);
                        if answering.send(task).is_err() {
                            return;
                        }
                    }
                    Ok(None) => delays = BACKOFF.build(),
                    Err(e) => {
                        tracing::debug!(error = %e, "tunnel failed; backing off");
                        // Without a limit on attempts the sequence never ends.
                        let wait = delays.next().unwrap_or(Duration::from_secs(10));
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        });
    }
    drop(answering_tx);
    // Requests being answered live in this set, so dropping the future ends them.
    let mut answering = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            task = answering_rx.recv() => match task {
                Some(task) => {
                    answering.spawn(task);
                }
                None => break,
            },
            Some(_) = answering.join_next(), if !answering.is_empty() => {}
            None = slots.join_next() => break,
        }
    }
}

/// A request that came down a tunnel, with the tunnel to answer it on.
struct Incoming {
    method: String,
    payload: Vec<u8>,
    up: mpsc::Sender<TunnelUp>,
    down: Streaming<TunnelDown>,
}

/// Counts a tunnel as idle while it waits.
struct IdleGuard<'a>(&'a AgentkMetrics);

impl Drop for IdleGuard<'_> {
    fn drop(&mut self) {
        self.0.tunnels_idle.dec();
    }
}

/// Open one tunnel and wait for its request: `None` if kas ended it without one.
async fn wait_for_request(
    channel: Channel,
    token: &str,
    connection_id: i64,
    metrics: &AgentkMetrics,
) -> Result<Option<Incoming>, Status> {
    let (up, rx) = mpsc::channel(4);
    up.send(TunnelUp {
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
    let mut down = podgate_agent::gzip_client!(ReverseTunnelClient::new(channel))
        .open(request)
        .await?
        .into_inner();
    metrics.tunnels_idle.inc();
    let _idle = IdleGuard(metrics);
    let Some(msg) = down.message().await? else {
        return Ok(None);
    };
    let Some(req) = msg.request else {
        return Ok(None);
    };
    Ok(Some(Incoming {
        method: req.method,
        payload: req.payload,
        up,
        down,
    }))
}

/// Answer `incoming` with `handler`, message by message, then the status; stop if
/// kas ends the tunnel first.
async fn answer<H: Handler>(
    incoming: Incoming,
    handler: Arc<H>,
    metrics: Arc<AgentkMetrics>,
    _permit: OwnedSemaphorePermit,
) {
    let Incoming {
        method,
        payload,
        up,
        mut down,
    } = incoming;
    metrics.tunnels_busy.inc();
    let started = Instant::now();
    let mut responses = handler.handle(method.clone(), payload);
    let status = loop {
        tokio::select! {
            item = responses.next() => match item {
                Some(Ok(payload)) => {
                    let msg = TunnelUp { msg: Some(tunnel_up::Msg::Message(TunnelMessage { payload })) };
                    if up.send(msg).await.is_err() {
                        break Status::cancelled("kas ended the tunnel");
                    }
                }
                Some(Err(status)) => break status,
                None => break Status::ok(""),
            },
            // kas ended the tunnel (its caller went away): cancel the request.
            m = down.message() => {
                if !matches!(m, Ok(Some(_))) {
                    break Status::cancelled("kas ended the tunnel");
                }
            }
        }
    };
    drop(responses);
    metrics.answered(&method, status.code(), started.elapsed());
    if status.code() != tonic::Code::Cancelled {
        let _ = up
            .send(TunnelUp {
                msg: Some(tunnel_up::Msg::Status(TunnelStatus {
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                })),
            })
            .await;
        drop(up);
        // The tunnel ends when kas has read the status and drops it.
        while let Ok(Some(_)) = down.message().await {}
    }
    metrics.tunnels_busy.dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_waits_double_from_100_ms_to_10_s() {
        let waits: Vec<u64> = BACKOFF
            .build()
            .take(10)
            .map(|d| d.as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]
        );
    }
}
