//! GitLab fidelity: the proxy routes every request by the token GitLab itself would
//! authenticate, refuses what it cannot route safely, and never sends a request to a Pod
//! other than the one that token belongs to. This file is the contract of issue 11.
//!
//! The real `podgate proxy` binary runs in front of three recording stub Pods (Pod 1 is
//! the default, legacy Pod). Each case is one raw HTTP request (bytes exactly as a client
//! writes them, sometimes in several writes with pauses) with:
//!
//! - `gitlab`: which token GitLab would authenticate for it and why, naming the GitLab
//!   (or Rack, Grape, Workhorse) source file that decides;
//! - `expect`: the Pod that must receive it (exactly once, byte-identical body, original
//!   request target, no hop-by-hop token header), or the refusal the proxy must answer
//!   (status and reason), in which case no Pod may see it at all.
//!
//! On top of GitLab's own choice the proxy applies a safety rule: every token present in
//! any source GitLab might read for that endpoint (each repeated value counts, and the
//! `RUNNER-TOKEN` header that routers read on runner endpoints) must name the same Pod
//! (an unroutable token names the default Pod). An invalid one gives 401, two that name
//! different Pods give 400 `conflicting_tokens`.
//!
//! Every case carries a unique `x-fidelity-case` header so cases can run concurrently and
//! each Pod's record can be searched for exactly that request. All failing cases are
//! reported together.

use crate::common;

mod bodies;
mod git;
mod harness;

use harness::{parse, run, seen_by};
mod hop_by_hop;
mod http_edges;
mod params;
mod paths;
mod smuggling;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::metrics::value_or_zero;
use common::{Seen, Stub, gitlab_token, start_proxy, three_pods};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};

// ---------------------------------------------------------------------------------------
// GitLab sources each case cites.

/// Runner endpoints (`/api/v4/runners*`, `jobs/request`).
const RUNNER_AUTH: &str = "lib/api/ci/helpers/runner.rb #current_runner authenticates \
    params[:token] only (403 if unknown; Grape `requires :token` gives 400 if missing). \
    params = Rack GET.merge(POST) (rack lib/rack/request.rb #params; a JSON body is merged \
    into the form hash by grape lib/grape/middleware/formatter.rb #read_body_input), so a \
    body token beats the query, and a repeated key keeps its last value (rack \
    lib/rack/query_parser.rb #normalize_params; Ruby JSON keeps the last duplicate key). \
    RUNNER-TOKEN is not read by Rails for these endpoints, but routers read it";

/// Job endpoints (`PUT /jobs/:id`, `PATCH trace`, artifacts upload/authorize).
const JOB_AUTH: &str = "lib/api/ci/helpers/runner.rb #job_token = (params[:token] || \
    env['HTTP_JOB_TOKEN']): the `token` param (body beats query, last repeated value wins, \
    rack lib/rack/request.rb and lib/rack/query_parser.rb) first, then the JOB-TOKEN header";

/// Any other API route (and `GET /jobs/:id/artifacts`, which uses `authenticate!`).
const API_AUTH: &str = "lib/api/api_guard.rb #find_user_from_sources with \
    lib/gitlab/auth/auth_finders.rb: deploy token (Deploy-Token header, Basic password) \
    on deploy_token_allowed routes; OAuth/job bearer (access_token param, Authorization: \
    Bearer, bearer_token param); PAT (private_token param, then PRIVATE-TOKEN header, \
    Basic on basic_auth_personal_access_token routes); job token (Basic gitlab-ci-token, \
    then job_token param, then token param, then JOB-TOKEN header)";

/// Git smart HTTP, LFS and the registry's `/jwt/auth`.
const GIT_AUTH: &str = "lib/gitlab/auth.rb #find_for_git_client (used by \
    app/controllers/repositories/git_http_client_controller.rb, the LFS controllers and \
    app/controllers/jwt_controller.rb): HTTP Basic; login gitlab-ci-token authenticates \
    the password as a job token (#build_access_token_check), any other login a PAT, \
    deploy token or password";

/// Paths.
const PATH_RULES: &str = "Workhorse internal/urlprefix/urlprefix.go #CleanURIPath \
    (path.Clean: `//` squeezed, `.`/`..` resolved, a trailing `/` kept) routes the request; \
    Rails ActionDispatch::Journey::Router::Utils.normalize_path squeezes `//` and drops a \
    trailing `/`; Grape accepts the `.json` format suffix (API format :json)";

/// Connection-listed headers.
const HOP_BY_HOP: &str = "RFC 9110 §7.6.1: a header named in Connection is hop-by-hop, \
    removed by the first intermediary (Workhorse's Go net/http proxy does), so GitLab never \
    sees it";

/// Multipart parsing.
const RACK_MULTIPART: &str = "rack lib/rack/multipart/parser.rb: the Content-Disposition \
    header name and (Rack 2.2: MULTIPART_CONTENT_DISPOSITION /…name=…/ni) the `name` \
    parameter are case-insensitive, the field name itself is a case-sensitive params key; \
    parts are read in order, the token may follow a file part";

// ---------------------------------------------------------------------------------------
// Tokens.

/// A token as a case specifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    /// A GitLab v1 routable token naming this Pod.
    Pod(u64),
    /// A legacy random token: unroutable, so the default Pod 1.
    Legacy,
    /// A v1 token whose CRC is wrong: invalid.
    Invalid,
}

impl Tok {
    /// The Pod this token sends a request to (`None` for an invalid one).
    fn pod(self) -> Option<u64> {
        match self {
            Tok::Pod(p) => Some(p),
            Tok::Legacy => Some(1),
            Tok::Invalid => None,
        }
    }

    fn describe(self) -> String {
        match self {
            Tok::Pod(p) => format!("Pod {p}"),
            Tok::Legacy => "unroutable (default Pod 1)".into(),
            Tok::Invalid => "invalid (bad CRC)".into(),
        }
    }

    /// A fresh token of this kind with a GitLab prefix (`glrt-`, `glcbt-`, …).
    fn mint(self, prefix: &str) -> String {
        match self {
            Tok::Pod(p) => gitlab_token(prefix, p),
            Tok::Legacy => {
                let random = random_hex();
                if prefix == "glcbt-" {
                    format!("glcbt-64_{random}")
                } else {
                    format!("{prefix}{random}")
                }
            }
            Tok::Invalid => corrupt(&gitlab_token(prefix, 2)),
        }
    }
}

fn random_hex() -> String {
    podgate_tokens::gitlab::random_bytes()
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The same token with its last CRC character changed: invalid.
fn corrupt(token: &str) -> String {
    let (head, last) = token.split_at(token.len() - 1);
    let other = if last == "0" { "1" } else { "0" };
    format!("{head}{other}")
}

/// HTTP Basic credentials.
fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

// ---------------------------------------------------------------------------------------
// Requests.

/// One request, written to the wire by [`Req::wire`].
#[derive(Clone, Debug)]
struct Req {
    method: String,
    /// The request target exactly as sent (path and query).
    target: String,
    version: &'static str,
    host: bool,
    headers: Vec<(String, String)>,
    /// The `Connection` header's value ("" for none).
    connection: String,
    body: Vec<u8>,
    /// Send `content-length` even for an empty body (POST/PUT/PATCH/DELETE).
    length: bool,
    chunked: bool,
}

impl Req {
    fn new(method: &str, target: &str) -> Req {
        Req {
            method: method.into(),
            target: target.into(),
            version: "HTTP/1.1",
            host: true,
            headers: Vec::new(),
            connection: "close".into(),
            body: Vec::new(),
            length: !matches!(method, "GET" | "HEAD"),
            chunked: false,
        }
    }

    fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn body(mut self, content_type: &str, body: Vec<u8>) -> Req {
        if !content_type.is_empty() {
            self.headers
                .push(("content-type".into(), content_type.into()));
        }
        self.body = body;
        self.length = true;
        self
    }

    fn connection(mut self, value: &str) -> Req {
        self.connection = value.into();
        self
    }

    /// The head lines (without the final empty line), each without CRLF.
    fn head_lines(&self, case: usize) -> Vec<String> {
        let mut lines = vec![format!("{} {} {}", self.method, self.target, self.version)];
        if self.host {
            lines.push("host: gitlab.example.com".into());
        }
        lines.push(format!("x-fidelity-case: {case}"));
        for (k, v) in &self.headers {
            lines.push(format!("{k}: {v}"));
        }
        if !self.connection.is_empty() {
            lines.push(format!("connection: {}", self.connection));
        }
        if self.chunked {
            lines.push("transfer-encoding: chunked".into());
        } else if self.length || !self.body.is_empty() {
            lines.push(format!("content-length: {}", self.body.len()));
        }
        lines
    }

    fn head(&self, case: usize) -> Vec<u8> {
        let mut head = String::new();
        for l in self.head_lines(case) {
            head.push_str(&l);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        head.into_bytes()
    }

    /// The body as framed on the wire.
    fn wire_body(&self) -> Vec<u8> {
        if !self.chunked {
            return self.body.clone();
        }
        let mut out = Vec::new();
        for chunk in self.body.chunks(16 * 1024) {
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    fn wire(&self, case: usize) -> Vec<u8> {
        let mut out = self.head(case);
        out.extend_from_slice(&self.wire_body());
        out
    }
}

fn with_query(path: &str, pairs: &[(String, String)]) -> String {
    let mut target = path.to_owned();
    for (k, v) in pairs {
        target.push(if target.contains('?') { '&' } else { '?' });
        target.push_str(&format!("{k}={v}"));
    }
    target
}

/// `{"k":"v",…}` in this order (duplicate keys kept as written).
fn json_body(fields: &[(&str, &str)]) -> Vec<u8> {
    let inner: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("\"{k}\":\"{v}\""))
        .collect();
    format!("{{{}}}", inner.join(",")).into_bytes()
}

/// `k=v&…` (tokens and our values need no escaping).
fn form_body(fields: &[(&str, &str)]) -> Vec<u8> {
    fields
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
        .into_bytes()
}

const BOUNDARY: &str = "----fidelityBoundary7MA4YWxkTrZu0gW";

fn mp_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// A multipart part: its header lines and its content.
struct Part {
    headers: String,
    content: Vec<u8>,
}

fn field(name: &str, value: &str) -> Part {
    Part {
        headers: format!("Content-Disposition: form-data; name=\"{name}\""),
        content: value.as_bytes().to_vec(),
    }
}

fn file_part(len: usize) -> Part {
    let mut content = b"PK\x03\x04".to_vec();
    // Not valid UTF-8 and full of CR/LF and dashes, like a real archive.
    content.extend((0..len.saturating_sub(4)).map(|i| match i % 7 {
        0 => b'\r',
        1 => b'\n',
        2 => b'-',
        3 => 0xff,
        _ => (i % 251) as u8,
    }));
    Part {
        headers: "Content-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\n\
                  Content-Type: application/zip"
            .into(),
        content,
    }
}

fn multipart_with(boundary: &str, parts: &[Part]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(format!("--{boundary}\r\n{}\r\n\r\n", p.headers).as_bytes());
        out.extend_from_slice(&p.content);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

fn multipart(parts: &[Part]) -> Vec<u8> {
    multipart_with(BOUNDARY, parts)
}

// ---------------------------------------------------------------------------------------
// Cases.

/// What must happen.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    /// Forwarded to exactly this Pod, byte-identical, nowhere else.
    Pod(u64),
    /// Refused with this status; the JSON `message` (or the body) contains the reason.
    Refused(u16, &'static str),
}

impl Expect {
    fn describe(&self) -> String {
        match self {
            Expect::Pod(p) => format!("reach Pod {p}"),
            Expect::Refused(s, "") => format!("refused {s}"),
            Expect::Refused(s, why) => format!("refused {s} {why}"),
        }
    }
}

/// How the client writes the request.
#[derive(Clone, Copy, Debug)]
enum Delivery {
    /// One write.
    Whole,
    /// The head and the first `first` body bytes, then `piece`-byte writes with
    /// `pause_ms` between them (a short first read for the proxy).
    Pieces {
        first: usize,
        piece: usize,
        pause_ms: u64,
    },
    /// One head line per write, `pause_ms` apart, then the body.
    SlowHead { pause_ms: u64 },
    /// The head, then wait for `100 Continue` (at most 2 s, as curl waits 1 s), then
    /// the body.
    Expect100,
}

/// One step of a client's writes.
enum Step {
    Send(Vec<u8>),
    Pause(Duration),
    Await100,
}

struct Case {
    name: String,
    /// Which token GitLab authenticates and why (GitLab source file).
    gitlab: String,
    req: Req,
    delivery: Delivery,
    expect: Expect,
    /// Headers that must not reach the Pod (hop-by-hop, listed in `Connection`).
    stripped: Vec<&'static str>,
}

impl Case {
    fn new(name: impl Into<String>, gitlab: impl Into<String>, req: Req, expect: Expect) -> Case {
        Case {
            name: name.into(),
            gitlab: gitlab.into(),
            req,
            delivery: Delivery::Whole,
            expect,
            stripped: Vec::new(),
        }
    }

    fn delivery(mut self, d: Delivery) -> Case {
        self.delivery = d;
        self
    }

    fn stripped(mut self, h: &'static str) -> Case {
        self.stripped.push(h);
        self
    }

    fn steps(&self, id: usize) -> Vec<Step> {
        match self.delivery {
            Delivery::Whole => vec![Step::Send(self.req.wire(id))],
            Delivery::Pieces {
                first,
                piece,
                pause_ms,
            } => {
                let body = self.req.wire_body();
                let first = first.min(body.len());
                let mut head = self.req.head(id);
                head.extend_from_slice(&body[..first]);
                let mut steps = vec![Step::Send(head)];
                for chunk in body[first..].chunks(piece.max(1)) {
                    steps.push(Step::Pause(Duration::from_millis(pause_ms)));
                    steps.push(Step::Send(chunk.to_vec()));
                }
                steps
            }
            Delivery::SlowHead { pause_ms } => {
                let mut steps = Vec::new();
                for l in self.req.head_lines(id) {
                    steps.push(Step::Send(format!("{l}\r\n").into_bytes()));
                    steps.push(Step::Pause(Duration::from_millis(pause_ms)));
                }
                let mut rest = b"\r\n".to_vec();
                rest.extend_from_slice(&self.req.wire_body());
                steps.push(Step::Send(rest));
                steps
            }
            Delivery::Expect100 => vec![
                Step::Send(self.req.head(id)),
                Step::Await100,
                Step::Send(self.req.wire_body()),
            ],
        }
    }
}

/// The outcome the contract requires for this set of tokens (all the tokens the proxy
/// must consider); `none` when there are none.
fn outcome(toks: &[Tok], none: Expect) -> Expect {
    if toks.contains(&Tok::Invalid) {
        return Expect::Refused(401, "401");
    }
    let pods: HashSet<u64> = toks.iter().filter_map(|t| t.pod()).collect();
    match pods.len() {
        0 => none,
        1 => Expect::Pod(*pods.iter().next().unwrap()),
        _ => Expect::Refused(400, "conflicting_tokens"),
    }
}

// ---------------------------------------------------------------------------------------
// The source matrix: endpoints and where their tokens can be.

/// Where a token is put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    Query(&'static str),
    Header(&'static str),
    /// The `token` field of a JSON body.
    Json,
    /// The `token` field of a form-urlencoded body.
    Form,
    /// A `token` part of a multipart body.
    Multipart,
    Bearer,
    /// HTTP Basic with this user name; the token is the password.
    Basic(&'static str),
}

impl Src {
    fn is_body(self) -> bool {
        matches!(self, Src::Json | Src::Form | Src::Multipart)
    }

    fn is_authorization(self) -> bool {
        matches!(self, Src::Bearer | Src::Basic(_))
    }

    fn describe(self) -> String {
        match self {
            Src::Query(q) => format!("query {q}"),
            Src::Header(h) => format!("{} header", h.to_ascii_uppercase()),
            Src::Json => "JSON body token".into(),
            Src::Form => "form body token".into(),
            Src::Multipart => "multipart token part".into(),
            Src::Bearer => "Authorization: Bearer".into(),
            Src::Basic(u) => format!("Basic {u}:<token>"),
        }
    }
}

/// Which family of GitLab authentication an endpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Runner,
    Job,
    Api,
}

/// The body an endpoint carries when no body token is put in it.
#[derive(Clone, Copy, Debug)]
enum Body {
    None,
    Json,
    Text,
    File,
}

struct Endpoint {
    label: &'static str,
    method: &'static str,
    path: &'static str,
    family: Family,
    /// Other body fields (before the token fields).
    fields: &'static [(&'static str, &'static str)],
    default: Body,
}

const RUNNER_ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        label: "register",
        method: "POST",
        path: "/api/v4/runners",
        family: Family::Runner,
        fields: &[("description", "fidelity")],
        default: Body::Json,
    },
    Endpoint {
        label: "verify",
        method: "POST",
        path: "/api/v4/runners/verify",
        family: Family::Runner,
        fields: &[("system_id", "s_fidelity")],
        default: Body::Json,
    },
    Endpoint {
        label: "reset-token",
        method: "POST",
        path: "/api/v4/runners/reset_authentication_token",
        family: Family::Runner,
        fields: &[],
        default: Body::Json,
    },
    Endpoint {
        label: "unregister",
        method: "DELETE",
        path: "/api/v4/runners",
        family: Family::Runner,
        fields: &[],
        default: Body::Json,
    },
    Endpoint {
        label: "unregister-manager",
        method: "DELETE",
        path: "/api/v4/runners/managers",
        family: Family::Runner,
        fields: &[("system_id", "s_fidelity")],
        default: Body::Json,
    },
    Endpoint {
        label: "jobs-request",
        method: "POST",
        path: "/api/v4/jobs/request",
        family: Family::Runner,
        fields: &[("last_update", "t1")],
        default: Body::Json,
    },
];

const JOB_ENDPOINTS: &[Endpoint] = &[
    Endpoint {
        label: "job-update",
        method: "PUT",
        path: "/api/v4/jobs/7",
        family: Family::Job,
        fields: &[("state", "running")],
        default: Body::Json,
    },
    Endpoint {
        label: "trace",
        method: "PATCH",
        path: "/api/v4/jobs/7/trace",
        family: Family::Job,
        fields: &[],
        default: Body::Text,
    },
    Endpoint {
        label: "artifacts-upload",
        method: "POST",
        path: "/api/v4/jobs/7/artifacts?artifact_format=zip&artifact_type=archive",
        family: Family::Job,
        fields: &[],
        default: Body::File,
    },
];

impl Endpoint {
    /// The token prefix a client would use in this source.
    fn prefix(&self, src: Src) -> &'static str {
        match (self.family, src) {
            (Family::Runner, _) => "glrt-",
            (Family::Job, _) => "glcbt-",
            (_, Src::Header("deploy-token")) => "gldt-",
            (_, Src::Basic("gitlab-ci-token")) => "glcbt-",
            (
                _,
                Src::Query("private_token" | "access_token" | "bearer_token")
                | Src::Header("private-token")
                | Src::Bearer
                | Src::Basic(_),
            ) => "glpat-",
            _ => "glcbt-",
        }
    }

    /// The request carrying these tokens, in this order.
    fn request(&self, tokens: &[(Src, String)]) -> Req {
        let query: Vec<(String, String)> = tokens
            .iter()
            .filter_map(|(s, t)| match s {
                Src::Query(q) => Some(((*q).to_owned(), t.clone())),
                _ => None,
            })
            .collect();
        let mut req = Req::new(self.method, &with_query(self.path, &query));
        for (s, t) in tokens {
            req = match s {
                Src::Header(h) => req.header(h, t),
                Src::Bearer => req.header("authorization", &format!("Bearer {t}")),
                Src::Basic(u) => req.header("authorization", &basic(u, t)),
                _ => req,
            };
        }
        let body_kind = tokens.iter().map(|(s, _)| *s).find(|s| s.is_body());
        let body_tokens: Vec<&str> = tokens
            .iter()
            .filter(|(s, _)| s.is_body())
            .map(|(_, t)| t.as_str())
            .collect();
        let mut fields: Vec<(&str, &str)> = self.fields.to_vec();
        fields.extend(body_tokens.iter().map(|t| ("token", *t)));
        match body_kind {
            Some(Src::Json) => req.body("application/json", json_body(&fields)),
            Some(Src::Form) => req.body("application/x-www-form-urlencoded", form_body(&fields)),
            Some(_) => {
                let mut parts: Vec<Part> = fields.iter().map(|(k, v)| field(k, v)).collect();
                if matches!(self.default, Body::File) {
                    parts.push(file_part(512));
                }
                req.body(&mp_type(), multipart(&parts))
            }
            None => match self.default {
                Body::None => req,
                Body::Json => req.body("application/json", json_body(&fields)),
                Body::Text => req
                    .header("content-range", "0-17")
                    .body("text/plain", b"Running on fidelity\n".to_vec()),
                Body::File => req.body(&mp_type(), multipart(&[file_part(512)])),
            },
        }
    }

    /// Which of these tokens GitLab authenticates, and the rule that says so.
    fn gitlab(&self, tokens: &[(Src, Tok)]) -> String {
        let last = |pred: &dyn Fn(Src) -> bool| tokens.iter().rev().find(|(s, _)| pred(*s));
        let chosen = match self.family {
            Family::Runner => {
                last(&|s| s.is_body()).or_else(|| last(&|s| s == Src::Query("token")))
            }
            Family::Job => last(&|s| s.is_body())
                .or_else(|| last(&|s| s == Src::Query("token")))
                .or_else(|| tokens.iter().find(|(s, _)| *s == Src::Header("job-token"))),
            Family::Api => {
                const ORDER: &[Src] = &[
                    Src::Header("deploy-token"),
                    Src::Query("access_token"),
                    Src::Bearer,
                    Src::Query("bearer_token"),
                    Src::Query("private_token"),
                    Src::Header("private-token"),
                    Src::Basic("jane"),
                    Src::Basic("gitlab-ci-token"),
                    Src::Query("job_token"),
                    Src::Query("token"),
                    Src::Header("job-token"),
                ];
                ORDER
                    .iter()
                    .find_map(|o| tokens.iter().rev().find(|(s, _)| s == o))
            }
        };
        let rule = match self.family {
            Family::Runner => RUNNER_AUTH,
            Family::Job => JOB_AUTH,
            Family::Api => API_AUTH,
        };
        let who = match chosen {
            Some((s, t)) => format!(
                "GitLab authenticates the {} ({})",
                s.describe(),
                t.describe()
            ),
            None => "GitLab finds no token it reads here".into(),
        };
        let all: Vec<String> = tokens
            .iter()
            .map(|(s, t)| format!("{} = {}", s.describe(), t.describe()))
            .collect();
        // Workhorse pre-authorizes an upload with the query and headers only.
        let workhorse = if self.label == "artifacts-upload" {
            " Through Workhorse the /authorize step sees only the query and the headers \
             (workhorse/internal/api/api.go #newRequest sends no body), so a token that is \
             only in the body fails with 403 on every Pod: routing by it is harmless."
        } else {
            ""
        };
        format!(
            "{who}; tokens present (each counts for the safety rule): [{}]. {rule}.{workhorse}",
            all.join(", ")
        )
    }

    fn case(&self, tokens: &[(Src, Tok)], none: Expect) -> Case {
        let minted: Vec<(Src, String)> = tokens
            .iter()
            .map(|(s, t)| (*s, t.mint(self.prefix(*s))))
            .collect();
        let name = format!(
            "{} {}: {}",
            self.label,
            self.method,
            tokens
                .iter()
                .map(|(s, t)| format!("{}={}", s.describe(), t.describe()))
                .collect::<Vec<_>>()
                .join(" + ")
        );
        let toks: Vec<Tok> = tokens.iter().map(|(_, t)| *t).collect();
        Case::new(
            name,
            self.gitlab(tokens),
            self.request(&minted),
            outcome(&toks, none),
        )
    }
}

/// Every source of a runner or job endpoint alone, every pair of sources (and every
/// source repeated) agreeing and conflicting, invalid and unroutable tokens beside
/// routable ones, and no token at all.
fn body_endpoint_matrix(ep: &Endpoint, cases: &mut Vec<Case>) {
    let header = match ep.family {
        Family::Runner => Src::Header("runner-token"),
        _ => Src::Header("job-token"),
    };
    let q = Src::Query("token");
    let none = Expect::Refused(400, "token_not_found");
    let singles = [q, Src::Json, Src::Form, Src::Multipart, header];
    for s in singles {
        cases.push(ep.case(&[(s, Tok::Pod(3))], none.clone()));
        cases.push(ep.case(&[(s, Tok::Pod(2))], none.clone()));
    }
    let mut pairs = Vec::new();
    for b in [Src::Json, Src::Form, Src::Multipart] {
        pairs.push((q, b));
        pairs.push((b, header));
    }
    pairs.push((q, header));
    for s in singles {
        pairs.push((s, s));
    }
    for (a, b) in pairs {
        cases.push(ep.case(&[(a, Tok::Pod(2)), (b, Tok::Pod(3))], none.clone()));
        cases.push(ep.case(&[(a, Tok::Pod(3)), (b, Tok::Pod(2))], none.clone()));
        cases.push(ep.case(&[(a, Tok::Pod(3)), (b, Tok::Pod(3))], none.clone()));
    }
    // GitLab reads the body and ignores the invalid query token: still refused.
    cases.push(ep.case(&[(q, Tok::Invalid), (Src::Json, Tok::Pod(2))], none.clone()));
    cases.push(ep.case(
        &[(Src::Form, Tok::Invalid), (header, Tok::Pod(2))],
        none.clone(),
    ));
    cases.push(ep.case(
        &[(Src::Multipart, Tok::Pod(3)), (header, Tok::Invalid)],
        none.clone(),
    ));
    // Rack keeps the last repeated value, the first is still a token.
    cases.push(ep.case(&[(q, Tok::Invalid), (q, Tok::Pod(2))], none.clone()));
    cases.push(ep.case(
        &[(Src::Form, Tok::Pod(3)), (Src::Form, Tok::Invalid)],
        none.clone(),
    ));
    // An unroutable token names the default Pod.
    cases.push(ep.case(&[(Src::Multipart, Tok::Legacy)], none.clone()));
    cases.push(ep.case(&[(q, Tok::Legacy), (Src::Form, Tok::Pod(2))], none.clone()));
    cases.push(ep.case(
        &[(Src::Json, Tok::Legacy), (header, Tok::Pod(1))],
        none.clone(),
    ));
    cases.push(ep.case(&[(Src::Json, Tok::Invalid)], none.clone()));
    // No token anywhere: the body was inspected and holds none. (A trace's text/plain
    // body is not inspected, so its case sends a form body without a token.)
    let mut empty = ep.case(&[], none);
    empty.name = format!("{} {}: no token in an inspected body", ep.label, ep.method);
    if matches!(ep.default, Body::Text) {
        empty.req = Req::new(ep.method, ep.path).body(
            "application/x-www-form-urlencoded",
            b"state=running".to_vec(),
        );
    }
    cases.push(empty);
}

/// A generic API route that takes every credential (generic packages:
/// lib/api/generic_packages.rb sets job_token_allowed, basic_auth_personal_access_token
/// and deploy_token_allowed).
const API_ENDPOINT: Endpoint = Endpoint {
    label: "api",
    method: "GET",
    path: "/api/v4/projects/5/packages/generic/pkg/1.0.0/file.bin",
    family: Family::Api,
    fields: &[],
    default: Body::None,
};

/// Artifact download by a dependent job: `authenticate_job_via_dependent_job!` runs the
/// generic API authentication (lib/api/ci/runner.rb).
const DOWNLOAD_ENDPOINT: Endpoint = Endpoint {
    label: "artifacts-download",
    method: "GET",
    path: "/api/v4/jobs/7/artifacts",
    family: Family::Api,
    fields: &[],
    default: Body::None,
};

fn api_matrix(ep: &Endpoint, sources: &[Src], cases: &mut Vec<Case>) {
    let none = Expect::Pod(1);
    for &s in sources {
        cases.push(ep.case(&[(s, Tok::Pod(3))], none.clone()));
    }
    for (i, &a) in sources.iter().enumerate() {
        for &b in &sources[i + 1..] {
            if a.is_authorization() && b.is_authorization() {
                continue; // one Authorization header
            }
            cases.push(ep.case(&[(a, Tok::Pod(2)), (b, Tok::Pod(3))], none.clone()));
            cases.push(ep.case(&[(a, Tok::Pod(2)), (b, Tok::Pod(2))], none.clone()));
        }
    }
    for &s in sources.iter().filter(|s| !s.is_authorization()) {
        cases.push(ep.case(&[(s, Tok::Pod(3)), (s, Tok::Pod(2))], none.clone()));
    }
    cases.push(ep.case(
        &[(sources[0], Tok::Invalid), (sources[1], Tok::Pod(2))],
        none.clone(),
    ));
    cases.push(ep.case(
        &[(sources[1], Tok::Legacy), (sources[0], Tok::Pod(2))],
        none.clone(),
    ));
    cases.push(ep.case(
        &[(sources[1], Tok::Legacy), (sources[0], Tok::Pod(1))],
        none.clone(),
    ));
    cases.push(ep.case(&[], none));
}

// ---------------------------------------------------------------------------------------
// Hand-written cases: bodies, multipart details, paths, hop-by-hop headers, Git, HTTP.

/// Every case of the main table.
fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for ep in RUNNER_ENDPOINTS.iter().chain(JOB_ENDPOINTS) {
        body_endpoint_matrix(ep, &mut cases);
    }
    // Artifacts authorize (Workhorse's pre-authorization: no body, query and header only).
    let authorize = Endpoint {
        label: "artifacts-authorize",
        method: "POST",
        path: "/api/v4/jobs/7/artifacts/authorize",
        family: Family::Job,
        fields: &[],
        default: Body::None,
    };
    let (q, h) = (Src::Query("token"), Src::Header("job-token"));
    let none = Expect::Refused(400, "token_not_found");
    for toks in [
        vec![(h, Tok::Pod(3))],
        vec![(q, Tok::Pod(2))],
        vec![(q, Tok::Pod(2)), (h, Tok::Pod(3))],
        vec![(q, Tok::Pod(3)), (h, Tok::Pod(3))],
        vec![(h, Tok::Pod(2)), (h, Tok::Pod(3))],
        vec![(q, Tok::Invalid), (h, Tok::Pod(3))],
    ] {
        cases.push(authorize.case(&toks, none.clone()));
    }
    api_matrix(
        &API_ENDPOINT,
        &[
            Src::Query("private_token"),
            Src::Query("access_token"),
            Src::Query("job_token"),
            Src::Query("token"),
            Src::Query("bearer_token"),
            Src::Header("private-token"),
            Src::Header("job-token"),
            Src::Header("deploy-token"),
            Src::Bearer,
            Src::Basic("gitlab-ci-token"),
            Src::Basic("jane"),
        ],
        &mut cases,
    );
    api_matrix(
        &DOWNLOAD_ENDPOINT,
        &[
            Src::Query("job_token"),
            Src::Query("token"),
            Src::Header("job-token"),
            Src::Basic("gitlab-ci-token"),
            Src::Header("private-token"),
            Src::Bearer,
        ],
        &mut cases,
    );
    bodies::bodies(&mut cases);
    paths::paths(&mut cases);
    hop_by_hop::hop_by_hop(&mut cases);
    git::git(&mut cases);
    params::params(&mut cases);
    http_edges::http_edges(&mut cases);
    cases
}

async fn three_stubs() -> [Stub; 3] {
    [
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    ]
}

/// Every case, with the HTTP/1 fast path serving what it takes (the default) and
/// pingora-proxy the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_reaches_the_pod_of_the_token_gitlab_authenticates() {
    let stubs = three_stubs().await;
    let config = three_pods(&stubs[0], &stubs[1], &stubs[2], "");
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let cases = all_cases();
    eprintln!("{} GitLab-fidelity cases", cases.len());
    harness::run_all(proxy.port, &stubs, cases, 0).await;
    // Both paths were exercised: runner and job requests on the fast path, the
    // rest (and every unusual framing) handed to pingora-proxy.
    let (_, metrics) = common::admin_get(&proxy, "/metrics").await;
    let fast_path = "podgate_proxy_fast_path_requests_total";
    let served = value_or_zero(&metrics, &format!("{fast_path}{{result=\"served\"}}"));
    let handed = value_or_zero(&metrics, fast_path) - served;
    eprintln!("fast path: {served} served, {handed} handed to pingora-proxy");
    assert!(served >= 20.0, "the fast path served only {served} cases");
    assert!(
        handed >= 20.0,
        "only {handed} cases were handed to pingora-proxy"
    );
}

/// Every case again with `fast_path = false`: pingora-proxy serves everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_reaches_the_pod_of_the_token_gitlab_authenticates_through_pingora_only() {
    let stubs = three_stubs().await;
    let config = three_pods(&stubs[0], &stubs[1], &stubs[2], "fast_path = false");
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    harness::run_all(proxy.port, &stubs, all_cases(), 0).await;
    let (_, metrics) = common::admin_get(&proxy, "/metrics").await;
    let counted = value_or_zero(&metrics, "podgate_proxy_fast_path_requests_total");
    assert_eq!(
        counted, 0.0,
        "fast_path = false, yet the fast path counted requests"
    );
}

/// `body_lookahead_bytes` bounds how far into a body the proxy looks for a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_body_lookahead_is_configurable() {
    let stubs = three_stubs().await;
    let config = three_pods(
        &stubs[0],
        &stubs[1],
        &stubs[2],
        "body_lookahead_bytes = 4096",
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let upload = |parts: &[Part]| {
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(&mp_type(), multipart(parts))
    };
    // Written in small pieces so that the proxy's reads cannot run far past the
    // configured look-ahead by accident.
    let pieces = |piece| Delivery::Pieces {
        first: 0,
        piece,
        pause_ms: 10,
    };
    let cases = vec![
        Case::new(
            "look-ahead 4096: token part after a 2 KiB file part, in 512-byte writes",
            format!("GitLab authenticates the token part (Pod 3). {JOB_AUTH}"),
            upload(&[file_part(2048), field("token", &j3)]),
            Expect::Pod(3),
        )
        .delivery(pieces(512)),
        Case::new(
            "look-ahead 4096: token part after a 12 KiB file part (1 KiB writes), no header",
            "GitLab would authenticate the token part (lib/api/ci/helpers/runner.rb \
             #job_token), but it lies beyond the configured look-ahead: the proxy cannot \
             see it and must not guess (never the default Pod)",
            upload(&[file_part(12 * 1024), field("token", &j3)]),
            Expect::Refused(400, "token_not_found"),
        )
        .delivery(pieces(1024)),
        Case::new(
            "look-ahead 4096: 12 KiB file part (1 KiB writes), JOB-TOKEN Pod 2",
            format!(
                "GitLab authenticates JOB-TOKEN (Pod 2); the body arrives byte-identical. {JOB_AUTH}"
            ),
            upload(&[file_part(12 * 1024)]).header("job-token", &j2),
            Expect::Pod(2),
        )
        .delivery(pieces(1024)),
    ];
    harness::run_all(proxy.port, &stubs, cases, 100_000).await;
}

/// A request head has an overall deadline (`head_timeout_ms`): a client that sends its
/// head one line every 400 ms is cut off after about 1 s with nothing forwarded; a head
/// sent quickly, or quickly followed by a slow body, is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_has_a_deadline() {
    let stubs = three_stubs().await;
    let config = three_pods(&stubs[0], &stubs[1], &stubs[2], "head_timeout_ms = 1000");
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let port = proxy.port;
    let pat2 = gitlab_token("glpat-", 2);
    let j3 = gitlab_token("glcbt-", 3);

    // The slow head: 10 lines, 400 ms apart (4 s in all, four times the deadline).
    let id = 200_000;
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let (closed_tx, closed_rx) = watch::channel(false);
    let reader = tokio::spawn(async move {
        let mut raw = Vec::new();
        let _ = rd.read_to_end(&mut raw).await;
        closed_tx.send_replace(true);
        raw
    });
    let mut lines = vec![
        "GET /api/v4/projects/5 HTTP/1.1".to_owned(),
        "host: gitlab.example.com".into(),
        format!("x-fidelity-case: {id}"),
        format!("private-token: {pat2}"),
    ];
    lines.extend((0..6).map(|i| format!("x-slow-{i}: {i}")));
    let mut head_complete = false;
    for (i, line) in lines.iter().enumerate() {
        let closed = *closed_rx.borrow();
        if closed
            || wr
                .write_all(format!("{line}\r\n").as_bytes())
                .await
                .is_err()
        {
            break;
        }
        // Pace the client (not a synchronisation): one line every 400 ms.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let closed = *closed_rx.borrow();
        if i == lines.len() - 1 && !closed && wr.write_all(b"\r\n").await.is_ok() {
            head_complete = true;
        }
    }
    let raw = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the proxy closes a connection whose head is too slow")
        .unwrap();
    let reply = parse(&raw);
    let mut failures = Vec::new();
    if head_complete {
        failures.push(format!(
            "the slow head was still accepted after 4 s (head_timeout_ms = 1000); reply status {}",
            reply.status
        ));
    }
    if !(raw.is_empty() || reply.status == 408) {
        failures.push(format!(
            "slow head answered {} instead of a close or 408",
            reply.status
        ));
    }
    if !seen_by(&stubs, id).is_empty() {
        failures.push("the slow head was forwarded".into());
    }

    // Quick heads, and a quick head followed by a slow body, are unaffected.
    let quick = vec![
        Case::new(
            "head_timeout_ms = 1000: a quick GET",
            format!("GitLab authenticates the PRIVATE-TOKEN (Pod 2). {API_AUTH}"),
            Req::new("GET", "/api/v4/projects/5").header("private-token", &pat2),
            Expect::Pod(2),
        ),
        Case::new(
            "head_timeout_ms = 1000: head lines 50 ms apart (0.25 s)",
            format!("GitLab authenticates the PRIVATE-TOKEN (Pod 2). {API_AUTH}"),
            Req::new("GET", "/api/v4/projects/5").header("private-token", &pat2),
            Expect::Pod(2),
        )
        .delivery(Delivery::SlowHead { pause_ms: 50 }),
        Case::new(
            "head_timeout_ms = 1000: quick head, trace body in 3 writes 600 ms apart",
            format!("The deadline covers the head only; GitLab authenticates JOB-TOKEN (Pod 3). {JOB_AUTH}"),
            Req::new("PATCH", "/api/v4/jobs/7/trace")
                .header("job-token", &j3)
                .header("content-range", "0-29")
                .body("text/plain", b"line one\nline two\nline three\n".to_vec()),
            Expect::Pod(3),
        )
        .delivery(Delivery::Pieces {
            first: 0,
            piece: 10,
            pause_ms: 600,
        }),
    ];
    let total = quick.len();
    for (i, case) in quick.into_iter().enumerate() {
        if let Err(e) = run(port, &stubs, id + 1 + i, &case).await {
            failures.push(format!(
                "{}: expected {}; {e}",
                case.name,
                case.expect.describe()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "head deadline ({} quick cases + 1 slow): {}",
        total,
        failures.join("\n")
    );
}
