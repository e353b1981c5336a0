//! `kube-sim`: a simulated Kubernetes API server, in-process. No real one can be
//! installed on these machines and kube-rs ships none, so agentk, the Graph API and
//! `podgate kube-sim` talk to this. It speaks enough of the real API for `kubectl`
//! and kube-rs clients:
//!
//! - discovery: `/version`, `/api`, `/apis` (groups with their preferred version),
//!   `/api/v1` and `/apis/<group>/<version>`, and the OpenAPI v3 index, where
//!   kubectl learns that the server validates fields itself (so `kubectl apply`
//!   needs no schemas). Served: core pods, configmaps, secrets, namespaces,
//!   serviceaccounts, services, persistentvolumeclaims, persistentvolumes, nodes,
//!   resourcequotas, endpoints; apps deployments, replicasets, statefulsets,
//!   daemonsets; batch jobs, cronjobs; networking.k8s.io ingresses, ingressclasses,
//!   networkpolicies; coordination.k8s.io leases; discovery.k8s.io endpointslices;
//!   rbac.authorization.k8s.io roles, rolebindings, clusterroles and
//!   clusterrolebindings;
//!   storage.k8s.io storageclasses;
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
//!   merge / strategic-merge patches (`kubectl apply`, `kubectl label`), delete;
//!   `dryRun=All` answered, not stored; errors as `Status` objects, which kubectl
//!   prints as `Error from server (NotFound): …`. Bodies are JSON or YAML: protobuf
//!   (which kubectl's `create <generator>` commands send for built-in kinds) is
//!   answered with 415, as kube-apiserver answers a media type it does not accept;
//! - field ownership (`ssa`, `fieldset`): every API write records
//!   `metadata.managedFields` (`Update` entries for creates, replaces and merge
//!   patches, by `fieldManager` or the user agent's first word, as kube-apiserver
//!   names the manager); server-side apply (`application/apply-patch+yaml`,
//!   `fieldManager` required: `422` otherwise) merges keyed lists item by item,
//!   answers a change to a field another manager owns with kube-apiserver's `409
//!   Conflict` (`Apply failed with 1 conflict: conflict with "kubectl" using
//!   apps/v1: .spec.replicas`) unless `force=true` moves the field, and removes
//!   the fields a manager applied before and omits now when nobody else owns them.
//!   Deployments and ReplicaSets count `metadata.generation`, and API clients
//!   cannot write their `status` (it is the controllers');
//! - namespaces (`namespaces`): creating in a missing namespace is `404`, in a
//!   terminating one `403`; deleting one marks it `Terminating`, then (after
//!   [`Settings::namespace_delete_delay`]) deletes what is in it and itself, with
//!   the apiserver's words for each refusal;
//! - faults (`faults`): a Service port outside 1–65535 is `422 Invalid` as
//!   kube-apiserver's validation words it; [`KubeSim::refuse`] (`--refuse`) denies
//!   writes of chosen names as an admission webhook would;
//! - controllers ([`KubeSim::start_controllers`]; `podgate kube-sim` runs them
//!   unless it generates or churns a cluster): Deployments get ReplicaSets and
//!   Pods, and their status (`observedGeneration`, replica counts, `Progressing`
//!   and `Available` with kube-controller-manager's reasons and messages) moves
//!   with the [`Settings`] delays (`controller`, `rollout`, `pods`); an image
//!   tagged `crashloop` never becomes ready, so its Deployment ends
//!   `ProgressDeadlineExceeded`; every Service selecting an available Deployment
//!   gets a small HTTP server per port on `127.0.0.1` and an `Endpoints` object
//!   listing them (`backends`), torn down when it scales to 0 or goes;
//! - Pods' streaming subresources (`streams`), as kubectl 1.32 uses them: `exec`
//!   and `attach` over WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`)
//!   running a built-in shell, `port-forward` as SPDY/3.1 tunnelled through a
//!   WebSocket with declared container ports answering as echo servers (each
//!   also over SPDY/3.1, kubectl's fallback), `logs`
//!   with `tailLines` and `follow` ([`KubeSim::container_log`],
//!   [`KubeSim::end_container`]);
//! - users: a request is served as the user its `Impersonate-User` (with
//!   `Impersonate-Group`, `-Uid`, `-Extra-*`) names, else as `system:anonymous`;
//!   [`KubeSim::audit`] keeps the last 1,000 requests (verb, path, query, user,
//!   groups);
//! - RBAC, when enforced ([`KubeSim::enforce_rbac`]; `rbac`): ServiceAccount
//!   tokens (legacy token Secrets) authenticate, Roles, ClusterRoles and their
//!   bindings authorize, impersonation needs `impersonate`;
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
//! parsed only when asked for); `cargo bench -p podgate-kube-sim --bench kube_sim`
//! measures it.
//!
//! Layout: [`KubeSim`] here is the handle (denials, refusals, settings, audit,
//! churn, controllers, [`KubeSim::serve`]); `objects` its direct reads and writes,
//! generated clusters and seeding ([`StoredObject`]);
//! `resources` holds the served kinds, discovery documents and
//! CustomResourceDefinitions; `selector` label and field selectors; `patch` body
//! decoding and the kind of patch; `fieldset` and `ssa` field ownership and
//! server-side apply; `store` the objects, resource versions and change history;
//! `namespaces` namespace lifecycle; `faults` validation and refusals; `paging`
//! lists, whole or in pages, and their snapshots; `watch` the watch streams;
//! `http` the request dispatch; `streams` exec, attach, port-forward and logs;
//! `access` impersonation, denials and the audit log;
//! `generate` generated clusters; `churn` the steady changes; `controller`,
//! `rollout`, `pods` and `backends` the controllers; `settings` their timings;
//! `tests` the handle's tests (other modules keep theirs beside them).

mod access;
mod backends;
mod churn;
mod controller;
mod faults;
mod fieldset;
mod generate;
mod http;
mod namespaces;
mod objects;
mod paging;
mod patch;
mod pods;
mod rbac;
mod resources;
mod rollout;
mod selector;
mod settings;
mod ssa;
mod store;
mod streams;
mod tls;
mod watch;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ::http::Method;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

pub use access::AuditEntry;
pub use churn::{Churn, ChurnStats};
pub use controller::Controllers;
pub use objects::StoredObject;
use resources::{KINDS, NAMESPACES, crd_object, kind, kind_of};
pub use settings::{Settings, parse_duration};
use store::Shared;
pub use tls::{Tls, self_signed};

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
    /// A setting is out of range.
    #[error("kube-sim setting {field}: {message}")]
    Setting {
        /// The setting: `progress_deadline_factor`.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A refusal names a resource kube-sim does not serve or a bad pattern.
    #[error("refusal of {resource:?}: {message}")]
    Refusal {
        /// The resource as given.
        resource: String,
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
    /// resources, and writes, are served as usual.
    pub fn deny(&self, group: &str, resource: &str) {
        self.shared.access.deny(group, resource, &[]);
    }

    /// Enforce RBAC from now on (`true`), or serve every request (`false`, the
    /// default): bearer tokens of ServiceAccount token Secrets authenticate (an
    /// unknown one is 401), impersonation needs the `impersonate` verb, and each
    /// request needs a rule of a bound Role or ClusterRole (403 otherwise), as
    /// kube-apiserver's RBAC authorizer decides (`kube_sim/rbac.rs`).
    pub fn enforce_rbac(&self, on: bool) {
        self.shared.access.enforce(on);
    }

    /// Authenticate the bearer token `token` as `user` in `groups` (plus
    /// `system:authenticated`) while RBAC is enforced, as kube-apiserver's
    /// `--token-auth-file` does: an administrator's credential is `groups =
    /// ["system:masters"]`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        self.shared.access.add_token(
            token,
            rbac::UserInfo {
                name: user.to_owned(),
                groups,
            },
        );
    }

    /// Deny the given `verbs` (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`) of `group`/`resource`, replacing an earlier denial.
    pub fn deny_verbs(&self, group: &str, resource: &str, verbs: &[&str]) {
        self.shared.access.deny(group, resource, verbs);
    }

    /// Use these settings from now on (controllers read them at each step).
    pub fn set_settings(&self, settings: Settings) -> Result<()> {
        settings.validate()?;
        *self
            .shared
            .settings
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = settings;
        self.shared.settings_changed.notify_waiters();
        Ok(())
    }

    /// The settings in force.
    pub fn settings(&self) -> Settings {
        self.shared.settings()
    }

    /// Refuse creates, updates and patches of `resource` (`deployments`,
    /// `services`, `deployments.apps`) whose name matches `name_regex`, as a
    /// validating admission webhook would: `400` with `admission webhook
    /// "refuse.kube-sim.podgate.dev" denied the request: <message>`. Direct
    /// [`KubeSim::put`]s are refused too.
    pub fn refuse(&self, resource: &str, name_regex: &str, message: &str) -> Result<()> {
        let fail = |message: String| Error::Refusal {
            resource: resource.to_owned(),
            message,
        };
        let k = kind(resource).ok_or_else(|| fail("not a served resource".into()))?;
        let re = regex::Regex::new(name_regex).map_err(|e| fail(e.to_string()))?;
        self.shared.faults.refuse(k, re, message);
        Ok(())
    }

    /// Lift every refusal of `resource`.
    pub fn unrefuse(&self, resource: &str) {
        if let Some(k) = kind(resource) {
            self.shared.faults.clear(k);
        }
    }

    /// Lift a denial of `group`/`resource`.
    pub fn allow(&self, group: &str, resource: &str) {
        self.shared.access.allow(group, resource);
    }

    /// Whether `group`/`resource` is served (`apps`/`deployments`, `""`/`pods`).
    pub fn serves(group: &str, resource: &str) -> bool {
        kind_of(group, resource).is_some()
    }

    /// Append `line` to the log of container `container` of Pod
    /// `namespace`/`pod`, as if its main process had written it: `kubectl logs`
    /// shows it, and followers (`logs -f`) and attached clients get it now.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str, line: &str) {
        self.shared
            .containers
            .get(namespace, pod, container)
            .append(line.as_bytes());
    }

    /// End the main process of container `container` of Pod
    /// `namespace`/`pod`: `kubectl logs -f` and `kubectl attach` sessions on it
    /// end; the log is kept, and the next `attach -i` starts a fresh process.
    pub fn end_container(&self, namespace: &str, pod: &str, container: &str) {
        self.shared.containers.get(namespace, pod, container).exit();
    }

    /// Keep the last `n` requests in [`KubeSim::audit`] (default 1,000) from now
    /// on, for a test that reads every request of a longer run.
    pub fn set_audit_limit(&self, n: usize) {
        self.shared.access.set_audit_limit(n);
    }

    /// The last requests served (at most 1,000 unless
    /// [`KubeSim::set_audit_limit`] said otherwise), oldest first: who asked for
    /// what.
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

    /// Start the controllers (see the `controller` module): Deployments get
    /// ReplicaSets and Pods and their status moves as kube-controller-manager moves
    /// it, with the [`Settings`] delays; Services selecting an available
    /// Deployment get backend servers and `Endpoints`. They stop when the returned
    /// handle is dropped. Must be called inside a Tokio runtime.
    pub fn start_controllers(&self) -> Controllers {
        controller::start(self.shared.clone())
    }

    /// Serve the Kubernetes API on `listener` until `shutdown` resolves; then stop
    /// and end every open connection (watches included), as a real API server going
    /// away would. Accept errors (such as running out of file descriptors) are
    /// logged and retried after a short pause.
    pub async fn serve(&self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        self.serve_with(listener, None, shutdown).await;
    }

    /// [`KubeSim::serve`] over HTTPS with `tls` (a handshake that fails ends
    /// that connection only).
    pub async fn serve_tls(
        &self,
        listener: TcpListener,
        tls: Tls,
        shutdown: impl Future<Output = ()>,
    ) {
        self.serve_with(listener, Some(tls), shutdown).await;
    }

    async fn serve_with(
        &self,
        listener: TcpListener,
        tls: Option<Tls>,
        shutdown: impl Future<Output = ()>,
    ) {
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
            let tls = tls.clone();
            connections.spawn(async move {
                // Upgraded sessions (exec, attach, port-forward) run on in this
                // task once the HTTP connection has handed its socket over.
                let (sessions, sessions_rx) = tokio::sync::mpsc::unbounded_channel();
                let sessions = streams::Sessions(sessions);
                let svc = service_fn(move |mut req: ::http::Request<hyper::body::Incoming>| {
                    let s = s.clone();
                    req.extensions_mut().insert(sessions.clone());
                    async move { Ok::<_, Infallible>(s.handle(req).await) }
                });
                let http = http1::Builder::new();
                let Some(tls) = tls else {
                    serve_connection(&http, TokioIo::new(stream), svc, sessions_rx).await;
                    return;
                };
                let Ok(ssl) = openssl::ssl::Ssl::new(tls.acceptor.context()) else {
                    return;
                };
                let Ok(mut stream) = tokio_openssl::SslStream::new(ssl, stream) else {
                    return;
                };
                if let Err(e) = std::pin::Pin::new(&mut stream).accept().await {
                    tracing::debug!(error = %e, "kube-sim: TLS handshake failed");
                    return;
                }
                serve_connection(&http, TokioIo::new(stream), svc, sessions_rx).await;
            });
        }
    }
}

/// Serve one HTTP/1.1 connection (upgrades allowed), then the sessions its
/// upgrades started, until all end.
async fn serve_connection<I, S>(
    http: &http1::Builder,
    io: I,
    svc: S,
    mut sessions: tokio::sync::mpsc::UnboundedReceiver<
        futures_util::future::BoxFuture<'static, ()>,
    >,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = http::Body>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = http.serve_connection(io, svc).with_upgrades().await;
    let mut running = Vec::new();
    while let Some(session) = sessions.recv().await {
        running.push(session);
    }
    futures_util::future::join_all(running).await;
}

/// A kubeconfig for a kube-sim at `server_url` (`http://127.0.0.1:<port>`): no
/// authentication, plain HTTP, namespace `default`.
pub fn kubeconfig(server_url: &str) -> String {
    kubeconfig_with(server_url, None, None)
}

/// A kubeconfig for a kube-sim at `server_url` whose user sends the bearer token
/// `token` and trusts the certificate `ca_pem` (PEM; for an `https://` URL), each
/// when given; namespace `default`.
pub fn kubeconfig_with(server_url: &str, token: Option<&str>, ca_pem: Option<&str>) -> String {
    use base64::Engine as _;
    let user = match token {
        Some(t) => format!("\n    token: {t}"),
        None => " {}".to_owned(),
    };
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server_url}{ca}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\ncurrent-context: test\nusers:\n- name: test\n  user:{user}\n"
    )
}

#[cfg(test)]
mod tests;
