//! The request head, as the fast path reads it: one strict parse (httparse) and the
//! framing checks that decide whether the fast path may serve the request at all.
//! Anything it does not take — another HTTP version, `Transfer-Encoding`, a
//! `Content-Length` that is not one plain number, `Upgrade`, `Expect`, a
//! `Connection` that nominates a header, a target that is not origin-form, a
//! header the `http` crate refuses — goes to pingora-proxy unread, which refuses
//! ambiguous framing exactly as it always has.

use std::ops::Range;

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// Most header lines in a head the fast path takes (more: pingora-proxy's).
const MAX_HEADERS: usize = 64;

/// Longest head the fast path waits for (longer: pingora-proxy's, whose own limit
/// then applies).
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// A parsed request head. Spans index the connection's buffer.
#[derive(Debug)]
pub(crate) struct Head {
    /// The method.
    pub(crate) method: Method,
    /// Where the request target (origin-form, as received) starts, where its path
    /// ends (at its first `?`, else with it) and where it ends, in the buffer: a
    /// head is at most `MAX_HEAD` bytes, and every held poll keeps one.
    target_at: [u32; 3],
    /// The headers, for routing (rules, token sources).
    pub(crate) headers: HeaderMap,
    /// Each header line's name and value, in order, for forwarding as received.
    pub(crate) lines: Vec<(Range<usize>, Range<usize>)>,
    /// The length of the head, blank line included.
    pub(crate) len: usize,
    /// The body's length (`Content-Length`, else 0).
    pub(crate) body_len: usize,
    /// Whether the connection may serve another request (no `close` in any
    /// `Connection` line, RFC 9112 §9.6).
    pub(crate) keepalive: bool,
    /// The headers the request lists in `Connection:` (never routed by, not
    /// forwarded).
    pub(crate) hop_by_hop: Vec<HeaderName>,
}

impl Head {
    /// The target's path, without the query.
    pub(crate) fn path<'a>(&self, buf: &'a [u8]) -> &'a str {
        let [start, path_end, _] = self.target_at.map(|i| i as usize);
        ascii(&buf[start..path_end])
    }

    /// The target's query, if any.
    pub(crate) fn query<'a>(&self, buf: &'a [u8]) -> Option<&'a str> {
        let [_, path_end, end] = self.target_at.map(|i| i as usize);
        (path_end < end).then(|| ascii(&buf[path_end + 1..end]))
    }

    /// The request target, as received.
    pub(crate) fn target(&self) -> Range<usize> {
        self.target_at[0] as usize..self.target_at[2] as usize
    }
}

/// Part of a target checked to be a valid `PathAndQuery` (ASCII) when parsed.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or("/")
}

/// What the start of a buffer holds. Returned once per request and consumed at
/// once: the head stays unboxed, so parsing it allocates no more than it must.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A head the fast path may serve.
    Head(Head),
    /// A request for pingora-proxy, and why.
    HandOff(HandOff),
}

/// Why a request goes to pingora-proxy rather than the fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandOff {
    /// A head `httparse` or the `http` crate refuses (h2c's preface among them),
    /// or one longer than the fast path waits for.
    Head,
    /// A head GitLab's front refuses (`crate::http1::refusal`): pingora-proxy's
    /// service answers it and closes the connection.
    Refused,
    /// Not HTTP/1.1.
    Version,
    /// A target that is not origin-form.
    Target,
    /// `Transfer-Encoding`, or a `Content-Length` that is not one plain number.
    Framing,
    /// `Upgrade` (WebSocket and others).
    Upgrade,
    /// `Expect`.
    Expect,
    /// A `Connection` header naming another header than `close` and `keep-alive`.
    Connection,
    /// No `Host`.
    Host,
    /// A rule that is not a runner or job endpoint, or none.
    Rule,
    /// A body the fast path does not read (multipart, a type GitLab would refuse,
    /// larger than the look-ahead).
    Body,
}

impl HandOff {
    /// The `result` label of `podgate_proxy_fast_path_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            HandOff::Head => "head",
            HandOff::Refused => "refused",
            HandOff::Version => "version",
            HandOff::Target => "target",
            HandOff::Framing => "framing",
            HandOff::Upgrade => "upgrade",
            HandOff::Expect => "expect",
            HandOff::Connection => "connection",
            HandOff::Host => "host",
            HandOff::Rule => "rule",
            HandOff::Body => "body",
        }
    }

    /// Whether the connection stays with pingora-proxy for good: its head is not
    /// HTTP/1.1, so no later request on it is one the fast path could read.
    pub(crate) fn for_good(self) -> bool {
        matches!(self, HandOff::Head | HandOff::Refused | HandOff::Version)
    }
}

/// The custom header names the fast path's clients send, named once: the `http`
/// crate copies every name it does not know into an allocation of its own. Runners
/// send `Runner-Token` (`gitlab-runner`, `network/gitlab.go`) and `Job-Token`;
/// API clients `Private-Token`; proxies in front `X-Request-Id`.
static KNOWN_CUSTOM: [HeaderName; 4] = [
    HeaderName::from_static("runner-token"),
    HeaderName::from_static("job-token"),
    HeaderName::from_static("private-token"),
    HeaderName::from_static("x-request-id"),
];

/// `raw` as a header name, as `HeaderName::from_bytes` reads it.
fn header_name(raw: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    KNOWN_CUSTOM
        .iter()
        .find(|k| k.as_str().len() == raw.len() && raw.eq_ignore_ascii_case(k.as_str().as_bytes()))
        .map_or_else(|| HeaderName::from_bytes(raw), |k| Ok(k.clone()))
}

/// Parse the head at the start of `buf`.
pub(crate) fn parse(buf: &[u8]) -> Parsed {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parsed::Partial,
        Ok(httparse::Status::Partial) => return Parsed::HandOff(HandOff::Head),
        Err(_) => return Parsed::HandOff(HandOff::Head),
    };
    if req.version != Some(1) {
        return Parsed::HandOff(HandOff::Version);
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Parsed::HandOff(HandOff::Head);
    };
    let raw_method = method;
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::HandOff(HandOff::Head);
    };
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + s.len()
    };
    // The target and the header values share one copy of the head rather than one
    // each.
    let shared = bytes::Bytes::copy_from_slice(&buf[..len]);
    // Origin-form only, and a target `http` accepts (as pingora parses it).
    let target = span(target.as_bytes());
    if !buf[target.clone()].starts_with(b"/")
        || PathAndQuery::from_maybe_shared(shared.slice(target.clone())).is_err()
    {
        return Parsed::HandOff(HandOff::Target);
    }
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    let mut lines = Vec::with_capacity(req.headers.len());
    let mut body_len = None;
    let mut host = false;
    for h in req.headers.iter() {
        let value_span = span(h.value);
        let (Ok(name), Ok(value)) = (
            header_name(h.name.as_bytes()),
            HeaderValue::from_maybe_shared(shared.slice(value_span.clone())),
        ) else {
            return Parsed::HandOff(HandOff::Head);
        };
        match name {
            // Chunked or any other coding: pingora-proxy's framing rules.
            http::header::TRANSFER_ENCODING => return Parsed::HandOff(HandOff::Framing),
            http::header::CONTENT_LENGTH => {
                let n = crate::http1::content_length(h.value).and_then(|n| usize::try_from(n).ok());
                match (n, body_len) {
                    (Some(n), None) => body_len = Some(n),
                    _ => return Parsed::HandOff(HandOff::Framing),
                }
            }
            http::header::UPGRADE => return Parsed::HandOff(HandOff::Upgrade),
            http::header::EXPECT => return Parsed::HandOff(HandOff::Expect),
            // A second `Host`, or userinfo in it: pingora-proxy's 400 (RFC 9112
            // §3.2; pingora-core `validate_request_authority`).
            http::header::HOST if host || h.value.contains(&b'@') => {
                return Parsed::HandOff(HandOff::Host);
            }
            http::header::HOST => host = true,
            _ => {}
        }
        lines.push((span(h.name.as_bytes()), value_span));
        headers.append(name, value);
    }
    // No Host: pingora-proxy answers the 400, as for every other request.
    if !host {
        return Parsed::HandOff(HandOff::Host);
    }
    // A header nominated as hop by hop: pingora-proxy's rules on which may be and
    // what then goes upstream (`sanitize_h1_upstream_request`).
    let nominates =
        |t: &[u8]| !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive");
    if crate::http1::connection_tokens(&headers).any(nominates) {
        return Parsed::HandOff(HandOff::Connection);
    }
    // What GitLab's front refuses: pingora-proxy's service answers it, closing.
    let checked = crate::http1::RequestHead {
        method: raw_method,
        target: &buf[target.clone()],
        headers: &headers,
    };
    if crate::http1::refusal(&checked).is_some() {
        return Parsed::HandOff(HandOff::Refused);
    }
    let path_end = buf[target.clone()]
        .iter()
        .position(|&b| b == b'?')
        .map_or(target.end, |i| target.start + i);
    // Within `MAX_HEAD`, so within a `u32`.
    let target_at = [target.start, path_end, target.end].map(|i| i as u32);
    Parsed::Head(Head {
        method,
        target_at,
        hop_by_hop: crate::sources::connection_listed(&headers),
        lines,
        len,
        body_len: body_len.unwrap_or(0),
        keepalive: !crate::http1::wants_close(&headers),
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A known custom name is the name `http` would make of it, in any case.
    #[test]
    fn known_custom_names_read_as_http_reads_them() {
        for raw in [
            "Runner-Token",
            "RUNNER-TOKEN",
            "job-token",
            "Private-Token",
            "X-Request-Id",
            "X-Request-Ix",
            "Runner-Tokens",
            "Host",
            "content-length",
        ] {
            let ours = header_name(raw.as_bytes()).unwrap();
            assert_eq!(
                ours,
                HeaderName::from_bytes(raw.as_bytes()).unwrap(),
                "{raw}"
            );
            assert_eq!(ours.as_str(), raw.to_ascii_lowercase(), "{raw}");
        }
        for bad in ["Runner Token", "", "job-token:"] {
            assert!(header_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    fn head(raw: &str) -> Head {
        match parse(raw.as_bytes()) {
            Parsed::Head(h) => h,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn handed_off(raw: &str) -> &'static str {
        match parse(raw.as_bytes()) {
            Parsed::HandOff(why) => why.label(),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn a_runner_poll_is_taken_with_its_spans() {
        let raw = "POST /api/v4/jobs/request?a=1 HTTP/1.1\r\nHost: gitlab\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"token\":1}x";
        let h = head(raw);
        assert_eq!(h.method, Method::POST);
        assert_eq!(h.path(raw.as_bytes()), "/api/v4/jobs/request");
        assert_eq!(h.query(raw.as_bytes()), Some("a=1"));
        assert_eq!(h.body_len, 12);
        assert_eq!(h.len, raw.len() - 12);
        assert!(h.keepalive);
        let (name, value) = &h.lines[1];
        assert_eq!(&raw[name.clone()], "Content-Type");
        assert_eq!(&raw[value.clone()], "application/json");
        assert_eq!(h.headers["content-length"], "12");
    }

    #[test]
    fn close_in_any_connection_line_ends_the_connection() {
        let h = head(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: keep-alive, Close\r\n\r\n",
        );
        assert!(!h.keepalive);
    }

    /// Found by `fuzz/fuzz_targets/proxy_request_head.rs`: `Connection:
    /// content-length` dropped the length from the request the Pod got, so the Pod
    /// read the body as its next request (smuggling). A nominated header is
    /// pingora-proxy's to sanitise.
    #[test]
    fn a_connection_nominating_headers_is_handed_off() {
        let raw = "POST /api/v4/jobs/request HTTP/1.1\r\nHost: a\r\nConnection: content-length, Transfer-Encoding, x-a\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(handed_off(raw), "connection");
        let h = head("GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, \r\n\r\n");
        assert!(h.keepalive);
    }

    #[test]
    fn the_pod_gets_no_hop_by_hop_header_and_the_proxys_own() {
        let raw = "POST /api/v4/jobs/request HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\nTE: trailers\r\nX-Podgate-Pod: 3\r\nX-GitLab-HTTP-Router-Rule-Type: route\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello";
        let h = head(raw);
        let up = super::super::forward::upstream_request(
            raw.as_bytes(),
            &h,
            raw.len(),
            &crate::service::Added::new(
                podgate_tokens::PodId::new(2).unwrap(),
                "r",
                "rid",
                "routable",
            ),
        );
        let up = String::from_utf8(up).unwrap();
        assert_eq!(
            up,
            "POST /api/v4/jobs/request HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nContent-Length: 5\r\nx-podgate-pod: 2\r\nx-podgate-rule: r\r\nx-request-id: rid\r\nx-gitlab-http-router-rule-action: classify\r\nx-gitlab-http-router-rule-type: CELL_ID\r\n\r\nhello"
        );
    }

    #[test]
    fn a_partial_head_waits() {
        assert!(matches!(
            parse(b"POST /api/v4/jobs/request HTTP/1.1\r\nHost: a\r\n"),
            Parsed::Partial
        ));
    }

    /// Every framing a smuggling attempt relies on is left to pingora-proxy, whose
    /// answer to it is the proxy's answer today.
    #[test]
    fn ambiguous_or_unusual_framing_is_handed_off() {
        let base = "POST /api/v4/jobs/request HTTP/1.1\r\nHost: a\r\n";
        for (extra, why) in [
            ("Transfer-Encoding: chunked\r\n", "framing"),
            (
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                "framing",
            ),
            ("Content-Length: 5\r\nContent-Length: 5\r\n", "framing"),
            ("Content-Length: 5, 5\r\n", "framing"),
            ("Content-Length: +5\r\n", "framing"),
            ("Content-Length: \r\n", "framing"),
            ("Content-Length: 0x5\r\n", "framing"),
            ("Transfer-Encoding: gzip, chunked\r\n", "framing"),
            ("Upgrade: websocket\r\nConnection: upgrade\r\n", "upgrade"),
            ("Expect: 100-continue\r\n", "expect"),
            ("X: a\r\n b\r\n", "head"),
            ("X : a\r\n", "head"),
        ] {
            assert_eq!(handed_off(&format!("{base}{extra}\r\n")), why, "{extra:?}");
        }
        assert_eq!(handed_off("GET / HTTP/1.0\r\nHost: a\r\n\r\n"), "version");
        assert_eq!(handed_off("GET / HTTP/1.1\r\n\r\n"), "host");
        assert_eq!(
            handed_off("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            "host"
        );
        assert_eq!(handed_off("GET / HTTP/1.1\r\nHost: u@a\r\n\r\n"), "host");
        assert_eq!(
            handed_off("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"),
            "target"
        );
        assert_eq!(
            handed_off("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            "head",
            "the h2c preface"
        );
        let long = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n",
            "a".repeat(MAX_HEAD)
        );
        assert_eq!(handed_off(&long), "head");
    }
}
