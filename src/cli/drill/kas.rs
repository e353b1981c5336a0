//! `drill get-pods`: what GitLab asks kas for an agent (`KasApi.GetPods` on kas's
//! external listener, with GitLab's JWT), timed, as one JSON line: `{"ok", "ms",
//! "pods", "connection_id"}` or `{"ok": false, "ms", "error"}`. The R3 drill calls
//! it on the kas that survives to see when the agent of the killed one is reachable
//! again.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use podgate_agent::proto::GetPodsRequest;
use podgate_agent::proto::kas_api_client::KasApiClient;
use serde_json::json;

/// Flags of `drill get-pods`.
#[derive(Debug, Args)]
pub(crate) struct GetPodsArgs {
    /// kas's external (GitLab) listener, `host:port`.
    #[arg(long)]
    kas: String,
    /// The GitLab ↔ kas secret file (base64, kas's `external_secret_file`).
    #[arg(long)]
    secret_file: PathBuf,
    /// The agent.
    #[arg(long)]
    agent_id: i64,
    /// Longest wait for the answer (kas waits up to its `max_wait` for the agent).
    #[arg(long, default_value = "30s", value_parser = super::parse_millis)]
    timeout: Duration,
}

pub(crate) async fn get_pods(args: GetPodsArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.secret_file)
        .with_context(|| format!("reading {}", args.secret_file.display()))?;
    let secret = podgate_agent::auth::decode_secret("secret_file", &text)?;
    let token = podgate_agent::auth::mint_external(&secret, "gitlab", 60)?;
    let started = Instant::now();
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.kas))?
            .connect()
            .await?;
        let mut client = KasApiClient::new(channel);
        let mut request = tonic::Request::new(GetPodsRequest {
            agent_id: args.agent_id,
            connection_id: 0,
            namespace: String::new(),
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
        anyhow::Ok(client.get_pods(request).await?.into_inner())
    };
    let answer = tokio::time::timeout(args.timeout, call).await;
    let ms = started.elapsed().as_millis() as u64;
    let (line, ok) = match answer {
        Ok(Ok(r)) => (
            json!({"ok": true, "ms": ms, "pods": r.pods.len(), "connection_id": r.connection_id}),
            true,
        ),
        Ok(Err(e)) => (
            json!({"ok": false, "ms": ms, "error": format!("{e:#}")}),
            false,
        ),
        Err(_) => (json!({"ok": false, "ms": ms, "error": "timed out"}), false),
    };
    println!("{line}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
