//! The REST mapping of `Classify` (`google.api.http`: `post: "/v1/classify"`,
//! `body: "*"`), which GitLab's HTTP Router calls: the request and response in
//! proto3's JSON mapping (lowerCamelCase names, enums by name, 64-bit integers as
//! strings; names as written in the schema, enum numbers and integer numbers are
//! accepted too, unknown fields ignored), and errors as a gRPC gateway writes them,
//! `{"code": 5, "message": "…", "details": []}` with the gateway's HTTP status for
//! the code (404 for `NOT_FOUND`).
//!
//! Only fields that are set are written back (no `null`s for unset messages).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Map, Value, json};
use tonic::{Code, Status};

use crate::classify::ClassifyRequest;
use crate::grpc::TopologyService;
use crate::proto::gitlab::cells::topology_service::types::v1::{Claim, claim::Claim as C};
use crate::proto::gitlab::cells::topology_service::{
    ClassifyAction, ClassifyResponse, ClassifyType,
};

/// The REST routes, to merge with the gRPC ones on one listener.
pub fn router(service: Arc<TopologyService>) -> axum::Router {
    axum::Router::new()
        .route("/v1/classify", axum::routing::post(classify))
        .route("/metrics", axum::routing::get(metrics))
        .with_state(service)
}

async fn classify(
    State(service): State<Arc<TopologyService>>,
    request: axum::extract::Request,
) -> Response {
    let caller = service.caller_in(request.extensions());
    // A classification is a few claims; more than a MiB is no request of GitLab's.
    let body = match axum::body::to_bytes(request.into_body(), 1 << 20).await {
        Ok(b) => b,
        Err(e) => return error_response(&Status::invalid_argument(format!("the body: {e}"))),
    };
    let answer = match parse_request(&body) {
        Ok(req) => service
            .classify(caller, &req)
            .await
            .map(|r| response_json(&r)),
        Err(e) => Err(e),
    };
    let answer = crate::metrics::counted("rest:Classify", answer);
    match answer {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(s) => error_response(&s),
    }
}

/// `GET /metrics`: the service's own metrics ([`crate::metrics`]).
async fn metrics() -> Response {
    let mut r = crate::metrics::render().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A gRPC status as a gRPC gateway writes it: the body, and the HTTP status its
/// `HTTPStatusFromCode` gives the code.
pub fn error_response(s: &Status) -> Response {
    let http = match s.code() {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    };
    json_response(
        http,
        &json!({"code": s.code() as i32, "message": s.message(), "details": []}),
    )
}

/// The claim fields: JSON name, schema name, and whether the value is an int64.
const CLAIM_FIELDS: &[(&str, &str, bool)] = &[
    ("route", "route", false),
    ("organizationPath", "organization_path", false),
    ("redirectRoute", "redirect_route", false),
    ("username", "username", false),
    ("email", "email", false),
    ("projectId", "project_id", true),
    ("namespaceId", "namespace_id", true),
    ("gpgKey", "gpg_key", false),
    ("sshKey", "ssh_key", false),
    ("userId", "user_id", true),
    ("organizationId", "organization_id", true),
    ("serviceDeskCustomEmail", "service_desk_custom_email", false),
    ("gpgKeyFingerprint", "gpg_key_fingerprint", false),
    (
        "serviceDeskProjectKeyAddressSlug",
        "service_desk_project_key_address_slug",
        false,
    ),
    ("sshKeyFingerprint", "ssh_key_fingerprint", false),
    ("snippetId", "snippet_id", true),
    ("pagesDomain", "pages_domain", false),
    ("pagesUniqueDomain", "pages_unique_domain", false),
];

fn bad(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

fn int64(v: &Value, field: &str) -> Result<i64, Status> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| bad(format!("{field}: an int64, as a number or a string")))
}

fn claim(v: &Value, at: &str) -> Result<Claim, Status> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad(format!("{at}: an object")))?;
    let mut found: Option<C> = None;
    for (k, value) in obj {
        let Some(i) = CLAIM_FIELDS
            .iter()
            .position(|(json, proto, _)| k == json || k == proto)
        else {
            continue;
        };
        if value.is_null() {
            continue;
        }
        if found.is_some() {
            return Err(bad(format!("{at}: more than one field of the claim oneof")));
        }
        let field = format!("{at}.{k}");
        let text = || {
            value
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("{field}: a string")))
        };
        found = Some(match i {
            0 => C::Route(text()?),
            1 => C::OrganizationPath(text()?),
            2 => C::RedirectRoute(text()?),
            3 => C::Username(text()?),
            4 => C::Email(text()?),
            5 => C::ProjectId(int64(value, &field)?),
            6 => C::NamespaceId(int64(value, &field)?),
            7 => C::GpgKey(text()?),
            8 => C::SshKey(text()?),
            9 => C::UserId(int64(value, &field)?),
            10 => C::OrganizationId(int64(value, &field)?),
            11 => C::ServiceDeskCustomEmail(text()?),
            12 => C::GpgKeyFingerprint(text()?),
            13 => C::ServiceDeskProjectKeyAddressSlug(text()?),
            14 => C::SshKeyFingerprint(text()?),
            15 => C::SnippetId(int64(value, &field)?),
            16 => C::PagesDomain(text()?),
            _ => C::PagesUniqueDomain(text()?),
        });
    }
    Ok(Claim { claim: found })
}

/// A `ClassifyRequest` from its JSON form.
pub fn parse_request(body: &[u8]) -> Result<ClassifyRequest, Status> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the body: a JSON object"))?;
    let mut req = ClassifyRequest::default();
    if let Some(t) = obj.get("type").filter(|t| !t.is_null()) {
        req.r#type = match t {
            Value::String(name) => ClassifyType::from_str_name(name)
                .map(|t| t as i32)
                .ok_or_else(|| bad(format!("type: unknown value {name:?}")))?,
            Value::Number(n) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| bad("type: an enum name or number"))?,
            _ => return Err(bad("type: an enum name or number")),
        };
    }
    if let Some(value) = obj.get("value").filter(|t| !t.is_null()) {
        req.value = value
            .as_str()
            .ok_or_else(|| bad("value: a string"))?
            .to_owned();
    }
    if let Some(claims) = obj.get("claims").filter(|t| !t.is_null()) {
        let list = claims.as_array().ok_or_else(|| bad("claims: an array"))?;
        for (i, c) in list.iter().enumerate() {
            req.claims.push(claim(c, &format!("claims[{i}]"))?);
        }
    }
    Ok(req)
}

/// A claim in proto3 JSON: its one field, int64s as strings.
pub fn claim_json(c: &Claim) -> Value {
    let Some(inner) = &c.claim else {
        return json!({});
    };
    let (i, value) = match inner {
        C::Route(v) => (0, json!(v)),
        C::OrganizationPath(v) => (1, json!(v)),
        C::RedirectRoute(v) => (2, json!(v)),
        C::Username(v) => (3, json!(v)),
        C::Email(v) => (4, json!(v)),
        C::ProjectId(v) => (5, json!(v.to_string())),
        C::NamespaceId(v) => (6, json!(v.to_string())),
        C::GpgKey(v) => (7, json!(v)),
        C::SshKey(v) => (8, json!(v)),
        C::UserId(v) => (9, json!(v.to_string())),
        C::OrganizationId(v) => (10, json!(v.to_string())),
        C::ServiceDeskCustomEmail(v) => (11, json!(v)),
        C::GpgKeyFingerprint(v) => (12, json!(v)),
        C::ServiceDeskProjectKeyAddressSlug(v) => (13, json!(v)),
        C::SshKeyFingerprint(v) => (14, json!(v)),
        C::SnippetId(v) => (15, json!(v.to_string())),
        C::PagesDomain(v) => (16, json!(v)),
        C::PagesUniqueDomain(v) => (17, json!(v)),
    };
    let mut m = Map::new();
    m.insert(CLAIM_FIELDS[i].0.to_owned(), value);
    Value::Object(m)
}

/// A `ClassifyResponse` in proto3 JSON.
pub fn response_json(r: &ClassifyResponse) -> Value {
    let mut m = Map::new();
    if r.action != 0 {
        let name = ClassifyAction::try_from(r.action)
            .map_or_else(|_| json!(r.action), |a| json!(a.as_str_name()));
        m.insert("action".into(), name);
    }
    if let Some(p) = &r.proxy {
        let mut proxy = Map::new();
        if !p.address.is_empty() {
            proxy.insert("address".into(), json!(p.address));
        }
        m.insert("proxy".into(), Value::Object(proxy));
    }
    if let Some(c) = &r.matched_claim {
        m.insert("matchedClaim".into(), claim_json(c));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_names_ints_and_enums_as_proto3_writes_them() {
        let req = parse_request(
            br#"{"claims":[{"route":"gitlab-org"},{"projectId":"278964"},{"project_id":7}],"unknown":1}"#,
        )
        .unwrap();
        assert_eq!(req.claims.len(), 3);
        assert_eq!(req.claims[1].claim, Some(C::ProjectId(278_964)));
        assert_eq!(req.claims[2].claim, Some(C::ProjectId(7)));
        let by_type = parse_request(br#"{"type":"SESSION_PREFIX","value":"cell-1"}"#).unwrap();
        assert_eq!(by_type.r#type, ClassifyType::SessionPrefix as i32);
        assert_eq!(parse_request(br#"{"type":3}"#).unwrap().r#type, 3);
        for bad in [
            &br#"{"type":"NOPE"}"#[..],
            br#"{"claims":[{"route":"a","email":"b"}]}"#,
            br#"{"claims":[{"projectId":"x"}]}"#,
            br#"[1]"#,
            b"{",
        ] {
            let e = parse_request(bad).unwrap_err();
            assert_eq!(
                e.code(),
                Code::InvalidArgument,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let out = response_json(&ClassifyResponse {
            action: ClassifyAction::Proxy as i32,
            proxy: Some(crate::proto::gitlab::cells::topology_service::ProxyInfo {
                address: "cell-2.example.com:443".into(),
            }),
            matched_claim: Some(Claim {
                claim: Some(C::ProjectId(278_964)),
            }),
        });
        assert_eq!(
            out,
            json!({"action":"PROXY","proxy":{"address":"cell-2.example.com:443"},"matchedClaim":{"projectId":"278964"}})
        );
    }
}
