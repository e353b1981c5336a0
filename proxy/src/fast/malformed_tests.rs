//! Malformed and ambiguous requests, down both paths (the fast path and
//! pingora-proxy alone): each gets the status GitLab's front gives it, is
//! forwarded or not as there, and the connection is closed where the request's
//! framing is lost. What passes NGINX is forwarded (the Pod stub's 200): Workhorse
//! and Rails answer it there. The sources are NGINX's `src/http/ngx_http_parse.c`
//! (`ngx_http_parse_request_line`, `ngx_http_parse_header_line`,
//! `ngx_http_parse_chunked`) and `src/http/ngx_http_request.c`
//! (`ngx_http_process_request_headers`, `ngx_http_process_request_header`),
//! <https://github.com/nginx/nginx/tree/3f6f7824d4e2eb1ac37dec76683d525ac0ff521c>,
//! with GitLab's bundled configuration (`underscores_in_headers off`,
//! `ignore_invalid_headers on`, `large_client_header_buffers 4 8k`: NGINX's
//! defaults, which omnibus-gitlab's `nginx-gitlab-http.conf.erb` keeps).

use std::sync::{Arc, LazyLock};

use podgate_tokens::{Classifier, KeySet};

use super::differential::{Differential, Observed};
use super::differential_tests::token;

static PATHS: LazyLock<std::sync::Mutex<Differential>> = LazyLock::new(|| {
    std::sync::Mutex::new(Differential::new(Arc::new(Classifier::with_keys(
        KeySet::new(),
    ))))
});

/// What a case must get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Refused with this status, nothing forwarded, the connection closed.
    Refused(u16),
    /// Forwarded to the Pod (one request), answered with its 200, kept.
    Forwarded,
    /// Forwarded, and the connection closed after the answer (HTTP/1.0 without
    /// `keep-alive`).
    ForwardedClosed,
}

struct Case {
    name: &'static str,
    request: Vec<u8>,
    fate: Fate,
    /// What decides it here, and where NGINX does.
    by: &'static str,
}

fn case(name: &'static str, request: impl Into<Vec<u8>>, fate: Fate, by: &'static str) -> Case {
    Case {
        name,
        request: request.into(),
        fate,
        by,
    }
}

/// A runner poll (routed by its header token) with `framing` as its body's
/// framing headers and `body` after the head.
fn poll(framing: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nHost: gitlab\r\nRunner-Token: {}\r\nContent-Type: application/json\r\n{framing}\r\n{body}",
        token("glrt-", 2)
    )
    .into_bytes()
}

/// A `GET` of a Rails page (no token) with `extra` header lines.
fn get(extra: &str) -> Vec<u8> {
    format!("GET /dashboard HTTP/1.1\r\nHost: gitlab\r\n{extra}\r\n").into_bytes()
}

fn cases() -> Vec<Case> {
    use Fate::*;
    let long = "a".repeat(9 * 1024);
    vec![
        // The request line (`ngx_http_parse_request_line`).
        case(
            "a lower-case method",
            "get /dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "http1::refusal; ngx_http_parse_request_line",
        ),
        case(
            "a method with a character outside A-Z, _ and -",
            "GE@T /dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "httparse; ngx_http_parse_request_line",
        ),
        case(
            "an unknown method of valid characters",
            "PURGE /dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Forwarded,
            "ngx_http_parse_request_line takes it; Rails answers",
        ),
        case(
            "TRACE",
            "TRACE /dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(405),
            "http1::refusal; ngx_http_process_request_header",
        ),
        case(
            "CONNECT (allow_connect off)",
            "CONNECT gitlab:443 HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(405),
            "pingora-proxy (allow_connect_method_proxying off); ngx_http_process_request_header",
        ),
        case(
            "a relative target",
            "GET dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "http1::refusal; ngx_http_parse_request_line",
        ),
        case(
            "an asterisk target",
            "OPTIONS * HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "http1::refusal; ngx_http_parse_request_line",
        ),
        case(
            "an absolute-form target",
            "GET http://gitlab/dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Forwarded,
            "ngx_http_parse_request_line takes it",
        ),
        case(
            "a space inside the target",
            "GET /dash board HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "pingora strict framing (no escaping); ngx_http_parse_request_line",
        ),
        case(
            "a NUL in the target",
            "GET /dash\0board HTTP/1.1\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "pingora strict framing (no escaping); ngx_http_parse_request_line",
        ),
        case(
            "version HTTP/1.0",
            "GET /dashboard HTTP/1.0\r\nHost: gitlab\r\n\r\n",
            ForwardedClosed,
            "ngx_http_parse_request_line; no keep-alive in HTTP/1.0",
        ),
        // NGINX answers 505 here, and 501 to a coding it does not know; the client
        // caused both, so they are 400s here (5xx alerts stay for server faults).
        // Found by `proxy_request_head` (its no-5xx property).
        case(
            "version HTTP/2.0 over HTTP/1",
            "GET /dashboard HTTP/2.0\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "httparse, strict framing; NGINX: 505",
        ),
        case(
            "version HTTP/9.9",
            "GET /dashboard HTTP/9.9\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "httparse, strict framing; NGINX: 505",
        ),
        case(
            "version HTTP/0.9 spelled out",
            "GET /dashboard HTTP/0.9\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "httparse; ngx_http_parse_request_line",
        ),
        case(
            "a version that is not digits",
            "GET /dashboard HTTP/1.x\r\nHost: gitlab\r\n\r\n",
            Refused(400),
            "httparse; ngx_http_parse_request_line",
        ),
        case(
            "a request line past 8 KiB",
            format!("GET /{long} HTTP/1.1\r\nHost: gitlab\r\n\r\n"),
            Refused(414),
            "http1::refusal; ngx_http_alloc_large_header_buffer (414)",
        ),
        // Header syntax (`ngx_http_parse_header_line`).
        case(
            "an obs-fold continuation line",
            get("X-A: 1\r\n  folded\r\n"),
            Refused(400),
            "httparse; ngx_http_parse_header_line",
        ),
        case(
            "a bare CR in a value",
            get("X-A: 1\r2\r\n"),
            Refused(400),
            "httparse; ngx_http_parse_header_line",
        ),
        case(
            "a bare LF line end",
            "GET /dashboard HTTP/1.1\nHost: gitlab\n\n",
            Forwarded,
            "httparse, ngx_http_parse_header_line take it",
        ),
        case(
            "a NUL in a value",
            get("X-A: 1\x002\r\n"),
            Refused(400),
            "httparse; ngx_http_parse_header_line",
        ),
        case(
            "a space before the colon",
            get("X-A : 1\r\n"),
            Refused(400),
            "httparse; ngx_http_parse_header_line",
        ),
        case(
            "a tab inside a name",
            get("X\tA: 1\r\n"),
            Refused(400),
            "httparse; ngx_http_parse_header_line",
        ),
        // NGINX reads it as an empty field; RFC 9112 §5 and Go's `net/http`
        // (Workhorse) refuse it, and so does `httparse`: kept strict.
        case(
            "a line with no colon",
            get("X-A\r\n"),
            Refused(400),
            "httparse; NGINX takes it as an empty field",
        ),
        case(
            "an empty name",
            get(": 1\r\n"),
            Refused(400),
            "httparse; ngx_http_parse_header_line",
        ),
        case(
            "a header line past 8 KiB",
            get(&format!("X-A: {long}\r\n")),
            Refused(400),
            "http1::refusal; ngx_http_alloc_large_header_buffer (494 as 400)",
        ),
        case(
            "a header name past 8 KiB",
            get(&format!("X-{long}: 1\r\n")),
            Refused(400),
            "http1::refusal; ngx_http_alloc_large_header_buffer (494 as 400)",
        ),
        case(
            "a head past 32 KiB in lines of 7 KiB",
            get(&format!(
                "X-A: {0}\r\nX-B: {0}\r\nX-C: {0}\r\nX-D: {0}\r\nX-E: {0}\r\n",
                "b".repeat(7 * 1024)
            )),
            Refused(400),
            "http1::refusal; ngx_http_alloc_large_header_buffer (494 as 400)",
        ),
        case(
            "no Host in HTTP/1.1",
            "GET /dashboard HTTP/1.1\r\n\r\n",
            Refused(400),
            "pipeline::plan; ngx_http_process_request_header",
        ),
        case(
            "two Host headers",
            get("Host: other\r\n"),
            Refused(400),
            "pingora validate_request_authority; ngx_http_process_host",
        ),
        case(
            "an invalid Host",
            "GET /dashboard HTTP/1.1\r\nHost: git/lab\r\n\r\n",
            Refused(400),
            "http1::refusal; ngx_http_validate_host",
        ),
        // Content-Length (`ngx_http_process_request_header`, unique headers).
        case(
            "Content-Length not a number",
            poll("Content-Length: abc\r\n", ""),
            Refused(400),
            "pingora; ngx_http_process_request_header (ngx_atoof)",
        ),
        case(
            "Content-Length negative",
            poll("Content-Length: -1\r\n", ""),
            Refused(400),
            "pingora; ngx_http_process_request_header (ngx_atoof)",
        ),
        case(
            "Content-Length with a plus sign",
            poll("Content-Length: +2\r\n", "{}"),
            Refused(400),
            "http1::refusal; ngx_http_process_request_header (ngx_atoof)",
        ),
        case(
            "Content-Length twice, equal",
            poll("Content-Length: 2\r\nContent-Length: 2\r\n", "{}"),
            Refused(400),
            "http1::refusal; ngx_http_process_unique_header_line",
        ),
        case(
            "Content-Length twice, different",
            poll("Content-Length: 2\r\nContent-Length: 3\r\n", "{}x"),
            Refused(400),
            "pingora; ngx_http_process_unique_header_line",
        ),
        case(
            "Content-Length as a list",
            poll("Content-Length: 2, 2\r\n", "{}"),
            Refused(400),
            "http1::refusal; ngx_http_process_request_header (ngx_atoof)",
        ),
        case(
            "Content-Length with Transfer-Encoding",
            poll(
                "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
                "2\r\n{}\r\n0\r\n\r\n",
            ),
            Refused(400),
            "pingora strict framing; ngx_http_process_request_header",
        ),
        case(
            "Content-Length past 2^64",
            poll("Content-Length: 99999999999999999999\r\n", ""),
            Refused(400),
            "pingora; ngx_http_process_request_header (ngx_atoof)",
        ),
        // Transfer-Encoding and chunked bodies (`ngx_http_parse_chunked`).
        case(
            "a chunked poll",
            poll("Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n"),
            Forwarded,
            "pingora's chunked reader; ngx_http_parse_chunked",
        ),
        case(
            "Transfer-Encoding gzip, chunked",
            poll(
                "Transfer-Encoding: gzip, chunked\r\n",
                "2\r\n{}\r\n0\r\n\r\n",
            ),
            Refused(400),
            "pingora strict framing; ngx_http_process_request_header (NGINX: 501)",
        ),
        case(
            "Transfer-Encoding gzip",
            poll("Transfer-Encoding: gzip\r\n", ""),
            Refused(400),
            "pingora strict framing; ngx_http_process_request_header (NGINX: 501)",
        ),
        case(
            "Transfer-Encoding twice",
            poll(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "2\r\n{}\r\n0\r\n\r\n",
            ),
            Refused(400),
            "pingora strict framing; ngx_http_process_unique_header_line",
        ),
        case(
            "Transfer-Encoding in HTTP/1.0",
            "POST /api/v4/jobs/request HTTP/1.0\r\nHost: gitlab\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            Refused(400),
            "pingora; ngx_http_process_request_header",
        ),
        case(
            "a chunk size that overflows",
            poll(
                "Transfer-Encoding: chunked\r\n",
                "ffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
            ),
            Refused(400),
            "pingora's chunked reader, answer::for_error; ngx_http_parse_chunked",
        ),
        case(
            "a chunk size that is not hex",
            poll("Transfer-Encoding: chunked\r\n", "zz\r\n{}\r\n0\r\n\r\n"),
            Refused(400),
            "pingora's chunked reader, answer::for_error; ngx_http_parse_chunked",
        ),
        case(
            "a chunk without its CRLF",
            poll("Transfer-Encoding: chunked\r\n", "2\r\n{}X0\r\n\r\n"),
            Refused(400),
            "pingora's chunked reader, answer::for_error; ngx_http_parse_chunked",
        ),
        case(
            "a chunk extension",
            poll(
                "Transfer-Encoding: chunked\r\n",
                "2;name=value\r\n{}\r\n0\r\n\r\n",
            ),
            Forwarded,
            "ngx_http_parse_chunked takes it",
        ),
        case(
            "a chunk extension of bare bytes",
            poll(
                "Transfer-Encoding: chunked\r\n",
                "2;\x01\x02\r\n{}\r\n0\r\n\r\n",
            ),
            Forwarded,
            "ngx_http_parse_chunked takes it",
        ),
        case(
            "trailers after the last chunk",
            poll(
                "Transfer-Encoding: chunked\r\n",
                "2\r\n{}\r\n0\r\nX-Trailer: 1\r\n\r\n",
            ),
            Forwarded,
            "ngx_http_parse_chunked takes them",
        ),
        // Expect (`ngx_http_test_expect`) and bodies on GET.
        case(
            "Expect: 100-continue",
            poll("Expect: 100-continue\r\nContent-Length: 2\r\n", "{}"),
            Forwarded,
            "body::answer_expect; ngx_http_test_expect",
        ),
        case(
            "an unknown expectation",
            poll("Expect: something\r\nContent-Length: 2\r\n", "{}"),
            Forwarded,
            "body::answer_expect; ngx_http_test_expect",
        ),
        case(
            "Expect twice",
            poll(
                "Expect: 100-continue\r\nExpect: 100-continue\r\nContent-Length: 2\r\n",
                "{}",
            ),
            Refused(400),
            "http1::refusal; ngx_http_process_unique_header_line",
        ),
        case(
            "a GET with a body",
            "GET /dashboard HTTP/1.1\r\nHost: gitlab\r\nContent-Length: 3\r\n\r\nabc",
            Forwarded,
            "NGINX takes it",
        ),
        case(
            "a GET with a chunked body",
            "GET /dashboard HTTP/1.1\r\nHost: gitlab\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            Forwarded,
            "NGINX takes it",
        ),
    ]
}

fn status(o: &Observed) -> Option<u16> {
    let start = &o.answer.as_ref()?.start;
    start.split(' ').nth(1)?.parse().ok()
}

/// Every case, on each path: the status, whether anything reached the Pod and
/// whether the connection still serves requests, as GitLab's front; and both
/// paths alike.
#[test]
fn malformed_requests_are_answered_as_gitlabs_front_answers_them() {
    let paths = PATHS.lock().unwrap();
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for c in cases() {
        let (fast, pingora) = paths.run(&c.request);
        for (path, o) in [("fast path", &fast), ("pingora", &pingora)] {
            let seen = (status(o), o.upstream.len(), o.kept_alive);
            let want = match c.fate {
                Fate::Refused(s) => (Some(s), 0, false),
                Fate::Forwarded => (Some(200), 1, true),
                Fate::ForwardedClosed => (Some(200), 1, false),
            };
            table.push(format!(
                "{:<45} {path:<9} status {:?} forwarded {} kept {} ({})",
                c.name, seen.0, seen.1, seen.2, c.by
            ));
            if seen != want {
                failures.push(format!(
                    "{}: {path} gave (status, forwarded, kept) {seen:?}, GitLab's front {want:?}: {:?}",
                    c.name, o.answer
                ));
            }
        }
        if fast != pingora {
            failures.push(format!(
                "{}: the paths differ:\n  fast path:    {fast:?}\n  pingora only: {pingora:?}",
                c.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\n{}",
        failures.join("\n"),
        table.join("\n")
    );
}

/// `Expect` ends at the edge, as at GitLab's NGINX: `100-continue` gets `100
/// Continue` before the answer, any other expectation is ignored, and the Pod
/// sees neither.
#[test]
fn expect_is_answered_at_the_edge_and_not_forwarded() {
    let paths = PATHS.lock().unwrap();
    for (expect, continued) in [("100-continue", true), ("100-Continue", true), ("x", false)] {
        let (fast, pingora) = paths.run(&poll(
            &format!("Expect: {expect}\r\nContent-Length: 2\r\n"),
            "{}",
        ));
        assert_eq!(fast, pingora);
        assert_eq!(fast.continued, continued, "{expect}: {fast:?}");
        let [request] = fast.upstream.as_slice() else {
            panic!("{expect}: one request upstream: {fast:?}");
        };
        assert!(
            !request.headers.iter().any(|(n, _)| n == "expect"),
            "{expect}: {request:?}"
        );
        assert_eq!(request.body, b"{}");
    }
}

/// Found by `proxy_chunked` (its no-5xx property).
///
/// A client that closes mid-request lost its own request: no 5xx (NGINX answers
/// 400, "client prematurely closed connection", in
/// `ngx_http_read_client_request_body`), and nothing half-sent reaches the Pod.
#[test]
fn a_request_cut_short_by_its_client_is_not_a_server_error() {
    let paths = PATHS.lock().unwrap();
    for (name, bytes) in [
        (
            "in the head",
            b"GET /dashboard HTTP/1.1\r\nHost: git".to_vec(),
        ),
        (
            "in a length body",
            poll("Content-Length: 20\r\n", "{\"token\":"),
        ),
        (
            "in a chunk",
            poll("Transfer-Encoding: chunked\r\n", "FFFFFFFFFFFFFFF\r\nx"),
        ),
        (
            "between chunks",
            poll("Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n"),
        ),
    ] {
        let (fast, pingora) = paths.run_then_close(&bytes);
        let want = match name {
            "in the head" => None,
            _ => Some(400),
        };
        for o in [&fast, &pingora] {
            assert_eq!(status(o), want, "{name}: {o:?}");
            assert!(o.upstream.is_empty(), "{name}: {o:?}");
        }
    }
    // Found by `proxy_request_head`: an answer of the proxy's own (conflicting
    // tokens) to a request whose body is still coming, and then does not. The fast
    // path reads the body first (400); pingora-proxy answers from the head or takes
    // the client for gone. Never a 500 (the drain before an answer of its own
    // failed), nothing forwarded.
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/regressions/proxy_request_head/answered-while-its-body-is-cut-short"
    ))
    .unwrap();
    let (fast, pingora) = paths.run_then_close(&bytes);
    assert_eq!(status(&fast), Some(400), "{fast:?}");
    assert!(
        status(&pingora).is_none_or(|s| (400..500).contains(&s)),
        "{pingora:?}"
    );
    assert!(fast.upstream.is_empty() && pingora.upstream.is_empty());
}
