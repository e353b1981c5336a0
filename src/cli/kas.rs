//! `podgate kas --config kas.toml`: one kas instance (the file's sections are
//! documented in `podgate_agent::kas::config`: listeners, secrets, `[gitlab]`,
//! `[agent_configuration]`, `[agent_info]`, `[k8s_proxy]`, `[registry]`).

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
    /// On SIGTERM/SIGINT, how long requests in flight may take to finish.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration_secs)]
    shutdown_grace: u64,
}

pub(crate) fn run(args: KasArgs) -> anyhow::Result<ExitCode> {
    let (config, registry_config) = KasFileConfig::load(&args.config)?;
    let k8s_prefix = config.k8s_proxy.as_ref().map(|p| p.url_prefix.clone());
    let gitlab_url = config.gitlab_url.clone();
    let agent_config = config.agent_config.clone();
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
        if let (Some(addr), Some(prefix)) = (kas.k8s_proxy_addr(), &k8s_prefix) {
            println!("kas: Kubernetes API proxy (kubectl, the Graph API at {prefix}graph) on http://{addr}{prefix}");
        }
        if let Some(addr) = kas.workspaces_addr() {
            println!(
                "kas: Workspaces HTTP server (https://<port>-<workspace>.<zone>/, Authorization: Bearer <personal access token>) on http://{addr}"
            );
        }
        if let Some(url) = &gitlab_url {
            println!(
                "kas: agentk modules' requests (GitlabAccess) go to GitLab at {url}/api/v4/internal/kubernetes/modules/"
            );
        }
        if let Some(source) = &agent_config {
            println!(
                "kas: agent configurations from {}/<agent id>.yaml, polled every {}{}",
                source.dir.display(),
                humantime_secs(source.poll),
                if gitlab_url.is_some() {
                    ", posted to GitLab on change"
                } else {
                    " (no [gitlab] url: not posted to GitLab)"
                }
            );
        }
        super::shutdown_signal().await;
        println!(
            "kas: shutting down; removing this kas and its agents from the registry, \
             then up to {}s for requests in flight",
            args.shutdown_grace
        );
        kas.shutdown_with_grace(std::time::Duration::from_secs(args.shutdown_grace))
            .await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// `20s`, `1.5s`.
fn humantime_secs(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs_f64())
}
