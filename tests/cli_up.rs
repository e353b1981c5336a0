//! `podgate up`, the README's main command, end to end: three Pods, the proxy and a
//! runner fleet; every Pod answers `jobs/request` polls (as the Pod itself counted them,
//! health probes excluded) and nothing is misrouted.

use std::process::Command;

use podgate_registry::testing::free_port;

#[test]
fn podgate_up_routes_a_fleet_to_all_three_pods_without_misroutes() {
    let (listen, admin) = (free_port(), free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["up", "--duration", "8s", "--runners", "12"])
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(["--tls-listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Printed only once the proxy's /readyz answered 200.
    assert!(stdout.contains("podgate up: ready"), "{stdout}");
    let last = stdout.rsplit("final").next().unwrap();
    // Each Pod's row: "  <id>  <addr>  <requests>  <jobs/request>  <misroutes>".
    for pod in ["1", "2", "3"] {
        let row = last
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pod))
            .unwrap_or_else(|| panic!("no row for Pod {pod}: {last}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        let requests: u64 = cols[2].parse().unwrap();
        let polls: u64 = cols[3].parse().unwrap();
        assert!(polls > 0, "Pod {pod} got no jobs/request: {row}");
        assert!(
            requests > polls,
            "Pod {pod}: registrations and job updates are runner traffic too: {row}"
        );
        assert_eq!(cols[4], "0", "Pod {pod} saw misroutes: {row}");
    }
    assert!(last.contains("misroutes: 0"), "{last}");
    assert!(
        stdout.contains("jobs done:") && stdout.contains("unexpected statuses: 0"),
        "{stdout}"
    );
    // The source GitLab authenticates: the runner token in the JSON body (runners that
    // also send `RUNNER-TOKEN` are counted by the body), the job token in `JOB-TOKEN`.
    for source in ["json:token", "header:job-token"] {
        assert!(last.contains(source), "no {source} traffic: {last}");
    }
}

/// `--no-fleet` queues no jobs of its own, and prints each Pod on one line a script can
/// read: its id, address, registration token and control API.
#[test]
fn podgate_up_without_a_fleet_prints_each_pod_and_queues_nothing() {
    let (listen, admin) = (free_port(), free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args(["up", "--no-fleet", "--duration", "4s"])
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(["--tls-listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
        let row = last
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pod))
            .unwrap_or_else(|| panic!("no row for Pod {pod}: {last}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
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
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;
    let (listen, admin, tls) = (free_port(), free_port(), free_port());
    let mut up = Command::new(env!("CARGO_BIN_EXE_podgate"))
        .args([
            "up",
            "--no-fleet",
            "--duration",
            "120s",
            "--kube-objects",
            "600",
        ])
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(["--tls-listen", &format!("127.0.0.1:{tls}")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SIGTERM, so `podgate up` stops its proxy child too.
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let _ = self.0.wait();
        }
    }
    let stdout = up.stdout.take().unwrap();
    let _up = Kill(up);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end (the test may have stopped listening): `podgate up` keeps
        // a stdout it can write to.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
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
