//! The HTTP/1 request rules both request paths apply before routing: what GitLab's
//! front, NGINX with omnibus-gitlab's configuration, refuses of a request head
//! that `httparse` has already parsed. The fast path hands a head that breaks one
//! to pingora-proxy ([`crate::fast`]), whose service answers it
//! ([`crate::service`]); so each rule lives here once, and every refusal closes
//! the connection, as NGINX's do (an error while the head is processed leaves
//! `r->keepalive` unset).
//!
//! [`content_length`] is the one `Content-Length` parser of both paths, for
//! requests and responses.
//!
//! What pingora decides before either path sees the head (a request line
//! `httparse` rejects, an HTTP version above 1, `Content-Length` beside
//! `Transfer-Encoding`, a `Transfer-Encoding` other than one `chunked`) is
//! refused there in strict mode, a patch of ours
//! (`HttpServerOptions::h1_strict_framing`, `vendor/README.md`).
//!
//! Sources, NGINX at
//! <https://github.com/nginx/nginx/tree/3f6f7824d4e2eb1ac37dec76683d525ac0ff521c>:
//! `src/http/ngx_http_parse.c` (`ngx_http_parse_request_line`) and
//! `src/http/ngx_http_request.c` (`ngx_http_headers_in`,
//! `ngx_http_alloc_large_header_buffer`, `ngx_http_process_request_header`,
//! `ngx_http_validate_host`), with `large_client_header_buffers 4 8k` (NGINX's
//! default, which omnibus-gitlab's `nginx-gitlab-http.conf.erb` keeps).

use http::HeaderMap;
use http::header::{self, HeaderName};

use crate::decision::Refusal;

/// Longest request line, and longest header line: one of NGINX's large header
/// buffers (`large_client_header_buffers 4 8k`). A longer request line is a 414,
/// a longer header line a 400.
pub const MAX_LINE: usize = 8 * 1024;

/// Longest head, request line and header lines together: NGINX's four large
/// header buffers. Longer: 400.
pub const MAX_HEAD: usize = 4 * MAX_LINE;

/// The headers NGINX takes once (`ngx_http_process_unique_header_line`, and
/// `ngx_http_process_host` for `Host`): a second line of one is a 400.
const UNIQUE: [HeaderName; 12] = [
    header::HOST,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::IF_RANGE,
    header::TRANSFER_ENCODING,
    header::EXPECT,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
];

/// An HTTP/1 request head, as either path parsed it.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// The method, as received (case kept).
    pub method: &'a str,
    /// The request target, as received.
    pub target: &'a [u8],
    /// The headers.
    pub headers: &'a HeaderMap,
}

/// What GitLab's NGINX refuses of `head`, in the order NGINX finds it; `None`:
/// nothing, route it.
pub fn refusal(head: &RequestHead<'_>) -> Option<Refusal> {
    // `ngx_http_parse_request_line`: a method is A-Z, `_` and `-`.
    if head.method.is_empty()
        || !head
            .method
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
    {
        return Some(Refusal::bad_request(
            "invalid_method",
            "the method is not upper-case letters, '_' and '-'",
        ));
    }
    // A target is a path (origin-form) or a URL (absolute-form).
    if !head.target.starts_with(b"/") && !absolute_form(head.target) {
        return Some(Refusal::bad_request(
            "invalid_target",
            "the request target is neither a path nor an absolute URL",
        ));
    }
    // "HTTP/1.1" and the two spaces.
    let line = head.method.len() + head.target.len() + 10;
    if line > MAX_LINE {
        return Some(refused(
            414,
            "uri_too_long",
            format!("the request line is longer than {MAX_LINE} bytes"),
        ));
    }
    // One pass over the headers: line lengths, and the unique ones seen twice.
    let mut total = line + 2;
    let mut seen = 0u16;
    for (name, value) in head.headers {
        let len = name.as_str().len() + 2 + value.len();
        if len > MAX_LINE {
            return Some(Refusal::bad_request(
                "header_too_large",
                format!("header {name} is longer than {MAX_LINE} bytes"),
            ));
        }
        total += len + 2;
        if let Some(i) = UNIQUE.iter().position(|u| u == name) {
            if seen & (1 << i) != 0 {
                return Some(Refusal::bad_request(
                    "duplicate_header",
                    format!("header {name} is sent more than once"),
                ));
            }
            seen |= 1 << i;
        }
    }
    if total > MAX_HEAD {
        return Some(Refusal::bad_request(
            "header_too_large",
            format!("the request head is longer than {MAX_HEAD} bytes"),
        ));
    }
    if let Some(host) = head.headers.get(http::header::HOST)
        && !valid_host(host.as_bytes())
    {
        return Some(Refusal::bad_request(
            "invalid_host",
            "the Host header is not a host name or address",
        ));
    }
    // `ngx_atoof`: digits only, no sign, no list, no overflow.
    if let Some(length) = head.headers.get(http::header::CONTENT_LENGTH)
        && content_length(length.as_bytes()).is_none()
    {
        return Some(Refusal::bad_request(
            "invalid_content_length",
            "the Content-Length header is not a number of bytes",
        ));
    }
    if head.method == "TRACE" {
        return Some(refused(
            405,
            "method_not_allowed",
            "TRACE is not allowed".into(),
        ));
    }
    None
}

/// `value` as a `Content-Length` (RFC 9110 §8.6: `1*DIGIT`, as NGINX's
/// `ngx_atoof` reads it: no sign, no list, no whitespace inside); `None` if it is
/// not one or does not fit in 63 bits.
pub fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value)
        .ok()?
        .parse::<u64>()
        .ok()
        .filter(|n| i64::try_from(*n).is_ok())
}

/// Whether a request header ends at the proxy, whatever the request: no Pod
/// receives it, on either path. These are the hop-by-hop headers (RFC 9110
/// §7.6.1), as pingora-proxy strips them (`strip_standard_hop_by_hop_headers`)
/// but for `Transfer-Encoding` and `Upgrade`, which frame the body and the
/// upgrade and stay pingora's; `Expect`, which the proxy answers
/// (`body::answer_expect`) and NGINX's proxy module sets empty
/// (`ngx_http_proxy_headers`); and names with an underscore
/// ([`crate::sources::dropped_at_the_edge`]). Headers a request lists in its own
/// `Connection:` end here too ([`crate::sources::connection_listed`]).
pub fn ends_here(name: &[u8]) -> bool {
    const HOP_BY_HOP: [&[u8]; 9] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"http2-settings",
        b"expect",
    ];
    HOP_BY_HOP
        .iter()
        .any(|h| h.len() == name.len() && name.eq_ignore_ascii_case(h))
        || crate::sources::dropped_at_the_edge(name)
}

/// The tokens of every `Connection` line (a list field, RFC 9110 §7.6.1:
/// comma-separated, any number of lines), trimmed, empty ones left out.
pub fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether the client asked to close the connection after this request: `close`
/// in any `Connection` line (RFC 9112 §9.6).
pub fn wants_close(headers: &HeaderMap) -> bool {
    connection_tokens(headers).any(|t| t.eq_ignore_ascii_case(b"close"))
}

/// The body length a request's `Content-Length` declares, if it has one that
/// [`content_length`] reads and that fits in memory.
pub fn declared_length(headers: &HeaderMap) -> Option<usize> {
    let value = headers.get(http::header::CONTENT_LENGTH)?;
    usize::try_from(content_length(value.as_bytes())?).ok()
}

fn refused(status: u16, code: &'static str, detail: String) -> Refusal {
    Refusal {
        status,
        code,
        detail,
    }
}

/// `scheme://…`, as `ngx_http_parse_request_line` reads a schema: a letter, then
/// letters, digits, `+`, `-` and `.`.
fn absolute_form(target: &[u8]) -> bool {
    let Some(colon) = target.iter().position(|&b| b == b':') else {
        return false;
    };
    let scheme = &target[..colon];
    scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        && target[colon..].starts_with(b"://")
}

/// `ngx_http_validate_host`: a name of letters, digits, unreserved and
/// sub-delimiter characters and `%`, without `..`; or an IP literal in brackets;
/// then an optional port of at most 65535. Empty is invalid.
fn valid_host(host: &[u8]) -> bool {
    let (name, port) = match host.first() {
        Some(b'[') => {
            let Some(end) = host.iter().position(|&b| b == b']') else {
                return false;
            };
            let literal = &host[1..end];
            if !literal.iter().all(|&b| b == b':' || host_char(b)) {
                return false;
            }
            match &host[end + 1..] {
                [] => (&host[..=end], None),
                [b':', port @ ..] => (&host[..=end], Some(port)),
                _ => return false,
            }
        }
        _ => match host.iter().position(|&b| b == b':') {
            Some(colon) => (&host[..colon], Some(&host[colon + 1..])),
            None => (host, None),
        },
    };
    let name_ok = name.starts_with(b"[")
        || (name.iter().all(|&b| host_char(b) || b == b'%')
            && !name.windows(2).any(|w| w == b".."));
    let port_ok = port.is_none_or(|p| {
        p.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(p)
                .ok()
                .and_then(|p| {
                    if p.is_empty() {
                        Some(0)
                    } else {
                        p.parse::<u32>().ok()
                    }
                })
                .is_some_and(|n| n <= 65535)
    });
    let trimmed = name.strip_suffix(b".").unwrap_or(name);
    name_ok && port_ok && !trimmed.is_empty() && !name.starts_with(b".")
}

fn host_char(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head<'a>(method: &'a str, target: &'a str, headers: &'a HeaderMap) -> RequestHead<'a> {
        RequestHead {
            method,
            target: target.as_bytes(),
            headers,
        }
    }

    fn headers(lines: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in lines {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn code(method: &str, target: &str, lines: &[(&str, &str)]) -> Option<(u16, &'static str)> {
        let h = headers(lines);
        refusal(&head(method, target, &h)).map(|r| (r.status, r.code))
    }

    #[test]
    fn what_nginx_takes_passes() {
        let host = [("host", "gitlab.example.com:8443")];
        assert_eq!(code("GET", "/api/v4/user?x=1", &host), None);
        assert_eq!(code("PURGE", "/", &host), None);
        assert_eq!(code("GET", "https://gitlab.example.com/x", &host), None);
        assert_eq!(code("GET", "/", &[("host", "[::1]:80")]), None);
        assert_eq!(code("GET", "/", &[("host", "gitlab.")]), None);
        assert_eq!(
            code("GET", "/", &[("host", "gitlab"), ("content-length", "12")]),
            None
        );
        assert_eq!(
            code("GET", "/", &[("x-a", "1"), ("x-a", "2"), ("host", "g")]),
            None
        );
    }

    #[test]
    fn what_nginx_refuses_is_refused_with_its_status() {
        let host = ("host", "gitlab");
        assert_eq!(code("get", "/", &[host]), Some((400, "invalid_method")));
        assert_eq!(code("GE.T", "/", &[host]), Some((400, "invalid_method")));
        assert_eq!(code("GET", "x", &[host]), Some((400, "invalid_target")));
        assert_eq!(code("GET", "*", &[host]), Some((400, "invalid_target")));
        assert_eq!(
            code("GET", "1http://x/", &[host]),
            Some((400, "invalid_target"))
        );
        let long = format!("/{}", "a".repeat(MAX_LINE));
        assert_eq!(code("GET", &long, &[host]), Some((414, "uri_too_long")));
        let value = "a".repeat(MAX_LINE);
        assert_eq!(
            code("GET", "/", &[host, ("x-a", &value)]),
            Some((400, "header_too_large"))
        );
        let value = "a".repeat(MAX_LINE - 100);
        let names = ["x-a", "x-b", "x-c", "x-d", "x-e"];
        let many: Vec<(&str, &str)> = names
            .into_iter()
            .map(|n| (n, value.as_str()))
            .chain([host])
            .collect();
        assert_eq!(code("GET", "/", &many), Some((400, "header_too_large")));
        for name in [
            "host",
            "content-length",
            "expect",
            "authorization",
            "transfer-encoding",
        ] {
            assert_eq!(
                code("GET", "/", &[host, (name, "1"), (name, "1")]),
                Some((400, "duplicate_header")),
                "{name}"
            );
        }
        for bad in [
            "git/lab", "a..b", "", "[::1", "[::1]x", "g:99999", "g:8o", "g lab",
        ] {
            let h = [("host", bad)];
            assert_eq!(code("GET", "/", &h), Some((400, "invalid_host")), "{bad}");
        }
        for bad in ["+5", "-1", "2, 2", "0x10", "99999999999999999999", ""] {
            assert_eq!(
                code("GET", "/", &[host, ("content-length", bad)]),
                Some((400, "invalid_content_length")),
                "{bad}"
            );
        }
        assert_eq!(
            code("TRACE", "/", &[host]),
            Some((405, "method_not_allowed"))
        );
    }
}
