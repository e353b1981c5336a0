//! The admin listener: `/metrics` (Prometheus), `/healthz` (the process serves) and
//! `/readyz` (the proxy's listener accepts connections and a topology with a usable
//! default Pod is loaded), and with `[console]
//! enabled` the web console under `/console/` ([`podgate_console`]): the page and
//! its event stream. Its own address, never the proxy's, so operations endpoints
//! are not exposed to runners.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Response, StatusCode};
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use podgate_registry::PodState;
use podgate_tokens::Classifier;

use crate::metrics::{self, METRICS};
use crate::server::RegistryHandle;
use podgate_console::{self as console, ConsoleHandle};

/// What the page may load and connect to: its own files, and WebSockets anywhere
/// (the Graph API is on the proxy's listener, another origin).
const CSP: &str = "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'";

/// The admin endpoints.
pub struct Admin {
    classifier: Arc<Classifier>,
    registry: RegistryHandle,
    console: Option<ConsoleHandle>,
    /// Where the proxy's own listener accepts, checked until it does once.
    listener: Option<SocketAddr>,
    listening: AtomicBool,
}

impl Admin {
    /// Admin endpoints reporting on `classifier` and `registry`, with the console
    /// when `console` is given.
    pub fn new(
        classifier: Arc<Classifier>,
        registry: RegistryHandle,
        console: Option<ConsoleHandle>,
    ) -> Self {
        Admin {
            classifier,
            registry,
            console,
            listener: None,
            listening: AtomicBool::new(false),
        }
    }

    /// Ready only once the proxy's listener `listen` (`ip:port`; a name is not
    /// checked) accepts a connection: pingora starts the admin and the proxy
    /// services side by side, and the proxy's binds its socket only as it starts,
    /// so without this `/readyz` could answer 200 before a client can connect.
    #[must_use]
    pub fn checking_listener(mut self, listen: &str) -> Self {
        self.listener = listen.parse::<SocketAddr>().ok().map(|mut a| {
            // A wildcard address is reached on the loopback of its family.
            if a.ip().is_unspecified() {
                a.set_ip(match a.ip() {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                });
            }
            a
        });
        self
    }

    /// Whether the proxy's listener has accepted a connection (once it has, it is
    /// not asked again).
    fn listening(&self) -> bool {
        if self.listening.load(Ordering::Relaxed) {
            return true;
        }
        let ok = self.listener.is_none_or(|a| {
            std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok()
        });
        if ok {
            self.listening.store(true, Ordering::Relaxed);
        }
        ok
    }

    /// Ready when the default Pod exists and takes traffic: only then does every
    /// request have somewhere to go.
    fn ready(&self) -> Result<String, String> {
        if !self.listening() {
            return Err("not ready: the proxy's listener does not accept connections yet\n".into());
        }
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

/// A file of the console's page, with headers that keep the page to its own
/// scripts and styles.
fn asset(content_type: &str, body: &'static [u8]) -> Response<Vec<u8>> {
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .header(http::header::CACHE_CONTROL, "no-cache")
        .header(http::header::CONTENT_SECURITY_POLICY, CSP)
        .header(http::header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(http::header::REFERRER_POLICY, "no-referrer")
        .body(body.to_vec())
        .unwrap_or_default()
}

/// What a request gets: a whole response, or the console's event stream.
enum Answer {
    Whole(Response<Vec<u8>>),
    Events(ConsoleHandle),
}

impl Admin {
    fn answer(&self, session: &ServerSession) -> Answer {
        const TEXT: &str = "text/plain; charset=utf-8";
        let path = session.req_header().uri.path();
        if let Some(console) = &self.console {
            match path {
                "/console" => {
                    let mut r = reply(StatusCode::MOVED_PERMANENTLY, TEXT, String::new());
                    r.headers_mut().insert(
                        http::header::LOCATION,
                        http::HeaderValue::from_static("/console/"),
                    );
                    return Answer::Whole(r);
                }
                "/console/events" => return Answer::Events(console.clone()),
                _ => {}
            }
            if let Some(file) = path.strip_prefix("/console/") {
                return Answer::Whole(match console::asset(file) {
                    Some((content_type, body)) => asset(content_type, body),
                    None => reply(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
                });
            }
        }
        Answer::Whole(match path {
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                render_metrics(&self.classifier),
            ),
            "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
            "/readyz" => match self.ready() {
                Ok(m) => reply(StatusCode::OK, TEXT, m),
                Err(m) => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, m),
            },
            _ => reply(
                StatusCode::NOT_FOUND,
                TEXT,
                if self.console.is_some() {
                    "not found: /metrics, /healthz, /readyz, /console/\n".into()
                } else {
                    "not found: /metrics, /healthz, /readyz\n".into()
                },
            ),
        })
    }
}

/// The proxy's metrics text, as `/metrics` serves it (also the console's own
/// source), with `classifier`'s cache counts brought up to date.
pub fn render_metrics(classifier: &Classifier) -> String {
    let s = classifier.cache_stats();
    METRICS.set_cache(s.hits, s.misses);
    metrics::render()
}

/// Server-sent events: the latest event at once, then each new one, until the
/// client goes or the process shuts down. Each is one `data:` line (the JSON has
/// no newline).
async fn stream_events(
    http: &mut ServerSession,
    console: ConsoleHandle,
    shutdown: &ShutdownWatch,
) -> pingora::Result<()> {
    let mut header = ResponseHeader::build(StatusCode::OK, Some(4))?;
    header.insert_header(http::header::CONTENT_TYPE, "text/event-stream")?;
    header.insert_header(http::header::CACHE_CONTROL, "no-cache")?;
    header.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
    http.set_keepalive(None);
    http.write_response_header(Box::new(header)).await?;
    let mut rx = console.subscribe();
    // A reconnecting EventSource waits this long (ms).
    http.write_response_body(Bytes::from_static(b"retry: 1000\n\n"), false)
        .await?;
    if let Some(json) = console.current() {
        http.write_response_body(event(&json), false).await?;
    }
    let mut shutdown = shutdown.clone();
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let json = rx.borrow_and_update().clone();
                if let Some(json) = json {
                    http.write_response_body(event(&json), false).await?;
                }
            }
            _ = shutdown.changed() => break,
        }
    }
    http.write_response_body(Bytes::new(), true).await
}

fn event(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

#[async_trait]
impl HttpServerApp for Admin {
    async fn process_new_http(
        self: &Arc<Self>,
        mut http: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match http.read_request().await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                tracing::debug!(error = %e, "admin: reading a request");
                return None;
            }
        }
        http.set_keepalive(if *shutdown.borrow() { None } else { Some(60) });
        match self.answer(&http) {
            Answer::Events(console) => {
                if let Err(e) = stream_events(&mut http, console, shutdown).await {
                    tracing::debug!(error = %e, "admin: console events ended");
                }
                None
            }
            Answer::Whole(response) => {
                let (parts, body) = response.into_parts();
                let header: ResponseHeader = parts.into();
                if let Err(e) = http.write_response_header(Box::new(header)).await {
                    tracing::debug!(error = %e, "admin: writing a response");
                    return None;
                }
                if !body.is_empty()
                    && let Err(e) = http.write_response_body(body.into(), true).await
                {
                    tracing::debug!(error = %e, "admin: writing a response");
                    return None;
                }
                let settings = HttpPersistentSettings::for_session(&http);
                match http.finish().await {
                    Ok(c) => c.map(|s| ReusedHttpStream::from_reusable_stream(s, settings)),
                    Err(_) => None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin(listen: &str) -> Admin {
        let classifier = Arc::new(Classifier::with_keys(podgate_tokens::KeySet::new()));
        Admin::new(classifier, RegistryHandle::default(), None).checking_listener(listen)
    }

    #[test]
    fn not_ready_until_the_proxys_listener_accepts() {
        // A port nothing listens on: bound, then released.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let a = admin(&format!("0.0.0.0:{port}"));
        assert!(!a.listening(), "nothing accepts on {port}");
        let err = a.ready().unwrap_err();
        assert!(err.contains("listener"), "{err}");
        // Now the proxy binds it (the wildcard is reached on loopback).
        let _bound = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
        assert!(a.listening());
        // A name is not checked.
        assert!(admin("localhost:1").listening());
    }
}
