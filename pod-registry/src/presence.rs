//! Presence: which kas instances run, and which agent connections each of them holds
//! (the seed's `ConnectedAgentInfo` and `KasInstanceInfo`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a kas instance can be reached by other kas instances (its *internal*
/// endpoint), e.g. `grpc://10.0.0.5:8155`. Also the kas's identity in the registry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KasAddress(pub String);

impl fmt::Display for KasAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for KasAddress {
    fn from(s: &str) -> Self {
        KasAddress(s.to_owned())
    }
}

/// One agentk → kas connection (one `GetConfiguration` stream of one agent replica).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConnection {
    /// The agent's id.
    pub agent_id: i64,
    /// Random per connection; with `agent_id` it names one agentk replica.
    pub connection_id: i64,
    /// The agent's configuration project.
    pub project_id: i64,
    /// agentk version.
    #[serde(default)]
    pub version: String,
    /// agentk commit.
    #[serde(default)]
    pub commit: String,
    /// Kubernetes namespace of the agentk pod.
    #[serde(default)]
    pub pod_namespace: String,
    /// Name of the agentk pod.
    #[serde(default)]
    pub pod_name: String,
    /// When the connection was established, Unix milliseconds.
    pub connected_at_ms: u64,
    /// The kas holding the connection.
    pub kas: KasAddress,
}

/// One running kas instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KasInstance {
    /// Its internal address, which is also its identity.
    pub address: KasAddress,
    /// kas version.
    #[serde(default)]
    pub version: String,
    /// kas commit.
    #[serde(default)]
    pub commit: String,
    /// The Pod this kas serves, if known.
    #[serde(default)]
    pub pod_id: Option<u64>,
    /// When it started, Unix milliseconds.
    #[serde(default)]
    pub started_at_ms: u64,
}

/// What presence listeners hear.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// An agent connection was registered somewhere.
    Connected {
        /// The agent.
        agent_id: i64,
        /// The connection.
        connection_id: i64,
        /// The kas holding it.
        kas: KasAddress,
    },
    /// An agent connection ended.
    Disconnected {
        /// The agent.
        agent_id: i64,
        /// The connection.
        connection_id: i64,
        /// The kas that held it.
        kas: KasAddress,
    },
    /// Events may have been missed (the subscription was lost and re-established, or
    /// this listener fell behind): re-read whatever you wait for.
    Resync,
}

/// A stored value with its own expiry, as kept in every backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Expiring<T> {
    /// Unix milliseconds after which readers ignore the value and GC removes it.
    pub(crate) expires_at_ms: u64,
    #[serde(flatten)]
    pub(crate) value: T,
}

/// A connection this process owns, with its JSON serialised once at registration.
#[derive(Debug)]
pub(crate) struct OwnedConn {
    pub(crate) conn: AgentConnection,
    /// `conn` as JSON.
    pub(crate) json: String,
}

impl OwnedConn {
    pub(crate) fn new(conn: AgentConnection) -> Self {
        let json = serde_json::to_string(&conn).expect("a connection serialises");
        OwnedConn { json, conn }
    }
}

/// Now as Unix milliseconds: the wall clock, moved by however far tokio's clock is
/// from the monotonic one. In a running process the two agree and this is the wall
/// clock; under `tokio::time::pause` expiries follow the paused clock, so tests of
/// TTLs advance time instead of waiting for it.
///
/// The wall and monotonic clocks are read as a bracketed pair (wall, monotonic,
/// wall), again if the two wall readings are more than 1 ms apart: a thread
/// preempted between two unbracketed readings moved "now" back by as long as it
/// was off the CPU, and an expiry checked just after its TTL passed looked alive
/// (the Redis conformance TTL test failed once so in a loaded CI run).
pub(crate) fn now_ms() -> u64 {
    fn wall_us() -> i128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i128)
    }
    let (mut wall, mut std_now) = (0i128, std::time::Instant::now());
    for _ in 0..4 {
        let before = wall_us();
        std_now = std::time::Instant::now();
        let after = wall_us();
        wall = before + (after - before) / 2;
        if after - before <= 1_000 {
            break;
        }
    }
    let tokio_now = tokio::time::Instant::now().into_std();
    let offset = if tokio_now >= std_now {
        tokio_now.duration_since(std_now).as_micros() as i128
    } else {
        -(std_now.duration_since(tokio_now).as_micros() as i128)
    };
    ((wall + offset) / 1000).max(0) as u64
}
