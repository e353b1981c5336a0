//! agentk's side of GitLab's reverse tunnel (`ReverseTunnel/Connect`): keep `idle`
//! tunnels waiting at kas, each opened with the `Descriptor` of what the
//! [`Handler`] serves; when one carries a call (`RequestInfo`), answer it while a
//! new idle tunnel takes its place. So the idle pool stays full under load and the
//! tunnels in use grow with it, up to `max_busy`; past that, new calls wait for a free
//! slot. While kas cannot be reached, each slot backs off from 100 ms to 10 s.
//!
//! A call streams both ways: request `Message`s until kas's `CloseSend`, and the
//! answer as `Header`, `Message`s, `Trailer`, then the end (OK) or an `Error`
//! (`google.rpc.Status`), then agentk half-closes. GitLab's agentk does the same in
//! `internal/module/reverse_tunnel/agent/connection.go`
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/reverse_tunnel/agent/connection.go>).
//! Each tunnel is its own HTTP/2 stream, so a reader at kas that falls behind slows
//! only the handler writing to that tunnel. kas ending a tunnel mid-call (with an
//! error or not) cancels the handler.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt as _};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use super::metrics::AgentkMetrics;
use podgate_agent::proto::gitlab::agent::entity::KubernetesVersion;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::info::AgentDescriptor;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::reverse_tunnel_client::ReverseTunnelClient;
use podgate_agent::proto::gitlab::agent::reverse_tunnel::rpc::{
    ConnectRequest, ConnectResponse, Descriptor, Error as ErrorFrame, Header, Message, Trailer,
    connect_request, connect_response,
};
use podgate_agent::proto::google::rpc::Status as StatusProto;
use podgate_agent::tunnel::{CONNECTION_ID_KEY, agentk_descriptor, meta_to_values, values_to_meta};

/// A tunnelled call's response: its messages; the stream's end is OK, an error
/// item ends it with that status.
pub type Responses = Pin<Box<dyn Stream<Item = Result<Vec<u8>, Status>> + Send>>;

/// A tunnelled call's request messages, until kas closes its side.
pub type Requests = Pin<Box<dyn Stream<Item = Vec<u8>> + Send>>;

/// One call that came down a tunnel.
pub struct Call {
    /// `/<service>/<method>`.
    pub method: String,
    /// Its request metadata.
    pub metadata: MetadataMap,
    /// Its request messages.
    pub requests: Requests,
}

/// Answers tunnelled calls.
pub trait Handler: Send + Sync + 'static {
    /// What the tunnels advertise (the `Descriptor`): by default every method
    /// podgate's agentk serves ([`podgate_agent::tunnel::AGENTK_METHODS`]).
    fn descriptor(&self) -> AgentDescriptor {
        agentk_descriptor()
    }

    /// Whether `method` is served by [`Handler::call`] (streaming requests); else by
    /// [`Handler::handle`] with the call's first request message.
    fn streams_requests(&self, _method: &str) -> bool {
        false
    }

    /// Serve a call whose requests stream ([`Handler::streams_requests`]).
    fn call(&self, call: Call) -> Responses {
        let method = call.method;
        unary(async move {
            Err(Status::unimplemented(format!(
                "agentk does not serve {method}"
            )))
        })
    }

    /// Serve a call of `method` (`/<service>/<method>`) with one request message.
    fn handle(&self, method: String, payload: Vec<u8>) -> Responses;

    /// The cluster's version for `Register`, asked before every registration as
    /// GitLab's agentk asks the API server's `/version`; `None` when it cannot be
    /// read (by default: no cluster).
    fn kubernetes_version(&self) -> BoxFuture<'static, Option<KubernetesVersion>> {
        Box::pin(async { None })
    }
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

/// Waits after a tunnel failed: 100 ms doubling to 10 s, each up to twice as long
/// at random (jitter: an agent's idle tunnel slots, failing together when kas goes
/// away, do not retry in step), again from 100 ms once a tunnel worked.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_max_delay(Duration::from_secs(10))
    .with_factor(2.0)
    .with_jitter()
    .without_max_times();

/// Serve tunnels for replica `connection_id` (named to kas in
/// [`CONNECTION_ID_KEY`]; `None`: tunnels for any replica) until dropped
/// (cancelling it stops every tunnel and the calls in flight).
pub async fn serve_tunnels<H: Handler>(
    channel: Channel,
    token: String,
    connection_id: Option<i64>,
    pool: TunnelPool,
    handler: Arc<H>,
) {
    let busy = Arc::new(Semaphore::new(pool.max_busy.max(1)));
    let (answering_tx, mut answering_rx) = mpsc::unbounded_channel();
    let descriptor = handler.descriptor();
    let mut slots = tokio::task::JoinSet::new();
    for _ in 0..pool.idle.max(1) {
        let (channel, token, handler) = (channel.clone(), token.clone(), handler.clone());
        let (busy, metrics, answering) = (busy.clone(), pool.metrics.clone(), answering_tx.clone());
        let descriptor = descriptor.clone();
        slots.spawn(async move {
            let mut delays = BACKOFF.build();
            loop {
                // A free slot first: past max_busy the idle pool stops refilling.
                let Ok(permit) = busy.clone().acquire_owned().await else {
                    return;
                };
                let opened = Opening {
                    channel: channel.clone(),
                    token: &token,
                    connection_id,
                    descriptor: &descriptor,
                };
                match opened.wait_for_call(&metrics).await {
                    Ok(Some(call)) => {
                        delays = BACKOFF.build();
                        let task = answer(call, handler.clone(), metrics.clone(), permit);
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
    // Calls being answered live in this set, so dropping the future ends them.
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

/// What opening a tunnel needs.
struct Opening<'a> {
    channel: Channel,
    token: &'a str,
    connection_id: Option<i64>,
    descriptor: &'a AgentDescriptor,
}

/// A call that came down a tunnel, with the tunnel to answer it on.
struct Incoming {
    method: String,
    meta: MetadataMap,
    up: mpsc::Sender<ConnectRequest>,
    down: Streaming<ConnectResponse>,
}

/// Counts a tunnel as idle while it waits.
struct IdleGuard<'a>(&'a AgentkMetrics);

impl Drop for IdleGuard<'_> {
    fn drop(&mut self) {
        self.0.tunnels_idle.dec();
    }
}

fn frame(msg: connect_request::Msg) -> ConnectRequest {
    ConnectRequest { msg: Some(msg) }
}

impl Opening<'_> {
    /// Open one tunnel, send the descriptor, and wait for its call: `None` if kas
    /// ended it without one.
    async fn wait_for_call(self, metrics: &AgentkMetrics) -> Result<Option<Incoming>, Status> {
        let (up, rx) = mpsc::channel(4);
        let descriptor = Descriptor {
            agent_descriptor: Some(self.descriptor.clone()),
        };
        up.send(frame(connect_request::Msg::Descriptor(descriptor)))
            .await
            .map_err(|_| Status::internal("tunnel closed"))?;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let md = request.metadata_mut();
        md.insert(
            "authorization",
            format!("Bearer {}", self.token)
                .parse()
                .map_err(|_| Status::internal("token is not a header value"))?,
        );
        if let Some(id) = self.connection_id {
            md.insert(CONNECTION_ID_KEY, id.into());
        }
        let mut down = podgate_agent::gzip_client!(ReverseTunnelClient::new(self.channel))
            .connect(request)
            .await?
            .into_inner();
        metrics.tunnels_idle.inc();
        let _idle = IdleGuard(metrics);
        let Some(msg) = down.message().await? else {
            return Ok(None);
        };
        match msg.msg {
            Some(connect_response::Msg::RequestInfo(info)) => Ok(Some(Incoming {
                method: info.method_name,
                meta: values_to_meta(&info.meta),
                up,
                down,
            })),
            _ => Err(Status::internal(
                "kas sent a tunnel frame other than RequestInfo first",
            )),
        }
    }
}

/// A status as the tunnel's `google.rpc.Status` (its details kept when they are one).
fn status_proto(status: &Status) -> StatusProto {
    let details = StatusProto::decode(status.details())
        .map(|s| s.details)
        .unwrap_or_default();
    StatusProto {
        code: status.code() as i32,
        message: status.message().to_owned(),
        details,
    }
}

/// Feed the call's request messages from `down` to `requests` until kas closes its
/// side, then read `down` to its end: returns once kas has ended the tunnel.
async fn read_down(mut down: Streaming<ConnectResponse>, requests: mpsc::Sender<Vec<u8>>) {
    let mut requests = Some(requests);
    while let Ok(Some(m)) = down.message().await {
        match m.msg {
            Some(connect_response::Msg::Message(m)) => {
                if let Some(tx) = &requests
                    && tx.send(m.data).await.is_err()
                {
                    requests = None;
                }
            }
            Some(connect_response::Msg::CloseSend(_)) => requests = None,
            // A second RequestInfo, or an empty frame: not a call's; end the tunnel.
            _ => return,
        }
    }
}

/// Answer `incoming` with `handler`: header, messages, trailer, then the status;
/// stop if kas ends the tunnel first.
async fn answer<H: Handler>(
    incoming: Incoming,
    handler: Arc<H>,
    metrics: Arc<AgentkMetrics>,
    _permit: OwnedSemaphorePermit,
) {
    let Incoming {
        method,
        meta,
        up,
        down,
    } = incoming;
    metrics.tunnels_busy.inc();
    let started = Instant::now();
    let (req_tx, req_rx) = mpsc::channel(4);
    let mut reader = tokio::spawn(read_down(down, req_tx));
    let mut requests: Requests = Box::pin(ReceiverStream::new(req_rx));
    let name = method.rsplit('/').next().unwrap_or(&method).to_owned();
    let mut header_sent = false;
    let status = 'call: {
        let mut responses = if handler.streams_requests(&method) {
            handler.call(Call {
                method,
                metadata: meta,
                requests,
            })
        } else {
            // One request message, read while watching for kas ending the tunnel.
            let first = tokio::select! {
                m = requests.next() => m,
                _ = &mut reader => break 'call Status::cancelled("kas ended the tunnel"),
            };
            let Some(payload) = first else {
                break 'call Status::invalid_argument(format!(
                    "{method} takes one request message; none came"
                ));
            };
            // Later request messages are not this call's; dropping the stream
            // leaves the reader watching for the tunnel's end.
            drop(requests);
            handler.handle(method, payload)
        };
        loop {
            tokio::select! {
                item = responses.next() => match item {
                    Some(Ok(data)) => {
                        let mut frames = Vec::with_capacity(2);
                        if !std::mem::replace(&mut header_sent, true) {
                            frames.push(connect_request::Msg::Header(Header { meta: HashMap::new() }));
                        }
                        frames.push(connect_request::Msg::Message(Message { data }));
                        for f in frames {
                            if up.send(frame(f)).await.is_err() {
                                break 'call Status::cancelled("kas ended the tunnel");
                            }
                        }
                    }
                    Some(Err(status)) => break 'call status,
                    None => break 'call Status::ok(""),
                },
                // kas ended the tunnel (its caller went away): cancel the call.
                _ = &mut reader => break 'call Status::cancelled("kas ended the tunnel"),
            }
        }
    };
    metrics.answered(&name, status.code(), started.elapsed());
    if !reader.is_finished() {
        // Header (if none went yet), trailer, and the error if it is one, as GitLab's
        // agentk sends them; then half-close.
        let mut frames = Vec::with_capacity(3);
        if !header_sent {
            frames.push(connect_request::Msg::Header(Header {
                meta: HashMap::new(),
            }));
        }
        frames.push(connect_request::Msg::Trailer(Trailer {
            meta: meta_to_values(status.metadata()),
        }));
        if status.code() != tonic::Code::Ok {
            frames.push(connect_request::Msg::Error(ErrorFrame {
                status: Some(status_proto(&status)),
            }));
        }
        for f in frames {
            let _ = up.send(frame(f)).await;
        }
        drop(up);
        // The tunnel ends when kas has read the answer and drops it.
        let _ = reader.await;
    } else {
        reader.abort();
    }
    metrics.tunnels_busy.dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_waits_double_from_100_ms_to_10_s_with_jitter() {
        let base = [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000];
        let runs: Vec<Vec<u64>> = (0..20)
            .map(|_| {
                BACKOFF
                    .build()
                    .take(10)
                    .map(|d| d.as_millis() as u64)
                    .collect()
            })
            .collect();
        for waits in &runs {
            for (w, b) in waits.iter().zip(base) {
                assert!(
                    (b..2 * b).contains(w),
                    "{w} ms for a base of {b} ms: {waits:?}"
                );
            }
        }
        // Not in step: twenty slots do not all wait the same.
        assert!(runs.iter().any(|r| r != &runs[0]), "{runs:?}");
    }

    /// An `Error` frame carries the status's code and message, and its details
    /// when they are an encoded `google.rpc.Status` (as tonic keeps them).
    #[test]
    fn statuses_become_google_rpc_statuses_with_their_details() {
        let plain = status_proto(&Status::not_found("no such pod"));
        assert_eq!(
            (plain.code, plain.message.as_str(), plain.details.len()),
            (tonic::Code::NotFound as i32, "no such pod", 0)
        );
        let mut inner = StatusProto {
            code: 9,
            message: "busy".into(),
            details: vec![Default::default()],
        };
        inner.details[0].type_url = "type.googleapis.com/x.Y".into();
        inner.details[0].value = b"why".to_vec();
        let with = Status::with_details(
            tonic::Code::FailedPrecondition,
            "busy",
            inner.encode_to_vec().into(),
        );
        let proto = status_proto(&with);
        assert_eq!(proto.code, tonic::Code::FailedPrecondition as i32);
        assert_eq!(proto.details, inner.details);
    }
}
