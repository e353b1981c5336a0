//! The observability listener of kas and agentk: `GET /metrics` (Prometheus text;
//! behind a bearer token when one is configured), `GET /healthz` (the process
//! serves) and `GET /readyz` (it can do its job: 200, or 503 with the reason).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the listener reports.
pub trait Report: Send + Sync + 'static {
    /// Metrics in the Prometheus text format.
    fn metrics(&self) -> String;
    /// `Ok` when ready, else why not.
    fn ready(&self) -> Result<(), String>;
    /// A bearer token `/metrics` requires, if any (`/healthz` and `/readyz` stay
    /// open for probes: they tell nothing).
    fn metrics_token(&self) -> Option<&str> {
        None
    }
}

/// Serve `report` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, report: Arc<dyn Report>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: do not spin.
                tracing::warn!(error = %e, "observability listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let report = report.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let report = report.clone();
                async move { Ok::<_, Infallible>(answer(&*report, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer<B>(report: &dyn Report, req: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            if let Some(token) = report.metrics_token() {
                use subtle::ConstantTimeEq as _;
                let given = req
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .unwrap_or_default();
                if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
                    let mut r = reply(
                        StatusCode::UNAUTHORIZED,
                        "text/plain",
                        "unauthenticated\n".into(),
                    );
                    r.headers_mut().insert(
                        http::header::WWW_AUTHENTICATE,
                        http::HeaderValue::from_static("Bearer"),
                    );
                    return r;
                }
            }
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                report.metrics(),
            )
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match report.ready() {
            Ok(()) => reply(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
