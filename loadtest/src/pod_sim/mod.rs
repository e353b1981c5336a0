//! `podgate pod-sim`: the runner API of one GitLab Pod, faithful enough for a real
//! GitLab Runner or a third-party one (GitLab Runner's `network/` package,
//! gitlab-org/gitlab-runner; GitLab's `lib/api/ci/runner.rb` and Workhorse's
//! `internal/builds/register.go`, gitlab-org/gitlab),
//! plus the one number that proves the proxy right: `misrouted_requests_total`, every
//! token that belongs to another Pod.
//!
//! - Parameters are read as GitLab's Grape/Rack API reads them (module `params`):
//!   query, JSON, form and multipart bodies, merged `GET.merge(POST)`.
//!   Runner endpoints authenticate `params[:token]` only; job endpoints
//!   `params[:token]`, then `JOB-TOKEN` (`lib/api/ci/helpers/runner.rb`).
//! - Registration issues runner tokens routable to this Pod (GitLab v1 `glrt-` with
//!   `c=<pod>`, or JWTs); verify, unregister, managers and reset work on them.
//! - Runners register with the instance registration token (instance runners) or a
//!   project's ([`State::project_registration_tokens`]: project runners), with
//!   `tag_list`, `run_untagged`, `locked`, `access_level` and `paused`.
//! - Jobs are queued at `job_rate` per second from [`PodSimConfig::job`] (cycling
//!   through [`PodSimConfig::job_tag_sets`] and the Pod's projects), by
//!   [`PodSim::enqueue`], or through the control API (`POST /-/podsim/jobs`); a
//!   runner gets only a job it matches (its tags, its project).
//! - `jobs/request` goes through a Workhorse layer (`http/workhorse.rs`: the poll is
//!   held on the runner's own queue key, `runner:build_queue:<token>`, up to
//!   [`PodSimConfig::long_poll`]) and then Rails (`http/jobs.rs`: a job, or 204 with
//!   the runner's current `X-GitLab-Last-Update`). A queued job ticks the keys of the
//!   runners that can take it ([`queue`]); with [`PodSimConfig::redis`] every key
//!   write is mirrored into Redis as GitLab writes it. 201 answers carry a job shaped
//!   like GitLab's: the predefined CI variables, the job's script and image, and
//!   `git_info` naming this Pod's real repository and commit.
//! - `PUT jobs/:id`, `PATCH jobs/:id/trace` (only the `Content-Range` start counts;
//!   416 when it is not the trace's length), artifacts upload (the `file` part
//!   streamed to disk and hashed) and download (streamed back).
//! - Git smart HTTP (`git http-backend`) for `/group/project-<pod>.git`, with
//!   `gitlab-ci-token:<job token>` Basic authentication.
//! - The pages of the Pod's own group and organization ([`namespace`],
//!   [`organization`]: `/team-<pod>/…`, `/o/org-<pod>/…`), which a path-routing
//!   front must bring here; another Pod's is a misroute (404, counted).
//! - What kas asks GitLab for its Kubernetes API proxy ([`kubernetes`]):
//!   `POST /api/v4/internal/kubernetes/authorize_proxy_user` (kas's JWT checked with
//!   [`PodSimConfig::kas_secret`]) and `GET /api/v4/job/allowed_agents`, from the
//!   Pod's users, personal access tokens (`glpat-`, routable here), browser sessions,
//!   agents ([`PodSimConfig::agents`]) and running jobs. The control API creates
//!   users, tokens, sessions and agents (`http/control.rs`).
//! - GitLab's side of Workspaces ([`workspaces`], `http/workspaces.rs`): a
//!   workspace store per Pod; `POST
//!   /api/v4/internal/kubernetes/modules/remote_development/reconcile` (kas's JWT,
//!   then the agent token kas passes in `Authorization: Bearer` or
//!   `Gitlab-Agentk-Api-Request`: 401 without
//!   one; 400 with Rails' message on bad parameters; 201 with the workspaces to
//!   apply, their `config_to_apply` and the `settings` of
//!   [`WorkspacesSimConfig::settings`]), `GET …/modules/remote_development/prerequisites`,
//!   and `POST /api/v4/internal/kubernetes/agent_configuration` (kas posts an
//!   agent's `config.yaml`; its `remote_development` keys become the agent's
//!   workspaces configuration; 204). Agent tokens are registered through
//!   [`PodSimConfig::agent_tokens`] or the control API, or are JWTs the Pod's keys
//!   verify. The control API creates, lists, stops, restarts and terminates
//!   workspaces (`/-/podsim/workspaces`) and sets an agent's workspaces
//!   configuration without kas (`/-/podsim/agents/N/workspaces_config`).
//!
//! Layout: this file ([`PodSim`], the running simulator, and [`enum@Error`]); `config`
//! ([`PodSimConfig`], [`WorkspacesSimConfig`], [`TokenFormat`]); `metrics`
//! ([`SimMetrics`], [`sum_samples`]); `http/` (one file per endpoint family:
//! `runners`, `jobs`, `trace`, `artifacts`, `git`, `kubernetes`, `users`,
//! `workspaces`, `agentw`, `control`, `workhorse`), `params/` (Rack and Grape
//! parameter parsing), [`state`] (the rules, no I/O), [`queue`] (runner queue keys,
//! matching, the Redis mirror), [`kubernetes`] (users, tokens and agents for the Kubernetes API proxy,
//! no I/O), [`workspaces`] (the Workspaces rules, no I/O), `repo` (the Git
//! repository).

mod config;
mod http;
pub mod kubernetes;
mod metrics;
mod params;
pub mod queue;
mod repo;
pub mod state;
pub mod workspaces;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;

pub use config::{PodSimConfig, TokenFormat, WorkspacesSimConfig};
pub use http::pages::{namespace, organization};
pub use kubernetes::{AgentSpec, AgentTokenOwner, KubeAccess};
pub use metrics::{RAILS_EVENTS, SimMetrics, WORKHORSE_STATES, WORKHORSE_STATUSES, sum_samples};
pub use repo::BRANCH;
pub use state::{AccessLevel, JobSpec, RunnerSpec, RunnerType, State};
pub use workspaces::reconcile::ReconcileSettings;
pub use workspaces::store::{Clock, WorkspaceStore};

/// Simulator errors.
#[derive(Debug, Error)]
pub enum Error {
    /// A configuration problem, naming the field.
    #[error("pod-sim configuration: {0}")]
    Config(String),
    /// A token could not be issued.
    #[error("issuing a token: {0}")]
    Token(String),
    /// Listening or storing artifacts failed.
    #[error("pod-sim I/O")]
    Io(#[from] std::io::Error),
    /// Creating the Git repository failed (is `git` installed?).
    #[error("creating the Git repository: {0}")]
    Git(String),
    /// Setting up the runner queues' Redis mirror failed.
    #[error(transparent)]
    Queue(#[from] queue::QueueError),
}

/// A running simulated Pod. Dropping it stops it.
pub struct PodSim {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What the request handlers share.
pub(crate) struct Shared {
    pub(crate) state: State,
    pub(crate) metrics: SimMetrics,
    pub(crate) config: PodSimConfig,
    /// Artifacts, uploads and the Git repository live here until the simulator stops.
    pub(crate) artifacts: tempfile::TempDir,
    /// The repository jobs clone (`None` when `git` could not create it).
    pub(crate) repo: Option<repo::Repo>,
    /// [`PodSimConfig::external_url`], resolved, without a trailing `/`.
    pub(crate) external_url: String,
    /// Users, tokens, sessions and agents for the Kubernetes API proxy.
    pub(crate) kube: KubeAccess,
    /// Workspaces and agents' workspaces configurations.
    pub(crate) workspaces: WorkspaceStore,
}

impl PodSim {
    /// Bind and serve.
    pub async fn start(config: PodSimConfig) -> Result<PodSim, Error> {
        config.validate()?;
        let metrics = SimMetrics::new(config.pod_id);
        let mut tasks = Vec::new();
        let mut queues = queue::RunnerQueues::new(metrics.runner_queue_ticks.clone());
        queues.set_watching_gauge(metrics.workhorse_open.with_label_values(&["watching"]));
        if let Some(url) = &config.redis {
            let (mirror, task) = queue::mirror::spawn(url, metrics.redis_errors.clone())?;
            queues.set_mirror(mirror);
            tasks.push(task);
        }
        let state = State::new(
            config.pod_id,
            config.token_format,
            config.keys.clone(),
            config.registration_token.clone(),
            config.conflict_every,
        )?
        .with_job_template(config.job.clone())
        .with_projects(config.projects)?
        .with_job_tag_sets(config.job_tag_sets.clone())?
        .with_queues(queues);
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("podgate-pod-sim-{}-", config.pod_id))
            .tempdir()?;
        let repo = match repo::create(&dir.path().join("git"), config.pod_id).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(pod = %config.pod_id, error = %e, "pod-sim: no Git repository; clones will fail");
                None
            }
        };
        let external_url = config
            .external_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"))
            .trim_end_matches('/')
            .to_owned();
        let kube = KubeAccess::new(config.pod_id, &config.agents).with_keys(config.keys.clone());
        for (token, agent) in &config.agent_tokens {
            kube.add_agent_token(token.clone(), *agent)
                .map_err(Error::Config)?;
        }
        let store = WorkspaceStore::default();
        for c in &config.workspaces.agent_configs {
            store.put_agent_config(c.clone());
        }
        metrics.refresh_workspaces(&store);
        let shared = Arc::new(Shared {
            kube,
            workspaces: store,
            state,
            metrics,
            artifacts: dir,
            repo,
            external_url,
            config,
        });
        tasks.push(tokio::spawn(http::serve(listener, shared.clone())));
        {
            // Expired queue keys nobody watches go, as Redis expires them.
            let s = shared.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                loop {
                    tick.tick().await;
                    s.state.queues().sweep();
                }
            }));
        }
        if shared.config.job_rate > 0.0 {
            let s = shared.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_secs_f64(1.0 / s.config.job_rate));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                loop {
                    tick.tick().await;
                    let max = s.config.max_pending;
                    if max > 0 && s.state.queued() >= max {
                        s.metrics.generator_skipped.inc();
                        continue;
                    }
                    if s.state.enqueue().is_ok() {
                        s.metrics.queued.set(s.state.queued() as i64);
                    }
                }
            }));
        }
        Ok(PodSim {
            addr,
            shared,
            tasks,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its state.
    pub fn state(&self) -> &State {
        &self.shared.state
    }

    /// Its metrics.
    pub fn metrics(&self) -> &SimMetrics {
        &self.shared.metrics
    }

    /// The URL job payloads name this Pod by.
    pub fn external_url(&self) -> &str {
        &self.shared.external_url
    }

    /// The commit jobs build (`None` when the repository could not be created).
    pub fn commit_sha(&self) -> Option<&str> {
        self.shared.repo.as_ref().map(|r| r.sha.as_str())
    }

    /// The project path jobs clone (`group/project-<pod>`; the repository is
    /// `<external_url>/<path>.git`).
    pub fn project_path(&self) -> String {
        repo::project_path(self.shared.config.pod_id)
    }

    /// Users, tokens, sessions and agents for the Kubernetes API proxy.
    pub fn kube(&self) -> &KubeAccess {
        &self.shared.kube
    }

    /// Its workspaces (tests move the store's clock: [`WorkspaceStore::clock`]).
    pub fn workspaces(&self) -> &WorkspaceStore {
        &self.shared.workspaces
    }

    /// Create a workspace for agent `agent_id` and user `user_id`, as the control
    /// API's `POST /-/podsim/workspaces` does.
    pub fn create_workspace(
        &self,
        agent_id: i64,
        user_id: u64,
        spec: workspaces::WorkspaceSpec,
    ) -> Result<workspaces::Workspace, workspaces::store::StoreError> {
        let project = repo::project_path(self.shared.config.pod_id);
        let name = project.rsplit('/').next().unwrap_or(&project).to_owned();
        let created = self.shared.workspaces.create(
            workspaces::store::NewWorkspace {
                agent_id,
                user_id,
                spec,
            },
            &name,
        );
        self.shared
            .metrics
            .refresh_workspaces(&self.shared.workspaces);
        created
    }

    /// Set workspace `id`'s desired state, as the control API's `PATCH
    /// /-/podsim/workspaces/N` does (`Terminated` is final).
    pub fn set_workspace_desired_state(
        &self,
        id: u64,
        state: workspaces::DesiredState,
    ) -> Result<workspaces::Workspace, workspaces::store::StoreError> {
        let result = self.shared.workspaces.set_desired_state(id, state);
        self.shared
            .metrics
            .refresh_workspaces(&self.shared.workspaces);
        result
    }

    /// Sign the user called `username` in, as a browser does: the `_gitlab_kas`
    /// session cookie's value and the page's CSRF token (what kas's Kubernetes API
    /// proxy and the Graph API accept from a browser).
    pub fn sign_in(&self, username: &str) -> Result<(String, String), Error> {
        self.shared.kube.sign_in(username).map_err(Error::Config)
    }

    /// A new personal access token (`glpat-`, routable to this Pod) for the user
    /// called `username`, with `scopes` (`k8s_proxy` lets it through kas's
    /// Kubernetes API proxy).
    pub fn create_personal_access_token(
        &self,
        username: &str,
        scopes: &[&str],
    ) -> Result<String, Error> {
        let user = self
            .shared
            .kube
            .user_by_name(username)
            .ok_or_else(|| Error::Config(format!("user {username:?}: no such user")))?;
        let token = self.shared.state.issue_personal_access_token()?;
        self.shared
            .kube
            .add_pat(
                token.clone(),
                user.id,
                scopes.iter().map(|s| (*s).to_owned()).collect(),
            )
            .map_err(Error::Config)?;
        Ok(token)
    }

    /// Queue a generated job: [`PodSimConfig::job`] with the next of
    /// [`PodSimConfig::job_tag_sets`] and the projects in turn ([`State::enqueue`]).
    /// Its id.
    pub fn enqueue(&self) -> Result<u64, Error> {
        let id = self.shared.state.enqueue()?;
        self.shared
            .metrics
            .queued
            .set(self.shared.state.queued() as i64);
        Ok(id)
    }

    /// Queue a job as `spec` says: its id.
    pub fn enqueue_spec(&self, spec: JobSpec) -> Result<u64, Error> {
        let id = self.shared.state.enqueue_spec(spec)?;
        self.shared
            .metrics
            .queued
            .set(self.shared.state.queued() as i64);
        Ok(id)
    }
}

impl Drop for PodSim {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
