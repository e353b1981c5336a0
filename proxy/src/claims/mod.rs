//! Path rules: a request whose path names a top-level namespace or an
//! organization goes to the Cell that claimed it, as GitLab's HTTP Router routes
//! it before any token rule. The claim's owner comes from a Topology Service
//! (podgate's `podgate topology-service`, or GitLab's), through its REST classify.
//!
//! - [`path`]: which claim a path names (Rails' reserved top-level words guarded,
//!   one format suffix stripped);
//! - [`client`]: the REST call;
//! - this module: [`PathRouter`], a bounded cache of answers (an owner for
//!   `cache_ttl_secs`, none for `negative_ttl_secs`), one call in flight per claim,
//!   and a deadline. **A Topology Service outage never fails a request**: a call
//!   that errs or outlasts `deadline_ms` falls through to the token rules (or, for
//!   an owner whose cache time ran out, keeps that owner), and for
//!   `retry_after_ms` after it no call is made at all, so an outage costs one
//!   deadline a second, not one a request.

pub mod client;
pub mod path;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use podgate_registry::Topology;
use podgate_tokens::PodId;
use serde::Deserialize;

use crate::metrics::METRICS;
pub use path::{PathClaim, path_claim};

/// A forward's reason (and metric label) when a route claim placed it.
pub const BY_ROUTE: &str = "path_route";
/// A forward's reason (and metric label) when an organization claim placed it.
pub const BY_ORGANIZATION: &str = "path_organization";

/// `[topology_service]` in `proxy.toml`: where path rules ask whose a claim is.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyServiceConfig {
    /// The Topology Service's REST listener, `host:port`: a DNS name (resolved at
    /// each call, so a moved service is followed) or an IP address.
    pub address: String,
    /// Longest wait for an answer before the request falls through to the token
    /// rules, in milliseconds.
    #[serde(default = "default_deadline")]
    pub deadline_ms: u64,
    /// How long an owner is remembered, in seconds.
    #[serde(default = "default_ttl")]
    pub cache_ttl_secs: u64,
    /// How long "no Cell claims it" is remembered, in seconds.
    #[serde(default = "default_negative_ttl")]
    pub negative_ttl_secs: u64,
    /// Most claims remembered.
    #[serde(default = "default_capacity")]
    pub cache_capacity: usize,
    /// After a failed call, how long to make none, in milliseconds.
    #[serde(default = "default_retry_after")]
    pub retry_after_ms: u64,
    /// More first path segments that name no namespace (besides
    /// [`path::RESERVED`]).
    #[serde(default)]
    pub reserved: Vec<String>,
    /// Mutual TLS to the service, as GitLab's HTTP Router reaches its Topology
    /// Service (with the Router's client certificate). None: plain HTTP.
    #[serde(default)]
    pub tls: Option<TopologyServiceTls>,
}

/// `[topology_service.tls]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyServiceTls {
    /// The CA the service's certificate is signed by (PEM).
    pub ca: std::path::PathBuf,
    /// The proxy's client certificate (PEM): the Router's role.
    pub cert: std::path::PathBuf,
    /// Its private key (PEM).
    pub key: std::path::PathBuf,
    /// The name the service's certificate carries; default: `address`'s host.
    #[serde(default)]
    pub server_name: Option<String>,
}

fn default_deadline() -> u64 {
    100
}
fn default_ttl() -> u64 {
    60
}
fn default_negative_ttl() -> u64 {
    10
}
fn default_capacity() -> usize {
    100_000
}
fn default_retry_after() -> u64 {
    1000
}

/// The host of `host:port` (an IPv6 address without its brackets).
fn host(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl TopologyServiceConfig {
    /// Every problem, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let port = self.address.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
        if host(&self.address).is_empty() || !matches!(port, Some(Ok(p)) if p > 0) {
            bad.push(format!(
                "topology_service.address = {:?}: expected host:port (a DNS name or an IP address, and a port)",
                self.address
            ));
        }
        if self.deadline_ms == 0 {
            bad.push("topology_service.deadline_ms: must be positive".into());
        }
        if self.cache_capacity == 0 {
            bad.push("topology_service.cache_capacity: must be positive".into());
        }
        if let Some(t) = &self.tls {
            for (field, path) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                if !path.is_file() {
                    bad.push(format!(
                        "topology_service.tls.{field} = {}: no such file",
                        path.display()
                    ));
                }
            }
        }
        for (i, r) in self.reserved.iter().enumerate() {
            if r.is_empty() || r.contains('/') {
                bad.push(format!(
                    "topology_service.reserved[{i}] = {r:?}: one path segment"
                ));
            }
        }
        bad
    }
}

/// What a claim's lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The Cell at this address (a `proxy.address`) claimed it.
    Cell(Arc<str>),
    /// No Cell claims it.
    Unclaimed,
    /// No answer (an error, the deadline, or a recent failure): fall through.
    Unavailable,
}

#[derive(Clone)]
struct Entry {
    owner: Option<Arc<str>>,
    expires: Instant,
    /// An owner kept past its cache time because the service gave no answer:
    /// served until `expires` (one `retry_after_ms`), then asked for again.
    stale: bool,
}

/// Path rules' lookups, shared by every request.
pub struct PathRouter {
    config: TopologyServiceConfig,
    tls: Option<client::Tls>,
    cache: quick_cache::sync::Cache<PathClaim, Entry>,
    started: Instant,
    /// No call before this many milliseconds after `started`.
    quiet_until_ms: AtomicU64,
}

impl PathRouter {
    /// A router asking the Topology Service of `config`; `Err` names the TLS file
    /// that would not load.
    pub fn new(config: TopologyServiceConfig) -> Result<Self, String> {
        let tls = config
            .tls
            .as_ref()
            .map(|t| {
                let file = |field: &str, path: &std::path::Path| {
                    let path = path.display().to_string();
                    let field = field.to_owned();
                    move |e: openssl::error::ErrorStack| {
                        format!("topology_service.tls.{field} = {path}: {e}")
                    }
                };
                let mut b =
                    openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls_client())
                        .map_err(|e| e.to_string())?;
                b.set_ca_file(&t.ca).map_err(file("ca", &t.ca))?;
                b.set_certificate_chain_file(&t.cert)
                    .map_err(file("cert", &t.cert))?;
                b.set_private_key_file(&t.key, openssl::ssl::SslFiletype::PEM)
                    .map_err(file("key", &t.key))?;
                b.check_private_key().map_err(file("key", &t.key))?;
                b.set_alpn_protos(b"\x08http/1.1")
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(client::Tls {
                    connector: b.build(),
                    server_name: t
                        .server_name
                        .clone()
                        .unwrap_or_else(|| host(&config.address).to_owned()),
                })
            })
            .transpose()?;
        Ok(PathRouter {
            cache: quick_cache::sync::Cache::new(config.cache_capacity),
            config,
            tls,
            started: Instant::now(),
            quiet_until_ms: AtomicU64::new(0),
        })
    }

    /// The claim a path names, if path rules apply to it.
    pub fn claim(&self, path: &str) -> Option<PathClaim> {
        path_claim(path, &self.config.reserved)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whose `claim` is: from the cache, else one call (shared by every request
    /// asking for the same claim meanwhile) bounded by the deadline.
    pub async fn owner(&self, claim: &PathClaim) -> Owner {
        let outcome = |o: &Option<Arc<str>>| match o {
            Some(a) => Owner::Cell(a.clone()),
            None => Owner::Unclaimed,
        };
        // An owner whose time in the cache ran out: still the best answer while the
        // Topology Service cannot give a new one (an owner changes when a namespace
        // moves Cells, rarely; the default Pod would be wrong for every request).
        let mut stale: Option<Arc<str>> = None;
        // Without an answer: the stale owner, kept in the cache for the requests
        // after this one until the next call is due.
        let fallback = |stale: Option<Arc<str>>| match stale {
            Some(a) => {
                METRICS.classify_cache.with_label_values(&["stale"]).inc();
                self.cache
                    .insert(claim.clone(), self.stale_entry(a.clone()));
                Owner::Cell(a)
            }
            None => Owner::Unavailable,
        };
        for _ in 0..2 {
            let guard = match self.cache.get_value_or_guard_async(claim).await {
                Ok(e) if e.expires > Instant::now() => {
                    let label = if e.stale {
                        "stale"
                    } else if e.owner.is_some() {
                        "hit"
                    } else {
                        "negative_hit"
                    };
                    METRICS.classify_cache.with_label_values(&[label]).inc();
                    return outcome(&e.owner);
                }
                Ok(e) => {
                    METRICS.classify_cache.with_label_values(&["expired"]).inc();
                    stale = stale.or(e.owner);
                    self.cache.remove(claim);
                    continue;
                }
                Err(guard) => guard,
            };
            METRICS.classify_cache.with_label_values(&["miss"]).inc();
            let answer = if self.now_ms() < self.quiet_until_ms.load(Ordering::Relaxed) {
                METRICS.topology_calls.with_label_values(&["skipped"]).inc();
                None
            } else {
                self.ask(claim).await
            };
            let Some(owner) = answer else {
                let Some(a) = stale else {
                    return Owner::Unavailable;
                };
                METRICS.classify_cache.with_label_values(&["stale"]).inc();
                // Through the guard: the requests that waited on this call get the
                // stale owner too.
                let _ = guard.insert(self.stale_entry(a.clone()));
                return Owner::Cell(a);
            };
            METRICS
                .topology_calls
                .with_label_values(&[if owner.is_some() {
                    "owner"
                } else {
                    "unclaimed"
                }])
                .inc();
            let ttl = if owner.is_some() {
                self.config.cache_ttl_secs
            } else {
                self.config.negative_ttl_secs
            };
            let _ = guard.insert(Entry {
                owner: owner.clone(),
                expires: Instant::now() + Duration::from_secs(ttl),
                stale: false,
            });
            return outcome(&owner);
        }
        fallback(stale)
    }

    /// The cache entry of an owner kept past its cache time: served until the next
    /// call is due (`retry_after_ms`).
    fn stale_entry(&self, owner: Arc<str>) -> Entry {
        Entry {
            owner: Some(owner),
            expires: Instant::now() + Duration::from_millis(self.config.retry_after_ms),
            stale: true,
        }
    }

    /// One call, bounded by the deadline: the owner (`None` inside: no Cell
    /// claims it), or `None` when no answer came (counted, logged, and no call
    /// for `retry_after_ms`).
    async fn ask(&self, claim: &PathClaim) -> Option<Option<Arc<str>>> {
        let deadline = Duration::from_millis(self.config.deadline_ms);
        let answer = tokio::time::timeout(
            deadline,
            client::classify(&self.config.address, self.tls.as_ref(), claim),
        )
        .await;
        match answer {
            Ok(Ok(owner)) => return Some(owner.map(Arc::<str>::from)),
            Ok(Err(e)) => {
                METRICS.topology_calls.with_label_values(&["error"]).inc();
                tracing::warn!(error = %e, "topology service: path rules fall through to token rules");
            }
            Err(_) => {
                METRICS
                    .topology_calls
                    .with_label_values(&["deadline"])
                    .inc();
                tracing::warn!(
                    deadline_ms = self.config.deadline_ms,
                    "topology service: no answer within the deadline; path rules fall through to token rules"
                );
            }
        }
        self.quiet();
        None
    }

    fn quiet(&self) {
        self.quiet_until_ms.store(
            self.now_ms() + self.config.retry_after_ms,
            Ordering::Relaxed,
        );
    }
}

/// The Pod of the Cell at `address` (a Pod's `cell_address`; a bare host matches
/// its host).
pub fn pod_of(topology: &Topology, address: &str) -> Option<PodId> {
    let host = |a: &str| a.rsplit_once(':').map_or(a, |(h, _)| h).to_owned();
    topology
        .pods
        .values()
        .find(|p| p.cell_address.as_deref() == Some(address))
        .or_else(|| {
            topology.pods.values().find(|p| {
                p.cell_address
                    .as_deref()
                    .is_some_and(|c| host(c) == host(address))
            })
        })
        .map(|p| p.id)
}

#[cfg(test)]
mod tests;
