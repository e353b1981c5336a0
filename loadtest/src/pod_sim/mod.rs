//! `podgate pod-sim`: the runner API of one GitLab Pod, faithful enough for a real
//! GitLab Runner or a third-party one (see `shared/reference/runner-protocol.md`),
//! plus the one number that proves the proxy right: `misrouted_requests_total`, every
//! token that belongs to another Pod.
//!
//! - Parameters are read as GitLab's Grape/Rack API reads them (module `params`):
//!   query, JSON, form and multipart bodies, merged `GET.merge(POST)`.
//!   Runner endpoints authenticate `params[:token]` only; job endpoints
//!   `params[:token]`, then `JOB-TOKEN` (`lib/api/ci/helpers/runner.rb`).
//! - Registration issues runner tokens routable to this Pod (GitLab v1 `glrt-` with
//!   `c=<pod>`, or JWTs); verify, unregister, managers and reset work on them.
//! - Jobs are queued at `job_rate` per second from [`PodSimConfig::job`], by
//!   [`PodSim::enqueue`], or through the control API (`POST /-/podsim/jobs`);
//!   `jobs/request` long-polls on the `X-GitLab-Last-Update` ticket and answers 201
//!   with a job shaped like GitLab's: the predefined CI variables, the job's script
//!   and image, and `git_info` naming this Pod's real repository and commit.
//! - `PUT jobs/:id`, `PATCH jobs/:id/trace` (only the `Content-Range` start counts;
//!   416 when it is not the trace's length), artifacts upload (the `file` part
//!   streamed to disk and hashed) and download (streamed back).
//! - Git smart HTTP (`git http-backend`) for `/group/project-<pod>.git`, with
//!   `gitlab-ci-token:<job token>` Basic authentication.
//! - What kas asks GitLab for its Kubernetes API proxy ([`kubernetes`]):
//!   `POST /api/v4/internal/kubernetes/authorize_proxy_user` (kas's JWT checked with
//!   [`PodSimConfig::kas_secret`]) and `GET /api/v4/job/allowed_agents`, from the
//!   Pod's users, personal access tokens (`glpat-`, routable here), browser sessions,
//!   agents ([`PodSimConfig::agents`]) and running jobs. The control API creates
//!   users, tokens, sessions and agents (`http/control.rs`).
//!
//! Layout: `http/` (one file per endpoint family: `runners`, `jobs`, `trace`,
//! `artifacts`, `git`, `control`), `params/` (Rack and Grape parameter parsing),
//! [`state`] (the rules, no I/O), [`kubernetes`] (users, tokens and agents for the
//! Kubernetes API proxy, no I/O), `repo` (the Git repository).

mod http;
pub mod kubernetes;
mod params;
mod repo;
pub mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use podgate_tokens::{KeySet, PodId};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::Deserialize;
use thiserror::Error;
use tokio::net::TcpListener;

pub use kubernetes::{AgentSpec, KubeAccess};
pub use repo::BRANCH;
pub use state::{JobSpec, State};

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
}

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
    /// Jobs queued per second (0: only through [`PodSim::enqueue`]).
    pub job_rate: f64,
    /// How long `jobs/request` holds a poll with nothing to give.
    pub long_poll: Duration,
    /// Every n-th job pick answers 409 (0: never).
    pub conflict_every: u64,
    /// Largest artifact accepted (413 above).
    pub max_artifact_bytes: u64,
    /// The URL runners reach this Pod at, used in job payloads (`CI_SERVER_URL`,
    /// `git_info.repo_url`, …): e.g. the proxy's URL. `None`: `http://<listen address>`.
    pub external_url: Option<String>,
    /// What generated jobs ([`PodSim::enqueue`], `job_rate`) run: script, image (none
    /// is possible), artifact paths and stage.
    pub job: JobSpec,
    /// The GitLab ↔ kas shared secret (≥ 32 bytes): verifies kas's
    /// `Gitlab-Kas-Api-Request` JWT on the internal API. `None`: kas is refused.
    pub kas_secret: Option<Vec<u8>>,
    /// Agents registered in the Pod's project (more through the control API).
    pub agents: Vec<AgentSpec>,
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
            long_poll: Duration::from_secs(50),
            conflict_every: 0,
            max_artifact_bytes: 1 << 30,
            external_url: None,
            job: JobSpec::default(),
            kas_secret: None,
            agents: Vec::new(),
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
        if self.job.script.is_empty() {
            bad.push("job.script: at least one line".into());
        }
        if self.job.stage.is_empty() {
            bad.push("job.stage: must not be empty".into());
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

/// The simulator's metrics, in a registry of its own (several Pods share a process
/// in `podgate up`).
pub struct SimMetrics {
    registry: Registry,
    /// `misrouted_requests_total`: tokens that belong to another Pod.
    pub misrouted: IntCounter,
    /// `podsim_requests_total{endpoint,status}`.
    pub requests: IntCounterVec,
    /// `podsim_jobs_queued`.
    pub queued: IntGauge,
    /// `podsim_artifact_bytes_total`: artifact bytes received.
    pub artifact_bytes: IntCounter,
}

impl SimMetrics {
    fn new(pod: PodId) -> Self {
        let registry =
            Registry::new_custom(None, Some([("pod".to_owned(), pod.to_string())].into()))
                .expect("valid registry labels");
        let misrouted = IntCounter::new(
            "misrouted_requests_total",
            "Requests whose token belongs to another Pod (answered 403).",
        )
        .expect("valid metric");
        let requests = IntCounterVec::new(
            Opts::new("podsim_requests_total", "Requests by endpoint and status."),
            &["endpoint", "status"],
        )
        .expect("valid metric");
        let queued = IntGauge::new("podsim_jobs_queued", "Jobs waiting for a runner.")
            .expect("valid metric");
        let artifact_bytes =
            IntCounter::new("podsim_artifact_bytes_total", "Artifact bytes received.")
                .expect("valid metric");
        for m in [
            Box::new(misrouted.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(requests.clone()),
            Box::new(queued.clone()),
            Box::new(artifact_bytes.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        SimMetrics {
            registry,
            misrouted,
            requests,
            queued,
            artifact_bytes,
        }
    }

    /// Requests answered, all endpoints and statuses.
    pub fn requests_total(&self) -> u64 {
        sum_samples(&self.render(), "podsim_requests_total{", |_| true)
    }

    /// The Prometheus text format.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The sum of the samples in Prometheus `text` whose line starts with `prefix` (a
/// metric name and `{`) and whose labels satisfy `keep`.
pub fn sum_samples(text: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
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
}

impl PodSim {
    /// Bind and serve.
    pub async fn start(config: PodSimConfig) -> Result<PodSim, Error> {
        config.validate()?;
        let state = State::new(
            config.pod_id,
            config.token_format,
            config.keys.clone(),
            config.registration_token.clone(),
            config.conflict_every,
        )?
        .with_job_template(config.job.clone());
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
        let shared = Arc::new(Shared {
            kube: KubeAccess::new(config.pod_id, &config.agents),
            state,
            metrics: SimMetrics::new(config.pod_id),
            artifacts: dir,
            repo,
            external_url,
            config,
        });
        let mut tasks = vec![tokio::spawn(http::serve(listener, shared.clone()))];
        if shared.config.job_rate > 0.0 {
            let s = shared.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick =
                    tokio::time::interval(Duration::from_secs_f64(1.0 / s.config.job_rate));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                loop {
                    tick.tick().await;
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

    /// Queue a job from [`PodSimConfig::job`]: its id.
    pub fn enqueue(&self) -> Result<u64, Error> {
        self.enqueue_spec(self.shared.config.job.clone())
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
