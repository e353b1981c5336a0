//! The fast path's parsers, for the fuzz targets in `fuzz/` only: not an API (hidden
//! from the docs), free to change with the parsers it wraps. Spans are resolved
//! into slices here, so a span outside the buffer panics under the fuzzer.

use std::sync::LazyLock;

use http::{HeaderMap, HeaderName};
use podgate_registry::Pod;
use podgate_tokens::PodId;

use crate::rules::Rule;

pub use super::response::{ChunkScanner, Framing};

/// The rule and Pod [`RequestHead::upstream`] is written for.
static UPSTREAM: LazyLock<(Rule, Pod)> = LazyLock::new(|| {
    let rule = crate::rules::builtin()
        .into_iter()
        .next()
        .expect("built-in rules");
    let pod = Pod::new(PodId::new(2).expect("non-zero"), "two", "127.0.0.1:2");
    (rule, pod)
});

/// A request head the fast path takes, its spans resolved.
#[derive(Debug)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: http::Method,
    /// The target's path.
    pub path: &'a str,
    /// The target's query.
    pub query: Option<&'a str>,
    /// The headers, as routing sees them.
    pub headers: HeaderMap,
    /// Each header line's name and value, as forwarded.
    pub lines: Vec<(&'a [u8], &'a [u8])>,
    /// The head's length, blank line included.
    pub len: usize,
    /// The body's length.
    pub body_len: usize,
    /// Whether the connection may serve another request.
    pub keepalive: bool,
    /// The headers listed in `Connection:`.
    pub hop_by_hop: Vec<HeaderName>,
    /// The request as the fast path writes it to the Pod (rule `jobs-request`, Pod
    /// 2), when `buf` holds the whole body.
    pub upstream: Option<Vec<u8>>,
}

/// What the start of a client's buffer holds.
#[derive(Debug)]
pub enum Request<'a> {
    /// Not a whole head yet.
    Partial,
    /// A head the fast path serves.
    Head(Box<RequestHead<'a>>),
    /// For pingora-proxy, and why.
    HandOff(&'static str),
}

/// The fast path's request head parser on `buf`.
pub fn request_head(buf: &[u8]) -> Request<'_> {
    match super::head::parse(buf) {
        super::head::Parsed::Partial => Request::Partial,
        super::head::Parsed::HandOff(why) => Request::HandOff(why.label()),
        super::head::Parsed::Head(h) => Request::Head(Box::new(RequestHead {
            upstream: (buf.len() - h.len >= h.body_len).then(|| {
                super::forward::upstream_request(
                    buf,
                    &h,
                    h.len + h.body_len,
                    &crate::service::Added::new(
                        UPSTREAM.1.id,
                        &UPSTREAM.0.name,
                        "fuzz",
                        "routable",
                    ),
                )
            }),
            method: h.method.clone(),
            path: h.path(buf),
            query: h.query(buf),
            lines: h
                .lines
                .iter()
                .map(|(n, v)| (&buf[n.clone()], &buf[v.clone()]))
                .collect(),
            len: h.len,
            body_len: h.body_len,
            keepalive: h.keepalive,
            hop_by_hop: h.hop_by_hop,
            headers: h.headers,
        })),
    }
}

/// A Pod's response head as the fast path relays it.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status.
    pub status: u16,
    /// The head's length, blank line included.
    pub len: usize,
    /// How the body ends.
    pub framing: Framing,
    /// Whether the Pod's connection may be reused.
    pub reusable: bool,
    /// The head written for the client.
    pub for_client: Vec<u8>,
}

/// What the start of a Pod's buffer holds.
#[derive(Debug)]
pub enum Response {
    /// Not a whole head yet.
    Partial,
    /// An interim (1xx) response of this length.
    Interim(usize),
    /// A final response head.
    Head(ResponseHead),
    /// A 502, and why.
    Invalid(&'static str),
}

/// The fast path's response head parser on `buf`, and the head it would write for
/// the client (with `request_id`, and `Connection: close` when `close`).
pub fn response_head(buf: &[u8], head_request: bool, request_id: &str, close: bool) -> Response {
    match super::response::parse(buf, head_request) {
        super::response::Parsed::Partial => Response::Partial,
        super::response::Parsed::Interim(n) => Response::Interim(n),
        super::response::Parsed::Invalid(why) => Response::Invalid(why),
        super::response::Parsed::Head(h) => {
            let mut for_client = Vec::new();
            h.write_for_client(buf, request_id, close, &mut for_client);
            Response::Head(ResponseHead {
                status: h.status,
                len: h.len,
                framing: h.framing,
                reusable: h.reusable,
                for_client,
            })
        }
    }
}
