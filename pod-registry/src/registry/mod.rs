//! [`Registry`]: the one handle the proxy and kas use. It owns what this process
//! registered, keeps it refreshed, serves topology snapshots lock-free, and wakes
//! waiters on presence events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::backend::memory::MemoryBackend;
use crate::backend::redis::{RedisBackend, RedisTarget};
use crate::backend::{BackendEvent, TopologyChange};
use crate::error::{Error, Result};
use crate::metrics::{Health, RegistryMetrics};
use crate::presence::{AgentConnection, AgentEvent, KasAddress, KasInstance, OwnedConn};
use crate::topology::{Pod, PodState, Topology, TopologyFile};
use podgate_tokens::PodId;
use tasks::{event_pump, every};

mod config;
mod tasks;

pub use config::{BackendConfig, RegistryConfig};

#[derive(Clone)]
enum Backend {
    Memory(MemoryBackend),
    Redis(RedisBackend),
}

#[derive(Default)]
struct Owned {
    conns: HashMap<(i64, i64), Arc<OwnedConn>>,
    kas: Option<KasInstance>,
}

struct Inner {
    backend: Backend,
    config: RegistryConfig,
    read_only_topology: bool,
    topology: ArcSwap<Topology>,
    topology_tx: watch::Sender<Arc<Topology>>,
    owned: Mutex<Owned>,
    events: broadcast::Sender<AgentEvent>,
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
        let backend = match target {
            None => Backend::Memory(MemoryBackend::new(
                file.as_ref().map(|f| f.to_topology(1)).unwrap_or_default(),
            )),
            Some(target) => {
                Backend::Redis(RedisBackend::connect(&target, &config, health.clone()).await?)
            }
        };
        Ok(Self::start(backend, config, file, health).await)
    }

    /// A registry on a shared in-memory store: registries built on clones of one
    /// `MemoryBackend` see each other's registrations and events.
    pub async fn with_memory(backend: MemoryBackend, config: RegistryConfig) -> Result<Registry> {
        config.validate()?;
        let health = Arc::new(Health::new(Arc::new(RegistryMetrics::new())));
        Ok(Self::start(Backend::Memory(backend), config, None, health).await)
    }

    async fn start(
        backend: Backend,
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
        match &self.inner.backend {
            Backend::Memory(m) => m.events(),
            Backend::Redis(r) => r.events(),
        }
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
        let t = match &self.inner.backend {
            Backend::Memory(m) => m.load_topology(),
            Backend::Redis(r) => r.load_topology().await?,
        };
        self.install_topology(t);
        Ok(self.topology())
    }

    /// Apply one change; returns the new snapshot (already in force here).
    pub async fn update_topology(&self, change: TopologyChange) -> Result<Arc<Topology>> {
        if self.inner.read_only_topology {
            return Err(Error::ReadOnly);
        }
        let next = match &self.inner.backend {
            Backend::Memory(m) => m.update_topology(&change)?,
            Backend::Redis(r) => r.update_topology(&change).await?,
        };
        self.install_topology(next);
        Ok(self.topology())
    }

    /// Add or replace a Pod.
    pub async fn put_pod(&self, pod: Pod) -> Result<Arc<Topology>> {
        self.update_topology(TopologyChange::Put(pod)).await
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

    // ---- presence ----------------------------------------------------------------

    /// Register an agent connection this process holds. It is owned from the moment
    /// the backend has it: refreshed until unregistered and removed at shutdown.
    ///
    /// If the write fails, or this future is dropped before it finishes (the caller
    /// was cancelled), the connection is not owned: nothing refreshes it, and what
    /// may have reached the backend expires within the TTL. The caller, who got an
    /// error (or nothing), has not handed the connection to anyone; it would
    /// otherwise be refreshed forever with no stream behind it (a ghost `GetPods`
    /// is routed to).
    pub async fn register_agent(&self, conn: AgentConnection) -> Result<()> {
        let owned = Arc::new(OwnedConn::new(conn));
        let key = (owned.conn.agent_id, owned.conn.connection_id);
        // Owned before the write, so a refresh that runs during it rewrites it too;
        // disowned again unless the write completes.
        {
            let mut o = self.owned();
            o.conns.insert(key, owned.clone());
            self.metrics().owned_connections.set(o.conns.len() as i64);
        }
        let mut pending = Pending {
            registry: self,
            key,
            conn: Some(owned.clone()),
        };
        let ttl = self.ttl_ms();
        let res = match &self.inner.backend {
            Backend::Memory(m) => {
                m.register(&owned.conn, ttl);
                Ok(())
            }
            Backend::Redis(r) => r.register(&owned, ttl).await,
        };
        if res.is_ok() {
            pending.conn = None;
        }
        res
    }

    /// Unregister a connection this process registered. Returns whether it was owned.
    pub async fn unregister_agent(&self, agent_id: i64, connection_id: i64) -> Result<bool> {
        let (conn, drop_holding) = {
            let mut o = self.owned();
            let Some(conn) = o.conns.remove(&(agent_id, connection_id)) else {
                return Ok(false);
            };
            self.inner
                .health
                .metrics()
                .owned_connections
                .set(o.conns.len() as i64);
            let others = o
                .conns
                .values()
                .any(|c| c.conn.agent_id == agent_id && c.conn.kas == conn.conn.kas);
            (conn, !others)
        };
        match &self.inner.backend {
            Backend::Memory(m) => m.unregister(&conn.conn, drop_holding),
            Backend::Redis(r) => r.unregister(&conn.conn, drop_holding).await?,
        }
        Ok(true)
    }

    /// Register this kas instance (owned, refreshed, removed at shutdown).
    pub async fn register_kas(&self, info: KasInstance) -> Result<()> {
        self.owned().kas = Some(info.clone());
        let ttl = self.ttl_ms();
        match &self.inner.backend {
            Backend::Memory(m) => {
                m.put_kas_instance(&info, ttl);
                Ok(())
            }
            Backend::Redis(r) => r.put_kas_instance(&info, ttl).await,
        }
    }

    /// Live connections of an agent, on every kas.
    pub async fn connections_by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>> {
        match &self.inner.backend {
            Backend::Memory(m) => Ok(m.by_agent(agent_id)),
            Backend::Redis(r) => r.by_agent(agent_id).await,
        }
    }

    /// Live connections of every agent of a configuration project.
    pub async fn connections_by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        match &self.inner.backend {
            Backend::Memory(m) => Ok(m.by_project(project_id)),
            Backend::Redis(r) => r.by_project(project_id).await,
        }
    }

    /// The kas instances holding at least one connection of an agent.
    pub async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
        match &self.inner.backend {
            Backend::Memory(m) => Ok(m.kas_for_agent(agent_id)),
            Backend::Redis(r) => r.kas_for_agent(agent_id).await,
        }
    }

    /// Every live kas instance.
    pub async fn kas_instances(&self) -> Result<Vec<KasInstance>> {
        match &self.inner.backend {
            Backend::Memory(m) => Ok(m.kas_instances()),
            Backend::Redis(r) => r.kas_instances().await,
        }
    }

    /// Presence events (connects, disconnects, and `Resync` when some may be lost).
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.inner.events.subscribe()
    }

    /// Resolve with the agent's connections as soon as it is connected on any kas,
    /// or fail with [`Error::AgentNotConnected`] at `deadline`. Woken by the connect
    /// event; `wait_recheck_interval` is only a safety net. Backend errors while
    /// waiting are not fatal: the wait goes on until the deadline.
    pub async fn wait_for_agent(
        &self,
        agent_id: i64,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<AgentConnection>> {
        let started = Instant::now();
        // Subscribe before the first look, so a connect in between is not missed.
        let mut events = self.subscribe();
        let recheck = self.inner.config.wait_recheck_interval;
        loop {
            if let Ok(conns) = self.connections_by_agent(agent_id).await
                && !conns.is_empty()
            {
                return Ok(conns);
            }
            let next_check = tokio::time::Instant::now() + recheck;
            loop {
                tokio::select! {
                    ev = events.recv() => match ev {
                        Ok(AgentEvent::Connected { agent_id: a, .. }) if a == agent_id => break,
                        Ok(AgentEvent::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Closed) => {
                            tokio::time::sleep_until(next_check.min(deadline)).await;
                            break;
                        }
                    },
                    _ = tokio::time::sleep_until(next_check) => break,
                    _ = tokio::time::sleep_until(deadline) => {
                        return Err(Error::AgentNotConnected { agent_id, waited: started.elapsed() });
                    }
                }
            }
        }
    }

    /// Rewrite everything this process owns with a fresh expiry (the background task
    /// does this every `refresh_interval`).
    pub async fn refresh(&self) -> Result<usize> {
        let (conns, kas): (Vec<Arc<OwnedConn>>, Option<KasInstance>) = {
            let o = self.owned();
            (o.conns.values().cloned().collect(), o.kas.clone())
        };
        let timer = self.metrics().refresh_seconds.start_timer();
        let ttl = self.ttl_ms();
        match &self.inner.backend {
            Backend::Memory(m) => m.refresh(&conns, kas.as_ref(), ttl),
            Backend::Redis(r) => r.refresh(&conns, kas.as_ref(), ttl).await?,
        }
        timer.observe_duration();
        Ok(conns.len())
    }

    /// Remove expired entries in the keys this process writes (and, in memory,
    /// everywhere). Returns how many went.
    pub async fn gc(&self) -> Result<usize> {
        let owned: Vec<(i64, i64)> = self
            .owned()
            .conns
            .values()
            .map(|c| (c.conn.project_id, c.conn.agent_id))
            .collect();
        let removed = match &self.inner.backend {
            Backend::Memory(m) => m.gc(),
            Backend::Redis(r) => r.gc(&owned).await?,
        };
        self.metrics().gc_removed.inc_by(removed as u64);
        Ok(removed)
    }

    /// Stop background work and remove everything this process registered. Call it
    /// before exiting; other clones of this handle stop refreshing too.
    pub async fn shutdown(&self) -> Result<()> {
        for t in self
            .inner
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
        {
            t.abort();
        }
        let keys: Vec<(i64, i64)> = self.owned().conns.keys().copied().collect();
        let mut first_err = None;
        for (agent, conn) in keys {
            if let Err(e) = self.unregister_agent(agent, conn).await {
                first_err.get_or_insert(e);
            }
        }
        let kas = self.owned().kas.take();
        if let Some(k) = kas {
            match &self.inner.backend {
                Backend::Memory(m) => m.remove_kas_instance(&k.address),
                Backend::Redis(r) => {
                    if let Err(e) = r.remove_kas_instance(&k.address).await {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// How many connections this process owns.
    pub fn owned_connections(&self) -> usize {
        self.owned().conns.len()
    }

    /// The connections of `agent_id` this process owns (registered and keeps
    /// refreshing). Answered from this process's own state, with no backend call:
    /// it holds while the backend is down.
    pub fn owned_by_agent(&self, agent_id: i64) -> Vec<AgentConnection> {
        self.owned()
            .conns
            .values()
            .filter(|c| c.conn.agent_id == agent_id)
            .map(|c| c.conn.clone())
            .collect()
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
        match &self.inner.backend {
            Backend::Memory(m) => Some(m.raw_len()),
            Backend::Redis(_) => None,
        }
    }
}

/// A registration whose write has not completed: disowns the connection when
/// dropped unless `conn` was taken (the write succeeded).
struct Pending<'a> {
    registry: &'a Registry,
    key: (i64, i64),
    conn: Option<Arc<OwnedConn>>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let mut o = self.registry.owned();
        // Only this registration's entry: a newer one under the same key stays.
        if o.conns
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &conn))
        {
            o.conns.remove(&self.key);
            self.registry
                .metrics()
                .owned_connections
                .set(o.conns.len() as i64);
        }
    }
}
