//! The Redis backend: standalone (`redis://…`) or Cluster (several `redis://…` seeds).
//!
//! Keys are documented in the crate docs. Every multi-key transaction touches keys of
//! one hash tag (`{p:<project>}`), so it lives in one Cluster slot.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt as _, stream};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::{BackendEvent, KasHolding, TopologyChange};
use crate::error::{Error, Result};
use crate::metrics::Health;
use crate::presence::{AgentConnection, AgentEvent, Expiring, KasAddress, KasInstance, now_ms};
use crate::topology::{Pod, Topology};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://host:port/db`.
    Standalone(String),
    /// A Cluster: one or more seed nodes.
    Cluster(Vec<String>),
}

/// Commands per pipeline when refreshing.
const REFRESH_BATCH: usize = 20_000;

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
    pub(crate) fn agent_conns(&self, project_id: i64, agent_id: i64) -> String {
        format!("{}:{{p:{project_id}}}:agent:{agent_id}:conns", self.prefix)
    }
    pub(crate) fn agent_kas(&self, project_id: i64, agent_id: i64) -> String {
        format!("{}:{{p:{project_id}}}:agent:{agent_id}:kas", self.prefix)
    }
    pub(crate) fn agent_project(&self, agent_id: i64) -> String {
        format!("{}:{{a:{agent_id}}}:project", self.prefix)
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

/// Removes every expired field of one hash, atomically. Values are JSON objects with
/// `expires_at_ms`; anything else is left alone.
const GC_SCRIPT: &str = r#"
local now = tonumber(ARGV[1])
local removed = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local ok, v = pcall(cjson.decode, all[i + 1])
  if ok and type(v) == 'table' then
    local exp = tonumber(v['expires_at_ms'])
    if exp and exp <= now then
      redis.call('HDEL', KEYS[1], all[i])
      removed = removed + 1
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

impl RedisBackend {
    /// Connect to `target`. A standalone server may be down now (the connection is
    /// made lazily and re-made with back-off); a Cluster must answer once to map slots.
    pub(crate) async fn connect(
        target: &RedisTarget,
        prefix: &str,
        health: Arc<Health>,
        backoff_max: Duration,
    ) -> Result<Self> {
        let conn = match target {
            RedisTarget::Standalone(url) => {
                let client = client_for(url)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(Some(Duration::from_secs(5)))
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
                    .connection_timeout(Duration::from_secs(1))
                    .response_timeout(Duration::from_secs(5))
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
        for _attempt in 0..16 {
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
        Err(Error::Config {
            origin: "topology".into(),
            problems: vec!["too many concurrent topology changes; try again".into()],
        })
    }

    // ---- presence ----------------------------------------------------------------

    fn conn_fields(
        &self,
        conn: &AgentConnection,
        exp: u64,
    ) -> Result<[(String, String, Vec<u8>); 3]> {
        let k = &self.keys;
        let value = serde_json::to_vec(&Expiring {
            expires_at_ms: exp,
            value: conn.clone(),
        })
        .map_err(|e| corrupt("agent connection", e))?;
        let holding = format!("{{\"expires_at_ms\":{exp}}}").into_bytes();
        Ok([
            (
                k.project(conn.project_id),
                format!("{}:{}", conn.agent_id, conn.connection_id),
                value.clone(),
            ),
            (
                k.agent_conns(conn.project_id, conn.agent_id),
                conn.connection_id.to_string(),
                value,
            ),
            (
                k.agent_kas(conn.project_id, conn.agent_id),
                conn.kas.0.clone(),
                holding,
            ),
        ])
    }

    /// Register one connection: the agent→project pointer, then the three indexes in
    /// one MULTI/EXEC with one expiry, then the event.
    pub(crate) async fn register(&self, conn: &AgentConnection, ttl_ms: u64) -> Result<()> {
        let exp = now_ms() + ttl_ms;
        let pointer = self.keys.agent_project(conn.agent_id);
        let project = conn.project_id;
        self.run("register", |mut c| async move {
            redis::cmd("SET")
                .arg(pointer)
                .arg(project)
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<()>(&mut c)
                .await
        })
        .await?;
        let mut p = redis::pipe();
        p.atomic();
        for (key, field, value) in self.conn_fields(conn, exp)? {
            p.cmd("HSET").arg(&key).arg(field).arg(value).ignore();
            p.cmd("PEXPIRE").arg(&key).arg(ttl_ms).ignore();
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
            .arg(format!("{}:{}", conn.agent_id, conn.connection_id))
            .ignore();
        p.cmd("HDEL")
            .arg(k.agent_conns(conn.project_id, conn.agent_id))
            .arg(conn.connection_id)
            .ignore();
        if drop_holding {
            p.cmd("HDEL")
                .arg(k.agent_kas(conn.project_id, conn.agent_id))
                .arg(&conn.kas.0)
                .ignore();
        }
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

    /// Rewrite everything this process owns with a fresh expiry: values and key TTLs.
    /// Batched pipelines; one `HSET` with many fields and one `PEXPIRE` per key. Cost
    /// grows with what is owned, never with the keyspace. After a Redis restart this
    /// alone puts everything back.
    pub(crate) async fn refresh(
        &self,
        conns: &[AgentConnection],
        instance: Option<&KasInstance>,
        ttl_ms: u64,
    ) -> Result<()> {
        let exp = now_ms() + ttl_ms;
        let mut by_key: BTreeMap<String, Vec<(String, Vec<u8>)>> = BTreeMap::new();
        let mut pointers: BTreeMap<i64, i64> = BTreeMap::new();
        for c in conns {
            for (key, field, value) in self.conn_fields(c, exp)? {
                by_key.entry(key).or_default().push((field, value));
            }
            pointers.insert(c.agent_id, c.project_id);
        }
        if let Some(i) = instance {
            let value = serde_json::to_vec(&Expiring {
                expires_at_ms: exp,
                value: i.clone(),
            })
            .map_err(|e| corrupt("kas instance", e))?;
            by_key
                .entry(self.keys.kas_instances())
                .or_default()
                .push((i.address.0.clone(), value));
        }
        // Every key's writes: one HSET with all its fields and one PEXPIRE, or one SET.
        let mut writes: Vec<(String, Vec<Cmd>)> = Vec::with_capacity(by_key.len() + pointers.len());
        for (key, fields) in by_key {
            let mut hset = redis::cmd("HSET");
            hset.arg(&key);
            for (f, v) in fields {
                hset.arg(f).arg(v);
            }
            let mut pexpire = redis::cmd("PEXPIRE");
            pexpire.arg(&key).arg(ttl_ms);
            writes.push((key, vec![hset, pexpire]));
        }
        for (agent, project) in pointers {
            let key = self.keys.agent_project(agent);
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(project).arg("PX").arg(ttl_ms);
            writes.push((key, vec![set]));
        }
        let batches = self.batches(writes);
        // Two batches in flight keep the socket busy without hogging the server.
        let results: Vec<Result<()>> = stream::iter(batches)
            .map(|b| async move {
                self.run("refresh", |mut c| async move {
                    b.query_async::<()>(&mut c).await
                })
                .await
            })
            .buffer_unordered(match self.conn {
                Conn::Single(_) => 2,
                Conn::Cluster(_) => 32,
            })
            .collect()
            .await;
        results.into_iter().collect()
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
        let key = self.keys.agent_project(agent_id);
        self.run("lookup", |mut c| async move {
            redis::cmd("GET").arg(key).query_async(&mut c).await
        })
        .await
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
        let key = self.keys.agent_conns(project, agent_id);
        let raw = self.hgetall(key.clone()).await?;
        Ok(self.live_conns(&key, raw))
    }

    pub(crate) async fn by_project(&self, project_id: i64) -> Result<Vec<AgentConnection>> {
        let key = self.keys.project(project_id);
        let raw = self.hgetall(key.clone()).await?;
        Ok(self.live_conns(&key, raw))
    }

    pub(crate) async fn kas_for_agent(&self, agent_id: i64) -> Result<Vec<KasAddress>> {
        let Some(project) = self.project_of(agent_id).await? else {
            return Ok(Vec::new());
        };
        let key = self.keys.agent_kas(project, agent_id);
        let now = now_ms();
        let mut out: Vec<KasAddress> = self
            .hgetall(key.clone())
            .await?
            .into_iter()
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

    fn live_conns(&self, key: &str, raw: Vec<(String, Vec<u8>)>) -> Vec<AgentConnection> {
        let now = now_ms();
        let mut out: Vec<AgentConnection> = raw
            .into_iter()
            .filter_map(|(_, v)| decode::<Expiring<AgentConnection>>(key, &v, &self.health))
            .filter(|e| e.expires_at_ms > now)
            .map(|e| e.value)
            .collect();
        out.sort_by_key(|c| (c.agent_id, c.connection_id));
        out
    }

    /// Remove expired fields from every key this process writes (its owned scope),
    /// each key atomically. Returns how many fields went.
    pub(crate) async fn gc(&self, holdings: &[KasHolding]) -> Result<usize> {
        let mut keys: Vec<String> = Vec::with_capacity(holdings.len() * 3 + 1);
        for h in holdings {
            keys.push(self.keys.project(h.project_id));
            keys.push(self.keys.agent_conns(h.project_id, h.agent_id));
            keys.push(self.keys.agent_kas(h.project_id, h.agent_id));
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
