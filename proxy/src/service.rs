//! [`PodGate`]: the pingora `ProxyHttp` implementation. One request goes through:
//! `request_filter` (match a rule, find and classify the token, decide) →
//! `upstream_peer` (pick an upstream of the decided Pod) → `upstream_request_filter`
//! (mark the request) → `logging` (one line per request, token fingerprint only).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use podgate_registry::{Pod, Registry};
use podgate_tokens::{Classification, Classifier, UnroutableReason};

use crate::decision::{self, OnInvalid, Outcome};
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
    next: AtomicUsize,
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
        PodGate {
            rules: Arc::new(rules),
            classifier,
            registry,
            on_invalid,
            next: AtomicUsize::new(0),
        }
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

async fn respond(
    session: &mut Session,
    status: u16,
    message: &str,
    retry_after: bool,
) -> Result<()> {
    let body = json_message(message);
    let mut resp = ResponseHeader::build(status, Some(4))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
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
        let head = session.req_header();
        let Some(idx) = self
            .rules
            .iter()
            .position(|r| r.matches(&head.method, head.uri.path(), &head.headers))
        else {
            respond(session, 404, "404 Not Found: no routing rule", false).await?;
            return Ok(true);
        };
        ctx.rule = Some(idx);
        let rule = &self.rules[idx];
        let topology = self.registry.topology();
        let outcome = match rule.action {
            ActionKind::RouteByToken => match self.find_token(session, rule).await {
                Err(413) => {
                    respond(session, 413, "413 Request Entity Too Large", false).await?;
                    return Ok(true);
                }
                Err(status) => {
                    respond(session, status, "400 Bad Request: unreadable body", false).await?;
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
        let answered = match &outcome {
            Outcome::Unauthorized(reason) => {
                respond(session, 401, &format!("401 Unauthorized: {reason}"), false).await?;
                true
            }
            Outcome::Unavailable(why) => {
                respond(
                    session,
                    503,
                    &format!("503 Service Unavailable: {why}"),
                    true,
                )
                .await?;
                true
            }
            Outcome::Forward { .. } => false,
        };
        ctx.outcome = Some(outcome);
        Ok(answered)
    }

    /// The decided Pod's next upstream (round robin; a retry moves on to the next).
    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        if ctx.attempt == 0 {
            ctx.start = self.next.fetch_add(1, Ordering::Relaxed);
        }
        let Some(pod) = ctx.forwarded() else {
            return Err(Error::new_str("no routing decision"));
        };
        let rule = &self.rules[ctx.rule.unwrap_or(0)];
        let pool = pool(pod, rule);
        if pool.is_empty() {
            return Err(Error::explain(
                ErrorType::ConnectNoRoute,
                "Pod has no upstream for this pool",
            ));
        }
        let addr = &pool[(ctx.start + ctx.attempt) % pool.len()];
        let mut peer = HttpPeer::new(addr.as_str(), false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(2));
        peer.options.read_timeout = Some(Duration::from_secs(rule.read_timeout_secs));
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
        if let Some(pod) = ctx.forwarded()
            && ctx.attempt < pool(pod, &self.rules[ctx.rule.unwrap_or(0)]).len()
        {
            e.set_retry(true);
        }
        e
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
        Ok(())
    }

    /// One line per request. Failures from the Pod or from us are warnings; a client
    /// that went away (a runner abandoning a long poll) is routine: debug.
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let rule = ctx.rule.map_or("-", |i| self.rules[i].name.as_str());
        let outcome = ctx.outcome.as_ref().map_or("-", Outcome::label);
        let pod = ctx.forwarded().map_or(0, |p| p.id.get());
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
                method, path, status, rule, outcome, pod, source = %source, token = %token, "request"
            ),
            Some(e) if *e.esource() == ErrorSource::Downstream => {
                tracing::debug!(method, path, status, rule, outcome, pod, source = %source, token = %token, error = %e, "client went away")
            }
            Some(e) => {
                tracing::warn!(method, path, status, rule, outcome, pod, source = %source, token = %token, error = %e, "request failed")
            }
        }
    }
}
