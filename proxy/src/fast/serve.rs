//! One connection's requests on the fast path: read a head, plan (or hand the
//! request to pingora-proxy), read the body, decide, then answer, hold or forward
//! — each a step of its own, the routing itself in [`crate::pipeline`].

use std::ops::Range;

use pingora::prelude::*;

use super::head::{self, HandOff, Head, Parsed};
use super::io::Access;
use super::{
    BODY_READ_TIMEOUT, Conn, FastPath, KEEPALIVE, Next, fast_rule, handover_due, write_all,
};
use crate::answer::Answer;
use crate::decision::{Outcome, Refusal};
use crate::edge_poll::RunnerRequest;
use crate::pipeline::{self, BodyPlan, BodyRead, Plan};
use crate::service::{Ctx, Held};

/// A request the fast path took: its head, where it ends in the buffer, and
/// whether the connection may serve another one after it.
struct Taken {
    head: Head,
    /// The end of its body in the connection's buffer.
    total: usize,
    /// What of the body was read as parameters (JSON or a form, read whole).
    body: Option<BodyPlan>,
    keepalive: bool,
}

impl Taken {
    /// The body, when it was read as parameters.
    fn runner_body(&self) -> Option<Range<usize>> {
        self.body.as_ref().map(|_| self.head.len..self.total)
    }
}

impl FastPath {
    /// Serve requests on `conn` until it closes or one is for pingora-proxy.
    pub(super) async fn serve(&self, conn: &mut Conn) -> Next {
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
    /// proxy closes it, and that request would fail with a reset. At an upgrade,
    /// the idle connection goes to the new process ([`crate::handover`]; `Ok(None)`
    /// here). Otherwise the wait goes on through the grace period, and the next
    /// request is served with `Connection: close` ([`FastPath::answer`], the
    /// forward), which moves the client on at a point where nothing is in flight; a
    /// connection idle through the whole grace period is dropped with the runtime.
    async fn read_head(&self, conn: &mut Conn, first: bool) -> Result<Option<Head>, HandOff> {
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
                    // From the last answer's log line, its clock read.
                    conn.deadline.set(conn.clock.take(), KEEPALIVE);
                    tokio::select! {
                        // What the client sent, or the stream's buffer holds, first:
                        // a hand-over must leave no byte of it behind.
                        biased;
                        read = read_more(&mut conn.stream, conn.access, &mut conn.buf) => read.ok(),
                        () = conn.deadline.passed() => None,
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
                Some(d) => tokio::time::timeout_at(
                    d,
                    read_more(&mut conn.stream, conn.access, &mut conn.buf),
                )
                .await
                .ok()
                .and_then(Result::ok),
            };
            match read {
                Some(n) if n > 0 => {}
                // Closed, failed, or no whole head within the deadline: as pingora
                // (patch 0002), the connection ends.
                _ => return Ok(None),
            }
        }
    }

    /// Serve one request whose head is at the start of the buffer. `Ok(keepalive)`
    /// when it was answered; `Err` when the connection leaves the fast path.
    async fn request(&self, conn: &mut Conn, head: Head) -> Result<bool, Next> {
        let mut ctx = Ctx {
            started: Some(crate::service::now()),
            ..Ctx::default()
        };
        let (rule, body) = self.plan(conn, &head)?;
        let total = match read_body(conn, &head).await {
            Ok(total) => total,
            Err(Cut::Early) => return self.ended_early(conn, head, ctx).await,
            Err(Cut::Gone) => return Err(Next::Close),
        };
        // Bytes past this request (a pipelined one) end the connection after the
        // answer, as pingora refuses to reuse a connection whose request was
        // overread (`v1/server.rs`, `reuse`): no request is parsed from bytes that
        // came with another one.
        let keepalive = head.keepalive && conn.buf.len() == total;
        let taken = Taken {
            head,
            total,
            body,
            keepalive,
        };
        ctx.request_id = self.gate.request_id(&taken.head.headers);
        if let Some(answer) = self.decide(conn, &taken, rule, &mut ctx) {
            return self.answer(conn, &taken, &ctx, &answer).await;
        }
        match self.edge_hold(conn, &taken, &mut ctx).await {
            Held::Forward => self.forward_and_log(conn, &taken, &mut ctx).await,
            Held::Answer(answer) => self.answer(conn, &taken, &ctx, &answer).await,
            Held::ClientGone(e) => {
                self.log(conn, &taken.head, 0, &ctx, Some(&e));
                Err(Next::Close)
            }
        }
    }

    /// Step 1 of the routing ([`crate::pipeline::plan`]), and whether the fast
    /// path serves the request: a runner or job rule ([`super::fast_rule`]), a body
    /// it reads whole if any, within the look-ahead. Else the hand-off.
    fn plan(&self, conn: &Conn, head: &Head) -> Result<(usize, Option<BodyPlan>), Next> {
        let gate = &self.gate;
        let (rule, body) = match gate.plan(&view(conn, head)) {
            // A path that names a claim: path rules ask the Topology Service
            // (pingora-proxy's service awaits them; the fast path's rules are the
            // runner and job endpoints, under `/api`, which name none).
            Plan::Route { rule, body }
                if fast_rule(&gate.rules[rule])
                    && gate
                        .path_router
                        .as_ref()
                        .is_none_or(|r| r.claim(head.path(&conn.buf)).is_none()) =>
            {
                (rule, body)
            }
            // A type GitLab would refuse: pingora-proxy answers it, with the body
            // read as pingora reads it.
            Plan::Refuse { .. } => return Err(Next::HandOff(HandOff::Body)),
            _ => return Err(Next::HandOff(HandOff::Rule)),
        };
        if body.as_ref().is_some_and(|b| !b.whole()) {
            // Multipart: read up to the look-ahead and streamed, pingora-proxy's.
            return Err(Next::HandOff(HandOff::Body));
        }
        let limit = body.as_ref().map_or(gate.body_lookahead, |b| b.limit);
        if head.body_len > limit {
            return Err(Next::HandOff(HandOff::Body));
        }
        Ok((rule, body.filter(|_| head.body_len > 0)))
    }

    /// Step 2 ([`crate::pipeline::decide`]) on the request as read, concluded
    /// ([`crate::service::PodGate::conclude`]): the answer from the proxy itself,
    /// or `None` to forward.
    fn decide(&self, conn: &Conn, taken: &Taken, rule: usize, ctx: &mut Ctx) -> Option<Answer> {
        let body = match (&taken.body, taken.runner_body()) {
            (Some(plan), Some(range)) => BodyRead::Read {
                plan,
                bytes: &conn.buf[range],
                complete: true,
            },
            _ => BodyRead::Skipped,
        };
        let decision = self.gate.decide(rule, &view(conn, &taken.head), body);
        self.gate.conclude(rule, decision, ctx)
    }

    /// A poll to hold at the edge ([`crate::service::PodGate::hold`]), with the
    /// client watched for going away; [`Held::Forward`] when it is not one.
    async fn edge_hold(&self, conn: &mut Conn, taken: &Taken, ctx: &mut Ctx) -> Held {
        let rule = self.gate.rule_of(ctx);
        let Some(polls) = rule.and_then(|rule| self.gate.edge_polls_for(ctx, rule)) else {
            return Held::Forward;
        };
        // Workhorse reads the body only when it is JSON or a form read whole.
        let body = taken.runner_body().map(|r| &conn.buf[r]);
        let request = RunnerRequest::read(&taken.head.headers, body);
        // Held for up to a minute: keep no more than the request itself.
        conn.buf.shrink_to_fit();
        let (stream, access) = (&mut conn.stream, conn.access);
        let gone = async {
            // The request is read whole: this returns only when the client closes
            // (or sends bytes it should not before its answer), as on pingora's path.
            let mut byte = [0u8; 1];
            let _ = super::io::read_into(stream, access, &mut byte).await;
        };
        self.gate.hold(ctx, polls, request, gone).await
    }

    /// Forward to the decided Pod ([`FastPath::forward`]), count and log it; on a
    /// failure, answer it as pingora-proxy's `fail_to_proxy` does if no response
    /// had started.
    async fn forward_and_log(
        &self,
        conn: &mut Conn,
        taken: &Taken,
        ctx: &mut Ctx,
    ) -> Result<bool, Next> {
        let head = &taken.head;
        match self
            .forward(conn, head, taken.total, ctx, taken.keepalive)
            .await
        {
            Ok((status, keepalive)) => {
                self.served.inc();
                self.log(conn, head, status, ctx, None);
                conn.buf.drain(..taken.total);
                Ok(keepalive)
            }
            Err(failed) => {
                let (code, answer) = Answer::for_error(&failed.error);
                let mut status = 0;
                if let (Some(answer), false) = (answer, failed.responded) {
                    let mut out = Vec::new();
                    answer.write_h1(&ctx.request_id, true, &mut out);
                    if write_all(conn, &out).await.is_ok() {
                        status = code;
                    }
                }
                self.log(conn, head, status, ctx, Some(&failed.error));
                Err(Next::Close)
            }
        }
    }

    /// Answer from the proxy itself, count and log it.
    async fn answer(
        &self,
        conn: &mut Conn,
        taken: &Taken,
        ctx: &Ctx,
        answer: &Answer,
    ) -> Result<bool, Next> {
        // Shutdown may have come during the request (a hold at the edge).
        let keepalive = taken.keepalive && !conn.shutting_down();
        let mut out = Vec::with_capacity(256);
        answer.write_h1(&ctx.request_id, !keepalive, &mut out);
        let written = write_all(conn, &out).await;
        self.served.inc();
        let e = written
            .err()
            .map(|e| Error::because(ErrorType::WriteError, "writing the answer", e).into_down());
        let status = if e.is_some() { 0 } else { answer.status };
        self.log(conn, &taken.head, status, ctx, e.as_deref());
        conn.buf.drain(..taken.total);
        match e {
            None => Ok(keepalive),
            Some(_) => Err(Next::Close),
        }
    }

    /// A body that ended before its length: NGINX's 400 ("client prematurely
    /// closed connection", `ngx_http_read_client_request_body`), as pingora-proxy's
    /// service answers it (`crate::body`), and the connection closed. A client that
    /// closed only its side reads it.
    async fn ended_early(&self, conn: &mut Conn, head: Head, mut ctx: Ctx) -> Result<bool, Next> {
        let refusal = Refusal::bad_request("body_ended_early", "the request body ended early");
        let answer = Answer::refusal(&refusal);
        ctx.request_id = self.gate.request_id(&head.headers);
        ctx.outcome = Some(Outcome::Refused(refusal));
        let taken = Taken {
            total: conn.buf.len(),
            head,
            body: None,
            keepalive: false,
        };
        self.answer(conn, &taken, &ctx, &answer).await?;
        Err(Next::Close)
    }

    /// Count and log the request; the clock read for it is kept for the
    /// connection's next deadline ([`Conn::clock`]).
    fn log(&self, conn: &mut Conn, head: &Head, status: u16, ctx: &Ctx, e: Option<&Error>) {
        let now = crate::service::now();
        self.gate.log_request(
            head.method.as_str(),
            head.path(&conn.buf),
            status,
            ctx,
            e,
            "fast",
            now,
        );
        conn.clock = Some(now);
    }
}

/// The request head as [`crate::pipeline`] reads it.
fn view<'a>(conn: &'a Conn, head: &'a Head) -> pipeline::Head<'a> {
    pipeline::Head {
        method: &head.method,
        path: head.path(&conn.buf),
        query: head.query(&conn.buf),
        headers: &head.headers,
        host: head
            .headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok()),
        http2: false,
        hop_by_hop: &head.hop_by_hop,
    }
}

/// Read the rest of the body into the buffer; where the request ends in it.
/// `Err`: the client closed, failed or stalled ([`Cut`]).
async fn read_body(conn: &mut Conn, head: &Head) -> Result<usize, Cut> {
    let total = head.len + head.body_len;
    while conn.buf.len() < total {
        conn.buf.reserve(total - conn.buf.len());
        let read = read_more(&mut conn.stream, conn.access, &mut conn.buf);
        match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
            Ok(Ok(0)) => return Err(Cut::Early),
            Ok(Ok(_)) => {}
            _ => return Err(Cut::Gone),
        }
    }
    Ok(total)
}

/// Why a body was not read whole.
enum Cut {
    /// The client closed (its side of) the connection first.
    Early,
    /// A read failed or stalled past [`super::BODY_READ_TIMEOUT`].
    Gone,
}

/// Read more of the request into the connection's buffer (`buf`), as `access`
/// says ([`super::Conn::access`]); the fields, not the `Conn`, so that its shutdown
/// watch can be awaited beside the read.
async fn read_more(
    stream: &mut pingora::protocols::l4::stream::Stream,
    access: Access,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < 512 {
        buf.reserve(if buf.is_empty() { 2048 } else { 4096 });
    }
    super::io::read(stream, access, buf).await
}
