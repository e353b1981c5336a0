//! podgate's Prometheus rules and Grafana dashboards against a real Prometheus
//! (Debian's `prometheus` and `promtool`, installed by `scripts/test.sh`):
//!
//! - `promtool check rules` and `promtool test rules` on the rule files beside the
//!   dashboards (each alert fires on its cause, when its `for` allows, and a healthy
//!   fleet raises none);
//! - `podgate up --prometheus-config` writes a configuration `promtool check config`
//!   accepts; a real Prometheus scrapes every process with it, loads the rules, and
//!   **every query of every dashboard panel** returns data, except the few listed in
//!   [`EMPTY_WHEN_IDLE`] with the reason.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Running, request};
use podgate_registry::testing::{eventually, free_port};
use serde_json::Value;

/// Queries (dashboard file, panel id, refId) allowed to return nothing while
/// `podgate up` runs undisturbed, and why: each counts something that does not
/// happen there.
const EMPTY_WHEN_IDLE: &[(&str, u64, &str, &str)] = &[
    (
        "podgate-proxy.json",
        20,
        "A",
        "health check failures: every simulated Pod answers its checks",
    ),
    (
        "podgate-proxy.json",
        21,
        "A",
        "upstream connect failures: every simulated Pod accepts",
    ),
    (
        "podgate-kas.json",
        18,
        "A",
        "kas's registry errors: its in-memory registry does not fail",
    ),
    (
        "podgate-kas.json",
        18,
        "B",
        "registry backend errors: likewise",
    ),
    (
        "podgate-kas.json",
        25,
        "A",
        "agent_info lookups are for opaque (legacy) agent tokens; agentk here has a JWT",
    ),
    (
        "podgate-kas.json",
        37,
        "A",
        "refused credentials: nobody offers bad ones",
    ),
    (
        "podgate-proxy.json",
        25,
        "A",
        "binary upgrades: none during the test",
    ),
    (
        "podgate-proxy.json",
        30,
        "A",
        "requests queued at upstreams.max_connections_per_address (1024): none at this load",
    ),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tool(name: &str) -> PathBuf {
    let path = PathBuf::from("/usr/bin").join(name);
    assert!(
        path.is_file(),
        "{name} is not installed: scripts/test.sh installs Debian's prometheus package"
    );
    path
}

/// `promtool ARGS` in `dir`, which must succeed.
fn promtool(args: &[String], dir: &Path) {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_and_unit_tests_the_rules() {
    for (dir, name) in [
        ("proxy/dashboards", "podgate-proxy"),
        ("agent/dashboards", "podgate-kas"),
    ] {
        let dir = repo().join(dir);
        for args in [
            vec![
                "check".to_owned(),
                "rules".to_owned(),
                format!("{name}.rules.yml"),
            ],
            vec![
                "test".to_owned(),
                "rules".to_owned(),
                format!("{name}.rules.test.yml"),
            ],
        ] {
            promtool(&args, &dir);
        }
    }
}

/// `s` for a URL's query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET a Prometheus API path: its JSON `data` (panics on an error answer).
async fn api(port: u16, path_and_query: &str) -> Value {
    let reply = request(port, &format!("GET {path_and_query} HTTP/1.1"), b"").await;
    let body: Value = serde_json::from_slice(&reply.body)
        .unwrap_or_else(|e| panic!("{path_and_query}: {e}: {:?}", reply.body));
    assert_eq!(body["status"], "success", "{path_and_query}: {body}");
    body["data"].clone()
}

/// One request (`head` without its final CRLF; `connection: close` added) on a
/// new connection: the whole reply.
async fn raw(port: u16, head: &str) -> common::Reply {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("{head}\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    common::parse_reply(&out)
}

/// An instant query's result vector.
async fn query(port: u16, promql: &str) -> Vec<Value> {
    let data = api(port, &format!("/api/v1/query?query={}", encode(promql))).await;
    data["result"].as_array().cloned().unwrap_or_default()
}

/// Every panel query of a dashboard: (panel id, refId, expr with Grafana's
/// variables set to "all" and `$__rate_interval` to what Grafana derives from a 1 s
/// scrape, rounded up).
fn panel_queries(dashboard: &Value) -> Vec<(u64, String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(u64, String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            walk(&p["panels"], out);
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap();
                let expr = ["$job", "$rule", "$pod", "$instance", "$agentk_job"]
                    .iter()
                    .fold(expr.to_owned(), |e, v| e.replace(v, ".*"))
                    .replace("$__rate_interval", "10s");
                out.push((
                    p["id"].as_u64().unwrap(),
                    t["refId"].as_str().unwrap().to_owned(),
                    expr,
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scraping_podgate_up_fills_every_panel() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    let listen = free_port();
    // `podgate up: ready` comes after the configuration is written.
    let args: Vec<String> = [
        "--runners".to_owned(),
        "12".into(),
        "--job-rate".into(),
        "2".into(),
        "--kube-objects".into(),
        "300".into(),
        "--listen".into(),
        format!("127.0.0.1:{listen}"),
        "--admin".into(),
        format!("127.0.0.1:{}", free_port()),
        "--tls-listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--prometheus-config".into(),
        config.display().to_string(),
        "--prometheus-interval".into(),
        "1s".into(),
    ]
    .into();
    let (up, printed) = common::podgate_up(&args, Duration::from_secs(180));
    assert!(printed.contains("  prometheus config="), "{printed}");
    // What a user does besides the fleet's traffic: a `kubectl get namespaces`
    // through the proxy and kas's Kubernetes API proxy (its credential checks with
    // GitLab), and a visit to the workspace's URL (kas's Workspaces server).
    let bearer = printed
        .split_whitespace()
        .find_map(|w| w.strip_prefix("bearer="))
        .unwrap_or_else(|| panic!("no bearer: {printed}"));
    let reply = raw(
        listen,
        &format!(
            "GET /-/kubernetes-agent/k8s-proxy/api/v1/namespaces HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {bearer}"
        ),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&reply.body)
    );
    let workspace = printed
        .lines()
        .find(|l| l.trim_start().starts_with("workspace id="))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("url=")))
        .and_then(|u| u.split("://").nth(1))
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no workspace url: {printed}"))
        .to_owned();
    let reply = raw(listen, &format!("GET / HTTP/1.1\r\nhost: {workspace}")).await;
    assert!(reply.status >= 200, "{}", reply.status);
    promtool(
        &[
            "check".into(),
            "config".into(),
            config.display().to_string(),
        ],
        dir.path(),
    );

    let port = free_port();
    let _prometheus = Running(
        Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Every job's target is scraped and up.
    let want: BTreeSet<&str> = [
        "podgate-proxy",
        "podgate-kas",
        "podgate-agentk",
        "podgate-pod-sim",
    ]
    .into();
    eventually(Duration::from_secs(60), "every target up", || async {
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
        )
        .await;
        if !matches!(reply, Ok(Ok(_))) {
            return None;
        }
        // Its API answers 503 until the storage is open.
        if request(port, "GET /-/ready HTTP/1.1", b"").await.status != 200 {
            return None;
        }
        let data = api(port, "/api/v1/targets").await;
        let targets = data["activeTargets"].as_array()?.clone();
        let up: BTreeSet<String> = targets
            .iter()
            .filter(|t| t["health"] == "up")
            .map(|t| t["labels"]["job"].as_str().unwrap_or_default().to_owned())
            .collect();
        let all_up = targets.iter().all(|t| t["health"] == "up");
        (all_up && want.iter().all(|j| up.contains(*j))).then_some(())
    })
    .await;

    // The rules loaded, and evaluate without error.
    let rules = api(port, "/api/v1/rules").await;
    let groups: BTreeSet<&str> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        groups,
        [
            "podgate-kas.alerts",
            "podgate-kas.recording",
            "podgate-proxy.alerts",
            "podgate-proxy.recording",
        ]
        .into()
    );

    // Every panel's every query returns data once a few scrapes are in, but for
    // the documented ones.
    let dashboards = [
        ("podgate-proxy.json", "proxy/dashboards/podgate-proxy.json"),
        ("podgate-kas.json", "agent/dashboards/podgate-kas.json"),
    ];
    let mut queries = Vec::new();
    for (name, path) in dashboards {
        let d: Value =
            serde_json::from_str(&std::fs::read_to_string(repo().join(path)).unwrap()).unwrap();
        for (id, ref_id, expr) in panel_queries(&d) {
            queries.push((name, id, ref_id, expr));
        }
    }
    assert!(queries.len() > 70, "{} queries", queries.len());
    let idle = |name: &str, id: u64, ref_id: &str| {
        EMPTY_WHEN_IDLE
            .iter()
            .any(|(n, i, r, _)| *n == name && *i == id && *r == ref_id)
    };
    // Polled like `eventually`, keeping the list of empty queries for the message.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut scrape = tokio::time::interval(Duration::from_millis(500));
    loop {
        // Each round after Prometheus's next scrapes (1 s apart).
        scrape.tick().await;
        let mut empty = Vec::new();
        for (name, id, ref_id, expr) in &queries {
            if !idle(name, *id, ref_id) && query(port, expr).await.is_empty() {
                empty.push(format!("{name} panel {id} {ref_id}: {expr}"));
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "panel queries with no data after 60 s:\n{}",
            empty.join("\n")
        );
    }

    // The recording rules produce their series, and no alert fires.
    for record in [
        "podgate:proxy_requests:rate5m",
        "podgate:proxy_5xx:ratio_rate5m",
        "podgate:proxy_routed_rejected:ratio_rate5m",
        "podgate:proxy_upstream_healthy:sum",
        "podgate:kas_connected_agents:sum",
    ] {
        eventually(Duration::from_secs(30), record, || async {
            (!query(port, record).await.is_empty()).then_some(())
        })
        .await;
    }
    let rules = api(port, "/api/v1/rules").await;
    for g in rules["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            assert_eq!(r["health"], "ok", "{r}");
            if r["type"] == "alerting" {
                assert_ne!(r["state"], "firing", "{r}");
            }
        }
    }
    let agents = query(port, "podgate:kas_connected_agents:sum").await;
    assert_eq!(
        agents[0]["value"][1], "1",
        "one agentk connected: {agents:?}"
    );
    drop(up);
}
