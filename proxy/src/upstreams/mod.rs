//! Where a Pod's requests go: one pingora [`LoadBalancer`](pingora::lb::LoadBalancer) per (Pod, pool), rebuilt
//! from the registry's topology.
//!
//! - **Names off the request path.** Each load balancer's discovery
//!   ([`discovery::NameDiscovery`]) turns the topology's `host:port` strings into
//!   addresses with tokio's resolver, again every `upstreams.resolve_interval_ms`,
//!   keeping the last good addresses of a name that stops resolving. The request
//!   path only reads the result: it never resolves (pingora 0.9's
//!   `HttpPeer::new` would call a blocking `getaddrinfo`, and panic when it fails).
//! - **Health** ([`crate::health`]): one shared pingora `HealthRegistry` per pool,
//!   probed by a `HealthCheckService` (a pingora background service), so an address
//!   several Pods list is checked once.
//! - **Selection:** round robin over a Pod's healthy addresses (every weight is
//!   1, `balancer::Lb::select`), except in a Pod's kas pool: there pingora's
//!   consistent hashing (`KetamaHashing`) on the agent's token sends every stream
//!   of one agentk (its configuration stream and all its reverse tunnels, separate
//!   HTTP/2 streams of one connection) to the same kas, which routes calls to the
//!   tunnels of the connections registered to it; a round robin would scatter the
//!   tunnels over kas instances that do not hold the agent's connection. A retry
//!   after a connect failure takes another address of the **same** Pod; no path
//!   leads to another Pod's upstreams.
//! - **Availability** (whether a Pod's pool can take a request at all) is worked
//!   out when its addresses or their health change, and read per request.
//!
//! Pods have no weight: traffic bound to a Pod goes to that Pod, unbound traffic to
//! the default Pod (see `podgate_registry::Pod`).
//!
//! [`UpstreamsService`] runs it all as a pingora background service: it waits for
//! the registry (opened by `server`'s registry service), builds the table from the
//! current topology, resolves every name once, signals ready (the proxy's listeners
//! start only then), and then follows topology changes and re-resolves
//! periodically until shutdown.

mod balancer;
mod config;
pub mod discovery;
mod limit;
mod service;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use pingora::lb::{Backends, HealthCheckService, HealthRegistry};
use pingora::server::ShutdownWatch;
use pingora::services::ServiceReadyNotifier;
use podgate_registry::Topology;
use podgate_tokens::PodId;
use tokio::sync::watch;

use crate::health::{HealthConfig, Observed, Observer, pool_name};
use crate::metrics::METRICS;
use crate::rules::Pool;
use balancer::{Lb, PodPool, inet};
pub use config::{Error, MAX_QUEUE_TIMEOUT_MS, UpstreamsConfig};
use discovery::{Discovery, NameDiscovery, Resolve};
pub(crate) use limit::{ConnLimits, Slot};
pub use service::UpstreamsService;

/// Whether a Pod's pool can take a request now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Availability {
    /// At least one address passes its health check.
    Ready,
    /// The Pod lists no upstream for this pool.
    NoUpstream,
    /// The Pod lists upstreams, but none has an address yet (names that never
    /// resolved).
    Unresolved,
    /// Every address fails its health check.
    NoHealthy,
}

impl Availability {
    /// The 503 reason (and outcome label) for a Pod that cannot take the request.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Availability::Ready => None,
            Availability::NoUpstream => Some("no_upstream"),
            Availability::Unresolved => Some("unresolved_upstream"),
            Availability::NoHealthy => Some("no_healthy_upstream"),
        }
    }
}

/// Which (Pod, upstream) each checked address belongs to, per pool: to count a
/// failed check for every Pod listing the address.
type Owners = HashMap<(Pool, SocketAddr), Vec<(String, String)>>;

/// Every (Pod, pool), looked up twice per request (availability, selection):
/// hashed with foldhash, its keys being the topology's.
type Table = HashMap<(PodId, Pool), Arc<PodPool>, foldhash::fast::RandomState>;

/// What the request path and the health checks read; written by the background
/// service only.
#[derive(Default)]
struct Shared {
    pools: ArcSwap<Table>,
    owners: ArcSwap<Owners>,
    /// The label sets of `podgate_proxy_upstream_healthy` now exported.
    gauges: Mutex<HashSet<(String, &'static str, String)>>,
}

impl Shared {
    /// Recompute who owns which address, and every health gauge: an upstream is
    /// healthy while one of its addresses is (an unresolved one is not).
    fn publish(&self) {
        let pools = self.pools.load();
        let mut owners: Owners = HashMap::new();
        let mut gauges = self.gauges.lock().unwrap_or_else(|e| e.into_inner());
        let mut current = HashSet::new();
        for p in pools.values() {
            p.publish_availability();
            let pod = p.pod.to_string();
            let pool = pool_name(p.pool);
            for upstream in p.discovery.upstreams() {
                let addrs = p.discovery.addrs_of(upstream);
                let healthy = addrs.iter().any(|a| p.ready(*a));
                for a in addrs {
                    owners
                        .entry((p.pool, a))
                        .or_default()
                        .push((pod.clone(), upstream.clone()));
                }
                METRICS
                    .upstream_healthy
                    .with_label_values(&[pod.as_str(), pool, upstream.as_str()])
                    .set(i64::from(healthy));
                current.insert((pod.clone(), pool, upstream.clone()));
            }
        }
        for gone in gauges.difference(&current) {
            let _ = METRICS.upstream_healthy.remove_label_values(&[
                gone.0.as_str(),
                gone.1,
                gone.2.as_str(),
            ]);
        }
        *gauges = current;
        self.owners.store(Arc::new(owners));
    }
}

impl Observer for Shared {
    fn failed(&self, pool: Pool, addr: SocketAddr, _error: &pingora::Error) {
        if let Some(owners) = self.owners.load().get(&(pool, addr)) {
            for (pod, upstream) in owners {
                METRICS
                    .health_failures
                    .with_label_values(&[pod.as_str(), upstream.as_str()])
                    .inc();
            }
        }
    }

    fn flipped(&self, pool: Pool, addr: SocketAddr, healthy: bool) {
        let owners = self.owners.load();
        for (pod, upstream) in owners.get(&(pool, addr)).into_iter().flatten() {
            if healthy {
                tracing::warn!(pod, pool = pool_name(pool), upstream, %addr, "upstream healthy again");
            } else {
                tracing::warn!(pod, pool = pool_name(pool), upstream, %addr, "upstream unhealthy");
            }
        }
        self.publish();
    }
}

/// Every (Pod, pool) load balancer, and their shared health checks.
pub struct Upstreams {
    shared: Arc<Shared>,
    web_health: Arc<HealthRegistry>,
    kas_health: Arc<HealthRegistry>,
    kas_k8s_proxy_health: Arc<HealthRegistry>,
    kas_workspaces_health: Arc<HealthRegistry>,
    health: HealthConfig,
    config: UpstreamsConfig,
    resolver: Arc<dyn Resolve>,
    limits: ConnLimits,
}

impl Upstreams {
    /// An empty table; [`Upstreams::apply`] fills it from a topology. Names resolve
    /// with `resolver` ([`discovery::SystemResolver`] in production).
    pub fn new(health: HealthConfig, config: UpstreamsConfig, resolver: Arc<dyn Resolve>) -> Self {
        let shared = Arc::new(Shared::default());
        let registry = |pool| {
            let r = Arc::new(HealthRegistry::new());
            if health.enabled {
                r.set_health_check(Box::new(Observed::new(
                    health.check_for(pool),
                    pool,
                    health.timeout(),
                    shared.clone(),
                )));
            }
            r
        };
        Upstreams {
            web_health: registry(Pool::Web),
            kas_health: registry(Pool::Kas),
            kas_k8s_proxy_health: registry(Pool::KasK8sProxy),
            kas_workspaces_health: registry(Pool::KasWorkspaces),
            shared: shared.clone(),
            health,
            limits: ConnLimits::new(
                config.max_connections_per_address,
                Duration::from_millis(config.queue_timeout_ms),
            ),
            config,
            resolver,
        }
    }

    /// The background services that run the health checks (none when `[health]`
    /// is disabled): one per pool, each address checked once a round.
    pub fn health_services(&self) -> Vec<(&'static str, HealthCheckService)> {
        if !self.health.enabled {
            return Vec::new();
        }
        [
            ("web", &self.web_health),
            ("kas", &self.kas_health),
            ("kas_k8s_proxy", &self.kas_k8s_proxy_health),
            ("kas_workspaces", &self.kas_workspaces_health),
        ]
        .into_iter()
        .map(|(name, registry)| {
            let mut s = HealthCheckService::new(registry.clone());
            s.health_check_frequency = Some(self.health.interval());
            s.parallel_health_check = true;
            (name, s)
        })
        .collect()
    }

    /// Whether `pod`'s `pool` can take a request now: as of the last change of
    /// the table, of an address or of a health check (each publishes it).
    pub fn availability(&self, pod: PodId, pool: Pool) -> Availability {
        match self.shared.pools.load().get(&(pod, pool)) {
            Some(p) => p.availability(),
            None => Availability::NoUpstream,
        }
    }

    /// An address of `pod`'s `pool` this request has not `tried`: a healthy one by
    /// round robin (by consistent hashing of `key` in a kas pool); failing that, any
    /// untried one (a check can be stale: a connect attempt settles it). `key` is
    /// the request's selection key (the agent's token for kas). `None`: every
    /// address was tried, or there is none.
    pub fn select(
        &self,
        pod: PodId,
        pool: Pool,
        key: &[u8],
        tried: &[SocketAddr],
    ) -> Option<SocketAddr> {
        self.shared
            .pools
            .load()
            .get(&(pod, pool))?
            .lb
            .select(key, tried)
    }

    /// A slot among the requests in flight to `addr` of `pod`'s `pool`, once it
    /// has one under `upstreams.max_connections_per_address` ([`limit`]; web pools
    /// only). Held until the request is done with its connection.
    pub(crate) async fn admit(
        &self,
        pod: PodId,
        pool: Pool,
        addr: SocketAddr,
    ) -> Result<Option<Slot>, Box<pingora::Error>> {
        if pool != Pool::Web {
            return Ok(None);
        }
        self.limits.admit(pod, addr).await.map(Some)
    }

    /// Whether `pod`'s `pool` has an address this request has not `tried`.
    pub fn untried_left(&self, pod: PodId, pool: Pool, tried: &[SocketAddr]) -> bool {
        self.shared.pools.load().get(&(pod, pool)).is_some_and(|p| {
            p.lb.backends()
                .get_backend()
                .iter()
                .any(|b| inet(b).is_some_and(|a| !tried.contains(&a)))
        })
    }

    /// Make the table match `topology`: a (Pod, pool) whose upstream list is
    /// unchanged keeps its load balancer (and health); a new or changed one gets a
    /// new load balancer that starts from the addresses already known for the names
    /// it shares with the old one. IP literals are in place before the new table is
    /// published; names are resolved before this returns.
    pub async fn apply(&self, topology: &Topology) {
        let old = self.shared.pools.load_full();
        let mut pools = Table::default();
        let mut pending = Vec::new();
        for pod in topology.pods.values() {
            for (pool, list) in [
                (Pool::Web, &pod.web),
                (Pool::Kas, &pod.kas),
                (Pool::KasK8sProxy, &pod.kas_k8s_proxy),
                (Pool::KasWorkspaces, &pod.kas_workspaces),
            ] {
                if list.is_empty() {
                    continue;
                }
                let key = (pod.id, pool);
                let previous = old.get(&key);
                if let Some(p) = previous
                    && p.discovery.upstreams() == list.as_slice()
                {
                    pools.insert(key, p.clone());
                    continue;
                }
                let discovery = Arc::new(NameDiscovery::new(
                    pod.id.to_string(),
                    pool_name(pool),
                    list.clone(),
                    self.resolver.clone(),
                    Duration::from_millis(self.config.resolve_timeout_ms),
                    previous.map(|p| &*p.discovery),
                ));
                let registry = match pool {
                    Pool::Web => &self.web_health,
                    Pool::Kas => &self.kas_health,
                    Pool::KasK8sProxy => &self.kas_k8s_proxy_health,
                    Pool::KasWorkspaces => &self.kas_workspaces_health,
                };
                let backends = Backends::new_with_health_registry(
                    Box::new(Discovery(discovery.clone())),
                    registry.clone(),
                );
                let p = Arc::new(PodPool::new(
                    pod.id,
                    pool,
                    discovery,
                    Lb::new(pool, backends),
                ));
                // Literals only: discovery completes without waiting.
                if p.update().now_or_never().is_none() {
                    pending.push(p.clone());
                }
                pools.insert(key, p);
            }
        }
        self.shared.pools.store(Arc::new(pools));
        self.shared.publish();
        if !pending.is_empty() {
            futures_util::future::join_all(pending.iter().map(|p| p.update())).await;
            self.shared.publish();
        }
    }

    /// Resolve every name again (all Pods concurrently).
    pub async fn resolve_all(&self) {
        let pools = self.shared.pools.load_full();
        futures_util::future::join_all(pools.values().map(|p| p.update())).await;
        self.shared.publish();
    }

    /// Follow `topologies` and re-resolve every `resolve_interval_ms` until
    /// `shutdown`. `ready` is signalled once the first topology is applied.
    pub async fn run(
        &self,
        mut topologies: watch::Receiver<Arc<Topology>>,
        mut shutdown: ShutdownWatch,
        ready: Option<ServiceReadyNotifier>,
    ) {
        let first = topologies.borrow_and_update().clone();
        self.apply(&first).await;
        if let Some(ready) = ready {
            ready.notify_ready();
        }
        let period = Duration::from_millis(self.config.resolve_interval_ms);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
                r = topologies.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let t = topologies.borrow_and_update().clone();
                    self.apply(&t).await;
                }
                _ = tick.tick() => self.resolve_all().await,
            }
        }
    }
}

#[cfg(test)]
mod tests;
