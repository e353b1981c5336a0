//! `drill claim`, `drill path-probe` and `drill path-probe-stats`: requests that
//! carry no token, which the proxy's path rules place by the Topology Service's
//! claims, while a drill stops that service.
//!
//! `claim` makes a Pod's claims as its Rails does (`BeginUpdate`, `CommitUpdate`).
//! The probe asks, round after round, for each Pod's group page
//! (`/team-<pod>/project/-/issues/<n>`) and organization page (`/o/org-<pod>/…`),
//! which must reach that Pod, and for one namespace no request named before
//! (`/fresh-<n>/project`): no cache holds it, so the proxy asks the service each
//! time, and without the service it must fall through to the default Pod within its
//! deadline. Each request is logged as `unix_ms kind want got status micros`
//! (`kind` `route`, `org` or `fresh`; `want` the Pod it must reach, 0 for any;
//! `got` the Pod whose page answered, 0 when the answer names none; status 0: no
//! answer within 5 s).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use podgate_loadtest::pod_sim::{namespace, organization};
use podgate_tokens::PodId;
use serde_json::{Value, json};

use super::unix_ms;

/// Flags of `drill claim`.
#[derive(Debug, Args)]
pub(crate) struct ClaimArgs {
    /// The Topology Service (gRPC), `host:port`.
    #[arg(long)]
    topology_service: SocketAddr,
    /// The Pod (its Cell) claiming.
    #[arg(long)]
    pod: PodId,
    /// Top-level namespaces to claim; default: the Pod's group `team-<pod>` and
    /// its organization `org-<pod>`.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
}

pub(crate) async fn claim(args: ClaimArgs) -> anyhow::Result<ExitCode> {
    let mut client = crate::cli::up_topology::client(args.topology_service).await?;
    let pod = args.pod;
    if args.namespaces.is_empty() {
        crate::cli::up_topology::claim(
            &mut client,
            pod,
            &[(namespace(pod), pod.get())],
            Some(organization(pod)),
        )
        .await?;
        println!(
            "claimed {} and {} for Pod {pod}",
            namespace(pod),
            organization(pod)
        );
    } else {
        // A `routes` row of its own per namespace (ids past the Pod's group's).
        let routes: Vec<(String, u64)> = (1u64..)
            .zip(&args.namespaces)
            .map(|(i, n)| (n.clone(), pod.get() * 1_000_000 + i))
            .collect();
        crate::cli::up_topology::claim(&mut client, pod, &routes, None).await?;
        println!("claimed {} for Pod {pod}", args.namespaces.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `drill path-probe`.
#[derive(Debug, Args)]
pub(crate) struct PathProbeArgs {
    /// The proxy, `host:port`.
    #[arg(long)]
    target: SocketAddr,
    /// How many Pods (1..=N) own pages.
    #[arg(long)]
    pods: u64,
    /// Pause between rounds.
    #[arg(long, default_value = "20ms", value_parser = super::parse_millis)]
    interval: Duration,
    /// Where to write the log.
    #[arg(long)]
    out: PathBuf,
}

/// One GET: the status (0: no answer within 5 s), the Pod whose page answered
/// (0: none named), and how long it took.
async fn get(target: SocketAddr, path: &str) -> (u16, u64, Duration) {
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        crate::cli::http_client::get(target, path),
    )
    .await;
    let (status, got) = match answer {
        Ok(Some((status, body))) => {
            let got = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["pod"].as_u64())
                .unwrap_or(0);
            (status, got)
        }
        _ => (0, 0),
    };
    (status, got, started.elapsed())
}

pub(crate) async fn probe(args: PathProbeArgs) -> anyhow::Result<ExitCode> {
    let mut log = std::io::BufWriter::new(
        std::fs::File::create(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?,
    );
    let pods: Vec<PodId> = (1..=args.pods).filter_map(PodId::new).collect();
    anyhow::ensure!(!pods.is_empty(), "--pods: at least 1");
    println!("path-probe: {} Pods; probing", pods.len());
    let stop = super::super::shutdown_signal();
    tokio::pin!(stop);
    for n in 0u64.. {
        let mut asks: Vec<(&str, u64, String)> = pods
            .iter()
            .flat_map(|&pod| {
                [
                    (
                        "route",
                        pod.get(),
                        format!("/{}/project/-/issues/{n}", namespace(pod)),
                    ),
                    (
                        "org",
                        pod.get(),
                        format!("/o/{}/groups/{}", organization(pod), namespace(pod)),
                    ),
                ]
            })
            .collect();
        asks.push((
            "fresh",
            0,
            format!("/fresh-{}-{n}/project", std::process::id()),
        ));
        for (kind, want, path) in asks {
            let (status, got, took) = tokio::select! {
                r = get(args.target, &path) => r,
                _ = &mut stop => {
                    log.flush()?;
                    return Ok(ExitCode::SUCCESS);
                }
            };
            writeln!(
                log,
                "{} {kind} {want} {got} {status} {}",
                unix_ms(),
                took.as_micros()
            )?;
        }
        log.flush()?;
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(args.interval) => {}
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Flags of `drill path-probe-stats`.
#[derive(Debug, Args)]
pub(crate) struct PathProbeStatsArgs {
    /// The probe's log.
    #[arg(long)]
    probe_log: PathBuf,
    #[command(flatten)]
    window: super::Window,
}

/// One logged request.
struct Line {
    t: u128,
    kind: String,
    want: u64,
    got: u64,
    status: u16,
    micros: u64,
}

fn parse(text: &str) -> Vec<Line> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Line {
                t: f.first()?.parse().ok()?,
                kind: (*f.get(1)?).to_owned(),
                want: f.get(2)?.parse().ok()?,
                got: f.get(3)?.parse().ok()?,
                status: f.get(4)?.parse().ok()?,
                micros: f.get(5)?.parse().ok()?,
            })
        })
        .collect()
}

/// Per kind in `[from, to]`: requests, failed (status 0 or 5xx), wrong (a page
/// answered by a Pod other than the one it must reach), and latency in ms.
fn figures(lines: &[Line], window: super::Window) -> Value {
    let mut out = serde_json::Map::new();
    for kind in ["route", "org", "fresh"] {
        let window: Vec<&Line> = lines
            .iter()
            .filter(|l| l.kind == kind && window.holds(l.t))
            .collect();
        let mut micros: Vec<u64> = window.iter().map(|l| l.micros).collect();
        micros.sort_unstable();
        let at = |q: f64| {
            micros
                .get(((micros.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .map(|&m| m as f64 / 1000.0)
        };
        out.insert(
            kind.to_owned(),
            json!({
                "requests": window.len(),
                "failed": window.iter().filter(|l| l.status == 0 || l.status >= 500).count(),
                "wrong": window.iter().filter(|l| l.want != 0 && l.got != l.want).count(),
                "p50_ms": at(0.5),
                "p99_ms": at(0.99),
                "max_ms": micros.last().map(|&m| m as f64 / 1000.0),
            }),
        );
    }
    Value::Object(out)
}

pub(crate) fn stats(args: &PathProbeStatsArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.probe_log)
        .with_context(|| format!("reading {}", args.probe_log.display()))?;
    println!("{}", figures(&parse(&text), args.window));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_per_kind_of_a_window() {
        let log = "1000 route 1 1 200 900\n\
                   1000 route 2 1 404 1100\n\
                   2000 org 2 2 200 800\n\
                   2000 fresh 0 0 404 150000\n\
                   2100 fresh 0 0 0 5000000\n\
                   2200 fresh 0 0 502 2000\n\
                   3000 route 1 1 200 700\n";
        let lines = parse(log);
        let w = |from, to| super::super::Window { from, to };
        let all = figures(&lines, w(0, None));
        assert_eq!(all["route"]["requests"], 3);
        assert_eq!(all["route"]["wrong"], 1);
        assert_eq!(all["route"]["failed"], 0);
        assert_eq!(all["fresh"]["failed"], 2);
        assert_eq!(all["fresh"]["wrong"], 0);
        assert_eq!(all["fresh"]["max_ms"], 5000.0);
        assert_eq!(all["fresh"]["p50_ms"], 150.0);
        let late = figures(&lines, w(1500, Some(2500)));
        assert_eq!(late["route"]["requests"], 0);
        assert_eq!(late["route"]["p50_ms"], Value::Null);
        assert_eq!(late["org"]["requests"], 1);
        assert_eq!(late["fresh"]["requests"], 3);
    }
}
