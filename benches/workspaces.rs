//! Workspaces figures (issue 13): N workspaces on one agent, through the real
//! pieces — the Pod simulator as GitLab, kas (in this process), kube-sim with its
//! controllers (in this process), and one `podgate agentk` child process (so its
//! RSS and CPU are its own, read from `/proc`). A recording relay between kas and
//! GitLab sees every module request on the wire (bodies and header bytes, the
//! `update_type`, the infos each way, GitLab's time to answer).
//!
//! - **initial full**: N workspaces exist before agentk starts; its first full
//!   reconcile (agentk's `cycle_duration_seconds{type="full"}`: the request and
//!   every apply), its bytes, and the time until all N are `Running`;
//! - **steady full**: the first full after all are `Running` (every Deployment
//!   sent, every workspace answered);
//! - **idle partial**: partial cycles with nothing to report, time and bytes per
//!   cycle, agentk's CPU per partial interval (`utime + stime` from
//!   `/proc/<pid>/stat`: all of agentk's work in the interval, Lease renewals
//!   included), agentk's RSS (`VmRSS`, `VmHWM`) at that steady state;
//! - **stop → Stopped**: M workspaces stopped through GitLab one after another
//!   (every `stagger`, jittered); the time from GitLab's `desired_state_updated_at`
//!   to its `actual_state_updated_at` once `Stopped`, p50 / p95 / max.
//!
//! ```sh
//! cargo bench --bench workspaces                              # 1,000 workspaces, GitLab's 10 s partials
//! cargo bench --bench workspaces -- --workspaces 300 --partial 2 --stops 10 --json ws.json
//! PODGATE_WS_BENCH_WORKSPACES=2000 cargo bench --bench workspaces
//! ```
//!
//! Flags (or `PODGATE_WS_BENCH_<FLAG>` in upper case): `--workspaces`, `--stops`,
//! `--partial` and `--full` (seconds, GitLab's settings; 10 and 120 by default,
//! so the idle partials measured fit between two fulls), `--idle-cycles`,
//! `--stagger` (seconds between stops), `--json FILE`. Under `cargo test --benches`
//! it runs once small (20 workspaces, 1 s partials) as a smoke test. Figures are
//! printed, never asserted.
//!
//! The partial right after a full is not idle here: kube-sim gives an object a new
//! `resourceVersion` on a server-side apply that changes nothing (kube-apiserver
//! does not), so the full's re-applies make every Deployment look changed and the
//! next partial sends them all again. The idle window starts after that partial.

#![allow(missing_docs, unreachable_pub)]

#[path = "workspaces/agentk.rs"]
mod agentk;
#[path = "workspaces/relay.rs"]
mod relay;
#[path = "workspaces/report.rs"]
mod report;
mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podgate_kas::agent_config::AgentConfigSource;
use podgate_kas::{Kas, KasConfig};
use podgate_loadtest::pod_sim::workspaces::{
    ActualState, DesiredState, WorkspaceSpec, WorkspacesAgentConfig,
};
use podgate_loadtest::pod_sim::{AgentSpec, PodSim, PodSimConfig};
use podgate_testkit::fixtures::{AgentTokens, EXTERNAL_SECRET, kas_config, memory_registry};
use podgate_testkit::kube::KubeTestServer;
use serde_json::json;
use tokio::io::AsyncBufReadExt as _;

use agentk::{clock_ticks, cpu_secs, cycles, metrics};
use relay::{Exchange, Relay, start_relay};
use support::{Terminated, rss_kib};

const AGENT: i64 = 1;
const ZONE: &str = "workspaces.bench.localhost";

struct Opts {
    workspaces: usize,
    stops: usize,
    partial: u64,
    full: u64,
    idle_cycles: usize,
    stagger: f64,
    json: Option<String>,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let get = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == &format!("--{name}"))
            .and_then(|i| args.get(i + 1).cloned())
            .or_else(|| {
                let env = format!("PODGATE_WS_BENCH_{}", name.replace('-', "_").to_uppercase());
                std::env::var(env).ok()
            })
    };
    let num = |name: &str, big: f64, small: f64| -> f64 {
        get(name)
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("--{name} {v}: a number"))
            })
            .unwrap_or(if bench { big } else { small })
    };
    Opts {
        workspaces: num("workspaces", 1000.0, 20.0) as usize,
        stops: num("stops", 20.0, 3.0) as usize,
        partial: num("partial", 10.0, 1.0) as u64,
        full: num("full", 120.0, 10.0) as u64,
        idle_cycles: (num("idle-cycles", 5.0, 3.0) as usize).max(1),
        stagger: num("stagger", 1.0, 0.3),
        json: get("json"),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = opts();
    let n = o.workspaces;
    let wait = Duration::from_secs(600);
    let ticks = clock_ticks();
    let started = Instant::now();

    // kube-sim with its controllers (default delays: pods start in 300 ms, stop in 200 ms).
    let kube = KubeTestServer::start(500_000).await.expect("kube-sim");
    let _controllers = kube.sim().start_controllers();
    kube.put(
        "namespaces",
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gitlab-agent"}}),
    );

    // GitLab: the Pod simulator, N workspaces already asked for.
    let tokens = AgentTokens::new(1);
    let pod = podgate_tokens::PodId::new(1).unwrap();
    let mut c = PodSimConfig::new(pod, "127.0.0.1:0".parse().unwrap());
    c.kas_secret = Some(EXTERNAL_SECRET.to_vec());
    c.keys = tokens.keys();
    c.agents = vec![AgentSpec::with_user_access(AGENT, pod)];
    c.workspaces
        .settings
        .partial_reconciliation_interval_seconds = o.partial;
    c.workspaces.settings.full_reconciliation_interval_seconds = o.full;
    c.workspaces.agent_configs = vec![WorkspacesAgentConfig {
        agent_id: AGENT,
        enabled: true,
        dns_zone: ZONE.into(),
        ..WorkspacesAgentConfig::default()
    }];
    let sim = PodSim::start(c).await.expect("the Pod simulator");
    for i in 0..n {
        sim.create_workspace(AGENT, 1 + (i % 10) as u64, WorkspaceSpec::default())
            .expect("creating a workspace");
    }

    // kas, reaching GitLab through the relay; the agent's configuration enables Workspaces.
    let relay = Arc::new(Relay::default());
    let relay_addr = start_relay(sim.addr(), relay.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(format!("{AGENT}.yaml")),
        format!("remote_development:\n  enabled: true\n  dns_zone: {ZONE}\n"),
    )
    .unwrap();
    let kas = Kas::start(
        KasConfig {
            gitlab_url: Some(format!("http://{relay_addr}")),
            gitlab_external_url: None,
            agent_config: Some(AgentConfigSource {
                dir: dir.path().to_owned(),
                poll: Duration::from_secs(20),
            }),
            ..kas_config(tokens.keys(), Duration::from_secs(10))
        },
        memory_registry().await,
    )
    .await
    .expect("kas");

    // agentk, a process of its own.
    let token = dir.path().join("agent.token");
    std::fs::write(&token, tokens.mint(Some(AGENT as u64))).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kube.kubeconfig()).unwrap();
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .env("PODGATE_LOG", "error")
        .args(["agentk", "--kas", &format!("grpc://{}", kas.agent_addr())])
        .arg("--token-file")
        .arg(&token)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "--observability-listen",
            "127.0.0.1:0",
            "--pod-namespace",
            "gitlab-agent",
            "--pod-name",
            "agentk-bench",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting podgate agentk");
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let agentk = Terminated(child);
    let mut lines =
        tokio::io::BufReader::new(tokio::process::ChildStdout::from_std(stdout).unwrap()).lines();
    let obs: SocketAddr = loop {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("agentk prints its observability address");
        if let Some(a) = line.strip_prefix("agentk: observability on ") {
            break a.trim().parse().unwrap();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // The initial full.
    let first = relay
        .until("the first full reconcile", wait, |ex| {
            ex.iter().find(|e| e.update_type == "full").cloned()
        })
        .await;
    let to_first_request = first.at - t0;
    // agentk is another process: its cycle metric is read until the cycle shows.
    let full_done = async {
        loop {
            let m = metrics(obs).await;
            let (count, sum) = cycles(&m, "full");
            if count >= 1.0 {
                return sum;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let initial_full_secs = tokio::time::timeout(wait, full_done)
        .await
        .expect("the first full cycle ends");
    let running = || {
        sim.workspaces()
            .list()
            .iter()
            .filter(|w| w.actual_state == ActualState::Running)
            .count()
    };
    // GitLab computes states while it answers a reconcile: check after each one.
    relay
        .until(&format!("all {n} workspaces Running"), wait, |_| {
            (running() >= n).then_some(())
        })
        .await;
    let converged = t0.elapsed();
    let cpu_converged = cpu_secs(pid, ticks);
    let rss_converged = rss_kib(pid);
    let objects = kube.sim().objects().len();

    // The steady full: the first one asked after all are Running.
    let before = metrics(obs).await;
    let conv_at = Instant::now();
    let steady = relay
        .until("a full reconcile after convergence", wait, |ex| {
            ex.iter()
                .find(|e| e.update_type == "full" && e.at > conv_at)
                .cloned()
        })
        .await;
    let steady_full_secs = tokio::time::timeout(wait, async {
        loop {
            let m = metrics(obs).await;
            let (c1, s1) = cycles(&m, "full");
            let (c0, s0) = cycles(&before, "full");
            if c1 > c0 {
                return s1 - s0;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the steady full cycle ends");

    // Idle partials.
    let after_full = Instant::now();
    let idle = |e: &Exchange| e.update_type == "partial" && e.infos_sent == 0 && e.infos_back == 0;
    let start_at = relay
        .until("an idle partial", wait, |ex| {
            ex.iter()
                .find(|e| e.at > after_full && idle(e))
                .map(|e| e.at)
        })
        .await;
    let (cpu0, m0) = (cpu_secs(pid, ticks), metrics(obs).await);
    let window: Vec<Exchange> = relay
        .until("idle partials", wait, |ex| {
            // Partials up to the next full (a full re-applies every object: the
            // partial after it is not idle), at most `idle_cycles` of them.
            let next_full = ex
                .iter()
                .find(|e| e.at > start_at && e.update_type == "full");
            let w: Vec<Exchange> = ex
                .iter()
                .filter(|e| e.at > start_at && e.update_type == "partial")
                .filter(|e| next_full.is_none_or(|f| e.at < f.at))
                .take(o.idle_cycles)
                .cloned()
                .collect();
            (w.len() >= o.idle_cycles || (next_full.is_some() && !w.is_empty())).then_some(w)
        })
        .await;
    let (cpu1, m1) = (cpu_secs(pid, ticks), metrics(obs).await);
    let rss_idle = rss_kib(pid);
    let not_idle = window.iter().filter(|e| !idle(e)).count();
    let ((pc0, ps0), (pc1, ps1)) = (cycles(&m0, "partial"), cycles(&m1, "partial"));
    let partial_ms = if pc1 > pc0 {
        (ps1 - ps0) / (pc1 - pc0) * 1e3
    } else {
        0.0
    };
    let cpu_per_interval_ms = (cpu1 - cpu0) / window.len() as f64 * 1e3;
    let mean =
        |f: fn(&Exchange) -> usize| window.iter().map(f).sum::<usize>() / window.len().max(1);
    let idle_wire = Exchange {
        request_body: mean(|e| e.request_body),
        request_head: mean(|e| e.request_head),
        response_body: mean(|e| e.response_body),
        response_head: mean(|e| e.response_head),
        gitlab: window.iter().map(|e| e.gitlab).sum::<Duration>() / window.len().max(1) as u32,
        ..window[0].clone()
    };

    // Stop → Stopped.
    let ids: Vec<u64> = sim
        .workspaces()
        .list()
        .iter()
        .take(o.stops)
        .map(|w| w.id)
        .collect();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            let jitter = rand::random::<f64>() * o.stagger;
            tokio::time::sleep(Duration::from_secs_f64(o.stagger * 0.5 + jitter)).await;
        }
        sim.set_workspace_desired_state(*id, DesiredState::Stopped)
            .expect("stopping a workspace");
    }
    let stopped = |id: &u64| {
        sim.workspaces()
            .get(*id)
            .is_some_and(|w| w.actual_state == ActualState::Stopped)
    };
    relay
        .until("every stopped workspace reported Stopped", wait, |_| {
            ids.iter().all(stopped).then_some(())
        })
        .await;
    let mut latencies: Vec<f64> = ids
        .iter()
        .map(|id| {
            let w = sim.workspaces().get(*id).unwrap();
            (w.actual_state_updated_at
                .saturating_sub(w.desired_state_updated_at)) as f64
                / 1e6
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    drop(agentk);

    let figures = report::Figures {
        workspaces: n,
        partial_interval_s: o.partial,
        full_interval_s: o.full,
        kube_objects: objects,
        run_s: started.elapsed().as_secs_f64(),
        first_request_s: to_first_request.as_secs_f64(),
        initial_full_s: initial_full_secs,
        all_running_s: converged.as_secs_f64(),
        cpu_converged_s: cpu_converged,
        rss_converged_kib: rss_converged,
        initial_full: first,
        steady_full_s: steady_full_secs,
        steady_full: steady,
        partial_ms,
        cpu_per_interval_ms,
        idle_cycles: window.len(),
        not_idle,
        idle_partial: idle_wire,
        rss_idle_kib: rss_idle,
        stop_latencies_s: latencies,
    };
    figures.print();
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&figures.json()).unwrap())
            .unwrap_or_else(|e| panic!("--json {path}: {e}"));
    }
    drop(kas);
}
