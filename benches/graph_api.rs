//! The Graph API's figures (issue 12), through the real `podgate kas` (its
//! `[k8s_proxy]` `/graph` WebSocket) and `podgate agentk` processes over a kube-sim
//! of N generated objects, with the WebSocket client and stack of
//! `tests/graph_api` (shared by `#[path]`, so the bench measures what the tests
//! check):
//!
//! - time from the request to the complete initial graph (every vertex and arc the
//!   independent model expects), and to the first message;
//! - bytes and messages of the initial graph, and the largest message;
//! - agentk's RSS (`VmRSS`, `VmHWM` from `/proc`) once the graph is complete;
//! - object change → action at the client while kube-sim churns: a ConfigMap is
//!   created (a probe) and the time until its `svx` arrives is recorded, probe after
//!   probe; p50 / p99 / max.
//!
//! ```sh
//! cargo bench --bench graph_api                       # 5,000 and 50,000 objects
//! cargo bench --bench graph_api -- --objects 5000 --probes 300 --churn 50
//! ```
//!
//! Under `cargo test --benches` it runs once with 500 objects and 20 probes, as a
//! smoke test. Figures are printed (and written as JSON with `--json FILE`), never
//! asserted.

#![allow(unreachable_pub, dead_code, missing_docs, unused_imports)]

#[path = "../tests/graph_api/client.rs"]
mod client;
#[path = "../tests/graph_api/expr.rs"]
mod expr;
#[path = "../tests/graph_api/harness.rs"]
mod harness;
#[path = "../tests/graph_api/model.rs"]
mod model;
#[path = "../tests/graph_api/select.rs"]
mod select;
mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use client::GraphClient;

const WAIT: Duration = Duration::from_secs(300);

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// What a dashboard asks for: every resource but events (glab's default and more:
/// apps, batch, core, networking, Flux, the CRD group).
fn request() -> Value {
    json!({"queries": [
        {"exclude": {"resource_selector_expression": "resource == 'events'"}},
        {"include": {"resource_selector_expression": "true"}}
    ]})
}

/// `VmRSS` and `VmHWM` (KiB) of the process whose command line has all of `words`.
fn rss_of(words: &[&str]) -> Option<(u64, u64)> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if words.iter().all(|w| cmd.contains(w)) {
            return Some(support::rss_kib(e.file_name().to_str()?.parse().ok()?));
        }
    }
    None
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn run(objects: usize, probes: usize, churn: f64) -> Value {
    let started = Instant::now();
    let stack = harness::start_stack(&[], Some((objects, 12)), &[]).await;
    let stack_secs = started.elapsed().as_secs_f64();
    let request = request();
    let (discovery, objs) = stack.cluster().await;
    let want = model::expected_graph(&discovery, &objs, &request);
    let (want_v, want_a) = (want.vertices.len(), want.arcs.len());

    let t0 = Instant::now();
    let c = GraphClient::connect(&stack.graph_url, &stack.bearer, &request)
        .await
        .unwrap_or_else(|e| panic!("connecting: {e:?}"));
    let first = c
        .wait_until("the first message", WAIT, |s| {
            (s.messages > 0).then(|| t0.elapsed())
        })
        .await;
    let complete = c
        .wait_until("the complete initial graph", WAIT, |s| {
            (s.vertices.len() >= want_v && s.arcs.len() >= want_a).then(|| t0.elapsed())
        })
        .await;
    let (messages, bytes, largest) = c.with(|s| (s.messages, s.bytes, s.largest));
    if let Some(d) = c.with(|s| model::diff(&want, &s.vertices, &s.arcs)) {
        eprintln!("graph_api bench: the initial graph differs from the model: {d:.400}");
    }
    let rss = rss_of(&["agentk", "agentk-graph"]);

    // Change → action, under churn.
    let churning = stack.kube.sim().start_churn(churn, 5);
    let mut latencies = Vec::with_capacity(probes);
    for i in 0..probes {
        let name = format!("probe-{i}");
        let t = Instant::now();
        stack.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {"i": i.to_string()}}));
        let seen = c
            .wait_until("a probe's svx", WAIT, |s| {
                s.find("configmaps", "default", &name).map(|_| t.elapsed())
            })
            .await;
        latencies.push(seen);
    }
    let churn_stats = format!("{:?}", churning.stats());
    drop(churning);
    latencies.sort();
    let (p50, p99, max) = (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
    );
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    println!(
        "graph_api objects={objects} vertices={want_v} arcs={want_a}: initial graph {} ms \
         (first message {} ms), {messages} messages, {bytes} bytes ({} bytes/vertex), largest {largest}; \
         agentk RSS {} MiB (peak {} MiB); change→action under churn {churn}/s over {probes} probes: \
         p50 {} ms, p99 {} ms, max {} ms; stack started in {stack_secs:.1} s",
        ms(complete),
        ms(first),
        bytes / want_v.max(1) as u64,
        rss.map_or(0, |r| r.0 / 1024),
        rss.map_or(0, |r| r.1 / 1024),
        ms(p50),
        ms(p99),
        ms(max),
    );
    json!({
        "objects": objects, "vertices": want_v, "arcs": want_a,
        "initial_graph_ms": ms(complete), "first_message_ms": ms(first),
        "messages": messages, "bytes": bytes, "largest_message": largest,
        "agentk_rss_kib": rss.map(|r| r.0), "agentk_peak_rss_kib": rss.map(|r| r.1),
        "churn_per_s": churn, "probes": probes,
        "change_to_action_ms": {"p50": ms(p50), "p99": ms(p99), "max": ms(max)},
        "churn": churn_stats,
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let sizes: Vec<usize> = match arg::<usize>(&args, "--objects") {
        Some(n) => vec![n],
        None if bench => vec![5_000, 50_000],
        None => vec![500],
    };
    let probes = arg(&args, "--probes").unwrap_or(if bench { 200 } else { 20 });
    let churn = arg(&args, "--churn").unwrap_or(20.0);
    let mut results = Vec::new();
    for n in sizes {
        results.push(run(n, probes, churn).await);
    }
    if let Some(path) = arg::<String>(&args, "--json") {
        std::fs::write(&path, serde_json::to_string_pretty(&results).unwrap())
            .unwrap_or_else(|e| panic!("--json {path}: {e}"));
    }
}
