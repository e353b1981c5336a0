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
