//! The Kubernetes API proxy's requests as agentk makes them against the cluster's
//! API server with the agent's own `kube::Client`, so the client's own credentials
//! apply: a caller's `Authorization` never reaches the cluster. The framing of
//! `MakeRequest` is [`super::make_request`]'s; the answers of a workspace's port
//! (`WorkspaceRequest`, [`super::workspace_traffic`]) use `respond`: one
//! [`HttpResponsePart`] header, then the body in `data` chunks as it arrives.
//!
//! As GitLab's agentk (`internal/module/kubernetes_api/agent/server.go`,
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/kubernetes_api/agent/server.go>):
//! the request carries `Via: gRPC/1.0 <agentk>`, the response
//! `Via: <HTTP version> <agentk>`; impersonation (`restImpersonationConfig`) is
//! - none when neither kas nor the caller asks for it;
//! - kas's (`Impersonate-User`, one `Impersonate-Group` per group, `Impersonate-Uid`,
//!   `Impersonate-Extra-<key>` per value) when GitLab says access is as a user;
//! - the caller's own `Impersonate-*` headers when kas sets none (access as the agent:
//!   the agent's service account decides whether it may impersonate);
//! - refused ("nested impersonation is not supported") when both are present, so a
//!   user can never impersonate someone else through kas's impersonation.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and the headers it names,
//! `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`, `Proxy-Authorization`,
//! `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`) are dropped, except that an
//! upgrade request keeps `Upgrade` with `Connection: upgrade` (GitLab's
//! `cleanHeader`); `Host` and `Content-Length` on the request are left to hyper.

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::BodyExt as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use prost::Message as _;
use tonic::Status;

use super::tunnels::Responses;
use podgate_agent::httpz::{drop_hop_by_hop, from_values};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agent::proto::kubernetes_api::{
    Header, HttpRequest, HttpResponseHeader, HttpResponsePart, ImpersonationConfig,
    http_response_part,
};

/// Largest `data` chunk sent up the tunnel (a larger body frame is split), well
/// under gRPC's 4 MiB message limit.
pub const MAX_CHUNK: usize = 256 << 10;

/// What agentk calls itself in `Via`.
const AGENT: &str = concat!("podgate-agentk/", env!("CARGO_PKG_VERSION"));

/// GitLab's answer to a request with impersonation from both kas and the caller.
const NESTED: &str = "nested impersonation is not supported - agent is already configured to impersonate an identity";

/// Whether `name` is an impersonation header (`Impersonate-User`, `-Group`, `-Uid`,
/// `-Extra-*`), as client-go's `transport` constants name them.
fn is_impersonation(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "impersonate-user" | "impersonate-group" | "impersonate-uid"
    ) || n.starts_with("impersonate-extra-")
}

fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), Status> {
    let bad = || Status::invalid_argument(format!("header {name:?} is not a valid header"));
    Ok((
        HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?,
        HeaderValue::from_str(value).map_err(|_| bad())?,
    ))
}

/// kas's impersonation as request headers (also the Graph API's watches).
pub(crate) fn impersonate(
    headers: &mut HeaderMap,
    imp: &ImpersonationConfig,
) -> Result<(), Status> {
    let mut add = |name: &str, value: &str| -> Result<(), Status> {
        let (n, v) = header(name, value)?;
        headers.append(n, v);
        Ok(())
    };
    if !imp.username.is_empty() {
        add("Impersonate-User", &imp.username)?;
    }
    for g in &imp.groups {
        add("Impersonate-Group", g)?;
    }
    if !imp.uid.is_empty() {
        add("Impersonate-Uid", &imp.uid)?;
    }
    for e in &imp.extra {
        // Extra keys are percent-encoded in the header name (client-go does the
        // same for keys with characters a header name cannot hold).
        let key = utf8_percent_encode(&e.key, HEADER_KEY_ESCAPE);
        for v in &e.val {
            add(&format!("Impersonate-Extra-{key}"), v)?;
        }
    }
    Ok(())
}

/// client-go's `headerKeyEscape`: bytes other than RFC 7230 token characters
/// (`legalHeaderKeyBytes`), and `%` itself, as `%XX`.
const HEADER_KEY_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'*')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

fn is_empty(imp: &ImpersonationConfig) -> bool {
    imp.username.is_empty() && imp.groups.is_empty() && imp.uid.is_empty() && imp.extra.is_empty()
}

/// A tunnelled request's method, URI (`path` must start with `/`) and headers,
/// hop-by-hop headers dropped: what the API server's request and a workspace's
/// ([`super::workspace_traffic`]) start from.
pub(super) fn request_head(
    req: &HttpRequest,
) -> Result<(http::Method, http::Uri, HeaderMap), Status> {
    if !req.path.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "request path {:?} does not start with /",
            req.path
        )));
    }
    let method = http::Method::from_bytes(req.method.as_bytes())
        .map_err(|_| Status::invalid_argument(format!("bad method {:?}", req.method)))?;
    let uri: http::Uri = req
        .path
        .parse()
        .map_err(|_| Status::invalid_argument(format!("bad request path {:?}", req.path)))?;
    let mut headers = HeaderMap::new();
    for h in &req.headers {
        for v in &h.values {
            let (n, v) = header(&h.name, v)?;
            headers.append(n, v);
        }
    }
    drop_hop_by_hop(&mut headers);
    Ok((method, uri, headers))
}

/// The HTTP request for the API server (`server.go`'s `newRequest` and
/// `restImpersonationConfig`): `request`'s method, path, query (encoded as Go's
/// `url.Values.Encode`) and headers (hop-by-hop ones dropped, `Upgrade` kept with
/// `Connection: upgrade` when there; `Host`, `Content-Length` and `Authorization`
/// left to the client), kas's impersonation `imp`, agentk's `Via`, `body`.
pub(crate) fn build(
    request: &prototool::HttpRequest,
    imp: Option<&ImpersonationConfig>,
    body: Vec<u8>,
) -> Result<http::Request<kube::client::Body>, Status> {
    if !request.url_path.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "request path {:?} does not start with /",
            request.url_path
        )));
    }
    let method = http::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| Status::invalid_argument(format!("bad method {:?}", request.method)))?;
    let query = encode_query(&request.query);
    let path = if query.is_empty() {
        request.url_path.clone()
    } else {
        format!("{}?{query}", request.url_path)
    };
    let uri: http::Uri = path
        .parse()
        .map_err(|_| Status::invalid_argument(format!("bad request path {path:?}")))?;
    let mut headers = from_values(&request.header);
    let upgrade: Vec<HeaderValue> = headers
        .get_all(http::header::UPGRADE)
        .iter()
        .cloned()
        .collect();
    drop_hop_by_hop(&mut headers);
    if !upgrade.is_empty() {
        for v in upgrade {
            headers.append(http::header::UPGRADE, v);
        }
        headers.insert(
            http::header::CONNECTION,
            HeaderValue::from_static("upgrade"),
        );
    }
    for name in [
        http::header::HOST,
        http::header::CONTENT_LENGTH,
        http::header::AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    let caller_impersonates = headers.keys().any(|k| is_impersonation(k.as_str()));
    match imp.filter(|i| !is_empty(i)) {
        Some(_) if caller_impersonates => return Err(Status::permission_denied(NESTED)),
        Some(imp) => impersonate(&mut headers, imp)?,
        None => {}
    }
    headers.append(
        http::header::VIA,
        HeaderValue::from_static(concat!(
            "gRPC/1.0 podgate-agentk/",
            env!("CARGO_PKG_VERSION")
        )),
    );
    let mut req = http::Request::new(kube::client::Body::from(body));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Ok(req)
}

/// Go's `url.Values.Encode`: keys sorted, `QueryEscape`d keys and values (a space
/// is `+`).
fn encode_query(query: &std::collections::HashMap<String, prototool::Values>) -> String {
    let escape = |s: &str| {
        utf8_percent_encode(s, QUERY_ESCAPE)
            .to_string()
            .replace("%20", "+")
    };
    let mut keys: Vec<&String> = query.keys().collect();
    keys.sort_unstable();
    let mut out = Vec::new();
    for k in keys {
        for v in &query[k].value {
            out.push(format!("{}={}", escape(k), escape(v)));
        }
    }
    out.join("&")
}

/// What Go's `QueryEscape` leaves as it is: letters, digits, `-_.~`.
const QUERY_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// agentk's `Via` on a response of HTTP `version`.
pub(crate) fn via(version: http::Version) -> HeaderValue {
    HeaderValue::from_str(&format!("{} {AGENT}", version_name(version)))
        .expect("a valid header value")
}

fn part(p: http_response_part::Part) -> Vec<u8> {
    HttpResponsePart { part: Some(p) }.encode_to_vec()
}

/// The response as tunnel messages: the header, then the body chunk by chunk
/// (also a workspace's answers, [`super::workspace_traffic`]).
pub(crate) fn respond<B>(response: http::Response<B>) -> Responses
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    let (mut head, body) = response.into_parts();
    drop_hop_by_hop(&mut head.headers);
    head.headers.append(http::header::VIA, via(head.version));
    let mut headers: Vec<Header> = Vec::new();
    for (name, value) in &head.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.iter_mut().find(|h| h.name == name.as_str()) {
            Some(h) => h.values.push(value),
            None => headers.push(Header {
                name: name.as_str().to_owned(),
                values: vec![value],
            }),
        }
    }
    let first = part(http_response_part::Part::Header(HttpResponseHeader {
        status: i32::from(head.status.as_u16()),
        headers,
    }));
    let chunks = body
        .into_data_stream()
        .map(|chunk| match chunk {
            Ok(data) => Ok(split(data)),
            Err(e) => {
                tracing::debug!(error = %e, "upstream response body broke");
                Err(Status::unavailable(format!(
                    "upstream response body broke: {e}"
                )))
            }
        })
        .flat_map(|r| match r {
            Ok(parts) => futures_util::stream::iter(parts.into_iter().map(Ok)).left_stream(),
            Err(e) => futures_util::stream::once(async move { Err(e) }).right_stream(),
        });
    Box::pin(futures_util::stream::once(async move { Ok(first) }).chain(chunks))
}

/// One body frame as `data` parts of at most [`MAX_CHUNK`] bytes.
fn split(data: Bytes) -> Vec<Vec<u8>> {
    data.chunks(MAX_CHUNK)
        .map(|c| part(http_response_part::Part::Data(c.to_vec())))
        .collect()
}

fn version_name(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2.0",
        http::Version::HTTP_3 => "3.0",
        _ => "1.1",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> prototool::HttpRequest {
        let mut h: std::collections::HashMap<String, prototool::Values> = Default::default();
        for (n, v) in headers {
            h.entry((*n).into()).or_default().value.push((*v).into());
        }
        let query = [("watch", "1"), ("labelSelector", "a b")]
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_owned(),
                    prototool::Values {
                        value: vec![v.to_owned()],
                    },
                )
            })
            .collect();
        prototool::HttpRequest {
            method: "GET".into(),
            header: h,
            url_path: "/api/v1/pods".into(),
            query,
        }
    }

    fn build(
        r: prototool::HttpRequest,
        imp: Option<ImpersonationConfig>,
    ) -> Result<http::Request<kube::client::Body>, Status> {
        super::build(&r, imp.as_ref(), Vec::new())
    }

    #[test]
    fn hop_by_hop_and_credentials_are_dropped_and_kas_impersonation_added() {
        let imp = ImpersonationConfig {
            username: "gitlab:user:alice".into(),
            groups: vec![
                "gitlab:user".into(),
                "gitlab:project_role:7:developer".into(),
            ],
            uid: "gitlab:user:1".into(),
            extra: vec![
                podgate_agent::proto::kubernetes_api::ExtraKeyVal {
                    key: "agent.gitlab.com/id".into(),
                    val: vec!["3".into()],
                },
                podgate_agent::proto::kubernetes_api::ExtraKeyVal {
                    key: "a+b%c é".into(),
                    val: vec!["4".into()],
                },
            ],
        };
        let r = build(
            request(&[
                ("Connection", "keep-alive, X-Secret"),
                ("X-Secret", "s"),
                ("Keep-Alive", "timeout=5"),
                ("Authorization", "Bearer pat:3:glpat-x"),
                ("Host", "gitlab.example.com"),
                ("Accept", "application/json"),
            ]),
            Some(imp),
        )
        .unwrap();
        let h = r.headers();
        for gone in [
            "connection",
            "x-secret",
            "keep-alive",
            "authorization",
            "host",
        ] {
            assert!(h.get(gone).is_none(), "{gone} forwarded");
        }
        assert_eq!(h["accept"], "application/json");
        assert_eq!(h["impersonate-user"], "gitlab:user:alice");
        let groups: Vec<_> = h.get_all("impersonate-group").iter().collect();
        assert_eq!(groups, ["gitlab:user", "gitlab:project_role:7:developer"]);
        assert_eq!(h["impersonate-uid"], "gitlab:user:1");
        assert_eq!(h["impersonate-extra-agent.gitlab.com%2Fid"], "3");
        assert_eq!(h["impersonate-extra-a+b%25c%20%C3%A9"], "4");
        assert!(
            h["via"]
                .to_str()
                .unwrap()
                .starts_with("gRPC/1.0 podgate-agentk/")
        );
        assert_eq!(r.uri(), "/api/v1/pods?labelSelector=a+b&watch=1");
        let r = build(
            request(&[("Upgrade", "SPDY/3.1"), ("Connection", "Upgrade, X-Secret")]),
            None,
        )
        .unwrap();
        assert_eq!(r.headers()["upgrade"], "SPDY/3.1");
        assert_eq!(r.headers()["connection"], "upgrade");
    }

    #[test]
    fn caller_impersonation_passes_alone_and_is_refused_with_kas_impersonation() {
        let caller = [("Impersonate-User", "admin")];
        let r = build(request(&caller), None).unwrap();
        assert_eq!(r.headers()["impersonate-user"], "admin");
        let imp = ImpersonationConfig {
            username: "gitlab:user:alice".into(),
            ..Default::default()
        };
        let e = build(request(&caller), Some(imp.clone())).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("nested impersonation"));
        let e = build(request(&[("Impersonate-Extra-Scopes", "x")]), Some(imp)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        // An empty impersonation config is no impersonation.
        let r = build(request(&caller), Some(ImpersonationConfig::default())).unwrap();
        assert_eq!(r.headers()["impersonate-user"], "admin");
    }

    #[test]
    fn large_frames_are_split() {
        let parts = split(Bytes::from(vec![7u8; MAX_CHUNK * 2 + 1]));
        assert_eq!(parts.len(), 3);
        let last = HttpResponsePart::decode(parts[2].as_slice()).unwrap();
        assert_eq!(last.part, Some(http_response_part::Part::Data(vec![7])));
    }
}
