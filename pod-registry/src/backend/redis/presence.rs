//! Presence writes of one connection: register (the agent's pointer, then its
//! project membership and agent hash in one `MULTI`/`EXEC`), unregister, and the
//! event each announces.

use redis::Cmd;

use super::RedisBackend;
use super::keys::{
    conn_field, corrupt, exp_field, holding_value, kas_field, member_field, pointer_value,
};
use crate::error::Result;
use crate::presence::{AgentConnection, AgentEvent, OwnedConn, now_ms};

/// `HSET key f v …` and `PEXPIRE key ttl`.
pub(super) fn hset_pexpire<'a>(
    key: &str,
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ttl_ms: u64,
) -> Vec<Cmd> {
    let mut hset = redis::cmd("HSET");
    hset.arg(key);
    for (f, v) in fields {
        hset.arg(f).arg(v);
    }
    let mut pexpire = redis::cmd("PEXPIRE");
    pexpire.arg(key).arg(ttl_ms);
    vec![hset, pexpire]
}

impl RedisBackend {
    /// The writes of one registration, all in the `{p:<project>}` slot: membership
    /// in the project index, and the connection and kas holding in the agent hash.
    fn registration_writes(&self, owned: &OwnedConn, exp: u64, ttl_ms: u64) -> Vec<Cmd> {
        let c = &owned.conn;
        let member = holding_value(exp);
        let mut cmds = hset_pexpire(
            &self.keys.project(c.project_id),
            [(member_field(c).as_bytes(), member.as_bytes())],
            ttl_ms,
        );
        cmds.extend(hset_pexpire(
            &self.keys.agent(c.project_id, c.agent_id),
            [
                (
                    conn_field(c.connection_id).as_bytes(),
                    owned.json.as_bytes(),
                ),
                (
                    exp_field(c.connection_id).as_bytes(),
                    exp.to_string().as_bytes(),
                ),
                (kas_field(&c.kas).as_bytes(), member.as_bytes()),
            ],
            ttl_ms,
        ));
        cmds
    }

    /// Register one connection: the agent→project pointer, then the project index and
    /// the agent hash in one MULTI/EXEC with one expiry, then the event.
    pub(super) async fn register(&self, owned: &OwnedConn, ttl_ms: u64) -> Result<()> {
        let conn = &owned.conn;
        let exp = now_ms() + ttl_ms;
        let key = self.keys.pointers(conn.agent_id);
        let mut pointer = redis::pipe();
        for cmd in hset_pexpire(
            &key,
            [(
                conn.agent_id.to_string().as_bytes(),
                pointer_value(conn.project_id, exp).as_bytes(),
            )],
            ttl_ms,
        ) {
            pointer.add_command(cmd).ignore();
        }
        self.run("register", |mut c| async move {
            pointer.query_async::<()>(&mut c).await
        })
        .await?;
        let mut p = redis::pipe();
        p.atomic();
        for cmd in self.registration_writes(owned, exp, ttl_ms) {
            p.add_command(cmd).ignore();
        }
        self.run("register", |mut c| async move {
            p.query_async::<()>(&mut c).await
        })
        .await?;
        self.publish_agent(&AgentEvent::connected(conn)).await
    }

    /// Remove one connection (and, when asked, this kas's holding of the agent) in one
    /// MULTI/EXEC. The pointer stays: other kas may hold the agent; it expires.
    pub(super) async fn unregister(
        &self,
        conn: &AgentConnection,
        drop_holding: bool,
    ) -> Result<()> {
        let k = &self.keys;
        let mut p = redis::pipe();
        p.atomic();
        p.cmd("HDEL")
            .arg(k.project(conn.project_id))
            .arg(member_field(conn))
            .ignore();
        let mut hdel = redis::cmd("HDEL");
        hdel.arg(k.agent(conn.project_id, conn.agent_id))
            .arg(conn_field(conn.connection_id))
            .arg(exp_field(conn.connection_id));
        if drop_holding {
            hdel.arg(kas_field(&conn.kas));
        }
        p.add_command(hdel).ignore();
        self.run("unregister", |mut c| async move {
            p.query_async::<()>(&mut c).await
        })
        .await?;
        self.publish_agent(&AgentEvent::disconnected(conn)).await
    }

    async fn publish_agent(&self, event: &AgentEvent) -> Result<()> {
        let payload = serde_json::to_string(event).map_err(|e| corrupt("event", e))?;
        self.publish(self.keys.agents_channel(), payload).await
    }
}
