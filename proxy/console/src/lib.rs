//! The web console: one page on the admin listener (`/console/`), its assets
//! compiled into the binary, fed by a server-sent event stream
//! (`/console/events`) derived from `/metrics`: the proxy's own, and those of the
//! processes listed in `[console] sources` (Pods, kas, agentk), scraped as
//! Prometheus scrapes them. The page computes rates from successive events. Its
//! cluster graph is the Graph API's `/graph` WebSocket, opened by the browser
//! itself through the proxy to kas with the `_gitlab_kas` session cookie, as
//! GitLab's own frontend does; the page is told where (and with which session)
//! in its URL's fragment, which never reaches a server.
//!
//! ```toml
//! [console]
//! enabled = true                   # default false: /console/ is 404
//! interval_ms = 1000               # scrape and event interval
//! [[console.sources]]
//! name = "pod-1"
//! url = "http://10.0.0.1:8080/metrics"
//! [[console.sources]]
//! name = "kas"
//! url = "http://10.0.0.5:8151/metrics"
//! bearer_token_file = "/etc/podgate/kas-metrics-token"
//! labels = { pod = "1" }           # added to each sample (a Prometheus target's labels)
//! ```
//!
//! Sources are scraped only while a page is open. What they expose (kas's metrics
//! included, whose listener wants a token) the console shows to whoever reaches
//! the admin listener: keep it on a private address, as `/metrics` already is.
//!
//! Layout: `config` ([`ConsoleConfig`]), [`exposition`] (the text format),
//! [`scrape`] (one scrape), this file (the scrape loop, the event payload),
//! `assets/` (the page). The proxy's admin listener mounts it (`podgate-proxy`,
//! `admin.rs`).

mod config;
pub mod exposition;
pub mod scrape;

pub use config::{ConsoleConfig, SourceConfig};

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::Serialize;
use tokio::sync::watch;

use self::exposition::Sample;
use self::scrape::Scraper;

/// One source in an event.
#[derive(Debug, Serialize)]
struct SourceSnapshot {
    name: String,
    /// Whether this scrape succeeded.
    up: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// `[name, {labels}, value]` per sample.
    samples: Vec<(String, serde_json::Map<String, serde_json::Value>, f64)>,
}

/// The event: every source at one instant.
#[derive(Debug, Serialize)]
struct Snapshot {
    /// Unix milliseconds when the scrapes started.
    t: u128,
    interval_ms: u64,
    sources: Vec<SourceSnapshot>,
}

impl SourceSnapshot {
    fn new(name: &str, result: Result<Vec<Sample>, String>) -> Self {
        match result {
            Ok(samples) => SourceSnapshot {
                name: name.to_owned(),
                up: true,
                error: None,
                samples: as_json(samples),
            },
            Err(e) => SourceSnapshot {
                name: name.to_owned(),
                up: false,
                error: Some(e),
                samples: Vec::new(),
            },
        }
    }
}

fn as_json(samples: Vec<Sample>) -> Vec<(String, serde_json::Map<String, serde_json::Value>, f64)> {
    samples
        .into_iter()
        .map(|s| {
            let labels = s
                .labels
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect();
            (s.name, labels, s.value)
        })
        .collect()
}

/// Where the admin listener gets events: the latest one (JSON), replaced at each
/// interval while anyone listens.
#[derive(Clone)]
pub struct ConsoleHandle {
    latest: Arc<watch::Sender<Option<Arc<str>>>>,
}

impl ConsoleHandle {
    /// A listener: its first [`watch::Receiver::changed`] returns with the next
    /// event (the latest one, if any, is already marked seen: read it with
    /// [`ConsoleHandle::current`]).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.latest.subscribe()
    }

    /// The latest event, if one was made.
    pub fn current(&self) -> Option<Arc<str>> {
        self.latest.borrow().clone()
    }
}

/// The scrape loop, a pingora background service.
pub struct Console {
    config: ConsoleConfig,
    latest: Arc<watch::Sender<Option<Arc<str>>>>,
    local: Box<dyn Fn() -> String + Send + Sync>,
    scraper: Scraper,
}

impl Console {
    /// The loop for `config`, with `local` rendering the proxy's own metrics; and
    /// the handle the admin listener serves events from.
    pub fn new(
        config: ConsoleConfig,
        local: Box<dyn Fn() -> String + Send + Sync>,
    ) -> (Console, ConsoleHandle) {
        let latest = Arc::new(watch::Sender::new(None));
        (
            Console {
                config,
                latest: latest.clone(),
                local,
                scraper: Scraper::default(),
            },
            ConsoleHandle { latest },
        )
    }

    /// Scrape every source at once (each within the interval, at least 1 s).
    async fn snapshot(&self) -> Snapshot {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let deadline = Duration::from_millis(self.config.interval_ms.max(1000));
        let scrapes = self.config.sources.iter().map(|s| async move {
            let result = match s.url.parse::<http::Uri>() {
                Ok(u) => self
                    .scraper
                    .scrape(&u, s.bearer_token_file.as_deref(), deadline)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let labelled = result.map(|mut samples| {
                for sample in &mut samples {
                    for (k, v) in &s.labels {
                        sample.labels.retain(|(name, _)| name != k);
                        sample.labels.push((k.clone(), v.clone()));
                    }
                }
                samples
            });
            SourceSnapshot::new(&s.name, labelled)
        });
        let mut sources = vec![SourceSnapshot::new(
            "proxy",
            exposition::parse(&(self.local)(), scrape::keep).map_err(|e| e.to_string()),
        )];
        sources.extend(futures_util::future::join_all(scrapes).await);
        Snapshot {
            t,
            interval_ms: self.config.interval_ms,
            sources,
        }
    }

    /// One scrape if anyone listens; logs sources that went down or came back.
    async fn step(&self, was_up: &mut Vec<bool>) {
        if self.latest.receiver_count() == 0 {
            return;
        }
        let snap = self.snapshot().await;
        was_up.resize(snap.sources.len(), true);
        for (s, was) in snap.sources.iter().zip(was_up.iter_mut()) {
            if s.up != *was {
                match &s.error {
                    None => tracing::info!(source = %s.name, "console: scraping again"),
                    Some(e) => {
                        tracing::warn!(source = %s.name, error = %e, "console: scrape failed")
                    }
                }
                *was = s.up;
            }
        }
        // Serialising numbers and strings cannot fail.
        let json = serde_json::to_string(&snap).unwrap_or_default();
        self.latest.send_replace(Some(Arc::from(json)));
    }
}

#[async_trait]
impl BackgroundService for Console {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.config.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_up = Vec::new();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.step(&mut was_up).await,
            }
        }
    }
}

/// A file of the page: (content type, bytes), for a path under `/console/`.
pub fn asset(path: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match path {
        "" | "index.html" => (
            "text/html; charset=utf-8",
            include_bytes!("../assets/index.html").as_slice(),
        ),
        "console.js" => (
            "text/javascript; charset=utf-8",
            include_bytes!("../assets/console.js").as_slice(),
        ),
        "graph.js" => (
            "text/javascript; charset=utf-8",
            include_bytes!("../assets/graph.js").as_slice(),
        ),
        "console.css" => (
            "text/css; charset=utf-8",
            include_bytes!("../assets/console.css").as_slice(),
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> String {
        "# TYPE a counter\na_total{pod=\"1\"} 3\nh_bucket{le=\"1\"} 1\nh_count 1\n".into()
    }

    #[tokio::test]
    async fn an_event_holds_every_source_and_says_which_failed() {
        // A source that answers, one that refuses the connection, one that is
        // not the text format.
        let good = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bad = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (good_addr, bad_addr) = (good.local_addr().unwrap(), bad.local_addr().unwrap());
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        for (l, body) in [(good, "b{x=\"y\"} 2\n"), (bad, "not metrics\n")] {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                loop {
                    let (mut s, _) = l.accept().await.unwrap();
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).await.unwrap();
                    let head = String::from_utf8_lossy(&buf[..n]).to_lowercase();
                    let body = if head.contains("authorization: bearer sekrit") {
                        body.to_owned()
                    } else {
                        format!("{body}unauthenticated 1\n")
                    };
                    let _ = s
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                }
            });
        }
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "sekrit\n").unwrap();
        let config = ConsoleConfig {
            enabled: true,
            interval_ms: 1000,
            sources: vec![
                SourceConfig {
                    name: "good".into(),
                    url: format!("http://{good_addr}/metrics"),
                    bearer_token_file: Some(token),
                    labels: [
                        ("pod".to_owned(), "2".to_owned()),
                        ("x".to_owned(), "z".to_owned()),
                    ]
                    .into(),
                },
                SourceConfig {
                    name: "closed".into(),
                    url: format!("http://{closed}/metrics"),
                    bearer_token_file: None,
                    labels: Default::default(),
                },
                SourceConfig {
                    name: "bad".into(),
                    url: format!("http://{bad_addr}/metrics"),
                    bearer_token_file: None,
                    labels: Default::default(),
                },
            ],
        };
        let (console, handle) = Console::new(config, Box::new(local));
        // Nobody listens: no scrape.
        console.step(&mut Vec::new()).await;
        assert!(handle.current().is_none());
        let _rx = handle.subscribe();
        console.step(&mut Vec::new()).await;
        let v: serde_json::Value = serde_json::from_str(&handle.current().unwrap()).unwrap();
        let sources = v["sources"].as_array().unwrap();
        let names: Vec<&str> = sources
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["proxy", "good", "closed", "bad"]);
        // The proxy's own: buckets left out.
        assert_eq!(
            sources[0]["samples"],
            serde_json::json!([["a_total", {"pod": "1"}, 3.0], ["h_count", {}, 1.0]])
        );
        // The token was sent (no `unauthenticated` sample).
        assert_eq!(sources[1]["up"], true);
        assert_eq!(
            sources[1]["samples"],
            // The source's labels added, replacing the scraped `x`.
            serde_json::json!([["b", {"pod": "2", "x": "z"}, 2.0]])
        );
        assert_eq!(sources[2]["up"], false);
        assert!(sources[2]["error"].as_str().unwrap().len() > 3);
        assert_eq!(sources[3]["up"], false);
        assert!(
            sources[3]["error"].as_str().unwrap().contains("line 1"),
            "{}",
            sources[3]
        );
    }
}
