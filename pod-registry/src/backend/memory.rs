//! The in-memory backend: one process, nothing to install. Clones share state, so two
//! `Registry` handles built on one `MemoryBackend` behave like two kas on one Redis.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::broadcast;

use super::{Backend, BackendEvent, TopologyChange};
use crate::error::Result;
use crate::presence::{
    AgentConnection, AgentEvent, Expiring, KasAddress, KasInstance, OwnedConn, now_ms,
};
use crate::topology::Topology;

#[derive(Default)]
struct State {
    topology: Topology,
    by_agent: HashMap<i64, HashMap<i64, Expiring<AgentConnection>>>,
    by_project: HashMap<i64, HashMap<(i64, i64), Expiring<AgentConnection>>>,
    agent_kas: HashMap<i64, HashMap<KasAddress, u64>>,
    kas: HashMap<KasAddress, Expiring<KasInstance>>,
}

/// Registry state held in this process.
#[derive(Clone)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<BackendEvent>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new(Topology::default())
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend").finish_non_exhaustive()
    }
}

impl MemoryBackend {
    /// A new, empty store seeded with `topology`.
    pub fn new(topology: Topology) -> Self {
        MemoryBackend {
            state: Arc::new(Mutex::new(State {
                topology,
                ..State::default()
            })),
            events: broadcast::channel(1024).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way
        // readers would misread (each update is a few inserts), so recover the guard.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, e: BackendEvent) {
        // No subscribers is fine.
        let _ = self.events.send(e);
    }
}

/// Every call takes the one lock for a few map operations and never fails.
#[async_trait::async_trait]
impl Backend for MemoryBackend {
    fn events(&self) -> broadcast::Receiver<BackendEvent> {
        self.events.subscribe()
    }

    async fn publish_kas_event(&self, payload: &[u8]) -> Result<()> {
        self.publish(BackendEvent::Kas(payload.into()));
        Ok(())
    }

    async fn load_topology(&self) -> Result<Topology> {
        Ok(self.lock().topology.clone())
    }

    async fn update_topology(&self, change: &TopologyChange) -> Result<Topology> {
        let next = {
            let mut s = self.lock();
            let next = change.apply(&s.topology)?;
            s.topology = next.clone();
            next
        };
        self.publish(BackendEvent::Topology(next.version));
        Ok(next)
    }

    async fn register(&self, owned: &OwnedConn, ttl_ms: u64) -> Result<()> {
        let exp = now_ms() + ttl_ms;
        write_conn(&mut self.lock(), &owned.conn, exp);
        self.publish(BackendEvent::Agent(AgentEvent::connected(&owned.conn)));
        Ok(())
    }

    async fn unregister(&self, conn: &AgentConnection, drop_holding: bool) -> Result<()> {
        {
            let mut s = self.lock();
            if let Some(m) = s.by_agent.get_mut(&conn.agent_id) {
                m.remove(&conn.connection_id);
            }
            if let Some(m) = s.by_project.get_mut(&conn.project_id) {
                m.remove(&(conn.agent_id, conn.connection_id));
            }
            if drop_holding && let Some(m) = s.agent_kas.get_mut(&conn.agent_id) {
                m.remove(&conn.kas);
            }
        }
        self.publish(BackendEvent::Agent(AgentEvent::disconnected(conn)));
        Ok(())
    }

    async fn put_kas_instance(&self, i: &KasInstance, ttl_ms: u64) -> Result<()> {
        put_instance(&mut self.lock(), i, now_ms() + ttl_ms);
        Ok(())
    }

    async fn remove_kas_instance(&self, addr: &KasAddress) -> Result<()> {
        self.lock().kas.remove(addr);
        Ok(())
    }

    async fn refresh(
        &self,
        conns: &[Arc<OwnedConn>],
        instance: Option<&KasInstance>,
        ttl_ms: u64,
    ) -> Result<()> {
        let exp = now_ms() + ttl_ms;
        let mut s = self.lock();
        for c in conns {
            write_conn(&mut s, &c.conn, exp);
        }
        if let Some(i) = instance {
            put_instance(&mut s, i, exp);
        }
        Ok(())
    }

    /// Removes every expired entry, not only those of `owned`: one process holds
    /// the whole store.
    async fn gc(&self, _owned: &[(i64, i64)]) -> Result<usize> {
        let now = now_ms();
        let mut s = self.lock();
        let mut removed = 0;
        for m in s.by_agent.values_mut() {
            let before = m.len();
            m.retain(|_, e| e.expires_at_ms > now);
            removed += before - m.len();
        }
        for m in s.by_project.values_mut() {
            let before = m.len();
            m.retain(|_, e| e.expires_at_ms > now);
            removed += before - m.len();
        }
        for m in s.agent_kas.values_mut() {
            let before = m.len();
            m.retain(|_, exp| *exp > now);
            removed += before - m.len();
        }
        let before = s.kas.len();
        s.kas.retain(|_, e| e.expires_at_ms > now);
        removed += before - s.kas.len();
        s.by_agent.retain(|_, m| !m.is_empty());
        s.by_project.retain(|_, m| !m.is_empty());
        s.agent_kas.retain(|_, m| !m.is_empty());
        Ok(removed)
    }

    async fn by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>> {
        let now = now_ms();
        let s = self.lock();
        Ok(live(s.by_agent.get(&agent_id).map(|m| m.values()), now))
    }

    async fn by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        let now = now_ms();
        let s = self.lock();
        Ok(live(s.by_project.get(&project_id).map(|m| m.values()), now))
    }

    async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
        let now = now_ms();
        let s = self.lock();
        let mut out: Vec<KasAddress> = s
            .agent_kas
            .get(&agent_id)
            .into_iter()
            .flatten()
            .filter(|(_, exp)| **exp > now)
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        Ok(out)
    }

    async fn kas_instances(&self) -> Result<Vec<KasInstance>> {
        let now = now_ms();
        let s = self.lock();
        let mut out: Vec<KasInstance> = s
            .kas
            .values()
            .filter(|e| e.expires_at_ms > now)
            .map(|e| e.value.clone())
            .collect();
        out.sort_by(|a, b| a.address.cmp(&b.address));
        Ok(out)
    }

    fn raw_len(&self) -> Option<usize> {
        let s = self.lock();
        Some(
            s.by_agent.values().map(HashMap::len).sum::<usize>()
                + s.by_project.values().map(HashMap::len).sum::<usize>()
                + s.agent_kas.values().map(HashMap::len).sum::<usize>()
                + s.kas.len(),
        )
    }
}

fn write_conn(s: &mut State, conn: &AgentConnection, exp: u64) {
    let e = Expiring {
        expires_at_ms: exp,
        value: conn.clone(),
    };
    s.by_agent
        .entry(conn.agent_id)
        .or_default()
        .insert(conn.connection_id, e.clone());
    s.by_project
        .entry(conn.project_id)
        .or_default()
        .insert((conn.agent_id, conn.connection_id), e);
    s.agent_kas
        .entry(conn.agent_id)
        .or_default()
        .insert(conn.kas.clone(), exp);
}

fn put_instance(s: &mut State, i: &KasInstance, exp: u64) {
    s.kas.insert(
        i.address.clone(),
        Expiring {
            expires_at_ms: exp,
            value: i.clone(),
        },
    );
}

fn live<'a>(
    entries: Option<impl Iterator<Item = &'a Expiring<AgentConnection>>>,
    now: u64,
) -> Vec<AgentConnection> {
    let mut out: Vec<AgentConnection> = entries
        .into_iter()
        .flatten()
        .filter(|e| e.expires_at_ms > now)
        .map(|e| e.value.clone())
        .collect();
    out.sort_by_key(|c| (c.agent_id, c.connection_id));
    out
}
