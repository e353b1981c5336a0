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
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if whole && declared.is_some_and(|n| n > limit) {
        return Ok(ReadBody {
            bytes: Vec::new(),
            complete: false,
        });
    }
    // One read returns at most pingora's 64 KiB body buffer.
    session.enable_retry_buffering_with_capacity(limit + READ_CHUNK_MAX);
    if session
        .req_header()
        .headers
        .contains_key(http::header::EXPECT)
    {
        // Answer the client's Expect ourselves, or it waits ~1 s before sending.
        session.write_continue_response().await?;
        session
            .req_header_mut()
            .remove_header(&http::header::EXPECT);
    }
    let mut bytes = Vec::new();
    let complete = loop {
        match session.read_request_body().await? {
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
