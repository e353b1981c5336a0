//! Presence reads: an agent's connections and kas (its pointer, then its agent
//! hash: two round trips), and a project's connections (its index, then its
//! agents' hashes in one pipeline). Entries past their own expiry are skipped.

use super::RedisBackend;
use super::keys::{Empty, Pointer, decode};
use crate::error::Result;
use crate::presence::{AgentConnection, Expiring, KasAddress, now_ms};

impl RedisBackend {
    async fn project_of(&self, agent_id: i64) -> Result<Option<i64>> {
        let key = self.keys.pointers(agent_id);
        let raw: Option<Vec<u8>> = self
            .run("lookup", |mut c| {
                let key = key.clone();
                async move {
                    redis::cmd("HGET")
                        .arg(&key)
                        .arg(agent_id)
                        .query_async(&mut c)
                        .await
                }
            })
            .await?;
        // An expired pointer still names the right project; the entries it leads to
        // carry their own expiry.
        Ok(raw
            .and_then(|r| decode::<Expiring<Pointer>>(&key, &r, &self.health))
            .map(|p| p.value.project))
    }

    pub(super) async fn hgetall(&self, key: String) -> Result<Vec<(String, Vec<u8>)>> {
        self.run("lookup", |mut c| async move {
            redis::cmd("HGETALL").arg(key).query_async(&mut c).await
        })
        .await
    }

    /// Whether a membership or holding value (`{"expires_at_ms": …}`) stored under
    /// `key` is still live at `now`.
    fn holds(&self, key: &str, value: &[u8], now: u64) -> bool {
        decode::<Expiring<Empty>>(key, value, &self.health).is_some_and(|e| e.expires_at_ms > now)
    }

    pub(super) async fn by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>> {
        let Some(project) = self.project_of(agent_id).await? else {
            return Ok(Vec::new());
        };
        let key = self.keys.agent(project, agent_id);
        let raw = self.hgetall(key.clone()).await?;
        let mut out = self.live_conns(&key, raw);
        out.sort_by_key(|c| (c.agent_id, c.connection_id));
        Ok(out)
    }

    /// The project index names the live members; their details are in the agent
    /// hashes of the same slot, read in one pipeline.
    pub(super) async fn by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        let key = self.keys.project(project_id);
        let now = now_ms();
        let mut members: Vec<(i64, i64)> = self
            .hgetall(key.clone())
            .await?
            .into_iter()
            .filter(|(_, v)| self.holds(&key, v, now))
            .filter_map(|(f, _)| {
                let (a, c) = f.split_once(':')?;
                Some((a.parse().ok()?, c.parse().ok()?))
            })
            .collect();
        if members.is_empty() {
            return Ok(Vec::new());
        }
        members.sort_unstable();
        let mut agents: Vec<i64> = members.iter().map(|(a, _)| *a).collect();
        agents.dedup();
        let mut p = redis::pipe();
        for a in &agents {
            p.cmd("HGETALL").arg(self.keys.agent(project_id, *a));
        }
        let hashes: Vec<Vec<(String, Vec<u8>)>> = self
            .run("lookup", |mut c| async move { p.query_async(&mut c).await })
            .await?;
        let mut out: Vec<AgentConnection> = agents
            .iter()
            .zip(hashes)
            .flat_map(|(a, raw)| self.live_conns(&self.keys.agent(project_id, *a), raw))
            .filter(|c| {
                members
                    .binary_search(&(c.agent_id, c.connection_id))
                    .is_ok()
            })
            .collect();
        out.sort_by_key(|c| (c.agent_id, c.connection_id));
        Ok(out)
    }

    pub(super) async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
        let Some(project) = self.project_of(agent_id).await? else {
            return Ok(Vec::new());
        };
        let key = self.keys.agent(project, agent_id);
        let now = now_ms();
        let mut out: Vec<KasAddress> = self
            .hgetall(key.clone())
            .await?
            .into_iter()
            .filter_map(|(f, v)| Some((f.strip_prefix("kas:")?.to_owned(), v)))
            .filter(|(_, v)| self.holds(&key, v, now))
            .map(|(f, _)| KasAddress(f))
            .collect();
        out.sort();
        Ok(out)
    }

    /// The live connections of an agent hash: each `conn:<id>` whose `exp:<id>`
    /// lies in the future.
    fn live_conns(&self, key: &str, raw: Vec<(String, Vec<u8>)>) -> Vec<AgentConnection> {
        let now = now_ms();
        let mut live: Vec<&str> = Vec::new();
        for (f, v) in &raw {
            if let Some(id) = f.strip_prefix("exp:") {
                let exp = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok());
                match exp {
                    Some(exp) if exp > now => live.push(id),
                    Some(_) => {}
                    None => self.health.corrupt(key, "unreadable expiry"),
                }
            }
        }
        raw.iter()
            .filter_map(|(f, v)| Some((f.strip_prefix("conn:")?, v)))
            .filter(|(id, _)| live.contains(id))
            .filter_map(|(_, v)| decode::<AgentConnection>(key, v, &self.health))
            .collect()
    }
}
