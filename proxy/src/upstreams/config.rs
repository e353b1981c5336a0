//! `[upstreams]` in `proxy.toml`, and why an upstream has no address.

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

/// Why an upstream has no address. Not fatal: the last good addresses stay in use
/// and the next round retries.
#[derive(Debug, Error)]
pub enum Error {
    /// The resolver answered with an error (or with no address).
    #[error("resolving {upstream}: {source}")]
    Resolve {
        /// The upstream as configured.
        upstream: String,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// The resolver did not answer in time.
    #[error("resolving {upstream}: no answer within {after:?}")]
    ResolveTimeout {
        /// The upstream as configured.
        upstream: String,
        /// The timeout.
        after: Duration,
    },
}

fn default_resolve_interval() -> u64 {
    30_000
}
fn default_resolve_timeout() -> u64 {
    2_000
}
fn default_max_connections() -> usize {
    1_024
}
fn default_queue_timeout() -> u64 {
    2_000
}
/// Longest `upstreams.queue_timeout_ms`.
pub const MAX_QUEUE_TIMEOUT_MS: u64 = 60_000;

/// `[upstreams]` in `proxy.toml`: name resolution of the topology's upstreams.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamsConfig {
    /// Milliseconds between re-resolutions of upstream names (IP literals are never
    /// resolved). Default 30000.
    #[serde(default = "default_resolve_interval")]
    pub resolve_interval_ms: u64,
    /// Milliseconds one name may take to resolve before the attempt counts as failed
    /// (its last good addresses stay). Default 2000.
    #[serde(default = "default_resolve_timeout")]
    pub resolve_timeout_ms: u64,
    /// Most requests in flight to one address of a Pod's web pool, each on its own
    /// connection (HAProxy's per-server `maxconn`); more wait for one to finish
    /// (`upstreams/limit.rs`). Long polls the edge does not hold count while the Pod holds
    /// them. 0: unbounded. Default 1024.
    #[serde(default = "default_max_connections")]
    pub max_connections_per_address: usize,
    /// Milliseconds a request waits for a slot under that bound before it is
    /// answered 503 + `Retry-After` (HAProxy's `timeout queue`, which defaults to
    /// its connect timeout: pingora's 2 s here). Default 2000.
    #[serde(default = "default_queue_timeout")]
    pub queue_timeout_ms: u64,
}

impl Default for UpstreamsConfig {
    fn default() -> Self {
        UpstreamsConfig {
            resolve_interval_ms: default_resolve_interval(),
            resolve_timeout_ms: default_resolve_timeout(),
            max_connections_per_address: default_max_connections(),
            queue_timeout_ms: default_queue_timeout(),
        }
    }
}

impl UpstreamsConfig {
    /// Problems, each naming its field under `upstreams.`.
    pub fn problems(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if self.resolve_interval_ms < 100 {
            bad.push("upstreams.resolve_interval_ms: at least 100".into());
        }
        if self.resolve_timeout_ms == 0 || self.resolve_timeout_ms > self.resolve_interval_ms {
            bad.push(
                "upstreams.resolve_timeout_ms: positive and at most resolve_interval_ms".into(),
            );
        }
        if self.queue_timeout_ms == 0 || self.queue_timeout_ms > MAX_QUEUE_TIMEOUT_MS {
            bad.push(format!(
                "upstreams.queue_timeout_ms: positive and at most {MAX_QUEUE_TIMEOUT_MS}"
            ));
        }
        bad
    }
}
