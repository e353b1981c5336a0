//! Storage behind the registry: the `Backend` trait, one set of operations, and
//! its two implementations, in memory ([`memory`]) and on Redis ([`redis`]).

use std::sync::Arc;

use podgate_tokens::PodId;
use tokio::sync::broadcast;

use crate::error::Result;
use crate::presence::{AgentConnection, AgentEvent, KasAddress, KasInstance, OwnedConn};
use crate::topology::{Pod, PodState, Topology};

pub mod memory;
pub mod redis;

/// What the [`Registry`](crate::Registry) asks of its storage. Every call that
/// reaches Redis is fallible and transient on failure ([`crate::Error::Backend`]);
/// the in-memory backend never fails a presence call.
///
/// The registry holds its backend as an `Arc<dyn Backend>`: a call costs one
/// virtual dispatch and one boxed future, nothing next to a Redis round trip or
/// the memory backend's lock and clones, and [`Registry`](crate::Registry) stays
/// one concrete type for the crates that hold it. The proxy's hot path,
/// [`Registry::topology`](crate::Registry::topology), is an `ArcSwap` load that
/// never reaches the backend.
#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// Change events (presence, topology versions, resync after a reconnect).
    fn events(&self) -> broadcast::Receiver<BackendEvent>;

    /// The stored topology (empty, version 0, if none was ever written).
    async fn load_topology(&self) -> Result<Topology>;
    /// Apply `change` to the stored topology; returns the new snapshot.
    async fn update_topology(&self, change: &TopologyChange) -> Result<Topology>;

    /// Store one connection with an expiry `ttl_ms` from now, and announce it.
    async fn register(&self, owned: &OwnedConn, ttl_ms: u64) -> Result<()>;
    /// Remove one connection (and, when `drop_holding`, this kas's holding of the
    /// agent), and announce it.
    async fn unregister(&self, conn: &AgentConnection, drop_holding: bool) -> Result<()>;
    /// Store this kas instance with an expiry `ttl_ms` from now.
    async fn put_kas_instance(&self, instance: &KasInstance, ttl_ms: u64) -> Result<()>;
    /// Remove a kas instance.
    async fn remove_kas_instance(&self, addr: &KasAddress) -> Result<()>;
    /// Give everything this process owns a new expiry `ttl_ms` from now.
    async fn refresh(
        &self,
        conns: &[Arc<OwnedConn>],
        instance: Option<&KasInstance>,
        ttl_ms: u64,
    ) -> Result<()>;
    /// Remove expired entries of the keys this process writes (`owned` lists its
    /// (project, agent) pairs); returns how many went.
    async fn gc(&self, owned: &[(i64, i64)]) -> Result<usize>;

    /// Live connections of an agent, sorted by (agent, connection).
    async fn by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>>;
    /// Live connections of every agent of a project, sorted by (agent, connection).
    async fn by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>>;
    /// The kas instances holding a live connection of an agent, sorted.
    async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>>;
    /// Every live kas instance, sorted by address.
    async fn kas_instances(&self) -> Result<Vec<KasInstance>>;
    /// Send `payload` to every kas on this store (itself included) as a
    /// [`BackendEvent::Kas`].
    async fn publish_kas_event(&self, payload: &[u8]) -> Result<()>;

    /// Test support: every stored entry, expired or not (the memory backend only).
    fn raw_len(&self) -> Option<usize> {
        None
    }
}

/// What a backend tells its subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BackendEvent {
    /// Presence changed somewhere.
    Agent(AgentEvent),
    /// A kas published an event for every kas (GitLab's `kas_events`).
    Kas(Arc<[u8]>),
    /// The topology reached this version.
    Topology(u64),
    /// Events may have been lost (reconnect): re-read state.
    Resync,
}

/// One change to the topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyChange {
    /// Add or replace a Pod (boxed: a Pod is large beside the other changes).
    Put(Box<Pod>),
    /// Remove a Pod.
    Remove(PodId),
    /// Change a Pod's state.
    SetState(PodId, PodState),
    /// Choose the default ("legacy") Pod.
    SetDefault(Option<PodId>),
}

impl TopologyChange {
    /// Apply to a snapshot, giving the next one (version + 1).
    pub(crate) fn apply(&self, t: &Topology) -> crate::Result<Topology> {
        let mut next = t.clone();
        next.version = t.version + 1;
        match self {
            TopologyChange::Put(pod) => {
                let problems = pod.problems(&format!("pod {}", pod.id));
                if !problems.is_empty() {
                    return Err(crate::Error::Config {
                        origin: "pod".into(),
                        problems,
                    });
                }
                next.pods.insert(pod.id, Arc::new((**pod).clone()));
            }
            TopologyChange::Remove(id) => {
                next.pods.remove(id).ok_or(crate::Error::NoSuchPod(*id))?;
                if next.default_pod == Some(*id) {
                    next.default_pod = None;
                }
            }
            TopologyChange::SetState(id, state) => {
                let pod = next.pods.get_mut(id).ok_or(crate::Error::NoSuchPod(*id))?;
                Arc::make_mut(pod).state = *state;
            }
            TopologyChange::SetDefault(id) => {
                if let Some(id) = id
                    && !next.pods.contains_key(id)
                {
                    return Err(crate::Error::NoSuchPod(*id));
                }
                next.default_pod = *id;
            }
        }
        let problems = next.problems();
        if !problems.is_empty() {
            return Err(crate::Error::Config {
                origin: "topology".into(),
                problems,
            });
        }
        Ok(next)
    }
}
