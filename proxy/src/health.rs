//! Active health checks of every upstream in the topology.
//!
//! Each round probes every web upstream with `GET <path>` (a 2xx or 3xx passes) and
//! every kas upstream with a TCP connect (kas speaks gRPC, not plain HTTP). An
//! upstream turns unhealthy after `fall` consecutive failures and healthy again after
//! `rise` consecutive passes; one never checked yet counts as healthy, so a new
//! upstream takes traffic at once and connect failures still fail over (see
//! `service`). The table is read lock-free on every request.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use podgate_registry::Registry;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::metrics::METRICS;
use crate::rules::Pool;

fn default_true() -> bool {
    true
}
fn default_path() -> String {
    "/-/readiness".into()
}
fn default_interval() -> u64 {
    2000
}
fn default_timeout() -> u64 {
    1000
}
fn default_rise() -> u32 {
    2
}
fn default_fall() -> u32 {
    3
}

/// `[health]` in `proxy.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Run active checks (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Path probed on web upstreams (GitLab: `/-/readiness`).
    #[serde(default = "default_path")]
    pub path: String,
    /// Milliseconds between rounds.
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Milliseconds a probe may take.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Consecutive passes that make an unhealthy upstream healthy.
    #[serde(default = "default_rise")]
    pub rise: u32,
    /// Consecutive failures that make a healthy upstream unhealthy.
    #[serde(default = "default_fall")]
    pub fall: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            path: default_path(),
            interval_ms: default_interval(),
            timeout_ms: default_timeout(),
            rise: default_rise(),
            fall: default_fall(),
        }
    }
}

impl HealthConfig {
    /// Problems, each naming its field under `health.`.
    pub fn problems(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if !self.path.starts_with('/') || self.path.contains(char::is_whitespace) {
            bad.push(format!(
                "health.path = {:?}: an absolute path without spaces",
                self.path
            ));
        }
        if self.interval_ms < 100 {
            bad.push("health.interval_ms: at least 100".into());
        }
        if self.timeout_ms == 0 || self.timeout_ms > self.interval_ms.max(100) {
            bad.push("health.timeout_ms: positive and at most interval_ms".into());
        }
        if self.rise == 0 {
            bad.push("health.rise: at least 1".into());
        }
        if self.fall == 0 {
            bad.push("health.fall: at least 1".into());
        }
        bad
    }
}

/// Which upstreams are unhealthy. Cheap to read on every request.
#[derive(Debug, Default)]
pub struct Health {
    down: ArcSwap<HashSet<String>>,
}

impl Health {
    /// Whether `upstream` may take traffic (true unless checks say otherwise).
    pub fn is_healthy(&self, upstream: &str) -> bool {
        let down = self.down.load();
        down.is_empty() || !down.contains(upstream)
    }

    /// Whether any upstream of `pool` may take traffic.
    pub fn any_healthy(&self, pool: &[String]) -> bool {
        pool.iter().any(|u| self.is_healthy(u))
    }
}

#[derive(Debug)]
struct Streak {
    healthy: bool,
    passes: u32,
    failures: u32,
}

/// Check forever (until the runtime stops), publishing into `health`.
pub async fn run(health: Arc<Health>, registry: Registry, config: HealthConfig) {
    let mut streaks: HashMap<(String, Pool), Streak> = HashMap::new();
    let mut labels: HashSet<(String, &'static str, String)> = HashSet::new();
    let timeout = Duration::from_millis(config.timeout_ms);
    let path: Arc<str> = config.path.as_str().into();
    let mut tick = tokio::time::interval(Duration::from_millis(config.interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let topology = registry.topology();
        let mut probes = JoinSet::new();
        let mut current = HashSet::new();
        for pod in topology.pods.values() {
            for (pool, list) in [(Pool::Web, &pod.web), (Pool::Kas, &pod.kas)] {
                for upstream in list {
                    let pod_id = pod.id.to_string();
                    current.insert((pod_id.clone(), pool_name(pool), upstream.clone()));
                    let (upstream, path) = (upstream.clone(), path.clone());
                    probes.spawn(async move {
                        let ok = probe(&upstream, pool, &path, timeout).await;
                        (pod_id, pool, upstream, ok)
                    });
                }
            }
        }
        let mut results = Vec::new();
        while let Some(Ok(r)) = probes.join_next().await {
            results.push(r);
        }
        let mut down = HashSet::new();
        let mut seen = HashSet::new();
        for (pod, pool, upstream, ok) in results {
            let s = streaks.entry((upstream.clone(), pool)).or_insert(Streak {
                healthy: true,
                passes: 0,
                failures: 0,
            });
            seen.insert((upstream.clone(), pool));
            if ok {
                s.passes += 1;
                s.failures = 0;
                if !s.healthy && s.passes >= config.rise {
                    s.healthy = true;
                    tracing::warn!(pod, upstream, "upstream healthy again");
                }
            } else {
                METRICS
                    .health_failures
                    .with_label_values(&[pod.as_str(), upstream.as_str()])
                    .inc();
                s.failures += 1;
                s.passes = 0;
                if s.healthy && s.failures >= config.fall {
                    s.healthy = false;
                    tracing::warn!(pod, upstream, path = %path, "upstream unhealthy");
                }
            }
            if !s.healthy {
                down.insert(upstream.clone());
            }
            METRICS
                .upstream_healthy
                .with_label_values(&[pod.as_str(), pool_name(pool), upstream.as_str()])
                .set(i64::from(s.healthy));
        }
        streaks.retain(|k, _| seen.contains(k));
        for gone in labels.difference(&current) {
            let _ = METRICS.upstream_healthy.remove_label_values(&[
                gone.0.as_str(),
                gone.1,
                gone.2.as_str(),
            ]);
        }
        labels = current;
        health.down.store(Arc::new(down));
    }
}

fn pool_name(pool: Pool) -> &'static str {
    match pool {
        Pool::Web => "web",
        Pool::Kas => "kas",
    }
}

/// One probe: TCP connect for kas; `GET path` answered 2xx/3xx for web.
async fn probe(upstream: &str, pool: Pool, path: &str, timeout: Duration) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(upstream).await?;
        if pool == Pool::Kas {
            return Ok::<bool, std::io::Error>(true);
        }
        let req = format!(
            "GET {path} HTTP/1.1\r\nhost: {upstream}\r\nuser-agent: podgate-health-check\r\nconnection: close\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).await?;
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let r = stream.read(&mut buf[n..]).await?;
            if r == 0 {
                break;
            }
            n += r;
        }
        Ok(status_ok(&buf[..n]))
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Ok(true)))
}

/// `HTTP/1.x 2xx` or `3xx`.
fn status_ok(head: &[u8]) -> bool {
    head.len() >= 12
        && head.starts_with(b"HTTP/1.")
        && head[8] == b' '
        && matches!(head[9], b'2' | b'3')
        && head[10].is_ascii_digit()
        && head[11].is_ascii_digit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert!(status_ok(b"HTTP/1.1 200 OK\r\n"));
        assert!(status_ok(b"HTTP/1.0 302 Found"));
        assert!(!status_ok(b"HTTP/1.1 503 Service Unavailable"));
        assert!(!status_ok(b"HTTP/1.1 404 x"));
        assert!(!status_ok(b"HTTP/1.1 2"));
        assert!(!status_ok(b"SSH-2.0-OpenSSH"));
    }

    #[test]
    fn unknown_upstreams_are_healthy_until_checked() {
        let h = Health::default();
        assert!(h.is_healthy("10.0.0.1:80"));
        h.down
            .store(Arc::new(HashSet::from(["10.0.0.1:80".to_owned()])));
        assert!(!h.is_healthy("10.0.0.1:80"));
        assert!(h.any_healthy(&["10.0.0.1:80".into(), "10.0.0.2:80".into()]));
        assert!(!h.any_healthy(&["10.0.0.1:80".into()]));
    }

    #[test]
    fn config_problems_name_fields() {
        let c = HealthConfig {
            path: "health".into(),
            interval_ms: 10,
            timeout_ms: 0,
            rise: 0,
            fall: 0,
            enabled: true,
        };
        let p = c.problems().join("\n");
        for f in [
            "health.path",
            "health.interval_ms",
            "health.timeout_ms",
            "health.rise",
            "health.fall",
        ] {
            assert!(p.contains(f), "{f}: {p}");
        }
        assert!(HealthConfig::default().problems().is_empty());
    }
}
