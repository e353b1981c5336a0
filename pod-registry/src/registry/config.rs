//! [`RegistryConfig`]: where registry state lives and how often it is refreshed,
//! checked by [`RegistryConfig::validate`].

use std::path::PathBuf;
use std::time::Duration;

use backon::ExponentialBuilder;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where registry state lives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BackendConfig {
    /// In this process only.
    #[default]
    Memory,
    /// One Redis server.
    Redis {
        /// `redis://[user:pass@]host:port[/db]`.
        url: String,
    },
    /// A Redis Cluster.
    RedisCluster {
        /// Seed nodes, `redis://host:port`.
        nodes: Vec<String>,
    },
}

/// Registry settings. Durations accept `90s`, `5m`, `250ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// Where state lives.
    pub backend: BackendConfig,
    /// A static topology file; when set, the topology is read-only and comes from it.
    pub topology_file: Option<PathBuf>,
    /// Prefix of every Redis key and channel.
    pub key_prefix: String,
    /// How long a registration lives unless refreshed.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How often this process rewrites what it owns (must be well under `ttl`).
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
    /// How often expired entries are removed.
    #[serde(with = "humantime_serde")]
    pub gc_interval: Duration,
    /// How often the topology is re-read even without a change event (safety net).
    #[serde(with = "humantime_serde")]
    pub topology_resync_interval: Duration,
    /// How often `wait_for_agent` re-checks without an event (safety net only).
    #[serde(with = "humantime_serde")]
    pub wait_recheck_interval: Duration,
    /// Longest pause between reconnection attempts, before jitter: pauses start at
    /// 50ms and double up to this, and each is lengthened by a random part of
    /// itself (up to as much again), as the Redis client's own reconnects are.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Longest a Redis call waits for its answer before it fails (transient).
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Longest a connection to Redis may take to be made.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            backend: BackendConfig::Memory,
            topology_file: None,
            key_prefix: "podgate".into(),
            ttl: Duration::from_secs(120),
            refresh_interval: Duration::from_secs(30),
            gc_interval: Duration::from_secs(300),
            topology_resync_interval: Duration::from_secs(30),
            wait_recheck_interval: Duration::from_secs(10),
            backoff_max: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

impl RegistryConfig {
    /// Check every field; all problems are reported at once, each naming its field.
    pub fn validate(&self) -> Result<()> {
        let mut bad = Vec::new();
        match &self.backend {
            BackendConfig::Memory => {}
            BackendConfig::Redis { url } => {
                if redis::Client::open(url.as_str()).is_err() {
                    bad.push(format!("backend.url = {url:?}: not a redis:// URL"));
                }
            }
            BackendConfig::RedisCluster { nodes } => {
                if nodes.is_empty() {
                    bad.push("backend.nodes: at least one seed node".into());
                }
                for (i, n) in nodes.iter().enumerate() {
                    if redis::Client::open(n.as_str()).is_err() {
                        bad.push(format!("backend.nodes[{i}] = {n:?}: not a redis:// URL"));
                    }
                }
            }
        }
        if self.key_prefix.is_empty()
            || !self
                .key_prefix
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
        {
            bad.push(format!(
                "key_prefix = {:?}: letters, digits, '-', '_' and '.' only",
                self.key_prefix
            ));
        }
        if self.ttl < Duration::from_millis(100) {
            bad.push(format!("ttl = {:?}: at least 100ms", self.ttl));
        }
        if self.refresh_interval.is_zero() || self.refresh_interval * 2 > self.ttl {
            bad.push(format!(
                "refresh_interval = {:?}: must be positive and at most half of ttl ({:?})",
                self.refresh_interval, self.ttl
            ));
        }
        for (name, d) in [
            ("gc_interval", self.gc_interval),
            ("topology_resync_interval", self.topology_resync_interval),
            ("wait_recheck_interval", self.wait_recheck_interval),
            ("backoff_max", self.backoff_max),
            ("response_timeout", self.response_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if d.is_zero() {
                bad.push(format!("{name}: must be positive"));
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Config {
                origin: "registry".into(),
                problems: bad,
            })
        }
    }
}

/// The pauses between reconnection attempts: from 50ms, doubling up to `max`, each
/// lengthened by a random part of itself (up to as much again), so processes that
/// lost Redis together do not all come back at the same moment. No limit on
/// attempts: the iterator it builds never ends; build a new one to start over.
pub(crate) fn reconnect_backoff(max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder as _;

    use super::*;

    #[test]
    fn reconnect_pauses_double_from_50ms_to_the_ceiling_with_jitter_and_never_end() {
        let max = Duration::from_millis(400);
        let pauses: Vec<Duration> = reconnect_backoff(max).build().take(1_000).collect();
        assert_eq!(pauses.len(), 1_000, "no limit on attempts");
        // Each pause is its base plus up to as much again; float rounding stays
        // far below the millisecond allowed here.
        let ms = Duration::from_millis;
        let bases = [50, 100, 200].into_iter().chain(std::iter::repeat(400));
        for (i, (pause, base)) in pauses.iter().zip(bases).enumerate() {
            assert!(
                *pause >= ms(base) && *pause <= ms(2 * base + 1),
                "pause {i}: {pause:?} for a base of {base}ms"
            );
        }
        let at_ceiling = &pauses[3..];
        assert!(
            at_ceiling.iter().any(|p| *p != at_ceiling[0]),
            "jitter spreads the pauses"
        );
    }
}
