//! The connection: one type over a standalone server and a Cluster, and the slot
//! a key's commands are confined to.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::error::{Error, Result};

/// The slot a Cluster pipeline is confined to (`None`: standalone, anything goes).
pub(super) type SlotGroup = Option<redis::cluster_routing::Slot>;

/// A connection to either kind of deployment; cheap to clone (multiplexed). Also
/// the Topology Service's claims connection (`podgate-topology-service`).
#[derive(Clone)]
pub enum Conn {
    /// One server, reconnected by the manager.
    Single(ConnectionManager),
    /// A Cluster.
    Cluster(ClusterConnection),
}

impl Conn {
    /// The slot `key` lives in, when that limits what one pipeline may hold.
    pub(super) fn slot_of(&self, key: &str) -> SlotGroup {
        match self {
            Conn::Single(_) => None,
            Conn::Cluster(_) => Some(redis::cluster_routing::Slot::for_key(key.as_bytes())),
        }
    }
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

/// A client for `url`; a bad URL is a configuration error.
pub(super) fn client_for(url: &str) -> Result<redis::Client> {
    redis::Client::open(url).map_err(|e| Error::Config {
        origin: "redis".into(),
        problems: vec![format!("redis url {url:?}: {e}")],
    })
}
