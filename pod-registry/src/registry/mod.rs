//! [`Registry`]: the one handle the proxy and kas use. It owns what this process
//! registered, keeps it refreshed, serves topology snapshots lock-free, and wakes
//! waiters on presence events.
//!
//! This file builds the handle and holds its topology; `presence` registers,
//! looks up and refreshes connections; `tasks` runs the background work; `config`
//! is [`RegistryConfig`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::backend::memory::MemoryBackend;
use crate::backend::redis::{RedisBackend, RedisTarget};
use crate::backend::{Backend, BackendEvent, TopologyChange};
use crate::error::{Error, Result};
use crate::metrics::{Health, RegistryMetrics};
use crate::presence::{AgentEvent, KasInstance, OwnedConn};
use crate::topology::{Pod, PodState, Topology, TopologyFile};
use podgate_tokens::PodId;
use tasks::{event_pump, every};

mod config;
mod presence;
mod tasks;

pub(crate) use config::reconnect_backoff;
pub use config::{BackendConfig, RegistryConfig};

/// What this process registered: refreshed until unregistered, removed at shutdown.
#[derive(Default)]
struct Owned {
    conns: HashMap<(i64, i64), Arc<OwnedConn>>,
    kas: Option<KasInstance>,
}

struct Inner {
    /// Behind a trait object: see [`Backend`] for why that costs the hot paths
    /// nothing.
    backend: Arc<dyn Backend>,
    config: RegistryConfig,
    read_only_topology: bool,
    topology: ArcSwap<Topology>,
    topology_tx: watch::Sender<Arc<Topology>>,
    owned: Mutex<Owned>,
    events: broadcast::Sender<AgentEvent>,
    kas_events: broadcast::Sender<Arc<[u8]>>,
    health: Arc<Health>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    empty_logged: std::sync::atomic::AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().map(std::mem::take).unwrap_or_default() {
            t.abort();
        }
    }
}

/// The registry handle. Cheap to clone; every clone is the same registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("backend", &self.inner.config.backend)
            .field("topology_version", &self.inner.topology.load().version)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Open the registry `config` describes and start its background tasks.
    pub async fn connect(config: RegistryConfig) -> Result<Registry> {
        config.validate()?;
        let file = config
            .topology_file
            .as_deref()
            .map(TopologyFile::load)
            .transpose()?;
        let health = Arc::new(Health::new(Arc::new(RegistryMetrics::new())));
        let target = match &config.backend {
            BackendConfig::Memory => None,
            BackendConfig::Redis { url } => Some(RedisTarget::Standalone(url.clone())),
            BackendConfig::RedisCluster { nodes } => Some(RedisTarget::Cluster(nodes.clone())),
        };
        let backend: Arc<dyn Backend> = match target {
            None => Arc::new(MemoryBackend::new(
                file.as_ref().map(|f| f.to_topology(1)).unwrap_or_default(),
            )),
            Some(target) => {
                Arc::new(RedisBackend::connect(&target, &config, health.clone()).await?)
            }
        };
        Ok(Self::start(backend, config, file, health).await)
    }

    /// A registry on a shared in-memory store: registries built on clones of one
    /// `MemoryBackend` see each other's registrations and events.
    pub async fn with_memory(backend: MemoryBackend, config: RegistryConfig) -> Result<Registry> {
        config.validate()?;
        let health = Arc::new(Health::new(Arc::new(RegistryMetrics::new())));
        Ok(Self::start(Arc::new(backend), config, None, health).await)
    }

    async fn start(
        backend: Arc<dyn Backend>,
        config: RegistryConfig,
        file: Option<TopologyFile>,
        health: Arc<Health>,
    ) -> Registry {
        let initial = file.as_ref().map(|f| f.to_topology(1)).unwrap_or_default();
        let (topology_tx, _) = watch::channel(Arc::new(initial.clone()));
        let inner = Arc::new(Inner {
            backend,
            read_only_topology: file.is_some(),
            topology: ArcSwap::from_pointee(initial),
            topology_tx,
            owned: Mutex::new(Owned::default()),
            events: broadcast::channel(4096).0,
            kas_events: broadcast::channel(256).0,
            health,
            tasks: Mutex::new(Vec::new()),
            empty_logged: std::sync::atomic::AtomicBool::new(false),
            config,
        });
        let registry = Registry { inner };
        if !registry.inner.read_only_topology {
            // A failure here is logged by health; readers start empty and the
            // resync loop keeps trying.
            let _ = registry.reload_topology().await;
        }
        registry.spawn_tasks();
        registry
    }

    fn spawn_tasks(&self) {
        let weak = Arc::downgrade(&self.inner);
        let c = &self.inner.config;
        let tasks = vec![
            tokio::spawn(event_pump(weak.clone(), self.backend_events())),
            tokio::spawn(every(weak.clone(), c.refresh_interval, |r| async move {
                let _ = r.refresh().await;
            })),
            tokio::spawn(every(weak.clone(), c.gc_interval, |r| async move {
                let _ = r.gc().await;
            })),
            tokio::spawn(every(weak, c.topology_resync_interval, |r| async move {
                let _ = r.reload_topology().await;
            })),
        ];
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tasks);
    }

    fn backend_events(&self) -> broadcast::Receiver<BackendEvent> {
        self.inner.backend.events()
    }

    /// The configuration in force.
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }

    /// Whether the backend answered the last call.
    pub fn backend_up(&self) -> bool {
        self.inner.health.is_up()
    }

    // ---- topology ----------------------------------------------------------------

    /// The current topology: one lock-free load, for the proxy's hot path.
    pub fn topology(&self) -> Arc<Topology> {
        self.inner.topology.load_full()
    }

    /// A receiver that sees every new topology snapshot.
    pub fn watch_topology(&self) -> watch::Receiver<Arc<Topology>> {
        self.inner.topology_tx.subscribe()
    }

    fn install_topology(&self, next: Topology) {
        let current = self.inner.topology.load();
        if **current == next {
            return;
        }
        // An empty version-0 topology where we had one means Redis lost its data:
        // keep routing on the last good snapshot until someone writes a new one.
        if next.version == 0 && next.pods.is_empty() && current.version > 0 {
            if !self
                .inner
                .empty_logged
                .swap(true, std::sync::atomic::Ordering::AcqRel)
            {
                tracing::warn!(
                    kept_version = current.version,
                    "registry holds no topology (Redis restarted empty?); keeping the last good snapshot"
                );
            }
            return;
        }
        self.inner
            .empty_logged
            .store(false, std::sync::atomic::Ordering::Release);
        self.metrics().topology_version.set(next.version as i64);
        let next = Arc::new(next);
        self.inner.topology.store(next.clone());
        self.inner.topology_tx.send_replace(next);
    }

    /// Re-read the topology from the backend; on failure the last snapshot stays.
    pub async fn reload_topology(&self) -> Result<Arc<Topology>> {
        if self.inner.read_only_topology {
            return Ok(self.topology());
        }
        let t = self.inner.backend.load_topology().await?;
        self.install_topology(t);
        Ok(self.topology())
    }

    /// Apply one change; returns the new snapshot (already in force here).
    pub async fn update_topology(&self, change: TopologyChange) -> Result<Arc<Topology>> {
        if self.inner.read_only_topology {
            return Err(Error::ReadOnly);
        }
        let next = self.inner.backend.update_topology(&change).await?;
        self.install_topology(next);
        Ok(self.topology())
    }

    /// Add or replace a Pod.
    pub async fn put_pod(&self, pod: Pod) -> Result<Arc<Topology>> {
        self.update_topology(TopologyChange::Put(Box::new(pod)))
            .await
    }

    /// Remove a Pod.
    pub async fn remove_pod(&self, id: PodId) -> Result<Arc<Topology>> {
        self.update_topology(TopologyChange::Remove(id)).await
    }

    /// Change a Pod's state (drain, undrain, down).
    pub async fn set_pod_state(&self, id: PodId, state: PodState) -> Result<Arc<Topology>> {
        self.update_topology(TopologyChange::SetState(id, state))
            .await
    }

    /// Choose the default ("legacy") Pod.
    pub async fn set_default_pod(&self, id: Option<PodId>) -> Result<Arc<Topology>> {
        self.update_topology(TopologyChange::SetDefault(id)).await
    }

    /// This registry's own metrics.
    pub fn metrics(&self) -> &RegistryMetrics {
        self.inner.health.metrics()
    }

    /// Register this registry's metrics in `into` (the Prometheus registry the
    /// process serves on `/metrics`). Fails if `into` already holds another
    /// registry's.
    pub fn register_metrics(&self, into: &prometheus::Registry) -> prometheus::Result<()> {
        self.metrics().register(into)
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.inner.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ttl_ms(&self) -> u64 {
        self.inner.config.ttl.as_millis() as u64
    }

    /// Test support: every stored entry in the memory backend, expired or not.
    #[doc(hidden)]
    pub fn memory_raw_len(&self) -> Option<usize> {
        self.inner.backend.raw_len()
    }
}
