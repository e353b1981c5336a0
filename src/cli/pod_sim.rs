//! `podgate pod-sim`: one simulated GitLab Pod's runner API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig, TokenFormat};
use podgate_tokens::{KeySet, PodId};

/// Flags of `podgate pod-sim`.
#[derive(Debug, Args)]
pub(crate) struct PodSimArgs {
    /// The Pod id its tokens route to.
    #[arg(long)]
    pod_id: PodId,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// How issued runner and job tokens are encoded.
    #[arg(long, value_enum, default_value = "gitlab-v1")]
    token_format: TokenFormat,
    /// Key files or directories: a private key to sign JWTs (`--token-format jwt`),
    /// public keys to recognise other Pods' JWTs as misroutes.
    #[arg(long = "key")]
    keys: Vec<PathBuf>,
    /// The registration token `POST /runners` accepts (default: a new `glrt-` token
    /// routable to this Pod, printed at start).
    #[arg(long, env = "PODGATE_REGISTRATION_TOKEN")]
    registration_token: Option<String>,
    /// Jobs queued per second.
    #[arg(long, default_value_t = 1.0)]
    job_rate: f64,
    /// The generator skips a tick while this many jobs are pending (0: no bound):
    /// a steady backlog for a soak whose runners take fewer jobs than `--job-rate`.
    #[arg(long, default_value_t = 0)]
    max_pending: usize,
    /// Longest hold of a `jobs/request` long poll on the runner's queue key, as
    /// Workhorse's `apiCiLongPollingDuration` (GitLab.com: 50 s), e.g. `50s`.
    #[arg(long, default_value = "50s", value_parser = super::parse_duration_secs)]
    long_poll: u64,
    /// How many projects the Pod has, each with its own registration token that
    /// registers project runners (`GET /-/podsim` lists them); they share one
    /// repository.
    #[arg(long, default_value_t = 2)]
    projects: usize,
    /// The tag sets generated jobs cycle through, each comma-separated (`""` is an
    /// untagged job), e.g. `--job-tags "" docker docker,linux gpu` (the default).
    #[arg(long = "job-tags", value_name = "TAGS", num_args = 1..)]
    job_tags: Option<Vec<String>>,
    /// Mirror every runner queue key write into this Redis (`redis://host:port`), as
    /// GitLab writes it: `SET runner:build_queue:<token> … EX 3600`, then `PUBLISH
    /// workhorse:notifications:runner:build_queue:<token> …`.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Answer every n-th job pick with 409 Conflict (0: never).
    #[arg(long, default_value_t = 0)]
    conflict_every: u64,
    /// The URL runners reach this Pod at (e.g. the proxy's), used in job payloads
    /// (`CI_SERVER_URL`, `git_info.repo_url`). Default: `http://<listen address>`.
    #[arg(long)]
    external_url: Option<String>,
    /// GitLab's Job Router is on here: `GET /api/v4/runners/router/discovery`
    /// answers this URL (the kas runners reach, e.g. `grpc://<proxy>`); without it
    /// discovery answers 501 and runners poll `jobs/request`.
    #[arg(long, value_name = "URL")]
    job_router_url: Option<String>,
    /// A line of the generated jobs' script; repeat for more lines (default: echo a
    /// line and write `out/result.txt`).
    #[arg(long = "job-script", value_name = "LINE")]
    job_script: Vec<String>,
    /// The generated jobs' container image.
    #[arg(long, value_name = "IMAGE", conflicts_with = "no_job_image")]
    job_image: Option<String>,
    /// Generated jobs have no image (`"image": null`), for shell runners.
    #[arg(long)]
    no_job_image: bool,
    /// An artifact path of the generated jobs; repeat for more (default: `out/`).
    #[arg(
        long = "job-artifact",
        value_name = "PATH",
        conflicts_with = "no_job_artifacts"
    )]
    job_artifacts: Vec<String>,
    /// Generated jobs upload no artifacts.
    #[arg(long)]
    no_job_artifacts: bool,
    /// The generated jobs' stage.
    #[arg(long, value_name = "STAGE")]
    job_stage: Option<String>,
    /// The GitLab ↔ kas secret file (base64, as kas's `external_secret_file`): kas's
    /// internal API calls (`authorize_proxy_user`) are verified with it; without it
    /// they are refused.
    #[arg(long, value_name = "FILE")]
    kas_secret_file: Option<PathBuf>,
    /// Register agent ID in the Pod's project, with `user_access` as the user for
    /// the project's members; repeat for more (more through the control API).
    #[arg(long = "agent", value_name = "ID")]
    agents: Vec<i64>,
    /// An opaque agent token of a `--agent`, as `ID=TOKEN`: it authenticates the
    /// module requests kas forwards for that agent (`Authorization: Bearer`);
    /// repeat for more. JWT agent tokens the `--key`s verify need no flag.
    #[arg(long = "agent-token", value_name = "ID=TOKEN")]
    agent_tokens: Vec<String>,
    /// Enable Workspaces for every `--agent` with this DNS zone, as kas's
    /// `agent_configuration` would store `remote_development: {enabled: true,
    /// dns_zone: ZONE}` (without it, kas or the control API configure agents).
    #[arg(long, value_name = "ZONE")]
    workspaces_dns_zone: Option<String>,
    /// The full reconciliation interval the reconcile answers tell agentk
    /// (`settings.full_reconciliation_interval_seconds`).
    #[arg(long, default_value = "3600s", value_parser = super::parse_duration_secs)]
    workspaces_full_interval: u64,
    /// The partial reconciliation interval the reconcile answers tell agentk
    /// (`settings.partial_reconciliation_interval_seconds`).
    #[arg(long, default_value = "10s", value_parser = super::parse_duration_secs)]
    workspaces_partial_interval: u64,
    /// Without the `remote_development` licensed feature: the Workspaces module
    /// endpoints answer 403.
    #[arg(long)]
    no_remote_development_license: bool,
}

pub(crate) fn run(args: PodSimArgs) -> anyhow::Result<ExitCode> {
    let keys = if args.keys.is_empty() {
        KeySet::new()
    } else {
        KeySet::load_all(&args.keys).context("loading --key")?
    };
    let mut config = PodSimConfig::new(args.pod_id, args.listen);
    config.token_format = args.token_format;
    config.keys = keys;
    config.registration_token = args.registration_token;
    config.job_rate = args.job_rate;
    config.max_pending = args.max_pending;
    config.long_poll = Duration::from_secs(args.long_poll);
    config.projects = args.projects;
    if let Some(sets) = &args.job_tags {
        config.job_tag_sets = sets
            .iter()
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .collect();
    }
    config.redis = args.redis;
    config.conflict_every = args.conflict_every;
    config.external_url = args.external_url;
    config.job_router_url = args.job_router_url;
    if !args.job_script.is_empty() {
        config.job.script = args.job_script;
    }
    if args.no_job_image {
        config.job.image = None;
    } else if let Some(image) = args.job_image {
        config.job.image = Some(image);
    }
    if args.no_job_artifacts {
        config.job.artifacts.clear();
    } else if !args.job_artifacts.is_empty() {
        config.job.artifacts = args.job_artifacts;
    }
    if let Some(stage) = args.job_stage {
        config.job.stage = stage;
    }
    if let Some(path) = &args.kas_secret_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --kas-secret-file {}", path.display()))?;
        config.kas_secret = Some(
            podgate_agent::auth::decode_secret("kas_secret_file", &text)
                .context("--kas-secret-file")?,
        );
    }
    config.agents = args
        .agents
        .iter()
        .map(|id| AgentSpec::with_user_access(*id, args.pod_id))
        .collect();
    for pair in &args.agent_tokens {
        let (id, token) = pair
            .split_once('=')
            .with_context(|| "--agent-token: expected ID=TOKEN".to_owned())?;
        let id: i64 = id
            .trim()
            .parse()
            .with_context(|| format!("--agent-token: agent id {id:?} is not a number"))?;
        config.agent_tokens.push((token.to_owned(), id));
    }
    if let Some(zone) = &args.workspaces_dns_zone {
        for id in &args.agents {
            let rd = serde_json::json!({"enabled": true, "dns_zone": zone});
            let c = podgate_loadtest::pod_sim::workspaces::agent_config::from_remote_development(
                *id, &rd,
            )
            .with_context(|| format!("--workspaces-dns-zone {zone:?}"))?;
            config.workspaces.agent_configs.push(c);
        }
    }
    config
        .workspaces
        .settings
        .full_reconciliation_interval_seconds = args.workspaces_full_interval;
    config
        .workspaces
        .settings
        .partial_reconciliation_interval_seconds = args.workspaces_partial_interval;
    config.workspaces.licensed = !args.no_remote_development_license;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let sim = PodSim::start(config).await?;
        println!(
            "pod-sim: Pod {} listening on http://{}",
            args.pod_id,
            sim.addr()
        );
        println!(
            "pod-sim: registration token {}",
            sim.state().registration_token()
        );
        let projects: Vec<String> = sim
            .state()
            .project_ids()
            .iter()
            .map(u64::to_string)
            .collect();
        println!(
            "pod-sim: projects {} (their registration tokens: GET http://{}/-/podsim)",
            projects.join(", "),
            sim.addr()
        );
        println!("pod-sim: metrics on http://{}/metrics", sim.addr());
        println!(
            "pod-sim: jobs clone {}/{}.git at {}",
            sim.external_url(),
            sim.project_path(),
            sim.commit_sha()
                .unwrap_or("(no repository: is git installed?)")
        );
        println!("pod-sim: control API on http://{}/-/podsim", sim.addr());
        println!(
            "pod-sim: workspaces on http://{}/-/podsim/workspaces",
            sim.addr()
        );
        super::shutdown_signal().await;
        let misrouted = sim.metrics().misrouted.get();
        println!("pod-sim: stopping; misrouted requests: {misrouted}");
        Ok(ExitCode::SUCCESS)
    })
}
