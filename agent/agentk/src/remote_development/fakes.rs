//! Small fakes of GitLab and the cluster for the module's unit tests (agentk's
//! `mock_test.go`/`mock_informer.go` play this part in GitLab's tests).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::Event;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::ports::{Cluster, Rails, RailsAnswer};

/// One request GitLab got.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    /// When it arrived (paused time in scheduling tests).
    pub(crate) at: Instant,
    /// The body, as text.
    pub(crate) body: String,
}

/// A scripted GitLab: answers queued with [`FakeRails::answer`], then 201 with no
/// workspaces.
pub(crate) struct FakeRails {
    requests: watch::Sender<Vec<Request>>,
    answers: Mutex<VecDeque<Result<RailsAnswer, String>>>,
    /// How long each answer takes.
    delay: Mutex<Duration>,
    /// The body of 201s once the queue is empty.
    default_body: Mutex<String>,
}

impl Default for FakeRails {
    fn default() -> Self {
        FakeRails {
            requests: watch::channel(Vec::new()).0,
            answers: Mutex::default(),
            delay: Mutex::default(),
            default_body: Mutex::new(r#"{"workspace_rails_infos":[]}"#.to_owned()),
        }
    }
}

impl FakeRails {
    /// Queue an answer with this status and body.
    pub(crate) fn answer(&self, status: u16, body: &str) {
        self.answers.lock().unwrap().push_back(Ok(RailsAnswer {
            status,
            body: Bytes::from(body.to_owned()),
        }));
    }

    /// Queue a 201 with these workspaces (JSON objects) and no settings.
    pub(crate) fn answer_infos(&self, infos: &[serde_json::Value]) {
        self.answer(
            201,
            &serde_json::json!({ "workspace_rails_infos": infos }).to_string(),
        );
    }

    /// Queue "no answer" (kas unreachable).
    pub(crate) fn fail(&self, why: &str) {
        self.answers.lock().unwrap().push_back(Err(why.to_owned()));
    }

    /// Once the queue is empty, answer 201 with this body.
    pub(crate) fn set_default(&self, body: &str) {
        *self.default_body.lock().unwrap() = body.to_owned();
    }

    /// Every answer takes this long from now on.
    pub(crate) fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }

    /// Requests so far.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.requests.borrow().clone()
    }

    /// Wait until at least `n` requests arrived; the first `n`.
    pub(crate) async fn wait_requests(&self, n: usize) -> Vec<Request> {
        let mut rx = self.requests.subscribe();
        let r = rx.wait_for(|r| r.len() >= n).await.unwrap();
        r[..n].to_vec()
    }
}

impl Rails for FakeRails {
    async fn reconcile(&self, body: Vec<u8>) -> Result<RailsAnswer, String> {
        let at = Instant::now();
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let answer = self.answers.lock().unwrap().pop_front();
        self.requests.send_modify(|r| {
            r.push(Request {
                at,
                body: String::from_utf8(body).unwrap(),
            })
        });
        answer.unwrap_or_else(|| {
            Ok(RailsAnswer {
                status: 201,
                body: Bytes::from(self.default_body.lock().unwrap().clone()),
            })
        })
    }
}

/// A cluster of namespaces; applies recorded, their results scripted.
#[derive(Default)]
pub(crate) struct FakeCluster {
    /// Applies started so far.
    pub(crate) started: watch::Sender<usize>,
    /// Namespaces that exist.
    pub(crate) namespaces: Mutex<BTreeSet<String>>,
    /// Namespaces deleted (they stay in `namespaces`, terminating, until a test
    /// removes them).
    pub(crate) deleted: Mutex<Vec<String>>,
    /// Namespaces created.
    pub(crate) created: Mutex<Vec<String>>,
    /// Configurations applied.
    pub(crate) applied: Mutex<Vec<String>>,
    /// Results of the next applies: an error list, or a gate the apply waits on
    /// first.
    results: Mutex<VecDeque<ApplyResult>>,
    /// `namespace_exists` fails with this while set.
    pub(crate) namespace_error: Mutex<Option<String>>,
}

enum ApplyResult {
    Now(Vec<String>),
    Gated(oneshot::Receiver<Vec<String>>),
}

impl FakeCluster {
    /// The next apply fails with these errors.
    pub(crate) fn fail_next_apply(&self, errors: &[&str]) {
        self.results.lock().unwrap().push_back(ApplyResult::Now(
            errors.iter().map(|e| (*e).to_owned()).collect(),
        ));
    }

    /// The next apply waits until the sender answers with its errors.
    pub(crate) fn gate_next_apply(&self) -> oneshot::Sender<Vec<String>> {
        let (tx, rx) = oneshot::channel();
        self.results
            .lock()
            .unwrap()
            .push_back(ApplyResult::Gated(rx));
        tx
    }

    /// Whether namespace `name` exists.
    pub(crate) fn has_namespace(&self, name: &str) -> bool {
        self.namespaces.lock().unwrap().contains(name)
    }
}

impl Cluster for FakeCluster {
    async fn apply(&self, config_to_apply: String) -> Result<(), Vec<String>> {
        self.applied.lock().unwrap().push(config_to_apply);
        self.started.send_modify(|n| *n += 1);
        let next = self.results.lock().unwrap().pop_front();
        let errors = match next {
            None => vec![],
            Some(ApplyResult::Now(e)) => e,
            Some(ApplyResult::Gated(rx)) => rx.await.unwrap_or_default(),
        };
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    async fn namespace_exists(&self, name: &str) -> Result<bool, String> {
        if let Some(e) = self.namespace_error.lock().unwrap().clone() {
            return Err(e);
        }
        Ok(self.has_namespace(name))
    }

    async fn create_namespace(&self, name: &str) -> Result<(), String> {
        self.created.lock().unwrap().push(name.to_owned());
        self.namespaces.lock().unwrap().insert(name.to_owned());
        Ok(())
    }

    async fn delete_namespace(&self, name: &str) -> Result<(), String> {
        self.deleted.lock().unwrap().push(name.to_owned());
        Ok(())
    }
}

/// A ready Deployment store and its writer.
pub(crate) fn store() -> (Store<Deployment>, Writer<Deployment>) {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
    (store, writer)
}

/// A workspace Deployment at `resource_version`.
pub(crate) fn deployment(name: &str, namespace: &str, resource_version: &str) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": resource_version,
            "labels": {"agent.gitlab.com/id": "1"},
        },
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {}},
        "status": {"replicas": 1, "availableReplicas": 1},
    }))
    .unwrap()
}

/// A workspace GitLab answers with.
pub(crate) fn rails_info(
    name: &str,
    namespace: &str,
    desired: &str,
    actual: &str,
    version: Option<&str>,
    config: &str,
) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "namespace": namespace,
        "desired_state": desired,
        "actual_state": actual,
        "deployment_resource_version": version,
        "config_to_apply": config,
        "image_pull_secrets": [],
    })
}
