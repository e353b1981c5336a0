//! `podgate agentk --kas URL --token-file F`: one agentk replica.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use podgate_agentk::{Agentk, AgentkConfig};

/// Flags of `podgate agentk`.
#[derive(Debug, Args)]
pub(crate) struct AgentkArgs {
    /// kas's agent listener (or the podgate proxy): `grpc://host:port` for gRPC over
    /// h2c, `ws://host:port/-/kubernetes-agent/` for gRPC inside a WebSocket;
    /// `grpcs://` and `wss://` for the same over TLS.
    #[arg(long)]
    kas: String,
    /// The file holding the agent token.
    #[arg(long)]
    token_file: PathBuf,
    /// A kubeconfig; without it: the in-cluster service account, else `$KUBECONFIG`
    /// or `~/.kube/config`.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// CA certificates (PEM) trusted for `grpcs://` and `wss://` kas URLs, instead of
    /// the system's.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// `/metrics`, `/healthz` and `/readyz` on this address ("off": none).
    #[arg(long, default_value = "0.0.0.0:8080")]
    observability_listen: String,
    /// Idle tunnels kept at kas (at least 2).
    #[arg(long, default_value_t = 2)]
    idle_tunnels: usize,
    /// Most requests answered at once.
    #[arg(long, default_value_t = 500)]
    max_busy_tunnels: usize,
    /// Graph API: seconds a watch may take to list before the client is warned
    /// (`INFORMER_SYNC_FAILED`).
    #[arg(long, default_value_t = 30.0)]
    graph_sync_timeout: f64,
    /// This replica's namespace, as reported to kas.
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pod_namespace: String,
    /// This replica's pod name, as reported to kas; also its identity in the
    /// Workspaces leader election (empty: a random one).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pod_name: String,
    /// Workspaces leader election: seconds the other replicas wait before taking
    /// over a Lease that is not renewed (client-go's default 15).
    #[arg(long, default_value_t = 15.0)]
    leader_lease_duration: f64,
    /// Workspaces leader election: seconds the leader keeps trying to renew before
    /// it stops leading (client-go's default 10).
    #[arg(long, default_value_t = 10.0)]
    leader_renew_deadline: f64,
    /// Workspaces leader election: seconds between tries (client-go's default 2).
    #[arg(long, default_value_t = 2.0)]
    leader_retry_period: f64,
}

pub(crate) fn run(args: AgentkArgs) -> anyhow::Result<ExitCode> {
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("--token-file {}", args.token_file.display()))?;
    let observability_listen = match args.observability_listen.as_str() {
        "off" => None,
        a => Some(a.parse::<SocketAddr>().with_context(|| {
            format!("--observability-listen {a:?}: expected ip:port or \"off\"")
        })?),
    };
    let config = AgentkConfig {
        kas_url: args.kas,
        token: token.trim().to_owned(),
        pod_namespace: args.pod_namespace,
        pod_name: args.pod_name,
        idle_tunnels: args.idle_tunnels,
        max_busy_tunnels: args.max_busy_tunnels,
        observability_listen,
        kubeconfig: args.kubeconfig,
        ca_file: args.ca_file,
        graph_sync_timeout: std::time::Duration::try_from_secs_f64(args.graph_sync_timeout)
            .context("--graph-sync-timeout: seconds, e.g. 30 or 0.5")?,
    };
    config.validate()?;
    let seconds = |flag: &str, v: f64| {
        std::time::Duration::try_from_secs_f64(v)
            .with_context(|| format!("--{flag}: seconds, e.g. 15 or 0.5"))
    };
    let leader = podgate_agentk::remote_development::LeaderOptions {
        lease_duration: seconds("leader-lease-duration", args.leader_lease_duration)?,
        renew_deadline: seconds("leader-renew-deadline", args.leader_renew_deadline)?,
        retry_period: seconds("leader-retry-period", args.leader_retry_period)?,
        ..podgate_agentk::remote_development::LeaderOptions::for_replica(
            &config.pod_namespace,
            &config.pod_name,
        )
    };
    leader
        .validate()
        .map_err(|e| super::usage(format!("--leader-*: {e}")))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let agentk = Agentk::start_with_leader(config, leader).await?;
        if let Some(addr) = agentk.observability_addr() {
            println!("agentk: observability on {addr}");
        }
        let stopped = tokio::select! {
            status = agentk.connected() => {
                println!(
                    "agentk: connected as agent {}, connection {}",
                    status.agent_id,
                    status.connection_id.unwrap_or_default()
                );
                false
            }
            _ = super::shutdown_signal() => true,
        };
        if stopped {
            agentk.shutdown().await;
            return Ok(ExitCode::SUCCESS);
        }
        super::shutdown_signal().await;
        println!("agentk: shutting down");
        agentk.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}
