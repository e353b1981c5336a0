//! `WatchGraph`: the Graph API's watch, evaluated in agentk (the Graph API as
//! gitlab-org/cli `internal/commands/cluster/graph/graph.go`, <https://docs.gitlab.com/cli/cluster/graph/>). kas sends the client's request JSON (which it
//! has validated) and the user to impersonate through a reverse tunnel; this answers
//! with a stream of
//! [`WatchGraphResponse`](podgate_agent::proto::kubernetes_api::WatchGraphResponse) batches
//! for as long as kas keeps the tunnel open.
//!
//! 1. The request is compiled again ([`podgate_agent::graph::request::compile`]): CEL once
//!    per request.
//! 2. Discovery (`discovery`) picks the resources to watch.
//! 3. Watches (`informers`, kube-runtime's watcher) run per resource cluster-wide
//!    when no namespace filter is set, else per (namespace, resource), with the
//!    query's label and field selectors sent to the API server; namespaces come from
//!    `namespaces.names` or from a watch on namespaces filtered by its selectors and
//!    CEL expression, re-evaluated as namespaces change.
//! 4. Each object is ingested where it arrives (`ingest`): trimmed, filtered by its
//!    object expression, payload and references computed; the graph (`state`)
//!    keeps only those results.
//! 5. The graph task (`engine`) merges the results and sends batches: one after
//!    every watch has synced (or timed out: an
//!    `INFORMER_SYNC_FAILED` warning, the rest goes on), then one per
//!    [`Settings::batch_interval`] while things change; a batch is split so that no
//!    message exceeds [`Settings::max_message_bytes`].
//!
//! Dropping the response stream (kas closed the tunnel: the WebSocket closed) stops
//! every watch and frees the graph.

mod batch;
mod discovery;
mod engine;
mod informers;
mod ingest;
mod refs;
mod state;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::mpsc;
use tonic::Status;

use super::tunnels::Responses;
use podgate_agent::proto::kubernetes_api::ImpersonationConfig;

pub use self::batch::encode_batches;

/// How a `WatchGraph` behaves.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long a watch may take to list before `INFORMER_SYNC_FAILED` (GitLab's
    /// example message says 30 seconds, `docs/graph-api.md` §5).
    pub sync_timeout: Duration,
    /// Changes are collected this long before a batch is sent.
    pub batch_interval: Duration,
    /// No message is larger (GitLab's client refuses over 4 MiB).
    pub max_message_bytes: usize,
    /// Where requests, informers, objects, actions and warnings are counted.
    pub metrics: Option<super::metrics::GraphMetrics>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            sync_timeout: Duration::from_secs(30),
            batch_interval: Duration::from_millis(100),
            max_message_bytes: 1024 * 1024,
            metrics: None,
        }
    }
}

/// The response stream; dropping it stops the watch.
struct GraphStream {
    rx: mpsc::Receiver<Result<Vec<u8>, Status>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stream for GraphStream {
    type Item = Result<Vec<u8>, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for GraphStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answer one tunnelled `WatchGraph` (an encoded
/// [`WatchGraphRequest`](podgate_agent::proto::kubernetes_api::WatchGraphRequest)) with a
/// stream of encoded [`podgate_agent::proto::kubernetes_api::WatchGraphResponse`] batches.
pub fn watch_graph(client: kube::Client, payload: Vec<u8>, settings: Settings) -> Responses {
    let (tx, rx) = mpsc::channel(2);
    let task = tokio::spawn(async move {
        if let Err(status) = engine::run(client, payload, settings, tx.clone()).await {
            let _ = tx.send(Err(status)).await;
        }
    });
    Box::pin(GraphStream { rx, task })
}

/// A kube client whose every request carries the impersonation headers, built as
/// `MakeRequest` builds them ([`super::k8s_api::impersonate`]).
fn impersonating(client: kube::Client, imp: &ImpersonationConfig) -> Result<kube::Client, Status> {
    let mut map = http::HeaderMap::new();
    super::k8s_api::impersonate(&mut map, imp)?;
    if map.is_empty() {
        return Ok(client);
    }
    let headers: Vec<(http::HeaderName, http::HeaderValue)> =
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let default_ns = client.default_namespace().to_owned();
    Ok(kube::Client::new(
        Impersonate {
            client,
            headers: Arc::new(headers),
        },
        default_ns,
    ))
}

#[derive(Clone)]
struct Impersonate {
    client: kube::Client,
    headers: Arc<Vec<(http::HeaderName, http::HeaderValue)>>,
}

impl tower::Service<http::Request<kube::client::Body>> for Impersonate {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: http::Request<kube::client::Body>) -> Self::Future {
        for (k, v) in self.headers.iter() {
            req.headers_mut().append(k.clone(), v.clone());
        }
        let client = self.client.clone();
        Box::pin(async move { client.send(req).await })
    }
}
