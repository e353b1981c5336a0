//! `podgate up` runs a Topology Service: it prints `topology_service
//! address=HOST:PORT`, each simulated Pod has claimed its group (`team-<pod>`) and
//! organization (`org-<pod>`), and the proxy routes those paths to their Pod.

use std::time::Duration;

use podgate_registry::testing::free_port;
use serde_json::{Value, json};

use crate::common::{podgate_up, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podgate_up_claims_each_pods_namespaces_and_routes_their_paths() {
    let (listen, admin, tls) = (free_port(), free_port(), free_port());
    let args: Vec<String> = [
        "--no-fleet",
        "--no-kube",
        "--listen",
        &format!("127.0.0.1:{listen}"),
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--tls-listen",
        &format!("127.0.0.1:{tls}"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let (_up, printed) =
        tokio::task::spawn_blocking(move || podgate_up(&args, Duration::from_secs(120)))
            .await
            .unwrap();
    let ts: std::net::SocketAddr = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("topology_service address="))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no topology_service line:\n{printed}"));
    let pod_address = |pod: u64| {
        printed
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("pod id={pod} address=http://"))
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(str::to_owned)
            })
            .unwrap()
    };

    for (path, pod) in [
        ("/team-2/project", 2),
        ("/team-3/project/-/issues/1.json", 3),
        ("/team-1.atom", 1),
        ("/o/org-3/groups/x", 3),
        ("/Team-2/project", 2),
    ] {
        let r = request(listen, &format!("GET {path} HTTP/1.1"), b"").await;
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!((r.status, &body["pod"]), (200, &json!(pod)), "{path}");
    }
    // The Topology Service's own answer, as the HTTP Router asks it.
    let r = request(
        ts.port(),
        "POST /v1/classify HTTP/1.1\r\ncontent-type: application/json",
        br#"{"claims":[{"route":"team-3"}]}"#,
    )
    .await;
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(body["proxy"]["address"], json!(pod_address(3)));
    // The proxy counted them.
    let metrics = request(admin, "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("podgate_proxy_path_rules_total{outcome=\"claimed\"} 5"),
        "{text}"
    );
}
