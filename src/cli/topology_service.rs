//! `podgate topology-service --config topology-service.toml`: GitLab's Topology
//! Service (the file is documented in `podgate_topology_service::config`): gRPC and
//! the REST classify mapping on one port, until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use podgate_topology_service::config::Config;
use podgate_topology_service::server::Bound;

/// Flags of `podgate topology-service`.
#[derive(Debug, Args)]
pub(crate) struct TopologyServiceArgs {
    /// The configuration (TOML).
    #[arg(long, short)]
    config: PathBuf,
}

pub(crate) fn run(args: TopologyServiceArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(&args.config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let bound = Bound::bind(&config).await?;
        println!(
            "topology_service address={} cells={}",
            bound.local_addr()?,
            config.cells.len()
        );
        bound.serve(super::shutdown_signal()).await?;
        anyhow::Ok(ExitCode::SUCCESS)
    })
}
