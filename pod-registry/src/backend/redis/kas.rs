//! kas instances, in one hash (`P:{kas}:instances`): address → instance JSON with
//! its own expiry. Written by the refresh, removed at shutdown. And the events one
//! kas publishes to all (`kas_events`).

use super::RedisBackend;
use super::keys::decode;
use crate::error::Result;
use crate::presence::{Expiring, KasAddress, KasInstance, now_ms};

impl RedisBackend {
    pub(super) async fn put_kas_instance(&self, i: &KasInstance, ttl_ms: u64) -> Result<()> {
        self.refresh(&[], Some(i), ttl_ms).await
    }

    pub(super) async fn remove_kas_instance(&self, addr: &KasAddress) -> Result<()> {
        let key = self.keys.kas_instances();
        let field = addr.0.clone();
        self.run("unregister", |mut c| async move {
            redis::cmd("HDEL")
                .arg(key)
                .arg(field)
                .query_async(&mut c)
                .await
        })
        .await
    }

    /// `PUBLISH kas_events payload`: GitLab's channel, not under the prefix, so kas
    /// instances of GitLab's and of podgate's on one Redis hear each other.
    pub(super) async fn publish_kas_event(&self, payload: &[u8]) -> Result<()> {
        self.publish(self.keys.kas_events_channel(), payload.to_vec())
            .await
    }

    pub(super) async fn kas_instances(&self) -> Result<Vec<KasInstance>> {
        let key = self.keys.kas_instances();
        let now = now_ms();
        let mut out: Vec<KasInstance> = self
            .hgetall(key.clone())
            .await?
            .into_iter()
            .filter_map(|(_, v)| decode::<Expiring<KasInstance>>(&key, &v, &self.health))
            .filter(|e| e.expires_at_ms > now)
            .map(|e| e.value)
            .collect();
        out.sort_by(|a, b| a.address.cmp(&b.address));
        Ok(out)
    }
}
