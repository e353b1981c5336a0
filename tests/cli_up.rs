//! `podgate up`, the README's main command, end to end: three Pods, the proxy and a
//! runner fleet; traffic reaches every Pod and nothing is misrouted.

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
    let last = stdout.rsplit("final").next().unwrap();
    // Each Pod's row: "  <id>  <addr>  <requests>  <misroutes>".
    for pod in ["1", "2", "3"] {
        let row = last
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pod))
            .unwrap_or_else(|| panic!("no row for Pod {pod}: {last}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        let requests: u64 = cols[2].parse().unwrap();
        assert!(requests > 0, "Pod {pod} got no traffic: {row}");
        assert_eq!(cols[3], "0", "Pod {pod} saw misroutes: {row}");
    }
    assert!(last.contains("misroutes: 0"), "{last}");
    assert!(
        stdout.contains("jobs done:") && stdout.contains("unexpected statuses: 0"),
        "{stdout}"
    );
    for source in ["header:runner-token", "json:token", "header:job-token"] {
        assert!(last.contains(source), "no {source} traffic: {last}");
    }
}
