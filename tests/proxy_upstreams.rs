//! Upstreams named by host name: resolved off the request path by the proxy's
//! load balancers. A name that resolves works like an address; one that does not
//! costs only its own Pod (a JSON 503 and a log line), never the process.

use crate::common;

use std::time::Duration;

use common::metrics::value;
use common::{Stub, admin_get, proxy_log, send, start_proxy_logged, three_pods, v1};
use podgate_registry::testing::{eventually, free_port};

/// `text` without terminal colour codes (the log is coloured even into a file).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters final-letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn runner_request(pod: u64) -> String {
    format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {}",
        v1(pod)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostname_upstream_works_and_an_unresolvable_one_costs_only_its_pod() {
    let (legacy, pod2) = (Stub::start(1).await, Stub::start(2).await);
    let config = common::topology(&[
        common::pod_entry(1, &[legacy.addr.to_string()], ""),
        common::pod_entry(2, &[format!("localhost:{}", pod2.addr.port())], ""),
        common::pod_entry(3, &["no-such-host.invalid:80".into()], ""),
    ]);
    let mut proxy = start_proxy_logged(&config, tempfile::tempdir().unwrap()).await;

    // A host name resolves (to the stub on 127.0.0.1).
    let (status, _, body) = send(proxy.port, &runner_request(2), b"{}").await;
    assert_eq!((status, body.as_str()), (200, r#"{"pod":2}"#));

    // A name that does not resolve: a JSON 503 for its Pod, nothing forwarded.
    let (status, headers, body) = send(proxy.port, &runner_request(3), b"{}").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(headers.get("retry-after").map(String::as_str), Some("5"));
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = json["message"].as_str().unwrap();
    assert!(message.contains("unresolved_upstream"), "{message}");

    // The other Pods are unaffected, and the process still serves.
    let (status, _, body) = send(proxy.port, "GET /api/v4/version HTTP/1.1", b"").await;
    assert_eq!((status, body.as_str()), (200, r#"{"pod":1}"#));
    for _ in 0..3 {
        let (status, _, _) = send(proxy.port, &runner_request(3), b"{}").await;
        assert_eq!(status, 503);
        let (status, _, body) = send(proxy.port, &runner_request(2), b"{}").await;
        assert_eq!((status, body.as_str()), (200, r#"{"pod":2}"#));
    }
    assert_eq!(pod2.seen().len(), 4);
    assert_eq!(legacy.seen().len(), 1);
    assert!(
        proxy.child.try_wait().unwrap().is_none(),
        "the proxy exited"
    );

    // The log says which upstream of which Pod, and why; nothing panicked.
    let log = eventually(
        Duration::from_secs(10),
        "the resolution warning",
        || async {
            let log = plain(&proxy_log(&proxy));
            log.contains("does not resolve").then_some(log)
        },
    )
    .await;
    let line = log
        .lines()
        .find(|l| l.contains("does not resolve"))
        .unwrap();
    assert!(line.contains("no-such-host.invalid:80"), "{line}");
    assert!(line.contains("pod=3"), "{line}");
    assert!(!log.contains("panicked"), "{log}");

    // The health gauge tells the two apart.
    let (_, text) = admin_get(&proxy, "/metrics").await;
    assert_eq!(
        value(
            &text,
            r#"podgate_proxy_upstream_healthy{pod="3",pool="web",upstream="no-such-host.invalid:80"}"#
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            &format!(
                r#"podgate_proxy_upstream_healthy{{pod="2",pool="web",upstream="localhost:{}"}}"#,
                pod2.addr.port()
            )
        ),
        Some(1.0),
        "{text}"
    );
}

/// A host name whose address refuses connections, beside a live one: every request
/// is answered by the same Pod, the dead address costing a retry at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_hostname_upstream_fails_over_within_its_pod() {
    let (legacy, alive) = (Stub::start(1).await, Stub::start(5).await);
    let dead = free_port();
    let config = format!(
        r#"[health]
        enabled = false
        {}"#,
        common::topology(&[
            common::pod_entry(1, &[legacy.addr.to_string()], ""),
            common::pod_entry(
                5,
                &[
                    format!("localhost:{dead}"),
                    format!("localhost:{}", alive.addr.port()),
                ],
                "",
            ),
        ])
    );
    let proxy = start_proxy_logged(&config, tempfile::tempdir().unwrap()).await;
    for i in 0..6 {
        let (status, _, body) = send(proxy.port, &runner_request(5), b"{}").await;
        assert_eq!(
            (status, body.as_str()),
            (200, r#"{"pod":5}"#),
            "request {i}"
        );
    }
    assert_eq!(alive.seen().len(), 6);
    assert!(legacy.seen().is_empty());
    let (_, text) = admin_get(&proxy, "/metrics").await;
    let failures = value(
        &text,
        r#"podgate_proxy_upstream_connect_failures_total{pod="5"}"#,
    )
    .unwrap_or(0.0);
    assert!(
        (1.0..=6.0).contains(&failures),
        "round robin tries the dead address for some requests: {failures}"
    );
}

/// `[upstreams] max_connections_per_address`: with one request in flight to Pod 2's
/// only address (a long poll the Pod holds), the next waits in the proxy — on
/// pingora's path (HTTP/1.0) as on the fast path — and reaches the Pod only once
/// the first is answered; past `queue_timeout_ms` one is answered 503 with
/// `Retry-After`, having never reached the Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_connection_bound_wait_for_one_to_finish() {
    let (legacy, pod2, pod3) = (
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    );
    for (queue_timeout_ms, http10) in [(60_000, true), (300, false)] {
        let config = three_pods(
            &legacy,
            &pod2,
            &pod3,
            &format!(
                "[upstreams]\nmax_connections_per_address = 1\nqueue_timeout_ms = {queue_timeout_ms}"
            ),
        );
        let proxy = start_proxy_logged(&config, tempfile::tempdir().unwrap()).await;
        let port = proxy.port;
        let before = pod2.seen().len();
        let held = tokio::spawn(async move {
            send(
                port,
                &format!("{}\r\nx-test-long-poll: 60", runner_request(2)),
                b"{}",
            )
            .await
        });
        eventually(
            Duration::from_secs(10),
            "Pod 2 to hold the poll",
            || async { (pod2.seen().len() > before).then_some(()) },
        )
        .await;
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let second = tokio::spawn(async move {
            send(
                port,
                &format!("POST /api/v4/runners/verify {version}\r\ncontent-type: application/json"),
                format!(r#"{{"token":"{}"}}"#, v1(2)).as_bytes(),
            )
            .await
        });
        if http10 {
            eventually(Duration::from_secs(10), "the second to queue", || async {
                let (_, text) = admin_get(&proxy, "/metrics").await;
                (value(&text, "podgate_proxy_upstream_queue{pod=\"2\"}") == Some(1.0)).then_some(())
            })
            .await;
            assert_eq!(
                pod2.seen().len(),
                before + 1,
                "the second reached the Pod past the bound"
            );
            pod2.queue_job();
            assert_eq!(held.await.unwrap().0, 201);
            let (status, _, body) = second.await.unwrap();
            assert_eq!((status, body.as_str()), (200, r#"{"pod":2}"#));
            assert_eq!(pod2.seen().len(), before + 2);
            let (_, text) = admin_get(&proxy, "/metrics").await;
            assert_eq!(
                value(
                    &text,
                    "podgate_proxy_upstream_queued_total{pod=\"2\",result=\"admitted\"}"
                ),
                Some(1.0),
                "{text}"
            );
            // Released once each request has ended, which may come a moment after its
            // client read the response.
            eventually(Duration::from_secs(10), "no connection in use", || async {
                let (_, text) = admin_get(&proxy, "/metrics").await;
                (value(&text, "podgate_proxy_upstream_in_use{pod=\"2\"}") == Some(0.0))
                    .then_some(())
            })
            .await;
        } else {
            let (status, headers, body) = second.await.unwrap();
            assert_eq!(status, 503, "{body}");
            assert!(headers.contains_key("retry-after"), "{headers:?}");
            assert_eq!(
                pod2.seen().len(),
                before + 1,
                "the refused one reached the Pod"
            );
            let (_, text) = admin_get(&proxy, "/metrics").await;
            assert_eq!(
                value(
                    &text,
                    "podgate_proxy_upstream_queued_total{pod=\"2\",result=\"timed_out\"}"
                ),
                Some(1.0),
                "{text}"
            );
            assert_eq!(
                value(&text, "podgate_proxy_upstream_in_use{pod=\"2\"}"),
                Some(1.0),
                "the held poll"
            );
            let log = plain(&proxy_log(&proxy));
            assert!(
                log.contains("none finished within 300 ms"),
                "the log names the bound:\n{log}"
            );
            pod2.queue_job();
            assert_eq!(held.await.unwrap().0, 201);
        }
    }
}
