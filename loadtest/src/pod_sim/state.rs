//! The Pod's state: runners, the job queue, jobs and their traces and artifacts.
//! No I/O besides the artifact files, so the rules are unit-tested here.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;

use podgate_tokens::{Classification, Classifier, KeySet, PodId, TokenKind};
use tokio::sync::watch;

use super::{Error, TokenFormat};

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

/// A job's state, as `PUT jobs/:id` moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Queued, not yet picked.
    Pending,
    /// Given to a runner.
    Running,
    /// Finished well.
    Success,
    /// Finished badly.
    Failed,
}

impl JobState {
    /// GitLab's name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Success => "success",
            JobState::Failed => "failed",
        }
    }

    /// Success or failed.
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Success | JobState::Failed)
    }
}

/// An uploaded artifact archive (the `file` part's bytes, as Workhorse stores it),
/// kept on disk.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// Where it is stored.
    pub path: PathBuf,
    /// Its size.
    pub size: u64,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// The file name the runner uploaded it as.
    pub filename: String,
}

/// What a queued job asks the runner to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    /// Job name (`None`: `build-<id>`).
    pub name: Option<String>,
    /// Stage name.
    pub stage: String,
    /// Script lines (`steps[0].script`).
    pub script: Vec<String>,
    /// Container image (`None`: the job has no image, `"image": null`).
    pub image: Option<String>,
    /// Artifact paths (empty: the job uploads no artifacts).
    pub artifacts: Vec<String>,
    /// Earlier jobs whose artifacts this one downloads (`None`: up to two jobs queued
    /// just before it, as generated jobs have).
    pub dependencies: Option<Vec<u64>>,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            name: None,
            stage: "test".into(),
            script: vec![
                "echo \"simulated job $CI_JOB_ID of $CI_PROJECT_PATH on Pod $CI_POD_ID\"".into(),
                "mkdir -p out".into(),
                "echo \"$CI_JOB_NAME\" > out/result.txt".into(),
            ],
            image: Some("alpine:3.20".into()),
            artifacts: vec!["out/".into()],
            dependencies: None,
        }
    }
}

/// Largest trace text kept per job (the length and CRC cover all of it).
pub const TRACE_KEPT: usize = 1 << 20;

/// A job.
#[derive(Clone, Debug)]
pub struct Job {
    /// Job id.
    pub id: u64,
    /// Job name.
    pub name: String,
    /// Stage name.
    pub stage: String,
    /// Script lines.
    pub script: Vec<String>,
    /// Container image, if any.
    pub image: Option<String>,
    /// Artifact paths.
    pub artifact_paths: Vec<String>,
    /// Its job token (routable to this Pod).
    pub token: String,
    /// Where it stands.
    pub state: JobState,
    /// The runner that took it.
    pub runner: Option<u64>,
    /// Bytes of trace received, in order.
    pub trace_len: u64,
    /// CRC-32 of the trace received.
    pub trace_crc: u32,
    /// The trace text received (its first [`TRACE_KEPT`] bytes).
    pub trace: Vec<u8>,
    /// Earlier jobs of the same pipeline whose artifacts this one downloads.
    pub dependencies: Vec<u64>,
    /// The uploaded artifact.
    pub artifact: Option<Artifact>,
}

#[derive(Debug, Default)]
struct Inner {
    next_runner: u64,
    /// Runner token → runner id.
    runners: HashMap<String, u64>,
    /// (runner id, system id) of the runner managers seen.
    managers: HashSet<(u64, String)>,
    next_job: u64,
    queue: VecDeque<u64>,
    jobs: HashMap<u64, Job>,
    job_tokens: HashMap<String, u64>,
    /// How many job requests found a job (for simulated 409 races).
    picks: u64,
}

/// What `jobs/request` answers.
#[derive(Debug)]
pub enum Pick {
    /// A job for the runner (201).
    Job(Box<Job>),
    /// Simulated race: another runner took it (409); it stays queued.
    Conflict,
    /// Nothing queued (204 after the long poll).
    Empty,
}

/// The Pod's state.
pub struct State {
    pod: PodId,
    format: TokenFormat,
    keys: KeySet,
    classifier: Classifier,
    registration_token: String,
    conflict_every: u64,
    template: JobSpec,
    inner: Mutex<Inner>,
    /// The queue ticket (`X-GitLab-Last-Update`): bumped whenever a job is queued.
    ticket: watch::Sender<u64>,
}

impl State {
    /// A Pod `pod` issuing tokens in `format` (JWTs signed with `keys`' signing key).
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
            conflict_every,
            template: JobSpec::default(),
            inner: Mutex::default(),
            ticket: watch::channel(1).0,
        };
        state.registration_token = match registration_token {
            Some(t) => t,
            None => state.issue(TokenKind::Runner, "glrt-")?,
        };
        Ok(state)
    }

    /// The spec [`State::enqueue`] queues jobs with.
    pub fn with_job_template(mut self, template: JobSpec) -> Self {
        self.template = template;
        self
    }

    /// The spec generated jobs are queued with.
    pub fn job_template(&self) -> &JobSpec {
        &self.template
    }

    /// This Pod's id.
    pub fn pod(&self) -> PodId {
        self.pod
    }

    /// The token `POST /runners` accepts.
    pub fn registration_token(&self) -> &str {
        &self.registration_token
    }

    /// The current queue ticket.
    pub fn ticket(&self) -> u64 {
        *self.ticket.borrow()
    }

    /// Watch the queue ticket (long polls wait on it).
    pub fn watch_ticket(&self) -> watch::Receiver<u64> {
        self.ticket.subscribe()
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

    /// Whether `token` is the registration token (or misrouted).
    pub fn check_registration(&self, token: &str) -> Owner<()> {
        let found = (token == self.registration_token).then_some(());
        self.owner(token, found)
    }

    /// Register a runner: (id, token).
    pub fn register(&self) -> Result<(u64, String), Error> {
        let token = self.issue(TokenKind::Runner, "glrt-")?;
        let mut inner = self.lock();
        inner.next_runner += 1;
        let id = inner.next_runner;
        inner.runners.insert(token.clone(), id);
        Ok((id, token))
    }

    /// The runner `token` authenticates.
    pub fn runner(&self, token: &str) -> Owner<u64> {
        let found = self.lock().runners.get(token).copied();
        self.owner(token, found)
    }

    /// `current_runner_manager`: the runner `runner` runs on `system_id`
    /// (`params.fetch(:system_id, '<legacy>')`, `lib/api/ci/helpers/runner.rb`).
    pub fn ensure_manager(&self, runner: u64, system_id: &str) {
        self.lock().managers.insert((runner, system_id.to_owned()));
    }

    /// Remove a runner manager: whether there was one.
    pub fn remove_manager(&self, runner: u64, system_id: &str) -> bool {
        self.lock().managers.remove(&(runner, system_id.to_owned()))
    }

    /// Forget a runner's token.
    pub fn unregister(&self, token: &str) -> bool {
        self.lock().runners.remove(token).is_some()
    }

    /// Replace a runner's token: the new token.
    pub fn reset_token(&self, token: &str) -> Result<Option<String>, Error> {
        let new = self.issue(TokenKind::Runner, "glrt-")?;
        let mut inner = self.lock();
        let Some(id) = inner.runners.remove(token) else {
            return Ok(None);
        };
        inner.runners.insert(new.clone(), id);
        Ok(Some(new))
    }

    /// Queue a job from the template (its dependencies: up to two earlier jobs).
    /// Wakes long polls.
    pub fn enqueue(&self) -> Result<u64, Error> {
        self.enqueue_spec(self.template.clone())
    }

    /// Queue a job as `spec` says. Its dependencies must be jobs queued earlier.
    /// Wakes long polls.
    pub fn enqueue_spec(&self, spec: JobSpec) -> Result<u64, Error> {
        let token = self.issue(TokenKind::Job, "glcbt-")?;
        let id = {
            let mut inner = self.lock();
            let id = inner.next_job + 1;
            let dependencies = match spec.dependencies {
                Some(deps) => {
                    if let Some(d) = deps.iter().find(|d| !inner.jobs.contains_key(d)) {
                        return Err(Error::Config(format!(
                            "dependencies: job {d} does not exist"
                        )));
                    }
                    deps
                }
                None => (id.saturating_sub(2)..id).filter(|d| *d > 0).collect(),
            };
            inner.next_job = id;
            inner.job_tokens.insert(token.clone(), id);
            inner.jobs.insert(
                id,
                Job {
                    id,
                    name: spec.name.unwrap_or_else(|| format!("build-{id}")),
                    stage: spec.stage,
                    script: spec.script,
                    image: spec.image,
                    artifact_paths: spec.artifacts,
                    token,
                    state: JobState::Pending,
                    runner: None,
                    trace_len: 0,
                    trace_crc: 0,
                    trace: Vec::new(),
                    dependencies,
                    artifact: None,
                },
            );
            inner.queue.push_back(id);
            id
        };
        self.ticket.send_modify(|t| *t += 1);
        Ok(id)
    }

    /// Jobs waiting for a runner.
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    /// Give the next queued job to `runner`.
    pub fn pick(&self, runner: u64) -> Pick {
        let mut inner = self.lock();
        if inner.queue.is_empty() {
            return Pick::Empty;
        }
        inner.picks += 1;
        if self.conflict_every > 0 && inner.picks.is_multiple_of(self.conflict_every) {
            return Pick::Conflict;
        }
        let Some(id) = inner.queue.pop_front() else {
            return Pick::Empty;
        };
        let job = inner.jobs.get_mut(&id).expect("queued jobs exist");
        job.state = JobState::Running;
        job.runner = Some(runner);
        Pick::Job(Box::new(job.clone()))
    }

    /// The job `token` belongs to.
    pub fn job_by_token(&self, token: &str) -> Owner<u64> {
        let found = self.lock().job_tokens.get(token).copied();
        self.owner(token, found)
    }

    /// A copy of job `id`.
    pub fn job(&self, id: u64) -> Option<Job> {
        self.lock().jobs.get(&id).cloned()
    }

    /// Tokens of job `id`'s dependencies, with their artifacts.
    pub fn dependencies(&self, id: u64) -> Vec<Job> {
        let inner = self.lock();
        inner
            .jobs
            .get(&id)
            .map(|j| {
                j.dependencies
                    .iter()
                    .filter_map(|d| inner.jobs.get(d).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `PUT jobs/:id`: move job `id` to `state`. A final state with a trace size the
    /// Pod has not received yet is accepted but not finished (202), as GitLab does
    /// while the trace is still arriving.
    pub fn update(&self, id: u64, state: JobState, trace_size: Option<u64>) -> Update {
        let mut inner = self.lock();
        let Some(job) = inner.jobs.get_mut(&id) else {
            return Update::NotFound;
        };
        // `authenticate_job!`: "Job is not processing on runner" (403 + Job-Status).
        if job.state != JobState::Running {
            return Update::Forbidden(job.state);
        }
        if state.is_final() && trace_size.is_some_and(|n| n != job.trace_len) {
            return Update::Accepted;
        }
        job.state = state;
        Update::Ok
    }

    /// `PATCH jobs/:id/trace`: append `data` at byte `start`, which must be where the
    /// trace ends now (GitLab's `Ci::AppendBuildTraceService` trusts only the start of
    /// `Content-Range` and takes the end from the body).
    pub fn append_trace(&self, id: u64, start: u64, data: &[u8]) -> Trace {
        let mut inner = self.lock();
        let Some(job) = inner.jobs.get_mut(&id) else {
            return Trace::NotFound;
        };
        if job.state != JobState::Running {
            return Trace::Forbidden(job.state);
        }
        if start != job.trace_len {
            return Trace::RangeMismatch(job.trace_len);
        }
        let mut h = crc32fast::Hasher::new_with_initial(job.trace_crc);
        h.update(data);
        job.trace_crc = h.finalize();
        job.trace_len += data.len() as u64;
        let room = TRACE_KEPT.saturating_sub(job.trace.len());
        job.trace.extend_from_slice(&data[..data.len().min(room)]);
        Trace::Ok(job.trace_len)
    }

    /// Record job `id`'s uploaded artifact.
    pub fn set_artifact(&self, id: u64, artifact: Artifact) -> bool {
        match self.lock().jobs.get_mut(&id) {
            Some(job) => {
                job.artifact = Some(artifact);
                true
            }
            None => false,
        }
    }
}

/// What a job update did.
#[derive(Debug, PartialEq, Eq)]
pub enum Update {
    /// Applied (200).
    Ok,
    /// Final state accepted, trace incomplete (202).
    Accepted,
    /// The job is already finished (403 + `Job-Status`).
    Forbidden(JobState),
    /// No such job (404).
    NotFound,
}

/// What a trace patch did.
#[derive(Debug, PartialEq, Eq)]
pub enum Trace {
    /// Appended; the trace is now this long (202 + `Range: 0-<len>`).
    Ok(u64),
    /// The patch does not start where the trace ends, which is here (416).
    RangeMismatch(u64),
    /// The job is not running (403 + `Job-Status`).
    Forbidden(JobState),
    /// No such job (404).
    NotFound,
}

#[cfg(test)]
mod tests;
