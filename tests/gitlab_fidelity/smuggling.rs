//! Request smuggling and framing edge cases, run against both paths a request can
//! take: the HTTP/1 fast path (`fast_path = true`, the default) and pingora-proxy
//! alone (`fast_path = false`).
//!
//! Each attempt is raw bytes on one connection: an outer request carrying a Pod 2
//! runner token and, hidden in its body by ambiguous framing, an inner request
//! carrying a Pod 3 token. Two things must hold:
//!
//! - **no misroute**, on either path: every request a Pod sees names that Pod in
//!   its `x-fidelity-case` label (`<id>-p<pod>`), i.e. was routed by its own token;
//! - **one behaviour**: the statuses the client reads and what each Pod sees are the
//!   same on both paths (the fast path hands every ambiguous framing to pingora, so
//!   a smuggling attempt meets exactly the refusals it met before the fast path, and
//!   like pingora it serves no request that came in the same read as another: a
//!   connection with bytes past its request closes after the answer).

use super::*;

/// An attempt: a name and the bytes.
struct Attempt {
    name: &'static str,
    raw: String,
}

fn json_poll(token: &str) -> String {
    format!("{{\"token\":\"{token}\",\"last_update\":\"x\"}}")
}

/// A whole `jobs/request` with a JSON body (`Connection: close` when `last`).
fn poll(label: &str, token: &str, last: bool) -> String {
    let body = json_poll(token);
    let connection = if last { "connection: close\r\n" } else { "" };
    format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nhost: gitlab.example.com\r\nx-fidelity-case: {label}\r\ncontent-type: application/json\r\n{connection}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The attempts of one round: `id` labels its requests, `t2` and `t3` are runner
/// tokens of Pods 2 and 3.
fn attempts(id: &str, t2: &str, t3: &str) -> Vec<Attempt> {
    let p2 = format!("{id}-p2");
    let inner = poll(&format!("{id}-p3"), t3, true);
    let outer_head = |framing: &str| {
        format!(
            "POST /api/v4/jobs/request HTTP/1.1\r\nhost: gitlab.example.com\r\nx-fidelity-case: {p2}\r\nrunner-token: {t2}\r\ncontent-type: application/json\r\n{framing}\r\n"
        )
    };
    let chunked_empty = format!("0\r\n\r\n{inner}");
    let body2 = json_poll(t2);
    let chunk = format!("{:x}\r\n{body2}\r\n0\r\n\r\n", body2.len());
    vec![
        Attempt {
            name: "CL.TE: Content-Length covers an inner request, chunked ends before it",
            raw: format!(
                "{}{chunked_empty}",
                outer_head(&format!(
                    "content-length: {}\r\ntransfer-encoding: chunked\r\n",
                    chunked_empty.len()
                ))
            ),
        },
        Attempt {
            name: "TE.CL: chunked covers an inner request, Content-Length ends before it",
            raw: format!(
                "{}{:x}\r\n{inner}\r\n0\r\n\r\n",
                outer_head("transfer-encoding: chunked\r\ncontent-length: 4\r\n"),
                inner.len()
            ),
        },
        Attempt {
            name: "two different Content-Length headers",
            raw: format!(
                "{}{inner}",
                outer_head(&format!(
                    "content-length: 0\r\ncontent-length: {}\r\n",
                    inner.len()
                ))
            ),
        },
        Attempt {
            name: "a Content-Length list",
            raw: format!(
                "{}{inner}",
                outer_head(&format!("content-length: 0, {}\r\n", inner.len()))
            ),
        },
        Attempt {
            name: "a signed Content-Length",
            raw: format!(
                "{}{inner}",
                outer_head(&format!("content-length: +{}\r\n", inner.len()))
            ),
        },
        Attempt {
            name: "an obfuscated Transfer-Encoding beside Content-Length",
            raw: format!(
                "{}{chunked_empty}",
                outer_head(&format!(
                    "content-length: {}\r\ntransfer-encoding: xchunked\r\n",
                    chunked_empty.len()
                ))
            ),
        },
        Attempt {
            name: "Transfer-Encoding with a space before the colon",
            raw: format!(
                "{}{chunked_empty}",
                outer_head(&format!(
                    "content-length: {}\r\ntransfer-encoding : chunked\r\n",
                    chunked_empty.len()
                ))
            ),
        },
        Attempt {
            name: "Transfer-Encoding folded onto a second line",
            raw: format!(
                "{}{chunked_empty}",
                outer_head(&format!(
                    "content-length: {}\r\ntransfer-encoding:\r\n chunked\r\n",
                    chunked_empty.len()
                ))
            ),
        },
        Attempt {
            name: "a valid chunked poll, then an inner request on the same connection",
            raw: format!(
                "{}{chunk}{inner}",
                outer_head("transfer-encoding: chunked\r\n")
            ),
        },
        Attempt {
            name: "two pipelined polls for two Pods",
            raw: format!("{}{inner}", poll(&p2, t2, false)),
        },
        Attempt {
            name: "a fast poll, then a CL.TE attempt on the same connection",
            raw: format!(
                "{}{}{chunked_empty}",
                poll(&p2, t2, false),
                outer_head(&format!(
                    "content-length: {}\r\ntransfer-encoding: chunked\r\n",
                    chunked_empty.len()
                ))
            ),
        },
        Attempt {
            name: "bare LF line endings",
            raw: poll(&p2, t2, true).replace("\r\n", "\n"),
        },
        Attempt {
            name: "a body shorter than its Content-Length, then the inner request",
            raw: format!(
                "{}{body2}{inner}",
                outer_head(&format!("content-length: {}\r\n", body2.len() + 10))
            ),
        },
        Attempt {
            name: "HTTP/1.0 keep-alive, then the inner request",
            raw: format!(
                "{}{inner}",
                poll(&p2, t2, false)
                    .replacen("HTTP/1.1", "HTTP/1.0", 1)
                    .replacen("\r\n", "\r\nconnection: keep-alive\r\n", 1)
            ),
        },
        Attempt {
            name: "a NUL byte in a header value",
            raw: format!(
                "{}{inner}",
                poll(&p2, t2, false).replacen("gitlab.example.com", "gitlab\0.example.com", 1)
            ),
        },
    ]
}

/// What one attempt did: the statuses the client read, in order, and what each Pod
/// saw (pod, label, method, body), sorted.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    statuses: Vec<u16>,
    seen: Vec<(u64, String, String, Vec<u8>)>,
}

async fn observe(port: u16, stubs: &[Stub], raw: &[u8], id: &str) -> Observed {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let _ = stream.write_all(raw).await;
    let mut got = Vec::new();
    // Until the proxy closes; a connection it keeps open (waiting for a body that
    // never comes) is cut after 3 s, the same on both paths.
    let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    let statuses = text
        .match_indices("HTTP/1.")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect();
    let mut seen: Vec<_> = stubs
        .iter()
        .flat_map(|s| {
            s.seen()
                .into_iter()
                .filter_map(|r| {
                    let label = r.headers.get("x-fidelity-case")?.clone();
                    let rest = label.strip_prefix(id)?.strip_prefix('-')?.to_owned();
                    Some((s.pod, rest, r.method, r.body))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    seen.sort();
    Observed { statuses, seen }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_attempts_meet_the_same_answers_on_both_paths_and_never_misroute() {
    let (t2, t3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let fast_stubs = three_stubs().await;
    let fast = start_proxy(
        &three_pods(&fast_stubs[0], &fast_stubs[1], &fast_stubs[2], ""),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let slow_stubs = three_stubs().await;
    let slow = start_proxy(
        &three_pods(
            &slow_stubs[0],
            &slow_stubs[1],
            &slow_stubs[2],
            "fast_path = false",
        ),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let mut failures = Vec::new();
    for i in 0..attempts("", "", "").len() {
        let id = format!("smuggle{i}");
        let attempt = attempts(&id, &t2, &t3).swap_remove(i);
        let raw = attempt.raw.into_bytes();
        let (on_fast, on_slow) = tokio::join!(
            observe(fast.port, &fast_stubs, &raw, &id),
            observe(slow.port, &slow_stubs, &raw, &id)
        );
        for (path, observed) in [("fast path", &on_fast), ("pingora only", &on_slow)] {
            for (pod, label, _, _) in &observed.seen {
                if *label != format!("p{pod}") {
                    failures.push(format!(
                        "{}: {path}: MISROUTE: Pod {pod} saw the request labelled {label}",
                        attempt.name
                    ));
                }
            }
        }
        if on_fast != on_slow {
            failures.push(format!(
                "{}: the paths differ:\n  fast path:    {on_fast:?}\n  pingora only: {on_slow:?}",
                attempt.name
            ));
        }
        eprintln!(
            "{}: statuses {:?}, Pods saw {:?}",
            attempt.name,
            on_slow.statuses,
            on_slow
                .seen
                .iter()
                .map(|(p, l, _, _)| format!("{p}:{l}"))
                .collect::<Vec<_>>()
        );
    }
    // The valid attempts did take the fast path (else this compared pingora twice).
    let (_, metrics) = common::admin_get(&fast, "/metrics").await;
    let served = value_or_zero(
        &metrics,
        "podgate_proxy_fast_path_requests_total{result=\"served\"}",
    );
    if served < 3.0 {
        failures.push(format!(
            "the fast path served {served} requests, expected at least 3"
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Read one response with a `Content-Length` body from `stream`: its status.
async fn read_one(stream: &mut TcpStream) -> u16 {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed mid-head");
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:")?.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    head[9..12].parse().unwrap()
}

/// A keep-alive connection whose requests go one at a time: a poll on the fast path,
/// then a chunked one (handed to pingora-proxy, which serves that one request and
/// gives the connection back), then a poll again, on the fast path. Each reaches
/// its token's Pod; nothing is lost at either switch. The worker threads each
/// run their own event loop (the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_moves_from_the_fast_path_to_pingora_between_requests() {
    moves_between_paths("").await;
}

/// The same on one work-stealing runtime (`work_stealing = true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_moves_between_paths_on_a_work_stealing_runtime() {
    moves_between_paths("work_stealing = true").await;
}

/// Three requests on one keep-alive connection to a proxy configured with `extra`:
/// fast path, pingora-proxy, fast path.
async fn moves_between_paths(extra: &str) {
    let (t2, t3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let stubs = three_stubs().await;
    let proxy = start_proxy(
        &three_pods(&stubs[0], &stubs[1], &stubs[2], extra),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let body3 = json_poll(&t3);
    let chunked = format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nhost: gitlab.example.com\r\nx-fidelity-case: switch-2-p3\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body3}\r\n0\r\n\r\n",
        body3.len()
    );
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let mut statuses = Vec::new();
    for request in [
        poll("switch-1-p2", &t2, false),
        chunked,
        poll("switch-3-p2", &t2, false),
    ] {
        stream.write_all(request.as_bytes()).await.unwrap();
        statuses.push(read_one(&mut stream).await);
    }
    assert_eq!(statuses, [200, 200, 200]);
    for (label, pod) in [("switch-1-p2", 2), ("switch-2-p3", 3), ("switch-3-p2", 2)] {
        let seen: Vec<u64> = stubs
            .iter()
            .flat_map(|s| {
                s.seen()
                    .into_iter()
                    .filter(|r| r.headers.get("x-fidelity-case").map(String::as_str) == Some(label))
                    .map(|_| s.pod)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(seen, [pod], "{label}");
    }
    // A request is counted once it has ended, which may come a moment after its
    // client read the response: the proxy is another process, so its counter is
    // read until it shows all three.
    let counts = |metrics: &str| {
        let count = |result: &str| {
            value_or_zero(
                metrics,
                &format!("podgate_proxy_fast_path_requests_total{{result=\"{result}\"}}"),
            )
        };
        (count("served"), count("framing"))
    };
    podgate_registry::testing::eventually(
        Duration::from_secs(10),
        "the fast path's counts: 2 served, 1 handed over for its framing",
        || async {
            let (_, metrics) = common::admin_get(&proxy, "/metrics").await;
            (counts(&metrics) == (2.0, 1.0)).then_some(())
        },
    )
    .await;
}
