//! `drill probe` and `drill probe-stats`: what a runner of each Pod sees, request by
//! request, while a drill breaks something.
//!
//! The probe registers one runner per Pod through the proxy, then sends `POST
//! /api/v4/runners/verify` for each in turn, one at a time, each on a new
//! connection (so a listener handed over, or a Pod gone, shows at once), and logs
//! `unix_ms pod status retry_after` per request (status 0: no answer within 5 s;
//! `retry_after` `-` when absent). A Pod that forgot the runner (restarted) answers
//! 403: it was reached, which is what is measured. `probe-stats` gives the figures of
//! a time window: requests, failures (status 0 or 5xx), when the first 503 with
//! `Retry-After` came, and the first success after the window opened.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde_json::{Value, json};

use super::unix_ms;
use crate::cli::http_client::{self, Method};

/// Flags of `drill probe`.
#[derive(Debug, Args)]
pub(crate) struct ProbeArgs {
    /// The proxy, `host:port`.
    #[arg(long)]
    target: SocketAddr,
    /// A Pod's registration token; repeat for each Pod (they are numbered from 1 in
    /// this order in the log).
    #[arg(long = "registration-token", required = true)]
    registration_tokens: Vec<String>,
    /// Pause between rounds (one request per Pod each).
    #[arg(long, default_value = "20ms", value_parser = super::parse_millis)]
    interval: std::time::Duration,
    /// Where to write the log.
    #[arg(long)]
    out: PathBuf,
}

/// One request on a new connection: the status (0: no answer within 5 s),
/// `Retry-After` and the body.
async fn post(target: SocketAddr, path: &str, body: &str) -> (u16, Option<String>, String) {
    let request = http_client::request(
        Method::POST,
        "gitlab.example.com",
        path,
        Some(body.to_owned()),
    );
    match tokio::time::timeout(Duration::from_secs(5), http_client::send(target, request)).await {
        Ok(Ok(r)) => {
            let retry_after = r
                .headers
                .get(http::header::RETRY_AFTER)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            (r.status.as_u16(), retry_after, r.text())
        }
        _ => (0, None, String::new()),
    }
}

pub(crate) async fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let mut tokens = Vec::new();
    for (i, reg) in args.registration_tokens.iter().enumerate() {
        let body = json!({"token": reg, "description": "drill-probe"}).to_string();
        let mut last = (0, None, String::new());
        for _ in 0..300 {
            last = post(args.target, "/api/v4/runners", &body).await;
            if last.0 == 201 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let token = serde_json::from_str::<Value>(&last.2)
            .ok()
            .and_then(|v| v["token"].as_str().map(str::to_owned))
            .with_context(|| {
                format!(
                    "registering the probe's runner of Pod {}: {} {}",
                    i + 1,
                    last.0,
                    last.2
                )
            })?;
        tokens.push(json!({ "token": token }).to_string());
    }
    let mut log = std::io::BufWriter::new(
        std::fs::File::create(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?,
    );
    println!("probe: {} runners registered; probing", tokens.len());
    let stop = super::super::shutdown_signal();
    tokio::pin!(stop);
    loop {
        for (i, body) in tokens.iter().enumerate() {
            let (status, retry_after, _) = tokio::select! {
                r = post(args.target, "/api/v4/runners/verify", body) => r,
                _ = &mut stop => {
                    log.flush()?;
                    return Ok(ExitCode::SUCCESS);
                }
            };
            writeln!(
                log,
                "{} {} {status} {}",
                unix_ms(),
                i + 1,
                retry_after.as_deref().unwrap_or("-")
            )?;
        }
        log.flush()?;
        tokio::select! {
            _ = &mut stop => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(args.interval) => {}
        }
    }
}

/// Flags of `drill probe-stats`.
#[derive(Debug, Args)]
pub(crate) struct ProbeStatsArgs {
    /// The probe's log.
    #[arg(long)]
    probe_log: PathBuf,
    /// Only this Pod (from 1, as numbered in the log).
    #[arg(long)]
    pod: Option<u32>,
    #[command(flatten)]
    window: super::Window,
}

/// One logged request.
struct Line {
    t: u128,
    pod: u32,
    status: u16,
    retry_after: bool,
}

fn parse(text: &str) -> Vec<Line> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Line {
                t: f.first()?.parse().ok()?,
                pod: f.get(1)?.parse().ok()?,
                status: f.get(2)?.parse().ok()?,
                retry_after: f.get(3).is_some_and(|v| *v != "-"),
            })
        })
        .collect()
}

/// Figures of `lines` in `[from, to]` (times relative to `from`).
fn figures(lines: &[Line], pod: Option<u32>, within: super::Window) -> Value {
    let from = within.from;
    let window: Vec<&Line> = lines
        .iter()
        .filter(|l| pod.is_none_or(|p| l.pod == p) && within.holds(l.t))
        .collect();
    let failed = |l: &&&Line| l.status == 0 || l.status >= 500;
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for l in &window {
        *statuses.entry(l.status.to_string()).or_default() += 1;
    }
    let rel = |l: Option<&&Line>| l.map(|l| (l.t - from) as u64);
    json!({
        "requests": window.len(),
        "ok": window.iter().filter(|l| !failed(l)).count(),
        "failed": window.iter().filter(failed).count(),
        "statuses": statuses,
        "first_failure_ms": rel(window.iter().find(failed)),
        "last_failure_ms": rel(window.iter().rfind(failed)),
        "first_503_retry_after_ms": rel(window.iter().find(|l| l.status == 503 && l.retry_after)),
        "first_ok_ms": rel(window.iter().find(|l| !failed(l))),
        "unanswered_503_without_retry_after": window.iter().filter(|l| l.status == 503 && !l.retry_after).count(),
    })
}

pub(crate) fn stats(args: &ProbeStatsArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.probe_log)
        .with_context(|| format!("reading {}", args.probe_log.display()))?;
    println!("{}", figures(&parse(&text), args.pod, args.window));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_of_a_window() {
        let log = "1000 1 200 -\n1000 2 200 -\n2000 2 0 -\n2100 2 503 1\n2200 2 503 1\n3000 2 403 -\n3100 1 200 -\n";
        let lines = parse(log);
        let w = |from, to| super::super::Window { from, to };
        let f = figures(&lines, Some(2), w(1500, None));
        assert_eq!(f["requests"], 4);
        assert_eq!(f["failed"], 3);
        assert_eq!(f["ok"], 1);
        assert_eq!(f["first_failure_ms"], 500);
        assert_eq!(f["first_503_retry_after_ms"], 600);
        assert_eq!(f["first_ok_ms"], 1500);
        assert_eq!(f["last_failure_ms"], 700);
        let all = figures(&lines, None, w(0, Some(1000)));
        assert_eq!(all["requests"], 2);
        assert_eq!(all["failed"], 0);
    }
}
