//! Agent configuration files. GitLab's kas reads `.gitlab/agents/<name>/config.yaml`
//! from the agent's project in Gitaly and polls it for new commits
//! (`internal/module/agent_configuration/server/server.go`); podgate reads
//! `<dir>/<agent id>.yaml` instead (`[agent_configuration] dir`, polled every
//! `poll`, default 20 s).
//!
//! - Each `GetConfiguration` stream ([`super::presence`]) sends the file's text in
//!   its first message (`""` when there is none: a missing file is an empty
//!   configuration, as in GitLab), and a new message whenever the text changes.
//! - Each stream polls on its own, as GitLab's streams do. A file that is not YAML,
//!   not a mapping, larger than [`MAX_FILE`] (GitLab's
//!   `max_configuration_file_size`) or unreadable is logged and skipped: the stream
//!   keeps the configuration it sent last (the first message then carries `""`).
//! - GitLab hears of the configuration as GitLab's kas tells it
//!   (`internal/gitlab/api/post_agent_configuration.go`): `POST
//!   /api/v4/internal/kubernetes/agent_configuration` with
//!   `{"agent_id": N, "agent_config": <the YAML as JSON>}` and the kas JWT; GitLab
//!   answers 204. kas posts on first sight of an agent's configuration and on each
//!   change: it remembers, per agent, what it posted last, so several replicas of
//!   one agent (or a reconnect) do not post the same configuration again; a failed
//!   post is retried at the next poll. A 404 (the agent was deleted) is logged at
//!   debug level, as GitLab's kas does.
//!
//! Metrics: `podgate_kas_agent_config_rejected_total` (a stream found its file
//! unusable: counted once per stream and distinct problem) and
//! `podgate_kas_agent_config_posts_total{result}` (`ok`, `not_found`, `error`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;

use super::gitlab::GitlabClient;
use podgate_agent::proto::AgentConfiguration;

/// Where GitLab hears about agent configurations.
pub const AGENT_CONFIGURATION_API_PATH: &str = "/api/v4/internal/kubernetes/agent_configuration";

/// Largest configuration file read (GitLab's default `max_configuration_file_size`,
/// 128 KiB).
pub const MAX_FILE: u64 = 128 << 10;

/// `[agent_configuration]`: where agent configuration files are.
#[derive(Clone, Debug)]
pub struct AgentConfigSource {
    /// The directory holding `<agent id>.yaml`.
    pub dir: PathBuf,
    /// How often each stream looks at its file.
    pub poll: Duration,
}

/// Why a configuration file was not used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// It could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It is larger than [`MAX_FILE`].
    #[error("{path}: larger than {MAX_FILE} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// It is not YAML, or not a mapping.
    #[error("{path}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// A configuration that parsed: its text and its JSON form.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The file's text (`""`: none).
    pub text: String,
    /// The YAML as JSON (an object; `{}` for an empty file).
    pub json: serde_json::Value,
}

/// Parse a configuration file's text: YAML whose top level is a mapping (or
/// nothing); GitLab's `parseYAMLToConfiguration` (YAML → JSON, `null` → empty).
pub fn parse(path: &Path, text: &str) -> Result<Parsed, Error> {
    let bad = |why: String| Error::Parse {
        path: path.to_owned(),
        why,
    };
    let json = if text.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        match serde_yaml::from_str::<serde_json::Value>(text).map_err(|e| bad(e.to_string()))? {
            serde_json::Value::Null => serde_json::Value::Object(Default::default()),
            v @ serde_json::Value::Object(_) => v,
            _ => return Err(bad("the configuration must be a mapping".into())),
        }
    };
    Ok(Parsed {
        text: text.to_owned(),
        json,
    })
}

/// `path`, parsed: `Ok(None)` when it does not exist.
fn read_file(path: &Path) -> Result<Option<Parsed>, Error> {
    use std::io::Read as _;
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut text = String::new();
    file.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_FILE {
        return Err(Error::TooLarge {
            path: path.to_owned(),
        });
    }
    parse(path, &text).map(Some)
}

/// No configuration (a missing file).
fn empty() -> Parsed {
    Parsed {
        text: String::new(),
        json: serde_json::Value::Object(Default::default()),
    }
}

/// What a new stream starts with.
pub(crate) struct First {
    /// The configuration sent first.
    pub(crate) parsed: Parsed,
    /// Why the file was not used, if it was not.
    problem: Option<String>,
}

/// The agent configurations one kas serves: the files, and what was posted to
/// GitLab.
pub(crate) struct AgentConfigs {
    source: AgentConfigSource,
    gitlab: Option<Arc<GitlabClient>>,
    /// Per agent: the SHA-256 of the configuration last posted (or being posted).
    posted: Mutex<HashMap<i64, [u8; 32]>>,
    rejected: prometheus::IntCounter,
    posts: prometheus::IntCounterVec,
}

impl AgentConfigs {
    /// Files from `source`; posted to `gitlab` when there is one; counted in
    /// `registry`.
    pub(crate) fn new(
        source: AgentConfigSource,
        gitlab: Option<Arc<GitlabClient>>,
        registry: &prometheus::Registry,
    ) -> Self {
        let rejected = prometheus::IntCounter::new(
            "podgate_kas_agent_config_rejected_total",
            "Agent configuration files found unusable (not YAML, not a mapping, too large, \
             unreadable), once per stream and problem",
        )
        .expect("valid metric");
        let posts = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "podgate_kas_agent_config_posts_total",
                "Agent configurations posted to GitLab, by result (ok, not_found, error)",
            ),
            &["result"],
        )
        .expect("valid metric");
        let _ = registry.register(Box::new(rejected.clone()));
        let _ = registry.register(Box::new(posts.clone()));
        AgentConfigs {
            source,
            gitlab,
            posted: Mutex::default(),
            rejected,
            posts,
        }
    }

    fn path(&self, agent_id: i64) -> PathBuf {
        self.source.dir.join(format!("{agent_id}.yaml"))
    }

    /// The agent's file now: `Ok(None)` when there is none.
    async fn read(&self, agent_id: i64) -> Result<Option<Parsed>, Error> {
        let path = self.path(agent_id);
        tokio::task::spawn_blocking(move || read_file(&path))
            .await
            .unwrap_or_else(|e| {
                Err(Error::Io {
                    path: PathBuf::new(),
                    source: std::io::Error::other(e),
                })
            })
    }

    /// The configuration a new stream starts with (`""` when there is none or it is
    /// unusable), posted to GitLab if this kas has not posted it yet.
    pub(crate) async fn first(self: &Arc<Self>, agent_id: i64) -> First {
        match self.read(agent_id).await {
            Ok(found) => {
                let parsed = found.unwrap_or_else(empty);
                self.maybe_post(agent_id, &parsed);
                First {
                    parsed,
                    problem: None,
                }
            }
            Err(e) => {
                self.rejected.inc();
                tracing::warn!(agent_id, error = %e, "agent configuration not used");
                // No configuration yet: nothing to post either.
                First {
                    parsed: empty(),
                    problem: Some(e.to_string()),
                }
            }
        }
    }

    /// Poll the agent's file every `poll` while `tx` is open; send `template` with
    /// the new text on each change, and post it.
    pub(crate) async fn watch(
        self: Arc<Self>,
        agent_id: i64,
        first: First,
        template: AgentConfiguration,
        tx: mpsc::Sender<Result<AgentConfiguration, tonic::Status>>,
    ) {
        let mut last = first.parsed;
        // The problem last reported, so a broken file is logged once.
        let mut reported = first.problem;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.source.poll) => {}
                _ = tx.closed() => return,
            }
            let now = match self.read(agent_id).await {
                Ok(Some(p)) => p,
                Ok(None) => empty(),
                Err(e) => {
                    let what = e.to_string();
                    if reported.as_ref() != Some(&what) {
                        self.rejected.inc();
                        tracing::warn!(agent_id, error = %what, "agent configuration not used; keeping the previous one");
                        reported = Some(what);
                    }
                    continue;
                }
            };
            reported = None;
            if now.text != last.text {
                tracing::info!(
                    agent_id,
                    bytes = now.text.len(),
                    "agent configuration changed"
                );
                let message = AgentConfiguration {
                    config_yaml: now.text.clone(),
                    ..template.clone()
                };
                if tx.send(Ok(message)).await.is_err() {
                    return;
                }
                last = now;
            }
            // Also retries a post that failed.
            self.maybe_post(agent_id, &last);
        }
    }

    /// Post `parsed` for `agent_id` unless it is what this kas posted last.
    fn maybe_post(self: &Arc<Self>, agent_id: i64, parsed: &Parsed) {
        let Some(gitlab) = self.gitlab.clone() else {
            return;
        };
        let digest: [u8; 32] = Sha256::digest(parsed.text.as_bytes()).into();
        {
            let mut posted = self.posted.lock().unwrap_or_else(|e| e.into_inner());
            if posted.get(&agent_id) == Some(&digest) {
                return;
            }
            posted.insert(agent_id, digest);
        }
        let body = serde_json::json!({
            "agent_id": agent_id,
            "agent_config": parsed.json,
        });
        let this = self.clone();
        tokio::spawn(async move {
            let body = serde_json::to_vec(&body).expect("JSON serialises");
            let result = gitlab
                .request(
                    http::Method::POST,
                    AGENT_CONFIGURATION_API_PATH,
                    &[],
                    Some(body),
                    true,
                )
                .await;
            let failure = match result {
                Ok(a) if a.status == http::StatusCode::NO_CONTENT => {
                    this.posts.with_label_values(&["ok"]).inc();
                    return;
                }
                Ok(a) if a.status == http::StatusCode::NOT_FOUND => {
                    this.posts.with_label_values(&["not_found"]).inc();
                    tracing::debug!(
                        agent_id,
                        "failed to notify GitLab of new agent configuration: 404 (deleted agent?)"
                    );
                    return;
                }
                Ok(a) => format!("GitLab answered {}", a.status),
                Err(e) => e.to_string(),
            };
            this.posts.with_label_values(&["error"]).inc();
            tracing::warn!(agent_id, error = %failure, "failed to notify GitLab of new agent configuration; retrying at the next poll");
            let mut posted = this.posted.lock().unwrap_or_else(|e| e.into_inner());
            if posted.get(&agent_id) == Some(&digest) {
                posted.remove(&agent_id);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_becomes_json_and_non_mappings_are_refused() {
        let p = Path::new("1.yaml");
        let parsed = parse(
            p,
            "remote_development:\n  enabled: true\n  dns_zone: ws.example.com\n",
        )
        .unwrap();
        assert_eq!(
            parsed.json,
            serde_json::json!({"remote_development": {"enabled": true, "dns_zone": "ws.example.com"}})
        );
        assert_eq!(parse(p, "").unwrap().json, serde_json::json!({}));
        assert_eq!(parse(p, "# nothing\n").unwrap().json, serde_json::json!({}));
        assert!(parse(p, "- a\n- b\n").is_err());
        let err = parse(p, "a: [unclosed\n").unwrap_err().to_string();
        assert!(err.contains("1.yaml"), "{err}");
    }
}
