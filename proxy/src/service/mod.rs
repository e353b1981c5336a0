//! [`PodGate`]: the pingora `ProxyHttp` implementation. One request goes through:
//! `request_filter` (match a rule, find and classify the token, decide) →
//! `upstream_peer` (pick a healthy upstream of the decided Pod) →
//! `upstream_request_filter` (mark the request) → `response_filter` (request id) →
//! `logging` (metrics, and one line per request with a token fingerprint only).
//! A `jobs/request` poll of a Pod that opts in may be held (and answered) in
//! `request_filter` instead ([`crate::edge_poll`]).

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
use crate::body::{DEFAULT_BODY_LOOKAHEAD, read_body, too_large};
use crate::decision::{self, Decision, OnInvalid, Outcome, Refusal};
use crate::edge_poll::{self, EdgePolls, PollResult, RunnerRequest, Verdict};
use crate::metrics::{self, METRICS};
use crate::params::BodyKind;
use crate::request_id::RequestIds;
use crate::rules::{ActionKind, Pool, Rule};
use crate::server::RegistryHandle;
use crate::sources::{self, Body, Candidate, Place, TokenSource};
use crate::upstreams::Upstreams;

mod steps;

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
    /// How an edge hold ended, if the poll went through one.
    pub(crate) edge: Option<PollResult>,
    /// The request's slot among those in flight to its upstream address
    /// (`upstreams.max_connections_per_address`), held until the request ends.
    pub(crate) slot: Option<crate::upstreams::Slot>,
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
            .map(|r| r.sources.iter().map(TokenSource::labels).collect())
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
        }
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

    /// Route by token: read what the rule's sources need (the body only when a
    /// parameter source may be in it), then decide ([`decision::route_by_token`]).
    /// Also the body, when it was read whole. `Err`: the client went away while its
    /// body was read.
    async fn route_by_token(
        &self,
        session: &mut Session,
        rule: &Rule,
    ) -> Result<(Decision, Option<Vec<u8>>)> {
        let head = session.req_header();
        let hop_by_hop = sources::connection_listed(&head.headers);
        let mut kind = None;
        if rule.sources.iter().any(TokenSource::reads_body) {
            let content_type = head
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            match BodyKind::of(content_type, &head.method) {
                Err(e) => {
                    return Ok((
                        refused(Refusal::bad_request("malformed_body", e.to_string())),
                        None,
                    ));
                }
                Ok(BodyKind::Opaque) => {}
                Ok(k) => kind = Some(k),
            }
        }
        let mut body = None;
        if let Some(k) = &kind
            && !session.is_body_empty()
        {
            let limit = match rule.max_body_bytes {
                Some(max) if k.whole() => max.min(self.body_lookahead),
                _ => self.body_lookahead,
            };
            let read = read_body(session, limit, k.whole()).await?;
            if session.retry_buffer_truncated() {
                return Ok((refused(too_large(limit)), None));
            }
            if k.whole() && !read.complete {
                // A JSON or form body past the look-ahead. Runner and job endpoints
                // carry small bodies (Workhorse refuses `jobs/request` over 32 KiB):
                // refuse. The general API takes large ones (commits, snippets):
                // route by the head, as the cells router does.
                if rule.requires_token {
                    return Ok((refused(too_large(limit)), None));
                }
                kind = None;
            } else {
                body = Some(read);
            }
        }
        let head = session.req_header();
        let request = decision::Request {
            headers: &head.headers,
            query: head.uri.query(),
            body: kind.as_ref().zip(body.as_ref()).map(|(k, b)| {
                (
                    k,
                    Body {
                        bytes: &b.bytes,
                        complete: b.complete,
                    },
                )
            }),
            hop_by_hop: &hop_by_hop,
        };
        let decision = self.token_decision(rule, &request);
        let whole = body.filter(|b| b.complete).map(|b| b.bytes);
        Ok((decision, whole))
    }

    /// A `jobs/request` poll forwarded to a Pod that opts in to edge holds: hold it
    /// here ([`edge_poll::PodPolls::hold`]). `Ok(true)`: answered here (204);
    /// `Ok(false)`: forward it; `Err`: the client went away during the hold.
    async fn edge_hold(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        rule: &Rule,
        body: Option<Vec<u8>>,
    ) -> Result<bool> {
        let Some(polls) = ctx
            .forwarded()
            .filter(|_| rule.name == edge_poll::JOBS_REQUEST_RULE)
            .and_then(|pod| self.edge_polls.as_ref()?.pod(pod.id))
        else {
            return Ok(false);
        };
        let request = RunnerRequest::read(&session.req_header().headers, body.as_deref());
        drop(body);
        let gone = async {
            // The body is read: this only returns when the client closes (or sends
            // bytes it should not before its answer).
            let _ = session.read_body_or_idle(true).await;
        };
        match polls.hold(request, gone).await {
            Verdict::Forward(r) => {
                ctx.edge = Some(r);
                Ok(false)
            }
            Verdict::NoContent(r, last_update) => {
                ctx.edge = Some(r);
                respond(session, ctx, &Answer::edge_no_content(&last_update)).await?;
                Ok(true)
            }
            Verdict::ClientGone => {
                ctx.edge = Some(PollResult::ClientGone);
                Err(Error::explain(
                    ErrorType::ConnectionClosed,
                    "the client went away during a long poll held at the edge",
                )
                .into_down())
            }
        }
    }

    /// The metric label of a token's source.
    fn source_label(&self, rule: usize, token: &Candidate) -> &str {
        self.source_labels[rule][token.source]
            .iter()
            .find(|(place, _)| *place == token.place)
            .map_or("none", |(_, label)| label.as_str())
    }
}

fn refused(refusal: Refusal) -> Decision {
    Decision {
        outcome: Outcome::Refused(refusal),
        token: None,
    }
}

/// Write an answer of the proxy's own through pingora's session.
async fn respond(session: &mut Session, ctx: &Ctx, answer: &Answer) -> Result<()> {
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
        let started = Instant::now();
        ctx.started = Some(started);
        ctx.request_id = self.request_id(&session.req_header().headers);
        let head = session.req_header();
        // RFC 9112 §3.2: an HTTP/1 request without Host is a 400, HTTP/1.0 included
        // (HTTP/2 carries `:authority` instead).
        if !session.is_http2() && !head.headers.contains_key(http::header::HOST) {
            let refusal = Refusal::bad_request("missing_host", "the request has no Host header");
            respond(session, ctx, &Answer::refusal(&refusal)).await?;
            ctx.outcome = Some(Outcome::Refused(refusal));
            return Ok(true);
        }
        // `Connection` is a list field: a `close` in any of its lines ends the
        // connection after this request (RFC 9112 §9.6). pingora reads only the first.
        if head
            .headers
            .get_all(http::header::CONNECTION)
            .iter()
            .skip(1)
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("close"))
        {
            session.set_keepalive(None);
        }
        let head = session.req_header();
        // HTTP/1 names the host in `Host`; HTTP/2 in `:authority` (the URI's).
        let host = head
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| head.uri.authority().map(|a| a.as_str()));
        let Some(idx) = self.rule_for(&head.method, head.uri.path(), &head.headers, host) else {
            let answer = Answer::message(404, "404 Not Found: no routing rule", false);
            respond(session, ctx, &answer).await?;
            return Ok(true);
        };
        ctx.rule = Some(idx);
        let rule = &self.rules[idx];
        let mut body = None;
        let outcome = match rule.action {
            ActionKind::RouteByToken => {
                let (decision, whole) = self.route_by_token(session, rule).await?;
                body = whole;
                ctx.token = decision.token;
                decision.outcome
            }
            _ => self.fixed_outcome(rule, &session.req_header().headers),
        };
        let outcome = self.settle(idx, outcome, started);
        let answer = Answer::for_outcome(rule.pool, &outcome);
        ctx.outcome = Some(outcome);
        match answer {
            Some(answer) => {
                respond(session, ctx, &answer).await?;
                Ok(true)
            }
            None => self.edge_hold(session, ctx, rule, body).await,
        }
    }

    /// An address of the decided Pod, from its load balancer (round robin over the
    /// healthy ones, or for kas the one the agent's token hashes to; a retry takes
    /// one this request has not tried, of the same Pod).
    /// Never resolves a name: the load balancer holds addresses only.
    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let Some(pod) = ctx.forwarded().cloned() else {
            return Err(Error::new_str("no routing decision"));
        };
        let rule = &self.rules[ctx.rule.unwrap_or(0)];
        // kas: every stream of one agentk (same token) to the same kas (see
        // `upstreams`); elsewhere the key is unused (round robin).
        let key = match (&ctx.token, rule.pool) {
            (Some(t), Pool::Kas) => t.token.as_bytes(),
            _ => ctx.request_id.as_bytes(),
        };
        let Some(addr) = self.upstreams.select(pod.id, rule.pool, key, &ctx.tried) else {
            return Err(Error::explain(
                ErrorType::ConnectNoRoute,
                "no address of the Pod left to try",
            ));
        };
        ctx.tried.push(addr);
        // A retry's address takes its own slot; the failed one's is given back.
        ctx.slot = None;
        ctx.slot = self.upstreams.admit(pod.id, rule.pool, addr).await?;
        let mut peer = HttpPeer::new(addr, false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(2));
        peer.options.read_timeout = Some(Duration::from_secs(rule.read_timeout_secs));
        if rule.pool == Pool::Kas && session.is_http2() {
            // agentk's gRPC: HTTP/2 end to end, cleartext to kas (h2c), trailers intact.
            peer.options.set_http_version(2, 2);
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
        if let Some(pod) = ctx.forwarded() {
            METRICS
                .connect_failures
                .with_label_values(&[pod.id.to_string().as_str()])
                .inc();
            let pool = self.rules[ctx.rule.unwrap_or(0)].pool;
            if self.upstreams.untried_left(pod.id, pool, &ctx.tried) {
                e.set_retry(true);
            }
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

    /// One line per request (`PodGate::log_request`, shared with the fast path).
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let head = session.req_header();
        self.log_request(
            head.method.as_str(),
            head.uri.path(),
            status,
            ctx,
            e,
            "pingora",
        );
    }
}
