//! The Redis backend: standalone (`redis://…`) or Cluster (several `redis://…` seeds).
//!
//! Keys are documented in the crate docs. Every multi-key transaction touches keys of
//! one hash tag (`{p:<project>}`), so it lives in one Cluster slot.
//!
//! One concern per file: the connection (`conn.rs`), the key schema and value
//! decoding (`keys.rs`), the Lua scripts (`scripts.rs`), the topology's
//! compare-and-set (`topology.rs`), presence writes (`presence.rs`) and reads
//! (`lookup.rs`), the refresh by slot (`refresh.rs`), kas instances (`kas.rs`), GC
//! (`gc.rs`) and the pub/sub subscriber (`subscriber.rs`). This file connects and
//! routes the registry's backend calls to them.

use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::{Backend, BackendEvent, TopologyChange};
use crate::error::{Error, Result};
use crate::metrics::Health;
use crate::presence::{AgentConnection, KasAddress, KasInstance, OwnedConn};
use crate::registry::RegistryConfig;
use crate::topology::Topology;
use conn::{Conn, client_for};
use keys::Keys;

mod conn;

pub use conn::Conn as RedisConn;
mod gc;
mod kas;
mod keys;
mod lookup;
mod presence;
mod refresh;
mod scripts;
mod subscriber;
mod topology;

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://host:port/db`.
    Standalone(String),
    /// A Cluster: one or more seed nodes.
    Cluster(Vec<String>),
}

/// Aborts the subscriber task when the last backend clone goes.
struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Registry state in Redis.
#[derive(Clone)]
pub struct RedisBackend {
    conn: Conn,
    keys: Keys,
    events: broadcast::Sender<BackendEvent>,
    health: Arc<Health>,
    gc_script: Arc<redis::Script>,
    cas_script: Arc<redis::Script>,
    _subscriber: Arc<TaskGuard>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connect to `target`. A standalone server may be down now (the connection is
    /// made lazily and re-made with back-off); a Cluster must answer once to map slots.
    pub(crate) async fn connect(
        target: &RedisTarget,
        config: &RegistryConfig,
        health: Arc<Health>,
    ) -> Result<Self> {
        let (prefix, backoff_max) = (&config.key_prefix, config.backoff_max);
        let conn = match target {
            RedisTarget::Standalone(url) => {
                let client = client_for(url)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.response_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(backoff_max);
                Conn::Single(
                    ConnectionManager::new_lazy_with_config(client, config)
                        .map_err(Error::backend("connect"))?,
                )
            }
            RedisTarget::Cluster(nodes) => {
                for n in nodes {
                    client_for(n)?;
                }
                let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(config.connect_timeout)
                    .response_timeout(config.response_timeout)
                    .build()
                    .map_err(Error::backend("connect"))?;
                Conn::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .map_err(Error::backend("connect"))?,
                )
            }
        };
        let keys = Keys::new(prefix);
        let (events, _) = broadcast::channel(4096);
        let task = tokio::spawn(subscriber::subscriber(
            target.clone(),
            keys.clone(),
            events.clone(),
            health.clone(),
            backoff_max,
        ));
        Ok(RedisBackend {
            conn,
            keys,
            events,
            health,
            gc_script: Arc::new(redis::Script::new(scripts::GC_SCRIPT)),
            cas_script: Arc::new(redis::Script::new(scripts::TOPOLOGY_CAS_SCRIPT)),
            _subscriber: Arc::new(TaskGuard(task)),
        })
    }

    /// Run a Redis call, record its outcome in health and metrics.
    async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let res = f(self.conn.clone()).await.map_err(Error::backend(op));
        self.health.record(op, &res);
        res
    }

    /// `PUBLISH channel payload` (recorded as op `publish`).
    async fn publish<P>(&self, channel: String, payload: P) -> Result<()>
    where
        P: redis::ToRedisArgs + Send,
    {
        self.run("publish", |mut c| async move {
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg(payload)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }
}

/// Each call goes to the inherent method of the same name, in the file of its
/// concern (inherent methods take precedence over trait methods).
#[async_trait::async_trait]
impl Backend for RedisBackend {
    fn events(&self) -> broadcast::Receiver<BackendEvent> {
        self.events.subscribe()
    }

    async fn publish_kas_event(&self, payload: &[u8]) -> Result<()> {
        self.publish_kas_event(payload).await
    }

    async fn load_topology(&self) -> Result<Topology> {
        self.load_topology().await
    }

    async fn update_topology(&self, change: &TopologyChange) -> Result<Topology> {
        self.update_topology(change).await
    }

    async fn register(&self, owned: &OwnedConn, ttl_ms: u64) -> Result<()> {
        self.register(owned, ttl_ms).await
    }

    async fn unregister(&self, conn: &AgentConnection, drop_holding: bool) -> Result<()> {
        self.unregister(conn, drop_holding).await
    }

    async fn put_kas_instance(&self, instance: &KasInstance, ttl_ms: u64) -> Result<()> {
        self.put_kas_instance(instance, ttl_ms).await
    }

    async fn remove_kas_instance(&self, addr: &KasAddress) -> Result<()> {
        self.remove_kas_instance(addr).await
    }

    async fn refresh(
        &self,
        conns: &[Arc<OwnedConn>],
        instance: Option<&KasInstance>,
        ttl_ms: u64,
    ) -> Result<()> {
        self.refresh(conns, instance, ttl_ms).await
    }

    async fn gc(&self, owned: &[(i64, i64)]) -> Result<usize> {
        self.gc(owned).await
    }

    async fn by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>> {
        self.by_agent(agent_id).await
    }

    async fn by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        self.by_project(project_id).await
    }

    async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
        self.kas_for_agent(agent_id).await
    }

    async fn kas_instances(&self) -> Result<Vec<KasInstance>> {
        self.kas_instances().await
    }
}
