//! `podgate kas --config kas.toml`: one kas instance (the file's sections are
//! documented in `podgate_kas::config`: listeners, secrets, `[gitlab]`,
//! `[agent_configuration]`, `[agent_info]`, `[k8s_proxy]`, `[registry]`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use podgate_kas::Kas;
use podgate_kas::config::KasFileConfig;
use podgate_registry::Registry;

/// Flags of `podgate kas`.
#[derive(Debug, Args)]
pub(crate) struct KasArgs {
    /// The kas configuration (TOML).
    #[arg(long, short)]
    config: PathBuf,
    /// How other kas reach this one's internal listener, instead of the file's
    /// `advertise_internal`: `host:port`, or `grpc://host:port` as GitLab's chart
    /// sets `OWN_PRIVATE_API_URL` to the pod's IP (kas reads that variable,
    /// `cmd/kas/kasapp/configured_app.go`).
    #[arg(long, env = "OWN_PRIVATE_API_URL")]
    advertise_internal: Option<String>,
    /// On SIGTERM/SIGINT, how long requests in flight may take to finish.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration_secs)]
    shutdown_grace: u64,
}

pub(crate) fn run(args: KasArgs) -> anyhow::Result<ExitCode> {
    let (mut config, registry_config) = KasFileConfig::load(&args.config)?;
    if let Some(a) = &args.advertise_internal {
        config.advertise_internal = Some(advertise(a).map_err(super::usage)?);
    }
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

/// `host:port` from `--advertise-internal` / `OWN_PRIVATE_API_URL` (`grpc://` is
/// GitLab's scheme for it; `grpcs://` would need TLS, which the internal listener
/// does not speak).
fn advertise(value: &str) -> Result<String, String> {
    let rest = value.strip_prefix("grpc://").unwrap_or(value);
    match rest.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty()
                && !rest.contains('/')
                && port.parse::<u16>().is_ok_and(|p| p > 0) =>
        {
            Ok(rest.to_owned())
        }
        _ => Err(format!(
            "--advertise-internal (or OWN_PRIVATE_API_URL) {value:?}: expected host:port or grpc://host:port"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::advertise;

    #[test]
    fn advertise_takes_gitlabs_form_and_host_port() {
        assert_eq!(advertise("grpc://10.0.0.5:8155").unwrap(), "10.0.0.5:8155");
        assert_eq!(advertise("kas-0.kas:8155").unwrap(), "kas-0.kas:8155");
        for bad in [
            "grpcs://10.0.0.5:8155",
            "10.0.0.5",
            "grpc://:8155",
            "x:0",
            "http://a:1/b",
        ] {
            assert!(
                advertise(bad).unwrap_err().contains("expected host:port"),
                "{bad}"
            );
        }
    }
}
