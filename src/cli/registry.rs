//! `podgate registry …`: look at and change the topology; look up agents.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use podgate_registry::{BackendConfig, Pod, PodState, Registry, RegistryConfig, Topology};
use podgate_tokens::PodId;

/// Where the registry is, and what to do with it.
#[derive(Debug, Args)]
pub(crate) struct RegistryArgs {
    /// A Redis server: `redis://host:port[/db]`.
    #[arg(long, env = "PODGATE_REDIS", global = true, conflicts_with_all = ["redis_cluster", "topology"])]
    redis: Option<String>,
    /// A Redis Cluster: seed nodes, comma-separated.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        conflicts_with = "topology"
    )]
    redis_cluster: Vec<String>,
    /// A static topology file (TOML), read-only.
    #[arg(long, global = true)]
    topology: Option<PathBuf>,
    /// Key prefix in Redis.
    #[arg(long, global = true, default_value = "podgate")]
    prefix: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: RegistryCommand,
}

#[derive(Debug, Subcommand)]
enum RegistryCommand {
    /// Pods: list, add, rm, drain, undrain, down, default.
    #[command(subcommand)]
    Pods(PodsCommand),
    /// Connected agents, by agent id or by project id.
    Agents {
        /// The agent's id.
        #[arg(
            long,
            required_unless_present = "project_id",
            conflicts_with = "project_id"
        )]
        agent_id: Option<i64>,
        /// The configuration project's id.
        #[arg(long)]
        project_id: Option<i64>,
    },
    /// Running kas instances.
    Kas,
}

#[derive(Debug, Subcommand)]
enum PodsCommand {
    /// List every Pod.
    List,
    /// Add or replace a Pod.
    Add {
        /// Pod (cell) id.
        #[arg(long)]
        id: PodId,
        /// Name for people.
        #[arg(long)]
        name: String,
        /// Web upstream `host:port` (repeatable).
        #[arg(long)]
        web: Vec<String>,
        /// kas upstream `host:port`: its agent listener (repeatable).
        #[arg(long)]
        kas: Vec<String>,
        /// kas's Kubernetes API proxy listener `host:port` (repeatable): where
        /// `/-/kubernetes-agent/k8s-proxy/` goes.
        #[arg(long)]
        kas_k8s_proxy: Vec<String>,
        /// kas's Workspaces HTTP server listener `host:port` (repeatable): where
        /// workspace hosts go (the proxy's `[workspaces] host_suffix`).
        #[arg(long)]
        kas_workspaces: Vec<String>,
        /// Retired: Pods have no weight (a Pod's traffic is spread evenly over its
        /// healthy upstreams). Accepted with a warning so existing scripts keep
        /// working.
        #[arg(long, hide = true)]
        weight: Option<u32>,
        /// Label `key=value` (repeatable).
        #[arg(long, value_parser = parse_label)]
        label: Vec<(String, String)>,
        /// Session-cookie prefix (default `cell-<id>`).
        #[arg(long)]
        session_prefix: Option<String>,
        /// Make it the default ("legacy") Pod too.
        #[arg(long)]
        default: bool,
    },
    /// Remove a Pod.
    Rm {
        /// Pod id.
        id: PodId,
    },
    /// Stop sending traffic to a Pod (503 + Retry-After).
    Drain {
        /// Pod id.
        id: PodId,
    },
    /// Send traffic to a Pod again.
    Undrain {
        /// Pod id.
        id: PodId,
    },
    /// Mark a Pod down.
    Down {
        /// Pod id.
        id: PodId,
    },
    /// Make a Pod the default ("legacy") one.
    Default {
        /// Pod id.
        id: PodId,
    },
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?}: expected key=value"))
}

/// Run a `podgate registry` subcommand.
pub(crate) fn run(args: RegistryArgs) -> anyhow::Result<ExitCode> {
    let backend = if let Some(url) = &args.redis {
        BackendConfig::Redis { url: url.clone() }
    } else if !args.redis_cluster.is_empty() {
        BackendConfig::RedisCluster {
            nodes: args.redis_cluster.clone(),
        }
    } else if args.topology.is_some() {
        BackendConfig::Memory
    } else {
        return Err(super::usage(
            "say where the registry is: --redis URL, --redis-cluster URLS or --topology FILE",
        ));
    };
    let config = RegistryConfig {
        backend,
        topology_file: args.topology.clone(),
        key_prefix: args.prefix.clone(),
        ..RegistryConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let registry = Registry::connect(config).await?;
        // Fail fast and clearly when Redis is not there.
        let topology = registry.reload_topology().await?;
        match args.command {
            RegistryCommand::Pods(cmd) => pods(&registry, cmd, topology, args.json).await,
            RegistryCommand::Agents {
                agent_id,
                project_id,
            } => {
                let conns = match (agent_id, project_id) {
                    (Some(a), _) => registry.connections_by_agent(a).await?,
                    (None, Some(p)) => registry.connections_by_project(p).await?,
                    (None, None) => unreachable!("clap requires one"),
                };
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&conns)?);
                } else {
                    println!(
                        "{:>8} {:>20} {:>8}  {:<28} {:<24} version",
                        "agent", "connection", "project", "kas", "pod"
                    );
                    for c in &conns {
                        println!(
                            "{:>8} {:>20} {:>8}  {:<28} {:<24} {}",
                            c.agent_id,
                            c.connection_id,
                            c.project_id,
                            c.kas.0,
                            format!("{}/{}", c.pod_namespace, c.pod_name),
                            c.version
                        );
                    }
                    println!("{} connection(s)", conns.len());
                }
                Ok(ExitCode::SUCCESS)
            }
            RegistryCommand::Kas => {
                let list = registry.kas_instances().await?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&list)?);
                } else {
                    for k in &list {
                        println!("{}  {} {}", k.address, k.version, k.commit);
                    }
                    println!("{} kas instance(s)", list.len());
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

async fn pods(
    registry: &Registry,
    cmd: PodsCommand,
    current: std::sync::Arc<Topology>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let topology = match cmd {
        PodsCommand::List => current,
        PodsCommand::Add {
            id,
            name,
            web,
            kas,
            kas_k8s_proxy,
            kas_workspaces,
            weight,
            label,
            session_prefix,
            default,
        } => {
            if weight.is_some() {
                eprintln!("podgate registry: --weight is retired and ignored: Pods have no weight");
            }
            let pod = Pod {
                id,
                name,
                web,
                kas,
                kas_k8s_proxy,
                kas_workspaces,
                state: current.pod(id).map_or(PodState::Active, |p| p.state),
                labels: label.into_iter().collect::<BTreeMap<_, _>>(),
                session_prefix,
                runner_queue_redis: current.pod(id).and_then(|p| p.runner_queue_redis.clone()),
                cell_address: current.pod(id).and_then(|p| p.cell_address.clone()),
            };
            let t = registry.put_pod(pod).await?;
            if default {
                registry.set_default_pod(Some(id)).await?
            } else {
                t
            }
        }
        PodsCommand::Rm { id } => registry.remove_pod(id).await?,
        PodsCommand::Drain { id } => registry.set_pod_state(id, PodState::Draining).await?,
        PodsCommand::Undrain { id } => registry.set_pod_state(id, PodState::Active).await?,
        PodsCommand::Down { id } => registry.set_pod_state(id, PodState::Down).await?,
        PodsCommand::Default { id } => registry.set_default_pod(Some(id)).await?,
    };
    print_topology(&topology, json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_topology(t: &Topology, json: bool) -> anyhow::Result<()> {
    if json {
        let pods: Vec<&Pod> = t.pods.values().map(|p| &**p).collect();
        let doc = serde_json::json!({
            "version": t.version,
            "default_pod": t.default_pod,
            "pods": pods,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("topology version {}", t.version);
    println!(
        "{:>4}  {:<16} {:<9} {:<32} kas",
        "id", "name", "state", "web"
    );
    for p in t.pods.values() {
        let default = if t.default_pod == Some(p.id) {
            "*"
        } else {
            " "
        };
        println!(
            "{:>3}{default}  {:<16} {:<9} {:<32} {}",
            p.id.get(),
            p.name,
            p.state,
            p.web.join(","),
            p.kas.join(",")
        );
    }
    println!("{} Pod(s); * = default (legacy)", t.pods.len());
    Ok(())
}
