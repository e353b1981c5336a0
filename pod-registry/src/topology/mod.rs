//! The topology: which Pods exist, where they listen, and which one is the default.
//!
//! A [`Topology`] is an immutable snapshot; every change produces a new one with a
//! higher `version`. The proxy reads the current snapshot with one lock-free load.

//!
//! Layout: this file holds the [`Topology`] snapshot and the static
//! [`TopologyFile`]; `pod` holds [`Pod`] and [`PodState`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use podgate_tokens::PodId;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod pod;

pub use pod::{Pod, PodState};

/// An immutable view of every Pod at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Increases with every change (0: empty, never written).
    pub version: u64,
    /// The Pods by id.
    pub pods: BTreeMap<PodId, Arc<Pod>>,
    /// The default ("legacy") Pod: where requests with no route go.
    pub default_pod: Option<PodId>,
}

impl Topology {
    /// The Pod with this id.
    pub fn pod(&self, id: PodId) -> Option<&Arc<Pod>> {
        self.pods.get(&id)
    }

    /// The default ("legacy") Pod, if set and present.
    pub fn legacy_pod(&self) -> Option<&Arc<Pod>> {
        self.default_pod.and_then(|id| self.pods.get(&id))
    }

    /// The Pod whose session prefix starts `cookie_value` (`cell-2-…`).
    pub fn pod_for_session(&self, cookie_value: &str) -> Option<&Arc<Pod>> {
        self.pods.values().find(|p| {
            let prefix = p.session_prefix();
            cookie_value.len() > prefix.len()
                && cookie_value.starts_with(&prefix)
                && cookie_value.as_bytes()[prefix.len()] == b'-'
        })
    }

    /// Every problem in the snapshot, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (id, pod) in &self.pods {
            if pod.id != *id {
                bad.push(format!(
                    "pods[{id}].id: stored under {id} but says {}",
                    pod.id
                ));
            }
            bad.extend(pod.problems(&format!("pods[{id}]")));
        }
        bad.extend(self.global_problems());
        bad
    }

    /// Problems between Pods: the default must exist, session prefixes must differ.
    fn global_problems(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if let Some(d) = self.default_pod
            && !self.pods.contains_key(&d)
        {
            bad.push(format!("default_pod = {d}: no such Pod"));
        }
        let mut prefixes = BTreeMap::new();
        for pod in self.pods.values() {
            if let Some(other) = prefixes.insert(pod.session_prefix(), pod.id) {
                bad.push(format!(
                    "pods[{}].session_prefix: {:?} is also Pod {other}'s",
                    pod.id,
                    pod.session_prefix()
                ));
            }
        }
        bad
    }
}

/// A static topology file (TOML):
///
/// ```toml
/// default_pod = 1
///
/// [[pods]]
/// id = 1
/// name = "legacy"
/// web = ["10.0.0.1:8080", "10.0.0.2:8080"]
/// kas = ["10.0.0.1:8150"]
/// kas_k8s_proxy = ["10.0.0.1:8154"]   # kas's Kubernetes API proxy listener
/// kas_workspaces = ["10.0.0.1:8160"]  # kas's Workspaces HTTP server listener
/// runner_queue_redis = "redis://10.0.0.1:6379"  # optional: long polls held at the edge
///
/// [[pods]]
/// id = 2
/// name = "pod-2"
/// web = ["10.0.1.1:8080"]
/// state = "draining"
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    /// The default ("legacy") Pod's id.
    #[serde(default)]
    pub default_pod: Option<PodId>,
    /// The Pods.
    #[serde(default)]
    pub pods: Vec<Pod>,
}

impl TopologyFile {
    /// Parse and validate TOML text; `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let file: TopologyFile = toml::from_str(text).map_err(|e| Error::Config {
            origin: origin.to_owned(),
            problems: vec![e.to_string()],
        })?;
        file.validate(origin)?;
        Ok(file)
    }

    /// Read, parse and validate a topology file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Check every field; all problems are reported at once.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let mut bad = Vec::new();
        let mut seen = BTreeMap::new();
        for (i, pod) in self.pods.iter().enumerate() {
            if let Some(j) = seen.insert(pod.id, i) {
                bad.push(format!("pods[{i}].id = {}: also used by pods[{j}]", pod.id));
            }
        }
        for (i, pod) in self.pods.iter().enumerate() {
            bad.extend(pod.problems(&format!("pods[{i}]")));
        }
        bad.extend(self.to_topology(0).global_problems());
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Config {
                origin: origin.to_owned(),
                problems: bad,
            })
        }
    }

    /// The snapshot this file describes.
    pub fn to_topology(&self, version: u64) -> Topology {
        Topology {
            version,
            pods: self
                .pods
                .iter()
                .map(|p| (p.id, Arc::new(p.clone())))
                .collect(),
            default_pod: self.default_pod,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(n: u64) -> PodId {
        PodId::new(n).unwrap()
    }

    #[test]
    fn parses_the_documented_example() {
        let text = r#"
            default_pod = 1
            [[pods]]
            id = 1
            name = "legacy"
            web = ["10.0.0.1:8080", "10.0.0.2:8080"]
            kas = ["10.0.0.1:8150"]
            kas_k8s_proxy = ["10.0.0.1:8154"]
            kas_workspaces = ["10.0.0.1:8160"]
            [[pods]]
            id = 2
            name = "pod-2"
            web = ["[::1]:8080"]
            state = "draining"
            labels = { region = "eu" }
        "#;
        let f = TopologyFile::parse(text, "test").unwrap();
        let t = f.to_topology(1);
        assert_eq!(t.legacy_pod().unwrap().name, "legacy");
        assert_eq!(t.legacy_pod().unwrap().kas_k8s_proxy, ["10.0.0.1:8154"]);
        assert_eq!(t.legacy_pod().unwrap().kas_workspaces, ["10.0.0.1:8160"]);
        assert_eq!(t.pod(pod(2)).unwrap().state, PodState::Draining);
        // A Pod without the pool is stored without the field (readers that predate
        // it refuse unknown fields).
        let json = serde_json::to_string(t.pod(pod(2)).unwrap().as_ref()).unwrap();
        assert!(!json.contains("kas_k8s_proxy"), "{json}");
        assert_eq!(t.pod_for_session("cell-2-abcdef").unwrap().id, pod(2));
        assert!(t.pod_for_session("cell-20-abcdef").is_none());
        assert!(t.pod_for_session("cell-2").is_none());
    }

    #[test]
    fn a_retired_weight_still_parses_and_is_not_written() {
        let t = TopologyFile::parse(
            "[[pods]]\nid = 1\nname = 'x'\nweb = ['a:1']\nweight = 3",
            "t",
        )
        .unwrap()
        .to_topology(1);
        let pod = t.pod(PodId::new(1).unwrap()).unwrap();
        let json = serde_json::to_string(pod.as_ref()).unwrap();
        assert!(!json.contains("weight"), "{json}");
        let stored = r#"{"id":1,"name":"x","web":["a:1"],"state":"active","weight":1}"#;
        assert_eq!(serde_json::from_str::<Pod>(stored).unwrap().name, "x");
        assert!(serde_json::from_str::<Pod>(r#"{"id":1,"name":"x","wieght":1}"#).is_err());
    }

    #[test]
    fn validation_names_every_bad_field() {
        let text = r#"
            default_pod = 9
            [[pods]]
            id = 1
            name = ""
            web = ["no-port", "host:0"]
            [[pods]]
            id = 1
            name = "dup"
            web = ["a:1"]
            kas_k8s_proxy = ["k8s"]
            kas_workspaces = ["ws"]
            session_prefix = "bad prefix"
        "#;
        let err = TopologyFile::parse(text, "topo.toml")
            .unwrap_err()
            .to_string();
        for needle in [
            "topo.toml",
            "pods[1].id = 1: also used by pods[0]",
            "default_pod = 9",
            "web[0] = \"no-port\"",
            "web[1] = \"host:0\"",
            "kas_k8s_proxy[0] = \"k8s\"",
            "kas_workspaces[0] = \"ws\"",
            "name",
        ] {
            assert!(err.contains(needle), "{needle:?} missing from: {err}");
        }
        let err = TopologyFile::parse("[[pods]]\nid = 0\nname='x'\nweb=['a:1']", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("positive"), "{err}");
        let err = TopologyFile::parse("[[pods]]\nid = 1\nnmae='x'", "t")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nmae"), "{err}");
    }

    #[test]
    fn runner_queue_redis_is_optional_validated_and_stored_only_when_set() {
        let base = "[[pods]]\nid = 1\nname = 'x'\nweb = ['a:1']\n";
        for ok in [
            "redis://10.0.0.1:6379",
            "redis://redis.pod-1.internal",
            "redis://:secret@127.0.0.1:6380/2",
            "rediss://user:pw@[::1]:6379/0",
            "redis+unix:///var/run/redis.sock",
            "redis+unix:///var/run/redis.sock?db=1",
        ] {
            let f = TopologyFile::parse(&format!("{base}runner_queue_redis = {ok:?}\n"), "t")
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
            let pod = &f.pods[0];
            assert_eq!(pod.runner_queue_redis.as_deref(), Some(ok));
            // The Redis-stored form (JSON) carries it both ways.
            let json = serde_json::to_string(pod).unwrap();
            assert_eq!(&serde_json::from_str::<Pod>(&json).unwrap(), pod);
        }
        for bad in [
            "",
            "127.0.0.1:6379",
            "http://127.0.0.1:6379",
            "redis://",
            "redis://:6379",
            "redis://host:0",
            "redis://host:port",
            "redis://host/db",
            "redis://ho st",
            "redis+unix://relative.sock",
            "redis://[::1",
        ] {
            let err = TopologyFile::parse(&format!("{base}runner_queue_redis = {bad:?}\n"), "t")
                .unwrap_err()
                .to_string();
            assert!(err.contains("pods[0].runner_queue_redis"), "{bad:?}: {err}");
        }
        // Not set: not written, so readers that predate the field keep parsing.
        let f = TopologyFile::parse(base, "t").unwrap();
        assert_eq!(f.pods[0].runner_queue_redis, None);
        let json = serde_json::to_string(&f.pods[0]).unwrap();
        assert!(!json.contains("runner_queue_redis"), "{json}");
    }
}
