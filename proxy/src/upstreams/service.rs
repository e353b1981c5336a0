//! The upstream table as a pingora background service.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::ServiceReadyNotifier;
use pingora::services::background::BackgroundService;

use super::Upstreams;
use crate::server::RegistryHandle;

/// [`Upstreams::run`] as a pingora background service, on the registry that
/// `server`'s registry service opens.
pub struct UpstreamsService {
    upstreams: Arc<Upstreams>,
    registry: RegistryHandle,
}

impl UpstreamsService {
    /// Run `upstreams` on the topology of `registry` (once it is open).
    pub fn new(upstreams: Arc<Upstreams>, registry: RegistryHandle) -> Self {
        UpstreamsService {
            upstreams,
            registry,
        }
    }
}

#[async_trait]
impl BackgroundService for UpstreamsService {
    async fn start_with_ready_notifier(
        &self,
        shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let registry = self.registry.wait().await;
        self.upstreams
            .run(registry.watch_topology(), shutdown, Some(ready))
            .await;
    }
}
