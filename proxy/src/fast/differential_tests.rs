//! The differential test: the same request bytes down the fast path and down
//! pingora-proxy alone give the same answer and the same request to the Pod.

use std::sync::{Arc, LazyLock};

use podgate_tokens::{Classifier, KeySet};

use super::differential::{Differential, Observed};

static PATHS: LazyLock<std::sync::Mutex<Differential>> = LazyLock::new(|| {
    std::sync::Mutex::new(Differential::new(Arc::new(Classifier::with_keys(
        KeySet::new(),
    ))))
});

/// A routable runner or job token of Pod `cell`.
pub(super) fn token(prefix: &str, cell: u64) -> String {
    let keys = podgate_tokens::gitlab::RoutingKeys {
        cell: Some(cell),
        organization: Some(1),
        ..Default::default()
    };
    podgate_tokens::gitlab::encode(prefix, &keys, &[7; 16]).unwrap()
}

fn both(request: &str) -> (Observed, Observed) {
    PATHS.lock().unwrap().run(request.as_bytes())
}

fn status(o: &Observed) -> &str {
    o.answer.as_ref().map_or("closed", |m| m.start.as_str())
}

/// A connection's future on the fast path stays within its budget: every held
/// poll and idle connection carries it (the README's memory per held poll is
/// measured with it). A change that grows it past the bound (a type kept across an
/// await that was not before, an inline array) shows here rather than in a memory
/// bench. The figure is this profile's (unoptimised test builds lay futures out as
/// release builds do, give or take locals kept alive).
#[test]
fn a_connection_future_stays_within_its_budget() {
    // 2,816 bytes at this writing (Rust 1.95); two cuts once taken back cost 408.
    const BUDGET: usize = 2_880;
    let size = PATHS.lock().unwrap().connection_future_size();
    assert!(
        size <= BUDGET,
        "a fast-path connection's future is {size} bytes, past its {BUDGET}: see what a change keeps across an await"
    );
}

/// Each request, on each path: the same answer, the same upstream request, and
/// the request id the client got is the one the Pod got.
#[test]
fn both_paths_answer_and_forward_alike() {
    let t2 = token("glrt-", 2);
    let t3 = token("glrt-", 3);
    let j2 = token("glcbt-", 2);
    let poll = |body: &str, extra: &str| {
        format!(
            "POST /api/v4/jobs/request HTTP/1.1\r\nHost: gitlab.example.com\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "a poll by its JSON token",
            poll(&format!("{{\"token\":\"{t2}\"}}"), ""),
            "HTTP/1.1 200 OK",
        ),
        (
            "a poll by its header token, with a body of no token",
            poll("{}", &format!("Runner-Token: {t3}\r\n")),
            "HTTP/1.1 200 OK",
        ),
        (
            "conflicting tokens",
            poll(
                &format!("{{\"token\":\"{t2}\"}}"),
                &format!("Runner-Token: {t3}\r\n"),
            ),
            "HTTP/1.1 400 Bad Request",
        ),
        ("no token", poll("{}", ""), "HTTP/1.1 400 Bad Request"),
        (
            "an invalid token",
            poll(&format!("{{\"token\":\"{}x\"}}", &t2[..t2.len() - 1]), ""),
            "HTTP/1.1 401 Unauthorized",
        ),
        (
            "a body GitLab cannot parse",
            poll("{\"token\":", ""),
            "HTTP/1.1 400 Bad Request",
        ),
        (
            "a poll past the 32 KiB cap",
            poll(
                &format!("{{\"token\":\"{t2}\",\"x\":\"{}\"}}", "a".repeat(33 * 1024)),
                "",
            ),
            "HTTP/1.1 413 Payload Too Large",
        ),
        (
            "a job update with a client's own x-podgate headers and request id",
            format!(
                "PUT /api/v4/jobs/7 HTTP/1.1\r\nHost: gitlab\r\nX-Podgate-Pod: 3\r\nX-Request-Id: abc-123\r\nJob-Token: {j2}\r\nContent-Length: 0\r\n\r\n"
            ),
            "HTTP/1.1 200 OK",
        ),
        (
            "a trace patch with hop-by-hop headers and repeated headers",
            format!(
                "PATCH /api/v4/jobs/7/trace HTTP/1.1\r\nHost: gitlab\r\nX-A: 1\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\nTE: trailers\r\nJob-Token: {j2}\r\nX-A: 2\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
            ),
            "HTTP/1.1 200 OK",
        ),
        (
            "a trace patch with an invalid header token and an unread body",
            format!(
                "PATCH /api/v4/jobs/7/trace HTTP/1.1\r\nHost: gitlab\r\nJob-Token: {}x\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello\nworld",
                &j2[..j2.len() - 1]
            ),
            "HTTP/1.1 401 Unauthorized",
        ),
        (
            // NGINX (`ngx_http_parse_chunked`) and Go's `net/http` answer 400.
            "a chunked poll whose chunk size overflows",
            format!(
                "POST /api/v4/jobs/request HTTP/1.1\r\nHost: gitlab\r\nRunner-Token: {t2}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nabc\r\n0\r\n\r\n"
            ),
            "HTTP/1.1 400 Bad Request",
        ),
        (
            "a chunked body whose chunk does not end in CRLF",
            format!(
                "POST /api/v4/jobs/request HTTP/1.1\r\nHost: gitlab\r\nRunner-Token: {t2}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}X0\r\n\r\n"
            ),
            "HTTP/1.1 400 Bad Request",
        ),
        (
            "a poll with two Host headers (pingora-proxy's 400)",
            poll(
                &format!("{{\"token\":\"{t2}\"}}"),
                "Host: other.example.com\r\n",
            ),
            "HTTP/1.1 400 Bad Request",
        ),
        (
            "a form registration with a query",
            {
                let body = format!("token={t3}&info%5Bname%5D=r");
                format!(
                    "POST /api/v4/runners/verify?x=1 HTTP/1.1\r\nHost: gitlab\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            },
            "HTTP/1.1 200 OK",
        ),
        (
            "a path GitLab serves after cleaning",
            format!(
                "POST /api/v4/jobs/%72equest/ HTTP/1.1\r\nHost: gitlab\r\nRunner-Token: {t2}\r\nContent-Length: 0\r\n\r\n"
            ),
            "HTTP/1.1 200 OK",
        ),
        (
            "a token in a header nominated as hop by hop (pingora-proxy's)",
            format!(
                "PATCH /api/v4/jobs/7/trace HTTP/1.1\r\nHost: gitlab\r\nConnection: x-token\r\nX-Token: glrt-x\r\nJob-Token: {j2}\r\nContent-Length: 0\r\n\r\n"
            ),
            "HTTP/1.1 200 OK",
        ),
        (
            "a request the fast path hands to pingora-proxy",
            "GET /dashboard HTTP/1.1\r\nHost: gitlab\r\n\r\n".to_owned(),
            "HTTP/1.1 200 OK",
        ),
        (
            "a HEAD of job artifacts",
            format!(
                "HEAD /api/v4/jobs/7/artifacts HTTP/1.1\r\nHost: gitlab\r\nJob-Token: {j2}\r\n\r\n"
            ),
            "HTTP/1.1 200 OK",
        ),
    ];
    let mut failures = Vec::new();
    for (name, request, expected) in &cases {
        let (fast, pingora) = both(request);
        if status(&fast) != *expected {
            failures.push(format!(
                "{name}: fast path answered {:?}, expected {expected}",
                fast.answer
            ));
        }
        if fast != pingora {
            failures.push(format!(
                "{name}: the paths differ:\n  fast path:    {fast:?}\n  pingora only: {pingora:?}"
            ));
        }
        if !fast.request_id_kept || !pingora.request_id_kept {
            failures.push(format!(
                "{name}: the Pod got another request id than the client"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Headers with an underscore reach no Pod, on either path, as GitLab's NGINX drops
/// them (`underscores_in_headers off`); the request is routed as if they were not
/// there (here: no token, the default Pod).
#[test]
fn headers_with_an_underscore_do_not_reach_the_pod() {
    let t2 = token("glrt-", 2);
    let (fast, pingora) = both(&format!(
        "GET /api/v4/user HTTP/1.1\r\nHost: gitlab\r\nPRIVATE_TOKEN: {t2}\r\nX_Custom: 1\r\nX-Kept: 2\r\n\r\n"
    ));
    assert_eq!(fast, pingora);
    let [request] = fast.upstream.as_slice() else {
        panic!("one request upstream: {fast:?}");
    };
    let names: Vec<&str> = request.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"x-kept"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains('_')), "{names:?}");
    let pod = request
        .headers
        .iter()
        .find(|(n, _)| n == "x-podgate-pod")
        .map(|(_, v)| v.clone());
    assert_eq!(pod.as_deref(), Some(b"1".as_slice()), "the default Pod");
}

/// The Pod learns which Pod, rule and request id the proxy decided, and nothing
/// the client claimed of them.
#[test]
fn the_pod_gets_the_headers_the_proxy_adds() {
    let j2 = token("glcbt-", 2);
    let (fast, _) = both(&format!(
        "PUT /api/v4/jobs/7 HTTP/1.1\r\nHost: gitlab\r\nX-Podgate-Pod: 3\r\nX-Podgate-Rule: default\r\nJob-Token: {j2}\r\nContent-Length: 0\r\n\r\n"
    ));
    let [request] = fast.upstream.as_slice() else {
        panic!("one request upstream: {fast:?}");
    };
    let get = |name: &str| -> Vec<&[u8]> {
        request
            .headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
            .collect()
    };
    assert_eq!(get("x-podgate-pod"), [b"2"]);
    assert_eq!(get("x-podgate-rule"), [b"job-update"]);
}
