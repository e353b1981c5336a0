//! One (Pod, pool)'s load balancer: round robin, or consistent hashing on the
//! request's key in kas pools.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use pingora::lb::selection::{Consistent, RoundRobin};
use pingora::lb::{Backend, Backends, Extensions, LoadBalancer};
use podgate_tokens::PodId;

use super::Availability;
use super::discovery::NameDiscovery;
use crate::rules::Pool;

/// One (Pod, pool): its discovery and its load balancer.
pub(super) struct PodPool {
    pub(super) pod: PodId,
    pub(super) pool: Pool,
    pub(super) discovery: Arc<NameDiscovery>,
    pub(super) lb: Lb,
    /// [`Availability`] as last published ([`PodPool::publish_availability`]),
    /// read by every request rather than asking each address's health.
    pub(super) availability: AtomicU8,
}

/// A pool's load balancer: round robin, or consistent hashing on the request's key
/// (kas pools, see the module docs).
pub(super) enum Lb {
    /// pingora's load balancer for its backends and their health, and the pool's
    /// turn: the round robin itself is [`Lb::select`]'s.
    RoundRobin(LoadBalancer<RoundRobin>, AtomicUsize),
    Consistent(LoadBalancer<Consistent>),
}

impl Lb {
    pub(super) fn new(pool: Pool, backends: Backends) -> Lb {
        match pool {
            Pool::Kas => Lb::Consistent(LoadBalancer::from_backends(backends)),
            _ => Lb::RoundRobin(LoadBalancer::from_backends(backends), AtomicUsize::new(0)),
        }
    }

    pub(super) fn backends(&self) -> &Backends {
        match self {
            Lb::RoundRobin(lb, _) => lb.backends(),
            Lb::Consistent(lb) => lb.backends(),
        }
    }

    /// An address not in `tried`: a healthy one (round robin, or consistent
    /// hashing on `key`), else any; `None` when every one was tried.
    ///
    /// Every backend weighs 1 ([`backend`]), so round robin is a turn over the
    /// set, which this takes itself: pingora's `select_with` walks a weighted
    /// index through a set of the backends already seen, hashing each one it
    /// looks at (SipHash, once more for its health), which cost about 2% of the
    /// proxy's CPU per request on `scripts/bench-proxy.sh`.
    pub(super) fn select(&self, key: &[u8], tried: &[SocketAddr]) -> Option<SocketAddr> {
        let backends = self.backends();
        let all = backends.get_backend();
        let untried = |b: &Backend| inet(b).filter(|a| !tried.contains(a));
        let healthy = match self {
            Lb::RoundRobin(_, turn) => {
                let n = all.len().max(1);
                let start = turn.fetch_add(1, Ordering::Relaxed) % n;
                all.iter()
                    .cycle()
                    .skip(start)
                    .take(all.len())
                    .find(|b| untried(b).is_some() && backends.ready(b))
                    .and_then(untried)
            }
            // The hash ring's fallback order is shared with concurrent requests, so
            // the iterator may skip an address: bound it, then look through the set.
            Lb::Consistent(lb) => lb
                .select_with(key, 4 * all.len() + 4, |b, ready| {
                    ready && untried(b).is_some()
                })
                .as_ref()
                .and_then(untried)
                .or_else(|| {
                    all.iter()
                        .find(|b| untried(b).is_some() && backends.ready(b))
                        .and_then(untried)
                }),
        };
        // A check can be stale: a connect attempt settles it.
        healthy.or_else(|| all.iter().find_map(untried))
    }

    pub(super) async fn update(&self) -> pingora::Result<()> {
        match self {
            Lb::RoundRobin(lb, _) => lb.update().await,
            Lb::Consistent(lb) => lb.update().await,
        }
    }
}

pub(super) fn backend(addr: SocketAddr) -> Backend {
    Backend {
        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
        weight: 1,
        ext: Extensions::new(),
    }
}

pub(super) fn inet(b: &Backend) -> Option<SocketAddr> {
    b.addr.as_inet().copied()
}

impl PodPool {
    /// A pool with nothing published yet: no address.
    pub(super) fn new(pod: PodId, pool: Pool, discovery: Arc<NameDiscovery>, lb: Lb) -> Self {
        PodPool {
            pod,
            pool,
            discovery,
            lb,
            availability: AtomicU8::new(Availability::Unresolved as u8),
        }
    }

    /// Run discovery, then publish the availability it leads to.
    pub(super) async fn update(&self) -> pingora::Result<()> {
        let updated = self.lb.update().await;
        self.publish_availability();
        updated
    }

    /// Whether the pool can take a request, as last published.
    pub(super) fn availability(&self) -> Availability {
        match self.availability.load(Ordering::Acquire) {
            a if a == Availability::Ready as u8 => Availability::Ready,
            a if a == Availability::NoHealthy as u8 => Availability::NoHealthy,
            _ => Availability::Unresolved,
        }
    }

    /// Work out whether the pool can take a request from its addresses and their
    /// health now, for [`PodPool::availability`]. Called after every change of
    /// either: a new table or addresses, a health check that flipped (pingora
    /// records the new health before it reports the flip).
    pub(super) fn publish_availability(&self) {
        let backends = self.lb.backends();
        let all = backends.get_backend();
        let now = if all.is_empty() {
            Availability::Unresolved
        } else if all.iter().any(|b| backends.ready(b)) {
            Availability::Ready
        } else {
            Availability::NoHealthy
        };
        self.availability.store(now as u8, Ordering::Release);
    }

    pub(super) fn ready(&self, addr: SocketAddr) -> bool {
        self.lb.backends().ready(&backend(addr))
    }
}
