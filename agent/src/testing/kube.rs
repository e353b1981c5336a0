//! A faithful in-process Kubernetes API server for tests: no real one can be installed
//! on these machines, and kube-rs ships none. It speaks enough of the real API for
//! `kubectl` and kube-rs clients:
//!
//! - discovery: `/version`, `/api`, `/apis`, `/api/v1` (pods, configmaps, namespaces);
//! - list with `resourceVersion`, `labelSelector` (`=`, `==`, `!=`, `in`, `notin`,
//!   `key`, `!key`) and `fieldSelector` (`metadata.name`, `metadata.namespace`,
//!   `status.phase`);
//! - watch streams (`ADDED`/`MODIFIED`/`DELETED`, `BOOKMARK` when asked), resumed
//!   from a `resourceVersion`; one older than the retained history gets the real
//!   server's `410 Gone` (an `ERROR` event with an `Expired` status);
//! - get, create (409 on a duplicate), replace (409 on a stale `resourceVersion`),
//!   merge / strategic-merge / apply patches, delete; errors as `Status` objects.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

type Body = BoxBody<Bytes, Infallible>;

/// A served resource type.
#[derive(Clone, Copy, Debug)]
struct Kind {
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
}

const KINDS: &[Kind] = &[
    Kind {
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        short: &["po"],
        namespaced: true,
    },
    Kind {
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        short: &["cm"],
        namespaced: true,
    },
    Kind {
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        short: &["ns"],
        namespaced: false,
    },
];

/// The store key of an object (cluster-scoped kinds have no namespace).
fn key(k: Kind, namespace: &str, name: &str) -> (String, String, String) {
    let ns = if k.namespaced { namespace } else { "" };
    (k.plural.to_owned(), ns.to_owned(), name.to_owned())
}

fn kind(plural: &str) -> Option<Kind> {
    KINDS.iter().copied().find(|k| k.plural == plural)
}

/// One change, as watches see it.
#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    plural: &'static str,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct Store {
    rv: u64,
    /// (plural, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    /// Recent events, oldest first; older ones are compacted away.
    history: VecDeque<Event>,
    uid: u64,
}

/// The test API server. Dropping it stops it.
pub struct KubeTestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    store: Mutex<Store>,
    events: broadcast::Sender<Event>,
    history_limit: usize,
    bookmark_every: Duration,
}

impl KubeTestServer {
    /// Serve on a free loopback port. At most `history_limit` events are kept for
    /// watch resumption.
    pub async fn start(history_limit: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                rv: 100,
                ..Store::default()
            }),
            events: broadcast::channel(4096).0,
            history_limit: history_limit.max(1),
            bookmark_every: Duration::from_millis(500),
        });
        for ns in ["default", "kube-system"] {
            shared.apply(
                Method::POST,
                "namespaces",
                "",
                None,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
        let s = shared.clone();
        let task = tokio::spawn(async move {
            // Connections live in this set: stopping the server ends them too, as a
            // real API server going away would.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                while connections.try_join_next().is_some() {}
                let s = s.clone();
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
        });
        Ok(KubeTestServer { addr, shared, task })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this server (no auth, plain HTTP).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\ncurrent-context: test\nusers:\n- name: test\n  user: {{}}\n",
            self.url()
        )
    }

    /// Create or replace an object directly (as another client would).
    pub fn put(&self, plural: &str, namespace: &str, object: Value) -> Value {
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let exists = self.get(plural, namespace, &name).is_some();
        let (_, v) = self.shared.apply(
            if exists { Method::PUT } else { Method::POST },
            plural,
            namespace,
            Some(&name).filter(|_| exists).map(String::as_str),
            object,
        );
        v
    }

    /// Delete an object directly.
    pub fn delete(&self, plural: &str, namespace: &str, name: &str) -> bool {
        self.shared
            .apply(Method::DELETE, plural, namespace, Some(name), Value::Null)
            .0
            .is_success()
    }

    /// An object, if present.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.shared.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .objects
            .get(&(plural.to_owned(), namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rv
    }
}

impl Drop for KubeTestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A `Status` object, as the API server reports errors.
fn status(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
}

fn error(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(code, &status(code, reason, message))
}

fn query(uri: &http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (!k.is_empty()).then(|| (k.to_owned(), percent_decode(v)))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One requirement of a label selector.
#[derive(Debug, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Parse a label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
fn parse_selector(s: &str) -> Result<Vec<Requirement>, String> {
    let mut reqs = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        // Split at the next comma outside parentheses.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        let term = rest[..end].trim();
        rest = rest[end..].trim_start_matches(',').trim();
        let set = |inner: &str| -> Vec<String> {
            inner
                .trim()
                .trim_start_matches('(')
                .trim_end_matches(')')
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect()
        };
        let req = if let Some((k, v)) = term.split_once("!=") {
            Requirement::NotEq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once("==") {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once('=') {
            Requirement::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = term.split_once(" notin ") {
            Requirement::NotIn(k.trim().into(), set(v))
        } else if let Some((k, v)) = term.split_once(" in ") {
            Requirement::In(k.trim().into(), set(v))
        } else if let Some(k) = term.strip_prefix('!') {
            Requirement::NotExists(k.trim().into())
        } else if !term.is_empty() && !term.contains(char::is_whitespace) {
            Requirement::Exists(term.into())
        } else {
            return Err(format!("unable to parse requirement: {term:?}"));
        };
        reqs.push(req);
    }
    Ok(reqs)
}

fn labels_match(reqs: &[Requirement], labels: &Value) -> bool {
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    reqs.iter().all(|r| match r {
        Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
        Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
        Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::NotExists(k) => get(k).is_none(),
    })
}

/// Field selectors: `metadata.name`, `metadata.namespace`, `status.phase` with `=`,
/// `==`, `!=`.
fn fields_match(selector: &str, object: &Value) -> Result<bool, String> {
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (field, want, negate) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, false)
        } else {
            return Err(format!("invalid field selector: {term:?}"));
        };
        let pointer = match field.trim() {
            "metadata.name" => "/metadata/name",
            "metadata.namespace" => "/metadata/namespace",
            "status.phase" => "/status/phase",
            other => return Err(format!("field label not supported: {other}")),
        };
        let have = object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("");
        if (have == want.trim()) == negate {
            return Ok(false);
        }
    }
    Ok(true)
}

/// RFC 7386 JSON merge patch (also used for strategic-merge and apply patches: for
/// the maps and scalars tests touch, they agree).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Create (POST), replace (PUT), patch (PATCH, `body` is the patch) or delete;
    /// returns the status and the object or a `Status`.
    fn apply(
        &self,
        method: Method,
        plural: &str,
        namespace: &str,
        name: Option<&str>,
        body: Value,
    ) -> (StatusCode, Value) {
        let Some(k) = kind(plural) else {
            return (
                StatusCode::NOT_FOUND,
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            );
        };
        let ns = if k.namespaced { namespace } else { "" };
        let mut store = self.lock();
        let name = name
            .map(str::to_owned)
            .or_else(|| body["metadata"]["name"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let key = (plural.to_owned(), ns.to_owned(), name.clone());
        let not_found = || {
            (
                StatusCode::NOT_FOUND,
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{} \"{name}\" not found", k.plural),
                ),
            )
        };
        let (event, object, code) = match method {
            Method::POST => {
                if name.is_empty() {
                    return (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        status(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "Invalid",
                            "metadata.name: Required value",
                        ),
                    );
                }
                if store.objects.contains_key(&key) {
                    return (
                        StatusCode::CONFLICT,
                        status(
                            StatusCode::CONFLICT,
                            "AlreadyExists",
                            &format!("{} \"{name}\" already exists", k.plural),
                        ),
                    );
                }
                let mut o = body;
                store.uid += 1;
                let uid = format!("00000000-0000-4000-8000-{:012x}", store.uid);
                o["apiVersion"] = json!("v1");
                o["kind"] = json!(k.kind);
                o["metadata"]["uid"] = json!(uid);
                o["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
                if k.namespaced {
                    o["metadata"]["namespace"] = json!(ns);
                }
                if k.kind == "Pod" && o["status"]["phase"].is_null() {
                    o["status"]["phase"] = json!("Pending");
                }
                ("ADDED", o, StatusCode::CREATED)
            }
            Method::PUT => {
                let Some(old) = store.objects.get(&key) else {
                    return not_found();
                };
                let want = body["metadata"]["resourceVersion"].as_str();
                if want.is_some_and(|w| Some(w) != old["metadata"]["resourceVersion"].as_str()) {
                    return (
                        StatusCode::CONFLICT,
                        status(
                            StatusCode::CONFLICT,
                            "Conflict",
                            &format!(
                                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                                k.plural
                            ),
                        ),
                    );
                }
                let mut o = body;
                o["metadata"]["uid"] = old["metadata"]["uid"].clone();
                o["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                if k.namespaced {
                    o["metadata"]["namespace"] = json!(ns);
                }
                o["apiVersion"] = json!("v1");
                o["kind"] = json!(k.kind);
                ("MODIFIED", o, StatusCode::OK)
            }
            Method::PATCH => {
                let Some(old) = store.objects.get(&key) else {
                    return not_found();
                };
                let mut o = old.clone();
                merge(&mut o, &body);
                ("MODIFIED", o, StatusCode::OK)
            }
            Method::DELETE => {
                let Some(o) = store.objects.remove(&key) else {
                    return not_found();
                };
                ("DELETED", o, StatusCode::OK)
            }
            _ => {
                return (
                    StatusCode::METHOD_NOT_ALLOWED,
                    status(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "MethodNotAllowed",
                        "method not allowed",
                    ),
                );
            }
        };
        store.rv += 1;
        let rv = store.rv;
        let mut object = object;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if event != "DELETED" {
            store.objects.insert(key, object.clone());
        }
        let e = Event {
            rv,
            plural: k.plural,
            kind: event,
            object: object.clone(),
        };
        store.history.push_back(e.clone());
        while store.history.len() > self.history_limit {
            store.history.pop_front();
        }
        drop(store);
        let _ = self.events.send(e);
        (code, object)
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().trim_end_matches('/').to_owned();
        let q = query(req.uri());
        let method = req.method().clone();
        match path.as_str() {
            "/version" => {
                return json_response(
                    StatusCode::OK,
                    &json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-podgate-test", "platform": "linux/amd64"}),
                );
            }
            "/api" => {
                return json_response(
                    StatusCode::OK,
                    &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
                );
            }
            "/apis" => {
                return json_response(
                    StatusCode::OK,
                    &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
                );
            }
            // kubectl asks the OpenAPI v3 document whether the server validates fields
            // itself (a `fieldValidation` parameter on each kind's PATCH); it does, so
            // kubectl needs no schemas.
            "/openapi/v3" => {
                return json_response(
                    StatusCode::OK,
                    &json!({"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=podgate"}}}),
                );
            }
            "/openapi/v3/api/v1" => {
                let mut paths = serde_json::Map::new();
                for k in KINDS {
                    let item = if k.namespaced {
                        format!("/api/v1/namespaces/{{namespace}}/{}/{{name}}", k.plural)
                    } else {
                        format!("/api/v1/{}/{{name}}", k.plural)
                    };
                    let op = |action: &str| {
                        json!({
                            "operationId": format!("{action}{}", k.kind),
                            "parameters": [
                                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                            ],
                            "responses": {"200": {"description": "OK"}},
                            "x-kubernetes-action": action,
                            "x-kubernetes-group-version-kind": {"group": "", "version": "v1", "kind": k.kind},
                        })
                    };
                    paths.insert(item, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
                }
                return json_response(
                    StatusCode::OK,
                    &json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": paths, "components": {"schemas": {}}}),
                );
            }
            "/api/v1" => {
                let resources: Vec<Value> = KINDS
                    .iter()
                    .map(|k| json!({"name": k.plural, "singularName": k.singular, "namespaced": k.namespaced, "kind": k.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": k.short}))
                    .collect();
                return json_response(
                    StatusCode::OK,
                    &json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}),
                );
            }
            _ => {}
        }
        // /api/v1/[namespaces/<ns>/]<plural>[/<name>]
        let Some(rest) = path.strip_prefix("/api/v1/") else {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (namespace, plural, name) = match parts.as_slice() {
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            ["namespaces", name] => (None, "namespaces", Some(*name)),
            [plural] => (None, *plural, None),
            _ => {
                return error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "the server could not find the requested resource",
                );
            }
        };
        let Some(k) = kind(plural) else {
            return error(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        };
        let ns = namespace.unwrap_or("");
        match (&method, name) {
            (&Method::GET, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                self.watch(k, namespace, &q)
            }
            (&Method::GET, None) => self.list(k, namespace, &q),
            (&Method::GET, Some(name)) => match self.lock().objects.get(&key(k, ns, name)) {
                Some(o) => json_response(StatusCode::OK, o),
                None => error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{} \"{name}\" not found", k.plural),
                ),
            },
            (&Method::POST | &Method::PUT | &Method::PATCH, _) => {
                let content_type = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let bytes = match req.into_body().collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => {
                        return error(StatusCode::BAD_REQUEST, "BadRequest", "unreadable body");
                    }
                };
                let body: Value = if content_type.contains("yaml") {
                    match serde_yaml::from_slice(&bytes) {
                        Ok(v) => v,
                        Err(e) => {
                            return error(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string());
                        }
                    }
                } else {
                    match serde_json::from_slice(&bytes) {
                        Ok(v) => v,
                        Err(e) => {
                            return error(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string());
                        }
                    }
                };
                if content_type.contains("json-patch+json") {
                    return error(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        "JSON patch is not supported by this test server",
                    );
                }
                // Server-side apply creates when absent.
                let method = if method == Method::PATCH
                    && content_type.contains("apply-patch")
                    && name.is_some_and(|n| !self.lock().objects.contains_key(&key(k, ns, n)))
                {
                    Method::POST
                } else {
                    method
                };
                let (code, v) = self.apply(method, k.plural, ns, name, body);
                json_response(code, &v)
            }
            (&Method::DELETE, Some(name)) => {
                let (code, v) = self.apply(Method::DELETE, k.plural, ns, Some(name), Value::Null);
                json_response(code, &v)
            }
            _ => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "method not allowed",
            ),
        }
    }

    fn matching(
        &self,
        k: Kind,
        namespace: Option<&str>,
        q: &BTreeMap<String, String>,
        o: &Value,
    ) -> Result<bool, String> {
        if k.namespaced
            && let Some(ns) = namespace
            && o["metadata"]["namespace"].as_str() != Some(ns)
        {
            return Ok(false);
        }
        if let Some(sel) = q.get("labelSelector")
            && !labels_match(&parse_selector(sel)?, &o["metadata"]["labels"])
        {
            return Ok(false);
        }
        match q.get("fieldSelector") {
            Some(sel) => fields_match(sel, o),
            None => Ok(true),
        }
    }

    fn list(
        &self,
        k: Kind,
        namespace: Option<&str>,
        q: &BTreeMap<String, String>,
    ) -> Response<Body> {
        let store = self.lock();
        let mut items = Vec::new();
        for ((plural, _, _), o) in &store.objects {
            if plural != k.plural {
                continue;
            }
            match self.matching(k, namespace, q, o) {
                Ok(true) => items.push(o.clone()),
                Ok(false) => {}
                Err(e) => return error(StatusCode::BAD_REQUEST, "BadRequest", &e),
            }
        }
        json_response(
            StatusCode::OK,
            &json!({
                "kind": format!("{}List", k.kind),
                "apiVersion": "v1",
                "metadata": {"resourceVersion": store.rv.to_string()},
                "items": items,
            }),
        )
    }

    fn watch(
        self: &Arc<Self>,
        k: Kind,
        namespace: Option<&str>,
        q: &BTreeMap<String, String>,
    ) -> Response<Body> {
        if let Some(sel) = q.get("labelSelector")
            && let Err(e) = parse_selector(sel)
        {
            return error(StatusCode::BAD_REQUEST, "BadRequest", &e);
        }
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let from: Option<u64> = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .filter(|v| *v > 0);
        // Subscribe before reading history so nothing falls between the two.
        let mut live = self.events.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(256);
        let line =
            |t: &str, o: &Value| Bytes::from(format!("{}\n", json!({"type": t, "object": o})));
        let mut backlog = Vec::new();
        let mut last;
        {
            let store = self.lock();
            match from {
                Some(rv) => {
                    let oldest = store.history.front().map_or(store.rv, |e| e.rv);
                    if rv + 1 < oldest {
                        let gone = status(
                            StatusCode::GONE,
                            "Expired",
                            &format!("too old resource version: {rv} ({})", oldest - 1),
                        );
                        backlog.push(line("ERROR", &gone));
                        last = u64::MAX;
                    } else {
                        for e in store
                            .history
                            .iter()
                            .filter(|e| e.rv > rv && e.plural == k.plural)
                        {
                            if self.matching(k, namespace, q, &e.object).unwrap_or(false) {
                                backlog.push(line(e.kind, &e.object));
                            }
                        }
                        last = store.rv;
                    }
                }
                None => {
                    // No resourceVersion: synthetic ADDED for everything, then changes.
                    for ((plural, _, _), o) in &store.objects {
                        if plural == k.plural && self.matching(k, namespace, q, o).unwrap_or(false)
                        {
                            backlog.push(line("ADDED", o));
                        }
                    }
                    last = store.rv;
                }
            }
        }
        let shared = self.clone();
        let namespace = namespace.map(str::to_owned);
        let q = q.clone();
        tokio::spawn(async move {
            for b in backlog {
                if tx.send(Ok(Frame::data(b))).await.is_err() {
                    return;
                }
            }
            if last == u64::MAX {
                return;
            }
            let mut tick = tokio::time::interval(shared.bookmark_every);
            loop {
                tokio::select! {
                    e = live.recv() => match e {
                        Ok(e) if e.rv > last && e.plural == k.plural => {
                            last = e.rv;
                            if shared.matching(k, namespace.as_deref(), &q, &e.object).unwrap_or(false)
                                && tx.send(Ok(Frame::data(line(e.kind, &e.object)))).await.is_err()
                            {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let gone = status(StatusCode::GONE, "Expired", "watch fell behind");
                            let _ = tx.send(Ok(Frame::data(line("ERROR", &gone)))).await;
                            return;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = tick.tick(), if bookmarks => {
                        let rv = shared.lock().rv;
                        let b = json!({"kind": k.kind, "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}});
                        if tx.send(Ok(Frame::data(line("BOOKMARK", &b)))).await.is_err() {
                            return;
                        }
                    }
                    _ = tx.closed() => return,
                }
            }
        });
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|f| (f, rx)) },
            );
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_parse_and_match() {
        let labels = json!({"app": "web", "tier": "front", "env": "prod"});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("env in (prod, staging)", true),
            ("env notin (prod)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing,app in (web),env notin (dev,qa)", true),
            ("missing", false),
        ] {
            assert_eq!(
                labels_match(&parse_selector(sel).unwrap(), &labels),
                want,
                "{sel}"
            );
        }
        assert!(parse_selector("a b").is_err());
        let pod = json!({"metadata": {"name": "p1", "namespace": "default"}, "status": {"phase": "Running"}});
        assert_eq!(
            fields_match("metadata.name=p1,status.phase!=Pending", &pod),
            Ok(true)
        );
        assert_eq!(fields_match("status.phase=Pending", &pod), Ok(false));
        assert!(fields_match("spec.nodeName=x", &pod).is_err());
        assert_eq!(percent_decode("app%3Dweb%2Ctier+in"), "app=web,tier in");
    }
}
