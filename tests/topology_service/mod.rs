//! `podgate topology-service` against clients shaped as GitLab's, each written
//! from the GitLab source that calls a Topology Service, on the generated stubs of
//! podgate's transcription of GitLab's schema (which compiles to the descriptors
//! GitLab's client gem carries, byte for byte: the crate's
//! `the_transcription_is_gitlabs_schema_byte_for_byte`):
//!
//! - [`rails`]: Rails' claim lifecycle (`app/models/cells/transaction_record.rb`,
//!   `lib/gitlab/topology_service_client/claim_service.rb` in gitlabhq/gitlabhq):
//!   `BeginUpdate` in a transaction then `CommitUpdate` or `RollbackUpdate`,
//!   `ALREADY_EXISTS`, the `ListLeases` warm-up, `ListRecords` paging, `GetCell`
//!   and health;
//! - [`shell`]: gitlab-shell's `Classify` (`internal/topology/` in
//!   gitlabhq/gitlab-shell): the retired field 4 and the `claims` chain, route,
//!   username and SSH fingerprint claims, its timeout and retries;
//! - [`router`]: the HTTP Router's REST classify and mail room's `FIRST_CELL`;
//! - [`snapshot`]: the paths of Rails' route snapshot through the proxy;
//! - [`proxy`]: podgate's proxy routing by path through it, as the HTTP Router
//!   does, and falling through when it is gone.

mod proxy;
mod rails;
mod router;
mod shell;
mod snapshot;
mod tls;
mod up;

use std::time::Duration;

use tonic::transport::Channel;

use podgate_registry::testing::{RedisCluster, RedisServer};

use crate::common::{Running, first_line, spawn_podgate};

/// A running `podgate topology-service` with three Cells (`cell-1` the first).
pub struct Ts {
    _process: Running,
    _dir: tempfile::TempDir,
    /// Where it listens (gRPC and REST).
    pub addr: std::net::SocketAddr,
    _redis: Option<RedisServer>,
    _cluster: Option<RedisCluster>,
}

/// Where a test's Topology Service keeps its claims.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Memory,
    /// A real `redis-server` on a free port.
    Redis,
    /// A real 3-master Redis Cluster.
    RedisCluster,
}

/// Starts `podgate topology-service` on a free port with its claims on `backend`.
pub fn start_on_backend(backend: Backend) -> Ts {
    let (section, redis, cluster) = match backend {
        Backend::Memory => (String::new(), None, None),
        Backend::Redis => {
            let r = RedisServer::start();
            (
                format!(
                    "[claims]\nbackend = {{ kind = \"redis\", url = \"{}\" }}\n",
                    r.url()
                ),
                Some(r),
                None,
            )
        }
        Backend::RedisCluster => {
            let c = RedisCluster::start();
            (
                format!(
                    "[claims]\nbackend = {{ kind = \"redis-cluster\", nodes = {:?} }}\n",
                    c.urls()
                ),
                None,
                Some(c),
            )
        }
    };
    let mut ts = start_with(0, &section);
    ts._redis = redis;
    ts._cluster = cluster;
    ts
}

/// One test per backend for each `name => scenario`: `name::memory`,
/// `name::redis`, `name::redis_cluster`, each running `scenario(&Ts)`.
macro_rules! on_every_backend {
    ($($name:ident => $scenario:ident;)*) => {$(
        mod $name {
            use crate::topology_service::{Backend, start_on_backend};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                super::$scenario(&start_on_backend(Backend::Memory)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$scenario(&start_on_backend(Backend::Redis)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_cluster() {
                super::$scenario(&start_on_backend(Backend::RedisCluster)).await;
            }
        }
    )*};
}
pub(crate) use on_every_backend;

/// The Cells every test's Topology Service knows.
pub const CELLS: &str = "\
[[cells]]
id = 1
address = \"cell-1.example.com:443\"
session_prefix = \"cell-1\"
sequence_ranges = [{ minval = 1, maxval = 999999999999 }]
[[cells]]
id = 2
address = \"cell-2.example.com:443\"
session_prefix = \"cell-2\"
sequence_ranges = [{ minval = 1000000000000, maxval = 1099999999999 }]
[[cells]]
id = 3
address = \"cell-3.example.com\"
session_prefix = \"cell-3\"
";

/// Starts `podgate topology-service` on a free port.
pub fn start() -> Ts {
    start_on(0)
}

/// Starts `podgate topology-service` on `port` (0: a free one).
pub fn start_on(port: u16) -> Ts {
    start_with(port, "")
}

/// Starts `podgate topology-service` on `port` (0: a free one), `extra` TOML
/// after the Cells.
fn start_with(port: u16, extra: &str) -> Ts {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topology-service.toml");
    std::fs::write(
        &path,
        format!("listen = \"127.0.0.1:{port}\"\n{CELLS}{extra}"),
    )
    .unwrap();
    let (child, lines) = spawn_podgate(["topology-service", "--config", path.to_str().unwrap()]);
    let addr = first_line(
        &lines,
        Duration::from_secs(30),
        "podgate topology-service",
        |l| {
            l.strip_prefix("topology_service address=")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|a| a.parse().ok())
        },
    );
    Ts {
        _process: Running(child),
        _dir: dir,
        addr,
        _redis: None,
        _cluster: None,
    }
}

impl Ts {
    /// A gRPC channel, h2c, as GitLab's clients dial with TLS off.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

/// Commits `claims` (bucket type, value) for `cell_id` in one lease, as a Cell's
/// Rails does.
pub async fn claim(ts: &Ts, cell_id: i64, claims: &[(ts_proto::claims::v1::bucket::Type, &str)]) {
    use ts_proto::claims::v1 as cv1;
    let mut c = cv1::claim_service_client::ClaimServiceClient::new(ts.channel().await);
    let create = claims
        .iter()
        .enumerate()
        .map(|(i, (t, v))| cv1::Metadata {
            bucket: Some(cv1::Bucket {
                r#type: *t as i32,
                value: (*v).to_owned(),
            }),
            source: Some(cv1::Source {
                r#type: cv1::source::Type::RailsTableRoutes as i32,
                rails_primary_key_id: (i as u64 + 1).to_be_bytes().to_vec(),
            }),
            ..Default::default()
        })
        .collect();
    commit(&mut c, cell_id, create).await;
}

/// `BeginUpdate` with `create` for `cell_id`, then `CommitUpdate` of its lease, on
/// client `c`; each must succeed.
pub async fn commit(
    c: &mut ts_proto::claims::v1::claim_service_client::ClaimServiceClient<Channel>,
    cell_id: i64,
    create: Vec<ts_proto::claims::v1::Metadata>,
) {
    use ts_proto::claims::v1 as cv1;
    let lease = c
        .begin_update(cv1::BeginUpdateRequest {
            create_records: create,
            cell_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .lease_uuid;
    c.commit_update(cv1::CommitUpdateRequest {
        cell_id,
        lease_uuid: lease,
    })
    .await
    .unwrap();
}

use podgate_topology_service::proto::gitlab::cells::topology_service as ts_proto;
