//! Reading the start of a request body before the upstream is chosen, when the
//! token may be a body parameter, so that pingora replays it upstream unchanged.
//!
//! What is read stays in pingora's retry buffer, which a patch to pingora sizes for
//! the look-ahead (`vendor/README.md`); pingora sends it first, then streams the rest
//! of the body as it arrives.

use pingora::prelude::*;
use pingora::proxy::Session;

use crate::decision::Refusal;

/// A body prefix read before routing.
pub(crate) struct ReadBody {
    /// The bytes read, from the start of the body.
    pub(crate) bytes: Vec<u8>,
    /// Whether they are the whole body.
    pub(crate) complete: bool,
}

/// A 413 for a body that must be read whole and is larger than `limit`.
pub(crate) fn too_large(limit: usize) -> Refusal {
    Refusal {
        status: 413,
        code: "body_too_large",
        detail: format!(
            "the body must be read to find the token, and is larger than {limit} bytes"
        ),
    }
}

/// Read the start of the request body before choosing the upstream, until it ends
/// or more than (`whole`: JSON, forms) or at least (multipart) `limit` bytes are
/// read; a body declared larger than `limit` that must be read whole is not read at
/// all (`complete` false, no bytes). What is read is replayed upstream byte for byte
/// from pingora's retry buffer, sized so the read that crosses `limit` still fits;
/// the rest streams.
pub(crate) async fn read_body(
    session: &mut Session,
    limit: usize,
    whole: bool,
) -> Result<ReadBody> {
    let declared = crate::http1::declared_length(&session.req_header().headers);
    if whole && declared.is_some_and(|n| n > limit) {
        return Ok(ReadBody {
            bytes: Vec::new(),
            complete: false,
        });
    }
    // One read returns at most pingora's 64 KiB body buffer.
    session.enable_retry_buffering_with_capacity(limit + READ_CHUNK_MAX);
    answer_expect(session).await?;
    let mut bytes = Vec::new();
    let complete = loop {
        // A read that fails is the client's. A body that ends before its length or
        // its last chunk is NGINX's 400 ("client prematurely closed connection",
        // `ngx_http_read_client_request_body`): a client that closed only its side
        // reads it, one that is gone does not.
        let chunk = session.read_request_body().await.map_err(|mut e| {
            if e.etype() == &ErrorType::ConnectionClosed {
                return Refusal::bad_request("body_ended_early", "the request body ended early")
                    .to_error();
            }
            e.as_down();
            e
        })?;
        match chunk {
            Some(chunk) => {
                bytes.extend_from_slice(&chunk);
                if (whole && bytes.len() > limit) || (!whole && bytes.len() >= limit) {
                    break session.is_body_done();
                }
            }
            None => break true,
        }
    };
    Ok(ReadBody { bytes, complete })
}

/// `body_lookahead_bytes` by default: pingora's own retry buffer size.
pub const DEFAULT_BODY_LOOKAHEAD: usize = 64 * 1024;

/// The most one body read returns (pingora's HTTP/1 body buffer; HTTP/2 frames are
/// smaller).
const READ_CHUNK_MAX: usize = 64 * 1024;

/// Answer a request's `Expect` as GitLab's NGINX does, before its body is read or
/// forwarded: `100-continue` on an HTTP/1.1 request whose body has not all
/// arrived gets `100 Continue` (else the client waits about a second before
/// sending it); any `Expect` then ends here, never forwarded (NGINX's
/// `ngx_http_test_expect` in `src/http/ngx_http_request_body.c`, and `Expect ""`
/// among the headers `ngx_http_proxy_module` sets).
pub(crate) async fn answer_expect(session: &mut Session) -> Result<()> {
    let head = session.req_header();
    let Some(expect) = head.headers.get(http::header::EXPECT) else {
        return Ok(());
    };
    let continue_ = expect.as_bytes().eq_ignore_ascii_case(b"100-continue")
        && head.version == http::Version::HTTP_11
        && !session.is_http2()
        && !session.is_body_done();
    if continue_ {
        session.write_continue_response().await?;
    }
    session
        .req_header_mut()
        .remove_header(&http::header::EXPECT);
    Ok(())
}

/// Before an answer of the proxy's own, read the rest of a body declared within
/// `limit` bytes, so that the connection can serve the client's next request:
/// pingora writes `Connection: close` and closes while a request body is unread.
/// Go's `net/http` server (Workhorse's) does the same for a handler that left up to
/// 256 KiB unread (`maxPostHandlerReadBytes`,
/// <https://github.com/golang/go/blob/go1.22.0/src/net/http/server.go>), and the
/// fast path has read any body it serves, at most the look-ahead, before it
/// answers. A larger or chunked body is not read, and one that cannot be read
/// (the client closed or stalled first) is not waited for: the answer is still
/// written, and the connection closes after it.
pub(crate) async fn drain_small_body(session: &mut Session, limit: usize) {
    // HTTP/2 ends the stream, not the connection; a connection closing anyway
    // needs no drain.
    if session.is_http2() || session.get_keepalive().is_none() || session.is_body_done() {
        return;
    }
    let declared = crate::http1::declared_length(&session.req_header().headers);
    if declared.is_some_and(|n| n <= limit) && session.drain_request_body().await.is_err() {
        session.set_keepalive(None);
    }
}
