//! The topology in one hash (`P:{topology}`): read whole, changed by
//! compare-and-set on its `version` field, announced on the topology channel.

use std::collections::HashMap;
use std::sync::Arc;

use super::RedisBackend;
use super::keys::corrupt;
use crate::backend::TopologyChange;
use crate::error::{Error, Result};
use crate::topology::{Pod, Topology};

/// How many times a topology change is re-read and re-applied when another process
/// changed the topology first.
const CAS_ATTEMPTS: u32 = 16;

impl RedisBackend {
    pub(super) async fn load_topology(&self) -> Result<Topology> {
        let key = self.keys.topology();
        let raw: HashMap<String, Vec<u8>> = self
            .run("topology_load", |mut c| {
                let key = key.clone();
                async move { redis::cmd("HGETALL").arg(key).query_async(&mut c).await }
            })
            .await?;
        decode_topology(&key, &raw)
    }

    pub(super) async fn update_topology(&self, change: &TopologyChange) -> Result<Topology> {
        let key = self.keys.topology();
        for _attempt in 0..CAS_ATTEMPTS {
            let current = self.load_topology().await?;
            let next = change.apply(&current)?;
            let mut inv = self.cas_script.key(&key);
            inv.arg(current.version);
            for (field, value) in topology_diff(&current, &next)? {
                inv.arg(field).arg(value);
            }
            let version: i64 = self
                .run("topology_update", |mut c| async move {
                    inv.invoke_async(&mut c).await
                })
                .await?;
            if version < 0 {
                continue; // someone else changed it first: re-read and re-apply
            }
            self.publish(self.keys.topology_channel(), version).await?;
            let mut next = next;
            next.version = version as u64;
            return Ok(next);
        }
        Err(Error::Contention {
            what: "the topology",
            attempts: CAS_ATTEMPTS,
        })
    }
}

fn decode_topology(key: &str, raw: &HashMap<String, Vec<u8>>) -> Result<Topology> {
    let bad = |reason: String| Error::Corrupt {
        key: key.to_owned(),
        reason,
    };
    let mut t = Topology::default();
    for (field, value) in raw {
        let text = std::str::from_utf8(value).map_err(|_| bad(format!("{field}: not UTF-8")))?;
        if field == "version" {
            t.version = text
                .parse()
                .map_err(|_| bad("version: not an integer".into()))?;
        } else if field == "default" {
            t.default_pod = Some(
                text.parse()
                    .map_err(|_| bad("default: not a Pod id".into()))?,
            );
        } else if field.starts_with("pod:") {
            let pod: Pod = serde_json::from_str(text).map_err(|e| bad(format!("{field}: {e}")))?;
            t.pods.insert(pod.id, Arc::new(pod));
        }
    }
    Ok(t)
}

/// The hash writes that turn `from` into `to` (empty value: delete the field).
fn topology_diff(from: &Topology, to: &Topology) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (id, pod) in &to.pods {
        if from.pods.get(id) != Some(pod) {
            let json = serde_json::to_string(&**pod).map_err(|e| corrupt("pod", e))?;
            out.push((format!("pod:{id}"), json));
        }
    }
    for id in from.pods.keys() {
        if !to.pods.contains_key(id) {
            out.push((format!("pod:{id}"), String::new()));
        }
    }
    if from.default_pod != to.default_pod {
        out.push((
            "default".into(),
            to.default_pod.map(|d| d.to_string()).unwrap_or_default(),
        ));
    }
    Ok(out)
}
