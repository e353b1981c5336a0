//! Claims on Redis, standalone or a Cluster. Every key carries the hash tag
//! `{ts}`, so all of them live in one Cluster slot and each change is one Lua
//! script: a lease's records change together or not at all, on a Cluster too.
//! (The price: one shard holds every claim. Claims change when Rails creates or
//! renames a namespace, user or key, rarely; classifications are read, and the
//! proxy caches them.)
//!
//! | key | type | content |
//! |---|---|---|
//! | `P:{ts}:records` | hash | `<bucket>:<value>` → the record (JSON: `cell`, `status`, `lease`, `uuid`, `created`/`updated` in ns, `src` the source key in hex, `stype` the source table, `meta` the `Metadata` protobuf in base64) |
//! | `P:{ts}:source:<cell>` | sorted set, all scores 0 | `<src hex>\0<field>`: the Cell's records by source key (`ListRecords`' `ZRANGEBYLEX`; hex keeps byte order, `\0` sorts a key before its extensions) |
//! | `P:{ts}:leases` | hash | lease uuid → `{cell, created, updated, creates: [fields], destroys: [fields]}` |

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use podgate_registry::RedisConn as Conn;
use prost::Message as _;
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};

use super::{Error, Key, LEASES_PAGE, LeaseCursor, LeasePage, RECORDS_PAGE, RecordFilter, nanos};
use crate::proto::gitlab::cells::topology_service::claims::v1::{
    LeaseRecord, Metadata, Record, record::Status,
};
use crate::proto::gitlab::cells::topology_service::types::v1::Uuid;

/// Where the claims live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One server: `redis://host:port[/db]`.
    Standalone(String),
    /// A Cluster's seed nodes.
    Cluster(Vec<String>),
}

/// Claims on Redis.
pub struct RedisClaims {
    conn: Conn,
    records: String,
    leases: String,
    prefix: String,
}

/// A record as stored.
#[derive(Serialize, Deserialize)]
struct Stored {
    cell: i64,
    status: i32,
    lease: String,
    uuid: String,
    created: String,
    updated: String,
    src: String,
    stype: i32,
    meta: String,
}

fn unavailable(e: redis::RedisError) -> Error {
    Error::Unavailable(e.to_string())
}

fn field(k: &Key) -> String {
    format!("{}:{}", k.bucket, k.value)
}

fn timestamp(ns: &str) -> prost_types::Timestamp {
    let ns: i128 = ns.parse().unwrap_or(0);
    prost_types::Timestamp {
        seconds: i64::try_from(ns.div_euclid(1_000_000_000)).unwrap_or(0),
        nanos: i32::try_from(ns.rem_euclid(1_000_000_000)).unwrap_or(0),
    }
}

fn now_ns() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        .to_string()
}

impl Stored {
    fn record(&self) -> Option<Record> {
        let meta = base64::engine::general_purpose::STANDARD
            .decode(&self.meta)
            .ok()
            .and_then(|b| Metadata::decode(&b[..]).ok())?;
        Some(Record {
            uuid: Some(Uuid {
                value: self.uuid.clone(),
            }),
            metadata: Some(meta),
            cell_id: self.cell,
            status: self.status,
            lease_uuid: (!self.lease.is_empty()).then(|| Uuid {
                value: self.lease.clone(),
            }),
            created_at: Some(timestamp(&self.created)),
            updated_at: Some(timestamp(&self.updated)),
        })
    }
}

/// `BeginUpdate`: checks every create is free and every destroy is the Cell's
/// own and unleased, then writes them all and the lease. KEYS: records, leases,
/// the Cell's source index. ARGV: cell, lease, now, the number of creates, then
/// each create's field, record and index member, then each destroy's field.
const BEGIN: &str = r"
local cell = tonumber(ARGV[1])
local n = tonumber(ARGV[4])
local i = 5
for k = 1, n do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then return {'ALREADY_EXISTS', ARGV[i]} end
  i = i + 3
end
local d = i
while i <= #ARGV do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur then return {'NOT_FOUND', ARGV[i]} end
  local r = cjson.decode(cur)
  if r.cell ~= cell then return {'OTHER_CELL', ARGV[i], tostring(r.cell)} end
  if r.status ~= 1 then return {'LEASED', ARGV[i]} end
  i = i + 1
end
local creates, destroys = {}, {}
i = 5
for k = 1, n do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[3], 0, ARGV[i + 2])
  creates[#creates + 1] = ARGV[i]
  i = i + 3
end
while i <= #ARGV do
  local r = cjson.decode(redis.call('HGET', KEYS[1], ARGV[i]))
  r.status = 3
  r.lease = ARGV[2]
  r.updated = ARGV[3]
  redis.call('HSET', KEYS[1], ARGV[i], cjson.encode(r))
  destroys[#destroys + 1] = ARGV[i]
  i = i + 1
end
redis.call('HSET', KEYS[2], ARGV[2], cjson.encode({cell = cell, created = ARGV[3], updated = ARGV[3], creates = creates, destroys = destroys}))
return {'OK'}
";

/// `CommitUpdate` (ARGV[3] = 1) or `RollbackUpdate`: idempotent, the lease's
/// own Cell only. KEYS: records, leases, the Cell's source index. ARGV: cell,
/// lease, commit, now.
const END: &str = r"
local l = redis.call('HGET', KEYS[2], ARGV[2])
if not l then return {'OK'} end
local lease = cjson.decode(l)
if lease.cell ~= tonumber(ARGV[1]) then return {'PERMISSION_DENIED', tostring(lease.cell)} end
local settle, drop = lease.creates, lease.destroys
if ARGV[3] ~= '1' then settle, drop = lease.destroys, lease.creates end
for _, f in ipairs(drop) do
  local cur = redis.call('HGET', KEYS[1], f)
  if cur then
    redis.call('ZREM', KEYS[3], cjson.decode(cur).src .. '\0' .. f)
    redis.call('HDEL', KEYS[1], f)
  end
end
for _, f in ipairs(settle) do
  local cur = redis.call('HGET', KEYS[1], f)
  if cur then
    local r = cjson.decode(cur)
    r.status = 1
    r.lease = ''
    r.updated = ARGV[4]
    redis.call('HSET', KEYS[1], f, cjson.encode(r))
  end
end
redis.call('HDEL', KEYS[2], ARGV[2])
return {'OK'}
";

/// The scripts, hashed once (`EVALSHA`, loaded on a `NOSCRIPT`).
static BEGIN_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(BEGIN));
static END_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(END));

impl RedisClaims {
    /// Connects to `target` (lazily for a standalone server: a broken connection
    /// is re-made with back-off on the next command), keys under `prefix`.
    pub async fn connect(target: &Target, prefix: &str) -> Result<Self, Error> {
        let timeout = Duration::from_secs(2);
        let conn = match target {
            Target::Standalone(url) => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                Conn::Single(
                    ConnectionManager::new_lazy_with_config(client, config).map_err(unavailable)?,
                )
            }
            Target::Cluster(nodes) => Conn::Cluster(
                redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .build()
                    .map_err(unavailable)?
                    .get_async_connection()
                    .await
                    .map_err(unavailable)?,
            ),
        };
        Ok(RedisClaims {
            conn,
            records: format!("{prefix}:{{ts}}:records"),
            leases: format!("{prefix}:{{ts}}:leases"),
            prefix: prefix.to_owned(),
        })
    }

    fn source_index(&self, cell: i64) -> String {
        format!("{}:{{ts}}:source:{cell}", self.prefix)
    }

    /// As [`super::memory::Memory::begin`].
    pub async fn begin(
        &self,
        cell_id: i64,
        creates: &[Metadata],
        destroys: &[Metadata],
    ) -> Result<String, Error> {
        let (create_keys, destroy_keys) = super::checked(creates, destroys)?;
        let uuid = super::memory::new_uuid();
        let now = now_ns();
        let mut script = BEGIN_SCRIPT.prepare_invoke();
        script
            .key(&self.records)
            .key(&self.leases)
            .key(self.source_index(cell_id))
            .arg(cell_id)
            .arg(&uuid)
            .arg(&now)
            .arg(create_keys.len());
        for (k, m) in create_keys.iter().zip(creates) {
            let src = m
                .source
                .as_ref()
                .map(|s| hex(&s.rails_primary_key_id))
                .unwrap_or_default();
            let stored = Stored {
                cell: cell_id,
                status: Status::LeaseCreating as i32,
                lease: uuid.clone(),
                uuid: super::memory::new_uuid(),
                created: now.clone(),
                updated: now.clone(),
                stype: m.source.as_ref().map_or(0, |s| s.r#type),
                meta: base64::engine::general_purpose::STANDARD.encode(m.encode_to_vec()),
                src: src.clone(),
            };
            let f = field(k);
            script
                .arg(&f)
                .arg(
                    serde_json::to_string(&stored)
                        .map_err(|e| Error::Unavailable(e.to_string()))?,
                )
                .arg(format!("{src}\0{f}"));
        }
        for k in &destroy_keys {
            script.arg(field(k));
        }
        let reply: Vec<String> = script
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let named = |f: &str| {
            f.split_once(':')
                .and_then(|(b, v)| b.parse().ok().map(|b| Key::new(b, v)))
                .map_or_else(|| f.to_owned(), |k| k.to_string())
        };
        match reply.first().map(String::as_str) {
            Some("OK") => Ok(uuid),
            Some("ALREADY_EXISTS") => Err(Error::AlreadyExists(named(&reply[1]))),
            Some("NOT_FOUND") => Err(Error::NotFound(format!(
                "{} is not claimed",
                named(&reply[1])
            ))),
            Some("OTHER_CELL") => Err(Error::FailedPrecondition(format!(
                "{} is claimed by Cell {}",
                named(&reply[1]),
                reply.get(2).map_or("?", String::as_str)
            ))),
            Some("LEASED") => Err(Error::FailedPrecondition(format!(
                "{} is held by another lease",
                named(&reply[1])
            ))),
            _ => Err(Error::Unavailable(format!("unexpected reply {reply:?}"))),
        }
    }

    /// As [`super::memory::Memory::end`].
    pub async fn end(&self, cell_id: i64, lease: &str, commit: bool) -> Result<(), Error> {
        let reply: Vec<String> = END_SCRIPT
            .key(&self.records)
            .key(&self.leases)
            .key(self.source_index(cell_id))
            .arg(cell_id)
            .arg(lease)
            .arg(if commit { "1" } else { "0" })
            .arg(now_ns())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        match reply.first().map(String::as_str) {
            Some("OK") => Ok(()),
            Some("PERMISSION_DENIED") => Err(Error::PermissionDenied(format!(
                "lease {lease} is Cell {}'s",
                reply.get(1).map_or("?", String::as_str)
            ))),
            _ => Err(Error::Unavailable(format!("unexpected reply {reply:?}"))),
        }
    }

    async fn stored(&self, key: &Key) -> Result<Option<Stored>, Error> {
        let raw: Option<String> = redis::cmd("HGET")
            .arg(&self.records)
            .arg(field(key))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
    }

    /// As [`super::memory::Memory::get`].
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        Ok(self.stored(key).await?.and_then(|s| s.record()))
    }

    /// As [`super::memory::Memory::owner`].
    pub async fn owner(&self, key: &Key) -> Result<Option<i64>, Error> {
        Ok(self
            .stored(key)
            .await?
            .filter(|s| s.status != Status::LeaseCreating as i32)
            .map(|s| s.cell))
    }

    /// As [`super::memory::Memory::leases`].
    pub async fn leases(
        &self,
        cell_id: i64,
        cursor: Option<&LeaseCursor>,
        limit: usize,
        created_after: Option<&prost_types::Timestamp>,
    ) -> Result<LeasePage, Error> {
        let limit = limit.clamp(1, LEASES_PAGE);
        let all: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&self.leases)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        let mut mine: Vec<(LeaseCursor, LeaseRecord)> = all
            .into_iter()
            .filter_map(|(uuid, json)| {
                let v: serde_json::Value = serde_json::from_str(&json).ok()?;
                (v["cell"].as_i64()? == cell_id).then_some(())?;
                let created = v["created"].as_str()?.to_owned();
                let updated = v["updated"].as_str()?.to_owned();
                Some((
                    LeaseCursor {
                        created_at: created.parse().ok()?,
                        uuid: uuid.clone(),
                    },
                    LeaseRecord {
                        uuid: Some(Uuid { value: uuid }),
                        created_at: Some(timestamp(&created)),
                        updated_at: Some(timestamp(&updated)),
                    },
                ))
            })
            .filter(|(c, _)| created_after.is_none_or(|t| c.created_at >= nanos(t)))
            .filter(|(c, _)| cursor.is_none_or(|after| c > after))
            .collect();
        mine.sort_by(|a, b| a.0.cmp(&b.0));
        let more = mine.len() > limit;
        mine.truncate(limit);
        Ok(LeasePage {
            next: more.then(|| mine.last().map(|(c, _)| c.clone())).flatten(),
            leases: mine.into_iter().map(|(_, r)| r).collect(),
        })
    }

    /// As [`super::memory::Memory::records`]: the Cell's source index from
    /// `(gt, lte]`, in chunks, filtered, never ending a page inside one source row.
    pub async fn records(&self, filter: &RecordFilter) -> Result<(Vec<Record>, bool), Error> {
        let index = self.source_index(filter.cell_id);
        let mut min: Vec<u8> = if filter.source_id_gt.is_empty() {
            b"-".to_vec()
        } else {
            [b"[", hex(&filter.source_id_gt).as_bytes(), b"\x01"].concat()
        };
        let max: Vec<u8> = if filter.source_id_lte.is_empty() {
            b"+".to_vec()
        } else {
            [b"(", hex(&filter.source_id_lte).as_bytes(), b"\x01"].concat()
        };
        let mut out: Vec<(String, Record)> = Vec::new();
        loop {
            let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
                .arg(&index)
                .arg(&min)
                .arg(&max)
                .arg("LIMIT")
                .arg(0)
                .arg(RECORDS_PAGE)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(unavailable)?;
            if members.is_empty() {
                return Ok((out.into_iter().map(|(_, r)| r).collect(), false));
            }
            let fields: Vec<&str> = members
                .iter()
                .map(|m| m.split_once('\0').map_or("", |(_, f)| f))
                .collect();
            let values: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&self.records)
                .arg(&fields)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(unavailable)?;
            for (member, value) in members.iter().zip(values) {
                let src = member.split_once('\0').map_or("", |(s, _)| s).to_owned();
                if out.len() >= RECORDS_PAGE && out.last().is_some_and(|(last, _)| *last != src) {
                    return Ok((out.into_iter().map(|(_, r)| r).collect(), true));
                }
                let Some(stored) = value.and_then(|v| serde_json::from_str::<Stored>(&v).ok())
                else {
                    continue;
                };
                let bucket: i32 = member
                    .split_once('\0')
                    .and_then(|(_, f)| f.split_once(':'))
                    .and_then(|(b, _)| b.parse().ok())
                    .unwrap_or(0);
                let wanted = (filter.source_type == 0 || stored.stype == filter.source_type)
                    && (filter.bucket_types.is_empty() || filter.bucket_types.contains(&bucket))
                    && (filter.claim_types.is_empty() || filter.claim_types.contains(&bucket));
                if wanted && let Some(r) = stored.record() {
                    out.push((src, r));
                }
            }
            let last = members.last().expect("not empty");
            min = [b"(", last.as_bytes()].concat();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
