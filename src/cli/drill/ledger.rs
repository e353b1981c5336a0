//! `drill ledger-check`: the Pods' job ledgers against the fleet's report.
//!
//! Per Pod (the fleet's registration tokens are given in the same order as the
//! `--pod`s, so the fleet's `jobs_by_pod[i]` are the jobs its runners of Pod `i` got):
//!
//! - no misroute: the Pod's `misrouted` counter is 0, and so is the fleet's;
//! - no job handed out twice, no job finished twice, no duplicate final update;
//! - every job the fleet finished (final update answered 200) is one the ledger
//!   holds as finished `success` on that Pod: the counts are equal, but for jobs
//!   whose final update the Pod applied as the fleet stopped (at most the fleet's
//!   `in_flight`);
//! - the fleet ran every job it got: none refused (`not_run`) or failed, except those
//!   it was running when it stopped (`in_flight`);
//! - picked on the Pod but never received by the fleet (answers cut when the fleet
//!   stopped) at most one per request slot of that Pod's runners.
//!
//! A Pod killed and restarted during the run (`--restarted`) has lost its first
//! ledger with its memory: its new ledger is checked alone, and the fleet's jobs
//! that failed with it are counted as lost with the killed Pod.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;

/// Flags of `drill ledger-check`.
#[derive(Debug, Args)]
pub(crate) struct LedgerCheckArgs {
    /// A Pod's address (`host:port`), in the order of the fleet's registration
    /// tokens; repeat for each.
    #[arg(long = "pod", required = true)]
    pods: Vec<SocketAddr>,
    /// The fleet's JSON report (`podgate loadtest runners --json`).
    #[arg(long)]
    fleet: PathBuf,
    /// The N-th `--pod` (from 1) was killed and restarted during the run.
    #[arg(long)]
    restarted: Option<usize>,
    /// Fail when any fleet request failed (a transport error or a 5xx).
    #[arg(long)]
    no_failed_requests: bool,
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

pub(crate) async fn check(args: LedgerCheckArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.fleet)
        .with_context(|| format!("reading {}", args.fleet.display()))?;
    let fleet: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", args.fleet.display()))?;
    let mut problems = Vec::new();
    let runners = num(&fleet["config"], "runners") as usize;
    let slots = num(&fleet["config"], "request_concurrency").max(1);
    let npods = args.pods.len();
    let by_pod = fleet["jobs_by_pod"].as_array().cloned().unwrap_or_default();
    if by_pod.len() != npods {
        problems.push(format!(
            "the fleet has {} registration tokens, {npods} --pod given",
            by_pod.len()
        ));
    }
    let (mut lost_with_pod, mut total_done) = (0, 0);
    for (i, addr) in args.pods.iter().enumerate() {
        let pod = i + 1;
        let (status, body) = crate::cli::http_client::get(*addr, "/-/podsim/ledger")
            .await
            .with_context(|| format!("GET http://{addr}/-/podsim/ledger: no answer"))?;
        anyhow::ensure!(
            status == 200,
            "GET http://{addr}/-/podsim/ledger: {status} {body}"
        );
        let ledger: Value = serde_json::from_str(&body).context("the ledger is not JSON")?;
        let s = &ledger["summary"];
        let f = by_pod.get(i).cloned().unwrap_or(Value::Null);
        let restarted = args.restarted == Some(pod);
        let pod_id = num(&ledger, "pod_id");
        let misrouted = num(&ledger, "misrouted");
        let (picked, success) = (num(s, "picked"), num(s, "success"));
        let (received, done) = (num(&f, "received"), num(&f, "done"));
        let (failed, not_run, in_flight) =
            (num(&f, "failed"), num(&f, "not_run"), num(&f, "in_flight"));
        let cut = picked as i64 - received as i64;
        total_done += done;
        println!(
            "ledger pod={pod_id}{}: created={} picked={picked} finished_once={} success={success} failed={} unfinished={} picked_twice={} duplicates={} misrouted={misrouted} | fleet: received={received} done={done} in_flight={in_flight} not_run={not_run} failed={failed} answers_cut={cut}",
            if restarted { " (restarted)" } else { "" },
            num(&ledger, "jobs_created"),
            num(s, "finished_once"),
            num(s, "failed"),
            num(s, "unfinished"),
            num(s, "picked_twice"),
            num(s, "duplicates"),
        );
        let mut bad = |m: String| problems.push(format!("pod {pod_id}: {m}"));
        if misrouted > 0 {
            bad(format!("{misrouted} requests for another Pod's tokens"));
        }
        if num(s, "picked_twice") > 0 {
            bad(format!("{} jobs handed out twice", num(s, "picked_twice")));
        }
        if num(s, "duplicates") > 0 {
            bad(format!("{} duplicate final updates", num(s, "duplicates")));
        }
        if num(s, "finished") != num(s, "finished_once") {
            bad(format!(
                "{} jobs finished, {} of them exactly once",
                num(s, "finished"),
                num(s, "finished_once")
            ));
        }
        if num(s, "failed") > 0 {
            bad(format!(
                "{} jobs finished failed (the fleet sends success)",
                num(s, "failed")
            ));
        }
        if restarted {
            // The jobs the fleet had on the killed Pod could not finish there.
            lost_with_pod += failed + not_run;
            if success > done {
                bad(format!(
                    "the ledger has {success} finished jobs, the fleet finished {done}"
                ));
            }
            continue;
        }
        // A final update the Pod applied while the fleet's stop cut its answer: on
        // the ledger, in flight for the fleet.
        if success < done || success > done + in_flight {
            bad(format!(
                "the ledger has {success} finished jobs, the fleet finished {done} (and was running {in_flight} when it stopped)"
            ));
        }
        if failed + not_run > 0 {
            bad(format!(
                "the fleet could not run {not_run} and finish {failed} of its jobs"
            ));
        }
        let pod_runners = (0..runners).filter(|n| n % npods.max(1) == i).count() as i64;
        if cut < 0 || cut > pod_runners * slots as i64 {
            bad(format!(
                "{picked} jobs picked, {received} received by the fleet (at most {} answers can be cut at its stop)",
                pod_runners * slots as i64
            ));
        }
    }
    let misroutes = num(&fleet, "misroutes");
    if misroutes > 0 {
        problems.push(format!("the fleet saw {misroutes} misroutes"));
    }
    let (mut requests, mut failed_requests) = (0, 0);
    let mut failures = Vec::new();
    for e in fleet["endpoints"].as_array().into_iter().flatten() {
        requests += num(e, "requests");
        for (status, n) in e["statuses"].as_object().into_iter().flatten() {
            let code: u16 = status.parse().unwrap_or(0);
            if code == 0 || code >= 500 {
                let n = n.as_u64().unwrap_or(0);
                failed_requests += n;
                failures.push(format!(
                    "{}:{status}={n}",
                    e["endpoint"].as_str().unwrap_or("?")
                ));
            }
        }
        for (error, n) in e["transport_errors"].as_object().into_iter().flatten() {
            failures.push(format!(
                "{}: {n} x \"{error}\"",
                e["endpoint"].as_str().unwrap_or("?")
            ));
        }
    }
    println!(
        "fleet: requests={requests} failed_requests={failed_requests}{} jobs_done={total_done} misroutes={misroutes} lost_with_killed_pod={lost_with_pod}",
        if failures.is_empty() {
            String::new()
        } else {
            format!(" ({})", failures.join(" "))
        }
    );
    if args.no_failed_requests && failed_requests > 0 {
        problems.push(format!("{failed_requests} fleet requests failed"));
    }
    if total_done == 0 {
        problems.push("the fleet finished no job: nothing was checked".into());
    }
    if problems.is_empty() {
        println!("ledger check: ok");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("ledger check: FAILED: {}", problems.join("; "));
        Ok(ExitCode::from(1))
    }
}
