//! The request head, as the fast path reads it: one strict parse (httparse) and the
//! framing checks that decide whether the fast path may serve the request at all.
//! Anything it does not take — another HTTP version, `Transfer-Encoding`, a
//! `Content-Length` that is not one plain number, `Upgrade`, `Expect`, a target that
//! is not origin-form, a header the `http` crate refuses — goes to pingora-proxy
//! unread, which refuses ambiguous framing exactly as it always has.

use std::ops::Range;

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
    /// The request target (origin-form), as received.
    pub(crate) target: Range<usize>,
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
        let target = self.target_str(buf);
        target.split_once('?').map_or(target, |(p, _)| p)
    }

    /// The target's query, if any.
    pub(crate) fn query<'a>(&self, buf: &'a [u8]) -> Option<&'a str> {
        self.target_str(buf).split_once('?').map(|(_, q)| q)
    }

    fn target_str<'a>(&self, buf: &'a [u8]) -> &'a str {
        // Checked to be a valid `PathAndQuery` (ASCII) when parsed.
        std::str::from_utf8(&buf[self.target.clone()]).unwrap_or("/")
    }
}

/// What the start of a buffer holds.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A head the fast path may serve.
    Head(Head),
    /// A request for pingora-proxy, and why (the metric's `result` label).
    HandOff(&'static str),
}

/// Parse the head at the start of `buf`.
pub(crate) fn parse(buf: &[u8]) -> Parsed {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parsed::Partial,
        Ok(httparse::Status::Partial) => return Parsed::HandOff("head"),
        Err(_) => return Parsed::HandOff("head"),
    };
    if req.version != Some(1) {
        return Parsed::HandOff("version");
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Parsed::HandOff("head");
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::HandOff("head");
    };
    // Origin-form only, and a target `http` accepts (as pingora parses it).
    if !target.starts_with('/') || http::uri::PathAndQuery::try_from(target).is_err() {
        return Parsed::HandOff("target");
    }
    let span = |s: &[u8]| {
        let start = s.as_ptr() as usize - buf.as_ptr() as usize;
        start..start + s.len()
    };
    let target = span(target.as_bytes());
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    let mut lines = Vec::with_capacity(req.headers.len());
    let mut body_len = None;
    let mut keepalive = true;
    let mut host = false;
    for h in req.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Parsed::HandOff("head");
        };
        match name {
            // Chunked or any other coding: pingora-proxy's framing rules.
            http::header::TRANSFER_ENCODING => return Parsed::HandOff("framing"),
            http::header::CONTENT_LENGTH => {
                let n = std::str::from_utf8(h.value)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<usize>().ok());
                match (n, body_len) {
                    (Some(n), None) => body_len = Some(n),
                    _ => return Parsed::HandOff("framing"),
                }
            }
            http::header::UPGRADE => return Parsed::HandOff("upgrade"),
            http::header::EXPECT => return Parsed::HandOff("expect"),
            http::header::HOST => host = true,
            http::header::CONNECTION
                if h.value
                    .split(|b| *b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close")) =>
            {
                keepalive = false;
            }
            _ => {}
        }
        lines.push((span(h.name.as_bytes()), span(h.value)));
        headers.append(name, value);
    }
    // No Host: pingora-proxy answers the 400, as for every other request.
    if !host {
        return Parsed::HandOff("host");
    }
    Parsed::Head(Head {
        method,
        target,
        hop_by_hop: crate::sources::connection_listed(&headers),
        headers,
        lines,
        len,
        body_len: body_len.unwrap_or(0),
        keepalive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Head {
        match parse(raw.as_bytes()) {
            Parsed::Head(h) => h,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    fn handed_off(raw: &str) -> &'static str {
        match parse(raw.as_bytes()) {
            Parsed::HandOff(why) => why,
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
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: te, Close\r\n\r\n",
        );
        assert!(!h.keepalive);
    }

    /// Found by `fuzz/fuzz_targets/proxy_request_head.rs`: `Connection:
    /// content-length` dropped the length from the request the Pod got, so the Pod
    /// read the body as its next request (smuggling).
    #[test]
    fn the_body_framing_is_forwarded_even_when_connection_lists_it() {
        let raw = "POST /api/v4/jobs/request HTTP/1.1\r\nHost: a\r\nConnection: content-length, Transfer-Encoding, x-a\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello";
        let h = head(raw);
        assert_eq!(h.hop_by_hop, [HeaderName::from_static("x-a")]);
        let rule = crate::rules::builtin().remove(0);
        let pod = podgate_registry::Pod::new(
            podgate_tokens::PodId::new(2).unwrap(),
            "two",
            "127.0.0.1:2",
        );
        let up = super::super::forward::upstream_request(
            raw.as_bytes(),
            &h,
            raw.len(),
            &rule,
            &pod,
            "rid",
        );
        let up = String::from_utf8(up).unwrap();
        assert!(up.contains("\r\nContent-Length: 5\r\n"), "{up}");
        assert!(!up.contains("X-A"), "{up}");
        assert!(up.ends_with("\r\n\r\nhello"), "{up}");
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
