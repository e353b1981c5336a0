//! `podgate up`, the README's main command, end to end: three Pods, the proxy and a
//! runner fleet; every Pod answers `jobs/request` polls (as the Pod itself counted them,
//! health probes excluded) and nothing is misrouted.

use std::process::Command;

use podgate_registry::testing::free_port;

use crate::common::process::Terminated;
use crate::common::{first_line, spawn_up};

/// `podgate up ARGS` on free ports, run to its end: what it printed. It must succeed.
fn run_up(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .arg("up")
        .args(args)
        .args(listeners(free_port(), free_port(), free_port()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Pod `pod`'s row of a table `podgate up` printed, and its columns: `<id> <addr>
/// <requests> <jobs/request> <held in Pod> <held at edge> <misroutes>`.
fn final_row<'a>(table: &'a str, pod: &str) -> (&'a str, Vec<&'a str>) {
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pod))
        .unwrap_or_else(|| panic!("no row for Pod {pod}: {table}"));
    (row, row.split_whitespace().collect())
}

/// `--listen`, `--admin` and `--tls-listen` on these ports of 127.0.0.1.
fn listeners(listen: u16, admin: u16, tls: u16) -> [String; 6] {
    [
        "--listen".into(),
        format!("127.0.0.1:{listen}"),
        "--admin".into(),
        format!("127.0.0.1:{admin}"),
        "--tls-listen".into(),
        format!("127.0.0.1:{tls}"),
    ]
}

#[test]
fn podgate_up_routes_a_fleet_to_all_three_pods_without_misroutes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    // Few enough jobs that runners idle and their polls are held (a busy machine's
    // backlog would otherwise give every poll a job).
    let stdout = run_up(&[
        "--duration",
        "8s",
        "--runners",
        "36",
        "--job-rate",
        "0.5",
        "--json",
        json.to_str().unwrap(),
    ]);
    // Printed only once the proxy's /readyz answered 200.
    assert!(stdout.contains("podgate up: ready"), "{stdout}");
    let last = stdout.rsplit("final").next().unwrap();
    for pod in ["1", "2", "3"] {
        let (row, cols) = final_row(last, pod);
        let requests: u64 = cols[2].parse().unwrap();
        let polls: u64 = cols[3].parse().unwrap();
        assert!(polls > 0, "Pod {pod} got no jobs/request: {row}");
        assert!(
            requests > polls,
            "Pod {pod}: registrations and job updates are runner traffic too: {row}"
        );
        assert_eq!(cols[6], "0", "Pod {pod} saw misroutes: {row}");
        // People browsing the Pods' group and organization pages, each brought by
        // the proxy's path rules to the Pod that claimed it.
        let by_path: u64 = cols[7].parse().unwrap();
        assert!(by_path > 0, "Pod {pod} served no page by path: {row}");
    }
    assert!(last.contains("misroutes: 0"), "{last}");
    // The proxy held polls at the edge (the Pods' queue keys in a private
    // redis-server): polls ended there by a queue change or by the fleet stopping,
    // beside the stale ones it forwarded.
    assert!(
        stdout.contains("jobs/request long polls held at the proxy"),
        "{stdout}"
    );
    let edge = last
        .lines()
        .find_map(|l| l.trim().strip_prefix("edge long polls:"))
        .unwrap_or_else(|| panic!("no edge long polls line: {last}"));
    let outcome = |k: &str| -> u64 {
        let words: Vec<&str> = edge.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == k)
            .unwrap_or_else(|| panic!("no {k}: {edge}"));
        words[at + 1].parse().unwrap()
    };
    assert!(outcome("stale") > 0, "{edge}");
    assert!(
        outcome("changed") + outcome("client_gone") + outcome("timeout") > 0,
        "no poll was held at the edge: {edge}"
    );
    assert!(
        stdout.contains("jobs done:") && stdout.contains("unexpected statuses: 0"),
        "{stdout}"
    );
    // The source GitLab authenticates: the runner token in the JSON body (runners that
    // also send `RUNNER-TOKEN` are counted by the body), the job token in `JOB-TOKEN`.
    for source in ["json:token", "header:job-token"] {
        assert!(last.contains(source), "no {source} traffic: {last}");
    }
    // The report predicts jobs/request from the configuration (36 runners every 3 s
    // plus 0.5 jobs/s on each of 3 Pods) and measures it.
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let expected = &report["expected"];
    assert_eq!(expected["job_rate_source"], "configured", "{expected}");
    assert_eq!(expected["job_rate"], 1.5, "{expected}");
    assert_eq!(expected["runners"], 36, "{expected}");
    assert!(expected["ratio"].as_f64().unwrap() > 0.0, "{expected}");
    // Paced like gitlab-runner, no storm: each runner asks at most once per feed
    // (one per check interval, the first at its start) plus once after each job it
    // got (a short run drains the jobs queued while runners registered, so the jobs
    // it ran, not the configured rate, bound that part).
    let answers = &report["jobs_request"];
    let count = |k: &str| answers[k].as_u64().unwrap();
    let created = count("created");
    assert!(created > 0, "{answers}");
    let requests = created
        + count("no_content_held")
        + count("no_content_immediate")
        + count("conflict")
        + count("other");
    let elapsed = report["elapsed_secs"].as_f64().unwrap();
    let feeds = 36.0 * (elapsed / 3.0 + 1.0);
    assert!(
        requests as f64 <= feeds + created as f64,
        "{requests} jobs/request in {elapsed:.1} s: more than 36 runners' feeds ({feeds:.0}) plus one per job ({created}): {answers}"
    );
}

/// `--no-fleet` queues no jobs of its own, and prints each Pod on one line a script can
/// read: its id, address, registration token and control API.
#[test]
fn podgate_up_without_a_fleet_prints_each_pod_and_queues_nothing() {
    let stdout = run_up(&["--no-fleet", "--duration", "4s"]);
    let pods: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("pod id="))
        .collect();
    assert_eq!(pods.len(), 3, "{stdout}");
    for (i, line) in pods.iter().enumerate() {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {k} in {line}"))
        };
        assert_eq!(field("id"), (i + 1).to_string());
        let address = field("address");
        assert!(address.starts_with("http://127.0.0.1:"), "{line}");
        assert!(field("registration_token").starts_with("glrt-"), "{line}");
        assert_eq!(field("control_api"), format!("{address}/-/podsim/jobs"));
    }
    let last = stdout.rsplit("final").next().unwrap();
    for pod in ["1", "2", "3"] {
        let (row, cols) = final_row(last, pod);
        // No runner ran: the proxy's health probes are not runner traffic.
        assert_eq!(cols[2], "0", "Pod {pod}: {row}");
        assert_eq!(cols[3], "0", "Pod {pod}: {row}");
    }
    assert!(!stdout.contains("runner fleet report"), "{stdout}");
}

/// The Kubernetes side: the printed kubeconfig takes the installed `kubectl` through
/// the proxy (TLS) and kas to the simulated cluster (`get`, `apply`, `delete`), and the
/// printed Graph API URL and bearer serve `podgate graph` the same Pods kubectl lists.
#[test]
fn podgate_up_serves_kubectl_and_the_graph_api_through_the_proxy() {
    let (listen, admin, tls) = (free_port(), free_port(), free_port());
    let (up, rx) = spawn_up(
        ["--no-fleet", "--duration", "120s", "--kube-objects", "600"]
            .map(String::from)
            .into_iter()
            .chain(listeners(listen, admin, tls)),
    );
    // SIGTERM when dropped, so `podgate up` stops its proxy child too.
    let _up = Terminated(up);
    let (mut kubeconfig, mut graph) = (None, None);
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("podgate up: ready within 2 minutes");
        if let Some(p) = line.trim().strip_prefix("kubeconfig path=") {
            kubeconfig = Some(p.to_owned());
        }
        if let Some(rest) = line.trim().strip_prefix("graph url=") {
            let (url, bearer) = rest.split_once(" bearer=").expect("url and bearer");
            graph = Some((url.to_owned(), bearer.to_owned()));
        }
        if line == "podgate up: ready" {
            break;
        }
    }
    let kubeconfig = kubeconfig.expect("a kubeconfig line");
    let (url, bearer) = graph.expect("a graph line");
    assert!(
        url.starts_with(&format!(
            "ws://127.0.0.1:{listen}/-/kubernetes-agent/k8s-proxy/"
        )),
        "{url}"
    );
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("running kubectl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let pods = kubectl(&["get", "pods", "-A", "-o", "name"]);
    let kubectl_pods = pods.lines().count();
    assert!(kubectl_pods > 0, "no pods: {pods}");
    let dir = tempfile::tempdir().unwrap();
    let cm = dir.path().join("cm.yaml");
    std::fs::write(&cm, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-up-test\n  namespace: default\ndata:\n  a: b\n").unwrap();
    assert!(
        kubectl(&["apply", "-f", cm.to_str().unwrap()]).contains("configmap/from-up-test created")
    );
    assert!(
        kubectl(&[
            "get",
            "configmap",
            "from-up-test",
            "-n",
            "default",
            "-o",
            "name"
        ])
        .contains("configmap/from-up-test")
    );
    assert!(kubectl(&["delete", "configmap", "from-up-test", "-n", "default"]).contains("deleted"));

    // The Graph API: the same Pods (churn is light; allow for a few in flight).
    let token = bearer.splitn(3, ':').nth(2).expect("pat:<agent>:<token>");
    let token_file = dir.path().join("pat");
    std::fs::write(&token_file, token).unwrap();
    let base = url.trim_start_matches("ws://").trim_end_matches("graph");
    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["graph", "-a", "1", "--url", &format!("http://{base}")])
        .arg("--token-file")
        .arg(&token_file)
        .args(["-r", "pods", "--summary-only"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "podgate graph: {stderr}");
    let graph_pods: usize = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")?
                .split(" vertices")
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    assert!(
        graph_pods.abs_diff(kubectl_pods) <= 10,
        "the graph has {graph_pods} pods, kubectl listed {kubectl_pods}"
    );
}

/// Workspaces: `podgate up` creates a workspace for Pod 1's agent and lists it in
/// its periodic table; agentk's reconciliation (through the proxy and kas, against
/// kube-sim's controllers) brings it to `Running`, and a stop through the printed
/// `podgate workspaces --gitlab …` command is followed to `Stopped` — which only
/// happens while reconcile traffic flows both ways (the Deployment scaled to 0 by
/// agentk's apply, then its status reported back to GitLab). The printed `open:`
/// line (the workspace's host on the proxy) reaches the running workspace's
/// Service through kas and agentk, and is answered 503 once it is stopped.
#[test]
fn podgate_up_runs_a_workspace_and_follows_a_stop() {
    use std::time::{Duration, Instant};
    let (listen, admin, tls) = (free_port(), free_port(), free_port());
    let (up, rx) = spawn_up(
        [
            "--no-fleet",
            "--duration",
            "180s",
            "--kube-objects",
            "300",
            "--workspaces-partial-interval",
            "1",
        ]
        .map(String::from)
        .into_iter()
        .chain(listeners(listen, admin, tls)),
    );
    let _up = Terminated(up);
    let next = |what: &str, deadline: Instant| -> String {
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left)
            .unwrap_or_else(|_| panic!("podgate up: no {what} in time"))
    };
    let field = |line: &str, k: &str| -> String {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
            .to_owned()
    };
    let (mut workspace, mut gitlab, mut kubeconfig) = (None, None, None);
    let (mut open, mut pat) = (None, None);
    let start = Instant::now() + Duration::from_secs(120);
    loop {
        let line = next("ready", start);
        let t = line.trim();
        if t.starts_with("workspace id=") {
            workspace = Some((
                field(t, "id"),
                field(t, "name"),
                field(t, "namespace"),
                field(t, "url"),
            ));
        }
        if let Some(rest) = t.strip_prefix("try: podgate workspaces --gitlab ") {
            gitlab = rest.split_whitespace().next().map(str::to_owned);
        }
        if let Some(p) = t.strip_prefix("kubeconfig path=") {
            kubeconfig = Some(p.to_owned());
        }
        if t.starts_with("open: curl ") {
            // `… http://<workspace host>:<proxy port>/`
            open = t.rsplit(' ').next().map(|u| {
                u.trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_owned()
            });
        }
        if t.starts_with("graph url=") {
            pat = Some(field(t, "bearer").splitn(3, ':').nth(2).unwrap().to_owned());
        }
        if line == "podgate up: ready" {
            break;
        }
    }
    let (id, name, namespace, url) = workspace.expect("a `workspace id=…` line");
    let open = open.expect("an `open: curl …` line");
    let pat = pat.expect("the graph line's bearer");
    let gitlab = gitlab.expect("a `try: podgate workspaces --gitlab …` line");
    let kubeconfig = kubeconfig.expect("a kubeconfig line");
    assert!(name.starts_with("workspace-1-1-"), "{name}");
    assert!(
        url.starts_with(&format!("https://60001-{name}.workspaces.localhost/")),
        "{url}"
    );

    // The table's row for the workspace: (desired, actual), once it shows `want`.
    let wait_row = |want: (&str, &str), deadline: Instant| {
        let mut last = None;
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("no table row {want:?} in time; last {last:?}"));
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() >= 5 && cols[0] == id && cols[1] == name {
                assert_eq!(cols[4], url, "{line}");
                if (cols[2], cols[3]) == want {
                    return;
                }
                last = Some(line.clone());
            }
        }
    };
    wait_row(
        ("Running", "Running"),
        Instant::now() + Duration::from_secs(90),
    );
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .expect("running kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let replicas = |kubectl: &dyn Fn(&[&str]) -> String| {
        kubectl(&[
            "get",
            "deployment",
            &name,
            "-n",
            &namespace,
            "-o",
            "jsonpath={.spec.replicas}",
        ])
    };
    // agentk applied GitLab's Deployment to the cluster (seen through the proxy and kas).
    assert_eq!(replicas(&kubectl), "1");
    // The printed way in: the workspace's host on the proxy, as the workspace's
    // owner, reaches the workspace's Service through kas and agentk (kube-sim's
    // backend names the Deployment).
    let host = url
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(open, format!("{host}:{listen}"));
    let host = open.clone();
    let visit = || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", listen)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET /hello HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {pat}\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status: u16 = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, out)
    };
    let (status, answer) = visit();
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer.contains(&format!("deployment {namespace}/{name}")),
        "{answer}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["workspaces", "--gitlab", &gitlab, "stop", &id])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podgate workspaces stop: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("Stopped"), "{text}");
    wait_row(
        ("Stopped", "Stopped"),
        Instant::now() + Duration::from_secs(60),
    );
    assert_eq!(replicas(&kubectl), "0");
    let (status, answer) = visit();
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer.contains(&format!("workspace {name} is not running")),
        "{answer}"
    );
}

/// The processes `pid` started that still run: (pid, command line).
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("children");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for child in text.split_whitespace() {
            let child: u32 = child.parse().unwrap();
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            out.push((child, cmdline));
        }
    }
    out
}

/// Wait (at most `within`) for process `pid` to exit: its pidfd becomes readable
/// when it terminates, reaped or not (PID 1 here reaps nobody). `false` if it
/// still runs.
fn exits_within(pid: u32, within: std::time::Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    use rustix::process::{Pid, PidfdFlags, pidfd_open};
    let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    let fd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return true, // already gone
        Err(e) => panic!("pidfd_open: {e}"),
    };
    let timeout = Timespec {
        tv_sec: i64::try_from(within.as_secs()).unwrap(),
        tv_nsec: 0,
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    poll(&mut fds, Some(&timeout)).unwrap() == 1
}

/// A SIGKILLed `podgate up` leaves nothing running: the kernel sends its proxy and
/// its private redis-server SIGTERM (`PR_SET_PDEATHSIG`), and they exit.
#[test]
fn a_killed_podgate_up_takes_its_proxy_and_redis_with_it() {
    let (mut up, rx) = spawn_up(
        ["--no-fleet".to_owned(), "--no-kube".to_owned()]
            .into_iter()
            .chain(listeners(free_port(), free_port(), free_port())),
    );
    first_line(
        &rx,
        std::time::Duration::from_secs(120),
        "podgate up",
        |line| line.contains("podgate up: ready").then_some(()),
    );
    let children: Vec<(u32, String)> = children_of(up.id())
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(" proxy --config ") || cmd.starts_with("redis-server"))
        .collect();
    assert_eq!(
        children.len(),
        2,
        "the proxy and redis-server: {children:?}"
    );
    up.kill().unwrap();
    up.wait().unwrap();
    for (pid, cmd) in &children {
        assert!(
            exits_within(*pid, std::time::Duration::from_secs(30)),
            "{cmd} (pid {pid}) outlived podgate up"
        );
    }
}
