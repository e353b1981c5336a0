//! Forwarding a request the fast path decided: an upstream connection of the Pod
//! (retried as pingora retries: another address of the same Pod after a failed
//! connect, a new connection after a reused one failed before any byte), the request
//! in one write, the response head parsed once and written to the client with what
//! body has arrived in one write, the rest relayed as it comes.

use std::net::SocketAddr;
use std::time::Duration;

use pingora::prelude::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::head::Head;
use super::response::{self, ChunkScanner, Framing, ResponseHead};
use super::upstream::{self, ConnectError};
use super::{Conn, Failed, FastPath, RELAY_CHUNK, write_all};
use crate::service::{Added, Ctx};

impl FastPath {
    /// Send the request to the decided Pod and relay its response. `Ok((status,
    /// keepalive))` once the response is relayed whole.
    pub(super) async fn forward(
        &self,
        conn: &mut Conn,
        head: &Head,
        total: usize,
        ctx: &mut Ctx,
        keepalive: bool,
    ) -> Result<(u16, bool), Failed> {
        let (Some(pod), Some(rule)) = (ctx.forwarded().cloned(), self.gate.rule_of(ctx)) else {
            return Err(Failed::before(Error::new_str("no routing decision")));
        };
        let added = self.gate.added(ctx, rule, pod.id);
        let mut request = upstream_request(&conn.buf, head, total, &added);
        let read_timeout = Duration::from_secs(rule.read_timeout_secs);
        // The decision's clock read, for the Pod's read deadline, while nothing has
        // been waited for since (a slot in the queue, a new connection).
        let mut clock = ctx.decided;
        // After a reused connection failed before any byte: the same address again,
        // on a new connection (its slot under `max_connections_per_address` kept).
        let mut fresh_for: Option<SocketAddr> = None;
        for _ in 0..self.max_attempts {
            let fresh = fresh_for.is_some();
            let addr = match fresh_for.take() {
                Some(addr) => addr,
                None => self.gate.next_address(ctx).await.map_err(Failed::before)?,
            };
            if ctx.slot.as_ref().is_some_and(|s| s.queued()) {
                clock = None;
            }
            let checked_out = match connection(&self.pool, addr, fresh).await {
                Ok(c) => c,
                Err(e) => {
                    if self.gate.connect_failed(ctx) {
                        continue;
                    }
                    return Err(Failed::before(e));
                }
            };
            let (mut up, reused) = checked_out;
            if !reused {
                clock = None;
            }
            if self.batch_sends {
                // The other requests this pass of the event loop read reach this
                // point first, and all go out together: a Pod's event loop a send
                // finds asleep must be woken (an interrupt to its CPU), one already
                // woken by the send before costs nothing. On the bench, NGINX as
                // the Pod slept 0.10 times a request instead of 0.22, and the proxy
                // spent about 8% less CPU a request (`scripts/bench-proxy.sh`).
                tokio::task::yield_now().await;
            }
            if let Err(e) = super::io::send_all(&up, &request).await {
                if reused {
                    fresh_for = Some(addr);
                    continue;
                }
                return Err(Failed::before(
                    Error::because(ErrorType::WriteError, "sending the request", e).into_up(),
                ));
            }
            let response = self
                .read_response(conn, &mut up, head, read_timeout, clock.take())
                .await;
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
            // Shutdown may have come while the Pod held the request (a long poll).
            let close = !keepalive || conn.shutting_down() || rhead.framing == Framing::Close;
            // The request went out: its buffer takes the client's response head.
            request.clear();
            let reusable = self
                .relay(
                    conn,
                    &mut up,
                    rbuf,
                    request,
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
    /// connection too, so a Pod holding a long poll for it is released). The
    /// deadline is `read_timeout` from `clock`, a clock read just taken, if any.
    async fn read_response(
        &self,
        conn: &mut Conn,
        up: &mut TcpStream,
        head: &Head,
        read_timeout: Duration,
        clock: Option<std::time::Instant>,
    ) -> Result<(Vec<u8>, ResponseHead), Attempt> {
        // Allocated when the first byte arrives: a poll the Pod holds costs no buffer.
        let mut rbuf: Vec<u8> = Vec::new();
        let mut byte = [0u8; 1];
        conn.deadline.set(clock, read_timeout);
        loop {
            tokio::select! {
                // The Pod's answer first: when the client closed as it came, the
                // answer is still logged as the Pod gave it, and its write fails.
                biased;
                // The socket's read slot, not `readable()`: no waiter to link
                // into the socket's list and unlink, per request.
                ready = std::future::poll_fn(|cx| up.poll_read_ready(cx)) => {
                    if let Err(e) = ready {
                        return Err(Attempt::failed_reading(&rbuf, e));
                    }
                }
                // The request is read whole: the client may only close, as pingora's
                // `read_body_or_idle` expects.
                read = super::io::read_into(&mut conn.stream, conn.access, &mut byte) => {
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
                () = conn.deadline.passed() => {
                    return Err(Attempt::Failed(
                        Error::explain(ErrorType::ReadTimedout, "reading the Pod's response")
                            .into_up(),
                    ));
                }
            }
            if rbuf.capacity() - rbuf.len() < 1024 {
                rbuf.reserve(4096);
            }
            match super::io::try_recv(up, &mut rbuf) {
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
    /// write (`out`, an empty buffer to write it in), then relay the rest of the
    /// body. `Ok(true)`: the upstream connection ended cleanly and may be reused.
    #[allow(clippy::too_many_arguments)]
    async fn relay(
        &self,
        conn: &mut Conn,
        up: &mut TcpStream,
        mut rbuf: Vec<u8>,
        mut out: Vec<u8>,
        rhead: &ResponseHead,
        request_id: &str,
        close: bool,
        read_timeout: Duration,
    ) -> Result<bool, Failed> {
        out.reserve(rhead.len + 96);
        rhead.write_for_client(&rbuf, request_id, close, &mut out);
        let mut body = BodyEnd::new(rhead.framing);
        let (take, mut done, mut clean) = body.take(&rbuf[rhead.len..])?;
        out.extend_from_slice(&rbuf[rhead.len..rhead.len + take]);
        let downstream = |e| Failed {
            error: Error::because(ErrorType::WriteError, "writing the response", e).into_down(),
            responded: true,
        };
        write_all(conn, &out).await.map_err(downstream)?;
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
            write_all(conn, &rbuf[..take]).await.map_err(downstream)?;
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
/// lines as received (less those that end at the proxy,
/// [`crate::http1::ends_here`], those it listed in `Connection:`, and the
/// proxy's own, [`crate::service::Added`]), the proxy's added headers, and the
/// body byte for byte — one buffer, one write.
pub(super) fn upstream_request(
    buf: &[u8],
    head: &Head,
    total: usize,
    added: &Added<'_>,
) -> Vec<u8> {
    // The added headers (five, the request id 32 bytes) fit without a reallocation.
    let mut out = Vec::with_capacity(total + 256);
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(&buf[head.target()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.lines {
        let n = &buf[name.clone()];
        if Added::is_added(n)
            || crate::http1::ends_here(n)
            || head
                .hop_by_hop
                .iter()
                .any(|h| n.eq_ignore_ascii_case(h.as_str().as_bytes()))
        {
            continue;
        }
        line(&mut out, n, &buf[value.clone()]);
    }
    added.for_each(|name, value| line(&mut out, name.as_bytes(), value));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&buf[head.len..total]);
    out
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}
