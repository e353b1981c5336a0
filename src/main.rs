//! `podgate`: the one user-facing binary. Parses flags, starts logging, and hands each
//! subcommand to the library crate that implements it.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// mimalloc: pingora allocates per request (headers, buffers); glibc's malloc was
/// 12% of the proxy's CPU under load. The `system-alloc` feature leaves glibc's, so
/// heap profilers that interpose `malloc` (heaptrack, valgrind) see every allocation.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// podgate routes GitLab runner and agent traffic to the right Pod.
#[derive(Debug, Parser)]
#[command(name = "podgate", version, about, propagate_version = true)]
struct Args {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `podgate=debug`.
    /// pingora's own per-request error lines are off by default: the proxy logs each
    /// failed request itself, once, with its rule, Pod and token fingerprint.
    #[arg(
        long,
        global = true,
        env = "PODGATE_LOG",
        default_value = "warn,pingora_proxy=off"
    )]
    log: String,

    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Routable tokens: generate keys, mint, inspect.
    #[command(subcommand)]
    Token(cli::token::TokenCommand),
    /// The Pod topology and agent presence, in Redis or a topology file.
    Registry(cli::registry::RegistryArgs),
    /// The whole routing path on one machine: 3 simulated Pods, the proxy, a runner
    /// fleet, and a live table.
    #[cfg(feature = "sim")]
    Up(cli::up::UpArgs),
    /// Load generators (a simulated runner fleet).
    #[cfg(feature = "sim")]
    #[command(subcommand)]
    Loadtest(cli::loadtest::LoadtestCommand),
    /// Run a kas instance (agent, GitLab and kas-to-kas listeners).
    Kas(cli::kas::KasArgs),
    /// Run GitLab's Topology Service: which Cell owns what (claims), and
    /// classification for the HTTP Router, gitlab-shell, mail room and Rails.
    TopologyService(cli::topology_service::TopologyServiceArgs),
    /// Run one agentk replica: connect to kas, keep reverse tunnels, answer with the
    /// Kubernetes API.
    Agentk(cli::agentk::AgentkArgs),
    /// Simulate one GitLab Pod's runner API (with misroute detection).
    #[cfg(feature = "sim")]
    PodSim(cli::pod_sim::PodSimArgs),
    /// Simulate a Kubernetes API server that kubectl and agentk accept.
    #[cfg(feature = "sim")]
    KubeSim(cli::kube_sim::KubeSimArgs),
    /// Watch the Kubernetes object graph through the Graph API (as `glab cluster
    /// graph` does) and print it.
    Graph(cli::graph::GraphArgs),
    /// Create, stop, restart, terminate and list workspaces in a simulated GitLab.
    #[cfg(feature = "sim")]
    Workspaces(cli::workspaces::WorkspacesArgs),
    /// Run the edge router.
    Proxy {
        /// The proxy configuration (TOML).
        #[arg(long, short)]
        config: std::path::PathBuf,
        /// Zero-downtime upgrade: take the listening sockets over from the running
        /// proxy through `upgrade_sock`; then send the old process SIGQUIT.
        #[arg(long, short)]
        upgrade: bool,
    },
}

/// Transparent huge pages off for this process and those it starts, as Redis does
/// by default (`disable-thp yes`: `prctl(PR_SET_THP_DISABLE)`, `src/server.c`).
/// mimalloc advises its arenas `MADV_HUGEPAGE`, so with THP in `madvise` mode
/// (Debian's default) khugepaged collapses sparsely used 2 MiB ranges into huge
/// pages, and resident memory grows in steps that are not allocations: in a
/// 30-minute soak (`scripts/drills.sh R7`) the busiest simulated Pod went from 35
/// to 73 MB, 41 MB of it `AnonHugePages` in mimalloc's arena, while the others
/// held 6 MB of huge pages and stayed flat. `PODGATE_THP=on` keeps them.
fn disable_transparent_huge_pages() {
    if std::env::var_os("PODGATE_THP").is_some_and(|v| v == "on") {
        return;
    }
    // Not fatal: a kernel without THP (or the prctl) has nothing to disable.
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let args = Args::parse();
    if let Err(e) = init_tracing(&args.log, args.log_json) {
        eprintln!("podgate: --log {:?} (or PODGATE_LOG): {e}", args.log);
        return ExitCode::from(cli::EXIT_USAGE);
    }
    let result = match args.command {
        Command::Token(cmd) => cli::token::run(cmd),
        Command::Registry(args) => cli::registry::run(args),
        #[cfg(feature = "sim")]
        Command::PodSim(args) => cli::pod_sim::run(args),
        #[cfg(feature = "sim")]
        Command::KubeSim(args) => cli::kube_sim::run(args),
        Command::Graph(args) => cli::graph::run(args),
        #[cfg(feature = "sim")]
        Command::Workspaces(args) => cli::workspaces::run(args),
        Command::Kas(args) => cli::kas::run(args),
        Command::TopologyService(args) => cli::topology_service::run(args),
        Command::Agentk(args) => cli::agentk::run(args),
        #[cfg(feature = "sim")]
        Command::Loadtest(cmd) => cli::loadtest::run(cmd),
        #[cfg(feature = "sim")]
        Command::Up(args) => cli::up::run(args),
        Command::Proxy { config, upgrade } => podgate_proxy::config::ProxyConfig::load(&config)
            .and_then(|c| {
                podgate_proxy::server::run(c, podgate_proxy::server::RunOptions { upgrade })
            })
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("podgate: {e:#}");
            ExitCode::from(cli::exit_code(&e))
        }
    }
}

/// Start logging with `filter` (tracing's `EnvFilter` syntax); a filter that does not
/// parse is an error, not a quiet fallback.
fn init_tracing(filter: &str, json: bool) -> Result<(), tracing_subscriber::filter::ParseError> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}
