//! Garbage collection: the GC script on every key this process writes, 64 at a
//! time. Its cost grows with what this process owns, never with the keyspace.

use futures_util::{StreamExt as _, stream};

use super::RedisBackend;
use crate::error::Result;
use crate::presence::now_ms;

impl RedisBackend {
    /// Remove expired fields from every key this process writes (its owned scope),
    /// each key atomically. Returns how many fields went.
    /// `owned` lists the (project, agent) pairs this process holds connections of.
    pub(super) async fn gc(&self, owned: &[(i64, i64)]) -> Result<usize> {
        let mut keys: Vec<String> = Vec::with_capacity(owned.len() * 3 + 1);
        for &(project, agent) in owned {
            keys.push(self.keys.project(project));
            keys.push(self.keys.agent(project, agent));
            keys.push(self.keys.pointers(agent));
        }
        keys.push(self.keys.kas_instances());
        keys.sort();
        keys.dedup();
        let now = now_ms();
        let removed: Vec<Result<i64>> = stream::iter(keys)
            .map(|key| {
                let script = self.gc_script.clone();
                async move {
                    self.run("gc", |mut c| async move {
                        script.key(key).arg(now).invoke_async(&mut c).await
                    })
                    .await
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let mut total = 0usize;
        for r in removed {
            total += r? as usize;
        }
        Ok(total)
    }
}
