//! [`PodGate`]: the pingora `ProxyHttp` implementation. One request goes through:
//! `request_filter` (match a rule, find and classify the token, decide) →
//! `upstream_peer` (pick a healthy upstream of the decided Pod) →
//! `upstream_request_filter` (mark the request) → `response_filter` (request id) →
//! `logging` (metrics, and one line per request with a token fingerprint only).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use podgate_registry::{Pod, Registry};
use podgate_tokens::{Classification, Classifier, UnroutableReason};

use crate::decision::{self, OnInvalid, Outcome};
use crate::health::Health;
use crate::metrics::{self, METRICS};
use crate::rules::{self, ActionKind, Pool, Rule};
use crate::sources::{self, BodyScan, TokenSource};

/// Per-request state.
#[derive(Debug, Default)]
pub struct Ctx {
    rule: Option<usize>,
    outcome: Option<Outcome>,
    /// Index into the rule's sources of where the token was found.
    source: Option<usize>,
    /// The token, for the log line's fingerprint (never logged itself).
    token: Option<String>,
    /// Where round robin started for this request; attempt `n` uses `start + n`.
    start: usize,
    attempt: usize,
    /// `X-Request-Id`: the client's if it sent a sane one, else generated.
    request_id: String,
    started: Option<Instant>,
}

impl Ctx {
    /// The Pod the request is forwarded to, once decided.
    fn forwarded(&self) -> Option<&Arc<Pod>> {
        match &self.outcome {
            Some(Outcome::Forward { pod, .. }) => Some(pod),
            _ => None,
        }
    }
}

/// The upstreams of `pod` that `rule` sends to.
fn pool<'a>(pod: &'a Pod, rule: &Rule) -> &'a [String] {
    match rule.pool {
        Pool::Web => &pod.web,
        Pool::Kas => &pod.kas,
    }
}

/// The router.
pub struct PodGate {
    rules: Arc<Vec<Rule>>,
    classifier: Arc<Classifier>,
    registry: Registry,
    on_invalid: OnInvalid,
    health: Arc<Health>,
    next: AtomicUsize,
    ids: RequestIds,
    /// `source_labels[rule][source]`: the metric label, rendered once.
    source_labels: Vec<Vec<String>>,
    /// Per rule, the histogram children, looked up once rather than per request.
    histograms: Vec<metrics::RuleHistograms>,
}

/// Request ids for requests that come without one: a random per-process prefix and a
/// counter, 32 hex digits, unique across processes and restarts.
struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        RequestIds {
            prefix: h.finish(),
            next: AtomicU64::new(0),
        }
    }

    fn generate(&self) -> String {
        format!(
            "{:016x}{:016x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// A client's `X-Request-Id` is kept if it is short and plain (it goes into logs and
/// upstream headers); anything else is replaced.
fn sane_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= 128
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/'))
}

impl PodGate {
    /// A router over `rules`, classifying with `classifier`, routing on `registry`'s
    /// topology.
    pub fn new(
        rules: Vec<Rule>,
        classifier: Arc<Classifier>,
        registry: Registry,
        on_invalid: OnInvalid,
    ) -> Self {
        let source_labels = rules
            .iter()
            .map(|r| r.sources.iter().map(ToString::to_string).collect())
            .collect();
        let histograms = rules
            .iter()
            .map(|r| metrics::RuleHistograms::new(&r.name))
            .collect();
        PodGate {
            histograms,
            source_labels,
            rules: Arc::new(rules),
            classifier,
            registry,
            on_invalid,
            health: Arc::new(Health::default()),
            next: AtomicUsize::new(0),
            ids: RequestIds::new(),
        }
    }

    /// Skip upstreams that `health` marks down.
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = health;
        self
    }

    /// Find the token a `route-by-token` rule looks for, reading the body if a body
    /// source is reached. `Err(status)` when the body is refused.
    async fn find_token(
        &self,
        session: &mut Session,
        rule: &Rule,
    ) -> Result<Option<(String, usize)>, u16> {
        let head = session.req_header();
        for (i, src) in rule.sources.iter().enumerate() {
            if let Some(t) = src.from_head(&head.headers, head.uri.query()) {
                return Ok(Some((t, i)));
            }
        }
        if !rule.sources.iter().any(TokenSource::needs_body) {
            return Ok(None);
        }
        let content_type = head
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let json = rule.sources.iter().enumerate().find_map(|(i, s)| match s {
            TokenSource::JsonBody(f) if contains_ignore_case(content_type, "json") => Some((i, f)),
            _ => None,
        });
        if let Some((i, field)) = json {
            let declared = head
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<usize>().ok());
            if declared.is_some_and(|n| n > sources::MAX_TOKEN_BODY) {
                return Err(413);
            }
            let body = read_body(session, ReadLimit::Whole(sources::MAX_TOKEN_BODY)).await?;
            return Ok(match sources::json_field(&body.bytes, field) {
                BodyScan::Found(t) => Some((t, i)),
                _ => None,
            });
        }
        let multipart = rule.sources.iter().enumerate().find_map(|(i, s)| match s {
            TokenSource::Multipart(f) => Some((i, f, sources::multipart_boundary(content_type)?)),
            _ => None,
        });
        let Some((i, field, boundary)) = multipart else {
            return Ok(None);
        };
        // One chunk only (see `ReadLimit::OneChunk`): the rest of an upload of any
        // size streams to the Pod unbuffered.
        let body = read_body(session, ReadLimit::OneChunk).await?;
        Ok(
            match sources::multipart_field(&body.bytes, &boundary, field, body.complete) {
                BodyScan::Found(t) => Some((t, i)),
                _ => None,
            },
        )
    }
}

/// How much of a body `read_body` may take.
enum ReadLimit {
    /// All of it, refusing more than this many bytes (413).
    Whole(usize),
    /// Exactly one read (at most 64 KiB). pingora replays what was read from a
    /// 64 KiB retry buffer and silently drops it if a second read overflows that
    /// buffer, so a body that must stream (artifacts) is never read further.
    OneChunk,
}

struct ReadBody {
    bytes: Vec<u8>,
    complete: bool,
}

/// Read (part of) the request body before choosing the upstream. What is read is
/// replayed upstream byte for byte from pingora's retry buffer; the rest streams.
async fn read_body(session: &mut Session, limit: ReadLimit) -> Result<ReadBody, u16> {
    session.enable_retry_buffering();
    if session
        .req_header()
        .headers
        .contains_key(http::header::EXPECT)
    {
        // Answer the client's Expect ourselves, or it waits ~1 s before sending.
        if session.write_continue_response().await.is_err() {
            return Err(400);
        }
        session
            .req_header_mut()
            .remove_header(&http::header::EXPECT);
    }
    let mut bytes = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                bytes.extend_from_slice(&chunk);
                match limit {
                    ReadLimit::Whole(max) if bytes.len() > max => return Err(413),
                    ReadLimit::Whole(_) => {}
                    ReadLimit::OneChunk => {
                        let complete = session.is_body_done();
                        return Ok(ReadBody { bytes, complete });
                    }
                }
            }
            Ok(None) => {
                return Ok(ReadBody {
                    bytes,
                    complete: true,
                });
            }
            Err(_) => return Err(400),
        }
    }
}

/// Whether `hay` contains `needle` (ASCII, case-insensitive), without allocating.
fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    hay.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A value formatted by a closure, only when displayed.
struct Lazy<F>(F);

impl<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result> fmt::Display for Lazy<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.0)(f)
    }
}

fn json_message(message: &str) -> Bytes {
    Bytes::from(serde_json::json!({ "message": message }).to_string())
}

/// Answer from the proxy itself: a GitLab-style `{"message": …}` body.
async fn respond(
    session: &mut Session,
    ctx: &Ctx,
    status: u16,
    message: &str,
    retry_after: bool,
) -> Result<()> {
    let body = json_message(message);
    let mut resp = ResponseHeader::build(status, Some(5))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    resp.insert_header("x-request-id", ctx.request_id.as_str())?;
    if retry_after {
        resp.insert_header("retry-after", "5")?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

#[async_trait]
impl ProxyHttp for PodGate {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    /// Decide. `Ok(true)`: answered here (401, 413, 503); `Ok(false)`: proxy on.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let started = Instant::now();
        ctx.started = Some(started);
        let head = session.req_header();
        ctx.request_id = match head.headers.get("x-request-id") {
            Some(v) if sane_request_id(v.as_bytes()) => {
                String::from_utf8_lossy(v.as_bytes()).into_owned()
            }
            _ => self.ids.generate(),
        };
        let Some(idx) = self
            .rules
            .iter()
            .position(|r| r.matches(&head.method, head.uri.path(), &head.headers))
        else {
            respond(session, ctx, 404, "404 Not Found: no routing rule", false).await?;
            return Ok(true);
        };
        ctx.rule = Some(idx);
        let rule = &self.rules[idx];
        let topology = self.registry.topology();
        let outcome = match rule.action {
            ActionKind::RouteByToken => match self.find_token(session, rule).await {
                Err(413) => {
                    respond(session, ctx, 413, "413 Request Entity Too Large", false).await?;
                    return Ok(true);
                }
                Err(status) => {
                    respond(
                        session,
                        ctx,
                        status,
                        "400 Bad Request: unreadable body",
                        false,
                    )
                    .await?;
                    return Ok(true);
                }
                Ok(Some((token, source))) => {
                    let c = self.classifier.classify(&token);
                    ctx.source = Some(source);
                    ctx.token = Some(token);
                    decision::decide(&c, &topology, self.on_invalid)
                }
                Ok(None) => decision::decide(
                    &Classification::Unroutable {
                        reason: UnroutableReason::Opaque,
                    },
                    &topology,
                    self.on_invalid,
                ),
            },
            ActionKind::RouteToPod => match rule.pod {
                Some(p) => decision::to_pod(&topology, p, "pinned"),
                None => decision::to_legacy(&topology, "default"),
            },
            ActionKind::SessionPrefix => {
                match rules::cookie(&session.req_header().headers, "_gitlab_session")
                    .and_then(|v| topology.pod_for_session(v))
                {
                    Some(p) => decision::to_pod(&topology, p.id, "session"),
                    None => decision::to_legacy(&topology, "default"),
                }
            }
            ActionKind::Default => decision::to_legacy(&topology, "default"),
        };
        // A Pod whose every upstream fails its health check: 503 now, rather than a
        // connection attempt bound to fail.
        let outcome = match outcome {
            Outcome::Forward { pod, .. } if !self.health.any_healthy(pool(&pod, rule)) => {
                Outcome::Unavailable(if pool(&pod, rule).is_empty() {
                    "no_upstream"
                } else {
                    "no_healthy_upstream"
                })
            }
            o => o,
        };
        self.histograms[idx]
            .decision
            .observe(started.elapsed().as_secs_f64());
        ctx.outcome = Some(outcome);
        match &ctx.outcome {
            Some(Outcome::Unauthorized(reason)) => {
                let message = format!("401 Unauthorized: {reason}");
                respond(session, ctx, 401, &message, false).await?;
                Ok(true)
            }
            Some(Outcome::Unavailable(why)) => {
                let message = format!("503 Service Unavailable: {why}");
                respond(session, ctx, 503, &message, true).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The decided Pod's next upstream (round robin; a retry moves on to the next).
    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        if ctx.attempt == 0 {
            ctx.start = self.next.fetch_add(1, Ordering::Relaxed);
        }
        let Some(pod) = ctx.forwarded().cloned() else {
            return Err(Error::new_str("no routing decision"));
        };
        let rule = &self.rules[ctx.rule.unwrap_or(0)];
        let pool = pool(&pod, rule);
        if pool.is_empty() {
            return Err(Error::explain(
                ErrorType::ConnectNoRoute,
                "Pod has no upstream for this pool",
            ));
        }
        // The next healthy upstream from where this request's round robin stands.
        let skip = (0..pool.len())
            .find(|k| {
                self.health
                    .is_healthy(&pool[(ctx.start + ctx.attempt + k) % pool.len()])
            })
            .unwrap_or(0);
        ctx.attempt += skip;
        let addr = &pool[(ctx.start + ctx.attempt) % pool.len()];
        let mut peer = HttpPeer::new(addr.as_str(), false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(2));
        peer.options.read_timeout = Some(Duration::from_secs(rule.read_timeout_secs));
        if rule.pool == Pool::Kas && session.is_http2() {
            // agentk's gRPC: HTTP/2 end to end, cleartext to kas (h2c), trailers intact.
            peer.options.set_http_version(2, 2);
        }
        ctx.attempt += 1;
        Ok(Box::new(peer))
    }

    /// Connection refused or timed out: try the same Pod's next upstream, never
    /// another Pod's.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(pod) = ctx.forwarded() {
            METRICS
                .connect_failures
                .with_label_values(&[pod.id.to_string().as_str()])
                .inc();
            if ctx.attempt < pool(pod, &self.rules[ctx.rule.unwrap_or(0)]).len() {
                e.set_retry(true);
            }
        }
        e
    }

    /// Errors become GitLab-style JSON answers: no upstream of the Pod reachable →
    /// 503 + `Retry-After` (the runner retries); upstream timeout → 504; other
    /// upstream failures → 502. Nothing is written once a response has started.
    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let (code, message, retry_after) = match (e.esource(), e.etype()) {
            (_, ErrorType::HTTPStatus(code)) => (
                *code,
                http::StatusCode::from_u16(*code)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("error"),
                false,
            ),
            (
                ErrorSource::Upstream | ErrorSource::Internal,
                ErrorType::ConnectTimedout
                | ErrorType::ConnectRefused
                | ErrorType::ConnectNoRoute
                | ErrorType::ConnectError
                | ErrorType::TLSHandshakeFailure,
            ) => (
                503,
                "503 Service Unavailable: no upstream of the Pod is reachable",
                true,
            ),
            (ErrorSource::Upstream, ErrorType::ReadTimedout) => (
                504,
                "504 Gateway Timeout: the Pod did not answer in time",
                false,
            ),
            (ErrorSource::Upstream, _) => (502, "502 Bad Gateway: the Pod failed", false),
            (
                ErrorSource::Downstream,
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed,
            ) => (0, "", false),
            (ErrorSource::Downstream, _) => (400, "400 Bad Request", false),
            _ => (500, "500 Internal Server Error", false),
        };
        if code > 0 && session.response_written().is_none() {
            let _ = respond(session, ctx, code, message, retry_after).await;
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// Tell the Pod which rule and decision brought the request.
    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut pingora::http::RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(pod) = ctx.forwarded() {
            upstream_request.insert_header("x-podgate-pod", pod.id.to_string())?;
        }
        if let Some(i) = ctx.rule {
            upstream_request.insert_header("x-podgate-rule", self.rules[i].name.as_str())?;
        }
        upstream_request.insert_header("x-request-id", ctx.request_id.as_str())?;
        Ok(())
    }

    /// The client learns the request id the Pod and our logs know it by.
    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        upstream_response.insert_header("x-request-id", ctx.request_id.as_str())?;
        Ok(())
    }

    /// One line per request. Failures from the Pod or from us are warnings; a client
    /// that went away (a runner abandoning a long poll) is routine: debug.
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let rule = ctx.rule.map_or("-", |i| self.rules[i].name.as_str());
        let outcome = ctx.outcome.as_ref().map_or("-", Outcome::label);
        let pod = ctx.forwarded().map_or(0, |p| p.id.get());
        let source_label = match (ctx.rule, ctx.source) {
            (Some(r), Some(s)) => self.source_labels[r][s].as_str(),
            _ => "none",
        };
        let mut pod_buf = itoa_buf::Buf::default();
        let mut status_buf = itoa_buf::Buf::default();
        METRICS
            .requests
            .with_label_values(&[
                rule,
                pod_buf.format(pod),
                status_buf.format(u64::from(status)),
                source_label,
                outcome,
            ])
            .inc();
        let elapsed = ctx.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        if let Some(h) = ctx.rule.and_then(|i| self.histograms.get(i)) {
            h.duration[metrics::status_class_index(status)].observe(elapsed);
        }
        let request_id = ctx.request_id.as_str();
        let head = session.req_header();
        let (method, path) = (head.method.as_str(), head.uri.path());
        // Formatted only when the line is emitted: nothing is hashed or rendered on
        // a request whose log level is off.
        let source = Lazy(|f: &mut fmt::Formatter<'_>| match (ctx.rule, ctx.source) {
            (Some(r), Some(s)) => write!(f, "{}", self.rules[r].sources[s]),
            _ => f.write_str("-"),
        });
        let token = Lazy(|f: &mut fmt::Formatter<'_>| match &ctx.token {
            Some(t) => f.write_str(&podgate_tokens::fingerprint(t)),
            None => f.write_str("-"),
        });
        match e {
            None => tracing::info!(
                method, path, status, rule, outcome, pod, source = %source, token = %token, request_id, elapsed, "request"
            ),
            Some(e) if *e.esource() == ErrorSource::Downstream => {
                tracing::debug!(method, path, status, rule, outcome, pod, source = %source, token = %token, request_id, elapsed, error = %e, "client went away")
            }
            Some(e) => {
                tracing::warn!(method, path, status, rule, outcome, pod, source = %source, token = %token, request_id, elapsed, error = %e, "request failed")
            }
        }
    }
}

/// Decimal formatting of label values on the stack, without allocating.
mod itoa_buf {
    /// Room for any `u64`.
    #[derive(Default)]
    pub(super) struct Buf([u8; 20]);

    impl Buf {
        pub(super) fn format(&mut self, mut n: u64) -> &str {
            let mut i = self.0.len();
            loop {
                i -= 1;
                self.0[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            std::str::from_utf8(&self.0[i..]).unwrap_or("0")
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn formats_like_display() {
            for n in [0, 7, 10, 401, 503, 65_535, u64::MAX] {
                assert_eq!(super::Buf::default().format(n), n.to_string());
            }
        }
    }
}
