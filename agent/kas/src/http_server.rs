//! The HTTP/1.1 serving kas's HTTP listeners share (the Kubernetes API proxy's,
//! `k8s_proxy`, and the Workspaces server's, `workspaces`): accept with back-off,
//! `TCP_NODELAY`, kas's header read timeout, upgrades on, and a drain that lets
//! requests in flight finish; and the response body type they answer with.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// The body type of kas's HTTP answers.
pub(crate) type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// How long a client may take to send a request's headers (kas: `readHeaderTimeout`).
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// An empty body.
pub(crate) fn empty_body() -> BoxBody {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// A whole body.
pub(crate) fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

/// Makes a `Send` body `Sync`, as [`BoxBody`] wants: it is only ever polled through
/// `&mut`, so the mutex is never locked.
pub(crate) struct SyncBody<B>(pub(crate) std::sync::Mutex<std::pin::Pin<Box<B>>>);

impl<B: hyper::body::Body> hyper::body::Body for SyncBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let inner = self
            .get_mut()
            .0
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        inner.as_mut().poll_frame(cx)
    }
}

/// Resolves once `draining` turns true (or its sender is gone).
async fn drain_signal(draining: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = draining.wait_for(|d| *d).await;
}

/// Answers one request of a kas HTTP/1.1 listener.
pub(crate) type Handle = Arc<
    dyn Fn(
            Request<Incoming>,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<BoxBody>> + Send>>
        + Send
        + Sync,
>;

/// Serve `handle` on `listener` until `draining` turns true; then stop accepting,
/// let requests in flight finish (idle connections close at once), and return when
/// every connection has ended. Upgraded connections live on in their own tasks.
/// `what` names the listener in logs.
pub(crate) async fn serve(
    listener: TcpListener,
    handle: Handle,
    draining: tokio::sync::watch::Receiver<bool>,
    what: &'static str,
) {
    let mut conns = tokio::task::JoinSet::new();
    let mut stop = draining.clone();
    loop {
        tokio::select! {
            _ = drain_signal(&mut stop) => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "{what}: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Responses and upgraded streams go out as written, not held for
                // the client's delayed ACK (Go's net/http sets TCP_NODELAY too).
                let _ = stream.set_nodelay(true);
                let (handle, mut drain) = (handle.clone(), draining.clone());
                conns.spawn(async move {
                    let service = service_fn(move |req| {
                        let answer = handle(req);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(READ_HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades();
                    tokio::pin!(conn);
                    let draining = tokio::select! {
                        _ = conn.as_mut() => false,
                        _ = drain_signal(&mut drain) => true,
                    };
                    if draining {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}
