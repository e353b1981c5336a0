//! agentk's Workspaces reconciler against a real kube-sim (over HTTP, through
//! kube-rs) and the real applier, with GitLab played by a scripted fake: the
//! Deployment watch by agent label, creation (namespace created, objects applied
//! with server-side apply), versions GitLab acknowledged not re-sent, an applier
//! error reported once, and termination (namespace deleted, `Terminating` until
//! the Deployment is gone, then `Terminated` until GitLab confirms).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use podgate_agentk::metrics::WorkspacesMetrics;
use podgate_agentk::remote_development::apply::KubeCluster;
use podgate_agentk::remote_development::ports::{Rails, RailsAnswer};
use podgate_agentk::remote_development::reconciler::{Applies, Deployments, Reconciler};
use podgate_agentk::remote_development::trackers::WorkspaceKey;
use podgate_testkit::kube::KubeTestServer;
use serde_json::{Value, json};

/// Every step of these tests is bounded: a hang is a failure, not a stuck CI job.
const STEP: Duration = Duration::from_secs(20);

/// GitLab: answers 201 with the queued bodies (then no workspaces) and keeps what
/// agentk sent.
#[derive(Default)]
struct ScriptedRails {
    answers: Mutex<VecDeque<String>>,
    bodies: Mutex<Vec<String>>,
}

impl ScriptedRails {
    fn answer(&self, infos: Value) {
        self.answers
            .lock()
            .unwrap()
            .push_back(json!({ "workspace_rails_infos": infos }).to_string());
    }
}

impl Rails for ScriptedRails {
    async fn reconcile(&self, body: Vec<u8>) -> Result<RailsAnswer, String> {
        self.bodies
            .lock()
            .unwrap()
            .push(String::from_utf8(body).unwrap());
        let answer = self
            .answers
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| r#"{"workspace_rails_infos":[]}"#.to_owned());
        Ok(RailsAnswer {
            status: 201,
            body: Bytes::from(answer),
        })
    }
}

fn deployment(name: &str, namespace: &str, agent: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"agent.gitlab.com/id": agent}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        }
    })
}

/// A workspace's `config_to_apply`: its inventory and its Deployment, as GitLab
/// sends them; `extra` appended (another document).
fn config(name: &str, namespace: &str, extra: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}-workspace-inventory
  namespace: {namespace}
  labels:
    agent.gitlab.com/id: \"1\"
    cli-utils.sigs.k8s.io/inventory-id: {name}-workspace-inventory
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
  labels:
    agent.gitlab.com/id: \"1\"
  annotations:
    config.k8s.io/owning-inventory: {name}-workspace-inventory
spec:
  replicas: 1
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      containers:
      - name: editor
        image: busybox
{extra}"
    )
}

fn infos(body: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(body).unwrap();
    v["workspace_agent_infos"].as_array().unwrap().clone()
}

struct Setup {
    kube: KubeTestServer,
    rails: Arc<ScriptedRails>,
    r: Reconciler<ScriptedRails, KubeCluster>,
}

impl Setup {
    async fn new() -> Setup {
        Setup::on(KubeTestServer::start(10_000).await.unwrap()).await
    }

    /// Agent 1's reconciler on `kube`, once its Deployment watch has listed.
    async fn on(kube: KubeTestServer) -> Setup {
        let client = kube.client().await;
        let rails = Arc::new(ScriptedRails::default());
        let deployments = tokio::time::timeout(STEP, Deployments::watch(client.clone(), 1))
            .await
            .expect("the watch lists in time")
            .expect("the watch lists");
        let r = Reconciler::new(
            rails.clone(),
            Arc::new(KubeCluster::new(client)),
            deployments,
            Applies::default(),
            WorkspacesMetrics::default(),
        );
        Setup { kube, rails, r }
    }

    /// One cycle and the applies it started; the body sent.
    async fn cycle(&mut self) -> String {
        tokio::time::timeout(STEP, async {
            self.r.run().await.expect("cycle");
            self.r.errors().wait_idle().await;
        })
        .await
        .expect("cycle in time");
        self.rails.bodies.lock().unwrap().last().unwrap().clone()
    }

    /// Wait until the reconciler's Deployment store satisfies `check`.
    async fn store_until(
        &self,
        check: impl FnMut(&[Arc<k8s_openapi::api::apps::v1::Deployment>]) -> bool,
    ) {
        let seen = tokio::time::timeout(STEP, self.r.deployments().wait_until(check))
            .await
            .expect("the store changes in time");
        assert!(seen);
    }
}

fn version_of(store: &[Arc<k8s_openapi::api::apps::v1::Deployment>], name: &str) -> Option<String> {
    store
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(name))
        .and_then(|d| d.metadata.resource_version.clone())
}

#[tokio::test]
async fn only_this_agents_deployments_are_watched_and_sent() {
    let kube = KubeTestServer::start(10_000).await.unwrap();
    kube.put(
        "namespaces",
        "",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}),
    );
    kube.put("deployments", "ns", deployment("mine", "ns", "1"));
    kube.put("deployments", "ns", deployment("theirs", "ns", "2"));
    let mut s = Setup::on(kube).await;
    let names = |d: &[Arc<k8s_openapi::api::apps::v1::Deployment>]| {
        let mut n: Vec<String> = d.iter().filter_map(|d| d.metadata.name.clone()).collect();
        n.sort();
        n
    };
    assert_eq!(names(&s.r.deployments().state()), ["mine"]);
    // Later ones arrive through the watch.
    s.kube
        .put("deployments", "ns", deployment("mine-too", "ns", "1"));
    s.kube
        .put("deployments", "ns", deployment("theirs-too", "ns", "2"));
    s.store_until(|d| d.len() == 2).await;
    assert_eq!(names(&s.r.deployments().state()), ["mine", "mine-too"]);

    s.r.run().await.unwrap();
    let body = s.rails.bodies.lock().unwrap()[0].clone();
    let sent: Vec<_> = infos(&body)
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sent, ["mine", "mine-too"]);
    assert!(body.starts_with(r#"{"update_type":"full","workspace_agent_infos":[{"name":"mine","namespace":"ns","latest_k8s_deployment_info":{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"#), "{body}");
}

#[tokio::test]
async fn a_workspace_is_created_acknowledged_reports_errors_and_is_terminated() {
    let mut s = Setup::new().await;
    let (ws, ns) = ("workspace-1-1-abc", "gl-rd-ns-1-1-abc");

    // Full, nothing yet. GitLab asks for a new workspace.
    s.rails.answer(json!([{
        "name": ws, "namespace": ns, "desired_state": "Running", "actual_state": "CreationRequested",
        "deployment_resource_version": null, "config_to_apply": config(ws, ns, ""), "image_pull_secrets": []
    }]));
    assert_eq!(
        s.cycle().await,
        r#"{"update_type":"full","workspace_agent_infos":[]}"#
    );
    assert_eq!(
        s.r.errors().get(&WorkspaceKey::new(ws, ns)),
        None,
        "applied without errors"
    );
    assert!(
        s.kube.get("namespaces", "", ns).is_some(),
        "namespace created"
    );
    let applied = s
        .kube
        .get("deployments", ns, ws)
        .expect("Deployment applied");
    let managers: Vec<_> = applied["metadata"]["managedFields"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|f| (f["manager"].clone(), f["operation"].clone()))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        managers.contains(&(json!("agentk"), json!("Apply"))),
        "{managers:?}"
    );

    // The Deployment reaches the watch and is sent whole; GitLab acknowledges it.
    s.store_until(|d| version_of(d, ws).is_some()).await;
    let body = s.cycle().await;
    let sent = infos(&body);
    assert_eq!(sent.len(), 1, "{body}");
    assert_eq!(sent[0]["name"], ws);
    assert_eq!(sent[0]["namespace"], ns);
    let version = sent[0]["latest_k8s_deployment_info"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    s.rails.answer(json!([{
        "name": ws, "namespace": ns, "desired_state": "Running", "actual_state": "Starting",
        "deployment_resource_version": version, "config_to_apply": ""
    }]));
    s.cycle().await;
    // Unchanged since: not sent again (nothing moves the Deployment's status here:
    // kube-sim's controllers are not started).
    assert_eq!(
        s.cycle().await,
        r#"{"update_type":"partial","workspace_agent_infos":[]}"#
    );
    // Changed: sent again.
    let mut changed = applied.clone();
    changed["metadata"]["labels"]["touched"] = json!("yes");
    s.kube.put("deployments", ns, changed);
    s.store_until(|d| version_of(d, ws).is_some_and(|v| v != version))
        .await;
    let body = s.cycle().await;
    assert_eq!(infos(&body).len(), 1, "{body}");
    assert_eq!(
        infos(&body)[0]["latest_k8s_deployment_info"]["metadata"]["labels"]["touched"],
        "yes"
    );
    let version =
        infos(&body)[0]["latest_k8s_deployment_info"]["metadata"]["resourceVersion"].clone();

    // A config with an object that names no inventory: the applier's error, once.
    let orphan = "---
apiVersion: v1
kind: Service
metadata:
  name: orphan
  namespace: NS
spec:
  ports:
  - port: 80
"
    .replace("NS", ns);
    s.rails.answer(json!([{
        "name": ws, "namespace": ns, "desired_state": "Running", "actual_state": "Running",
        "deployment_resource_version": version, "config_to_apply": config(ws, ns, &orphan)
    }]));
    s.cycle().await;
    let body = s.cycle().await;
    let sent = infos(&body);
    assert_eq!(sent.len(), 1, "{body}");
    assert_eq!(sent[0]["error_details"]["error_type"], "applier");
    let message = sent[0]["error_details"]["error_message"].as_str().unwrap();
    assert!(message.contains("no owning inventory found"), "{message}");
    // That cycle carried the error and GitLab answered it with the workspace.
    s.rails.answer(json!([{
        "name": ws, "namespace": ns, "desired_state": "Running", "actual_state": "Error",
        "deployment_resource_version": version, "config_to_apply": ""
    }]));
    let _ = s.cycle().await;
    assert_eq!(
        s.cycle().await,
        r#"{"update_type":"partial","workspace_agent_infos":[]}"#
    );

    // Terminate: the namespace is deleted; Terminating while the Deployment is
    // there, Terminated once it is gone, until GitLab says Terminated.
    let terminated = |actual: &str| {
        json!([{
            "name": ws, "namespace": ns, "desired_state": "Terminated", "actual_state": actual,
            "deployment_resource_version": version, "config_to_apply": ""
        }])
    };
    s.rails.answer(terminated("Running"));
    s.cycle().await;
    let ns_now = s.kube.get("namespaces", "", ns);
    assert!(
        ns_now.is_none() || ns_now.as_ref().unwrap()["metadata"]["deletionTimestamp"].is_string(),
        "namespace being deleted: {ns_now:?}"
    );
    let in_store = version_of(&s.r.deployments().state(), ws).is_some();
    let body = s.cycle().await;
    let progress = infos(&body)[0]["termination_progress"].clone();
    if in_store {
        assert!(
            progress == "Terminating" || progress == "Terminated",
            "{body}"
        );
    }
    s.store_until(|d| version_of(d, ws).is_none()).await;
    let body = s.cycle().await;
    assert_eq!(
        body,
        format!(
            r#"{{"update_type":"partial","workspace_agent_infos":[{{"name":"{ws}","namespace":"{ns}","termination_progress":"Terminated"}}]}}"#
        )
    );
    s.rails.answer(terminated("Terminated"));
    s.cycle().await;
    assert_eq!(
        s.cycle().await,
        r#"{"update_type":"partial","workspace_agent_infos":[]}"#
    );
    assert!(s.r.terminations().is_empty());
}

/// GitLab for one replica: every answer sets a one-second partial interval; each
/// request is counted in a watch.
struct CountingRails {
    bodies: tokio::sync::watch::Sender<Vec<String>>,
}

impl CountingRails {
    fn new() -> Arc<CountingRails> {
        Arc::new(CountingRails {
            bodies: tokio::sync::watch::channel(Vec::new()).0,
        })
    }

    async fn wait_requests(&self, n: usize) -> Vec<String> {
        let mut rx = self.bodies.subscribe();
        let bodies = tokio::time::timeout(STEP, rx.wait_for(|b| b.len() >= n))
            .await
            .expect("requests in time")
            .unwrap();
        bodies.clone()
    }
}

impl Rails for CountingRails {
    async fn reconcile(&self, body: Vec<u8>) -> Result<RailsAnswer, String> {
        self.bodies
            .send_modify(|b| b.push(String::from_utf8(body).unwrap()));
        Ok(RailsAnswer {
            status: 201,
            body: Bytes::from_static(
                br#"{"workspace_rails_infos":[],"settings":{"full_reconciliation_interval_seconds":3600,"partial_reconciliation_interval_seconds":1}}"#,
            ),
        })
    }
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_released_lease_hands_over_at_once() {
    use podgate_agent::proto::gitlab::agent::agentcfg::{AgentConfiguration, RemoteDevelopmentCf};
    use podgate_agentk::AgentConfig;
    use podgate_agentk::remote_development::{LeaderOptions, run};

    let kube = KubeTestServer::start(10_000).await.unwrap();
    let client = kube.client().await;
    let (config_tx, config_rx) = tokio::sync::watch::channel(None::<AgentConfig>);
    let options = |identity: &str| LeaderOptions {
        namespace: "default".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
    };
    let replica = |identity: &str| {
        let rails = CountingRails::new();
        let metrics = WorkspacesMetrics::default();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(
            client.clone(),
            rails.clone(),
            Arc::new(KubeCluster::new(client.clone())),
            config_rx.clone(),
            options(identity),
            metrics.clone(),
            async move {
                let _ = stop_rx.await;
            },
        ));
        (rails, metrics, stop_tx, task)
    };
    let (rails_a, metrics_a, stop_a, task_a) = replica("replica-a");
    let (rails_b, metrics_b, stop_b, task_b) = replica("replica-b");

    // Disabled: no election, no requests (the Lease is not even created).
    config_tx
        .send(Some(AgentConfig {
            agent_id: 1,
            configuration: AgentConfiguration {
                remote_development: Some(RemoteDevelopmentCf {
                    enabled: false,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }))
        .unwrap();
    // Enabled: one replica wins and starts with a full reconcile.
    config_tx
        .send(Some(AgentConfig {
            agent_id: 1,
            configuration: AgentConfiguration {
                remote_development: Some(RemoteDevelopmentCf {
                    enabled: true,
                    dns_zone: "ws.example".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }))
        .unwrap();
    let (first, second) = tokio::time::timeout(STEP, async {
        tokio::select! {
            _ = rails_a.wait_requests(1) => ((&rails_a, &metrics_a, stop_a, task_a), (&rails_b, &metrics_b, stop_b, task_b)),
            _ = rails_b.wait_requests(1) => ((&rails_b, &metrics_b, stop_b, task_b), (&rails_a, &metrics_a, stop_a, task_a)),
        }
    })
    .await
    .expect("a leader in time");
    let lease = kube
        .get("leases", "default", "agent-1-lock")
        .expect("the Lease");
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();

    // The leader keeps reconciling (1 s partials); the other never does.
    let bodies = first.0.wait_requests(3).await;
    assert!(
        bodies[0].starts_with(r#"{"update_type":"full""#),
        "{}",
        bodies[0]
    );
    assert!(
        bodies[1].starts_with(r#"{"update_type":"partial""#),
        "{}",
        bodies[1]
    );
    assert!(
        second.0.bodies.borrow().is_empty(),
        "only the leader reconciles"
    );
    assert_eq!(first.1.leader.get(), 1);
    assert_eq!(second.1.leader.get(), 0);

    // The leader stops and gives the Lease up: the other takes over well before
    // the lease duration, with a full reconcile.
    let (_, _, stop, task) = first;
    stop.send(()).unwrap();
    tokio::time::timeout(STEP, task).await.unwrap().unwrap();
    let released = kube.get("leases", "default", "agent-1-lock").unwrap();
    assert_ne!(
        released["spec"]["holderIdentity"].as_str().unwrap_or(""),
        holder
    );
    let bodies = second.0.wait_requests(1).await;
    assert!(
        bodies[0].starts_with(r#"{"update_type":"full""#),
        "{}",
        bodies[0]
    );
    let lease = kube.get("leases", "default", "agent-1-lock").unwrap();
    assert_ne!(lease["spec"]["holderIdentity"], holder.as_str());
    assert_eq!(second.1.leader.get(), 1);

    // The configuration sender gone: the module ends.
    drop(config_tx);
    let (_, _, _stop, task) = second;
    tokio::time::timeout(STEP, task).await.unwrap().unwrap();
}

/// The whole loop in one process: a real agentk (`Agentk::start`, its module
/// enabled by the agent configuration file kas serves) reconciling through a real
/// kas with the Pod simulator as GitLab, against kube-sim with its controllers: a
/// workspace is created, runs, stops, restarts and is terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_lives_through_kas_and_the_pod_simulator() {
    use podgate_loadtest::pod_sim::workspaces::{ActualState, DesiredState, WorkspaceSpec};
    use podgate_testkit::workspaces::{WorkspacesStack, until};

    let stack = WorkspacesStack::builder()
        .max_wait(Duration::from_secs(10))
        .workspaces_listener(false)
        .start()
        .await;
    let (kube, sim, agentk) = (&stack.kube, &stack.sim, &stack.agentk);

    let ws = stack.running_workspace(WorkspaceSpec::default()).await;
    assert!(kube.get("namespaces", "", &ws.namespace).is_some());
    let deployment = kube.get("deployments", &ws.namespace, &ws.name).unwrap();
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(agentk.metrics().workspaces.leader.get(), 1);

    stack
        .set_state(ws.id, DesiredState::Stopped, ActualState::Stopped)
        .await;
    assert_eq!(
        kube.get("deployments", &ws.namespace, &ws.name).unwrap()["spec"]["replicas"],
        0
    );

    sim.set_workspace_desired_state(ws.id, DesiredState::RestartRequested)
        .unwrap();
    until("Running again", || {
        let w = sim.workspaces().get(ws.id).unwrap();
        w.desired_state == DesiredState::Running && w.actual_state == ActualState::Running
    })
    .await;

    stack
        .set_state(ws.id, DesiredState::Terminated, ActualState::Terminated)
        .await;
    assert!(kube.get("namespaces", "", &ws.namespace).is_none());
    assert!(agentk.metrics().workspaces.cycles("full", "ok") >= 1);
    assert_eq!(agentk.metrics().workspaces.apply_errors.get(), 0);
    let text = agentk.metrics().render();
    for line in [
        "podgate_agentk_workspaces_cycles_total{result=\"ok\",type=\"partial\"}",
        "podgate_agentk_workspaces_cycle_duration_seconds_count{type=\"full\"}",
        "podgate_agentk_workspaces_sent_total",
        "podgate_agentk_workspaces_apply_errors_total 0",
        "podgate_agentk_workspaces_leader 1",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    stack.shutdown().await;
}
