//! [`PodGate`]: the pingora `ProxyHttp` implementation. One request goes through:
//! `request_filter` (plan, read the body the plan asks for, decide: the two steps
//! of [`crate::pipeline`]) → `upstream_peer` (pick a healthy upstream of the
//! decided Pod) → `upstream_request_filter` (mark the request) → `response_filter`
//! (request id) → `logging` (metrics, and one line per request with a token
//! fingerprint only). A poll whose rule has `edge_hold`, to a Pod that opts in, may
//! be held (and answered) in `request_filter` instead ([`crate::edge_poll`]).
//!
//! The steps after the decision that the HTTP/1 fast path shares live beside it:
//! `steps` (request id, conclusion, logging), `hold` (edge holds), `upstream`
//! (address selection and retries, the headers added upstream).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use podgate_registry::Pod;
use podgate_tokens::Classifier;

use crate::answer::Answer;
use crate::body::{DEFAULT_BODY_LOOKAHEAD, read_body};
use crate::decision::{Decision, OnInvalid, Outcome};
use crate::edge_poll::{EdgePolls, PollResult, RunnerRequest};
use crate::metrics;
use crate::pipeline::{self, BodyRead, Plan};
use crate::request_id::RequestIds;
use crate::rules::{Pool, Rule};
use crate::server::RegistryHandle;
use crate::sources::{self, Candidate, Place, TokenSource};
use crate::upstreams::Upstreams;

mod hold;
mod kas_open;
mod steps;
mod upstream;

pub(crate) use hold::Held;
pub(crate) use kas_open::KasOpen;
pub(crate) use upstream::{ADDED_HEADERS, Added, CONNECT_TIMEOUT};

/// Concurrent gRPC calls on one connection to a kas, below the 200 that kas's
/// server (hyper's HTTP/2 default) allows: kas's memory goes with its connections
/// more than with its calls.
const KAS_H2_STREAMS: usize = 100;

/// Per-request state.
#[derive(Debug, Default)]
pub struct Ctx {
    pub(crate) rule: Option<usize>,
    pub(crate) outcome: Option<Outcome>,
    /// The token routed by and where it was, for the log line's fingerprint (the
    /// token itself is never logged) and the source label.
    pub(crate) token: Option<Candidate>,
    /// The upstream addresses tried so far (a retry takes another of the Pod's).
    pub(crate) tried: Vec<SocketAddr>,
    /// `X-Request-Id`: the client's if it sent a sane one, else generated.
    pub(crate) request_id: String,
    pub(crate) started: Option<Instant>,
    /// When the decision was made (the clock read that timed it): on the fast path
    /// the Pod's read deadline counts from it when nothing was awaited since.
    pub(crate) decided: Option<Instant>,
    /// How an edge hold ended, if the poll went through one.
    pub(crate) edge: Option<PollResult>,
    /// The request's slot among those in flight to its upstream address
    /// (`upstreams.max_connections_per_address`), held until the request ends.
    pub(crate) slot: Option<crate::upstreams::Slot>,
    /// Counted in `podgate_proxy_kas_open` while the request is open, when it goes
    /// to a Pod's kas.
    pub(crate) kas_open: Option<KasOpen>,
    /// The status of an answer of the proxy's own that went to a gRPC call as a
    /// gRPC status (HTTP 200): what the metrics and the log line count (0: none).
    pub(crate) answered: std::sync::atomic::AtomicU16,
}

/// Now, on the runtime's clock: tokio's, which tests pause and advance (in a build
/// without tokio's `test-util`, the system's monotonic clock). Deadlines on
/// tokio's timers are set from these readings.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Ctx {
    /// The Pod the request is forwarded to, once decided.
    pub(crate) fn forwarded(&self) -> Option<&Arc<Pod>> {
        match &self.outcome {
            Some(Outcome::Forward { pod, .. }) => Some(pod),
            _ => None,
        }
    }
}

/// Per rule, per source: each place's metric label.
type SourceLabels = Vec<Vec<Vec<(Place, String)>>>;

/// The router. Cheap to clone: the HTTP/1 fast path ([`crate::fast`]) shares it with
/// pingora-proxy's service, so both paths route with the same rules, classifier,
/// topology, pools and metrics.
#[derive(Clone)]
pub struct PodGate {
    pub(crate) rules: Arc<Vec<Rule>>,
    pub(crate) classifier: Arc<Classifier>,
    pub(crate) registry: RegistryHandle,
    pub(crate) on_invalid: OnInvalid,
    pub(crate) upstreams: Arc<Upstreams>,
    ids: Arc<RequestIds>,
    /// `source_labels[rule][source]`: the metric label per place, rendered once.
    source_labels: Arc<SourceLabels>,
    /// Most body bytes read before routing (`body_lookahead_bytes`).
    pub(crate) body_lookahead: usize,
    /// Per rule, the histogram children, looked up once rather than per request.
    histograms: Arc<Vec<metrics::RuleHistograms>>,
    /// Long polls held at the edge (`None`: `edge_poll_hold_secs = 0`).
    pub(crate) edge_polls: Option<Arc<EdgePolls>>,
    /// Path rules (`None`: no `[topology_service]`).
    pub(crate) path_router: Option<Arc<crate::claims::PathRouter>>,
}

impl PodGate {
    /// A router over `rules`, classifying with `classifier`, routing on `registry`'s
    /// topology to the addresses `upstreams` keeps for each Pod.
    pub fn new(
        rules: Vec<Rule>,
        classifier: Arc<Classifier>,
        registry: RegistryHandle,
        upstreams: Arc<Upstreams>,
        on_invalid: OnInvalid,
    ) -> Self {
        let source_labels = rules
            .iter()
            .map(|r| {
                r.by_token()
                    .map(|b| b.sources.iter().map(TokenSource::labels).collect())
                    .unwrap_or_default()
            })
            .collect();
        let histograms = rules
            .iter()
            .map(|r| metrics::RuleHistograms::new(&r.name))
            .collect();
        PodGate {
            histograms: Arc::new(histograms),
            source_labels: Arc::new(source_labels),
            body_lookahead: DEFAULT_BODY_LOOKAHEAD,
            rules: Arc::new(rules),
            classifier,
            registry,
            on_invalid,
            upstreams,
            ids: Arc::new(RequestIds::new()),
            edge_polls: None,
            path_router: None,
        }
    }

    /// Route requests whose path names a claim by its owner, asking `router`.
    pub fn with_path_router(mut self, router: Arc<crate::claims::PathRouter>) -> Self {
        self.path_router = Some(router);
        self
    }

    /// Hold opted-in Pods' `jobs/request` polls at the edge with `polls`.
    pub fn with_edge_polls(mut self, polls: Arc<EdgePolls>) -> Self {
        self.edge_polls = Some(polls);
        self
    }

    /// Read at most `bytes` of a body before routing (`body_lookahead_bytes`).
    pub fn with_body_lookahead(mut self, bytes: usize) -> Self {
        self.body_lookahead = bytes;
        self
    }

    /// Read the body as `plan` says and decide by rule `rule`
    /// ([`crate::pipeline::decide`]). Also the body, when it was read whole. `Err`:
    /// the client went away while its body was read.
    async fn read_and_decide(
        &self,
        session: &mut Session,
        rule: usize,
        plan: Option<pipeline::BodyPlan>,
    ) -> Result<(Decision, Option<Vec<u8>>)> {
        let read = match &plan {
            Some(p) if !session.is_body_empty() => {
                let read = read_body(session, p.limit, p.whole()).await?;
                // What was read is replayed from pingora's retry buffer: one that
                // overflowed cannot replay it.
                let overflow = session.retry_buffer_truncated();
                Some((p, read, overflow))
            }
            _ => None,
        };
        let hop_by_hop = sources::connection_listed(&session.req_header().headers);
        let view = pipeline_head(session, &hop_by_hop);
        let body = match &read {
            None => BodyRead::Skipped,
            Some((p, _, true)) => BodyRead::Overflow { limit: p.limit },
            Some((p, b, false)) => BodyRead::Read {
                plan: p,
                bytes: &b.bytes,
                complete: b.complete,
            },
        };
        let decision = self.decide(rule, &view, body);
        let whole = read
            .filter(|(_, b, overflow)| !overflow && b.complete)
            .map(|(_, b, _)| b.bytes);
        Ok((decision, whole))
    }

    /// A poll forwarded by a rule with `edge_hold` to a Pod that opts in: hold it
    /// here ([`PodGate::hold`]). `Ok(true)`: answered here (204); `Ok(false)`:
    /// forward it; `Err`: the client went away during the hold.
    async fn edge_hold(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        rule: &Rule,
        body: Option<Vec<u8>>,
    ) -> Result<bool> {
        let Some(polls) = self.edge_polls_for(ctx, rule) else {
            return Ok(false);
        };
        let request = RunnerRequest::read(&session.req_header().headers, body.as_deref());
        drop(body);
        let gone = async {
            // The body is read: this only returns when the client closes (or sends
            // bytes it should not before its answer).
            let _ = session.read_body_or_idle(true).await;
        };
        match self.hold(ctx, polls, request, gone).await {
            Held::Forward => Ok(false),
            Held::Answer(answer) => {
                self.answer(session, ctx, &answer).await?;
                Ok(true)
            }
            Held::ClientGone(e) => Err(e),
        }
    }

    /// Answer from the proxy itself, the connection kept for the client's next
    /// request where the fast path would keep it ([`crate::body::drain_small_body`]).
    async fn answer(&self, session: &mut Session, ctx: &Ctx, answer: &Answer) -> Result<()> {
        crate::body::drain_small_body(session, self.body_lookahead).await;
        respond(session, ctx, answer).await
    }

    /// The metric label of a token's source.
    fn source_label(&self, rule: usize, token: &Candidate) -> &str {
        self.source_labels[rule][token.source]
            .iter()
            .find(|(place, _)| *place == token.place)
            .map_or("none", |(_, label)| label.as_str())
    }
}

/// The request head as [`crate::pipeline`] reads it.
fn pipeline_head<'a>(
    session: &'a Session,
    hop_by_hop: &'a [http::HeaderName],
) -> pipeline::Head<'a> {
    let head = session.req_header();
    pipeline::Head {
        method: &head.method,
        path: head.uri.path(),
        query: head.uri.query(),
        headers: &head.headers,
        // HTTP/1 names the host in `Host`; HTTP/2 in `:authority` (the URI's).
        host: head
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| head.uri.authority().map(|a| a.as_str())),
        http2: session.is_http2(),
        hop_by_hop,
    }
}

/// Write an answer of the proxy's own through pingora's session; to a gRPC call,
/// as gRPC ([`Answer::as_grpc`]).
async fn respond(session: &mut Session, ctx: &Ctx, answer: &Answer) -> Result<()> {
    let grpc;
    let answer = if crate::answer::is_grpc(session.is_http2(), &session.req_header().headers) {
        grpc = answer.as_grpc();
        ctx.answered
            .store(answer.status, std::sync::atomic::Ordering::Relaxed);
        &grpc
    } else {
        answer
    };
    let resp = answer.response_header(&ctx.request_id)?;
    let body = answer.body.clone();
    session
        .write_response_header(Box::new(resp), body.is_none())
        .await?;
    if let Some(body) = body {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

#[async_trait]
impl ProxyHttp for PodGate {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    /// Decide. `Ok(true)`: answered here (400, 401, 413, 503); `Ok(false)`: proxy
    /// on. `Err`: the client went away while its body was read.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let started = now();
        ctx.started = Some(started);
        ctx.request_id = self.request_id(&session.req_header().headers);
        // `Connection` is a list field: a `close` in any of its lines ends the
        // connection after this request. pingora reads only the first.
        if crate::http1::wants_close(&session.req_header().headers) {
            session.set_keepalive(None);
        }
        // What GitLab's front refuses of an HTTP/1 head (the fast path hands such
        // heads here): answered, and the connection closed, as NGINX does.
        if !session.is_http2() {
            let head = session.req_header();
            let checked = crate::http1::RequestHead {
                method: head.method.as_str(),
                target: head.raw_path(),
                headers: &head.headers,
            };
            if let Some(refusal) = crate::http1::refusal(&checked) {
                session.set_keepalive(None);
                self.answer(session, ctx, &Answer::refusal(&refusal))
                    .await?;
                ctx.outcome = Some(Outcome::Refused(refusal));
                return Ok(true);
            }
        }
        // Planning reads no `Connection:`-listed header: they matter to the token
        // lookup only, after the body is read.
        let plan = self.plan(&pipeline_head(session, &[]));
        let (idx, decision, body) = match plan {
            Plan::MissingHost(refusal) => {
                session.set_keepalive(None);
                self.answer(session, ctx, &Answer::refusal(&refusal))
                    .await?;
                ctx.outcome = Some(Outcome::Refused(refusal));
                return Ok(true);
            }
            Plan::NoRule => {
                let answer = Answer::message(404, "404 Not Found: no routing rule", false);
                self.answer(session, ctx, &answer).await?;
                return Ok(true);
            }
            Plan::Refuse { rule, refusal } => (rule, pipeline::refused(refusal), None),
            Plan::Route { rule, body } => {
                ctx.rule = Some(rule);
                match self
                    .route_by_path(rule, session.req_header().uri.path())
                    .await
                {
                    Some(decision) => (rule, decision, None),
                    None => {
                        let (decision, body) = self.read_and_decide(session, rule, body).await?;
                        (rule, decision, body)
                    }
                }
            }
        };
        match self.conclude(idx, decision, ctx) {
            Some(answer) => {
                self.answer(session, ctx, &answer).await?;
                Ok(true)
            }
            None => {
                let rule = &self.rules[idx];
                if let Some(pod) = ctx.forwarded() {
                    ctx.kas_open = KasOpen::open(rule, pod, ctx.token.as_ref());
                }
                crate::body::answer_expect(session).await?;
                self.edge_hold(session, ctx, rule, body).await
            }
        }
    }

    /// An address of the decided Pod, from its load balancer (round robin over the
    /// healthy ones, or for kas the one the agent's token hashes to; a retry takes
    /// one this request has not tried, of the same Pod).
    /// Never resolves a name: the load balancer holds addresses only.
    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let addr = self.next_address(ctx).await?;
        let rule = self
            .rule_of(ctx)
            .ok_or_else(|| Error::new_str("no routing decision"))?;
        let mut peer = HttpPeer::new(addr, false, String::new());
        peer.options.connection_timeout = Some(CONNECT_TIMEOUT);
        peer.options.read_timeout = Some(Duration::from_secs(rule.read_timeout_secs));
        if rule.pool == Pool::Kas && session.is_http2() {
            // agentk's and runners' gRPC: HTTP/2 end to end, cleartext to kas (h2c),
            // trailers intact; calls multiplexed on shared connections (pingora's
            // default is one stream a connection: a connection at kas for every
            // held `GetJob` and every idle agent tunnel).
            peer.options.set_http_version(2, 2);
            peer.options.max_h2_streams = KAS_H2_STREAMS;
        }
        Ok(Box::new(peer))
    }

    /// Connection refused or timed out: try another address of the same Pod, never
    /// another Pod's.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if self.connect_failed(ctx) {
            e.set_retry(true);
        }
        e
    }

    /// Errors become GitLab-style JSON answers: no upstream of the Pod reachable →
    /// 503 + `Retry-After` (the runner retries); upstream timeout → 504; other
    /// upstream failures → 502. Nothing is written once a response has started.
    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let (code, answer) = Answer::for_error(e);
        if let Some(answer) = answer
            && session.response_written().is_none()
        {
            let _ = respond(session, ctx, &answer).await;
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
        // Hop-by-hop headers the client listed in `Connection:` end here (RFC 9110
        // §7.6.1): a token in one was not routed by, so it must not reach the Pod.
        for name in sources::connection_listed(&upstream_request.headers) {
            upstream_request.remove_header(&name);
        }
        // What ends at the proxy, as on the fast path; but `Connection`, which
        // pingora has already rewritten for a WebSocket upgrade.
        let dropped: Vec<http::HeaderName> = upstream_request
            .headers
            .keys()
            .filter(|n| {
                **n != http::header::CONNECTION && crate::http1::ends_here(n.as_str().as_bytes())
            })
            .cloned()
            .collect();
        for name in dropped {
            upstream_request.remove_header(&name);
        }
        // A client's copies of the headers the proxy adds are never forwarded,
        // including those this decision leaves unset.
        for name in ADDED_HEADERS {
            upstream_request.remove_header(name);
        }
        if let Some(pod) = ctx.forwarded() {
            let rule = self
                .rule_of(ctx)
                .ok_or_else(|| Error::new_str("no routing decision"))?;
            let mut added = Ok(());
            self.added(ctx, rule, pod.id).for_each(|name, value| {
                if added.is_ok() {
                    added = http::HeaderValue::from_bytes(value)
                        .map_err(|e| Error::because(ErrorType::InternalError, "a header value", e))
                        .and_then(|v| upstream_request.insert_header(name, v));
                }
            });
            added?;
        }
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

    /// A failed request is logged once, by [`ProxyHttp::logging`]: pingora's own
    /// "Fail to proxy" line would log it twice, and at error level for a client's
    /// mistake (a malformed chunked body) as well as for a server fault.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        true
    }

    /// One line per request (`PodGate::log_request`, shared with the fast path).
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = match ctx.answered.load(std::sync::atomic::Ordering::Relaxed) {
            0 => session.response_written().map_or(0, |r| r.status.as_u16()),
            answered => answered,
        };
        let head = session.req_header();
        self.log_request(
            head.method.as_str(),
            head.uri.path(),
            status,
            ctx,
            e,
            "pingora",
            now(),
        );
    }
}
