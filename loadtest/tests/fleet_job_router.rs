//! Runners with `FF_USE_JOB_ROUTER` on, against a Pod simulator and no kas: every
//! way they fall back to `jobs/request` that the fleet can show without a router,
//! with every queued job still run exactly once (the Pod's ledger).
//!
//! - discovery answers 501 (no router on the Pod): `no_discovery`, and discovery is
//!   asked once per runner (cached an hour, as gitlab-runner does);
//! - discovery names a URL whose scheme the runner cannot dial: `dial_failed`;
//! - discovery names a closed port: gitlab-runner's dial does not connect
//!   (`grpc.NewClient`), so each `GetJob` fails `UNAVAILABLE` and the runner gets
//!   nothing until three failures over 5 s trip the breaker (`breaker_tripped`);
//!   then the breaker is open for 30 s (`breaker_open`).

use std::sync::Arc;
use std::time::Duration;

use podgate_loadtest::fleet::{self, FleetConfig, Progress, Report};
use podgate_loadtest::pod_sim::{PodSim, PodSimConfig};
use podgate_registry::testing::eventually;
use podgate_tokens::PodId;

/// Jobs queued before the fleet starts.
const JOBS: u64 = 8;
/// Runners, one of each default tag set, all with the Job Router on.
const ROUTED: u64 = 4;

/// A Pod whose discovery names `job_router_url`, `JOBS` jobs queued, and a fleet
/// against it until every job has finished and `at_least` has passed; the fleet's
/// report.
async fn run_all_jobs(job_router_url: Option<String>, at_least: Duration) -> (PodSim, Report) {
    let mut c = PodSimConfig::new(PodId::new(1).unwrap(), "127.0.0.1:0".parse().unwrap());
    c.long_poll = Duration::from_secs(1);
    c.job_router_url = job_router_url;
    let sim = PodSim::start(c).await.expect("pod-sim starts");
    for _ in 0..JOBS {
        sim.enqueue().unwrap();
    }
    let mut config = FleetConfig::new(
        format!("http://{}", sim.addr()),
        vec![sim.state().registration_token().to_owned()],
        ROUTED as usize,
        Duration::from_secs(600),
    );
    config.check_interval = Duration::from_millis(200);
    config.artifact_bytes = 0;
    config.trace_patches = 1;
    config.job_router_share = 1.0;
    let started = tokio::time::Instant::now();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let fleet = tokio::spawn(fleet::run(
        config,
        Arc::new(Progress::default()),
        async move {
            let _ = rx.await;
        },
    ));
    eventually(
        at_least + Duration::from_secs(30),
        "every queued job finished",
        || async { (sim.state().ledger().0.finished == JOBS).then_some(()) },
    )
    .await;
    tokio::time::sleep_until(started + at_least).await;
    let _ = tx.send(());
    let report = fleet.await.unwrap().unwrap();
    (sim, report)
}

/// Every job picked once and finished once, and the fleet counted the same.
fn assert_every_job_ran_once(sim: &PodSim, report: &Report) {
    let (l, _) = sim.state().ledger();
    assert_eq!(
        (l.picked, l.picked_twice, l.finished, l.finished_once),
        (JOBS, 0, JOBS, JOBS),
        "{l:?}"
    );
    assert_eq!(
        (l.success, l.failed, l.unfinished, l.duplicates),
        (JOBS, 0, 0, 0),
        "{l:?}"
    );
    let j = report.jobs_by_pod[0];
    assert_eq!(
        (j.received, j.not_run, j.done, j.failed),
        (JOBS, 0, JOBS, 0),
        "{j:?}"
    );
    assert_eq!(report.misroutes, 0);
    assert_eq!(report.unexpected(), 0, "{}", report.table());
}

/// The discovery answers: status → count.
fn discovery(report: &Report) -> Vec<(u16, u64)> {
    report.endpoints["runners_router_discovery"]
        .statuses
        .iter()
        .map(|(s, n)| (*s, *n))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_router_on_the_pod_runners_fall_back_and_ask_discovery_once() {
    let (sim, report) = run_all_jobs(None, Duration::ZERO).await;
    assert_every_job_ran_once(&sim, &report);
    // One discovery per Job Router runner: its 501 is kept for an hour.
    assert_eq!(discovery(&report), [(501, ROUTED)], "{}", report.table());
    let r = &report.job_router_by_pod[0];
    assert_eq!(
        (r.get_job, r.jobs, r.empty, r.errors),
        (0, 0, 0, 0),
        "{r:?}"
    );
    let f = r.fallbacks;
    assert_eq!(f.no_discovery, f.total(), "{f:?}");
    // Every turn fell back to a poll; a poll the stop cut is not recorded.
    let polls = report.jobs_request.total();
    assert!(
        polls >= JOBS && f.no_discovery >= polls && f.no_discovery <= polls + ROUTED,
        "{f:?}, {polls} polls"
    );
    let table = report.table();
    assert!(table.contains("job router (100% of runners)"), "{table}");
    let json = report.to_json();
    assert_eq!(json["config"]["job_router_share"], 1.0);
    assert_eq!(
        json["job_router_by_pod"][0]["fallbacks"]["no_discovery"],
        f.no_discovery
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_url_the_runner_cannot_dial_falls_back_at_once() {
    let url = "tcp://127.0.0.1:9".to_owned();
    let (sim, report) = run_all_jobs(Some(url), Duration::ZERO).await;
    assert_every_job_ran_once(&sim, &report);
    assert_eq!(discovery(&report), [(200, ROUTED)], "{}", report.table());
    let r = &report.job_router_by_pod[0];
    assert_eq!(r.get_job, 0, "no call was made: {r:?}");
    let f = r.fallbacks;
    // Dial failures count toward the breaker too: past 5 s it may be open.
    assert!(f.dial_failed >= ROUTED, "{f:?}");
    assert_eq!(f.dial_failed + f.breaker_open, f.total(), "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_router_port_trips_each_runners_breaker_then_it_falls_back() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let url = format!("grpc://{closed}");
    // Each runner's breaker trips about 5 s after its first failure; it stays open
    // 30 s, longer than the run.
    let (sim, report) = run_all_jobs(Some(url), Duration::from_secs(8)).await;
    assert_every_job_ran_once(&sim, &report);
    assert_eq!(discovery(&report), [(200, ROUTED)], "{}", report.table());
    let r = &report.job_router_by_pod[0];
    // Every call failed UNAVAILABLE; each runner's breaker tripped once.
    assert_eq!((r.jobs, r.empty), (0, 0), "{r:?}");
    assert_eq!(r.errors, r.get_job, "{r:?}");
    assert_eq!(
        r.errors_by_code.get("Unavailable").copied(),
        Some(r.errors),
        "{r:?}"
    );
    assert!(r.get_job >= 3 * ROUTED, "{r:?}");
    let f = r.fallbacks;
    assert_eq!(f.breaker_tripped, ROUTED, "{f:?}");
    assert_eq!(f.breaker_tripped + f.breaker_open, f.total(), "{f:?}");
}
