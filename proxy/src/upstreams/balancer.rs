//! One (Pod, pool)'s load balancer: round robin, or consistent hashing on the
//! request's key in kas pools.

use std::net::SocketAddr;
use std::sync::Arc;

use pingora::lb::selection::{Consistent, RoundRobin};
use pingora::lb::{Backend, Backends, Extensions, LoadBalancer};
use podgate_tokens::PodId;

use super::discovery::NameDiscovery;
use crate::rules::Pool;

/// One (Pod, pool): its discovery and its load balancer.
pub(super) struct PodPool {
    pub(super) pod: PodId,
    pub(super) pool: Pool,
    pub(super) discovery: Arc<NameDiscovery>,
    pub(super) lb: Lb,
}

/// A pool's load balancer: round robin, or consistent hashing on the request's key
/// (kas pools, see the module docs).
pub(super) enum Lb {
    RoundRobin(LoadBalancer<RoundRobin>),
    Consistent(LoadBalancer<Consistent>),
}

impl Lb {
    pub(super) fn new(pool: Pool, backends: Backends) -> Lb {
        match pool {
            Pool::Kas => Lb::Consistent(LoadBalancer::from_backends(backends)),
            _ => Lb::RoundRobin(LoadBalancer::from_backends(backends)),
        }
    }

    pub(super) fn backends(&self) -> &Backends {
        match self {
            Lb::RoundRobin(lb) => lb.backends(),
            Lb::Consistent(lb) => lb.backends(),
        }
    }

    pub(super) fn select_with<F>(
        &self,
        key: &[u8],
        max_iterations: usize,
        accept: F,
    ) -> Option<Backend>
    where
        F: Fn(&Backend, bool) -> bool,
    {
        match self {
            Lb::RoundRobin(lb) => lb.select_with(key, max_iterations, accept),
            Lb::Consistent(lb) => lb.select_with(key, max_iterations, accept),
        }
    }

    pub(super) async fn update(&self) -> pingora::Result<()> {
        match self {
            Lb::RoundRobin(lb) => lb.update().await,
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
    pub(super) fn ready(&self, addr: SocketAddr) -> bool {
        self.lb.backends().ready(&backend(addr))
    }
}
