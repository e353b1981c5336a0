//! Presence: which kas instances run, and which agent connections each of them holds
//! (the `ConnectedAgentInfo` and `KasInstanceInfo` of kas's request routing design,
//! `doc/kas_request_routing.md` in gitlab-org/cluster-integration/gitlab-agent).

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
    /// The version of the agent's cluster, as agentk last registered it (none: an
    /// agentk that sent none, or one registered before this field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<KubernetesVersion>,
    /// When the connection was established, Unix milliseconds.
    pub connected_at_ms: u64,
    /// The kas holding the connection.
    pub kas: KasAddress,
}

/// The Kubernetes API server's version an agent reports (GitLab's
/// `entity.KubernetesVersion`, from the server's `/version`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesVersion {
    /// `major`, e.g. `1`.
    #[serde(default)]
    pub major: String,
    /// `minor`, e.g. `32`.
    #[serde(default)]
    pub minor: String,
    /// `gitVersion`, e.g. `v1.32.0`.
    #[serde(default)]
    pub git_version: String,
    /// `platform`, e.g. `linux/amd64`.
    #[serde(default)]
    pub platform: String,
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

impl AgentEvent {
    /// The event announcing `conn`.
    pub(crate) fn connected(conn: &AgentConnection) -> Self {
        AgentEvent::Connected {
            agent_id: conn.agent_id,
            connection_id: conn.connection_id,
            kas: conn.kas.clone(),
        }
    }

    /// The event announcing that `conn` ended.
    pub(crate) fn disconnected(conn: &AgentConnection) -> Self {
        AgentEvent::Disconnected {
            agent_id: conn.agent_id,
            connection_id: conn.connection_id,
            kas: conn.kas.clone(),
        }
    }
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
/// The wall clock's offset from the monotonic clock is measured once and then
/// kept: "now" is that offset plus tokio's clock, so within a process it moves
/// exactly as tokio's clock does. Reading the two clocks at every call would give
/// each call its own measurement error, up to the time a preempted thread is off
/// the CPU between the readings, even with bracketed readings: on a loaded machine
/// an expiry checked 2 ms after its TTL could look alive.
/// The offset is measured again every [`CLOCK_REMEASURE`] of real time and taken
/// only when it moved by [`CLOCK_STEP`] or more: a step of the wall clock (NTP,
/// an operator), which other kas instances see too.
pub(crate) fn now_ms() -> u64 {
    use std::sync::{Mutex, OnceLock};
    static ANCHOR: OnceLock<std::time::Instant> = OnceLock::new();
    /// (when measured, wall clock minus monotonic clock since [`ANCHOR`], in µs).
    static OFFSET: Mutex<Option<(std::time::Instant, i128)>> = Mutex::new(None);
    let anchor = *ANCHOR.get_or_init(std::time::Instant::now);
    let since_anchor = |t: std::time::Instant| -> i128 {
        match t.checked_duration_since(anchor) {
            Some(d) => d.as_micros() as i128,
            None => -(anchor.duration_since(t).as_micros() as i128),
        }
    };
    let offset = {
        let mut kept = OFFSET.lock().unwrap_or_else(|e| e.into_inner());
        match *kept {
            Some((at, offset)) if at.elapsed() < CLOCK_REMEASURE => offset,
            previous => {
                let (wall, mono) = wall_and_monotonic();
                let fresh = wall - since_anchor(mono);
                let offset = match previous {
                    Some((_, old)) if (old - fresh).abs() < CLOCK_STEP.as_micros() as i128 => old,
                    _ => fresh,
                };
                *kept = Some((std::time::Instant::now(), offset));
                offset
            }
        }
    };
    let now = offset + since_anchor(tokio::time::Instant::now().into_std());
    (now / 1000).max(0) as u64
}

/// How often [`now_ms`] measures the wall clock against the monotonic one.
const CLOCK_REMEASURE: std::time::Duration = std::time::Duration::from_secs(10);
/// The smallest change of that offset [`now_ms`] takes as a step of the wall clock.
const CLOCK_STEP: std::time::Duration = std::time::Duration::from_millis(50);

/// The wall clock (µs since the Unix epoch) and the monotonic clock at one
/// instant: read as a bracketed pair (wall, monotonic, wall), again while the two
/// wall readings are more than 1 ms apart, at most four times.
fn wall_and_monotonic() -> (i128, std::time::Instant) {
    fn wall_us() -> i128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i128)
    }
    let (mut wall, mut mono) = (0i128, std::time::Instant::now());
    for _ in 0..4 {
        let before = wall_us();
        mono = std::time::Instant::now();
        let after = wall_us();
        wall = before + (after - before) / 2;
        if after - before <= 1_000 {
            break;
        }
    }
    (wall, mono)
}

#[cfg(test)]
mod clock_tests {
    use super::now_ms;

    /// Under paused time "now" moves exactly as tokio's clock, however long the
    /// real time between readings (the offset is not measured again per call).
    #[tokio::test(start_paused = true)]
    async fn now_moves_exactly_with_tokios_clock() {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let a = now_ms();
        assert!(a.abs_diff(wall) < 1_000, "{a} is the wall clock ({wall})");
        for step in [1u64, 59_999, 60_000, 2] {
            let before = now_ms();
            tokio::time::advance(std::time::Duration::from_millis(step)).await;
            // Real time passes too, between readings and a preemption or two.
            std::thread::sleep(std::time::Duration::from_millis(3));
            assert_eq!(now_ms() - before, step);
        }
    }
}
