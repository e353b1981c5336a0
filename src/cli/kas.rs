//! `podgate kas --config kas.toml`: one kas instance.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use podgate_agent::kas::Kas;
use podgate_agent::kas::config::KasFileConfig;
use podgate_registry::Registry;

/// Flags of `podgate kas`.
#[derive(Debug, Args)]
pub(crate) struct KasArgs {
    /// The kas configuration (TOML).
    #[arg(long, short)]
    config: PathBuf,
}

pub(crate) fn run(args: KasArgs) -> anyhow::Result<ExitCode> {
    let (config, registry_config) = KasFileConfig::load(&args.config)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let registry = Registry::connect(registry_config)
            .await
            .context("opening the presence registry")?;
        let kas = Kas::start(config, registry).await?;
        println!(
            "kas: agents on {}, GitLab (KasApi) on {}, kas (KasInternal) on {}",
            kas.agent_addr(),
            kas.external_addr(),
            kas.internal_addr()
        );
        if let Some(addr) = kas.observability_addr() {
            println!("kas: observability (/metrics, /healthz, /readyz) on {addr}");
        }
        super::shutdown_signal().await;
        println!("kas: shutting down; removing this kas and its agents from the registry");
        kas.shutdown().await?;
        Ok(ExitCode::SUCCESS)
    })
}
