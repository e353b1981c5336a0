//! The open-loop generator keeps its rate whatever the server does, and measures from
//! each request's due time.

use std::time::Duration;

use http::Method;
use podgate_loadtest::open_loop::{OpenLoopConfig, run};
use podgate_loadtest::pod_sim::{PodSim, PodSimConfig};
use podgate_tokens::PodId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_rate_times_duration_requests_and_reports_them() {
    let sim = PodSim::start(PodSimConfig::new(
        PodId::new(1).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let config = OpenLoopConfig {
        url: format!("http://{}/-/readiness", sim.addr()),
        method: Method::GET,
        headers: vec![],
        body: Default::default(),
        rate: 200.0,
        duration: Duration::from_secs(1),
        max_in_flight: 64,
    };
    let report = run(config.clone()).await.unwrap();
    assert_eq!(report.sent, 200);
    assert_eq!(
        report.statuses.get(&200),
        Some(&200),
        "{:?}",
        report.statuses
    );
    // 200 requests spread over a second: the last is due at 995 ms.
    assert!(
        report.elapsed >= Duration::from_millis(995),
        "{:?}",
        report.elapsed
    );
    assert_eq!(report.latency.len(), 200);
    let json = report.to_json();
    assert_eq!(json["sent"], 200);

    // A refused connection is a status-0 result, never a hang or a panic.
    let refused = OpenLoopConfig {
        url: format!("http://127.0.0.1:{}/", podgate_registry_free_port()),
        rate: 50.0,
        duration: Duration::from_millis(200),
        ..config
    };
    let report = run(refused).await.unwrap();
    assert_eq!(report.statuses.get(&0), Some(&10));
}

fn podgate_registry_free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
