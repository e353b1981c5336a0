//! The topology: which Pods exist, where they listen, and which one is the default.
//!
//! A [`Topology`] is an immutable snapshot; every change produces a new one with a
//! higher `version`. The proxy reads the current snapshot with one lock-free load.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use podgate_tokens::PodId;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Whether a Pod takes traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodState {
    /// Serving.
    #[default]
    Active,
    /// Being emptied: requests for it are refused with 503 + `Retry-After`.
    Draining,
    /// Out of service.
    Down,
}

impl PodState {
    /// The name used in configuration, the CLI and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            PodState::Active => "active",
            PodState::Draining => "draining",
            PodState::Down => "down",
        }
    }
}

impl fmt::Display for PodState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PodState {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "active" => Ok(PodState::Active),
            "draining" => Ok(PodState::Draining),
            "down" => Ok(PodState::Down),
            _ => Err(format!("{s:?}: expected active, draining or down")),
        }
    }
}

/// One Pod: a self-contained GitLab deployment and its kas.
///
/// Earlier versions had a `weight`, which routing never read (a request bound to a
/// Pod goes to that Pod, an unbound one to the default Pod: there is no traffic to
/// share between Pods, and within a Pod the proxy spreads traffic evenly over its
/// healthy upstream addresses). It is gone from the model; topology files and the Pod
/// JSON stored in Redis that still carry it parse as before.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, from = "PodWire")]
pub struct Pod {
    /// The Pod (cell) id that routable tokens name.
    pub id: PodId,
    /// A name for people (`pod-2`, `eu-west-1a`).
    pub name: String,
    /// Web (Workhorse) upstreams, `host:port`.
    #[serde(default)]
    pub web: Vec<String>,
    /// kas upstreams, `host:port`: kas's agent listener (agentk's gRPC and
    /// WebSocket).
    #[serde(default)]
    pub kas: Vec<String>,
    /// kas's Kubernetes API proxy listener, `host:port` (`kubectl` and the Graph API
    /// through `/-/kubernetes-agent/k8s-proxy/`): a listener of its own in kas,
    /// HTTP/1.1, so a pool of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kas_k8s_proxy: Vec<String>,
    /// kas's Workspaces HTTP server listener, `host:port` (user traffic for
    /// `https://<port>-<workspace>.<zone>/`): HTTP/1.1, a pool of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kas_workspaces: Vec<String>,
    /// Whether it takes traffic.
    #[serde(default)]
    pub state: PodState,
    /// Free-form labels (`region = "eu"`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Prefix of `_gitlab_session` cookie values that belong to this Pod; defaults to
    /// `cell-<id>`.
    #[serde(default)]
    pub session_prefix: Option<String>,
    /// The Redis the Pod's GitLab keeps its runners' queue keys in
    /// (`runner:build_queue:<token>`, announced on `workhorse:notifications:…`; the
    /// Redis its Workhorse watches), as a `redis://`, `rediss://` or `redis+unix://`
    /// URL. Set: the proxy holds this Pod's `jobs/request` long polls at the edge
    /// (`podgate_proxy::edge_poll`); `None`: they are forwarded as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_queue_redis: Option<String>,
}

/// A [`Pod`] as stored: the same fields, plus the retired `weight`, accepted and
/// dropped so that stored topologies written by earlier versions keep parsing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PodWire {
    id: PodId,
    name: String,
    #[serde(default)]
    web: Vec<String>,
    #[serde(default)]
    kas: Vec<String>,
    #[serde(default)]
    kas_k8s_proxy: Vec<String>,
    #[serde(default)]
    kas_workspaces: Vec<String>,
    #[serde(default)]
    state: PodState,
    #[serde(default, rename = "weight")]
    _retired_weight: Option<u32>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    session_prefix: Option<String>,
    #[serde(default)]
    runner_queue_redis: Option<String>,
}

impl From<PodWire> for Pod {
    fn from(w: PodWire) -> Self {
        Pod {
            id: w.id,
            name: w.name,
            web: w.web,
            kas: w.kas,
            kas_k8s_proxy: w.kas_k8s_proxy,
            kas_workspaces: w.kas_workspaces,
            state: w.state,
            labels: w.labels,
            session_prefix: w.session_prefix,
            runner_queue_redis: w.runner_queue_redis,
        }
    }
}

impl Pod {
    /// A Pod with one web upstream, active.
    pub fn new(id: PodId, name: impl Into<String>, web: impl Into<String>) -> Self {
        Pod {
            id,
            name: name.into(),
            web: vec![web.into()],
            kas: Vec::new(),
            kas_k8s_proxy: Vec::new(),
            kas_workspaces: Vec::new(),
            state: PodState::Active,
            labels: BTreeMap::new(),
            session_prefix: None,
            runner_queue_redis: None,
        }
    }

    /// The session-cookie prefix: the configured one, or `cell-<id>`.
    pub fn session_prefix(&self) -> String {
        self.session_prefix
            .clone()
            .unwrap_or_else(|| format!("cell-{}", self.id))
    }

    /// Check this Pod; every problem is named with `at` (e.g. `pods[1]`) in front.
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut bad = Vec::new();
        if self.name.trim().is_empty() {
            bad.push(format!("{at}.name: must not be empty"));
        }
        for (field, addrs) in [
            ("web", &self.web),
            ("kas", &self.kas),
            ("kas_k8s_proxy", &self.kas_k8s_proxy),
            ("kas_workspaces", &self.kas_workspaces),
        ] {
            for (i, a) in addrs.iter().enumerate() {
                if !is_host_port(a) {
                    bad.push(format!("{at}.{field}[{i}] = {a:?}: expected host:port"));
                }
            }
        }
        if self.web.is_empty()
            && self.kas.is_empty()
            && self.kas_k8s_proxy.is_empty()
            && self.kas_workspaces.is_empty()
        {
            bad.push(format!("{at}: needs at least one web or kas upstream"));
        }
        if let Some(p) = &self.session_prefix
            && (p.is_empty() || !p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'))
        {
            bad.push(format!(
                "{at}.session_prefix = {p:?}: letters, digits and '-' only"
            ));
        }
        if let Some(url) = &self.runner_queue_redis
            && !is_redis_url(url)
        {
            bad.push(format!(
                "{at}.runner_queue_redis = {url:?}: expected a redis://host[:port][/db], rediss://… or redis+unix:///path URL"
            ));
        }
        bad
    }
}

/// A `redis://` or `rediss://` URL naming a host (user info, port and database
/// optional), or a `redis+unix://` URL naming a socket path.
fn is_redis_url(url: &str) -> bool {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return false;
    }
    if let Some(path) = url.strip_prefix("redis+unix://") {
        let path = path.split(['?', '#']).next().unwrap_or("");
        return path.starts_with('/') && path.len() > 1;
    }
    let Some(rest) = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => return false,
        },
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    let db_ok = rest[authority.len()..]
        .strip_prefix('/')
        .map(|d| d.split(['?', '#']).next().unwrap_or(""))
        .is_none_or(|d| d.is_empty() || d.parse::<u32>().is_ok());
    !host.is_empty() && port_ok && db_ok
}

/// `host:port` with a non-empty host and a port in 1..=65535 (IPv6 in brackets).
fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner.ends_with(']') && inner.len() > 1
    } else {
        !host.is_empty() && !host.contains(':') && !host.contains('/')
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

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
        // A Pod without the pool is stored as before (older readers refuse unknown
        // fields).
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
