//! One Pod: [`Pod`], its [`PodState`], and the checks on its fields.

use std::collections::BTreeMap;
use std::fmt;

use podgate_tokens::PodId;
use serde::{Deserialize, Serialize};

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
/// A Pod has no weight: a request bound to a Pod goes to that Pod, an unbound one
/// to the default Pod, so there is no traffic to share between Pods, and within a
/// Pod the proxy spreads traffic evenly over its healthy upstream addresses. A
/// `weight` field in a topology file or in stored Pod JSON is accepted and ignored
/// (see `PodWire`).
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
    /// (`podgate_proxy::edge_poll`); `None`: they are forwarded to the Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_queue_redis: Option<String>,
    /// The Cell's address as GitLab's Topology Service names it (a `Classify`
    /// answer's `proxy.address`, `host` or `host:port`): how the proxy knows which
    /// Pod a claim's owner is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_address: Option<String>,
}

/// A [`Pod`] as read: the same fields, plus a `weight`, accepted and dropped, so
/// that topology files and stored Pods that carry one parse.
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
    #[serde(default)]
    cell_address: Option<String>,
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
            cell_address: w.cell_address,
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
            cell_address: None,
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
