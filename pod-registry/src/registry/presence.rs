//! The presence half of [`Registry`]: registering what this process holds (owned,
//! refreshed, removed at shutdown), lookups across every kas, waiting for an
//! agent, and the periodic refresh and GC.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::broadcast;

use super::Registry;
use crate::error::{Error, Result};
use crate::presence::{AgentConnection, AgentEvent, KasAddress, KasInstance, OwnedConn};

impl Registry {
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
        let res = self.inner.backend.register(&owned, ttl).await;
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
        self.inner
            .backend
            .unregister(&conn.conn, drop_holding)
            .await?;
        Ok(true)
    }

    /// Register this kas instance (owned, refreshed, removed at shutdown).
    pub async fn register_kas(&self, info: KasInstance) -> Result<()> {
        self.owned().kas = Some(info.clone());
        let ttl = self.ttl_ms();
        self.inner.backend.put_kas_instance(&info, ttl).await
    }

    /// Live connections of an agent, on every kas.
    pub async fn connections_by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>> {
        self.inner.backend.by_agent(agent_id).await
    }

    /// Live connections of every agent of a configuration project.
    pub async fn connections_by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        self.inner.backend.by_project(project_id).await
    }

    /// The kas instances holding at least one connection of an agent.
    pub async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
        self.inner.backend.kas_for_agent(agent_id).await
    }

    /// Every live kas instance.
    pub async fn kas_instances(&self) -> Result<Vec<KasInstance>> {
        self.inner.backend.kas_instances().await
    }

    /// Publish `payload` to every kas on this registry's store, this one included
    /// ([`Self::kas_events`]). On Redis it is `PUBLISH kas_events`, as GitLab's kas
    /// publishes its events; the memory store hands it to the registries sharing it.
    pub async fn publish_kas_event(&self, payload: &[u8]) -> Result<()> {
        self.inner.backend.publish_kas_event(payload).await
    }

    /// The events kas instances publish ([`Self::publish_kas_event`]), as they
    /// arrive. Pub/sub delivers at most once: events published while the
    /// subscription was down are lost.
    pub fn kas_events(&self) -> broadcast::Receiver<Arc<[u8]>> {
        self.inner.kas_events.subscribe()
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
        self.inner
            .backend
            .refresh(&conns, kas.as_ref(), ttl)
            .await?;
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
        let removed = self.inner.backend.gc(&owned).await?;
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
        if let Some(k) = kas
            && let Err(e) = self.inner.backend.remove_kas_instance(&k.address).await
        {
            first_err.get_or_insert(e);
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
