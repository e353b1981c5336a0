//! `podgate up --prometheus-config FILE`: a Prometheus configuration that scrapes
//! every process `podgate up` runs, with podgate's recording and alerting rules
//! written beside it, so `prometheus --config.file FILE` watches the fleet with
//! the rules and dashboards podgate ships.
//!
//! Jobs (the dashboards' `job` variables): `podgate-proxy` (the proxy's admin
//! listener), `podgate-kas` (kas's observability listener, with the bearer token
//! its `/metrics` requires, in a file beside the configuration), `podgate-agentk`,
//! and `podgate-pod-sim` (the simulated Pods' own counters, `podsim_*`: what the
//! Pods saw, to compare with what the proxy says it sent).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

/// The proxy's rules (`proxy/dashboards/podgate-proxy.rules.yml`).
pub(crate) const PROXY_RULES: &str = include_str!("../../proxy/dashboards/podgate-proxy.rules.yml");
/// kas's and agentk's rules (`agent/dashboards/podgate-kas.rules.yml`).
pub(crate) const KAS_RULES: &str = include_str!("../../agent/dashboards/podgate-kas.rules.yml");

/// What Prometheus scrapes.
#[derive(Debug)]
pub(crate) struct Targets {
    pub(crate) proxy_admin: SocketAddr,
    /// kas's observability listener and its `/metrics` bearer token.
    pub(crate) kas: Option<(SocketAddr, String)>,
    /// The other Pods' kas instances' observability listeners (no token), in the
    /// same `podgate-kas` job: the Job Router's panels sum over every Cell's kas.
    pub(crate) cell_kas: Vec<SocketAddr>,
    pub(crate) agentk: Option<SocketAddr>,
    pub(crate) pods: Vec<SocketAddr>,
}

/// Write the configuration to `path`, the rule files (and kas's token, mode 0600)
/// into its directory. Prometheus resolves their names against the configuration's
/// directory.
pub(crate) fn write(path: &Path, targets: &Targets, every: Duration) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let put = |name: &str, text: &str| {
        let file = dir.join(name);
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
    };
    put("podgate-proxy.rules.yml", PROXY_RULES)?;
    put("podgate-kas.rules.yml", KAS_RULES)?;
    std::fs::write(path, config(targets, every))
        .with_context(|| format!("writing {}", path.display()))?;
    if let Some((_, token)) = &targets.kas {
        write_secret(&dir.join("podgate-kas-metrics-token"), token)?;
    }
    Ok(())
}

/// Write `text` to a file only its owner may read (0600).
pub(crate) fn write_secret(file: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(file)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", file.display()))
}

/// The configuration's text.
fn config(t: &Targets, every: Duration) -> String {
    let secs = every.as_secs().max(1);
    let job = |name: &str, addrs: &[SocketAddr], extra: &str| {
        let list: Vec<String> = addrs.iter().map(|a| format!("\"{a}\"")).collect();
        format!(
            "  - job_name: {name}\n{extra}    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        )
    };
    let mut out = format!(
        "# Written by `podgate up --prometheus-config`: every process it runs, with\n\
         # podgate's rules (the files beside this one).\n\
         global:\n  scrape_interval: {secs}s\n  evaluation_interval: {secs}s\n\
         rule_files:\n  - podgate-proxy.rules.yml\n  - podgate-kas.rules.yml\n\
         scrape_configs:\n"
    );
    out.push_str(&job("podgate-proxy", &[t.proxy_admin], ""));
    // A kas that wants no token ignores the one sent.
    let kas: Vec<SocketAddr> = t
        .kas
        .iter()
        .map(|(a, _)| *a)
        .chain(t.cell_kas.iter().copied())
        .collect();
    if !kas.is_empty() {
        out.push_str(&job(
            "podgate-kas",
            &kas,
            if t.kas.is_some() {
                "    authorization:\n      type: Bearer\n      credentials_file: podgate-kas-metrics-token\n"
            } else {
                ""
            },
        ));
    }
    if let Some(addr) = t.agentk {
        out.push_str(&job("podgate-agentk", &[addr], ""));
    }
    if !t.pods.is_empty() {
        out.push_str(&job("podgate-pod-sim", &t.pods, ""));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_process_is_a_job_and_kas_sends_its_token_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prometheus.yml");
        let targets = Targets {
            proxy_admin: "127.0.0.1:9191".parse().unwrap(),
            kas: Some(("127.0.0.1:4000".parse().unwrap(), "s3cret".into())),
            cell_kas: vec!["127.0.0.1:4002".parse().unwrap()],
            agentk: Some("127.0.0.1:4001".parse().unwrap()),
            pods: vec![
                "127.0.0.1:5001".parse().unwrap(),
                "127.0.0.1:5002".parse().unwrap(),
            ],
        };
        write(&path, &targets, Duration::from_secs(2)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(yaml["global"]["scrape_interval"].as_str(), Some("2s"));
        let jobs: Vec<(&str, Vec<&str>)> = yaml["scrape_configs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|j| {
                (
                    j["job_name"].as_str().unwrap(),
                    j["static_configs"][0]["targets"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_str().unwrap())
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            jobs,
            vec![
                ("podgate-proxy", vec!["127.0.0.1:9191"]),
                ("podgate-kas", vec!["127.0.0.1:4000", "127.0.0.1:4002"]),
                ("podgate-agentk", vec!["127.0.0.1:4001"]),
                ("podgate-pod-sim", vec!["127.0.0.1:5001", "127.0.0.1:5002"]),
            ]
        );
        // The token is not in the configuration, only in its 0600 file.
        assert!(!text.contains("s3cret"));
        let token = dir.path().join("podgate-kas-metrics-token");
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "s3cret");
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
            0o600
        );
        for rules in ["podgate-proxy.rules.yml", "podgate-kas.rules.yml"] {
            assert!(dir.path().join(rules).is_file(), "{rules}");
        }
    }
}
