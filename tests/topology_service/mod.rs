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
//! - [`router`]: the HTTP Router's REST classify and mail room's `FIRST_CELL`.

mod rails;
mod router;
mod shell;

use std::time::Duration;

use tonic::transport::Channel;

use crate::common::{Running, first_line, spawn_podgate};

/// A running `podgate topology-service` with three Cells (`cell-1` the first).
pub struct Ts {
    _process: Running,
    _dir: tempfile::TempDir,
    /// Where it listens (gRPC and REST).
    pub addr: std::net::SocketAddr,
}

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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("topology-service.toml");
    std::fs::write(&path, format!("listen = \"127.0.0.1:0\"\n{CELLS}")).unwrap();
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
