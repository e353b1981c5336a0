//! Scheduling over fake GitLab and cluster in paused time (agentk's
//! `worker_test.go`, `module_test.go`), and the leader/config supervision.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tokio::time::Instant;

use super::*;
use crate::remote_development::fakes::{FakeCluster, FakeRails, Request, deployment, store};

const SETTINGS_100_40: &str = r#"{"workspace_rails_infos":[],"settings":{"full_reconciliation_interval_seconds":100,"partial_reconciliation_interval_seconds":40}}"#;

struct Running {
    rails: Arc<FakeRails>,
    metrics: WorkspacesMetrics,
    t0: Instant,
    task: tokio::task::JoinHandle<()>,
    _writer: kube::runtime::reflector::store::Writer<k8s_openapi::api::apps::v1::Deployment>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    /// The first `n` requests as (seconds since start, update type).
    async fn schedule(&self, n: usize) -> Vec<(u64, String)> {
        self.rails
            .wait_requests(n)
            .await
            .iter()
            .map(|r| (self.secs(r), update_type(r)))
            .collect()
    }

    fn secs(&self, r: &Request) -> u64 {
        (r.at - self.t0).as_secs()
    }
}

fn update_type(r: &Request) -> String {
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    v["update_type"].as_str().unwrap().to_owned()
}

fn start(
    rails: FakeRails,
    prepare: impl FnOnce(
        &mut kube::runtime::reflector::store::Writer<k8s_openapi::api::apps::v1::Deployment>,
    ),
) -> Running {
    let rails = Arc::new(rails);
    let (reader, mut writer) = store();
    prepare(&mut writer);
    let metrics = WorkspacesMetrics::default();
    let worker = Worker::new(
        rails.clone(),
        Arc::new(FakeCluster::default()),
        reader,
        metrics.clone(),
    );
    let t0 = Instant::now();
    Running {
        rails,
        metrics,
        t0,
        task: tokio::spawn(worker.run()),
        _writer: writer,
    }
}

fn s(t: u64, kind: &str) -> (u64, String) {
    (t, kind.to_owned())
}

#[tokio::test(start_paused = true)]
async fn full_at_start_then_partial_every_ten_seconds() {
    let w = start(FakeRails::default(), |_| {});
    assert_eq!(
        w.schedule(4).await,
        vec![
            s(0, "full"),
            s(10, "partial"),
            s(20, "partial"),
            s(30, "partial")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn settings_apply_from_the_next_cycle_and_a_full_rearms_both_timers() {
    let rails = FakeRails::default();
    rails.set_default(SETTINGS_100_40);
    let w = start(rails, |_| {});
    assert_eq!(
        w.schedule(5).await,
        vec![
            s(0, "full"),
            s(40, "partial"),
            s(80, "partial"),
            s(100, "full"),
            s(140, "partial"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn missing_settings_mean_the_defaults() {
    let rails = FakeRails::default();
    rails.answer(201, SETTINGS_100_40);
    rails.answer(
        201,
        r#"{"workspace_rails_infos":[],"settings":{"partial_reconciliation_interval_seconds":20}}"#,
    );
    // Then no settings at all.
    let w = start(rails, |_| {});
    assert_eq!(
        w.schedule(4).await,
        vec![
            s(0, "full"),
            s(40, "partial"),
            s(60, "partial"),
            s(70, "partial")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_keeps_the_settings_and_a_failed_full_is_retried_as_full() {
    let rails = FakeRails::default();
    rails.set_default(SETTINGS_100_40);
    rails.answer(500, "");
    rails.answer(201, SETTINGS_100_40);
    rails.answer(503, "");
    let w = start(rails, |_| {});
    assert_eq!(
        w.schedule(5).await,
        vec![
            s(0, "full"),
            // The full failed: the next tick (default interval) sends full again.
            s(10, "full"),
            // Failed; the 40 s from GitLab stay.
            s(50, "partial"),
            s(90, "partial"),
            s(100, "full"),
        ]
    );
    assert_eq!(w.metrics.cycles("full", "error"), 1);
    assert_eq!(w.metrics.cycles("partial", "error"), 1);
    assert_eq!(w.metrics.cycles("full", "ok"), 2);
}

#[tokio::test(start_paused = true)]
async fn timers_are_rearmed_after_a_slow_cycle() {
    let rails = FakeRails::default();
    rails.set_delay(Duration::from_secs(25));
    let w = start(rails, |_| {});
    assert_eq!(
        w.schedule(3).await,
        vec![s(0, "full"), s(35, "partial"), s(70, "partial")]
    );
}

#[tokio::test(start_paused = true)]
async fn every_full_cycle_starts_a_new_reconciler() {
    let rails = FakeRails::default();
    // GitLab acknowledges the Deployment's version every time.
    rails.set_default(
        r#"{"workspace_rails_infos":[{"name":"ws","namespace":"ns","deployment_resource_version":"1","desired_state":"Running","actual_state":"Running","config_to_apply":""}],
            "settings":{"full_reconciliation_interval_seconds":30,"partial_reconciliation_interval_seconds":10}}"#,
    );
    let w = start(rails, |writer| {
        writer.apply_watcher_event(&Event::Apply(deployment("ws", "ns", "1")));
    });
    let requests = w.rails.wait_requests(5).await;
    let sent: Vec<(u64, String, bool)> = requests
        .iter()
        .map(|r| (w.secs(r), update_type(r), r.body.contains(r#""name":"ws""#)))
        .collect();
    assert_eq!(
        sent,
        vec![
            (0, "full".into(), true),
            (10, "partial".into(), false),
            (20, "partial".into(), false),
            // Fresh trackers: the acknowledged version is sent again.
            (30, "full".into(), true),
            (40, "partial".into(), false),
        ]
    );
}

/// The configuration kas would send for a file with this `remote_development`
/// section (`enabled` and `dns_zone` only).
fn configuration(yaml: &str) -> AgentConfiguration {
    let file: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    let remote_development = file.get("remote_development").map(|r| RemoteDevelopmentCf {
        enabled: r.get("enabled").and_then(|v| v.as_bool()).unwrap_or(false),
        dns_zone: r
            .get("dns_zone")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned(),
        ..Default::default()
    });
    AgentConfiguration {
        remote_development,
        ..Default::default()
    }
}

fn module(yaml: &str) -> Option<ModuleConfig> {
    Some(ModuleConfig {
        agent_id: 1,
        remote_development: RemoteDevelopmentConfig::from_configuration(&configuration(yaml)),
    })
}

#[test]
fn the_section_decides_enabled() {
    let on = RemoteDevelopmentConfig::from_configuration(&configuration(
        "remote_development:\n  enabled: true\n  dns_zone: ws.example.com\n",
    ));
    assert!(on.enabled);
    assert_eq!(on.section.unwrap().dns_zone, "ws.example.com");
    for off in [
        "{}",
        "observability: {}\n",
        "remote_development:\n  enabled: false\n",
    ] {
        let c = RemoteDevelopmentConfig::from_configuration(&configuration(off));
        assert!(!c.enabled, "{off}");
    }
}

/// Counts starts; `running` drops to 0 when the worker future is dropped.
struct Probe {
    starts: watch::Sender<usize>,
    running: Arc<watch::Sender<usize>>,
}

struct RunningGuard(Arc<watch::Sender<usize>>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

#[tokio::test]
async fn the_module_runs_only_while_leading_and_enabled() {
    let (config_tx, config_rx) = watch::channel(None);
    let (leader_tx, leader_rx) = watch::channel(false);
    let probe = Arc::new(Probe {
        starts: watch::channel(0).0,
        running: Arc::new(watch::channel(0).0),
    });
    let metrics = WorkspacesMetrics::default();
    let p = probe.clone();
    let sup = tokio::spawn(supervise(
        config_rx,
        leader_rx,
        metrics.clone(),
        move |cfg| {
            assert!(cfg.remote_development.enabled);
            p.starts.send_modify(|n| *n += 1);
            p.running.send_modify(|n| *n += 1);
            let guard = RunningGuard(p.running.clone());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await
            }
        },
    ));
    let mut starts = probe.starts.subscribe();
    let mut running = probe.running.subscribe();
    let enabled = "remote_development:\n  enabled: true\n";

    // Leading, but no configuration yet; then a disabled one: nothing runs.
    leader_tx.send(true).unwrap();
    config_tx
        .send(module("remote_development:\n  enabled: false\n"))
        .unwrap();
    // Enabled: started.
    config_tx.send(module(enabled)).unwrap();
    running.wait_for(|n| *n == 1).await.unwrap();
    assert_eq!(*starts.borrow(), 1, "not started while disabled");
    assert_eq!(metrics.leader.get(), 1);

    // The same configuration again: no restart. Another: restarted.
    config_tx.send(module(enabled)).unwrap();
    config_tx
        .send(module(
            "remote_development:\n  enabled: true\n  dns_zone: x\n",
        ))
        .unwrap();
    starts.wait_for(|n| *n == 2).await.unwrap();
    running.wait_for(|n| *n == 1).await.unwrap();

    // Leadership lost: stopped; regained: started afresh.
    leader_tx.send(false).unwrap();
    running.wait_for(|n| *n == 0).await.unwrap();
    assert_eq!(*starts.borrow(), 2, "restarted once for the one change");
    assert_eq!(metrics.leader.get(), 0);
    leader_tx.send(true).unwrap();
    starts.wait_for(|n| *n == 3).await.unwrap();
    running.wait_for(|n| *n == 1).await.unwrap();

    // Disabled: stopped.
    config_tx.send(module("")).unwrap();
    running.wait_for(|n| *n == 0).await.unwrap();

    // The sources gone: supervision ends.
    drop(config_tx);
    sup.await.unwrap();
    assert_eq!(*starts.borrow(), 3);
}

/// A Deployment source whose first watches fail.
struct Flaky {
    failures: std::sync::Mutex<usize>,
    store: kube::runtime::reflector::Store<k8s_openapi::api::apps::v1::Deployment>,
}

impl DeploymentSource for Flaky {
    async fn deployments(
        &self,
    ) -> Result<
        crate::remote_development::reconciler::Deployments,
        crate::remote_development::reconciler::Error,
    > {
        let failed = {
            let mut failures = self.failures.lock().unwrap();
            let failed = *failures > 0;
            *failures = failures.saturating_sub(1);
            failed
        };
        if failed {
            return Err(crate::remote_development::reconciler::Error::Sync(
                "no list".into(),
            ));
        }
        self.store.deployments().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_cannot_list_is_retried_at_the_next_tick_as_full() {
    let rails = Arc::new(FakeRails::default());
    let (reader, _writer) = store();
    let metrics = WorkspacesMetrics::default();
    let worker = Worker::new(
        rails.clone(),
        Arc::new(FakeCluster::default()),
        Flaky {
            failures: std::sync::Mutex::new(2),
            store: reader,
        },
        metrics.clone(),
    );
    let t0 = Instant::now();
    let task = tokio::spawn(worker.run());
    let requests = rails.wait_requests(2).await;
    task.abort();
    let seen: Vec<_> = requests
        .iter()
        .map(|r| ((r.at - t0).as_secs(), update_type(r)))
        .collect();
    // Failed at 0 and 10; the third tick's new reconciler starts with a full.
    assert_eq!(seen, vec![s(20, "full"), s(30, "partial")]);
    assert_eq!(metrics.cycles("full", "error"), 2);
}
