//! Claims: which Cell owns a unique key (a top-level namespace's route, a
//! username, an email, a project id…), changed only through leases, as GitLab's
//! Topology Service keeps them (`claims.v1.ClaimService`).
//!
//! A Cell's Rails sends one `BeginUpdate` inside its database transaction: the
//! records to create (each `LEASE_CREATING`, refused whole with `ALREADY_EXISTS`
//! when any key is taken) and to destroy (each its own, `ACTIVE`, then
//! `LEASE_DESTROYING`). After its transaction commits it sends `CommitUpdate`
//! (creates become `ACTIVE`, destroys go), after a rollback `RollbackUpdate` (the
//! reverse). Both are idempotent and accepted only from the lease's own Cell.
//! Classification sees a key's owner while it is `ACTIVE` or `LEASE_DESTROYING`: a
//! claim counts from its commit until the commit of its destruction.
//!
//! - this module: the key a record is stored under, the [`Store`] and its errors;
//! - [`memory`]: the store in one process;
//! - [`redis`]: the store on Redis or a Redis Cluster, each change one script.

pub mod memory;
pub mod redis;

use prost_types::Timestamp;

use crate::proto::gitlab::cells::topology_service::claims::v1::{
    LeaseRecord, Metadata, Record, bucket,
};
use crate::proto::gitlab::cells::topology_service::types::v1::{Claim, claim};

/// Why a claim operation was refused; each maps to the gRPC code GitLab's clients
/// act on (Rails: `ALREADY_EXISTS` → "has already been taken").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A key to create is taken (`ALREADY_EXISTS`).
    #[error("{0} is already claimed")]
    AlreadyExists(String),
    /// No such record or lease (`NOT_FOUND`).
    #[error("{0}")]
    NotFound(String),
    /// The record cannot change now: another lease holds it, or another Cell owns
    /// it (`FAILED_PRECONDITION`).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The request itself is wrong (`INVALID_ARGUMENT`).
    #[error("{0}")]
    InvalidArgument(String),
    /// The lease is another Cell's (`PERMISSION_DENIED`).
    #[error("{0}")]
    PermissionDenied(String),
    /// The store could not be reached (`UNAVAILABLE`).
    #[error("claims store unavailable: {0}")]
    Unavailable(String),
}

/// A claim's identity: the bucket type (a `Bucket.Type`, whose numbers are the
/// `Claim` oneof's field numbers) and its value, case-folded where GitLab's
/// uniqueness is case-insensitive (routes, usernames, emails, domains).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// `Bucket.Type` as its number.
    pub bucket: i32,
    /// The value, normalised.
    pub value: String,
}

impl Key {
    /// The key of a bucket `{type, value}`.
    pub fn new(bucket: i32, value: &str) -> Self {
        let folded = matches!(
            bucket::Type::try_from(bucket),
            Ok(bucket::Type::Routes
                | bucket::Type::OrganizationPath
                | bucket::Type::RedirectRoutes
                | bucket::Type::Usernames
                | bucket::Type::Emails
                | bucket::Type::ServiceDeskCustomEmails
                | bucket::Type::PagesDomains
                | bucket::Type::PagesUniqueDomains)
        );
        Key {
            bucket,
            value: if folded {
                value.to_lowercase()
            } else {
                value.to_owned()
            },
        }
    }

    /// The key a record's metadata names (its `bucket`).
    pub fn of_metadata(m: &Metadata) -> Result<Self, Error> {
        let b = m
            .bucket
            .as_ref()
            .filter(|b| b.r#type != 0 && bucket::Type::try_from(b.r#type).is_ok())
            .ok_or_else(|| Error::InvalidArgument("metadata.bucket: a known type".into()))?;
        if b.value.is_empty() {
            return Err(Error::InvalidArgument(
                "metadata.bucket.value: must not be empty".into(),
            ));
        }
        Ok(Key::new(b.r#type, &b.value))
    }

    /// The key a classification claim names: the oneof's field number is the
    /// bucket type; numbers are written as decimal text, as Rails writes a bucket's
    /// value (`value.to_s`).
    pub fn of_claim(c: &Claim) -> Option<Self> {
        use claim::Claim as C;
        let (bucket, value) = match c.claim.as_ref()? {
            C::Route(v) => (1, v.clone()),
            C::OrganizationPath(v) => (2, v.clone()),
            C::RedirectRoute(v) => (3, v.clone()),
            C::Username(v) => (4, v.clone()),
            C::Email(v) => (5, v.clone()),
            C::ProjectId(v) => (6, v.to_string()),
            C::NamespaceId(v) => (7, v.to_string()),
            C::GpgKey(v) => (8, v.clone()),
            C::SshKey(v) => (9, v.clone()),
            C::UserId(v) => (10, v.to_string()),
            C::OrganizationId(v) => (11, v.to_string()),
            C::ServiceDeskCustomEmail(v) => (12, v.clone()),
            C::GpgKeyFingerprint(v) => (13, v.clone()),
            C::ServiceDeskProjectKeyAddressSlug(v) => (14, v.clone()),
            C::SshKeyFingerprint(v) => (15, v.clone()),
            C::SnippetId(v) => (16, v.to_string()),
            C::PagesDomain(v) => (17, v.clone()),
            C::PagesUniqueDomain(v) => (18, v.clone()),
        };
        Some(Key::new(bucket, &value))
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = bucket::Type::try_from(self.bucket).map_or("UNKNOWN", |t| t.as_str_name());
        write!(f, "{name} {:?}", self.value)
    }
}

/// What `ListRecords` asks for: one Cell's records, by source table, bucket and
/// claim type, with source keys in `(gt, lte]` (an empty `lte`: no upper bound).
#[derive(Clone, Debug, Default)]
pub struct RecordFilter {
    /// The Cell.
    pub cell_id: i64,
    /// `Source.Type`; 0: any.
    pub source_type: i32,
    /// `Bucket.Type`s; empty: any.
    pub bucket_types: Vec<i32>,
    /// `ClaimType`s (the same numbers); empty: any.
    pub claim_types: Vec<i32>,
    /// Source keys above this.
    pub source_id_gt: Vec<u8>,
    /// Source keys at most this; empty: no bound.
    pub source_id_lte: Vec<u8>,
}

/// A page of leases and where the next starts.
#[derive(Clone, Debug, Default)]
pub struct LeasePage {
    /// The leases, oldest first.
    pub leases: Vec<LeaseRecord>,
    /// The cursor for the next page; `None` at the end.
    pub next: Option<LeaseCursor>,
}

/// Where a lease listing goes on: after the lease created at `created_at` with
/// `uuid` (leases are listed by creation, then uuid).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeaseCursor {
    /// The last listed lease's creation, in nanoseconds since the epoch.
    pub created_at: i128,
    /// Its uuid.
    pub uuid: String,
}

/// Most records one `ListRecords` page returns (more when a page would otherwise
/// end inside the records of one source row, which a client paging by
/// `source_id_gt` would skip).
pub const RECORDS_PAGE: usize = 1000;

/// Most leases one `ListLeases` page returns, whatever `limit` asks.
pub const LEASES_PAGE: usize = 1000;

/// The keys of a `BeginUpdate`'s creates and destroys, checked as every store
/// checks them first: something to do, known buckets and values, no key twice.
pub fn checked(creates: &[Metadata], destroys: &[Metadata]) -> Result<(Vec<Key>, Vec<Key>), Error> {
    if creates.is_empty() && destroys.is_empty() {
        return Err(Error::InvalidArgument(
            "create_records and destroy_records are both empty".into(),
        ));
    }
    let create_keys = creates
        .iter()
        .map(Key::of_metadata)
        .collect::<Result<Vec<_>, _>>()?;
    let destroy_keys = destroys
        .iter()
        .map(Key::of_metadata)
        .collect::<Result<Vec<_>, _>>()?;
    let all: Vec<&Key> = create_keys.iter().chain(&destroy_keys).collect();
    for (i, k) in all.iter().enumerate() {
        if all[..i].contains(k) {
            return Err(Error::InvalidArgument(format!(
                "{k} appears twice in one update"
            )));
        }
    }
    Ok((create_keys, destroy_keys))
}

/// Where the claims are kept.
pub enum Store {
    /// In this process.
    Memory(memory::Memory),
    /// On Redis or a Redis Cluster.
    Redis(redis::RedisClaims),
}

impl Store {
    /// `BeginUpdate`: creates and destroys for `cell_id` under a new lease, all or
    /// nothing. Returns the lease's uuid.
    pub async fn begin(
        &self,
        cell_id: i64,
        creates: &[Metadata],
        destroys: &[Metadata],
    ) -> Result<String, Error> {
        match self {
            Store::Memory(m) => m.begin(cell_id, creates, destroys),
            Store::Redis(r) => r.begin(cell_id, creates, destroys).await,
        }
    }

    /// `CommitUpdate` (`commit`) or `RollbackUpdate`.
    pub async fn end(&self, cell_id: i64, lease: &str, commit: bool) -> Result<(), Error> {
        match self {
            Store::Memory(m) => m.end(cell_id, lease, commit),
            Store::Redis(r) => r.end(cell_id, lease, commit).await,
        }
    }

    /// The record of `key`, whatever its status.
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        match self {
            Store::Memory(m) => Ok(m.get(key)),
            Store::Redis(r) => r.get(key).await,
        }
    }

    /// The Cell that owns `key` for classification.
    pub async fn owner(&self, key: &Key) -> Result<Option<i64>, Error> {
        match self {
            Store::Memory(m) => Ok(m.owner(key)),
            Store::Redis(r) => r.owner(key).await,
        }
    }

    /// `ListLeases`.
    pub async fn leases(
        &self,
        cell_id: i64,
        cursor: Option<&LeaseCursor>,
        limit: usize,
        created_after: Option<&Timestamp>,
    ) -> Result<LeasePage, Error> {
        match self {
            Store::Memory(m) => Ok(m.leases(cell_id, cursor, limit, created_after)),
            Store::Redis(r) => r.leases(cell_id, cursor, limit, created_after).await,
        }
    }

    /// `ListRecords`: one page, and whether more follow.
    pub async fn records(&self, filter: &RecordFilter) -> Result<(Vec<Record>, bool), Error> {
        match self {
            Store::Memory(m) => Ok(m.records(filter)),
            Store::Redis(r) => r.records(filter).await,
        }
    }
}

/// Nanoseconds since the epoch of `t`.
pub fn nanos(t: &Timestamp) -> i128 {
    i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos)
}
