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
//! Once handed off, a connection stays with pingora-proxy.
//! `podgate_proxy_fast_path_requests_total{result}` counts both.

mod head;
mod response;
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::prelude::*;
use pingora::protocols::Stream;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use prometheus::IntCounter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::answer::Answer;
use crate::decision;
use crate::edge_poll::{self, PollResult, RunnerRequest, Verdict};
use crate::metrics::METRICS;
use crate::params::BodyKind;
use crate::rules::{ActionKind, Pool, Rule};
use crate::service::{Ctx, PodGate};
use crate::sources::{self, Body, TokenSource};

use head::{Head, Parsed};
use response::{ChunkScanner, Framing, ResponseHead};
use upstream::ConnectError;

/// How long an idle client connection is kept between requests (pingora's
/// default keep-alive, `apps/mod.rs`).
const KEEPALIVE: Duration = Duration::from_secs(60);

/// How long one read of a request body may take.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Most connection attempts for one request (pingora's `max_retries` default).
const MAX_ATTEMPTS: usize = 16;

/// The largest read of a response body relayed at a time.
const RELAY_CHUNK: usize = 64 * 1024;

/// The fast path, and pingora-proxy's service behind it.
pub struct FastPath {
    gate: PodGate,
    proxy: Arc<HttpProxy<PodGate>>,
    pool: upstream::Pool,
    head_timeout: Duration,
    enabled: bool,
    served: IntCounter,
}

impl FastPath {
    /// Serve runner requests with `gate` (a clone of the one inside `proxy`), hand
    /// everything else to `proxy`. A request head must be complete within
    /// `head_timeout` of its first byte, as on pingora's path (`head_timeout_ms`).
    pub fn new(gate: PodGate, proxy: HttpProxy<PodGate>, head_timeout: Duration) -> Self {
        FastPath {
            gate,
            proxy: Arc::new(proxy),
            pool: upstream::Pool::default(),
            head_timeout,
            enabled: true,
            served: METRICS.fast_path.with_label_values(&["served"]),
        }
    }

    /// `false`: hand every connection to pingora-proxy (`fast_path = false`).
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }
}

/// A client connection and the bytes read from it not yet consumed.
struct Conn {
    stream: Stream,
    buf: Vec<u8>,
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
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
        };
        match self.serve(&mut conn, shutdown).await {
            Next::Close => None,
            Next::HandOff(why) => {
                METRICS.fast_path.with_label_values(&[why]).inc();
                let Conn { stream, buf } = conn;
                let mut l4 = stream.into_any().downcast::<L4Stream>().ok()?;
                l4.rewind(&buf);
                drop(buf);
                ServerApp::process_new(&self.proxy, l4, shutdown).await
            }
        }
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.proxy).await;
    }
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
    async fn serve(&self, conn: &mut Conn, shutdown: &ShutdownWatch) -> Next {
        loop {
            let head = match self.read_head(conn, shutdown).await {
                Ok(Some(head)) => head,
                Ok(None) => return Next::Close,
                Err(why) => return Next::HandOff(why),
            };
            match self.request(conn, head, shutdown).await {
                Ok(true) => {}
                Ok(false) => return Next::Close,
                Err(next) => return next,
            }
        }
    }

    /// Read until the buffer starts with a whole head. `Ok(None)`: the connection
    /// closed, idled out, or the server is shutting down between requests.
    async fn read_head(
        &self,
        conn: &mut Conn,
        shutdown: &ShutdownWatch,
    ) -> Result<Option<Head>, &'static str> {
        let mut deadline = None;
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
                    // Idle between requests: nothing is held but the socket.
                    conn.buf = Vec::new();
                    let mut shutdown = shutdown.clone();
                    if *shutdown.borrow() {
                        return Ok(None);
                    }
                    tokio::select! {
                        r = tokio::time::timeout(KEEPALIVE, read_more(conn)) => r,
                        _ = shutdown.changed() => return Ok(None),
                    }
                }
                Some(d) => tokio::time::timeout_at(d, read_more(conn)).await,
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
    async fn request(
        &self,
        conn: &mut Conn,
        head: Head,
        shutdown: &ShutdownWatch,
    ) -> Result<bool, Next> {
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
        let hop_by_hop = sources::connection_listed(&head.headers);
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
            hop_by_hop: &hop_by_hop,
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
        let keepalive = head.keepalive && !overread && !*shutdown.borrow();
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

    /// Send the request to the decided Pod and relay its response. `Ok((status,
    /// keepalive))` once the response is relayed whole.
    async fn forward(
        &self,
        conn: &mut Conn,
        head: &Head,
        total: usize,
        rule: &Rule,
        ctx: &mut Ctx,
        keepalive: bool,
    ) -> Result<(u16, bool), Failed> {
        let Some(pod) = ctx.forwarded().cloned() else {
            return Err(Failed::before(Error::new_str("no routing decision")));
        };
        let request = upstream_request(&conn.buf, head, total, rule, &pod, &ctx.request_id);
        let read_timeout = Duration::from_secs(rule.read_timeout_secs);
        let mut fresh_for: Option<SocketAddr> = None;
        for _ in 0..MAX_ATTEMPTS {
            let fresh = fresh_for.is_some();
            let addr = match fresh_for.take() {
                Some(addr) => addr,
                None => {
                    let selected = self.gate.upstreams.select(
                        pod.id,
                        rule.pool,
                        ctx.request_id.as_bytes(),
                        &ctx.tried,
                    );
                    let Some(addr) = selected else {
                        return Err(Failed::before(
                            Error::explain(
                                ErrorType::ConnectNoRoute,
                                "no address of the Pod left to try",
                            )
                            .into_up(),
                        ));
                    };
                    ctx.tried.push(addr);
                    addr
                }
            };
            let checked_out = match connection(&self.pool, addr, fresh).await {
                Ok(c) => c,
                Err(e) => {
                    METRICS
                        .connect_failures
                        .with_label_values(&[pod.id.to_string().as_str()])
                        .inc();
                    if self
                        .gate
                        .upstreams
                        .untried_left(pod.id, rule.pool, &ctx.tried)
                    {
                        continue;
                    }
                    return Err(Failed::before(e));
                }
            };
            let (mut up, reused) = checked_out;
            if let Err(e) = up.write_all(&request).await {
                if reused {
                    fresh_for = Some(addr);
                    continue;
                }
                return Err(Failed::before(
                    Error::because(ErrorType::WriteError, "sending the request", e).into_up(),
                ));
            }
            let response = self.read_response(conn, &mut up, head, read_timeout).await;
            let (rbuf, rhead) = match response {
                Ok(r) => r,
                Err(Attempt::Retry) if reused => {
                    fresh_for = Some(addr);
                    continue;
                }
                Err(Attempt::Retry) => {
                    return Err(Failed::before(
                        Error::explain(
                            ErrorType::ConnectionClosed,
                            "the Pod closed the connection before answering",
                        )
                        .into_up(),
                    ));
                }
                Err(Attempt::Failed(e)) => return Err(Failed::before(e)),
            };
            let close = !keepalive || rhead.framing == Framing::Close;
            let reusable = self
                .relay(
                    conn,
                    &mut up,
                    rbuf,
                    &rhead,
                    &ctx.request_id,
                    close,
                    read_timeout,
                )
                .await?;
            if reusable {
                self.pool.put_back(addr, up);
            }
            return Ok((rhead.status, !close));
        }
        Err(Failed::before(
            Error::explain(ErrorType::ConnectError, "too many connection attempts").into_up(),
        ))
    }

    /// Read the response head from `up`, skipping interim responses, while
    /// watching the client: one that closes ends the request (its upstream
    /// connection too, so a Pod holding a long poll for it is released).
    async fn read_response(
        &self,
        conn: &mut Conn,
        up: &mut TcpStream,
        head: &Head,
        read_timeout: Duration,
    ) -> Result<(Vec<u8>, ResponseHead), Attempt> {
        // Allocated when the first byte arrives: a poll the Pod holds costs no buffer.
        let mut rbuf: Vec<u8> = Vec::new();
        let mut byte = [0u8; 1];
        let timeout = tokio::time::sleep(read_timeout);
        tokio::pin!(timeout);
        loop {
            tokio::select! {
                ready = up.readable() => {
                    if let Err(e) = ready {
                        return Err(Attempt::failed_reading(&rbuf, e));
                    }
                }
                // The request is read whole: the client may only close, as pingora's
                // `read_body_or_idle` expects.
                read = conn.stream.read(&mut byte) => {
                    let e = match read {
                        Ok(n) if n > 0 => Error::explain(
                            ErrorType::ConnectError,
                            "Sent data after end of body",
                        ),
                        _ => Error::explain(
                            ErrorType::ConnectionClosed,
                            "the client went away while the Pod answered",
                        ),
                    };
                    return Err(Attempt::Failed(e.into_down()));
                },
                () = &mut timeout => {
                    return Err(Attempt::Failed(
                        Error::explain(ErrorType::ReadTimedout, "reading the Pod's response")
                            .into_up(),
                    ));
                }
            }
            if rbuf.capacity() - rbuf.len() < 1024 {
                rbuf.reserve(4096);
            }
            match up.try_read_buf(&mut rbuf) {
                Ok(0) => {
                    return Err(Attempt::failed_reading(
                        &rbuf,
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(Attempt::failed_reading(&rbuf, e)),
            }
            loop {
                match response::parse(&rbuf, head.method == http::Method::HEAD) {
                    response::Parsed::Partial => break,
                    response::Parsed::Interim(n) => {
                        rbuf.drain(..n);
                    }
                    response::Parsed::Head(h) => return Ok((rbuf, h)),
                    response::Parsed::Invalid(why) => {
                        return Err(Attempt::Failed(
                            Error::explain(ErrorType::InvalidHTTPHeader, why).into_up(),
                        ));
                    }
                }
            }
        }
    }

    /// Write the response head (and what body has arrived) to the client in one
    /// write, then relay the rest of the body. `Ok(true)`: the upstream connection
    /// ended cleanly and may be reused.
    #[allow(clippy::too_many_arguments)]
    async fn relay(
        &self,
        conn: &mut Conn,
        up: &mut TcpStream,
        mut rbuf: Vec<u8>,
        rhead: &ResponseHead,
        request_id: &str,
        close: bool,
        read_timeout: Duration,
    ) -> Result<bool, Failed> {
        let mut out = Vec::with_capacity(rhead.len + 96);
        rhead.write_for_client(&rbuf, request_id, close, &mut out);
        let mut body = BodyEnd::new(rhead.framing);
        let (take, mut done, mut clean) = body.take(&rbuf[rhead.len..])?;
        out.extend_from_slice(&rbuf[rhead.len..rhead.len + take]);
        let downstream = |e| Failed {
            error: Error::because(ErrorType::WriteError, "writing the response", e).into_down(),
            responded: true,
        };
        write_all(&mut conn.stream, &out)
            .await
            .map_err(downstream)?;
        drop(out);
        while !done {
            rbuf.clear();
            rbuf.reserve(RELAY_CHUNK);
            let read = tokio::time::timeout(read_timeout, up.read_buf(&mut rbuf)).await;
            let n = match read {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => {
                    return Err(Failed {
                        error: Error::because(ErrorType::ReadError, "reading the body", e)
                            .into_up(),
                        responded: true,
                    });
                }
                Err(_) => {
                    return Err(Failed {
                        error: Error::explain(ErrorType::ReadTimedout, "reading the body")
                            .into_up(),
                        responded: true,
                    });
                }
            };
            if n == 0 {
                if body.framing == Framing::Close {
                    break;
                }
                return Err(Failed {
                    error: Error::explain(
                        ErrorType::ConnectionClosed,
                        "the Pod closed before the body ended",
                    )
                    .into_up(),
                    responded: true,
                });
            }
            let (take, end, tail_clean) = body.take(&rbuf)?;
            done = end;
            clean = tail_clean;
            write_all(&mut conn.stream, &rbuf[..take])
                .await
                .map_err(downstream)?;
        }
        Ok(rhead.reusable && clean)
    }
}

/// One attempt's failure to get a response head.
enum Attempt {
    /// The Pod closed or reset before any byte: on a reused connection, send again
    /// on a new one.
    Retry,
    /// Anything else.
    Failed(Box<Error>),
}

impl Attempt {
    fn failed_reading(read: &[u8], e: std::io::Error) -> Attempt {
        if read.is_empty() {
            Attempt::Retry
        } else {
            Attempt::Failed(
                Error::because(ErrorType::ReadError, "reading the response", e).into_up(),
            )
        }
    }
}

/// Where a response body ends, as its bytes go by.
struct BodyEnd {
    framing: Framing,
    left: u64,
    chunks: ChunkScanner,
}

impl BodyEnd {
    fn new(framing: Framing) -> Self {
        BodyEnd {
            framing,
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            chunks: ChunkScanner::default(),
        }
    }

    /// Of `bytes`, how many belong to the body, whether the body ended, and
    /// whether nothing followed it (the connection is clean).
    fn take(&mut self, bytes: &[u8]) -> Result<(usize, bool, bool), Failed> {
        Ok(match self.framing {
            Framing::Empty => (0, true, bytes.is_empty()),
            Framing::Length(_) => {
                let take = bytes.len().min(self.left as usize);
                self.left -= take as u64;
                (take, self.left == 0, take == bytes.len())
            }
            Framing::Chunked => match self.chunks.scan(bytes) {
                Ok(Some(end)) => (end, true, end == bytes.len()),
                Ok(None) => (bytes.len(), false, true),
                Err(why) => {
                    return Err(Failed {
                        error: Error::explain(ErrorType::InvalidHTTPHeader, why).into_up(),
                        responded: true,
                    });
                }
            },
            Framing::Close => (bytes.len(), false, false),
        })
    }
}

/// A connection for an attempt: a new one to `addr` (`fresh`: after a reused one
/// failed), else the pool's. Errors as pingora's connector types them.
async fn connection(
    pool: &upstream::Pool,
    addr: SocketAddr,
    fresh: bool,
) -> Result<(TcpStream, bool), Box<Error>> {
    let conn = if fresh {
        upstream::connect(addr).await.map(|c| (c, false))
    } else {
        pool.checkout(addr).await
    };
    conn.map_err(|e| match e {
        ConnectError::TimedOut => {
            Error::explain(ErrorType::ConnectTimedout, format!("connecting to {addr}")).into_up()
        }
        ConnectError::Failed(e) => {
            let etype = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                ErrorType::ConnectRefused
            } else {
                ErrorType::ConnectError
            };
            Error::because(etype, format!("connecting to {addr}"), e).into_up()
        }
    })
}

/// The request as the Pod receives it: the request line, the client's header
/// lines as received (less those it listed in `Connection:`, which end here, and
/// the proxy's own), `X-Podgate-Pod`, `X-Podgate-Rule`, `X-Request-Id`, and the
/// body byte for byte — one buffer, one write.
fn upstream_request(
    buf: &[u8],
    head: &Head,
    total: usize,
    rule: &Rule,
    pod: &podgate_registry::Pod,
    request_id: &str,
) -> Vec<u8> {
    use std::io::Write as _;
    let hop_by_hop = sources::connection_listed(&head.headers);
    let mut out = Vec::with_capacity(total + 96 + rule.name.len());
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(&buf[head.target.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.lines {
        let n = &buf[name.clone()];
        let ours = [&b"x-podgate-pod"[..], b"x-podgate-rule", b"x-request-id"]
            .iter()
            .any(|o| n.eq_ignore_ascii_case(o));
        if ours
            || hop_by_hop
                .iter()
                .any(|h| n.eq_ignore_ascii_case(h.as_str().as_bytes()))
        {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(&buf[value.clone()]);
        out.extend_from_slice(b"\r\n");
    }
    let _ = write!(
        out,
        "x-podgate-pod: {}\r\nx-podgate-rule: {}\r\nx-request-id: {request_id}\r\n\r\n",
        pod.id, rule.name
    );
    out.extend_from_slice(&buf[head.len..total]);
    out
}

/// Read more of the request into the connection's buffer.
async fn read_more(conn: &mut Conn) -> std::io::Result<usize> {
    if conn.buf.capacity() - conn.buf.len() < 512 {
        conn.buf
            .reserve(if conn.buf.is_empty() { 2048 } else { 4096 });
    }
    conn.stream.read_buf(&mut conn.buf).await
}

/// Write all of `bytes` and flush (the listener's write buffer coalesces nothing
/// here: the caller's buffer is already whole).
async fn write_all(stream: &mut Stream, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}
