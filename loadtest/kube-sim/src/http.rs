//! HTTP dispatch: discovery documents, then
//! `/api/v1/[namespaces/<ns>/]<plural>[/<name>]` and
//! `/apis/<group>/<version>/[namespaces/<ns>/]<plural>[/<name>]` to list, watch,
//! get, create, replace, patch and delete; every error a Kubernetes `Status` object.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::access::{Identity, forbidden};
use super::patch::{PatchKind, decode_body};
use super::rbac::{Attributes, Policy, UserInfo, bearer, requester};
use super::resources::{NAMESPACES, discovery, key, kind_at};
use super::store::{Shared, Write, as_version};
use super::streams::SUBRESOURCES;

/// A response body: whole, or a watch stream.
pub(super) type Body = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    text_response(status, v.to_string())
}

fn text_response(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(full(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A `Status` object, as the API server reports errors.
pub(super) fn status(code: StatusCode, reason: &str, message: &str) -> Value {
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

/// A response carrying a `Status`.
pub(super) fn error(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(code, &status(code, reason, message))
}

fn not_found() -> Response<Body> {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
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

/// A query value as Go's `url.ParseQuery` reads it: `+` is a space, then `%XX`
/// escapes are decoded.
pub(super) fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

impl Shared {
    /// Answer one request as the user its impersonation headers name, and
    /// remember it in the audit log.
    pub(super) async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let id = match Identity::from_headers(req.headers()) {
            Ok(id) => id,
            Err(e) => {
                self.access.record(
                    (&req.method().as_str().to_lowercase(), &path, &query),
                    &Identity::default(),
                    None,
                    StatusCode::INTERNAL_SERVER_ERROR,
                );
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    &format!("Internal error occurred: {e}"),
                );
            }
        };
        let mut authenticated = None;
        let authz = if self.access.enforcing() {
            let policy = self.access.policy(&self.lock());
            authenticated = policy.authenticate(bearer(req.headers())).map(|u| u.name);
            match requester(&policy, req.headers(), &id) {
                Ok(user) => Some((policy, user)),
                Err((code, status)) => {
                    self.access.record(
                        (&req.method().as_str().to_lowercase(), &path, &query),
                        &id,
                        authenticated.as_deref(),
                        code,
                    );
                    return json_response(code, &status);
                }
            }
        } else {
            None
        };
        let (verb, response) = self.clone().dispatch(req, &id, authz.as_ref()).await;
        self.access.record(
            (&verb, &path, &query),
            &id,
            authenticated.as_deref(),
            response.status(),
        );
        response
    }

    /// Route one request: (its verb, the response). With `authz` (RBAC enforced:
    /// the policy and the user served), a request its rules do not allow is 403.
    async fn dispatch(
        self: Arc<Self>,
        req: Request<Incoming>,
        id: &Identity,
        authz: Option<&(Arc<Policy>, UserInfo)>,
    ) -> (String, Response<Body>) {
        let path = req.uri().path().trim_end_matches('/').to_owned();
        let q = query(req.uri());
        let method = req.method().clone();
        let plain_verb = method.as_str().to_lowercase();
        let not_found = || (plain_verb.clone(), not_found());
        if let Some(doc) = discovery(&path) {
            return (plain_verb, json_response(StatusCode::OK, &doc));
        }
        let (group, version, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
            ("", "v1", rest)
        } else if let Some(rest) = path.strip_prefix("/apis/") {
            let mut it = rest.splitn(3, '/');
            match (it.next(), it.next(), it.next()) {
                (Some(g), Some(v), Some(rest)) => (g, v, rest),
                _ => return not_found(),
            }
        } else {
            return not_found();
        };
        let parts: Vec<&str> = rest.split('/').collect();
        if group.is_empty()
            && let ["namespaces", ns, "pods", name, sub] = parts.as_slice()
            && SUBRESOURCES.contains(sub)
        {
            // kube-apiserver's verb is the method's: `get` for the WebSocket
            // `GET`, `create` for SPDY's `POST` (`endpoints/request/requestinfo.go`).
            let verb = match method {
                Method::GET => "get",
                Method::POST => "create",
                _ => plain_verb.as_str(),
            }
            .to_owned();
            if let Some((policy, user)) = authz {
                let a = Attributes {
                    verb: &verb,
                    resource: "pods",
                    subresource: sub,
                    namespace: ns,
                    name,
                    ..Attributes::default()
                };
                if !policy.allows(user, &a) {
                    let message = format!(
                        "pods {name:?} is forbidden: User {:?} cannot {verb} resource \"pods/{sub}\" in API group \"\" in the namespace {ns:?}",
                        user.name
                    );
                    let mut s = status(StatusCode::FORBIDDEN, "Forbidden", &message);
                    s["details"] = json!({"name": name, "kind": "pods"});
                    return (verb, json_response(StatusCode::FORBIDDEN, &s));
                }
            }
            let response = match method {
                Method::GET => self.pod_stream(req, ns, name, sub),
                Method::POST if *sub != "log" => self.pod_stream(req, ns, name, sub),
                _ => error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    "method not allowed",
                ),
            };
            return (verb, response);
        }
        let (namespace, plural, name) = match parts.as_slice() {
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            ["namespaces", name] if group.is_empty() => (None, "namespaces", Some(*name)),
            [plural] => (None, *plural, None),
            [plural, name] => (None, *plural, Some(*name)),
            _ => return not_found(),
        };
        let Some(k) = kind_at(group, version, plural) else {
            return not_found();
        };
        // A namespaced path to a cluster-scoped kind, or a named object of a
        // namespaced kind outside any namespace, is no resource.
        if (namespace.is_some() && !k.namespaced)
            || (name.is_some() && k.namespaced && namespace.is_none())
        {
            return not_found();
        }
        let ns = namespace.unwrap_or("");
        let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
        let verb = match (&method, name) {
            (&Method::GET, Some(_)) => "get",
            (&Method::GET, None) if watch => "watch",
            (&Method::GET, None) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, Some(_)) => "delete",
            (&Method::DELETE, None) => "deletecollection",
            _ => plain_verb.as_str(),
        }
        .to_owned();
        if self.access.is_denied(k, &verb) {
            let status = forbidden(k, &verb, namespace, name, id.name());
            return (verb, json_response(StatusCode::FORBIDDEN, &status));
        }
        if let Some((policy, user)) = authz {
            let a = Attributes {
                verb: &verb,
                group: k.group,
                resource: k.plural,
                namespace: ns,
                name: name.unwrap_or(""),
                ..Attributes::default()
            };
            if !policy.allows(user, &a) {
                let status = forbidden(k, &verb, namespace, name, &user.name);
                return (verb, json_response(StatusCode::FORBIDDEN, &status));
            }
        }
        let response = match (&method, name) {
            (&Method::GET, None) if watch => self.watch(k, version, namespace, &q),
            (&Method::GET, None) => match self.list(k, version, namespace, &q) {
                Ok(list) => text_response(StatusCode::OK, list),
                Err((code, status)) => json_response(code, &status),
            },
            (&Method::GET, Some(name)) => match self.lock().objects.get(&key(k, ns, name)) {
                Some(o) => text_response(StatusCode::OK, o.text_in(k, version).into_owned()),
                None => error(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{} \"{name}\" not found", k.id()),
                ),
            },
            (&Method::POST | &Method::PUT | &Method::PATCH, _) => {
                let content_type = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                // kube-apiserver's default manager: the user agent up to its first
                // `/` (`managerOrUserAgent` in `endpoints/handlers/rest.go`).
                let manager = match q.get("fieldManager").filter(|m| !m.is_empty()) {
                    Some(m) => m.clone(),
                    None => req
                        .headers()
                        .get(http::header::USER_AGENT)
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .unwrap_or_default()
                        .split('/')
                        .next()
                        .unwrap_or("")
                        .chars()
                        .take(128)
                        .collect(),
                };
                let bytes = match req.into_body().collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => {
                        return (
                            verb,
                            error(StatusCode::BAD_REQUEST, "BadRequest", "unreadable body"),
                        );
                    }
                };
                let (patch, body) = match decode_body(&content_type, &bytes) {
                    Ok(v) => v,
                    Err((code, reason, message)) => {
                        return (verb, error(code, reason, &message));
                    }
                };
                let apply = method == Method::PATCH && patch == PatchKind::Apply;
                if let Some(invalid) = patch_options(&method, apply, &q) {
                    return (
                        verb,
                        json_response(StatusCode::UNPROCESSABLE_ENTITY, &invalid),
                    );
                }
                // Server-side apply creates when absent.
                let exists = name.is_some_and(|n| self.lock().objects.contains_key(&key(k, ns, n)));
                let method = if apply && !exists {
                    Method::POST
                } else {
                    method
                };
                let (code, v) = self.write(Write {
                    apply,
                    force: q.get("force").is_some_and(|f| f == "true"),
                    manager: Some(manager),
                    api_version: k.api_version(version),
                    admit: true,
                    dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
                    lifecycle: true,
                    ..Write::new(method, k, ns, name, body)
                });
                json_response(code, &as_version(k, version, v))
            }
            (&Method::DELETE, Some(name)) if k == NAMESPACES => {
                let (code, v) = self.delete_namespace(name);
                json_response(code, &v)
            }
            (&Method::DELETE, Some(name)) => {
                let (code, v) = self.apply(Method::DELETE, k, ns, Some(name), Value::Null);
                json_response(code, &as_version(k, version, v))
            }
            _ => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "method not allowed",
            ),
        };
        (verb, response)
    }
}

/// kube-apiserver's checks of a write's options (`ValidatePatchOptions` in
/// `apimachinery/pkg/apis/meta/v1/validation`): an apply names its field manager;
/// `force` is for applies only. The `422 Invalid` `Status`, if one fails.
fn patch_options(method: &Method, apply: bool, q: &BTreeMap<String, String>) -> Option<Value> {
    if *method != Method::PATCH {
        return None;
    }
    let (field, detail) = if apply && q.get("fieldManager").is_none_or(|m| m.is_empty()) {
        (
            "fieldManager",
            "Required value: is required for apply patch",
        )
    } else if !apply && q.contains_key("force") {
        (
            "force",
            "Forbidden: may not be specified for non-apply patch",
        )
    } else {
        return None;
    };
    let mut s = status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("PatchOptions.meta.k8s.io \"\" is invalid: {field}: {detail}"),
    );
    let reason = if field == "force" {
        "FieldValueForbidden"
    } else {
        "FieldValueRequired"
    };
    let cause_message = detail.to_owned();
    s["details"] = json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{"reason": reason, "message": cause_message, "field": field}]});
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decode("app%3Dweb%2Ctier+in"), "app=web,tier in");
        assert_eq!(percent_decode("a%2Bb+c%zz%"), "a+b c%zz%");
    }
}
