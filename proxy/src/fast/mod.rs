//! The HTTP/1 fast path for the runner and job endpoints: a pingora `ServerApp`
//! in front of pingora-proxy's service on the plaintext listener.
//!
//! It serves the requests runners send all day — `jobs/request` polls, job
//! updates, trace patches, runner registration — with the **same** rules, token
//! choice, classifier, topology, upstream pools, edge holds, answers, metrics and
//! log lines as pingora-proxy's [`crate::service::PodGate`] (it holds a clone of it
//! and calls its steps; nothing of the routing is written twice). What it saves is
//! pingora-proxy's per-request structure (session objects, header copies, two
//! channels and select loops, a 64 KiB response buffer, boxed hook futures): one
//! parse per direction, one write per direction for a small response, and a held
//! poll that is a socket, its request bytes and a waiter.
//!
//! Everything else is handed to pingora-proxy on the same connection, with the
//! bytes already read put back ([`pingora::protocols::l4::stream::Stream::rewind`])
//! so pingora parses the request as if the fast path did not exist:
//!
//! - TLS connections, HTTP/1.0, h2c, WebSocket and other upgrades, `Expect`;
//! - any framing but one plain `Content-Length` (`Transfer-Encoding`, repeated or
//!   malformed lengths: the smuggling vectors, refused by pingora as before);
//! - a head `httparse` or the `http` crate refuses, or no `Host`;
//! - rules that are not runner or job endpoints (`requires_token`, web pool);
//! - multipart bodies and bodies above the look-ahead (pingora answers the 413 or
//!   streams them).
//!
//! pingora-proxy serves that one request and gives the connection back, so between
//! requests every plaintext HTTP/1.1 connection waits here (and is handed to the new
//! process at an upgrade, [`crate::handover`]); only a head that is not HTTP/1.1
//! (h2c's preface, HTTP/1.0) leaves the connection with pingora-proxy for good.
//! `podgate_proxy_fast_path_requests_total{result}` counts both.

mod forward;
#[doc(hidden)]
pub mod fuzzing;
mod head;
mod response;
mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::listeners::L4BufferSettings;
use pingora::prelude::*;
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use prometheus::IntCounter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::answer::Answer;
use crate::decision;
use crate::edge_poll::{self, PollResult, RunnerRequest, Verdict};
use crate::handover::Handover;
use crate::metrics::METRICS;
use crate::params::BodyKind;
use crate::rules::{ActionKind, Pool, Rule};
use crate::service::{Ctx, PodGate};
use crate::sources::{Body, TokenSource};

use head::{Head, Parsed};

/// How long an idle client connection is kept between requests (pingora's
/// default keep-alive, `apps/mod.rs`).
const KEEPALIVE: Duration = Duration::from_secs(60);

/// How long one read of a request body may take.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connection attempts for one request (pingora's `max_retries` default).
const MAX_ATTEMPTS: usize = 16;

/// The largest read of a response body relayed at a time.
const RELAY_CHUNK: usize = 64 * 1024;

/// The fast path, and pingora-proxy's service behind it. A clone shares
/// everything (the upstream pool too): the one serving connections handed over at
/// an upgrade is a clone of the listener's ([`crate::handover`]).
#[derive(Clone)]
pub struct FastPath {
    gate: PodGate,
    proxy: Arc<HttpProxy<PodGate>>,
    pool: Arc<upstream::Pool>,
    head_timeout: Duration,
    enabled: bool,
    /// The listener's buffers, given back to a connection handed to pingora-proxy.
    buffers: L4BufferSettings,
    served: IntCounter,
    /// Where idle connections go when this process shuts down, if a new one serves.
    handover: Option<Arc<Handover>>,
}

impl FastPath {
    /// Serve runner requests with `gate` (a clone of the one inside `proxy`), hand
    /// everything else to `proxy`. A request head must be complete within
    /// `head_timeout` of its first byte, as on pingora's path (`head_timeout_ms`).
    pub fn new(gate: PodGate, proxy: HttpProxy<PodGate>, head_timeout: Duration) -> Self {
        FastPath {
            gate,
            proxy: Arc::new(proxy),
            pool: Arc::default(),
            head_timeout,
            enabled: true,
            buffers: L4BufferSettings::default(),
            served: METRICS.fast_path.with_label_values(&["served"]),
            handover: None,
        }
    }

    /// Hand idle connections to `handover`'s successor at shutdown.
    pub fn handover(mut self, handover: Arc<Handover>) -> Self {
        self.handover = Some(handover);
        self
    }

    /// The listener's buffer settings (`read_buffer_bytes`), restored on a
    /// connection handed to pingora-proxy.
    pub fn listener_buffers(mut self, buffers: L4BufferSettings) -> Self {
        self.buffers = buffers;
        self
    }

    /// `false`: hand every connection to pingora-proxy (`fast_path = false`).
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }
}

/// A client connection and the bytes read from it not yet consumed.
struct Conn {
    /// Unbuffered until pingora-proxy has served a request on it: the fast path
    /// reads into `buf` and writes whole buffers (each write flushed), so the
    /// listener's buffers would only cost memory (1.4 KiB per held poll). Once
    /// pingora has used them they stay, since it may have read ahead into them.
    stream: Box<L4Stream>,
    buf: Vec<u8>,
    /// The server's shutdown: an answer written once it is on says
    /// `Connection: close`.
    shutdown: ShutdownWatch,
}

impl Conn {
    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// How a connection leaves the fast path.
enum Next {
    /// Closed (by the client, a timeout, shutdown or an error).
    Close,
    /// To pingora-proxy, with the bytes read put back; why (a metric label).
    HandOff(&'static str),
}

#[async_trait]
impl ServerApp for FastPath {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        if !self.enabled {
            return ServerApp::process_new(&self.proxy, stream, shutdown).await;
        }
        if !stream.as_any().is::<L4Stream>() {
            // TLS: ALPN and h2 are pingora's.
            METRICS.fast_path.with_label_values(&["tls"]).inc();
            return ServerApp::process_new(&self.proxy, stream, shutdown).await;
        }
        let mut stream = stream.into_any().downcast::<L4Stream>().ok()?;
        // Nothing has been read or written yet: no buffered byte is lost.
        stream.set_buffer(L4BufferSettings::unbuffered());
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            shutdown: shutdown.clone(),
        };
        let mut buffered = false;
        loop {
            let why = match self.serve(&mut conn).await {
                Next::Close => return None,
                Next::HandOff(why) => why,
            };
            METRICS.fast_path.with_label_values(&[why]).inc();
            let Conn {
                mut stream, buf, ..
            } = conn;
            if !buffered {
                // Every write was flushed and every read went into `buf`: the
                // stream's (empty) buffers can be replaced. They stay: what pingora
                // read ahead into them is read from them from now on.
                stream.set_buffer(self.buffers);
                buffered = true;
            }
            stream.rewind(&buf);
            drop(buf);
            if matches!(why, "head" | "version") {
                // Not an HTTP/1.1 head (h2c's preface among them): the connection
                // is pingora's from here on.
                return ServerApp::process_new(&self.proxy, stream, shutdown).await;
            }
            // One request on pingora-proxy, as its own loop would serve it
            // (`apps/mod.rs`), and the connection comes back: idle between requests
            // it is the fast path's, so it is handed over at an upgrade
            // ([`crate::handover`]) rather than closed by pingora's loop.
            let mut session = ServerSession::new_http1(stream);
            session.set_keepalive((!*shutdown.borrow()).then_some(KEEPALIVE.as_secs()));
            let (stream, _) = self
                .proxy
                .process_new_http(session, shutdown)
                .await?
                .consume();
            conn = Conn {
                stream: stream.into_any().downcast::<L4Stream>().ok()?,
                buf: Vec::new(),
                shutdown: shutdown.clone(),
            };
        }
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.proxy).await;
    }
}

/// Resolves, with the hand-over, once the server shuts down and a new process
/// serves; never without.
async fn handover_due<'h>(
    handover: Option<&'h Handover>,
    shutdown: &mut ShutdownWatch,
) -> &'h Handover {
    let Some(handover) = handover else {
        return std::future::pending().await;
    };
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
    if !handover.has_successor() {
        return std::future::pending().await;
    }
    handover
}

/// Whether a rule's requests may take the fast path: runner and job endpoints
/// (GitLab requires their token) on the Pod's web pool.
fn fast_rule(rule: &Rule) -> bool {
    rule.action == ActionKind::RouteByToken && rule.pool == Pool::Web && rule.requires_token
}

/// A failed forward: the error (for the log and the answer) and whether a response
/// had started (then nothing more can be said to the client).
struct Failed {
    error: Box<Error>,
    responded: bool,
}

impl Failed {
    fn before(error: Box<Error>) -> Self {
        Failed {
            error,
            responded: false,
        }
    }
}

impl FastPath {
    /// Serve requests on `conn` until it closes or one is for pingora-proxy.
    async fn serve(&self, conn: &mut Conn) -> Next {
        let mut first = true;
        loop {
            let head = match self.read_head(conn, first).await {
                Ok(Some(head)) => head,
                Ok(None) => return Next::Close,
                Err(why) => return Next::HandOff(why),
            };
            first = false;
            match self.request(conn, head).await {
                Ok(true) => {}
                Ok(false) => return Next::Close,
                Err(next) => return next,
            }
        }
    }

    /// Read until the buffer starts with a whole head. `Ok(None)`: the connection
    /// closed or idled out.
    ///
    /// Shutdown does not cut a keep-alive wait short, unlike pingora's own loop: a
    /// client may have sent its next request on the idle connection the moment the
    /// proxy closes it, and that request fails with a reset (`scripts/drills.sh` R5
    /// caught a runner's poll so during an upgrade). At an upgrade, the idle
    /// connection goes to the new process ([`crate::handover`]; `Ok(None)` here).
    /// Otherwise the wait goes on through the grace period, and the next request is
    /// served with `Connection: close` (`request`), which moves the client on at a
    /// point where nothing is in flight; a connection idle through the whole grace
    /// period is dropped with the runtime.
    async fn read_head(&self, conn: &mut Conn, first: bool) -> Result<Option<Head>, &'static str> {
        let mut deadline = None;
        let mut handover = self.handover.as_deref();
        loop {
            if !conn.buf.is_empty() {
                match head::parse(&conn.buf) {
                    Parsed::Head(h) => return Ok(Some(h)),
                    Parsed::HandOff(why) => return Err(why),
                    Parsed::Partial => {}
                }
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + self.head_timeout);
            }
            let read = match deadline {
                None => {
                    if !first {
                        // Idle between requests: nothing is held but the socket.
                        conn.buf = Vec::new();
                    }
                    tokio::select! {
                        // What the client sent, or the stream's buffer holds, first:
                        // a hand-over must leave no byte of it behind.
                        biased;
                        read = tokio::time::timeout(
                            KEEPALIVE,
                            read_more(&mut conn.stream, &mut conn.buf),
                        ) => read,
                        to = handover_due(handover, &mut conn.shutdown) => {
                            // Nothing of a next request has been read: the socket,
                            // and whatever the client sends on it, is the new
                            // process's. A failed send keeps it here.
                            if to.send(&conn.stream).is_ok() {
                                return Ok(None);
                            }
                            handover = None;
                            continue;
                        }
                    }
                }
                Some(d) => {
                    tokio::time::timeout_at(d, read_more(&mut conn.stream, &mut conn.buf)).await
                }
            };
            match read {
                Ok(Ok(n)) if n > 0 => {}
                // Closed, failed, or no whole head within the deadline: as pingora
                // (patch 0002), the connection ends.
                _ => return Ok(None),
            }
        }
    }

    /// Serve one request whose head is at the start of the buffer. `Ok(keepalive)`
    /// when it was answered; `Err` when the connection leaves the fast path.
    async fn request(&self, conn: &mut Conn, head: Head) -> Result<bool, Next> {
        let started = Instant::now();
        let gate = &self.gate;
        let host = head
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok());
        let idx = gate
            .rule_for(&head.method, head.path(&conn.buf), &head.headers, host)
            .filter(|i| fast_rule(&gate.rules[*i]))
            .ok_or(Next::HandOff("rule"))?;
        let rule = &gate.rules[idx];
        let kind = match rule.sources.iter().any(TokenSource::reads_body) {
            false => None,
            true => {
                let content_type = head
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok());
                match BodyKind::of(content_type, &head.method) {
                    Ok(BodyKind::Opaque) => None,
                    Ok(k) if k.whole() => Some(k),
                    // Multipart, or a type pingora's path refuses with its words.
                    _ => return Err(Next::HandOff("body")),
                }
            }
        };
        let limit = match (rule.max_body_bytes, &kind) {
            (Some(max), Some(_)) => max.min(gate.body_lookahead),
            _ => gate.body_lookahead,
        };
        if head.body_len > limit {
            return Err(Next::HandOff("body"));
        }
        let total = head.len + head.body_len;
        while conn.buf.len() < total {
            conn.buf.reserve(total - conn.buf.len());
            match tokio::time::timeout(BODY_READ_TIMEOUT, conn.stream.read_buf(&mut conn.buf)).await
            {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(Next::Close),
            }
        }

        let mut ctx = Ctx {
            started: Some(started),
            request_id: gate.request_id(&head.headers),
            rule: Some(idx),
            ..Ctx::default()
        };
        let body = &conn.buf[head.len..total];
        let whole = kind.as_ref().filter(|_| !body.is_empty());
        let request = decision::Request {
            headers: &head.headers,
            query: head.query(&conn.buf),
            body: whole.map(|k| {
                (
                    k,
                    Body {
                        bytes: body,
                        complete: true,
                    },
                )
            }),
            hop_by_hop: &head.hop_by_hop,
        };
        let decision = gate.token_decision(rule, &request);
        ctx.token = decision.token;
        let outcome = gate.settle(idx, decision.outcome, started);
        let answer = Answer::for_outcome(rule.pool, &outcome);
        ctx.outcome = Some(outcome);
        // Bytes past this request (a pipelined one) end the connection after the
        // answer, as pingora refuses to reuse a connection whose request was
        // overread (`v1/server.rs`, `reuse`): no request is parsed from bytes that
        // came with another one.
        let overread = conn.buf.len() > total;
        let keepalive = head.keepalive && !overread;
        // Workhorse reads the body only when it is JSON or a form read whole.
        let runner_body = whole.is_some().then_some(head.len..total);

        if let Some(answer) = answer {
            return self
                .answer(conn, &head, total, &ctx, &answer, keepalive)
                .await;
        }
        if let Some(verdict) = self.edge_hold(conn, &head, &ctx, rule, runner_body).await {
            match verdict {
                Verdict::Forward(r) => ctx.edge = Some(r),
                Verdict::NoContent(r, last_update) => {
                    ctx.edge = Some(r);
                    let answer = Answer::edge_no_content(&last_update);
                    return self
                        .answer(conn, &head, total, &ctx, &answer, keepalive)
                        .await;
                }
                Verdict::ClientGone => {
                    ctx.edge = Some(PollResult::ClientGone);
                    let e = Error::explain(
                        ErrorType::ConnectionClosed,
                        "the client went away during a long poll held at the edge",
                    )
                    .into_down();
                    self.log(conn, &head, 0, &ctx, Some(&e));
                    return Err(Next::Close);
                }
            }
        }
        match self
            .forward(conn, &head, total, rule, &mut ctx, keepalive)
            .await
        {
            Ok((status, keepalive)) => {
                self.served.inc();
                self.log(conn, &head, status, &ctx, None);
                conn.buf.drain(..total);
                Ok(keepalive)
            }
            Err(failed) => {
                let (code, answer) = Answer::for_error(&failed.error);
                let mut status = 0;
                if let (Some(answer), false) = (answer, failed.responded) {
                    let mut out = Vec::new();
                    answer.write_h1(&ctx.request_id, true, &mut out);
                    if write_all(&mut conn.stream, &out).await.is_ok() {
                        status = code;
                    }
                }
                self.log(conn, &head, status, &ctx, Some(&failed.error));
                Err(Next::Close)
            }
        }
    }

    /// Answer from the proxy itself, count and log it.
    async fn answer(
        &self,
        conn: &mut Conn,
        head: &Head,
        total: usize,
        ctx: &Ctx,
        answer: &Answer,
        keepalive: bool,
    ) -> Result<bool, Next> {
        // Shutdown may have come during the request (a hold at the edge).
        let keepalive = keepalive && !conn.shutting_down();
        let mut out = Vec::with_capacity(256);
        answer.write_h1(&ctx.request_id, !keepalive, &mut out);
        let written = write_all(&mut conn.stream, &out).await;
        self.served.inc();
        let e = written
            .err()
            .map(|e| Error::because(ErrorType::WriteError, "writing the answer", e).into_down());
        let status = if e.is_some() { 0 } else { answer.status };
        self.log(conn, head, status, ctx, e.as_deref());
        conn.buf.drain(..total);
        match e {
            None => Ok(keepalive),
            Some(_) => Err(Next::Close),
        }
    }

    fn log(&self, conn: &Conn, head: &Head, status: u16, ctx: &Ctx, e: Option<&Error>) {
        self.gate.log_request(
            head.method.as_str(),
            head.path(&conn.buf),
            status,
            ctx,
            e,
            "fast",
        );
    }

    /// A `jobs/request` poll to a Pod that opts in to edge holds: hold it here
    /// ([`edge_poll::PodPolls::hold`]); `None` when the Pod does not opt in.
    async fn edge_hold(
        &self,
        conn: &mut Conn,
        head: &Head,
        ctx: &Ctx,
        rule: &Rule,
        body: Option<std::ops::Range<usize>>,
    ) -> Option<Verdict> {
        let polls = ctx
            .forwarded()
            .filter(|_| rule.name == edge_poll::JOBS_REQUEST_RULE)
            .and_then(|pod| self.gate.edge_polls.as_ref()?.pod(pod.id))?;
        let request = RunnerRequest::read(&head.headers, body.map(|r| &conn.buf[r]));
        // Held for up to a minute: keep no more than the request itself.
        conn.buf.shrink_to_fit();
        let stream = &mut conn.stream;
        let gone = async {
            // The request is read whole: this returns only when the client closes
            // (or sends bytes it should not before its answer), as on pingora's path.
            let mut byte = [0u8; 1];
            let _ = stream.read(&mut byte).await;
        };
        Some(polls.hold(request, gone).await)
    }
}

/// Read more of the request into the connection's buffer (`buf`); the fields,
/// not the `Conn`, so that its shutdown watch can be awaited beside the read.
async fn read_more(stream: &mut L4Stream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 512 {
        buf.reserve(if buf.is_empty() { 2048 } else { 4096 });
    }
    stream.read_buf(buf).await
}

/// Write all of `bytes` and flush (the listener's write buffer coalesces nothing
/// here: the caller's buffer is already whole).
async fn write_all(stream: &mut L4Stream, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}
