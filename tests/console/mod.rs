//! The web console in a real browser: Debian's headless Chromium, driven over the
//! DevTools protocol ([`cdp`]), opens the URL `podgate up` prints, and
//!
//! - the page reports no error (no exception, no `console.error`, no failed load,
//!   no refused WebSocket, no CSP violation);
//! - its traffic table agrees with each simulated Pod's own `/metrics`, after
//!   runner requests the test sent through the proxy (and its misroutes are 0
//!   where the Pods counted 0);
//! - kas's agent shows as connected, the workspace `podgate up` created shows with
//!   the states Pod 1 reports;
//! - the graph, opened by the page itself through the proxy to kas's Graph API
//!   with a browser session cookie, has as many vertices as `kubectl` (through the
//!   same proxy and kas) lists objects of the kinds glab watches by default, and a
//!   canvas with something drawn on it;
//! - `kubectl delete` of a ConfigMap makes its vertex go within a second.
//!
//! Screenshots go to `target/tmp/console-screenshots/` for a person to look at.

mod cdp;
mod live;
use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::job_router::client::Client as JobRouterClient;
use crate::job_router::gitlab::RunnerConfig;
use common::metrics;
use podgate_registry::testing::{eventually, free_port};
use serde_json::{Value, json};

/// The kinds glab watches by default (the console sends glab's default request),
/// as `kubectl get` names them.
const GLAB_DEFAULT_KINDS: &str = "pods,secrets,configmaps,serviceaccounts,deployments.apps,replicasets.apps,daemonsets.apps,statefulsets.apps,jobs.batch,cronjobs.batch,roles.rbac.authorization.k8s.io,rolebindings.rbac.authorization.k8s.io";

fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `kubectl ARGS` with `kubeconfig`: its stdout (panics on failure).
fn kubectl(kubeconfig: &str, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl is installed");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// (namespace, resource, name) of every object of the default kinds outside
/// kube-system, as kubectl lists them.
fn listed(kubeconfig: &str) -> Vec<(String, String, String)> {
    let text = kubectl(
        kubeconfig,
        &[
            "get",
            GLAB_DEFAULT_KINDS,
            "-A",
            "--no-headers",
            "-o",
            "custom-columns=NS:.metadata.namespace,KIND:.kind,NAME:.metadata.name",
        ],
    );
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[0] != "kube-system")
                .then(|| (f[0].to_owned(), f[1].to_owned(), f[2].to_owned()))
        })
        .collect()
}

/// A Pod simulator's runner requests, by its own `podsim_requests_total` (what
/// `podgate up`'s table counts: not probes, scrapes, the control API, the current
/// user, or GitLab's internal API for kas and agents), and its misroutes.
async fn pod_counts(addr: &str) -> (u64, u64) {
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let reply = common::request(port, "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8(reply.body).unwrap();
    let runner: f64 = metrics::select(&metrics::samples(&text), "podsim_requests_total")
        .filter(|s| {
            let endpoint = s.label("endpoint").unwrap();
            let not_runner = [
                "health",
                "metrics",
                "control",
                "user",
                "namespace_page",
                "organization_page",
            ]
            .contains(&endpoint)
                || ["k8s_", "ws_", "agentw_"]
                    .iter()
                    .any(|p| endpoint.starts_with(p));
            !not_runner
        })
        .map(|s| s.value)
        .sum();
    let misrouted = metrics::value_or_zero(&text, "misrouted_requests_total");
    (runner as u64, misrouted as u64)
}

/// `podsim_workspace_info`'s (desired, actual) for `workspace` on Pod `addr`.
async fn workspace_states(addr: &str, workspace: &str) -> Option<(String, String)> {
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let reply = common::request(port, "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8(reply.body).unwrap();
    let all = metrics::samples(&text);
    let info = metrics::select(
        &all,
        &format!(r#"podsim_workspace_info{{workspace="{workspace}"}}"#),
    )
    .next()?;
    let label = |name: &str| info.label(name).map(str::to_owned);
    Some((label("desired_state")?, label("actual_state")?))
}

/// `podgate up` with `extra` flags and its listeners on free ports: the process,
/// what it printed once ready, and its proxy and admin ports.
fn up_on_free_ports(extra: &[&str]) -> (common::Running, String, u16, u16) {
    let (listen, admin) = (free_port(), free_port());
    let mut args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    args.extend([
        "--listen".into(),
        format!("127.0.0.1:{listen}"),
        "--admin".into(),
        format!("127.0.0.1:{admin}"),
        "--tls-listen".into(),
        format!("127.0.0.1:{}", free_port()),
    ]);
    let (up, printed) = common::podgate_up(&args, Duration::from_secs(240));
    (up, printed, listen, admin)
}

/// The value of `key=` on the first line containing `marker`.
fn field(printed: &str, marker: &str, key: &str) -> String {
    printed
        .lines()
        .find(|l| l.contains(marker))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{key}=")))
        })
        .unwrap_or_else(|| panic!("no {key}= on a line with {marker:?}:\n{printed}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium_agrees_with_the_pods_and_the_cluster() {
    let (_up, printed, listen, admin) =
        up_on_free_ports(&["--no-fleet", "--kube-objects", "2000", "--kube-churn", "0"]);
    let url = field(&printed, "console url=", "url");
    assert!(
        url.starts_with(&format!(
            "http://127.0.0.1:{admin}/console/#graph=ws://127.0.0.1:{listen}/"
        )),
        "{url}"
    );
    let kubeconfig = field(&printed, "kubeconfig path=", "path");
    let workspace = field(&printed, "workspace id=", "name");
    let pods: BTreeMap<String, (String, String)> = printed
        .lines()
        .filter(|l| l.trim_start().starts_with("pod id="))
        .map(|l| {
            let f = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .unwrap()
                    .to_owned()
            };
            (
                f("id"),
                (
                    f("address").trim_start_matches("http://").to_owned(),
                    f("registration_token"),
                ),
            )
        })
        .collect();
    assert_eq!(pods.len(), 3, "{printed}");

    // Runner traffic through the proxy, a different amount per Pod: a
    // registration, then 2 × id verifications.
    let mut runner_tokens = BTreeMap::new();
    for (id, (_, registration)) in &pods {
        let body = json!({"token": registration}).to_string();
        let reply = common::request(
            listen,
            "POST /api/v4/runners HTTP/1.1\r\ncontent-type: application/json",
            body.as_bytes(),
        )
        .await;
        assert_eq!(
            reply.status,
            201,
            "{:?}",
            String::from_utf8_lossy(&reply.body)
        );
        let token = serde_json::from_slice::<Value>(&reply.body).unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned();
        runner_tokens.insert(id.clone(), token.clone());
        let body = json!({"token": token}).to_string();
        for _ in 0..2 * id.parse::<u32>().unwrap() {
            let reply = common::request(
                listen,
                "POST /api/v4/runners/verify HTTP/1.1\r\ncontent-type: application/json",
                body.as_bytes(),
            )
            .await;
            assert_eq!(reply.status, 200);
        }
    }

    // One runner of each Pod on the Job Router (gitlab-runner's `router/`, as
    // tests/job_router has it), polling: its first GetJob is answered at once
    // (no `last_update` yet), the next held at its Pod's kas.
    let pollers: Vec<_> = runner_tokens
        .values()
        .map(|token| {
            let client = JobRouterClient::new(RunnerConfig::new(
                &format!("http://127.0.0.1:{listen}"),
                token,
            ));
            tokio::spawn(async move {
                loop {
                    client.request_job().await;
                }
            })
        })
        .collect();

    // Pages of each Pod's group, which carry no token: the proxy's path rules
    // place them by the Pod's claim (`podgate up` claims `team-<id>`), a
    // different number per Pod.
    for id in pods.keys() {
        for n in 0..id.parse::<u32>().unwrap() {
            let reply = common::request(
                listen,
                &format!("GET /team-{id}/project/-/issues/{n} HTTP/1.1"),
                b"",
            )
            .await;
            assert_eq!(reply.status, 200, "Pod {id}'s page");
        }
    }

    let browser = cdp::Browser::launch().await;
    let page = browser.page().await;
    let opened = now_ms();
    page.navigate(&url).await;
    let dir = screenshots();

    // Traffic: each Pod's row says what the Pod itself counted.
    let cell = |pod: &str, k: &str| {
        format!(
            "(document.querySelector('#pods tr[data-pod=\"{pod}\"] td[data-k=\"{k}\"]') || {{}}).textContent"
        )
    };
    for (id, (addr, _)) in &pods {
        let (runner, misrouted) = pod_counts(addr).await;
        assert!(runner >= 3, "Pod {id} answered {runner} runner requests");
        let want = (runner.to_string(), misrouted.to_string());
        let got = eventually(Duration::from_secs(20), "the page's row agrees", || async {
            let got = (
                page.eval(&cell(id, "answered")).await.ok()?,
                page.eval(&cell(id, "misroutes")).await.ok()?,
            );
            let got = (
                got.0.as_str()?.replace(',', ""),
                got.1.as_str()?.replace(',', ""),
            );
            (got == want).then_some(got)
        })
        .await;
        assert_eq!(got.1, "0");
        let pages: u64 = id.parse().unwrap();
        let by_path = page.eval(&cell(id, "by_path")).await.unwrap();
        assert_eq!(
            by_path.as_str(),
            Some(pages.to_string().as_str()),
            "Pod {id}"
        );
        // Only runner traffic and its pages reach Pods 2 and 3 (Pod 1 also has
        // kas's), so the proxy routed to each exactly what it answered.
        if id != "1" {
            let proxied = page.eval(&cell(id, "proxied")).await.unwrap();
            assert_eq!(
                proxied.as_str().unwrap().replace(',', ""),
                (runner + pages).to_string(),
                "Pod {id}"
            );
        }
    }

    // The Job Router: each Pod's runner held at its own kas, and open at the proxy.
    let jr = |pod: &str, k: &str| {
        format!(
            "(document.querySelector('#jr tr[data-pod=\"{pod}\"] td[data-k=\"{k}\"]') || {{}}).textContent"
        )
    };
    for id in pods.keys() {
        eventually(
            Duration::from_secs(30),
            "the Job Router row shows the held call",
            || async {
                let held = page.eval(&jr(id, "held")).await.ok()?;
                let open = page.eval(&jr(id, "open")).await.ok()?;
                let calls = page.eval(&jr(id, "calls")).await.ok()?;
                let calls: u64 = calls.as_str()?.replace(',', "").parse().ok()?;
                (held == "1" && open == "1" && calls >= 1).then_some(())
            },
        )
        .await;
    }
    for p in pollers {
        p.abort();
    }

    // kas: podgate up's agentk is connected.
    eventually(Duration::from_secs(20), "one connected agent", || async {
        let v = page
            .eval("document.getElementById('kas-agents').textContent")
            .await
            .ok()?;
        (v == "1").then_some(())
    })
    .await;

    // Workspaces: the one podgate up created, in the states Pod 1 reports.
    eventually(Duration::from_secs(30), "the workspace row agrees", || async {
        let want = workspace_states(&pods["1"].0, &workspace).await?;
        let row = page
            .eval(&format!(
                "(() => {{ const r = document.querySelector('#ws tr[data-workspace=\"{workspace}\"]'); \
                 return r && [r.querySelector('[data-k=desired]').textContent, r.querySelector('[data-k=actual]').textContent]; }})()"
            ))
            .await
            .ok()?;
        (row == json!([want.0, want.1])).then_some(())
    })
    .await;

    // The graph: as many vertices as kubectl lists objects.
    let expected = eventually(
        Duration::from_secs(90),
        "the graph has every object",
        || async {
            let want = listed(&kubeconfig).len();
            let got = page
                .eval("podgateConsole.graph.connected ? podgateConsole.graph.vertices.size : -1")
                .await
                .ok()?;
            (got.as_u64()? as usize == want).then_some(want)
        },
    )
    .await;
    assert!(expected > 1000, "thousands of vertices: {expected}");
    let draw_ms = page.eval("podgateConsole.graph.drawMs").await.unwrap();
    println!(
        "graph: {expected} vertices within {} ms of opening the page (kubectl's listings included); one frame drawn in {draw_ms} ms",
        now_ms() - opened
    );
    let stats = page
        .eval("document.getElementById('graph-stats').textContent")
        .await
        .unwrap();
    assert!(
        stats
            .as_str()
            .unwrap()
            .starts_with(&format!("{expected} vertices")),
        "{stats}"
    );
    // Something was drawn: pixels other than the background.
    let painted = page
        .eval(
            "(() => { const c = document.getElementById('graph-canvas'); \
             const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
             let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })()",
        )
        .await
        .unwrap();
    assert!(
        painted.as_u64().unwrap() > 1000,
        "painted pixels: {painted}"
    );
    page.screenshot(&dir.join("console.png")).await;

    // Selecting a Pod highlights its arcs (its owner reference at least).
    let selected = page
        .eval(
            "(() => { const G = podgateConsole.graph; \
             const arc = [...G.arcs.values()].find((a) => a.t === 'or' && a.s.includes('/pods/')); \
             if (!arc) return null; G.select(arc.s); \
             return document.getElementById('graph-info').textContent; })()",
        )
        .await
        .unwrap();
    assert!(
        selected
            .as_str()
            .is_some_and(|t| t.contains("arcs out (") && t.contains("or")),
        "{selected}"
    );
    page.screenshot(&dir.join("graph-selected.png")).await;

    // A deletion through kas reaches the page within a second.
    let (ns, _, name) = listed(&kubeconfig)
        .into_iter()
        .find(|(_, kind, _)| kind == "ConfigMap")
        .expect("a ConfigMap");
    let key = format!("/v1/configmaps/{ns}/{name}");
    assert_eq!(
        page.eval(&format!("podgateConsole.graph.vertices.has({key:?})"))
            .await
            .unwrap(),
        true
    );
    kubectl(&kubeconfig, &["delete", "configmap", "-n", &ns, &name]);
    let deleted = now_ms();
    let gone_at = eventually(Duration::from_secs(10), "the vertex is gone", || async {
        page.eval(&format!(
            "podgateConsole.graph.vertices.has({key:?}) ? null : podgateConsole.graph.deleted.get({key:?})"
        ))
        .await
        .ok()?
        .as_u64()
    })
    .await;
    let latency = gone_at.saturating_sub(deleted);
    println!("vertex gone {latency} ms after kubectl delete returned");
    assert!(
        latency < 1000,
        "the vertex went {latency} ms after the delete"
    );

    let errors = page.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
    page.screenshot(&dir.join("console-after-delete.png")).await;
}
