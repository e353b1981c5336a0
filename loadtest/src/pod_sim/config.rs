//! The simulator's configuration: [`PodSimConfig`] (one Pod: its id, listener,
//! tokens, jobs, agents) with `validate()`, [`WorkspacesSimConfig`] (GitLab's
//! Workspaces side) and [`TokenFormat`].

use std::net::SocketAddr;
use std::time::Duration;

use podgate_tokens::{KeySet, PodId};
use serde::Deserialize;

use super::{AgentSpec, Error, JobSpec, ReconcileSettings, workspaces};

/// How issued tokens are encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TokenFormat {
    /// GitLab's routable token format (`glrt-…`, `glcbt-…` with `c=<pod>`).
    #[default]
    GitlabV1,
    /// Signed JWTs with the routing claims.
    Jwt,
}

/// GitLab's Workspaces side of a Pod.
#[derive(Clone, Debug)]
pub struct WorkspacesSimConfig {
    /// Whether the `remote_development` licensed feature is available (403 on the
    /// module endpoints otherwise, and `agent_configuration` stores nothing).
    pub licensed: bool,
    /// The intervals the reconcile answer tells agentk (3600 s / 10 s).
    pub settings: ReconcileSettings,
    /// Agents' workspaces configurations at start (kas's `agent_configuration`
    /// and the control API set more).
    pub agent_configs: Vec<workspaces::WorkspacesAgentConfig>,
    /// `gitlab_kas.external_url` (what agentk dials, `wss://…` or `grpc://…`):
    /// `agentw/server_config` derives the workspaces server's URLs from it. `None`:
    /// Omnibus' default, the Pod's external URL with `ws`/`wss` and
    /// `/-/kubernetes-agent/`.
    pub kas_external_url: Option<String>,
}

impl Default for WorkspacesSimConfig {
    fn default() -> Self {
        WorkspacesSimConfig {
            licensed: true,
            settings: ReconcileSettings::default(),
            agent_configs: Vec::new(),
            kas_external_url: None,
        }
    }
}

/// One simulated Pod.
#[derive(Clone, Debug)]
pub struct PodSimConfig {
    /// The Pod id its tokens route to.
    pub pod_id: PodId,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Token encoding.
    pub token_format: TokenFormat,
    /// Keys (a signing key for `jwt`; verification keys to recognise other Pods' JWTs).
    pub keys: KeySet,
    /// The registration token; generated (routable here) when not given.
    pub registration_token: Option<String>,
    /// Jobs queued per second (0: only through [`PodSim::enqueue`](super::PodSim::enqueue)).
    pub job_rate: f64,
    /// The `job_rate` generator skips a tick while this many jobs are pending (0: no
    /// bound). GitLab queues whatever pipelines create; a soak whose runners take
    /// fewer jobs than are generated would otherwise measure a growing backlog in the
    /// simulator, not the system under test (`scripts/drills.sh` R7).
    pub max_pending: usize,
    /// How long Workhorse holds a `jobs/request` poll whose runner's queue key has not
    /// changed (`apiCiLongPollingDuration`; GitLab.com: 50 s).
    pub long_poll: Duration,
    /// How many projects the Pod has (default 2), each with its own registration
    /// token routable to the Pod; they share the Pod's one Git repository.
    pub projects: usize,
    /// The tag sets generated jobs cycle through (default: none, `docker`,
    /// `docker,linux`, `gpu`); an empty set is an untagged job.
    pub job_tag_sets: Vec<Vec<String>>,
    /// A Redis URL (`redis://host:port/db`): every runner queue key write is mirrored
    /// there as GitLab writes it (`SET runner:build_queue:<token> … EX 3600`, then
    /// `PUBLISH workhorse:notifications:runner:build_queue:<token> …`). `None`: in
    /// memory only.
    pub redis: Option<String>,
    /// Every n-th job pick answers 409 (0: never).
    pub conflict_every: u64,
    /// Largest artifact accepted (413 above).
    pub max_artifact_bytes: u64,
    /// The URL runners reach this Pod at, used in job payloads (`CI_SERVER_URL`,
    /// `git_info.repo_url`, …): e.g. the proxy's URL. `None`: `http://<listen address>`.
    pub external_url: Option<String>,
    /// What generated jobs ([`PodSim::enqueue`](super::PodSim::enqueue), `job_rate`) run: script, image (none
    /// is possible), artifact paths and stage.
    pub job: JobSpec,
    /// The GitLab ↔ kas shared secret (≥ 32 bytes): verifies kas's
    /// `Gitlab-Kas-Api-Request` JWT on the internal API. `None`: kas is refused.
    pub kas_secret: Option<Vec<u8>>,
    /// Agents registered in the Pod's project (more through the control API).
    pub agents: Vec<AgentSpec>,
    /// Opaque agent tokens: (token, agent id) of a registered agent.
    pub agent_tokens: Vec<(String, i64)>,
    /// Workspaces.
    pub workspaces: WorkspacesSimConfig,
    /// What `GET /api/v4/runners/router/discovery` names as the Job Router's URL
    /// (a kas runners reach: `grpc://…`, `grpcs://…`, `ws://…`, `wss://…`);
    /// `None`: the router is off here, and discovery answers 501.
    pub job_router_url: Option<String>,
}

impl PodSimConfig {
    /// Defaults for Pod `pod_id` on `listen`.
    pub fn new(pod_id: PodId, listen: SocketAddr) -> Self {
        PodSimConfig {
            pod_id,
            listen,
            token_format: TokenFormat::GitlabV1,
            keys: KeySet::new(),
            registration_token: None,
            job_rate: 0.0,
            max_pending: 0,
            long_poll: Duration::from_secs(50),
            projects: 2,
            job_tag_sets: super::state::default_job_tag_sets(),
            redis: None,
            conflict_every: 0,
            max_artifact_bytes: 1 << 30,
            external_url: None,
            job: JobSpec::default(),
            kas_secret: None,
            agents: Vec::new(),
            agent_tokens: Vec::new(),
            workspaces: WorkspacesSimConfig::default(),
            job_router_url: None,
        }
    }

    /// Every problem, each naming its field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if !(self.job_rate.is_finite() && self.job_rate >= 0.0) {
            bad.push(format!("job_rate = {}: a rate >= 0", self.job_rate));
        }
        if self.long_poll.is_zero() {
            bad.push("long_poll: must be positive".into());
        }
        if !(1..=1000).contains(&self.projects) {
            bad.push(format!("projects = {}: between 1 and 1000", self.projects));
        }
        if self.job_tag_sets.is_empty() {
            bad.push("job_tag_sets: at least one tag set (an empty set is untagged)".into());
        }
        for (i, set) in self.job_tag_sets.iter().enumerate() {
            for t in set {
                if t.trim().is_empty() || t.contains(',') || t.trim() != t {
                    bad.push(format!(
                        "job_tag_sets[{i}]: tag {t:?} is blank, padded or has a comma"
                    ));
                }
            }
        }
        if let Some(url) = &self.redis
            && let Err(e) = redis::Client::open(url.as_str())
        {
            bad.push(format!("redis: not a Redis URL ({e})"));
        }
        if self.token_format == TokenFormat::Jwt && self.keys.signing_key().is_err() {
            bad.push("token_format = jwt: needs a signing key".into());
        }
        if let Some(url) = &self.external_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            bad.push(format!(
                "external_url = {url:?}: an http:// or https:// URL"
            ));
        }
        if self.kas_secret.as_ref().is_some_and(|s| s.len() < 32) {
            bad.push("kas_secret: at least 32 bytes".into());
        }
        let mut ids = std::collections::HashSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            if !ids.insert(a.id) {
                bad.push(format!("agents[{i}].id = {}: registered twice", a.id));
            }
        }
        for (i, (token, agent)) in self.agent_tokens.iter().enumerate() {
            if token.is_empty() {
                bad.push(format!("agent_tokens[{i}]: an empty token"));
            }
            if !ids.contains(agent) {
                bad.push(format!(
                    "agent_tokens[{i}]: agent {agent} is not registered"
                ));
            }
        }
        if let Err(e) = self.workspaces.settings.validate() {
            bad.push(format!("workspaces.settings.{e}"));
        }
        for (i, c) in self.workspaces.agent_configs.iter().enumerate() {
            if !ids.contains(&c.agent_id) {
                bad.push(format!(
                    "workspaces.agent_configs[{i}].agent_id = {}: not a registered agent",
                    c.agent_id
                ));
            }
        }
        if self.job.script.is_empty() {
            bad.push("job.script: at least one line".into());
        }
        if self.job.stage.is_empty() {
            bad.push("job.stage: must not be empty".into());
        }
        if !self.job.tags.is_empty() || self.job.project.is_some() {
            bad.push(
                "job.tags, job.project: generated jobs take job_tag_sets and the projects in turn"
                    .into(),
            );
        }
        if self
            .job
            .dependencies
            .as_ref()
            .is_some_and(|d| !d.is_empty())
        {
            bad.push("job.dependencies: generated jobs depend on the jobs before them".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(bad.join("; ")))
        }
    }
}
