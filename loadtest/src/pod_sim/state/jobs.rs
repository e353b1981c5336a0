//! Jobs: what a queued job asks for ([`JobSpec`]), the queue
//! `Ci::RegisterJobService` picks from (a runner gets only a job it matches: its
//! tags and project, `Gitlab::Ci::Matching::RunnerMatcher`), the ticks of the keys
//! of the runners that can take a new job (`Ci::UpdateBuildQueueService#tick`), and
//! each job's updates, trace and artifact.
//!
//! Jobs are picked oldest first among those the runner matches (GitLab orders
//! instance runners' queues by the projects' running jobs first, "fair
//! scheduling"; the simulator keeps plain queue order).

use std::path::PathBuf;

use podgate_tokens::TokenKind;

use super::super::Error;
use super::super::queue::BuildMatcher;
use super::{LedgerEntry, LedgerSummary, Owner, State};

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
    /// The job's tags (`tags:` in `.gitlab-ci.yml`): only runners with all of them
    /// take it; none: runners that run untagged jobs.
    pub tags: Vec<String>,
    /// The job's project (`None`: the Pod's projects in turn).
    pub project: Option<u64>,
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
            tags: Vec::new(),
            project: None,
        }
    }
}

/// Largest trace text kept per job (the length and CRC cover all of it).
pub const TRACE_KEPT: usize = 1 << 20;

/// Finished jobs kept whole; older ones are archived: their state, runner, project,
/// trace length and CRC kept, the rest dropped (`state/archive.rs`).
pub const FINISHED_KEPT: usize = 1024;

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
    /// Its tags.
    pub tags: Vec<String>,
    /// Its project's id.
    pub project: u64,
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

impl Job {
    /// What the job asks of a runner (every simulated job builds the protected
    /// default branch).
    pub fn matcher(&self) -> BuildMatcher {
        BuildMatcher::new(self.project, &self.tags, true)
    }
}

/// What `jobs/request` answers (`Ci::RegisterJobService#execute`).
#[derive(Debug)]
pub enum Pick {
    /// A job for the runner (201).
    Job(Box<Job>),
    /// Simulated race: another runner took it (409); it stays queued.
    Conflict,
    /// Nothing queued that this runner can take (204).
    Empty,
}

impl State {
    /// Queue a generated job: the template, with the next of the job tag sets and,
    /// every time the tag sets come round, the next project (so every project gets
    /// every tag set); its dependencies are up to two earlier jobs. Ticks the keys of
    /// the runners that can take it.
    pub fn enqueue(&self) -> Result<u64, Error> {
        let n = {
            let mut inner = self.lock();
            inner.generated += 1;
            inner.generated - 1
        };
        let sets = self.tag_sets.len() as u64;
        let mut spec = self.template.clone();
        spec.tags = self.tag_sets[(n % sets) as usize].clone();
        spec.project = Some(self.projects[((n / sets) % self.projects.len() as u64) as usize].0);
        self.enqueue_spec(spec)
    }

    /// Queue a job as `spec` says. Its dependencies must be jobs queued earlier and
    /// its project one of the Pod's. Ticks the keys of the runners that can take it.
    pub fn enqueue_spec(&self, spec: JobSpec) -> Result<u64, Error> {
        if let Some(p) = spec.project
            && !self.projects.iter().any(|(id, _)| *id == p)
        {
            return Err(Error::Config(format!(
                "project: {p} is not a project of Pod {}",
                self.pod
            )));
        }
        let token = self.issue(TokenKind::Job, "glcbt-")?;
        let tags = super::super::queue::matching::clean(spec.tags);
        let matcher = {
            let mut inner = self.lock();
            let id = inner.next_job + 1;
            let dependencies = match spec.dependencies {
                Some(deps) => {
                    if let Some(d) = deps
                        .iter()
                        .find(|d| !inner.jobs.contains_key(d) && !inner.archive.contains(**d))
                    {
                        return Err(Error::Config(format!(
                            "dependencies: job {d} does not exist"
                        )));
                    }
                    deps
                }
                None => (id.saturating_sub(2)..id).filter(|d| *d > 0).collect(),
            };
            let project = match spec.project {
                Some(p) => p,
                None => {
                    inner.in_turn += 1;
                    self.projects[((inner.in_turn - 1) % self.projects.len() as u64) as usize].0
                }
            };
            inner.next_job = id;
            inner.job_tokens.insert(token.clone(), id);
            let job = Job {
                id,
                name: spec.name.unwrap_or_else(|| format!("build-{id}")),
                stage: spec.stage,
                script: spec.script,
                image: spec.image,
                artifact_paths: spec.artifacts,
                tags,
                project,
                token,
                state: JobState::Pending,
                runner: None,
                trace_len: 0,
                trace_crc: 0,
                trace: Vec::new(),
                dependencies,
                artifact: None,
            };
            let matcher = job.matcher();
            inner.jobs.insert(id, job);
            inner
                .queue
                .entry(matcher.clone())
                .or_default()
                .push_back(id);
            inner.queued += 1;
            (id, matcher)
        };
        // `Ci::UpdateBuildQueueService#tick`, after the job became pending.
        self.tick_for(&matcher.1);
        Ok(matcher.0)
    }

    /// Jobs waiting for a runner.
    pub fn queued(&self) -> usize {
        self.lock().queued
    }

    /// `Ci::RegisterJobService#execute`: give runner `runner` the oldest queued job
    /// it matches. Every `conflict_every`-th pick that finds one is a simulated race
    /// (409) and leaves the job queued.
    pub fn pick(&self, runner: u64) -> Pick {
        let Some(matcher) = self.matcher(runner) else {
            return Pick::Empty;
        };
        let mut inner = self.lock();
        let Some(class) = inner
            .queue
            .iter()
            .filter(|(b, q)| !q.is_empty() && matcher.matches(b))
            .min_by_key(|(_, q)| q.front().copied())
            .map(|(b, _)| b.clone())
        else {
            return Pick::Empty;
        };
        inner.picks += 1;
        if self.conflict_every > 0 && inner.picks.is_multiple_of(self.conflict_every) {
            return Pick::Conflict;
        }
        let Some(id) = inner.queue.get_mut(&class).and_then(|q| q.pop_front()) else {
            return Pick::Empty;
        };
        if inner.queue.get(&class).is_some_and(|q| q.is_empty()) {
            inner.queue.remove(&class);
        }
        inner.queued -= 1;
        inner.ledger.picked(id, runner);
        let job = inner.jobs.get_mut(&id).expect("queued jobs exist");
        job.state = JobState::Running;
        job.runner = Some(runner);
        Pick::Job(Box::new(job.clone()))
    }

    /// The job `token` belongs to.
    pub fn job_by_token(&self, token: &str) -> Owner<u64> {
        let found = {
            let inner = self.lock();
            inner
                .job_tokens
                .get(token)
                .copied()
                .or_else(|| inner.archive.by_token(token))
        };
        self.owner(token, found)
    }

    /// A copy of job `id` (of an archived job, what is left of it).
    pub fn job(&self, id: u64) -> Option<Job> {
        let inner = self.lock();
        match inner.jobs.get(&id) {
            Some(j) => Some(j.clone()),
            None => inner.archive.job(id),
        }
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
    ///
    /// The ledger ([`State::ledger`]) records an accepted final state, and a final
    /// state refused because the job had finished already as a duplicate.
    pub fn update(&self, id: u64, state: JobState, trace_size: Option<u64>) -> Update {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(job) = inner.jobs.get_mut(&id) else {
            return match inner.archive.state(id) {
                Some(done) => {
                    if state.is_final() {
                        inner.ledger.duplicate(id);
                    }
                    Update::Forbidden(done)
                }
                None => Update::NotFound,
            };
        };
        // `authenticate_job!`: "Job is not processing on runner" (403 + Job-Status).
        if job.state != JobState::Running {
            if state.is_final() && job.state.is_final() {
                inner.ledger.duplicate(id);
            }
            return Update::Forbidden(job.state);
        }
        if state.is_final() && trace_size.is_some_and(|n| n != job.trace_len) {
            return Update::Accepted;
        }
        job.state = state;
        if state.is_final() {
            inner.ledger.finished(id, state);
            inner.finished_whole.push_back(id);
            if inner.finished_whole.len() > FINISHED_KEPT
                && let Some(old) = inner.finished_whole.pop_front()
                && let Some(job) = inner.jobs.remove(&old)
            {
                inner.job_tokens.remove(&job.token);
                inner.archive.insert(job);
            }
        }
        Update::Ok
    }

    /// A `PUT jobs/:id` asking for final `state` with job `id`'s own token was refused
    /// before [`State::update`] (`authenticate_job!`: the job is not running): a
    /// duplicate in the ledger when the job had finished already.
    pub fn final_refused(&self, id: u64, state: JobState) {
        let mut inner = self.lock();
        let finished = match inner.jobs.get(&id) {
            Some(j) => j.state.is_final(),
            None => inner.archive.contains(id),
        };
        if state.is_final() && finished {
            inner.ledger.duplicate(id);
        }
    }

    /// The ledger: its counts and one line per job handed out, by id.
    pub fn ledger(&self) -> (LedgerSummary, Vec<LedgerEntry>) {
        let inner = self.lock();
        (inner.ledger.summary(), inner.ledger.entries())
    }

    /// Jobs queued since the Pod started (picked or not).
    pub fn jobs_created(&self) -> u64 {
        self.lock().next_job
    }

    /// `PATCH jobs/:id/trace`: append `data` at byte `start`, which must be where the
    /// trace ends now (GitLab's `Ci::AppendBuildTraceService` trusts only the start of
    /// `Content-Range` and takes the end from the body).
    pub fn append_trace(&self, id: u64, start: u64, data: &[u8]) -> Trace {
        let mut inner = self.lock();
        let Some(job) = inner.jobs.get_mut(&id) else {
            return match inner.archive.state(id) {
                Some(done) => Trace::Forbidden(done),
                None => Trace::NotFound,
            };
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
