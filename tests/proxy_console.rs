//! The web console on the proxy's admin listener (`[console] enabled`), with the
//! real binary: its page and files (with a content security policy), 404s for
//! anything else, nothing at all when disabled, and its server-sent events, which
//! carry the proxy's own metrics and each source's scrape, and say when a source
//! stops answering. (`tests/console` drives the page in a browser.)

use crate::common;

use std::time::Duration;

use common::{Stub, admin_get, send, start_proxy, three_pods};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A `/metrics` endpoint answering `text` to every request; stops when aborted.
async fn metrics_source(text: &'static str) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                            text.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    (addr, task)
}

/// The event stream, read as it comes: each `data:` line's JSON.
struct Events {
    conn: TcpStream,
    buf: Vec<u8>,
}

impl Events {
    async fn open(admin: u16) -> (Events, String) {
        let mut conn = TcpStream::connect(("127.0.0.1", admin)).await.unwrap();
        conn.write_all(
            b"GET /console/events HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n\r\n",
        )
        .await
        .unwrap();
        let mut events = Events {
            conn,
            buf: Vec::new(),
        };
        let head = loop {
            if let Some(end) = events.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&events.buf[..end]).into_owned();
                events.buf.drain(..end + 4);
                break head;
            }
            events.read().await;
        };
        (events, head)
    }

    async fn read(&mut self) {
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout(Duration::from_secs(20), self.conn.read(&mut chunk))
            .await
            .expect("an event within 20 s")
            .unwrap();
        assert!(n > 0, "the event stream ended");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// The next event (each is written as one chunk: `data: {…}\n\n`).
    async fn next(&mut self) -> Value {
        loop {
            let text = String::from_utf8_lossy(&self.buf).into_owned();
            if let Some(start) = text.find("data: ")
                && let Some(len) = text[start..].find("\n\n")
            {
                let json = text[start + 6..start + len].to_owned();
                let consumed = text[..start + len + 2].len();
                self.buf.drain(..consumed);
                return serde_json::from_str(&json).unwrap();
            }
            self.read().await;
        }
    }
}

fn source<'a>(event: &'a Value, name: &str) -> &'a Value {
    event["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no source {name}: {event}"))
}

/// The sum of a source's samples of `metric` whose labels include `labels`.
fn total(source: &Value, metric: &str, labels: &[(&str, &str)]) -> f64 {
    source["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s[0] == metric && labels.iter().all(|(k, v)| s[1][*k] == *v))
        .map(|s| s[2].as_f64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_the_console_and_its_events() {
    let (legacy, pod2, pod3) = (
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    );
    let (src, src_task) =
        metrics_source("# TYPE podsim_requests_total counter\npodsim_requests_total{endpoint=\"jobs_request\",pod=\"2\",status=\"201\"} 5\nh_bucket{le=\"1\"} 1\n")
            .await;
    let console = format!(
        "[console]\nenabled = true\ninterval_ms = 200\n[[console.sources]]\nname = \"pod-2\"\nurl = \"http://{src}/metrics\"\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(&three_pods(&legacy, &pod2, &pod3, &console), dir).await;

    // The page and its files.
    let (status, headers, _) = send(proxy.admin, "GET /console HTTP/1.1", b"").await;
    assert_eq!((status, headers["location"].as_str()), (301, "/console/"));
    let (status, headers, body) = send(proxy.admin, "GET /console/ HTTP/1.1", b"").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(headers["content-security-policy"].contains("default-src 'self'"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    for file in ["console.js", "graph.js", "console.css"] {
        assert!(body.contains(file), "the page loads {file}");
        let (status, headers, body) =
            send(proxy.admin, &format!("GET /console/{file} HTTP/1.1"), b"").await;
        assert_eq!(status, 200, "{file}");
        assert!(
            headers["content-type"].starts_with(if file.ends_with(".js") {
                "text/javascript"
            } else {
                "text/css"
            }),
            "{file}: {headers:?}"
        );
        assert!(body.len() > 500, "{file}");
    }
    assert_eq!(admin_get(&proxy, "/console/secrets.txt").await.0, 404);
    assert_eq!(admin_get(&proxy, "/metrics").await.0, 200);

    // A runner request to Pod 2 through the proxy, so the proxy's own counters
    // have a `pod="2"` series.
    let token = common::gitlab_token("glrt-", 2);
    let (status, _, _) = send(
        proxy.port,
        "POST /api/v4/runners/verify HTTP/1.1\r\ncontent-type: application/json",
        format!("{{\"token\":\"{token}\"}}").as_bytes(),
    )
    .await;
    assert_eq!(status, 200);

    let (mut events, head) = Events::open(proxy.admin).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_lowercase()
            .contains("content-type: text/event-stream"),
        "{head}"
    );
    let first = events.next().await;
    let proxy_src = source(&first, "proxy");
    assert_eq!(proxy_src["up"], true);
    assert_eq!(
        total(proxy_src, "podgate_proxy_requests_total", &[("pod", "2")]),
        1.0,
        "{proxy_src}"
    );
    // Buckets are left out, of the proxy's histograms as of the sources'.
    assert!(
        !proxy_src["samples"].to_string().contains("_bucket"),
        "{proxy_src}"
    );
    let pod = source(&first, "pod-2");
    assert_eq!(pod["up"], true, "{pod}");
    assert_eq!(
        total(
            pod,
            "podsim_requests_total",
            &[("pod", "2"), ("endpoint", "jobs_request")]
        ),
        5.0
    );
    assert!(!pod["samples"].to_string().contains("h_bucket"));
    // Events keep coming, each a new instant.
    let second = events.next().await;
    assert!(second["t"].as_u64().unwrap() > first["t"].as_u64().unwrap());

    // The source goes away: a later event says so, and the proxy's own still come.
    src_task.abort();
    let _ = src_task.await;
    let down = loop {
        let e = events.next().await;
        if source(&e, "pod-2")["up"] == false {
            break e;
        }
    };
    assert!(
        source(&down, "pod-2")["error"].as_str().unwrap().len() > 3,
        "{down}"
    );
    assert_eq!(source(&down, "proxy")["up"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_console_enabled_there_is_no_console() {
    let (legacy, pod2, pod3) = (
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(&three_pods(&legacy, &pod2, &pod3, ""), dir).await;
    for path in ["/console/", "/console/events", "/console/console.js"] {
        assert_eq!(admin_get(&proxy, path).await.0, 404, "{path}");
    }
}
