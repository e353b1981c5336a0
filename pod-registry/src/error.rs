//! The registry's one error type.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Errors from the registry.
#[derive(Debug, Error)]
pub enum Error {
    /// The backend (Redis) failed or is unreachable. Transient: retry later; the
    /// registry's own background tasks already do, with back-off.
    #[error("registry backend error during {op}: {source}")]
    Backend {
        /// The operation that failed (`register`, `lookup`, `refresh`, …).
        op: &'static str,
        /// The cause.
        #[source]
        source: redis::RedisError,
    },
    /// A stored value could not be decoded (written by an incompatible version, or
    /// by hand). Not transient: the entry is skipped and counted.
    #[error("registry value under {key} is not valid: {reason}")]
    Corrupt {
        /// The Redis key (or in-memory table).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Configuration is invalid; every problem is listed with the field it names.
    #[error("invalid configuration in {origin}: {}", problems.join("; "))]
    Config {
        /// Where the configuration came from (a file, `--redis`, …).
        origin: String,
        /// Each problem, naming its field.
        problems: Vec<String>,
    },
    /// Other processes changed the same shared state (the topology) every time this
    /// one tried. Transient: try again.
    #[error("{what}: changed concurrently {attempts} times in a row; try again")]
    Contention {
        /// What was being changed.
        what: &'static str,
        /// How many times the change was re-read and re-applied.
        attempts: u32,
    },
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The topology source cannot be changed (a static file).
    #[error("the topology comes from a static file and cannot be changed here")]
    ReadOnly,
    /// No such Pod.
    #[error("no Pod with id {0}")]
    NoSuchPod(podgate_tokens::PodId),
    /// `wait_for_agent` reached its deadline with no connection for the agent.
    #[error("agent {agent_id} did not connect within {waited:?}")]
    AgentNotConnected {
        /// The agent waited for.
        agent_id: i64,
        /// How long we waited.
        waited: Duration,
    },
}

impl Error {
    pub(crate) fn backend(op: &'static str) -> impl FnOnce(redis::RedisError) -> Error {
        move |source| Error::Backend { op, source }
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Backend { .. } | Error::AgentNotConnected { .. } | Error::Contention { .. }
        )
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
