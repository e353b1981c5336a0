//! Active health checks: `[health]` in `proxy.toml`, and the pingora checks built
//! from it.
//!
//! Web upstreams get pingora's `HttpHealthCheck`: `GET <path>` (GitLab:
//! `/-/readiness`) answered 2xx or 3xx passes. kas upstreams get its `TcpHealthCheck`
//! (kas speaks gRPC, not plain HTTP): a connection accepted passes. An address turns
//! unhealthy after `fall` consecutive failures and healthy again after `rise`
//! consecutive passes; one never checked yet counts as healthy, so a new upstream
//! takes traffic at once and connect failures still fail over (see `service`).
//!
//! Each pool's checks run once per address, however many Pods list it, in one
//! pingora `HealthCheckService` (a background service; see [`crate::upstreams`]).
//! [`Observed`] wraps a check to count failures and report flips to an
//! [`Observer`], which keeps `podgate_proxy_upstream_healthy` and
//! `podgate_proxy_health_check_failures_total`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::lb::Backend;
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck, TcpHealthCheck};
use pingora::{Error, ErrorType};
use serde::Deserialize;

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

/// The `user-agent` of web checks, so an upstream can tell them from traffic.
pub const USER_AGENT: &str = "podgate-health-check";

/// The `host` of web checks. One check serves every Pod listing an address, so it
/// names no Pod; GitLab's `/-/readiness` does not look at it (its access is by
/// client IP, `monitoring.ip_whitelist`).
pub const HOST: &str = "localhost";

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
    /// Milliseconds from the end of one round of checks to the start of the next.
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Milliseconds one check may take (connect, send, answer).
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

    /// Time between rounds.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    /// Time one check may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// The pingora check for `pool`: HTTP for web, TCP for kas's listeners, with
    /// `rise`/`fall` and the timeout applied.
    pub fn check_for(&self, pool: Pool) -> Box<dyn HealthCheck + Send + Sync> {
        let timeout = Some(self.timeout());
        let (rise, fall) = (self.rise as usize, self.fall as usize);
        match pool {
            Pool::Web => {
                let mut hc = HttpHealthCheck::new(HOST, false);
                hc.consecutive_success = rise;
                hc.consecutive_failure = fall;
                hc.peer_template.options.connection_timeout = timeout;
                hc.peer_template.options.read_timeout = timeout;
                hc.peer_template.options.write_timeout = timeout;
                hc.req = readiness_request(&self.path);
                hc.validator = Some(Box::new(status_ok));
                Box::new(hc)
            }
            Pool::Kas | Pool::KasK8sProxy | Pool::KasWorkspaces => {
                let mut hc = TcpHealthCheck::new();
                hc.consecutive_success = rise;
                hc.consecutive_failure = fall;
                hc.peer_template.options.connection_timeout = timeout;
                hc
            }
        }
    }
}

/// `GET path` with our `host` and `user-agent`.
fn readiness_request(path: &str) -> RequestHeader {
    // The path was validated (absolute, no spaces); a path `http` still refuses
    // falls back to `/`, which every web upstream answers somehow.
    let mut req = RequestHeader::build("GET", path.as_bytes(), None)
        .or_else(|_| RequestHeader::build("GET", b"/", None))
        .expect("GET / is a valid request");
    for (name, value) in [("host", HOST), ("user-agent", USER_AGENT)] {
        req.insert_header(name, value)
            .expect("static header values are valid");
    }
    req
}

/// A 2xx or 3xx answer passes (GitLab's readiness answers 200; a redirect still
/// shows a live Workhorse).
fn status_ok(resp: &ResponseHeader) -> pingora::Result<()> {
    if resp.status.is_success() || resp.status.is_redirection() {
        Ok(())
    } else {
        Error::e_explain(
            ErrorType::CustomCode("health check status", resp.status.as_u16()),
            format!("{} answered to the health check", resp.status),
        )
    }
}

/// Told about every failed check and every flip, to keep metrics and log lines.
pub trait Observer: Send + Sync {
    /// A check of `addr` (in `pool`) failed.
    fn failed(&self, pool: Pool, addr: SocketAddr, error: &Error);
    /// `addr` (in `pool`) turned healthy or unhealthy.
    fn flipped(&self, pool: Pool, addr: SocketAddr, healthy: bool);
}

/// A pingora check with a hard deadline, reporting to an [`Observer`].
pub struct Observed {
    inner: Box<dyn HealthCheck + Send + Sync>,
    pool: Pool,
    timeout: Duration,
    observer: Arc<dyn Observer>,
}

impl Observed {
    /// Wrap `inner`, the check of `pool`'s addresses; each check ends after `timeout`.
    pub fn new(
        inner: Box<dyn HealthCheck + Send + Sync>,
        pool: Pool,
        timeout: Duration,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Observed {
            inner,
            pool,
            timeout,
            observer,
        }
    }
}

#[async_trait]
impl HealthCheck for Observed {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let result = match tokio::time::timeout(self.timeout, self.inner.check(target)).await {
            Ok(r) => r,
            Err(_) => Error::e_explain(
                ErrorType::ConnectTimedout,
                format!("health check took more than {:?}", self.timeout),
            ),
        };
        if let (Err(e), Some(addr)) = (&result, target.addr.as_inet()) {
            self.observer.failed(self.pool, *addr, e);
        }
        result
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        if let Some(addr) = target.addr.as_inet() {
            self.observer.flipped(self.pool, *addr, healthy);
        }
    }

    fn backend_summary(&self, target: &Backend) -> String {
        format!("{} upstream {}", pool_name(self.pool), target.addr)
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.inner.health_threshold(success)
    }
}

/// `web`, `kas`, `kas_k8s_proxy` or `kas_workspaces`: the `pool` metric label.
pub fn pool_name(pool: Pool) -> &'static str {
    match pool {
        Pool::Web => "web",
        Pool::Kas => "kas",
        Pool::KasK8sProxy => "kas_k8s_proxy",
        Pool::KasWorkspaces => "kas_workspaces",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_and_three_hundreds_pass() {
        for (code, ok) in [
            (200, true),
            (204, true),
            (302, true),
            (404, false),
            (500, false),
            (503, false),
        ] {
            let resp = ResponseHeader::build(code, None).unwrap();
            assert_eq!(status_ok(&resp).is_ok(), ok, "{code}");
        }
    }

    #[test]
    fn the_web_check_asks_for_readiness_as_the_health_checker() {
        let req = readiness_request("/-/readiness");
        assert_eq!(req.method, "GET");
        assert_eq!(req.uri.path(), "/-/readiness");
        assert_eq!(req.headers["user-agent"], USER_AGENT);
        assert_eq!(req.headers["host"], HOST);
    }

    #[test]
    fn rise_and_fall_become_the_thresholds() {
        let c = HealthConfig {
            rise: 4,
            fall: 7,
            ..HealthConfig::default()
        };
        for pool in [Pool::Web, Pool::Kas, Pool::KasK8sProxy, Pool::KasWorkspaces] {
            let hc = c.check_for(pool);
            assert_eq!(hc.health_threshold(true), 4);
            assert_eq!(hc.health_threshold(false), 7);
        }
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
