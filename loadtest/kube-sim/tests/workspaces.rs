//! kube-sim grown for Workspaces, checked with kube-rs and the real `kubectl`: the
//! new kinds in discovery, server-side apply with field ownership, namespace
//! deletion, the Deployment controller with its faults, and Service backends.

use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::watcher;
use podgate_kube_sim::Settings;
use podgate_testkit::kube::{KubeTestServer, Kubectl};
use serde_json::{Value, json};

fn client(server: &KubeTestServer) -> kube::Client {
    let config = kube::Config::new(server.url().parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// How long a wait for the simulated cluster may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

fn managers(o: &Value) -> Vec<(String, String)> {
    o["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap().to_owned(),
                e["operation"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_the_other_new_kinds_are_discovered_and_served() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let client = client(&server);
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    for (group, kind) in [
        ("coordination.k8s.io", "Lease"),
        ("networking.k8s.io", "NetworkPolicy"),
        ("", "ResourceQuota"),
        ("", "Endpoints"),
        ("discovery.k8s.io", "EndpointSlice"),
    ] {
        let gvk = kube::api::GroupVersionKind::gvk(group, "v1", kind);
        assert!(
            discovery.resolve_gvk(&gvk).is_some(),
            "{kind} not discovered"
        );
    }

    // A Lease as client-go's leader election uses it: create, then replace with
    // the resourceVersion as an optimistic lock.
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "agent-1"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut next = created.clone();
    next.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("agent-1", &PostParams::default(), &next)
        .await
        .unwrap();
    // The stale one loses.
    let e = leases
        .replace("agent-1", &PostParams::default(), &next)
        .await
        .unwrap_err();
    assert!(matches!(e, kube::Error::Api(ref s) if s.code == 409), "{e}");
    let got = leases.get("agent-1").await.unwrap();
    assert_eq!(got.spec.unwrap().holder_identity.as_deref(), Some("b"));

    let k = Kubectl::new(&server);
    let out = k.ok(&["api-resources", "-o", "name"], None);
    for want in [
        "leases.coordination.k8s.io",
        "networkpolicies.networking.k8s.io",
        "resourcequotas",
        "endpoints",
        "endpointslices.discovery.k8s.io",
    ] {
        assert!(out.lines().any(|l| l == want), "{want} missing from\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_records_owners_conflicts_and_removes_dropped_fields() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client(&server), "default");
    let apply = |manager: &str, force: bool| {
        let mut p = PatchParams::apply(manager);
        p.force = force;
        p
    };
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "labels": {"app": "ws"}}, "data": {"a": "1", "b": "2"}});
    let cm = cms
        .patch("cfg", &apply("agentk", false), &Patch::Apply(&config))
        .await
        .unwrap();
    let v = serde_json::to_value(&cm).unwrap();
    assert_eq!(managers(&v), [("agentk".into(), "Apply".into())]);
    let entry = &v["metadata"]["managedFields"][0];
    assert_eq!(entry["apiVersion"], "v1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:data": {"f:a": {}, "f:b": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
    );

    // Another manager changes a.
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "9"}});
    let e = cms
        .patch("cfg", &apply("other", false), &Patch::Apply(&other))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e}")
    };
    assert_eq!(s.code, 409);
    assert_eq!(s.reason, "Conflict");
    assert_eq!(
        s.message,
        "Apply failed with 1 conflict: conflict with \"agentk\": .data.a"
    );
    // Forced, it moves.
    let cm = cms
        .patch("cfg", &apply("other", true), &Patch::Apply(&other))
        .await
        .unwrap();
    assert_eq!(cm.data.as_ref().unwrap()["a"], "9");
    let v = serde_json::to_value(&cm).unwrap();
    assert_eq!(
        managers(&v),
        [
            ("agentk".into(), "Apply".into()),
            ("other".into(), "Apply".into())
        ]
    );
    assert_eq!(
        v["metadata"]["managedFields"][0]["fieldsV1"]["f:data"],
        json!({"f:b": {}})
    );

    // agentk stops applying b and the label: both go (nobody else owns them);
    // a stays (other owns it).
    let less =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}});
    let cm = cms
        .patch("cfg", &apply("agentk", false), &Patch::Apply(&less))
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap().into_iter().collect::<Vec<_>>(),
        [("a".to_owned(), "9".to_owned())]
    );
    assert!(cm.metadata.labels.unwrap_or_default().is_empty());

    // A merge patch records an Update for its manager.
    let cm = cms
        .patch(
            "cfg",
            &PatchParams {
                field_manager: Some("editor".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"data": {"c": "3"}})),
        )
        .await
        .unwrap();
    let v = serde_json::to_value(&cm).unwrap();
    let update = v["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "editor")
        .unwrap()
        .clone();
    assert_eq!(update["operation"], "Update");
    assert_eq!(update["fieldsV1"], json!({"f:data": {"f:c": {}}}));

    // An apply without a field manager is refused as the apiserver refuses it.
    let (code, body) = raw_patch(
        &server,
        "/api/v1/namespaces/default/configmaps/cfg",
        "application/apply-patch+yaml",
        "data: {d: '4'}",
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        body["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
}

/// A PATCH straight to kube-sim: (status, body).
async fn raw_patch(
    server: &KubeTestServer,
    path: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = server.url().trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "PATCH {path} HTTP/1.1\r\nhost: k\r\nconnection: close\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let code = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw.split_once("\r\n\r\n").unwrap().1;
    (code, serde_json::from_str(body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_shows_managed_fields_and_conflicts() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let k = Kubectl::new(&server);
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  key: one\n";
    let out = k.ok(&["apply", "--server-side", "-f", "-"], Some(cm));
    assert!(out.contains("configmap/web serverside-applied"), "{out}");
    let out = k.ok(
        &[
            "get",
            "configmap",
            "web",
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(managers(&v), [("kubectl".into(), "Apply".into())]);
    assert_eq!(
        v["metadata"]["managedFields"][0]["fieldsV1"],
        json!({"f:data": {"f:key": {}}})
    );

    let changed = cm.replace("key: one", "key: two");
    let err = k.fails(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "someone-else",
            "-f",
            "-",
        ],
        Some(&changed),
    );
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .data.key"),
        "{err}"
    );
    let out = k.ok(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "someone-else",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&changed),
    );
    assert!(out.contains("serverside-applied"), "{out}");
    let v = server.get("configmaps", "default", "web").unwrap();
    assert_eq!(v["data"]["key"], "two");
    assert_eq!(managers(&v), [("someone-else".into(), "Apply".into())]);

    // kubectl label: an Update by kubectl-label, next to the applier.
    k.ok(&["label", "configmap", "web", "team=a"], None);
    let v = server.get("configmaps", "default", "web").unwrap();
    assert_eq!(
        managers(&v),
        [
            ("someone-else".into(), "Apply".into()),
            ("kubectl-label".into(), "Update".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_terminates_it_deletes_its_contents_then_it() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let sim = server.sim();
    // Held Terminating until the test lets go.
    sim.set_settings(Settings {
        namespace_delete_delay: Duration::from_secs(3600),
        ..Settings::default()
    })
    .unwrap();
    let client = client(&server);
    let k = Kubectl::new(&server);
    // kubectl's `create <generator>` commands send protobuf, which kube-sim does
    // not speak: objects go in as YAML.
    let cm = |ns: &str, name: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  a: b\n"
        )
    };
    // A missing namespace: 404, as the apiserver says it.
    let err = k.fails(&["apply", "-f", "-"], Some(&cm("nowhere", "c")));
    assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");

    k.ok(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n"),
    );
    k.ok(&["apply", "-f", "-"], Some(&cm("shop", "c")));
    k.ok(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: shop\nstringData:\n  a: b\n"),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    let mut events = watcher::watcher(cms.clone(), watcher::Config::default()).boxed();
    // Wait until the watch has its initial list.
    loop {
        match events.next().await.unwrap().unwrap() {
            watcher::Event::InitDone => break,
            _ => continue,
        }
    }

    let out = k.ok(&["delete", "namespace", "shop", "--wait=false"], None);
    assert!(out.contains("namespace \"shop\" deleted"), "{out}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = namespaces.get("shop").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    assert!(ns.metadata.deletion_timestamp.is_some());
    let err = k.fails(&["apply", "-f", "-"], Some(&cm("shop", "late")));
    assert!(
        err.contains("configmaps \"late\" is forbidden: unable to create new content in namespace shop because it is being terminated"),
        "{err}"
    );
    let err = k.fails(&["delete", "namespace", "shop", "--wait=false"], None);
    assert!(
        err.contains("The system is ensuring all content is removed"),
        "{err}"
    );
    let err = k.fails(&["delete", "namespace", "default", "--wait=false"], None);
    assert!(err.contains("this namespace may not be deleted"), "{err}");

    // Let go: the ConfigMap's DELETED arrives, then the namespace is gone.
    sim.set_settings(Settings::default()).unwrap();
    let deleted = tokio::time::timeout(PATIENCE, async {
        loop {
            if let watcher::Event::Delete(cm) = events.next().await.unwrap().unwrap() {
                return cm;
            }
        }
    })
    .await
    .expect("the ConfigMap's DELETED event");
    assert_eq!(deleted.metadata.name.as_deref(), Some("c"));
    wait_for(namespaces, "shop", |ns: Option<&Namespace>| ns.is_none()).await;
    assert!(server.get("secrets", "shop", "s").is_none());
    let err = k.fails(&["get", "namespace", "shop"], None);
    assert!(err.contains("namespaces \"shop\" not found"), "{err}");
}

/// A Deployment of `replicas` running `image`, its Pods labelled `app: <name>`.
fn deployment(name: &str, replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": image}]},
            },
        },
    })
}

/// Server-side apply of [`deployment`]`(name, replicas, image)` by `agentk`,
/// forced.
async fn apply_deployment(
    api: &Api<Deployment>,
    name: &str,
    replicas: i64,
    image: &str,
) -> kube::Result<Deployment> {
    let apply = PatchParams::apply("agentk").force();
    api.patch(
        name,
        &apply,
        &Patch::Apply(deployment(name, replicas, image)),
    )
    .await
}

/// Wait (at most [`PATIENCE`]) until object `name` of `api` satisfies `cond`:
/// the object then.
async fn wait_for<K>(api: Api<K>, name: &str, cond: impl Condition<K>) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::time::timeout(PATIENCE, await_condition(api, name, cond))
        .await
        .expect("the condition in time")
        .expect("the watch runs")
}

/// kube-sim's stored objects of `resource` (a plural).
fn stored(server: &KubeTestServer, resource: &str) -> Vec<podgate_kube_sim::StoredObject> {
    server
        .sim()
        .objects()
        .into_iter()
        .filter(|o| o.resource == resource)
        .collect()
}

fn condition<'a>(d: &'a Deployment, kind: &str) -> Option<(&'a str, &'a str, &'a str)> {
    let c = d
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)?;
    Some((
        c.status.as_str(),
        c.reason.as_deref().unwrap_or(""),
        c.message.as_deref().unwrap_or(""),
    ))
}

/// A watch on one Deployment, opened before the change it is to see.
struct Watch {
    stream: futures_util::stream::BoxStream<
        'static,
        Result<watcher::Event<Deployment>, watcher::Error>,
    >,
}

impl Watch {
    /// Open it, and wait until its initial list is in.
    async fn new(api: &Api<Deployment>, name: &str) -> Watch {
        let mut stream = watcher::watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .boxed();
        loop {
            if let watcher::Event::InitDone = stream.next().await.unwrap().unwrap() {
                return Watch { stream };
            }
        }
    }

    /// Wait until the Deployment satisfies `done`, collecting the Progressing
    /// reasons seen on the way.
    async fn until(&mut self, done: impl Fn(&Deployment) -> bool) -> (Deployment, Vec<String>) {
        let mut reasons: Vec<String> = Vec::new();
        tokio::time::timeout(PATIENCE, async {
            loop {
                let d = match self.stream.next().await.unwrap().unwrap() {
                    watcher::Event::Apply(d) | watcher::Event::InitApply(d) => d,
                    _ => continue,
                };
                if let Some((_, reason, _)) = condition(&d, "Progressing")
                    && reasons.last().map(String::as_str) != Some(reason)
                {
                    reasons.push(reason.to_owned());
                }
                if done(&d) {
                    return (d, reasons);
                }
            }
        })
        .await
        .expect("the Deployment reached the state awaited")
    }
}

fn available(d: &Deployment) -> i32 {
    d.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_progress_become_available_and_stop_like_kube_controller_manager() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let _controllers = server.sim().start_controllers();
    let api: Api<Deployment> = Api::namespaced(client(&server), "default");
    let mut watch = Watch::new(&api, "web").await;
    apply_deployment(&api, "web", 1, "nginx:1.27")
        .await
        .unwrap();
    let (d, reasons) = watch
        .until(|d| condition(d, "Progressing").is_some_and(|c| c.1 == "NewReplicaSetAvailable"))
        .await;
    // The stages, as a watcher of a real cluster sees them.
    assert_eq!(
        reasons,
        [
            "NewReplicaSetCreated",
            "ReplicaSetUpdated",
            "NewReplicaSetAvailable"
        ]
    );
    let status = d.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.replicas, Some(1));
    assert_eq!(status.updated_replicas, Some(1));
    assert_eq!(status.ready_replicas, Some(1));
    assert_eq!(status.available_replicas, Some(1));
    assert_eq!(status.unavailable_replicas, None);
    let rs_name = stored(&server, "replicasets")[0].name.clone();
    assert!(rs_name.starts_with("web-"), "{rs_name}");
    assert_eq!(
        condition(&d, "Progressing").unwrap(),
        (
            "True",
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{rs_name}\" has successfully progressed.").as_str()
        )
    );
    assert_eq!(
        condition(&d, "Available").unwrap(),
        (
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability."
        )
    );
    let pods = stored(&server, "pods");
    assert_eq!(pods.len(), 1);
    let pod = pods[0].value();
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["name"], rs_name);
    assert_eq!(pod["metadata"]["labels"]["app"], "web");
    assert_eq!(
        d.metadata.annotations.unwrap()["deployment.kubernetes.io/revision"],
        "1"
    );
    // The status is the controller's: its managedFields entry says so.
    let v = serde_json::to_value(api.get("web").await.unwrap()).unwrap();
    assert!(
        v["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["manager"] == "kube-controller-manager" && e["subresource"] == "status"),
        "{v}"
    );

    // Stopped: replicas 0; the Pod goes, the Deployment stays complete.
    apply_deployment(&api, "web", 0, "nginx:1.27")
        .await
        .unwrap();
    // Stopping first: the last replica still available, as GitLab's state
    // calculator sees a stopping workspace (spec.replicas 0, availableReplicas 1).
    let (d, _) = watch
        .until(|d| d.status.as_ref().and_then(|s| s.observed_generation) == Some(2))
        .await;
    assert_eq!(available(&d), 1);
    let (d, _) = watch
        .until(|d| {
            d.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
                && available(d) == 0
                && d.status.as_ref().and_then(|s| s.replicas).is_none()
        })
        .await;
    assert_eq!(
        condition(&d, "Progressing").unwrap().1,
        "NewReplicaSetAvailable"
    );
    assert_eq!(
        condition(&d, "Available").unwrap().1,
        "MinimumReplicasAvailable"
    );
    assert!(stored(&server, "pods").is_empty(), "the Pod is gone");

    // Started again: unavailable until its Pod runs.
    apply_deployment(&api, "web", 1, "nginx:1.27")
        .await
        .unwrap();
    let (d, _) = watch
        .until(|d| d.status.as_ref().and_then(|s| s.unavailable_replicas) == Some(1))
        .await;
    assert_eq!(
        condition(&d, "Available").unwrap().1,
        "MinimumReplicasUnavailable"
    );
    watch.until(|d| available(d) == 1).await;

    // Deleted: its ReplicaSet and Pods go with it.
    api.delete("web", &DeleteParams::default()).await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client(&server), "default");
    tokio::time::timeout(PATIENCE, async {
        let mut stream = watcher::watcher(pods, watcher::Config::default()).boxed();
        let mut live = std::collections::BTreeSet::new();
        loop {
            match stream.next().await.unwrap().unwrap() {
                watcher::Event::InitApply(p) | watcher::Event::Apply(p) => {
                    live.insert(p.metadata.name.unwrap());
                }
                watcher::Event::Delete(p) => {
                    live.remove(&p.metadata.name.unwrap());
                }
                watcher::Event::InitDone if live.is_empty() => break,
                _ => {}
            }
            if live.is_empty() {
                break;
            }
        }
    })
    .await
    .unwrap();
    assert!(stored(&server, "replicasets").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashlooping_deployment_exceeds_its_progress_deadline() {
    let server = KubeTestServer::start(1000).await.unwrap();
    server
        .sim()
        .set_settings(Settings {
            progress_deadline_factor: 0.5,
            ..Settings::default()
        })
        .unwrap();
    let _controllers = server.sim().start_controllers();
    let api: Api<Deployment> = Api::namespaced(client(&server), "default");
    let mut d = deployment("crash", 1, "busybox:crashloop");
    // 3 s once scaled: room for the Pod to start (300 ms) on a busy machine before
    // the deadline passes.
    d["spec"]["progressDeadlineSeconds"] = json!(6);
    let mut watch = Watch::new(&api, "crash").await;
    api.patch("crash", &PatchParams::apply("agentk"), &Patch::Apply(d))
        .await
        .unwrap();
    let (d, reasons) = watch
        .until(|d| condition(d, "Progressing").is_some_and(|c| c.1 == "ProgressDeadlineExceeded"))
        .await;
    assert_eq!(
        reasons,
        [
            "NewReplicaSetCreated",
            "ReplicaSetUpdated",
            "ProgressDeadlineExceeded"
        ]
    );
    let (status, _, message) = condition(&d, "Progressing").unwrap();
    assert_eq!(status, "False");
    assert!(
        message.starts_with("ReplicaSet \"crash-")
            && message.ends_with("\" has timed out progressing."),
        "{message}"
    );
    assert_eq!(
        condition(&d, "Available").unwrap(),
        (
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability."
        )
    );
    let s = d.status.unwrap();
    assert_eq!(s.unavailable_replicas, Some(1));
    assert_eq!(s.available_replicas, None);
    let pod = stored(&server, "pods")[0].value();
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"], "CrashLoopBackOff",
        "{pod}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_bad_service_ports_and_refused_names() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let client = client(&server);
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "x"},
        "spec": {"selector": {"app": "x"}, "ports": [{"name": "http", "port": 70000}]},
    }))
    .unwrap();
    let e = services
        .create(&PostParams::default(), &svc)
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e}")
    };
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "Service \"x\" is invalid: spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive"
    );

    server
        .sim()
        .refuse("deployments", "^refused-", "policy forbids this workspace")
        .unwrap();
    let api: Api<Deployment> = Api::namespaced(client, "default");
    let e = apply_deployment(&api, "refused-1", 1, "nginx")
        .await
        .unwrap_err();
    let kube::Error::Api(s) = e else {
        panic!("{e}")
    };
    assert_eq!(s.code, 400);
    assert_eq!(
        s.message,
        "admission webhook \"refuse.kube-sim.podgate.dev\" denied the request: policy forbids this workspace"
    );
    // Other names are served.
    apply_deployment(&api, "fine", 1, "nginx").await.unwrap();
    assert!(server.sim().refuse("nothing", ".", "x").is_err());
    assert!(server.sim().refuse("pods", "(", "x").is_err());
}

/// One GET to `127.0.0.1:port`: (status, body), or the connect error.
async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: ws\r\nconnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let code = raw
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_of_an_available_deployment_get_backends_and_endpoints() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let _controllers = server.sim().start_controllers();
    let client = client(&server);
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "ws"},
        "spec": {"selector": {"app": "ws"}, "ports": [
            {"name": "editor", "port": 60001, "targetPort": 60001},
            {"name": "ssh", "port": 60022},
        ]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(client.clone(), "default");
    apply_deployment(&api, "ws", 1, "nginx").await.unwrap();
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let ep = wait_for(endpoints.clone(), "ws", |e: Option<&Endpoints>| {
        e.is_some_and(|e| e.subsets.as_ref().is_some_and(|s| !s.is_empty()))
    })
    .await
    .unwrap();
    let subset = &ep.subsets.unwrap()[0];
    assert_eq!(subset.addresses.as_ref().unwrap()[0].ip, "127.0.0.1");
    let ports = subset.ports.clone().unwrap();
    let editor = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("editor"))
        .unwrap()
        .port;
    assert!(ports.iter().any(|p| p.name.as_deref() == Some("ssh")));
    // Mirrored in an EndpointSlice of the Service.
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), "default");
    let list = slices
        .list(&kube::api::ListParams::default().labels("kubernetes.io/service-name=ws"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let slice = &list.items[0];
    assert_eq!(slice.endpoints[0].addresses, ["127.0.0.1"]);
    assert!(
        slice
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .any(|p| p.name.as_deref() == Some("editor") && p.port == Some(editor))
    );
    let (code, body) = http_get(editor as u16, "/some/path?x=1").await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body,
        "kube-sim backend: deployment default/ws, service ws port 60001: GET /some/path?x=1\n"
    );

    // Scaled to 0: the Endpoints are emptied and the port closed.
    apply_deployment(&api, "ws", 0, "nginx").await.unwrap();
    wait_for(endpoints.clone(), "ws", |e: Option<&Endpoints>| {
        e.is_some_and(|e| e.subsets.as_ref().is_none_or(|s| s.is_empty()))
    })
    .await;
    assert!(
        http_get(editor as u16, "/").await.is_err(),
        "the backend stopped"
    );
    let list = slices
        .list(&kube::api::ListParams::default().labels("kubernetes.io/service-name=ws"))
        .await
        .unwrap();
    assert!(
        list.items.is_empty(),
        "the EndpointSlice went with the backends"
    );

    // Service deleted: its Endpoints go too.
    services
        .delete("ws", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(endpoints, "ws", |e: Option<&Endpoints>| e.is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_workspace_namespace_takes_its_running_deployment_with_it() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let _controllers = server.sim().start_controllers();
    let client = client(&server);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "gl-rd-ns-1-1-abc"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<Deployment> = Api::namespaced(client.clone(), "gl-rd-ns-1-1-abc");
    let services: Api<Service> = Api::namespaced(client.clone(), "gl-rd-ns-1-1-abc");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "ws"},
        "spec": {"selector": {"app": "ws"}, "ports": [{"name": "editor", "port": 60001}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let mut watch = Watch::new(&api, "ws").await;
    apply_deployment(&api, "ws", 1, "nginx").await.unwrap();
    watch.until(|d| available(d) == 1).await;

    namespaces
        .delete("gl-rd-ns-1-1-abc", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(namespaces, "gl-rd-ns-1-1-abc", |n: Option<&Namespace>| {
        n.is_none()
    })
    .await;
    // Nothing is left in it, and nothing came back: the controllers' creates meet
    // the namespace lifecycle too.
    let left: Vec<String> = server
        .sim()
        .objects()
        .into_iter()
        .filter(|o| o.namespace == "gl-rd-ns-1-1-abc")
        .map(|o| format!("{} {}", o.resource, o.name))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let e = apply_deployment(&api, "ws", 1, "nginx").await.unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 404 && s.message == "namespaces \"gl-rd-ns-1-1-abc\" not found"),
        "{e}"
    );
}
