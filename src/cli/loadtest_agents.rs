//! `podgate loadtest agents`: many agentk replicas connected to one kas at once,
//! each holding its idle reverse tunnels, as a fleet of clusters does. It sizes a
//! kas: connect N agents, then read kas's memory and its `/metrics`. The agents
//! answer every request `UNIMPLEMENTED` (no Kubernetes behind them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures_util::StreamExt as _;
use podgate_agentk::{Agentk, AgentkConfig, Handler, Responses, unary};
use podgate_tokens::{KeySet, MintRequest, PodId, TokenKind};

/// Flags of `podgate loadtest agents`.
#[derive(Debug, Args)]
pub(crate) struct AgentsArgs {
    /// kas's agent listener, e.g. grpc://127.0.0.1:8150.
    #[arg(long)]
    kas: String,
    /// The agent-token signing key (a `<kid>.private.pem` of `podgate token
    /// keygen`; kas's `agent_keys` holds its public half).
    #[arg(long)]
    key: PathBuf,
    /// The Pod the tokens route to.
    #[arg(long, default_value_t = 1)]
    pod: u64,
    /// How many agents (one replica each).
    #[arg(long, default_value_t = 100)]
    agents: u64,
    /// The first agent id; the others follow.
    #[arg(long, default_value_t = 1)]
    first_agent: u64,
    /// Idle tunnels each replica keeps open (agentk's default 2).
    #[arg(long, default_value_t = 2)]
    idle_tunnels: usize,
    /// Replicas connecting at once.
    #[arg(long, default_value_t = 32)]
    connect_concurrency: usize,
    /// How long to hold them once all are connected, e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration_secs)]
    duration: u64,
}

/// Every request: `UNIMPLEMENTED`.
struct Nothing;

impl Handler for Nothing {
    fn handle(&self, method: String, _payload: Vec<u8>) -> Responses {
        unary(std::future::ready(Err(tonic::Status::unimplemented(
            method,
        ))))
    }
}

pub(crate) fn run(args: AgentsArgs) -> anyhow::Result<ExitCode> {
    if args.agents == 0 || args.connect_concurrency == 0 {
        return Err(super::usage(
            "--agents and --connect-concurrency must be at least 1".to_owned(),
        ));
    }
    let pod = PodId::new(args.pod)
        .ok_or_else(|| super::usage(format!("--pod {}: not a valid Pod id", args.pod)))?;
    let keys =
        KeySet::load(&args.key).with_context(|| format!("loading --key {}", args.key.display()))?;
    keys.signing_key()
        .with_context(|| format!("--key {}: no private key to sign with", args.key.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let started = Instant::now();
        let handler = Arc::new(Nothing);
        let ids = args.first_agent..args.first_agent + args.agents;
        let mut connecting = futures_util::stream::iter(ids.map(|agent| {
            let mut req = MintRequest::new(TokenKind::Agent, pod, 24 * 3600);
            req.agent = Some(agent);
            req.project = Some(agent);
            let token = keys
                .signing_key()
                .map_err(anyhow::Error::from)
                .and_then(|k| Ok(podgate_tokens::mint(&req, k, podgate_tokens::unix_now())?));
            let config = token.map(|token| AgentkConfig {
                kas_url: args.kas.clone(),
                token,
                pod_namespace: "gitlab-agent".into(),
                pod_name: format!("agentk-{agent}"),
                idle_tunnels: args.idle_tunnels,
                max_busy_tunnels: args.idle_tunnels.max(1),
                observability_listen: None,
                kubeconfig: None,
                ca_file: None,
                graph_sync_timeout: Duration::from_secs(30),
            });
            let handler = handler.clone();
            async move {
                let agentk = Agentk::start_with(config?, handler)
                    .await
                    .with_context(|| format!("agent {agent}"))?;
                agentk.connected().await;
                anyhow::Ok(agentk)
            }
        }))
        .buffer_unordered(args.connect_concurrency);
        let mut held = Vec::new();
        while let Some(agentk) = connecting.next().await {
            held.push(agentk?);
            if held.len() % 1000 == 0 {
                eprintln!("loadtest agents: {} connected", held.len());
            }
        }
        println!(
            "loadtest agents: {} agents connected to {} in {:.1} s, {} idle tunnels each; holding them {} s",
            held.len(),
            args.kas,
            started.elapsed().as_secs_f64(),
            args.idle_tunnels,
            args.duration
        );
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(args.duration)) => {}
            () = super::shutdown_signal() => {}
        }
        let lost = held.iter().filter(|a| a.status().connection_id.is_none()).count();
        for a in held {
            a.shutdown().await;
        }
        println!("loadtest agents: done; {lost} were not connected at the end");
        Ok(if lost == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    })
}
