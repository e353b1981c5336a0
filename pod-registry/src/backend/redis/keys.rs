//! The key schema: key names under one prefix, the hash fields inside them, the
//! small JSON values written by hand (the table is in the crate docs), and how
//! stored values are decoded.

use crate::error::Error;
use crate::metrics::Health;
use crate::presence::{AgentConnection, KasAddress};

/// Agent→project pointers live in this many hashes (`{a:<agent mod N>}:agents`), so
/// a refresh writes them with a few thousand commands, not one per agent.
pub(crate) const POINTER_BUCKETS: i64 = 1024;

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
    /// GitLab's kas events channel (`eventsRedisChannel` in
    /// <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/cmd/kas/kasapp/server_api.go>),
    /// which GitLab does not put under its key prefix either.
    pub(crate) fn kas_events_channel(&self) -> String {
        "kas_events".to_owned()
    }
}

/// A connection's field in its project index: `<agent>:<connection>`.
pub(super) fn member_field(c: &AgentConnection) -> String {
    format!("{}:{}", c.agent_id, c.connection_id)
}

/// A connection's JSON in its agent hash: `conn:<connection>`.
pub(super) fn conn_field(connection_id: i64) -> String {
    format!("conn:{connection_id}")
}

/// A connection's expiry (Unix ms) in its agent hash: `exp:<connection>`.
pub(super) fn exp_field(connection_id: i64) -> String {
    format!("exp:{connection_id}")
}

/// A kas's holding of the agent in its agent hash: `kas:<address>`.
pub(super) fn kas_field(kas: &KasAddress) -> String {
    format!("kas:{}", kas.0)
}

/// The value of a project membership and of a kas holding.
pub(super) fn holding_value(exp: u64) -> String {
    format!("{{\"expires_at_ms\":{exp}}}")
}

/// The value of an agent's pointer to its project.
pub(super) fn pointer_value(project: i64, exp: u64) -> String {
    format!("{{\"expires_at_ms\":{exp},\"project\":{project}}}")
}

/// A [`holding_value`] as read back.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Empty {}

/// A [`pointer_value`] as read back (with its `Expiring` wrapper).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Pointer {
    pub(super) project: i64,
}

/// A value that could not be encoded, as an error naming `what` it was.
pub(super) fn corrupt(what: &str, e: serde_json::Error) -> Error {
    Error::Corrupt {
        key: what.to_owned(),
        reason: e.to_string(),
    }
}

/// Decode a stored JSON value; one that does not decode is counted as corrupt
/// (under `key`) and skipped.
pub(super) fn decode<T: serde::de::DeserializeOwned>(
    key: &str,
    raw: &[u8],
    health: &Health,
) -> Option<T> {
    match serde_json::from_slice(raw) {
        Ok(v) => Some(v),
        Err(e) => {
            health.corrupt(key, &e.to_string());
            None
        }
    }
}
