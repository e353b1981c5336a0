//! The claims store in one process: records by key, leases by uuid, every change
//! under one lock, so a lease's records change together or not at all.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;

use super::{Error, Key, LEASES_PAGE, LeaseCursor, LeasePage, RECORDS_PAGE, RecordFilter, nanos};
use crate::proto::gitlab::cells::topology_service::claims::v1::{
    LeaseRecord, Metadata, Record, record::Status,
};
use crate::proto::gitlab::cells::topology_service::types::v1::Uuid;

/// A lease: the records one `BeginUpdate` changed, until its commit or rollback.
#[derive(Clone, Debug)]
struct Lease {
    record: LeaseRecord,
    cell_id: i64,
    creates: Vec<Key>,
    destroys: Vec<Key>,
}

#[derive(Default)]
struct State {
    records: BTreeMap<Key, Record>,
    leases: HashMap<String, Lease>,
}

/// Claims in memory.
#[derive(Default)]
pub struct Memory {
    state: Mutex<State>,
}

fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A random (version 4) UUID in its usual text form.
pub fn new_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl Memory {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic under the lock leaves whole records behind: every change below
        // checks first and writes after.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `BeginUpdate`: creates and destroys for `cell_id` under a new lease, all or
    /// nothing. Returns the lease's uuid.
    pub fn begin(
        &self,
        cell_id: i64,
        creates: &[Metadata],
        destroys: &[Metadata],
    ) -> Result<String, Error> {
        let (create_keys, destroy_keys) = super::checked(creates, destroys)?;
        let mut state = self.lock();
        for k in &create_keys {
            if state.records.contains_key(k) {
                return Err(Error::AlreadyExists(k.to_string()));
            }
        }
        for k in &destroy_keys {
            let r = state
                .records
                .get(k)
                .ok_or_else(|| Error::NotFound(format!("{k} is not claimed")))?;
            if r.cell_id != cell_id {
                return Err(Error::FailedPrecondition(format!(
                    "{k} is claimed by Cell {}",
                    r.cell_id
                )));
            }
            if r.status != Status::Active as i32 {
                return Err(Error::FailedPrecondition(format!(
                    "{k} is held by another lease"
                )));
            }
        }
        let uuid = new_uuid();
        let at = now();
        let lease_uuid = Some(Uuid {
            value: uuid.clone(),
        });
        for (k, m) in create_keys.iter().zip(creates) {
            state.records.insert(
                k.clone(),
                Record {
                    uuid: Some(Uuid { value: new_uuid() }),
                    metadata: Some(m.clone()),
                    cell_id,
                    status: Status::LeaseCreating as i32,
                    lease_uuid: lease_uuid.clone(),
                    created_at: Some(at),
                    updated_at: Some(at),
                },
            );
        }
        for k in &destroy_keys {
            if let Some(r) = state.records.get_mut(k) {
                r.status = Status::LeaseDestroying as i32;
                r.lease_uuid = lease_uuid.clone();
                r.updated_at = Some(at);
            }
        }
        state.leases.insert(
            uuid.clone(),
            Lease {
                record: LeaseRecord {
                    uuid: lease_uuid,
                    created_at: Some(at),
                    updated_at: Some(at),
                },
                cell_id,
                creates: create_keys,
                destroys: destroy_keys,
            },
        );
        Ok(uuid)
    }

    /// `CommitUpdate` (`commit`) or `RollbackUpdate`: idempotent; a lease already
    /// ended is no error, another Cell's is.
    pub fn end(&self, cell_id: i64, lease: &str, commit: bool) -> Result<(), Error> {
        let mut state = self.lock();
        let Some(l) = state.leases.get(lease) else {
            return Ok(());
        };
        if l.cell_id != cell_id {
            return Err(Error::PermissionDenied(format!(
                "lease {lease} is Cell {}'s",
                l.cell_id
            )));
        }
        let l = state.leases.remove(lease).expect("looked up above");
        let at = now();
        let (settle, drop) = if commit {
            (&l.creates, &l.destroys)
        } else {
            (&l.destroys, &l.creates)
        };
        for k in drop {
            state.records.remove(k);
        }
        for k in settle {
            if let Some(r) = state.records.get_mut(k) {
                r.status = Status::Active as i32;
                r.lease_uuid = None;
                r.updated_at = Some(at);
            }
        }
        Ok(())
    }

    /// The record of `key`, whatever its status.
    pub fn get(&self, key: &Key) -> Option<Record> {
        self.lock().records.get(key).cloned()
    }

    /// The Cell that owns `key` for classification: `ACTIVE` or `LEASE_DESTROYING`.
    pub fn owner(&self, key: &Key) -> Option<i64> {
        self.lock()
            .records
            .get(key)
            .filter(|r| r.status != Status::LeaseCreating as i32)
            .map(|r| r.cell_id)
    }

    /// `ListLeases`: `cell_id`'s leases created at or after `created_after`, oldest
    /// first, after `cursor`, at most `limit` (and [`LEASES_PAGE`]).
    pub fn leases(
        &self,
        cell_id: i64,
        cursor: Option<&LeaseCursor>,
        limit: usize,
        created_after: Option<&Timestamp>,
    ) -> LeasePage {
        let limit = limit.clamp(1, LEASES_PAGE);
        let state = self.lock();
        let mut mine: Vec<(LeaseCursor, &LeaseRecord)> = state
            .leases
            .iter()
            .filter(|(_, l)| l.cell_id == cell_id)
            .map(|(uuid, l)| {
                let at = l.record.created_at.as_ref().map_or(0, nanos);
                (
                    LeaseCursor {
                        created_at: at,
                        uuid: uuid.clone(),
                    },
                    &l.record,
                )
            })
            .filter(|(c, _)| created_after.is_none_or(|t| c.created_at >= nanos(t)))
            .filter(|(c, _)| cursor.is_none_or(|after| c > after))
            .collect();
        mine.sort_by(|a, b| a.0.cmp(&b.0));
        let more = mine.len() > limit;
        mine.truncate(limit);
        LeasePage {
            next: more.then(|| mine.last().map(|(c, _)| c.clone())).flatten(),
            leases: mine.into_iter().map(|(_, r)| r.clone()).collect(),
        }
    }

    /// `ListRecords`: the records `filter` selects, by source key ascending, one
    /// page, and whether more follow.
    pub fn records(&self, filter: &RecordFilter) -> (Vec<Record>, bool) {
        let state = self.lock();
        let source_key = |r: &Record| -> Vec<u8> {
            r.metadata
                .as_ref()
                .and_then(|m| m.source.as_ref())
                .map(|s| s.rails_primary_key_id.clone())
                .unwrap_or_default()
        };
        let mut hits: Vec<(Vec<u8>, &Record)> = state
            .records
            .iter()
            .filter(|(k, r)| {
                let source_type = r
                    .metadata
                    .as_ref()
                    .and_then(|m| m.source.as_ref())
                    .map_or(0, |s| s.r#type);
                r.cell_id == filter.cell_id
                    && (filter.source_type == 0 || source_type == filter.source_type)
                    && (filter.bucket_types.is_empty() || filter.bucket_types.contains(&k.bucket))
                    && (filter.claim_types.is_empty() || filter.claim_types.contains(&k.bucket))
            })
            .map(|(_, r)| (source_key(r), r))
            .filter(|(s, _)| {
                (filter.source_id_gt.is_empty() || *s > filter.source_id_gt)
                    && (filter.source_id_lte.is_empty() || *s <= filter.source_id_lte)
            })
            .collect();
        hits.sort_by(|a, b| a.0.cmp(&b.0));
        let mut end = hits.len().min(RECORDS_PAGE);
        // Never end a page inside one source row's records.
        while end < hits.len() && end > 0 && hits[end].0 == hits[end - 1].0 {
            end += 1;
        }
        let truncated = end < hits.len();
        (
            hits.into_iter().take(end).map(|(_, r)| r.clone()).collect(),
            truncated,
        )
    }
}
