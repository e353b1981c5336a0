//! `kube-sim`: a simulated Kubernetes API server, in-process. No real one can be
//! installed on these machines and kube-rs ships none, so agentk, the Graph API and
//! `podgate kube-sim` talk to this. It speaks enough of the real API for `kubectl`
//! and kube-rs clients:
//!
//! - discovery: `/version`, `/api`, `/apis` (groups with their preferred version),
//!   `/api/v1` and `/apis/<group>/<version>`, and the OpenAPI v3 index, where
//!   kubectl learns that the server validates fields itself (so `kubectl apply`
//!   needs no schemas). Served: core pods, configmaps, secrets, namespaces,
//!   serviceaccounts, services, persistentvolumeclaims, persistentvolumes, nodes;
//!   apps deployments, replicasets, statefulsets, daemonsets; batch jobs, cronjobs;
//!   networking.k8s.io ingresses, ingressclasses; storage.k8s.io storageclasses;
//!   scheduling.k8s.io priorityclasses; node.k8s.io runtimeclasses;
//!   apiextensions.k8s.io customresourcedefinitions; the custom kinds `widgets`
//!   (`example.podgate.dev`, in `v1` and `v1beta1`, so version selection matters),
//!   Flux's `kustomizations` (`kustomize.toolkit.fluxcd.io/v1`), `helmreleases`
//!   (`helm.toolkit.fluxcd.io/v2`), `gitrepositories`, `helmrepositories` and
//!   `ocirepositories` (`source.toolkit.fluxcd.io/v1`), each with its
//!   CustomResourceDefinition
//!   stored from the start; events in core and `events.k8s.io`; subresources such
//!   as `pods/status` listed, not served;
//! - list with `resourceVersion`, `labelSelector` (`=`, `==`, `!=`, `in`, `notin`,
//!   `key`, `!key`) and `fieldSelector` (`metadata.name`, `metadata.namespace`,
//!   `status.phase`): what `kubectl get -l … --field-selector …` sends; in pages
//!   with `limit` and `continue` (kubectl's `--chunk-size`, 500 by default, and
//!   kube-runtime's watcher, 500 a page), as kube-apiserver pages them: selectors
//!   applied before the limit, `metadata.continue` and (without selectors)
//!   `remainingItemCount` while more remain, every page as of the first page's
//!   `resourceVersion` (a snapshot sharing the stored objects, kept 5 minutes, at
//!   most 64), `410 Gone` (`Expired`, with the apiserver's message and an
//!   inconsistent-continuation token) once the snapshot is gone, `400` for a token
//!   that does not decode (see `paging`);
//! - watch streams (`ADDED`/`MODIFIED`/`DELETED`, `BOOKMARK` when asked), resumed
//!   from a `resourceVersion`; one older than the retained history gets the real
//!   server's `410 Gone` (an `ERROR` event with an `Expired` status): what
//!   `kubectl get -w` and kube-runtime's watcher consume;
//! - get, create (409 on a duplicate), replace (409 on a stale `resourceVersion`),
//!   merge / strategic-merge / server-side apply patches (`kubectl apply`,
//!   `kubectl label`), delete; errors as `Status` objects, which kubectl prints as
//!   `Error from server (NotFound): …`. Bodies are JSON or YAML: protobuf (which
//!   kubectl's `create <generator>` commands send for built-in kinds) is answered
//!   with 415, as kube-apiserver answers a media type it does not accept;
//! - users: a request is served as the user its `Impersonate-User` (with
//!   `Impersonate-Group`, `-Uid`, `-Extra-*`) names, else as `system:anonymous`;
//!   [`KubeSim::audit`] keeps the last 1,000 requests (verb, path, query, user,
//!   groups);
//! - denials ([`KubeSim::deny`], `--deny apps/deployments`): get, list and watch of
//!   a resource answer `403 Forbidden` with the message kube-apiserver's RBAC
//!   denial carries (`deployments.apps is forbidden: User "…" cannot list resource
//!   "deployments" in API group "apps" at the cluster scope`), which kubectl prints
//!   as `Error from server (Forbidden): …`;
//! - generated clusters ([`KubeSim::generate`], `--objects N`): exactly N objects
//!   exercising every reference the Graph API draws (owner references; volumes,
//!   projected volumes, env and envFrom, ServiceAccounts, image-pull Secrets, Nodes,
//!   classes; Ingress backends and TLS; claims and volumes; Flux sources,
//!   dependencies, inventories; Helm storage Secrets);
//! - churn ([`KubeSim::start_churn`], `--churn PER_S`): creates, updates and deletes
//!   at a steady rate, deterministic from a seed, leaving references realistic
//!   (Pods that mount a ConfigMap not created yet, deletions that leave references
//!   dangling);
//! - [`KubeSim::objects`]: every stored object with its group, storage version and
//!   plural, for tests that compute what a client should see.
//!
//! At 50,000 generated objects the process holds 120–150 MiB after generation and
//! about 250 MiB while serving cluster-wide lists (objects are kept as JSON text,
//! parsed only when asked for); `cargo bench -p podgate-agent --bench kube_sim`
//! measures it.
//!
//! Layout: [`KubeSim`] here is the handle (direct reads and writes, seeding,
//! denials, audit, churn, [`KubeSim::serve`]); `resources` holds the served kinds,
//! discovery documents and CustomResourceDefinitions; `selector` label and field
//! selectors; `patch` body decoding and merge patches; `store` the objects,
//! resource versions and change history; `paging` lists, whole or in pages, and
//! their snapshots; `watch` the watch streams; `http` the
//! request dispatch; `access` impersonation, denials and the audit log; `generate`
//! generated clusters; `churn` the steady changes.

mod access;
mod churn;
mod generate;
mod http;
mod paging;
mod patch;
mod resources;
mod selector;
mod store;
mod watch;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ::http::Method;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde::Deserialize as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;

pub use access::AuditEntry;
pub use churn::{Churn, ChurnStats};
use resources::{KINDS, Kind, NAMESPACES, crd_object, key, kind, kind_named, kind_of};
use store::{Shared, Stored};

/// Errors of kube-sim. None is worth retrying: each names input to fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A seed document could not be read or is not an object kube-sim serves.
    #[error("seed document {document}{}: {message}", name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default())]
    Seed {
        /// Which document, counting from 1.
        document: usize,
        /// `Kind namespace/name`, where the document got that far.
        name: Option<String>,
        /// What is wrong.
        message: String,
    },
}

/// Results of kube-sim.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A simulated cluster: a cheap, cloneable handle on one store. Serve it with
/// [`KubeSim::serve`]; read and write it directly as another client would.
#[derive(Clone)]
pub struct KubeSim {
    shared: Arc<Shared>,
}

impl KubeSim {
    /// A cluster holding the namespaces `default` and `kube-system`, keeping at most
    /// `history_limit` events (at least one) for watch resumption.
    pub fn new(history_limit: usize) -> Self {
        let shared = Arc::new(Shared::new(history_limit));
        for ns in ["default", "kube-system"] {
            shared.apply(
                Method::POST,
                NAMESPACES,
                "",
                None,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}),
            );
        }
        let crds = kind("customresourcedefinitions").expect("served");
        for k in KINDS.iter().filter(|k| k.custom) {
            shared.apply(Method::POST, crds, "", None, crd_object(*k));
        }
        KubeSim { shared }
    }

    /// Deny `get`, `list` and `watch` of `resource` (a plural: `deployments`) in
    /// `group` (`apps`; `""` for the core group): those requests get a `403
    /// Forbidden` `Status` naming the user, as when RBAC does not allow them. Other
    /// resources, and writes, are served as before.
    pub fn deny(&self, group: &str, resource: &str) {
        self.shared.access.deny(group, resource, &[]);
    }

    /// Deny the given `verbs` (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`) of `group`/`resource`, replacing an earlier denial.
    pub fn deny_verbs(&self, group: &str, resource: &str, verbs: &[&str]) {
        self.shared.access.deny(group, resource, verbs);
    }

    /// Lift a denial of `group`/`resource`.
    pub fn allow(&self, group: &str, resource: &str) {
        self.shared.access.allow(group, resource);
    }

    /// Whether `group`/`resource` is served (`apps`/`deployments`, `""`/`pods`).
    pub fn serves(group: &str, resource: &str) -> bool {
        kind_of(group, resource).is_some()
    }

    /// The last requests served (at most 1,000), oldest first: who asked for what.
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.shared.access.audit()
    }

    /// Start changing the cluster at `per_s` steps a second (see the `churn`
    /// module: Deployments scaled with their ReplicaSets and Pods, ConfigMaps and
    /// Pods created, labels, annotations, spec fields and statuses updated, Pods and
    /// ConfigMaps deleted), deterministic from `seed` and the cluster as it is now.
    /// It stops when the returned handle is dropped. Must be called inside a Tokio
    /// runtime.
    pub fn start_churn(&self, per_s: f64, seed: u64) -> Churn {
        churn::start(self.shared.clone(), per_s, seed)
    }

    /// Every stored object, with its kind's group, storage version and plural: what
    /// a test needs to compute a graph independently. Cheap: objects are shared
    /// with the store and parsed only when asked ([`StoredObject::value`]).
    pub fn objects(&self) -> Vec<StoredObject> {
        let store = self.shared.lock();
        let mut out = Vec::with_capacity(store.objects.len());
        for k in KINDS {
            out.extend(store.of(*k).map(|((_, ns, name), o)| StoredObject {
                group: k.group,
                version: k.versions[0],
                resource: k.plural,
                namespaced: k.namespaced,
                namespace: ns.clone(),
                name: name.clone(),
                object: o.clone(),
            }));
        }
        out
    }

    /// Serve the Kubernetes API on `listener` until `shutdown` resolves; then stop
    /// and end every open connection (watches included), as a real API server going
    /// away would. Accept errors (such as running out of file descriptors) are
    /// logged and retried after a short pause.
    pub async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        // Connections live in this set: dropping it ends them.
        let mut connections = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = &mut shutdown => return,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "kube-sim: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            while connections.try_join_next().is_some() {}
            let s = self.shared.clone();
            connections.spawn(async move {
                let svc = service_fn(move |req| {
                    let s = s.clone();
                    async move { Ok::<_, Infallible>(s.handle(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    }

    /// Create or replace an object directly (as another client would); returns the
    /// stored object or a `Status`. `resource` names the kind as kubectl does:
    /// `pods`, `deployments.apps`, or a bare plural served by one group only.
    pub fn put(&self, resource: &str, namespace: &str, object: Value) -> Value {
        let Some(k) = kind(resource) else {
            return http::status(
                ::http::StatusCode::NOT_FOUND,
                "NotFound",
                &format!("the server doesn't have a resource type \"{resource}\""),
            );
        };
        self.put_kind(k, namespace, object)
    }

    fn put_kind(&self, k: Kind, namespace: &str, object: Value) -> Value {
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let exists = self
            .shared
            .lock()
            .objects
            .contains_key(&key(k, namespace, &name));
        let (_, v) = self.shared.apply(
            if exists { Method::PUT } else { Method::POST },
            k,
            namespace,
            Some(&name).filter(|_| exists).map(String::as_str),
            object,
        );
        v
    }

    /// Delete an object directly; whether it existed.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        kind(resource).is_some_and(|k| {
            self.shared
                .apply(Method::DELETE, k, namespace, Some(name), Value::Null)
                .0
                .is_success()
        })
    }

    /// An object, if present (`namespace` is `""` for cluster-scoped kinds), in its
    /// kind's preferred version.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let k = kind(resource)?;
        self.shared
            .lock()
            .objects
            .get(&key(k, namespace, name))
            .map(|s| s.value())
    }

    /// Add a generated cluster of exactly `objects` objects (see the `generate`
    /// module: Nodes and classes; namespaces with apps, Deployments → ReplicaSets →
    /// Pods linked by controller owner references, Ingresses, StatefulSets,
    /// CronJobs, Widgets, Flux Kustomizations and HelmReleases with their sources
    /// and Helm storage Secrets), the same for the same `seed`; returns how many
    /// objects were added.
    pub fn generate(&self, objects: usize, seed: u64) -> usize {
        generate::generate(self, objects, seed)
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Load objects from a multi-document YAML text (`---` between documents), each
    /// created or replaced as [`KubeSim::put`] does; namespaced objects without a
    /// namespace go to `default`. Empty documents are skipped. Returns how many
    /// objects were loaded; on an error, the documents before the bad one stay loaded.
    pub fn load_seed(&self, yaml: &str) -> Result<usize> {
        let mut loaded = 0;
        for (i, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
            let document = i + 1;
            let fail = |name: Option<String>, message: String| Error::Seed {
                document,
                name,
                message,
            };
            let object = Value::deserialize(doc).map_err(|e| fail(None, e.to_string()))?;
            if object.is_null() {
                continue;
            }
            if !object.is_object() {
                return Err(fail(None, "not a mapping".into()));
            }
            let api_version = object["apiVersion"].as_str().unwrap_or("");
            let kind_name = object["kind"].as_str().unwrap_or("");
            let name = object["metadata"]["name"].as_str().unwrap_or("");
            let Some(k) = kind_named(api_version, kind_name) else {
                return Err(fail(
                    None,
                    format!("apiVersion {api_version:?} kind {kind_name:?} is not served"),
                ));
            };
            let namespace = if k.namespaced {
                object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_owned()
            } else {
                String::new()
            };
            let label = if k.namespaced {
                format!("{kind_name} {namespace}/{name}")
            } else {
                format!("{kind_name} {name}")
            };
            if name.is_empty() {
                return Err(fail(Some(label), "metadata.name: Required value".into()));
            }
            let stored = self.put_kind(k, &namespace, object);
            if stored["kind"] == "Status" {
                let message = stored["message"].as_str().unwrap_or("refused").to_owned();
                return Err(fail(Some(label), message));
            }
            loaded += 1;
        }
        Ok(loaded)
    }
}

/// One object as [`KubeSim::objects`] lists it.
#[derive(Clone, Debug)]
pub struct StoredObject {
    /// The API group: `apps`, `""` for the core group.
    pub group: &'static str,
    /// The version objects of the kind are stored (and preferred) in: `v1`.
    pub version: &'static str,
    /// The plural resource name: `deployments`.
    pub resource: &'static str,
    /// Whether the kind lives in namespaces.
    pub namespaced: bool,
    /// The namespace; `""` for cluster-scoped kinds.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    object: Arc<Stored>,
}

impl StoredObject {
    /// The object as stored (in [`StoredObject::version`]), parsed.
    pub fn value(&self) -> Value {
        self.object.value()
    }

    /// The object's JSON text as stored.
    pub fn json(&self) -> &str {
        &self.object.text
    }
}

/// A kubeconfig for a kube-sim at `server_url` (`http://127.0.0.1:<port>`): no
/// authentication, plain HTTP, namespace `default`.
pub fn kubeconfig(server_url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server_url}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\ncurrent-context: test\nusers:\n- name: test\n  user: {{}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_load_and_bad_documents_are_named() {
        let sim = KubeSim::new(10);
        let n = sim
            .load_seed(
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n---\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: apps, labels: {app: web}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: b}\n",
            )
            .unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            sim.get("pods", "apps", "web").unwrap()["status"]["phase"],
            "Pending"
        );
        assert_eq!(
            sim.get("configmaps", "default", "cfg").unwrap()["data"]["a"],
            "b"
        );
        assert!(sim.get("namespaces", "", "apps").is_some());

        let e = sim
            .load_seed("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: d}\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("seed document 2:"), "{e}");
        assert!(e.contains("\"policy/v1\""), "{e}");
        let e = sim
            .load_seed("apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "seed document 1 (Pod x/): metadata.name: Required value");
        let e = sim.load_seed("a: [\n").unwrap_err().to_string();
        assert!(e.starts_with("seed document 1: "), "{e}");
        let e = sim.load_seed("- 1\n").unwrap_err().to_string();
        assert_eq!(e, "seed document 1: not a mapping");
        let e = sim
            .load_seed("apiVersion: v1\nkind: Pod\nmetadata: {name: b}\n---\nkind: [\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("seed document 2: "), "{e}");
        assert!(sim.get("pods", "default", "b").is_some());
    }

    /// When the shutdown future resolves, `serve` returns and open watches end.
    #[tokio::test]
    async fn stopping_ends_open_watches() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let sim = KubeSim::new(10);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn({
            let sim = sim.clone();
            async move {
                sim.serve(listener, async {
                    let _ = stopped.await;
                })
                .await;
            }
        });
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /api/v1/namespaces?watch=true HTTP/1.1\r\nhost: k\r\n\r\n")
            .await
            .unwrap();
        // The synthetic ADDED events arrive: the watch is open.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !String::from_utf8_lossy(&buf).contains("kube-system") {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "watch ended early");
            buf.extend_from_slice(&chunk[..n]);
        }
        stop.send(()).unwrap();
        server.await.unwrap();
        // The connection is closed, not left hanging.
        let closed = async {
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the watch connection closed when the server stopped");
    }

    /// One HTTP/1.1 request to `addr`: (status, body).
    async fn request(
        addr: std::net::SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut req = format!("GET {path} HTTP/1.1\r\nhost: k\r\nconnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap();
        (status, body)
    }

    /// Requests are served as the impersonated user, who the audit log and the
    /// 403 of a denied resource name.
    #[tokio::test]
    async fn impersonated_requests_are_audited_and_denials_name_the_user() {
        let sim = KubeSim::new(10);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn({
            let sim = sim.clone();
            async move { sim.serve(listener, std::future::pending()).await }
        });
        sim.put(
            "deployments",
            "default",
            json!({"metadata": {"name": "web"}, "spec": {}}),
        );

        let (code, _) = request(addr, "/apis/apps/v1/deployments", &[]).await;
        assert_eq!(code, 200);
        sim.deny("apps", "deployments");
        let (code, body) = request(addr, "/apis/apps/v1/deployments", &[]).await;
        assert_eq!(code, 403, "{body}");
        let status: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "Forbidden");
        assert_eq!(
            status["message"],
            r#"deployments.apps is forbidden: User "system:anonymous" cannot list resource "deployments" in API group "apps" at the cluster scope"#
        );
        let as_alice = [
            ("Impersonate-User", "gitlab:user:alice"),
            ("Impersonate-Group", "gitlab:user"),
            ("Impersonate-Group", "gitlab:project_role:7:developer"),
            ("Impersonate-Extra-agent.gitlab.com%2Fid", "9"),
        ];
        let (code, body) = request(
            addr,
            "/apis/apps/v1/namespaces/default/deployments?watch=true",
            &as_alice,
        )
        .await;
        assert_eq!(code, 403);
        assert!(
            body.contains(r#"User \"gitlab:user:alice\" cannot watch resource \"deployments\" in API group \"apps\" in the namespace \"default\""#),
            "{body}"
        );
        let (code, body) = request(
            addr,
            "/apis/apps/v1/namespaces/default/deployments/web",
            &[],
        )
        .await;
        assert_eq!(code, 403);
        assert!(
            body.contains(r#"deployments.apps \"web\" is forbidden"#),
            "{body}"
        );
        // Other resources are served, to the impersonated user too.
        let (code, _) = request(addr, "/api/v1/namespaces/default/pods", &as_alice).await;
        assert_eq!(code, 200);
        // Groups without a user: refused, as kube-apiserver refuses them.
        let (code, body) = request(addr, "/api/v1/pods", &[("Impersonate-Group", "g")]).await;
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("without impersonating a user"), "{body}");
        sim.allow("apps", "deployments");
        let (code, _) = request(addr, "/apis/apps/v1/deployments", &as_alice).await;
        assert_eq!(code, 200);

        let audit = sim.audit();
        let seen: Vec<(&str, &str, Option<&str>)> = audit
            .iter()
            .map(|e| (e.verb.as_str(), e.path.as_str(), e.user.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("list", "/apis/apps/v1/deployments", None),
                ("list", "/apis/apps/v1/deployments", None),
                (
                    "watch",
                    "/apis/apps/v1/namespaces/default/deployments",
                    Some("gitlab:user:alice")
                ),
                (
                    "get",
                    "/apis/apps/v1/namespaces/default/deployments/web",
                    None
                ),
                (
                    "list",
                    "/api/v1/namespaces/default/pods",
                    Some("gitlab:user:alice")
                ),
                ("get", "/api/v1/pods", None),
                (
                    "list",
                    "/apis/apps/v1/deployments",
                    Some("gitlab:user:alice")
                ),
            ]
        );
        let last = audit.last().unwrap();
        assert_eq!(
            last.groups,
            ["gitlab:user", "gitlab:project_role:7:developer"]
        );
        assert_eq!(last.extra["agent.gitlab.com/id"], ["9"]);
        assert!(audit[0].groups.is_empty() && audit[0].extra.is_empty());

        // The log is bounded: the newest 1,000 are kept.
        for _ in 0..access::AUDIT_LIMIT {
            request(addr, "/version", &[]).await;
        }
        let audit = sim.audit();
        assert_eq!(audit.len(), access::AUDIT_LIMIT);
        assert!(
            audit
                .iter()
                .all(|e| e.path == "/version" && e.verb == "get")
        );
        server.abort();
    }

    #[test]
    fn objects_lists_everything_with_its_kind() {
        let sim = KubeSim::new(10);
        sim.put("widgets", "default", json!({"apiVersion": "example.podgate.dev/v1beta1", "kind": "Widget", "metadata": {"name": "w"}}));
        sim.put("nodes", "", json!({"metadata": {"name": "worker-0"}}));
        let objects = sim.objects();
        let find = |resource: &str, name: &str| {
            objects
                .iter()
                .find(|o| o.resource == resource && o.name == name)
                .unwrap_or_else(|| panic!("{resource} {name}"))
        };
        let w = find("widgets", "w");
        assert_eq!(
            (w.group, w.version, w.namespaced),
            ("example.podgate.dev", "v1", true)
        );
        assert_eq!(w.namespace, "default");
        assert_eq!(
            w.value()["apiVersion"],
            "example.podgate.dev/v1",
            "stored in the preferred version"
        );
        assert!(w.json().contains("\"name\":\"w\""));
        let n = find("nodes", "worker-0");
        assert_eq!(
            (n.group, n.namespaced, n.namespace.as_str()),
            ("", false, "")
        );
        // The CustomResourceDefinitions of every custom kind.
        let crds: Vec<&str> = objects
            .iter()
            .filter(|o| o.resource == "customresourcedefinitions")
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(
            crds,
            [
                "gitrepositories.source.toolkit.fluxcd.io",
                "helmreleases.helm.toolkit.fluxcd.io",
                "helmrepositories.source.toolkit.fluxcd.io",
                "kustomizations.kustomize.toolkit.fluxcd.io",
                "ocirepositories.source.toolkit.fluxcd.io",
                "widgets.example.podgate.dev",
            ]
        );
        let crd = find("customresourcedefinitions", "widgets.example.podgate.dev").value();
        assert_eq!(crd["spec"]["versions"][1]["name"], "v1beta1");
        assert_eq!(crd["spec"]["versions"][1]["storage"], false);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(objects.len(), 2 + 6 + 2);
    }
}
