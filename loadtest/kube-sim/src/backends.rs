//! Service backends and the endpoints controller: while a Deployment has available
//! replicas, every Service of its namespace whose selector matches its Pod
//! template's labels gets a small HTTP server per Service port on `127.0.0.1:0`
//! (`200 text/plain` naming the Deployment, the Service and port, the method and
//! the path), and the Service's `Endpoints` (same name) lists `127.0.0.1` with the
//! bound ports under the Service ports' names, as the endpoints controller
//! (`pkg/controller/endpoint`) publishes Pod addresses. When the Deployment scales
//! to 0 or goes, its servers stop and the `Endpoints` lose its subset; a Service's
//! `Endpoints` go with the Service. Each Deployment's part is mirrored in an
//! `EndpointSlice` (`discovery.k8s.io/v1`) labelled `kubernetes.io/service-name`.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::controller::{MANAGER, deployments};
use super::resources::{Kind, key, kind};
use super::rollout::template_hash;
use super::store::{Shared, Write, now};

/// The annotation the endpoints controller sets; kube-sim also reads it as "managed here".
const TRIGGER: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The label naming who manages an EndpointSlice, and the controller's value.
const SLICE_MANAGER: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";

/// (namespace, service, deployment, service port).
type BackendKey = (String, String, String, i64);

/// One running backend server; dropping it stops it.
#[derive(Debug)]
struct Backend {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The running backends.
#[derive(Debug, Default)]
pub(super) struct Backends {
    running: BTreeMap<BackendKey, Backend>,
}

fn services() -> Kind {
    kind("services").expect("served")
}

fn endpoints() -> Kind {
    kind("endpoints").expect("served")
}

fn in_namespace(shared: &Shared, k: Kind, ns: &str) -> Vec<Value> {
    shared
        .lock()
        .in_namespace(k, ns)
        .map(|(_, o)| o.value())
        .collect()
}

/// Whether every `selector` label is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object().filter(|s| !s.is_empty()) else {
        return false;
    };
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl Backends {
    /// Bring namespace `ns`'s backends and `Endpoints` in line with its Services and
    /// Deployments.
    pub(super) async fn reconcile(&mut self, shared: &Shared, ns: &str) {
        let svcs = in_namespace(shared, services(), ns);
        let deploys = in_namespace(shared, deployments(), ns);
        // (service → [(deployment, port, port name, protocol)])
        let mut want: BTreeMap<String, Vec<(String, i64, Value, Value)>> = BTreeMap::new();
        for svc in &svcs {
            let selector = &svc["spec"]["selector"];
            if selector.as_object().is_none_or(|s| s.is_empty()) {
                continue;
            }
            let svc_name = svc["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let entry = want.entry(svc_name).or_default();
            for d in &deploys {
                let up = d["status"]["availableReplicas"].as_i64().unwrap_or(0) > 0
                    && d["metadata"]["deletionTimestamp"].is_null();
                if !up || !selects(selector, &d["spec"]["template"]["metadata"]["labels"]) {
                    continue;
                }
                let d_name = d["metadata"]["name"].as_str().unwrap_or("").to_owned();
                for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
                    if let Some(port) = p["port"].as_i64() {
                        entry.push((
                            d_name.clone(),
                            port,
                            p["name"].clone(),
                            p["protocol"].clone(),
                        ));
                    }
                }
            }
        }
        let wanted: BTreeSet<BackendKey> = want
            .iter()
            .flat_map(|(svc, list)| {
                list.iter()
                    .map(move |(d, port, _, _)| (ns.to_owned(), svc.clone(), d.clone(), *port))
            })
            .collect();
        // Stopped before the Endpoints say so: once they do, the ports are closed.
        let gone: Vec<BackendKey> = self
            .running
            .keys()
            .filter(|k| k.0 == ns && !wanted.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(mut b) = self.running.remove(&k) {
                b.task.abort();
                let _ = (&mut b.task).await;
            }
        }
        for k in wanted {
            if self.running.contains_key(&k) {
                continue;
            }
            match start(&k).await {
                Ok(b) => {
                    self.running.insert(k, b);
                }
                Err(e) => {
                    tracing::warn!(error = %e, service = %k.1, "kube-sim: a Service backend could not listen")
                }
            }
        }
        // EndpointSlice name → (Service, ports), one a Deployment.
        let mut slices: BTreeMap<String, (String, Vec<Value>)> = BTreeMap::new();
        let mut updates = Vec::new();
        for (svc_name, list) in &want {
            let mut by_deploy: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
            for (d, port, name, protocol) in list {
                let Some(b) =
                    self.running
                        .get(&(ns.to_owned(), svc_name.clone(), d.clone(), *port))
                else {
                    continue;
                };
                let mut p = json!({"port": b.port, "protocol": if protocol.is_null() { json!("TCP") } else { protocol.clone() }});
                if !name.is_null() {
                    p["name"] = name.clone();
                }
                by_deploy.entry(d).or_default().push(p);
            }
            slices.extend(by_deploy.iter().map(|(d, ports)| {
                let name = format!("{svc_name}-{}", &template_hash(&json!([svc_name, d]))[..5]);
                (name, (svc_name.clone(), ports.clone()))
            }));
            let subsets: Vec<Value> = by_deploy
                .into_values()
                .map(|ports| json!({"addresses": [{"ip": "127.0.0.1"}], "ports": ports}))
                .collect();
            updates.push((svc_name, subsets));
        }
        // Slices first: once the Endpoints say so, the slices do too.
        publish_slices(shared, ns, &slices);
        for (svc_name, subsets) in updates {
            publish(shared, ns, svc_name, subsets);
        }
        // Endpoints of Services that are gone.
        for ep in in_namespace(shared, endpoints(), ns) {
            let name = ep["metadata"]["name"].as_str().unwrap_or("");
            if !want.contains_key(name) && !ep["metadata"]["annotations"][TRIGGER].is_null() {
                shared.apply(Method::DELETE, endpoints(), ns, Some(name), Value::Null);
            }
        }
    }
}

/// Write Service `svc`'s `Endpoints` when its subsets differ.
fn publish(shared: &Shared, ns: &str, svc: &str, subsets: Vec<Value>) {
    let current = shared
        .lock()
        .objects
        .get(&key(endpoints(), ns, svc))
        .map(|s| s.value());
    let subsets = if subsets.is_empty() {
        Value::Null
    } else {
        json!(subsets)
    };
    if current.as_ref().is_some_and(|c| c["subsets"] == subsets) {
        return;
    }
    let mut o = json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": svc, "namespace": ns, "annotations": {TRIGGER: now()}},
    });
    if !subsets.is_null() {
        o["subsets"] = subsets;
    }
    let method = if current.is_some() {
        Method::PUT
    } else {
        Method::POST
    };
    shared.write(Write {
        manager: Some(MANAGER.to_owned()),
        lifecycle: true,
        ..Write::new(method, endpoints(), ns, Some(svc), o)
    });
}

/// Make namespace `ns`'s managed EndpointSlices these (name → (Service, ports)),
/// as the EndpointSlice controller (`pkg/controller/endpointslice`) mirrors what the
/// Endpoints say: labelled with the Service's name, owned by it.
fn publish_slices(shared: &Shared, ns: &str, want: &BTreeMap<String, (String, Vec<Value>)>) {
    let slices = kind("endpointslices.discovery.k8s.io").expect("served");
    for current in in_namespace(shared, slices, ns) {
        let name = current["metadata"]["name"].as_str().unwrap_or("");
        if current["metadata"]["labels"][SLICE_MANAGER] == SLICE_CONTROLLER
            && !want.contains_key(name)
        {
            shared.apply(Method::DELETE, slices, ns, Some(name), Value::Null);
        }
    }
    for (name, (svc, ports)) in want {
        let service = shared
            .lock()
            .objects
            .get(&key(services(), ns, svc))
            .map(|s| s.value());
        let Some(service) = service else { continue };
        let o = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": ns,
                "generateName": format!("{svc}-"),
                "labels": {"kubernetes.io/service-name": svc, SLICE_MANAGER: SLICE_CONTROLLER},
                "ownerReferences": super::generate::controller_ref(&service),
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false}}],
            "ports": ports,
        });
        let current = shared
            .lock()
            .objects
            .get(&key(slices, ns, name))
            .map(|s| s.value());
        if current
            .as_ref()
            .is_some_and(|c| c["ports"] == o["ports"] && c["endpoints"] == o["endpoints"])
        {
            continue;
        }
        let method = if current.is_some() {
            Method::PUT
        } else {
            Method::POST
        };
        shared.write(Write {
            manager: Some("endpointslice-controller".to_owned()),
            lifecycle: true,
            ..Write::new(method, slices, ns, Some(name), o)
        });
    }
}

/// Listen on `127.0.0.1:0` and answer every request with what it reached.
async fn start(k: &BackendKey) -> std::io::Result<Backend> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (ns, svc, deploy, svc_port) = k.clone();
    let who: Arc<str> = format!("deployment {ns}/{deploy}, service {svc} port {svc_port}").into();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            while connections.try_join_next().is_some() {}
            let who = who.clone();
            connections.spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let text = format!(
                        "kube-sim backend: {who}: {} {}\n",
                        req.method(),
                        req.uri().path_and_query().map_or("/", |p| p.as_str())
                    );
                    async move {
                        let mut r = Response::new(Full::new(Bytes::from(text)));
                        r.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("text/plain; charset=utf-8"),
                        );
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(Backend { port, task })
}
