//! The Redis backend: standalone (`redis://…`) or Cluster (several `redis://…` seeds).
//!
//! Keys are documented in the crate docs. Every multi-key transaction touches keys of
//! one hash tag (`{p:<project>}`), so it lives in one Cluster slot.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt as _, stream};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::{BackendEvent, TopologyChange};
use crate::error::{Error, Result};
use crate::metrics::Health;
use crate::presence::{
    AgentConnection, AgentEvent, Expiring, KasAddress, KasInstance, OwnedConn, now_ms,
};
use crate::registry::RegistryConfig;
use crate::topology::{Pod, Topology};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://host:port/db`.
    Standalone(String),
    /// A Cluster: one or more seed nodes.
    Cluster(Vec<String>),
}

/// Agent→project pointers live in this many hashes (`{a:<agent mod N>}:agents`), so
/// a refresh writes them with a few thousand commands, not one per agent.
pub(crate) const POINTER_BUCKETS: i64 = 1024;

/// Commands per pipeline when refreshing.
const REFRESH_BATCH: usize = 20_000;
/// Connections per refresh chunk (a chunk is built while earlier ones are sent).
const REFRESH_CHUNK: usize = 2_000;

/// `HSET key f v …` and `PEXPIRE key ttl`.
fn hset_pexpire<'a>(
    key: &str,
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ttl_ms: u64,
) -> Vec<Cmd> {
    let mut hset = redis::cmd("HSET");
    hset.arg(key);
    for (f, v) in fields {
        hset.arg(f).arg(v);
    }
    let mut pexpire = redis::cmd("PEXPIRE");
    pexpire.arg(key).arg(ttl_ms);
    vec![hset, pexpire]
}

/// The slot a Cluster pipeline is confined to (`None`: standalone, anything goes).
type SlotGroup = Option<redis::cluster_routing::Slot>;
/// An agent hash's refresh commands and the connections they renew.
type AgentWrite = (Vec<Cmd>, Vec<Arc<OwnedConn>>);

/// One refresh pipeline: plain (replies ignored), or agent hashes whose replies
/// tell which agents lost their data and need their connection JSON again.
enum Job {
    Plain(Pipeline),
    Agents(Pipeline, Vec<Vec<Arc<OwnedConn>>>),
}

/// The agent→kas index value.
fn holding_value(exp: u64) -> String {
    format!("{{\"expires_at_ms\":{exp}}}")
}

/// Key names, all under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }
    pub(crate) fn topology(&self) -> String {
        format!("{}:{{topology}}", self.prefix)
    }
    pub(crate) fn project(&self, project_id: i64) -> String {
        format!("{}:{{p:{project_id}}}:project", self.prefix)
    }
    pub(crate) fn agent(&self, project_id: i64, agent_id: i64) -> String {
        format!("{}:{{p:{project_id}}}:agent:{agent_id}", self.prefix)
    }
    pub(crate) fn pointers(&self, agent_id: i64) -> String {
        format!(
            "{}:{{a:{}}}:agents",
            self.prefix,
            agent_id.rem_euclid(POINTER_BUCKETS)
        )
    }
    pub(crate) fn kas_instances(&self) -> String {
        format!("{}:{{kas}}:instances", self.prefix)
    }
    pub(crate) fn agents_channel(&self) -> String {
        format!("{}:events:agents", self.prefix)
    }
    pub(crate) fn topology_channel(&self) -> String {
        format!("{}:events:topology", self.prefix)
    }
}

/// A connection to either kind of deployment; cheap to clone (multiplexed).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Removes every expired entry of one hash, atomically: `exp:<id>` fields (a bare
/// expiry) go with their `conn:<id>` partner; other values are JSON objects with
/// `expires_at_ms`. Anything else is left alone. Returns how many entries went.
const GC_SCRIPT: &str = r#"
local now = tonumber(ARGV[1])
local removed = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if string.sub(f, 1, 4) == 'exp:' then
    local exp = tonumber(v)
    if exp and exp <= now then
      redis.call('HDEL', KEYS[1], f, 'conn:' .. string.sub(f, 5))
      removed = removed + 1
    end
  elseif string.sub(f, 1, 5) ~= 'conn:' then
    local ok, d = pcall(cjson.decode, v)
    if ok and type(d) == 'table' then
      local exp = tonumber(d['expires_at_ms'])
      if exp and exp <= now then
        redis.call('HDEL', KEYS[1], f)
        removed = removed + 1
      end
    end
  end
end
return removed
"#;

/// Compare-and-set of the topology hash: applies field writes (empty value = delete)
/// only if `version` is still ARGV[1]; returns the new version, or -1 on conflict.
const TOPOLOGY_CAS_SCRIPT: &str = r#"
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if cur ~= tonumber(ARGV[1]) then return -1 end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
"#;

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

fn client_for(url: &str) -> Result<redis::Client> {
    redis::Client::open(url).map_err(|e| Error::Config {
        origin: "redis".into(),
        problems: vec![format!("redis url {url:?}: {e}")],
    })
}

/// How many times a topology change is re-read and re-applied when another process
/// changed the topology first.
const CAS_ATTEMPTS: u32 = 16;

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
        let task = tokio::spawn(subscriber(
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
            gc_script: Arc::new(redis::Script::new(GC_SCRIPT)),
            cas_script: Arc::new(redis::Script::new(TOPOLOGY_CAS_SCRIPT)),
            _subscriber: Arc::new(TaskGuard(task)),
        })
    }

    pub(crate) fn events(&self) -> broadcast::Receiver<BackendEvent> {
        self.events.subscribe()
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

    // ---- topology ----------------------------------------------------------------

    pub(crate) async fn load_topology(&self) -> Result<Topology> {
        let key = self.keys.topology();
        let raw: HashMap<String, Vec<u8>> = self
            .run("topology_load", |mut c| {
                let key = key.clone();
                async move { redis::cmd("HGETALL").arg(key).query_async(&mut c).await }
            })
            .await?;
        decode_topology(&key, &raw)
    }

    pub(crate) async fn update_topology(&self, change: &TopologyChange) -> Result<Topology> {
        let key = self.keys.topology();
        for _attempt in 0..CAS_ATTEMPTS {
            let current = self.load_topology().await?;
            let next = change.apply(&current)?;
            let mut inv = self.cas_script.key(&key);
            inv.arg(current.version);
            for (field, value) in topology_diff(&current, &next)? {
                inv.arg(field).arg(value);
            }
            let version: i64 = self
                .run("topology_update", |mut c| async move {
                    inv.invoke_async(&mut c).await
                })
                .await?;
            if version < 0 {
                continue; // someone else changed it first: re-read and re-apply
            }
            let channel = self.keys.topology_channel();
            let _: () = self
                .run("publish", |mut c| async move {
                    redis::cmd("PUBLISH")
                        .arg(channel)
                        .arg(version)
                        .query_async(&mut c)
                        .await
                })
                .await?;
            let mut next = next;
            next.version = version as u64;
            return Ok(next);
        }
        Err(Error::Contention {
            what: "the topology",
            attempts: CAS_ATTEMPTS,
        })
    }

    // ---- presence ----------------------------------------------------------------

    /// The writes of one registration, all in the `{p:<project>}` slot: membership
    /// in the project index, and the connection and kas holding in the agent hash.
    fn registration_writes(&self, owned: &OwnedConn, exp: u64, ttl_ms: u64) -> Vec<Cmd> {
        let c = &owned.conn;
        let member = holding_value(exp);
        let mut cmds = hset_pexpire(
            &self.keys.project(c.project_id),
            [(member_field(c).as_bytes(), member.as_bytes())],
            ttl_ms,
        );
        cmds.extend(hset_pexpire(
            &self.keys.agent(c.project_id, c.agent_id),
            [
                (
                    conn_field(c.connection_id).as_bytes(),
                    owned.json.as_bytes(),
                ),
                (
                    exp_field(c.connection_id).as_bytes(),
                    exp.to_string().as_bytes(),
                ),
                (kas_field(&c.kas).as_bytes(), member.as_bytes()),
            ],
            ttl_ms,
        ));
        cmds
    }

    /// Register one connection: the agent→project pointer, then the project index and
    /// the agent hash in one MULTI/EXEC with one expiry, then the event.
    pub(crate) async fn register(&self, owned: &OwnedConn, ttl_ms: u64) -> Result<()> {
        let conn = &owned.conn;
        let exp = now_ms() + ttl_ms;
        let key = self.keys.pointers(conn.agent_id);
        let mut pointer = redis::pipe();
        for cmd in hset_pexpire(
            &key,
            [(
                conn.agent_id.to_string().as_bytes(),
                pointer_value(conn.project_id, exp).as_bytes(),
            )],
            ttl_ms,
        ) {
            pointer.add_command(cmd).ignore();
        }
        self.run("register", |mut c| async move {
            pointer.query_async::<()>(&mut c).await
        })
        .await?;
        let mut p = redis::pipe();
        p.atomic();
        for cmd in self.registration_writes(owned, exp, ttl_ms) {
            p.add_command(cmd).ignore();
        }
        self.run("register", |mut c| async move {
            p.query_async::<()>(&mut c).await
        })
        .await?;
        self.publish_agent(&AgentEvent::Connected {
            agent_id: conn.agent_id,
            connection_id: conn.connection_id,
            kas: conn.kas.clone(),
        })
        .await
    }

    /// Remove one connection (and, when asked, this kas's holding of the agent) in one
    /// MULTI/EXEC. The pointer stays: other kas may hold the agent; it expires.
    pub(crate) async fn unregister(
        &self,
        conn: &AgentConnection,
        drop_holding: bool,
    ) -> Result<()> {
        let k = &self.keys;
        let mut p = redis::pipe();
        p.atomic();
        p.cmd("HDEL")
            .arg(k.project(conn.project_id))
            .arg(member_field(conn))
            .ignore();
        let mut hdel = redis::cmd("HDEL");
        hdel.arg(k.agent(conn.project_id, conn.agent_id))
            .arg(conn_field(conn.connection_id))
            .arg(exp_field(conn.connection_id));
        if drop_holding {
            hdel.arg(kas_field(&conn.kas));
        }
        p.add_command(hdel).ignore();
        self.run("unregister", |mut c| async move {
            p.query_async::<()>(&mut c).await
        })
        .await?;
        self.publish_agent(&AgentEvent::Disconnected {
            agent_id: conn.agent_id,
            connection_id: conn.connection_id,
            kas: conn.kas.clone(),
        })
        .await
    }

    async fn publish_agent(&self, event: &AgentEvent) -> Result<()> {
        let channel = self.keys.agents_channel();
        let payload = serde_json::to_string(event).map_err(|e| corrupt("event", e))?;
        self.run("publish", |mut c| async move {
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg(payload)
                .query_async::<()>(&mut c)
                .await
        })
        .await
    }

    /// Renew everything this process owns: new expiries and key TTLs. Cost grows
    /// with what is owned, never with the keyspace.
    ///
    /// Connections are sorted by (project, agent) and sent in chunks, each built while
    /// earlier ones are in flight: one `HSET` + `PEXPIRE` per key. Agent hashes get
    /// only their small `exp:<id>` values; `HSET` answers how many fields it created,
    /// and a created `exp:` field means the hash lost data (Redis restarted, evicted
    /// or flushed it), so that agent's connection JSON is written again at once.
    pub(crate) async fn refresh(
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
                .entry(self.slot_of(&key))
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

    fn slot_of(&self, key: &str) -> SlotGroup {
        match self.conn {
            Conn::Single(_) => None,
            Conn::Cluster(_) => Some(redis::cluster_routing::Slot::for_key(key.as_bytes())),
        }
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
        let mut groups: HashMap<Option<redis::cluster_routing::Slot>, Vec<Vec<Cmd>>> =
            HashMap::new();
        for (key, cmds) in writes {
            let group = match self.conn {
                Conn::Single(_) => None,
                Conn::Cluster(_) => Some(redis::cluster_routing::Slot::for_key(key.as_bytes())),
            };
            groups.entry(group).or_default().push(cmds);
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

    pub(crate) async fn put_kas_instance(&self, i: &KasInstance, ttl_ms: u64) -> Result<()> {
        self.refresh(&[], Some(i), ttl_ms).await
    }

    pub(crate) async fn remove_kas_instance(&self, addr: &KasAddress) -> Result<()> {
        let key = self.keys.kas_instances();
        let field = addr.0.clone();
        self.run("unregister", |mut c| async move {
            redis::cmd("HDEL")
                .arg(key)
                .arg(field)
                .query_async(&mut c)
                .await
        })
        .await
    }

    async fn project_of(&self, agent_id: i64) -> Result<Option<i64>> {
        let key = self.keys.pointers(agent_id);
        let raw: Option<Vec<u8>> = self
            .run("lookup", |mut c| async move {
                redis::cmd("HGET")
                    .arg(&key)
                    .arg(agent_id)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let key = self.keys.pointers(agent_id);
        // An expired pointer still names the right project; the entries it leads to
        // carry their own expiry.
        Ok(raw
            .and_then(|r| decode::<Expiring<Pointer>>(&key, &r, &self.health))
            .map(|p| p.value.project))
    }

    async fn hgetall(&self, key: String) -> Result<Vec<(String, Vec<u8>)>> {
        self.run("lookup", |mut c| async move {
            redis::cmd("HGETALL").arg(key).query_async(&mut c).await
        })
        .await
    }

    pub(crate) async fn by_agent(&self, agent_id: i64) -> Result<Vec<AgentConnection>> {
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
    pub(crate) async fn by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        let key = self.keys.project(project_id);
        let now = now_ms();
        let mut members: Vec<(i64, i64)> = self
            .hgetall(key.clone())
            .await?
            .into_iter()
            .filter(|(_, v)| {
                decode::<Expiring<Empty>>(&key, v, &self.health)
                    .is_some_and(|e| e.expires_at_ms > now)
            })
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

    pub(crate) async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
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
            .filter(|(_, v)| {
                decode::<Expiring<Empty>>(&key, v, &self.health)
                    .is_some_and(|e| e.expires_at_ms > now)
            })
            .map(|(f, _)| KasAddress(f))
            .collect();
        out.sort();
        Ok(out)
    }

    pub(crate) async fn kas_instances(&self) -> Result<Vec<KasInstance>> {
        let key = self.keys.kas_instances();
        let now = now_ms();
        let mut out: Vec<KasInstance> = self
            .hgetall(key.clone())
            .await?
            .into_iter()
            .filter_map(|(_, v)| decode::<Expiring<KasInstance>>(&key, &v, &self.health))
            .filter(|e| e.expires_at_ms > now)
            .map(|e| e.value)
            .collect();
        out.sort_by(|a, b| a.address.cmp(&b.address));
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

    /// Remove expired fields from every key this process writes (its owned scope),
    /// each key atomically. Returns how many fields went.
    /// `owned` lists the (project, agent) pairs this process holds connections of.
    pub(crate) async fn gc(&self, owned: &[(i64, i64)]) -> Result<usize> {
        let mut keys: Vec<String> = Vec::with_capacity(owned.len() * 3 + 1);
        for &(project, agent) in owned {
            keys.push(self.keys.project(project));
            keys.push(self.keys.agent(project, agent));
            keys.push(self.keys.pointers(agent));
        }
        keys.push(self.keys.kas_instances());
        keys.sort();
        keys.dedup();
        let now = now_ms();
        let removed: Vec<Result<i64>> = stream::iter(keys)
            .map(|key| {
                let script = self.gc_script.clone();
                async move {
                    self.run("gc", |mut c| async move {
                        script.key(key).arg(now).invoke_async(&mut c).await
                    })
                    .await
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let mut total = 0usize;
        for r in removed {
            total += r? as usize;
        }
        Ok(total)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Empty {}

#[derive(serde::Serialize, serde::Deserialize)]
struct Pointer {
    project: i64,
}

fn member_field(c: &AgentConnection) -> String {
    format!("{}:{}", c.agent_id, c.connection_id)
}

fn conn_field(connection_id: i64) -> String {
    format!("conn:{connection_id}")
}

fn exp_field(connection_id: i64) -> String {
    format!("exp:{connection_id}")
}

fn kas_field(kas: &KasAddress) -> String {
    format!("kas:{}", kas.0)
}

fn pointer_value(project: i64, exp: u64) -> String {
    format!("{{\"expires_at_ms\":{exp},\"project\":{project}}}")
}

fn corrupt(what: &str, e: serde_json::Error) -> Error {
    Error::Corrupt {
        key: what.to_owned(),
        reason: e.to_string(),
    }
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, raw: &[u8], health: &Health) -> Option<T> {
    match serde_json::from_slice(raw) {
        Ok(v) => Some(v),
        Err(e) => {
            health.corrupt(key, &e.to_string());
            None
        }
    }
}

fn decode_topology(key: &str, raw: &HashMap<String, Vec<u8>>) -> Result<Topology> {
    let bad = |reason: String| Error::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let mut t = Topology::default();
    for (field, value) in raw {
        let text = std::str::from_utf8(value).map_err(|_| bad(format!("{field}: not UTF-8")))?;
        if field == "version" {
            t.version = text
                .parse()
                .map_err(|_| bad("version: not an integer".into()))?;
        } else if field == "default" {
            t.default_pod = Some(
                text.parse()
                    .map_err(|_| bad("default: not a Pod id".into()))?,
            );
        } else if field.starts_with("pod:") {
            let pod: Pod = serde_json::from_str(text).map_err(|e| bad(format!("{field}: {e}")))?;
            t.pods.insert(pod.id, Arc::new(pod));
        }
    }
    Ok(t)
}

/// The hash writes that turn `from` into `to` (empty value: delete the field).
fn topology_diff(from: &Topology, to: &Topology) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (id, pod) in &to.pods {
        if from.pods.get(id) != Some(pod) {
            let json = serde_json::to_string(&**pod).map_err(|e| corrupt("pod", e))?;
            out.push((format!("pod:{id}"), json));
        }
    }
    for id in from.pods.keys() {
        if !to.pods.contains_key(id) {
            out.push((format!("pod:{id}"), String::new()));
        }
    }
    if from.default_pod != to.default_pod {
        out.push((
            "default".into(),
            to.default_pod.map(|d| d.to_string()).unwrap_or_default(),
        ));
    }
    Ok(out)
}

/// Keep one pub/sub subscription alive: (re)connect with back-off, subscribe to both
/// channels, forward messages, and announce `Resync` after every (re)subscription.
async fn subscriber(
    target: RedisTarget,
    keys: Keys,
    events: broadcast::Sender<BackendEvent>,
    health: Arc<Health>,
    backoff_max: Duration,
) {
    let agents = keys.agents_channel();
    let topology = keys.topology_channel();
    let urls = match &target {
        RedisTarget::Standalone(u) => vec![u.clone()],
        RedisTarget::Cluster(nodes) => nodes.clone(),
    };
    let mut delay = Duration::from_millis(50);
    let mut next = 0usize;
    loop {
        // In a Cluster every node relays PUBLISH, so any reachable node will do.
        let url = &urls[next % urls.len()];
        next += 1;
        let res: redis::RedisResult<redis::aio::PubSub> = async {
            let mut ps = redis::Client::open(url.as_str())?
                .get_async_pubsub()
                .await?;
            ps.subscribe(&agents).await?;
            ps.subscribe(&topology).await?;
            Ok(ps)
        }
        .await;
        match res {
            Ok(mut ps) => {
                health.record::<()>("subscribe", &Ok(()));
                delay = Duration::from_millis(50);
                let _ = events.send(BackendEvent::Resync);
                let mut msgs = ps.on_message();
                while let Some(msg) = msgs.next().await {
                    let channel = msg.get_channel_name();
                    let payload: Vec<u8> = msg.get_payload_bytes().to_vec();
                    let event = if channel == agents {
                        serde_json::from_slice::<AgentEvent>(&payload)
                            .ok()
                            .map(BackendEvent::Agent)
                    } else if channel == topology {
                        std::str::from_utf8(&payload)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .map(BackendEvent::Topology)
                    } else {
                        None
                    };
                    match event {
                        Some(e) => {
                            let _ = events.send(e);
                        }
                        None => health.corrupt(channel, "unreadable event"),
                    }
                }
                // The stream ended: the connection is gone.
                let err = redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "pub/sub connection closed",
                ));
                health.record::<()>("subscribe", &Err(Error::backend("subscribe")(err)));
            }
            Err(e) => {
                health.record::<()>("subscribe", &Err(Error::backend("subscribe")(e)));
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(backoff_max);
    }
}
