//! Agent configuration files. GitLab's kas reads `.gitlab/agents/<name>/config.yaml`
//! from the agent's project in Gitaly at the newest commit of its default branch
//! and polls for new commits
//! (<https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_configuration/server/server.go>);
//! podgate reads `<dir>/<agent id>.yaml` instead (`[agent_configuration] dir`,
//! polled every `poll`, default 20 s, and at once when GitLab reports a push to the
//! agent's project, [`AgentConfigs::pushed`]).
//!
//! - **Commit ids.** GitLab's agentk resumes a configuration stream from the
//!   `commit_id` it has, and kas answers only when the commit differs. A file has no
//!   commit, so podgate's commit id is the file's git blob id (`git hash-object`:
//!   SHA-1 of `blob <length>\0` and the bytes, 40 hex digits like a commit id): it
//!   depends on the content alone, so it is stable across kas restarts and replicas,
//!   changes with every edit, and an operator can compute it. A missing file is the
//!   empty configuration (as in GitLab) with the blob id of empty content.
//! - **Parsing** is GitLab's ([`file`](mod@file)): a file that is not YAML, not a mapping, has
//!   an unknown field or breaks a validation rule, or is larger than [`MAX_FILE`]
//!   (GitLab's `max_configuration_file_size`), is a user error: the stream ends with
//!   `FailedPrecondition` (`Config: …`), as GitLab's does. An unreadable file is
//!   logged and retried at the next poll.
//! - GitLab hears of the configuration as GitLab's kas tells it
//!   (`internal/gitlab/api/post_agent_configuration.go`): `POST
//!   /api/v4/internal/kubernetes/agent_configuration` with
//!   `{"agent_id": N, "agent_config": <the file as JSON>}` and the kas JWT; GitLab
//!   answers 204. kas posts on first sight of an agent's commit and on each
//!   change: it remembers, per agent, the commit it posted last, so several replicas
//!   of one agent (or a reconnect) do not post the same configuration again; a
//!   failed post is retried at the next poll. A 404 (the agent was deleted) is
//!   logged at debug level, as GitLab's kas does.
//!
//! Metrics: `podgate_kas_agent_config_rejected_total` (a read found the file
//! unusable) and `podgate_kas_agent_config_posts_total{result}` (`ok`,
//! `not_found`, `error`).

pub mod file;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha1::{Digest as _, Sha1};
use tokio::sync::broadcast;

use super::gitlab::GitlabClient;

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
    /// It could not be read (transient: read again at the next poll).
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It is larger than [`MAX_FILE`] (a user error).
    #[error("agent configuration file: larger than {MAX_FILE} bytes")]
    TooLarge,
    /// It is not a valid configuration (a user error).
    #[error(transparent)]
    File(#[from] file::Error),
}

impl Error {
    /// Whether the file itself is wrong (GitLab's `UserError`): reading it again
    /// gives the same answer until someone edits it.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, Error::Io { .. })
    }
}

/// The git blob id of `bytes` (see the module docs): the configuration's commit id.
pub fn commit_id(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex::encode(h.finalize())
}

/// An agent's configuration at one commit.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Its commit id ([`commit_id`]).
    pub commit_id: String,
    /// The configuration.
    pub parsed: file::Parsed,
}

/// `path`'s bytes: empty when it does not exist.
fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    use std::io::Read as _;
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(Error::TooLarge);
    }
    Ok(bytes)
}

/// Parse a file's bytes.
fn snapshot(bytes: &[u8]) -> Result<Snapshot, Error> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| file::Error::Parse(format!("YAMLToJSON: not UTF-8: {e}")))?;
    Ok(Snapshot {
        commit_id: commit_id(bytes),
        parsed: file::parse(text)?,
    })
}

/// The agent configurations one kas serves: the files, what was posted to GitLab,
/// and GitLab's push notifications.
pub struct AgentConfigs {
    /// `None`: kas has no configuration files; every agent has the empty one.
    source: Option<AgentConfigSource>,
    gitlab: Option<Arc<GitlabClient>>,
    /// Per agent: the commit last posted (or being posted).
    posted: Mutex<HashMap<i64, String>>,
    /// Projects GitLab reported a push to.
    pushes: broadcast::Sender<i64>,
    rejected: prometheus::IntCounter,
    posts: prometheus::IntCounterVec,
}

impl AgentConfigs {
    /// Files from `source` (none: every agent's configuration is empty); posted to
    /// `gitlab` when there is one; counted in `registry`.
    pub fn new(
        source: Option<AgentConfigSource>,
        gitlab: Option<Arc<GitlabClient>>,
        registry: &prometheus::Registry,
    ) -> Self {
        let rejected = prometheus::IntCounter::new(
            "podgate_kas_agent_config_rejected_total",
            "Reads of agent configuration files that found them unusable (not YAML, not a \
             valid configuration, too large, unreadable)",
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
            pushes: broadcast::channel(64).0,
            rejected,
            posts,
        }
    }

    /// How often a stream reads its file again; `None` when there are no files.
    pub fn poll(&self) -> Option<Duration> {
        self.source.as_ref().map(|s| s.poll)
    }

    /// The agent's configuration now.
    pub async fn read(&self, agent_id: i64) -> Result<Snapshot, Error> {
        let Some(source) = &self.source else {
            return snapshot(b"");
        };
        let path = source.dir.join(format!("{agent_id}.yaml"));
        let read = tokio::task::spawn_blocking(move || read_file(&path).and_then(|b| snapshot(&b)))
            .await
            .unwrap_or_else(|e| {
                Err(Error::Io {
                    path: PathBuf::new(),
                    source: std::io::Error::other(e),
                })
            });
        if let Err(e) = &read {
            self.rejected.inc();
            tracing::warn!(agent_id, error = %e, "agent configuration not used");
        }
        read
    }

    /// GitLab reported a push to `project_id`: its agents' streams read their
    /// files now (GitLab's `OnGitPushEvent` poke).
    pub fn pushed(&self, project_id: i64) {
        let _ = self.pushes.send(project_id);
    }

    /// Push reports, for a stream to wait on.
    pub fn pushes(&self) -> broadcast::Receiver<i64> {
        self.pushes.subscribe()
    }

    /// Post `snapshot` for `agent_id` unless it is what this kas posted last.
    /// Nothing is posted without configuration files: this kas is then not where
    /// GitLab's agent configurations come from, and an empty one posted would
    /// clear what GitLab holds (its CI and user access authorisations).
    pub fn maybe_post(self: &Arc<Self>, agent_id: i64, snapshot: &Snapshot) {
        let (Some(gitlab), Some(_)) = (self.gitlab.clone(), &self.source) else {
            return;
        };
        let digest = snapshot.commit_id.clone();
        {
            let mut posted = self.posted.lock().unwrap_or_else(|e| e.into_inner());
            if posted.get(&agent_id) == Some(&digest) {
                return;
            }
            posted.insert(agent_id, digest.clone());
        }
        let body = serde_json::json!({
            "agent_id": agent_id,
            "agent_config": snapshot.parsed.json,
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
    fn a_commit_id_is_the_files_git_blob_id() {
        // `git hash-object` of empty content and of "hello\n".
        assert_eq!(commit_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
        assert_eq!(
            commit_id(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[tokio::test]
    async fn a_missing_file_and_no_files_are_the_empty_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let registry = prometheus::Registry::new();
        let source = AgentConfigSource {
            dir: dir.path().to_owned(),
            poll: Duration::from_secs(1),
        };
        for configs in [
            AgentConfigs::new(Some(source), None, &registry),
            AgentConfigs::new(None, None, &registry),
        ] {
            let s = configs.read(7).await.unwrap();
            assert_eq!(s.commit_id, commit_id(b""));
            assert_eq!(s.parsed.file, Default::default());
        }
        std::fs::write(dir.path().join("7.yaml"), vec![b'#'; MAX_FILE as usize + 1]).unwrap();
        let configs = AgentConfigs::new(
            Some(AgentConfigSource {
                dir: dir.path().to_owned(),
                poll: Duration::from_secs(1),
            }),
            None,
            &registry,
        );
        let err = configs.read(7).await.unwrap_err();
        assert!(
            matches!(err, Error::TooLarge) && err.is_user_error(),
            "{err}"
        );
    }
}
