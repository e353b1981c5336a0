//! The refresh: everything this process owns gets new expiries and key TTLs, in
//! pipelines grouped by Cluster slot, several in flight. Agent hashes that lost
//! their data are repaired from the replies.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::{StreamExt as _, stream};
use redis::{Cmd, Pipeline};

use super::RedisBackend;
use super::conn::{Conn, SlotGroup};
use super::keys::{
    POINTER_BUCKETS, conn_field, corrupt, exp_field, holding_value, kas_field, member_field,
    pointer_value,
};
use super::presence::hset_pexpire;
use crate::error::{Error, Result};
use crate::presence::{Expiring, KasInstance, OwnedConn, now_ms};

/// Commands per pipeline when refreshing.
const REFRESH_BATCH: usize = 20_000;
/// Connections per refresh chunk (a chunk is built while earlier ones are sent).
const REFRESH_CHUNK: usize = 2_000;

/// An agent hash's refresh commands and the connections they renew.
type AgentWrite = (Vec<Cmd>, Vec<Arc<OwnedConn>>);

/// One refresh pipeline: plain (replies ignored), or agent hashes whose replies
/// tell which agents lost their data and need their connection JSON again.
enum Job {
    Plain(Pipeline),
    Agents(Pipeline, Vec<Vec<Arc<OwnedConn>>>),
}

impl RedisBackend {
    /// Renew everything this process owns: new expiries and key TTLs. Cost grows
    /// with what is owned, never with the keyspace.
    ///
    /// Connections are sorted by (project, agent) and sent in chunks, each built while
    /// earlier ones are in flight: one `HSET` + `PEXPIRE` per key. Agent hashes get
    /// only their small `exp:<id>` values; `HSET` answers how many fields it created,
    /// and a created `exp:` field means the hash lost data (Redis restarted, evicted
    /// or flushed it), so that agent's connection JSON is written again at once.
    pub(super) async fn refresh(
        &self,
        conns: &[Arc<OwnedConn>],
        instance: Option<&KasInstance>,
        ttl_ms: u64,
    ) -> Result<()> {
        let exp = now_ms() + ttl_ms;
        let mut sorted: Vec<Arc<OwnedConn>> = conns.to_vec();
        sorted.sort_unstable_by_key(|c| (c.conn.project_id, c.conn.agent_id, c.conn.connection_id));
        let limit = match self.conn {
            Conn::Single(_) => 4,
            Conn::Cluster(_) => 16,
        };
        let mut inflight = stream::FuturesUnordered::new();
        let mut first_err: Option<Error> = None;
        let mut pending: Vec<Job> = Vec::new();
        if let Some(i) = instance {
            let value = serde_json::to_vec(&Expiring {
                expires_at_ms: exp,
                value: i.clone(),
            })
            .map_err(|e| corrupt("kas instance", e))?;
            let key = self.keys.kas_instances();
            let cmds = hset_pexpire(&key, [(i.address.0.as_bytes(), &value[..])], ttl_ms);
            pending.extend(self.batches(vec![(key, cmds)]).into_iter().map(Job::Plain));
        }
        let mut chunks = sorted.chunks(REFRESH_CHUNK);
        let mut pointers_done = false;
        loop {
            if pending.is_empty() {
                match chunks.next() {
                    Some(chunk) => pending = self.chunk_jobs(chunk, exp, ttl_ms),
                    None if !pointers_done => {
                        pointers_done = true;
                        let writes = self.pointer_writes(&sorted, exp, ttl_ms);
                        pending = self.batches(writes).into_iter().map(Job::Plain).collect();
                    }
                    None => break,
                }
            }
            while let Some(job) = pending.pop() {
                while inflight.len() >= limit {
                    if let Some(Err(e)) = inflight.next().await {
                        first_err.get_or_insert(e);
                    }
                }
                inflight.push(self.send_job(job));
            }
        }
        while let Some(r) = inflight.next().await {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Send one refresh job; the future owns everything it needs.
    fn send_job(&self, job: Job) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let mut conn = self.conn.clone();
        let health = self.health.clone();
        let keys = self.keys.clone();
        async move {
            let res = match job {
                Job::Plain(p) => p.query_async::<()>(&mut conn).await,
                Job::Agents(p, groups) => {
                    async {
                        let replies: Vec<i64> = p.query_async(&mut conn).await?;
                        // Replies come in (HSET, PEXPIRE) pairs, one pair per agent.
                        let mut repair = redis::pipe();
                        let mut n = 0;
                        for (group, created) in groups.iter().zip(replies.iter().step_by(2)) {
                            if *created > 0 {
                                let first = &group[0].conn;
                                let mut hset = redis::cmd("HSET");
                                hset.arg(keys.agent(first.project_id, first.agent_id));
                                for c in group {
                                    hset.arg(conn_field(c.conn.connection_id)).arg(&c.json);
                                }
                                repair.add_command(hset).ignore();
                                n += 1;
                            }
                        }
                        if n > 0 {
                            repair.query_async::<()>(&mut conn).await?;
                        }
                        Ok(())
                    }
                    .await
                }
            }
            .map_err(Error::backend("refresh"));
            health.record("refresh", &res);
            res
        }
    }

    /// The jobs for one chunk of connections sorted by (project, agent): project
    /// memberships (plain), and agent hashes (expiries, with repair on data loss).
    fn chunk_jobs(&self, chunk: &[Arc<OwnedConn>], exp: u64, ttl_ms: u64) -> Vec<Job> {
        let k = &self.keys;
        let member = holding_value(exp);
        let exp_text = exp.to_string();
        let mut plain: Vec<(String, Vec<Cmd>)> = Vec::new();
        let mut agents: Vec<(String, Vec<Cmd>, Vec<Arc<OwnedConn>>)> = Vec::new();
        let mut i = 0;
        while i < chunk.len() {
            let project = chunk[i].conn.project_id;
            let mut members: Vec<String> = Vec::new();
            while i < chunk.len() && chunk[i].conn.project_id == project {
                let agent = chunk[i].conn.agent_id;
                let mut fields: Vec<(String, &str)> = Vec::new();
                let mut group = Vec::new();
                while i < chunk.len()
                    && chunk[i].conn.project_id == project
                    && chunk[i].conn.agent_id == agent
                {
                    let c = &chunk[i];
                    fields.push((exp_field(c.conn.connection_id), exp_text.as_str()));
                    let holding = kas_field(&c.conn.kas);
                    if !fields.iter().any(|(f, _)| *f == holding) {
                        fields.push((holding, member.as_str()));
                    }
                    members.push(member_field(&c.conn));
                    group.push(c.clone());
                    i += 1;
                }
                let key = k.agent(project, agent);
                let cmds = hset_pexpire(
                    &key,
                    fields.iter().map(|(f, v)| (f.as_bytes(), v.as_bytes())),
                    ttl_ms,
                );
                agents.push((key, cmds, group));
            }
            let key = k.project(project);
            let cmds = hset_pexpire(
                &key,
                members.iter().map(|f| (f.as_bytes(), member.as_bytes())),
                ttl_ms,
            );
            plain.push((key, cmds));
        }
        let mut jobs: Vec<Job> = self.batches(plain).into_iter().map(Job::Plain).collect();
        // Agent hashes, grouped by slot (a Cluster pipeline stays within one slot).
        let mut by_slot: HashMap<SlotGroup, Vec<AgentWrite>> = HashMap::new();
        for (key, cmds, group) in agents {
            by_slot
                .entry(self.conn.slot_of(&key))
                .or_default()
                .push((cmds, group));
        }
        for (_, entries) in by_slot {
            let mut p = redis::pipe();
            let mut groups = Vec::new();
            for (cmds, group) in entries {
                for c in cmds {
                    p.add_command(c);
                }
                groups.push(group);
                if groups.len() * 2 >= REFRESH_BATCH {
                    jobs.push(Job::Agents(
                        std::mem::take(&mut p),
                        std::mem::take(&mut groups),
                    ));
                }
            }
            if !groups.is_empty() {
                jobs.push(Job::Agents(p, groups));
            }
        }
        jobs
    }

    /// Every owned agent's pointer, grouped by bucket: one `HSET` + `PEXPIRE` each.
    fn pointer_writes(
        &self,
        sorted: &[Arc<OwnedConn>],
        exp: u64,
        ttl_ms: u64,
    ) -> Vec<(String, Vec<Cmd>)> {
        let mut buckets: HashMap<i64, Vec<(String, String)>> = HashMap::new();
        let mut last = None;
        for c in sorted {
            let (a, p) = (c.conn.agent_id, c.conn.project_id);
            if last == Some((a, p)) {
                continue;
            }
            last = Some((a, p));
            buckets
                .entry(a.rem_euclid(POINTER_BUCKETS))
                .or_default()
                .push((a.to_string(), pointer_value(p, exp)));
        }
        buckets
            .into_values()
            .map(|fields| {
                let key = self.keys.pointers(fields[0].0.parse().unwrap_or(0));
                let cmds = hset_pexpire(
                    &key,
                    fields.iter().map(|(f, v)| (f.as_bytes(), v.as_bytes())),
                    ttl_ms,
                );
                (key, cmds)
            })
            .collect()
    }

    /// Pack per-key writes into pipelines of at most [`REFRESH_BATCH`] commands. A
    /// Cluster pipeline must stay within one slot, so there keys are grouped by slot.
    fn batches(&self, writes: Vec<(String, Vec<Cmd>)>) -> Vec<Pipeline> {
        let mut groups: HashMap<SlotGroup, Vec<Vec<Cmd>>> = HashMap::new();
        for (key, cmds) in writes {
            groups
                .entry(self.conn.slot_of(&key))
                .or_default()
                .push(cmds);
        }
        let mut out = Vec::new();
        for (_, keys) in groups {
            let mut p = redis::pipe();
            let mut n = 0;
            for cmds in keys {
                for c in cmds {
                    p.add_command(c).ignore();
                    n += 1;
                }
                if n >= REFRESH_BATCH {
                    out.push(std::mem::take(&mut p));
                    n = 0;
                }
            }
            if n > 0 {
                out.push(p);
            }
        }
        out
    }
}
