//! The Pod's state: runners (registration, types, tags), the job queue and jobs with
//! their traces and artifacts, and the runners' queue keys ([`RunnerQueues`]). No I/O besides the artifact files, so
//! the rules are unit-tested here.
//!
//! # Runners
//! `state/runners.rs`: instance runners (the Pod's registration token) and project
//! runners (a project's registration token), their tags, `run_untagged`, `locked`,
//! `access_level` and `paused`.
//!
//! # Jobs
//! `state/jobs.rs`: [`JobSpec`], [`Job`], the queue `Ci::RegisterJobService` picks
//! from (a runner gets only a job it matches), and the ticks of the keys of the
//! runners that can take a new job.
//!
//! # Projects
//! A Pod has [`PodSimConfig::projects`](super::PodSimConfig::projects) projects
//! (ids from [`project_ids`]), each with its own registration token routable to the
//! Pod. They all share the Pod's one Git repository (`group/project-<pod>`): jobs of
//! any project clone it; only the project id in their payload tells them apart.

mod archive;
mod jobs;
mod ledger;
mod runners;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use podgate_tokens::{Classification, Classifier, KeySet, PodId, TokenKind};

use super::queue::{BuildMatcher, RunnerMatcher, RunnerQueues};
use super::{Error, TokenFormat};

pub use super::queue::{AccessLevel, RunnerType};
pub use jobs::{Artifact, FINISHED_KEPT, Job, JobSpec, JobState, Pick, TRACE_KEPT, Trace, Update};
pub use ledger::{LedgerEntry, LedgerSummary};
pub use runners::{Runner, RunnerSpec};

/// Who a token belongs to, as this Pod sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner<T> {
    /// Issued here: the runner or job it names.
    Ours(T),
    /// Routable to another Pod: the proxy sent it to the wrong place.
    Misrouted(PodId),
    /// Not a token this Pod issued (wrong, revoked, or unroutable).
    Unknown,
}

/// The ids of Pod `pod`'s `n` projects: the first is the Pod's project of the
/// Kubernetes and Workspaces simulation ([`super::kubernetes::project_id`]), the
/// others follow it 100,000 apart (distinct across Pods below that many).
pub fn project_ids(pod: PodId, n: usize) -> Vec<u64> {
    let first = super::kubernetes::project_id(pod);
    (0..n as u64).map(|i| first + i * 100_000).collect()
}

/// The tag sets generated jobs cycle through by default: untagged, `docker`,
/// `docker,linux`, `gpu`.
pub fn default_job_tag_sets() -> Vec<Vec<String>> {
    [&[][..], &["docker"], &["docker", "linux"], &["gpu"]]
        .iter()
        .map(|s| s.iter().map(|t| (*t).to_owned()).collect())
        .collect()
}

#[derive(Debug, Default)]
struct Inner {
    next_runner: u64,
    /// Runner token → runner id.
    runners: HashMap<String, u64>,
    /// Runner id → the runner.
    runner_info: HashMap<u64, Runner>,
    /// Runners grouped by what they accept (`tick_for` matches each group once).
    classes: HashMap<RunnerMatcher, HashSet<u64>>,
    /// (runner id, system id) of the runner managers seen.
    managers: HashSet<(u64, String)>,
    next_job: u64,
    /// Pending job ids by what they ask of a runner, each group in queue order.
    queue: BTreeMap<BuildMatcher, VecDeque<u64>>,
    /// Jobs in `queue`.
    queued: usize,
    jobs: HashMap<u64, Job>,
    job_tokens: HashMap<String, u64>,
    /// How many job requests found a job (for simulated 409 races).
    picks: u64,
    /// Jobs [`State::enqueue`] generated (the tag set and project cycle on it).
    generated: u64,
    /// Jobs queued without a project (they take the projects in turn).
    in_turn: u64,
    /// Who got each job and how it ended ([`State::ledger`]).
    ledger: ledger::Ledger,
    /// Finished jobs still held whole, oldest first (at most [`FINISHED_KEPT`]).
    finished_whole: VecDeque<u64>,
    /// Finished jobs before those ([`archive`]).
    archive: archive::Archive,
}

/// The Pod's state.
pub struct State {
    pod: PodId,
    format: TokenFormat,
    keys: KeySet,
    classifier: Classifier,
    registration_token: String,
    /// (project id, registration token).
    projects: Vec<(u64, String)>,
    conflict_every: u64,
    template: JobSpec,
    tag_sets: Vec<Vec<String>>,
    inner: Mutex<Inner>,
    queues: RunnerQueues,
}

impl State {
    /// A Pod `pod` issuing tokens in `format` (JWTs signed with `keys`' signing key),
    /// with two projects and the default job tag sets.
    pub fn new(
        pod: PodId,
        format: TokenFormat,
        keys: KeySet,
        registration_token: Option<String>,
        conflict_every: u64,
    ) -> Result<Self, Error> {
        if format == TokenFormat::Jwt && keys.signing_key().is_err() {
            return Err(Error::Config(
                "token_format = jwt needs a signing key (--key)".into(),
            ));
        }
        let classifier = Classifier::with_keys(keys.clone());
        let mut state = State {
            pod,
            format,
            keys,
            classifier,
            registration_token: String::new(),
            projects: Vec::new(),
            conflict_every,
            template: JobSpec::default(),
            tag_sets: default_job_tag_sets(),
            inner: Mutex::default(),
            queues: RunnerQueues::default(),
        };
        state.registration_token = match registration_token {
            Some(t) => t,
            None => state.issue(TokenKind::Runner, "glrt-")?,
        };
        state = state.with_projects(2)?;
        Ok(state)
    }

    /// The spec [`State::enqueue`] queues jobs with.
    pub fn with_job_template(mut self, template: JobSpec) -> Self {
        self.template = template;
        self
    }

    /// `n` projects (at least one), each with a new registration token.
    pub fn with_projects(mut self, n: usize) -> Result<Self, Error> {
        if n == 0 {
            return Err(Error::Config("projects: at least one".into()));
        }
        let mut projects = Vec::with_capacity(n);
        for id in project_ids(self.pod, n) {
            projects.push((id, self.issue(TokenKind::Runner, "glrt-")?));
        }
        self.projects = projects;
        Ok(self)
    }

    /// The tag sets generated jobs cycle through (at least one; `[]` is untagged).
    pub fn with_job_tag_sets(mut self, sets: Vec<Vec<String>>) -> Result<Self, Error> {
        if sets.is_empty() {
            return Err(Error::Config("job_tag_sets: at least one tag set".into()));
        }
        self.tag_sets = sets
            .into_iter()
            .map(super::queue::matching::clean)
            .collect();
        Ok(self)
    }

    /// The runners' queue keys (replace them to count ticks in a registered metric or
    /// mirror them into Redis).
    pub fn with_queues(mut self, queues: RunnerQueues) -> Self {
        self.queues = queues;
        self
    }

    /// The spec generated jobs are queued with.
    pub fn job_template(&self) -> &JobSpec {
        &self.template
    }

    /// The tag sets generated jobs cycle through.
    pub fn job_tag_sets(&self) -> &[Vec<String>] {
        &self.tag_sets
    }

    /// This Pod's id.
    pub fn pod(&self) -> PodId {
        self.pod
    }

    /// The instance registration token `POST /runners` accepts.
    pub fn registration_token(&self) -> &str {
        &self.registration_token
    }

    /// Each project's id and registration token (which registers project runners).
    pub fn project_registration_tokens(&self) -> Vec<(u64, String)> {
        self.projects.clone()
    }

    /// The Pod's project ids.
    pub fn project_ids(&self) -> Vec<u64> {
        self.projects.iter().map(|(id, _)| *id).collect()
    }

    /// The runners' queue keys.
    pub fn queues(&self) -> &RunnerQueues {
        &self.queues
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new token routable to this Pod.
    fn issue(&self, kind: TokenKind, prefix: &str) -> Result<String, Error> {
        match self.format {
            TokenFormat::GitlabV1 => {
                let keys = podgate_tokens::gitlab::RoutingKeys {
                    cell: Some(self.pod.get()),
                    organization: Some(1),
                    ..Default::default()
                };
                podgate_tokens::gitlab::encode(
                    prefix,
                    &keys,
                    &podgate_tokens::gitlab::random_bytes(),
                )
                .map_err(|e| Error::Token(e.to_string()))
            }
            TokenFormat::Jwt => {
                let mut req = podgate_tokens::MintRequest::new(kind, self.pod, 24 * 3600);
                req.prefix = Some(prefix.to_owned());
                let key = self
                    .keys
                    .signing_key()
                    .map_err(|e| Error::Token(e.to_string()))?;
                podgate_tokens::mint(&req, key, podgate_tokens::unix_now())
                    .map_err(|e| Error::Token(e.to_string()))
            }
        }
    }

    /// A new personal access token (`glpat-`) routable to this Pod.
    pub fn issue_personal_access_token(&self) -> Result<String, Error> {
        self.issue(TokenKind::PersonalAccess, "glpat-")
    }

    /// Where `token` routes, as this Pod sees it: [`Owner::Misrouted`] for another
    /// Pod's, else [`Owner::Unknown`] (this Pod's tables are not consulted).
    pub fn owner_of(&self, token: &str) -> Owner<()> {
        self.owner(token, None)
    }

    /// Whose is `token`: a lookup in `table`, else the Pod it routes to.
    fn owner<T: Copy>(&self, token: &str, found: Option<T>) -> Owner<T> {
        if let Some(x) = found {
            return Owner::Ours(x);
        }
        match self.classifier.classify(token) {
            Classification::Routable(id) if id.pod != self.pod => Owner::Misrouted(id.pod),
            _ => Owner::Unknown,
        }
    }
}

#[cfg(test)]
mod tests;
