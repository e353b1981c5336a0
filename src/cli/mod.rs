//! Subcommand glue: argument types and output formatting only; the work happens in
//! the library crates.
//!
//! The product's commands (`proxy`, `kas`, `agentk`, `token`, `registry`, `graph`)
//! are always built; the simulated world's (`up`, `loadtest`, `pod-sim`,
//! `kube-sim`, `workspaces`) only with the default feature `sim`.

pub(crate) mod agentk;
#[cfg(feature = "sim")]
pub(crate) mod drill;
pub(crate) mod graph;
#[cfg(feature = "sim")]
pub(crate) mod http_client;
pub(crate) mod kas;
#[cfg(feature = "sim")]
pub(crate) mod kube_sim;
#[cfg(feature = "sim")]
pub(crate) mod loadtest;
#[cfg(feature = "sim")]
pub(crate) mod loadtest_agents;
#[cfg(feature = "sim")]
pub(crate) mod pod_sim;
pub(crate) mod registry;
pub(crate) mod token;
pub(crate) mod topology_service;
#[cfg(feature = "sim")]
pub(crate) mod up;
#[cfg(feature = "sim")]
pub(crate) mod up_cells;
#[cfg(feature = "sim")]
pub(crate) mod up_console;
#[cfg(feature = "sim")]
pub(crate) mod up_graph;
#[cfg(feature = "sim")]
pub(crate) mod up_prometheus;
#[cfg(feature = "sim")]
pub(crate) mod up_proxy;
#[cfg(feature = "sim")]
pub(crate) mod up_redis;
#[cfg(feature = "sim")]
pub(crate) mod up_table;
#[cfg(feature = "sim")]
pub(crate) mod up_topology;
#[cfg(feature = "sim")]
pub(crate) mod up_workspaces;
#[cfg(feature = "sim")]
pub(crate) mod workspaces;

/// Exit code for usage and configuration errors (clap uses the same).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code for a token found invalid.
pub(crate) const EXIT_INVALID: u8 = 1;
/// Exit code for a failure while running: a listener that cannot be bound, Redis or
/// a Pod that cannot be reached, a server that stopped.
pub(crate) const EXIT_FAILURE: u8 = 1;

/// A flag or argument the command cannot use (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Usage(pub(crate) String);

/// A usage error saying `why`.
pub(crate) fn usage(why: impl Into<String>) -> anyhow::Error {
    Usage(why.into()).into()
}

/// The exit code for a command's error: [`EXIT_USAGE`] when anything in its chain is
/// a usage or configuration error (a flag, a configuration file, its keys), else
/// [`EXIT_FAILURE`]. Scripts and supervisors tell "fix the command" from "retry".
pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    use podgate_agentk as agentk;
    use podgate_kas as kas;
    use podgate_proxy::config as proxy;
    let usage = e.chain().any(|c| {
        c.is::<Usage>()
            || c.is::<clap::Error>()
            || c.is::<kas::config::Error>()
            || c.is::<podgate_topology_service::config::Error>()
            || c.is::<podgate_tokens::keys::Error>()
            || matches!(
                c.downcast_ref::<proxy::Error>(),
                Some(
                    proxy::Error::Invalid { .. } | proxy::Error::Io { .. } | proxy::Error::Keys(_)
                )
            )
            || matches!(
                c.downcast_ref::<agentk::Error>(),
                Some(agentk::Error::Invalid(_))
            )
            || matches!(
                c.downcast_ref::<podgate_registry::Error>(),
                Some(podgate_registry::Error::Config { .. } | podgate_registry::Error::ReadOnly)
            )
    });
    if usage { EXIT_USAGE } else { EXIT_FAILURE }
}

/// Resolves at the first SIGINT (Ctrl-C) or SIGTERM.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Parse a duration such as `90`, `90s`, `15m`, `1h` or `7d` into seconds.
pub(crate) fn parse_duration_secs(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 90s, 15m, 1h or 7d"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: unit must be s, m, h or d")),
    };
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration_secs;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("90"), Ok(90));
        assert_eq!(parse_duration_secs("15m"), Ok(900));
        assert_eq!(parse_duration_secs("1h"), Ok(3600));
        assert_eq!(parse_duration_secs("7d"), Ok(604_800));
        assert!(parse_duration_secs("0s").is_err());
        assert!(parse_duration_secs("1w").is_err());
        assert!(parse_duration_secs("h").is_err());
    }
}
