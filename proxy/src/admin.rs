//! The admin listener: `/metrics` (Prometheus), `/healthz` (the process serves) and
//! `/readyz` (a topology with a usable default Pod is loaded). Its own address, never
//! the proxy's, so operations endpoints are not exposed to runners.

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use podgate_registry::PodState;
use podgate_tokens::Classifier;

use crate::metrics::{self, METRICS};
use crate::server::RegistryHandle;

/// The admin endpoints.
pub struct Admin {
    classifier: Arc<Classifier>,
    registry: RegistryHandle,
}

impl Admin {
    /// Admin endpoints reporting on `classifier` and `registry`.
    pub fn new(classifier: Arc<Classifier>, registry: RegistryHandle) -> Self {
        Admin {
            classifier,
            registry,
        }
    }

    /// Ready when the default Pod exists and takes traffic: only then does every
    /// request have somewhere to go.
    fn ready(&self) -> Result<String, String> {
        let t = self.registry.topology();
        match t.legacy_pod() {
            Some(p) if p.state == PodState::Active => Ok(format!(
                "ready: topology version {}, {} Pods\n",
                t.version,
                t.pods.len()
            )),
            Some(p) => Err(format!(
                "not ready: default Pod {} is {:?}\n",
                p.id, p.state
            )),
            None => Err(format!(
                "not ready: no default Pod in topology version {}\n",
                t.version
            )),
        }
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Vec<u8>> {
    let body = body.into_bytes();
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .unwrap_or_default()
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        const TEXT: &str = "text/plain; charset=utf-8";
        match session.req_header().uri.path() {
            "/metrics" => {
                let s = self.classifier.cache_stats();
                METRICS.set_cache(s.hits, s.misses);
                reply(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics::render(),
                )
            }
            "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
            "/readyz" => match self.ready() {
                Ok(m) => reply(StatusCode::OK, TEXT, m),
                Err(m) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, m),
            },
            _ => reply(
                StatusCode::NOT_FOUND,
                TEXT,
                "not found: /metrics, /healthz, /readyz\n".into(),
            ),
        }
    }
}
