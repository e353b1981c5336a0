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

mod common;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
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

fn bodies(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));

    // --- unparseable bodies: fail closed.
    let malformed = Expect::Refused(400, "malformed_body");
    let why = "GitLab cannot read params[:token] from a body it cannot parse (Grape answers \
               400 for bad JSON, grape lib/grape/middleware/formatter.rb; Rack raises \
               InvalidParameterError / EOFError → 400 for a bad form or multipart, rack \
               lib/rack/query_parser.rb, lib/rack/multipart/parser.rb); the proxy must not \
               guess";
    let bad_json = format!(r#"{{"token":"{p2}","info":{{"name":"x"}}"#);
    cases.push(Case::new(
        "jobs-request: truncated JSON",
        why,
        Req::new("POST", "/api/v4/jobs/request")
            .body("application/json", bad_json.clone().into_bytes()),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "jobs-request: truncated JSON beside a RUNNER-TOKEN header",
        why,
        Req::new("POST", "/api/v4/jobs/request")
            .header("runner-token", &p2)
            .body("application/json", bad_json.into_bytes()),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "job-update: JSON with a trailing comma",
        why,
        Req::new("PUT", "/api/v4/jobs/7").body(
            "application/json",
            format!(r#"{{"token":"{j3}","state":"running",}}"#).into_bytes(),
        ),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "verify: form body with bad percent-encoding in another field",
        why,
        Req::new("POST", "/api/v4/runners/verify").body(
            "application/x-www-form-urlencoded",
            format!("token={p3}&system_id=%ZZ").into_bytes(),
        ),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "register: form body with a truncated percent-escape in the token",
        why,
        Req::new("POST", "/api/v4/runners").body(
            "application/x-www-form-urlencoded",
            format!("description=x&token={p3}%4").into_bytes(),
        ),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "trace: form body with bad percent-encoding, JOB-TOKEN header present",
        why,
        Req::new("PATCH", "/api/v4/jobs/7/trace")
            .header("job-token", &j2)
            .body("application/x-www-form-urlencoded", b"token=%G1%".to_vec()),
        malformed.clone(),
    ));
    cases.push(Case::new(
        "artifacts-upload: multipart without a boundary parameter",
        "Rack cannot split the body without a boundary (rack lib/rack/multipart/parser.rb \
         .parse returns EMPTY: no params at all), so GitLab reads no token from it and \
         authenticate_job! fails on every Pod; either refusal is fail-closed",
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            "multipart/form-data",
            multipart(&[field("token", &j2), file_part(64)]),
        ),
        Expect::Refused(400, "malformed_body|token_not_found"),
    ));
    cases.push(Case::new(
        "artifacts-upload: multipart body that never opens its boundary",
        why,
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            &mp_type(),
            format!("token={j2}\r\nthis is not a multipart body\r\n").into_bytes(),
        ),
        malformed.clone(),
    ));
    {
        let mut body = multipart(&[field("token", &p3), field("system_id", "s_1")]);
        let cut = body.len() - format!("--{BOUNDARY}--\r\n").len();
        body.truncate(cut);
        cases.push(Case::new(
            "verify: complete multipart body without its closing boundary",
            why,
            Req::new("POST", "/api/v4/runners/verify").body(&mp_type(), body),
            malformed.clone(),
        ));
    }
    cases.push(Case::new(
        "jobs-request: multipart part without the blank line after its headers",
        why,
        Req::new("POST", "/api/v4/jobs/request").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"token\"\r\n{p2}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        malformed,
    ));

    // --- no token in the inspected body and none elsewhere: fail closed.
    let missing = Expect::Refused(400, "token_not_found");
    let why = "GitLab: Grape `requires :token` answers 400 \"token is missing\" on every Pod \
               (lib/api/ci/runner.rb); the proxy must not pick the default Pod";
    cases.push(Case::new(
        "verify: empty form body",
        why,
        Req::new("POST", "/api/v4/runners/verify")
            .body("application/x-www-form-urlencoded", Vec::new()),
        missing.clone(),
    ));
    cases.push(Case::new(
        "jobs-request: JSON whose only token is nested (info.token is not params[:token])",
        why,
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json",
            format!(r#"{{"info":{{"token":"{p2}"}},"last_update":"x"}}"#).into_bytes(),
        ),
        missing.clone(),
    ));
    cases.push(Case::new(
        "artifacts-upload: multipart with only a file part and no JOB-TOKEN",
        "GitLab: authenticate_job! finds neither params[:token] nor JOB-TOKEN → 403 on every \
         Pod (lib/api/ci/helpers/runner.rb); the proxy must not pick the default Pod",
        Req::new("POST", "/api/v4/jobs/7/artifacts")
            .body(&mp_type(), multipart(&[file_part(2048)])),
        missing.clone(),
    ));
    cases.push(Case::new(
        "artifacts-upload: 100 KiB file part first, token part after the look-ahead, no header",
        "the token part lies beyond body_lookahead_bytes (65536): the proxy cannot see the token \
         GitLab would read (lib/api/ci/helpers/runner.rb #job_token) and must not guess",
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            &mp_type(),
            multipart(&[file_part(100 * 1024), field("token", &j3)]),
        ),
        missing.clone(),
    ));
    // --- body encodings GitLab decodes.
    cases.push(Case::new(
        "jobs-request: JSON token with a \\u escape",
        format!("Ruby's JSON parser decodes \\u0067 to `g`: GitLab authenticates the decoded token (Pod 3). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json",
            format!(r#"{{"token":"\u0067{}","last_update":"x"}}"#, &p3[1..]).into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "register: form token fully percent-encoded",
        format!("Rack unescapes form values (rack lib/rack/query_parser.rb): GitLab authenticates the decoded token (Pod 2). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners").body(
            "application/x-www-form-urlencoded",
            format!(
                "description=x&token={}",
                p2.bytes().map(|b| format!("%{b:02X}")).collect::<String>()
            )
            .into_bytes(),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "verify: content type in capitals with a charset",
        format!("Rack downcases the media type (rack lib/rack/request.rb #media_type), so the body is a form: Pod 3. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            "APPLICATION/X-WWW-FORM-URLENCODED; charset=UTF-8",
            format!("token={p3}&system_id=s_1").into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: application/json; charset=utf-8",
        format!("Grape parses a JSON body whatever its charset: Pod 2. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json; charset=utf-8",
            format!(r#"{{"token":"{p2}","last_update":"x"}}"#).into_bytes(),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "jobs-request: JSON with a nested token beside the top-level one",
        format!("Only the top-level key is params[:token]: Pod 3 (the nested Pod 2 token is not a token source). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request").body(
            "application/json",
            format!(r#"{{"info":{{"name":"x","token":"{p2}"}},"token":"{p3}"}}"#).into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "trace: text/plain log that looks like JSON and a form, JOB-TOKEN Pod 3",
        format!(
            "Rack parses only form media types and Grape only JSON, so a text/plain trace body is \
             never params (rack lib/rack/request.rb #form_data?); GitLab authenticates JOB-TOKEN \
             (Pod 3). {JOB_AUTH}"
        ),
        Req::new("PATCH", "/api/v4/jobs/7/trace")
            .header("job-token", &j3)
            .header("content-range", "0-99")
            .body(
                "text/plain",
                format!("{{\"token\":\"{j2}\"}}\ntoken={j2}&x=1\n").into_bytes(),
            ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: chunked JSON body",
        format!("The body (dechunked) is the same JSON: GitLab authenticates its token (Pod 2). {RUNNER_AUTH}"),
        Req {
            chunked: true,
            ..Req::new("POST", "/api/v4/jobs/request").body(
                "application/json",
                format!(r#"{{"token":"{p2}","last_update":"x"}}"#).into_bytes(),
            )
        },
        Expect::Pod(2),
    ));
    cases.push(
        Case::new(
            "register: multipart with Expect: 100-continue (curl --form)",
            format!("GitLab authenticates the multipart token part (Pod 3). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners")
                .header("expect", "100-continue")
                .body(
                    &mp_type(),
                    multipart(&[field("description", "x"), field("token", &p3)]),
                ),
            Expect::Pod(3),
        )
        .delivery(Delivery::Expect100),
    );

    // --- multipart details.
    cases.push(Case::new(
        "artifacts-upload: small file part first, token part after it",
        format!("Rack reads every part: GitLab authenticates the token part (Pod 3). {RACK_MULTIPART}. {JOB_AUTH}"),
        Req::new("POST", "/api/v4/jobs/7/artifacts")
            .body(&mp_type(), multipart(&[file_part(1024), field("token", &j3)])),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "artifacts-upload: 40 KiB file part first, token part within the 64 KiB look-ahead",
        format!("GitLab authenticates the token part (Pod 2). {RACK_MULTIPART}. {JOB_AUTH}"),
        Req::new("POST", "/api/v4/jobs/7/artifacts").body(
            &mp_type(),
            multipart(&[
                file_part(40 * 1024),
                field("artifact_format", "zip"),
                field("token", &j2),
            ]),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "artifacts-upload: 200 KiB file part, JOB-TOKEN header (body streams past the look-ahead)",
        format!("No token part; GitLab authenticates JOB-TOKEN (Pod 3); the body must arrive byte-identical. {JOB_AUTH}"),
        Req::new("POST", "/api/v4/jobs/7/artifacts")
            .header("job-token", &j3)
            .body(&mp_type(), multipart(&[file_part(200 * 1024)])),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "artifacts-upload: chunked 150 KiB multipart, token part first",
        format!("GitLab authenticates the token part (Pod 2); the dechunked body must arrive byte-identical. {JOB_AUTH}"),
        Req {
            chunked: true,
            ..Req::new("POST", "/api/v4/jobs/7/artifacts")
                .body(&mp_type(), multipart(&[field("token", &j2), file_part(150 * 1024)]))
        },
        Expect::Pod(2),
    ));
    cases.push(
        Case::new(
            "artifacts-upload: short first read (head + 5 body bytes), file part then token part",
            format!(
                "GitLab authenticates the token part (Pod 3), however the bytes arrive. {JOB_AUTH}"
            ),
            Req::new("POST", "/api/v4/jobs/7/artifacts").body(
                &mp_type(),
                multipart(&[file_part(300), field("token", &j3)]),
            ),
            Expect::Pod(3),
        )
        .delivery(Delivery::Pieces {
            first: 5,
            piece: 64,
            pause_ms: 15,
        }),
    );
    cases.push(
        Case::new(
            "verify: short first read of a multipart body, token split across writes",
            format!("GitLab authenticates the token part (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners/verify").body(
                &mp_type(),
                multipart(&[field("system_id", "s_1"), field("token", &p2)]),
            ),
            Expect::Pod(2),
        )
        .delivery(Delivery::Pieces {
            first: 3,
            piece: 11,
            pause_ms: 10,
        }),
    );
    cases.push(
        Case::new(
            "jobs-request: short first read of a JSON body",
            format!("GitLab authenticates the JSON token (Pod 3). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/jobs/request").body(
                "application/json",
                format!(r#"{{"last_update":"x","token":"{p3}"}}"#).into_bytes(),
            ),
            Expect::Pod(3),
        )
        .delivery(Delivery::Pieces {
            first: 1,
            piece: 9,
            pause_ms: 10,
        }),
    );
    cases.push(
        Case::new(
            "register: short first read of a form body",
            format!("GitLab authenticates the form token (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners").body(
                "application/x-www-form-urlencoded",
                format!("description=x&token={p2}").into_bytes(),
            ),
            Expect::Pod(2),
        )
        .delivery(Delivery::Pieces {
            first: 0,
            piece: 7,
            pause_ms: 10,
        }),
    );
    cases.push(
        Case::new(
            "jobs-request: a form body whose conflicting second token arrives in a later write",
            "Rack keeps the last `token` (Pod 3) but the first (Pod 2) is a token too: refused",
            Req::new("POST", "/api/v4/jobs/request").body(
                "application/x-www-form-urlencoded",
                format!("token={p2}&last_update=x&token={p3}").into_bytes(),
            ),
            Expect::Refused(400, "conflicting_tokens"),
        )
        .delivery(Delivery::Pieces {
            first: 60,
            piece: 20,
            pause_ms: 10,
        }),
    );
    cases.push(Case::new(
        "verify: multipart with lower-case part headers and an unquoted name",
        format!("Rack matches the header name case-insensitively and accepts an unquoted name: Pod 3. {RACK_MULTIPART}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\ncontent-disposition: form-data; name=token\r\n\r\n{p3}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: multipart with a quoted boundary parameter",
        format!("Rack strips the quotes (rack lib/rack/multipart/parser.rb MULTIPART): Pod 2. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            &format!("multipart/form-data; boundary=\"{BOUNDARY}\""),
            multipart(&[field("token", &p2)]),
        ),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "verify: multipart NAME=\"token\" (upper-case parameter name) alone",
        format!(
            "Rack 2.2 matches `name=` case-insensitively (/…name=…/ni), so GitLab on Rack 2.2 \
             authenticates it (Pod 3); the proxy must count it. {RACK_MULTIPART}"
        ),
        Req::new("POST", "/api/v4/runners/verify").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; NAME=\"token\"\r\n\r\n{p3}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: multipart NAME=\"token\" Pod 2 beside name=\"token\" Pod 3",
        format!("Both parts are params[:token] for Rack 2.2 (the last wins): two Pods, refused. {RACK_MULTIPART}"),
        Req::new("POST", "/api/v4/runners/verify").body(
            &mp_type(),
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; NAME=\"token\"\r\n\r\n{p2}\r\n\
                 --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{p3}\r\n--{BOUNDARY}--\r\n"
            )
            .into_bytes(),
        ),
        Expect::Refused(400, "conflicting_tokens"),
    ));
    cases.push(Case::new(
        "jobs-request: multipart field \"TOKEN\" (invalid) is not params[:token]; RUNNER-TOKEN Pod 2",
        format!(
            "params keys are case-sensitive: `TOKEN` is another field, not a token source; the \
             only token is RUNNER-TOKEN (Pod 2). {RACK_MULTIPART}"
        ),
        Req::new("POST", "/api/v4/jobs/request")
            .header("runner-token", &p2)
            .body(&mp_type(), multipart(&[field("TOKEN", &corrupt(&p3))])),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "jobs-request: multipart token parts repeated, three values, last two agree",
        "Rack keeps the last `token` (Pod 3); the first names Pod 2: refused",
        Req::new("POST", "/api/v4/jobs/request").body(
            &mp_type(),
            multipart(&[
                field("token", &p2),
                field("token", &p3),
                field("token", &p3),
            ]),
        ),
        Expect::Refused(400, "conflicting_tokens"),
    ));
}

fn paths(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let json = |t: &str| format!(r#"{{"token":"{t}","state":"running"}}"#).into_bytes();
    let form = |t: &str| format!("token={t}&system_id=s_1").into_bytes();
    let mut add = |name: &str, req: Req, pod: u64, what: &str| {
        cases.push(Case::new(
            format!("path {name}"),
            format!("GitLab serves this path as {what} and authenticates the body token (Pod {pod}). {PATH_RULES}"),
            req,
            Expect::Pod(pod),
        ));
    };
    add(
        "PUT /api/v4/jobs/1// (JSON job token)",
        Req::new("PUT", "/api/v4/jobs/1//").body("application/json", json(&j3)),
        3,
        "PUT /api/v4/jobs/1 (job update)",
    );
    add(
        "PUT /api/v4/jobs/1/ (JSON job token)",
        Req::new("PUT", "/api/v4/jobs/1/").body("application/json", json(&j2)),
        2,
        "PUT /api/v4/jobs/1",
    );
    add(
        "PUT /api/v4//jobs//1 (form job token)",
        Req::new("PUT", "/api/v4//jobs//1").body(
            "application/x-www-form-urlencoded",
            format!("state=running&token={j3}").into_bytes(),
        ),
        3,
        "PUT /api/v4/jobs/1",
    );
    add(
        "PUT /api/v4/jobs/request/../7 (JSON job token)",
        Req::new("PUT", "/api/v4/jobs/request/../7").body("application/json", json(&j2)),
        2,
        "PUT /api/v4/jobs/7",
    );
    add(
        "POST /api/v4//jobs/request (JSON)",
        Req::new("POST", "/api/v4//jobs/request").body("application/json", json(&p2)),
        2,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/jobs/request/ (JSON)",
        Req::new("POST", "/api/v4/jobs/request/").body("application/json", json(&p3)),
        3,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/jobs/request.json (JSON)",
        Req::new("POST", "/api/v4/jobs/request.json").body("application/json", json(&p2)),
        2,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/jobs/./request (form)",
        Req::new("POST", "/api/v4/jobs/./request")
            .body("application/x-www-form-urlencoded", form(&p3)),
        3,
        "POST /api/v4/jobs/request",
    );
    add(
        "POST /api/v4/runners/verify.json (form)",
        Req::new("POST", "/api/v4/runners/verify.json")
            .body("application/x-www-form-urlencoded", form(&p3)),
        3,
        "POST /api/v4/runners/verify",
    );
    add(
        "POST /api/v4/runners/./verify (form)",
        Req::new("POST", "/api/v4/runners/./verify")
            .body("application/x-www-form-urlencoded", form(&p2)),
        2,
        "POST /api/v4/runners/verify",
    );
    add(
        "POST /api/v4/x/../runners (form registration)",
        Req::new("POST", "/api/v4/x/../runners")
            .body("application/x-www-form-urlencoded", form(&p3)),
        3,
        "POST /api/v4/runners",
    );
    add(
        "POST /api/v4/runners/ (multipart registration)",
        Req::new("POST", "/api/v4/runners/").body(&mp_type(), multipart(&[field("token", &p2)])),
        2,
        "POST /api/v4/runners",
    );
    add(
        "DELETE /api/v4/runners// (JSON)",
        Req::new("DELETE", "/api/v4/runners//").body("application/json", json(&p3)),
        3,
        "DELETE /api/v4/runners",
    );
    add(
        "DELETE /api/v4/runners/managers/ (form)",
        Req::new("DELETE", "/api/v4/runners/managers/")
            .body("application/x-www-form-urlencoded", form(&p2)),
        2,
        "DELETE /api/v4/runners/managers",
    );
    add(
        "POST /api/v4/runners/reset_authentication_token.json (JSON)",
        Req::new("POST", "/api/v4/runners/reset_authentication_token.json")
            .body("application/json", json(&p3)),
        3,
        "POST /api/v4/runners/reset_authentication_token",
    );
    add(
        "PATCH /api/v4/jobs//7//trace/ (form token)",
        Req::new("PATCH", "/api/v4/jobs//7//trace/").body(
            "application/x-www-form-urlencoded",
            format!("token={j3}").into_bytes(),
        ),
        3,
        "PATCH /api/v4/jobs/7/trace",
    );
    add(
        "PATCH /api/v4/jobs/7/trace.json (JSON token)",
        Req::new("PATCH", "/api/v4/jobs/7/trace.json").body("application/json", json(&j2)),
        2,
        "PATCH /api/v4/jobs/7/trace",
    );
    add(
        "POST /api/v4/jobs/7/artifacts/ (multipart token)",
        Req::new("POST", "/api/v4/jobs/7/artifacts/").body(
            &mp_type(),
            multipart(&[field("token", &j3), file_part(256)]),
        ),
        3,
        "POST /api/v4/jobs/7/artifacts",
    );
    add(
        "POST /api/v4/jobs/7/./artifacts (multipart token)",
        Req::new("POST", "/api/v4/jobs/7/./artifacts").body(
            &mp_type(),
            multipart(&[field("token", &j2), file_part(256)]),
        ),
        2,
        "POST /api/v4/jobs/7/artifacts",
    );
    cases.push(Case::new(
        "path POST /api/v4//jobs/request?token=Pod2 with JSON token Pod 3",
        format!(
            "GitLab serves POST /api/v4/jobs/request and authenticates the body token (Pod 3); the \
             query token names Pod 2: refused. {PATH_RULES}. {RUNNER_AUTH}"
        ),
        Req::new("POST", &format!("/api/v4//jobs/request?token={p2}"))
            .body("application/json", json(&p3)),
        Expect::Refused(400, "conflicting_tokens"),
    ));
    cases.push(Case::new(
        "path PUT /api/v4/jobs/1// with an invalid JSON token",
        format!(
            "GitLab serves PUT /api/v4/jobs/1 and reads the (invalid) body token: 401. {PATH_RULES}"
        ),
        Req::new("PUT", "/api/v4/jobs/1//").body("application/json", json(&corrupt(&j3))),
        Expect::Refused(401, "401"),
    ));
    cases.push(Case::new(
        "path PUT /api/v4/jobs/1// with a JSON body holding no token",
        format!("GitLab serves PUT /api/v4/jobs/1 (Grape requires :token → 400 everywhere). {PATH_RULES}"),
        Req::new("PUT", "/api/v4/jobs/1//").body("application/json", br#"{"state":"running"}"#.to_vec()),
        Expect::Refused(400, "token_not_found"),
    ));
}

fn hop_by_hop(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let pat3 = gitlab_token("glpat-", 3);
    cases.push(
        Case::new(
            "Connection: close, runner-token — RUNNER-TOKEN Pod 3 is hop-by-hop; JSON token Pod 2",
            format!("{HOP_BY_HOP}; GitLab authenticates the JSON token (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/jobs/request")
                .header("runner-token", &p3)
                .connection("close, runner-token")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{p2}"}}"#).into_bytes(),
                ),
            Expect::Pod(2),
        )
        .stripped("runner-token"),
    );
    cases.push(
        Case::new(
            "second Connection header lists JOB-TOKEN (invalid); JSON token Pod 3",
            format!("{HOP_BY_HOP}; GitLab authenticates the JSON token (Pod 3). {JOB_AUTH}"),
            Req::new("PUT", "/api/v4/jobs/7")
                .header("job-token", &corrupt(&j2))
                .header("connection", "job-token")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{j3}","state":"running"}}"#).into_bytes(),
                ),
            Expect::Pod(3),
        )
        .stripped("job-token"),
    );
    cases.push(
        Case::new(
            "Connection: Job-Token, close (mixed case) — query token Pod 2 decides",
            format!("{HOP_BY_HOP}; GitLab authenticates ?token= (Pod 2). {JOB_AUTH}"),
            Req::new("PATCH", &format!("/api/v4/jobs/7/trace?token={j2}"))
                .header("job-token", &j3)
                .header("content-range", "0-3")
                .connection("Job-Token, close")
                .body("text/plain", b"log\n".to_vec()),
            Expect::Pod(2),
        )
        .stripped("job-token"),
    );
    cases.push(
        Case::new(
            "Connection: close, private-token — the only token is hop-by-hop: default Pod",
            format!("{HOP_BY_HOP}; GitLab sees no token: an anonymous API request goes to the default Pod. {API_AUTH}"),
            Req::new("GET", "/api/v4/projects/5")
                .header("private-token", &pat3)
                .connection("close, private-token"),
            Expect::Pod(1),
        )
        .stripped("private-token"),
    );
    cases.push(
        Case::new(
            "Connection: close, authorization — git clone credentials are hop-by-hop: default Pod",
            format!("{HOP_BY_HOP}; GitLab sees an anonymous git request. {GIT_AUTH}"),
            Req::new(
                "GET",
                "/group/project.git/info/refs?service=git-upload-pack",
            )
            .header("authorization", &basic("gitlab-ci-token", &j3))
            .connection("close, authorization"),
            Expect::Pod(1),
        )
        .stripped("authorization"),
    );
    cases.push(
        Case::new(
            "Connection: close, runner-token with RUNNER-TOKEN invalid; form token Pod 3",
            format!("{HOP_BY_HOP}; the invalid token never reaches GitLab, which authenticates the form token (Pod 3). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/runners/verify")
                .header("runner-token", &corrupt(&p2))
                .connection("close, runner-token")
                .body("application/x-www-form-urlencoded", format!("token={p3}").into_bytes()),
            Expect::Pod(3),
        )
        .stripped("runner-token"),
    );
    cases.push(Case::new(
        "Connection lists another header: JOB-TOKEN Pod 3 still conflicts with JSON token Pod 2",
        format!("Only Connection-listed headers are hop-by-hop; GitLab authenticates the JSON token (Pod 2), JOB-TOKEN names Pod 3: refused. {JOB_AUTH}"),
        Req::new("PUT", "/api/v4/jobs/7")
            .header("job-token", &j3)
            .header("x-trace", "1")
            .connection("close, x-trace")
            .body("application/json", format!(r#"{{"token":"{j2}"}}"#).into_bytes()),
        Expect::Refused(400, "conflicting_tokens"),
    ));
}

fn git(cases: &mut Vec<Case>) {
    let (j2, j3) = (gitlab_token("glcbt-", 2), gitlab_token("glcbt-", 3));
    let pat3 = gitlab_token("glpat-", 3);
    let dt2 = gitlab_token("gldt-", 2);
    let dt3 = gitlab_token("gldt-", 3);
    let ci = |t: &str| basic("gitlab-ci-token", t);
    let mut add = |name: &str, req: Req, expect: Expect, who: &str| {
        cases.push(Case::new(
            format!("git {name}"),
            format!("{who}. {GIT_AUTH}"),
            req,
            expect,
        ));
    };
    add(
        "info/refs upload-pack, Basic gitlab-ci-token Pod 3",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header("authorization", &ci(&j3))
        .header("git-protocol", "version=2"),
        Expect::Pod(3),
        "GitLab authenticates the job token (Pod 3)",
    );
    add(
        "git-upload-pack POST, Basic gitlab-ci-token Pod 2",
        Req::new("POST", "/group/project.git/git-upload-pack")
            .header("authorization", &ci(&j2))
            .body(
                "application/x-git-upload-pack-request",
                b"0014command=ls-refs\n0001000csymrefs\n0000".to_vec(),
            ),
        Expect::Pod(2),
        "GitLab authenticates the job token (Pod 2)",
    );
    add(
        "git-receive-pack POST, Basic user:PAT Pod 3",
        Req::new("POST", "/group/sub/project.git/git-receive-pack")
            .header("authorization", &basic("jane", &pat3))
            .body("application/x-git-receive-pack-request", b"0000".to_vec()),
        Expect::Pod(3),
        "GitLab authenticates the PAT (Pod 3)",
    );
    add(
        "info/refs receive-pack, Basic deploy token Pod 2",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-receive-pack",
        )
        .header("authorization", &basic("gitlab+deploy-token-1", &dt2)),
        Expect::Pod(2),
        "GitLab authenticates the deploy token (Pod 2)",
    );
    add(
        "LFS batch, Basic gitlab-ci-token Pod 3 (JSON body without a token field)",
        Req::new("POST", "/group/project.git/info/lfs/objects/batch")
            .header("authorization", &ci(&j3))
            .header("accept", "application/vnd.git-lfs+json")
            .body(
                "application/vnd.git-lfs+json",
                br#"{"operation":"download","objects":[{"oid":"12","size":1}]}"#.to_vec(),
            ),
        Expect::Pod(3),
        "GitLab authenticates the job token (Pod 3); the LFS body is not a token source",
    );
    add(
        "/jwt/auth for the registry, Basic gitlab-ci-token Pod 2",
        Req::new(
            "GET",
            "/jwt/auth?service=container_registry&scope=repository:group/project:pull,push",
        )
        .header("authorization", &ci(&j2)),
        Expect::Pod(2),
        "app/controllers/jwt_controller.rb authenticates the job token (Pod 2)",
    );
    add(
        "generic package upload, JOB-TOKEN Pod 3",
        Req::new(
            "PUT",
            "/api/v4/projects/5/packages/generic/pkg/1.0.0/file.bin",
        )
        .header("job-token", &j3)
        .body("application/octet-stream", vec![0xAB; 3000]),
        Expect::Pod(3),
        "lib/api/generic_packages.rb (job_token_allowed): GitLab authenticates JOB-TOKEN (Pod 3)",
    );
    add(
        "Maven package download, Deploy-Token Pod 2",
        Req::new(
            "GET",
            "/api/v4/projects/5/packages/maven/com/acme/app/1.0/app-1.0.jar",
        )
        .header("deploy-token", &dt2),
        Expect::Pod(2),
        "deploy_token_allowed route: GitLab authenticates Deploy-Token (Pod 2)",
    );
    add(
        "PyPI package upload, Basic gitlab-ci-token Pod 3",
        Req::new("POST", "/api/v4/projects/5/packages/pypi")
            .header("authorization", &ci(&j3))
            .body(
                &mp_type(),
                multipart(&[field(":action", "file_upload"), file_part(300)]),
            ),
        Expect::Pod(3),
        "lib/api/pypi_packages.rb (job_token_allowed: :basic_auth): GitLab authenticates the job token (Pod 3)",
    );
    add(
        "info/refs without credentials",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        ),
        Expect::Pod(1),
        "no credentials: GitLab answers the anonymous request; the default Pod",
    );
    add(
        "info/refs, Basic user:password (no token)",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header("authorization", &basic("jane", "correct-horse-battery")),
        Expect::Pod(1),
        "a password is unroutable: the default Pod",
    );
    add(
        "git-upload-pack, Basic gitlab-ci-token invalid",
        Req::new("POST", "/group/project.git/git-upload-pack")
            .header("authorization", &ci(&corrupt(&j2)))
            .body("application/x-git-upload-pack-request", b"0000".to_vec()),
        Expect::Refused(401, "401"),
        "an invalid token: refused",
    );
    add(
        "info/refs, Basic gitlab-ci-token Pod 2 + JOB-TOKEN Pod 3 (not read on Git routes)",
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header("authorization", &ci(&j2))
        .header("job-token", &j3),
        Expect::Pod(2),
        "GitLab authenticates Basic (Pod 2) and never reads JOB-TOKEN on Git routes \
         (app/controllers/repositories/git_http_client_controller.rb #authenticate_user: \
         Basic, Kerberos or anonymous only), so JOB-TOKEN is no source here",
    );
    add(
        "generic package, JOB-TOKEN Pod 2 + Deploy-Token Pod 3",
        Req::new(
            "GET",
            "/api/v4/projects/5/packages/generic/pkg/1.0.0/file.bin",
        )
        .header("job-token", &j2)
        .header("deploy-token", &dt3),
        Expect::Refused(400, "conflicting_tokens"),
        "GitLab authenticates the deploy token first (Pod 3, lib/api/api_guard.rb), JOB-TOKEN names Pod 2: refused",
    );
}

/// How Rack, Grape, Doorkeeper and Rails read parameters and credentials: decoded keys,
/// Rack 2.2's `;` query separator, case-insensitive auth schemes, empty values, and
/// Rails' method override.
fn params(cases: &mut Vec<Case>) {
    let (p2, p3) = (gitlab_token("glrt-", 2), gitlab_token("glrt-", 3));
    let j3 = gitlab_token("glcbt-", 3);
    let (pat2, pat3) = (gitlab_token("glpat-", 2), gitlab_token("glpat-", 3));
    let conflict = Expect::Refused(400, "conflicting_tokens");
    let form = "application/x-www-form-urlencoded";
    cases.push(Case::new(
        "jobs-request: query key percent-encoded (%74oken = token) Pod 2 + JSON token Pod 3",
        format!(
            "Rack unescapes keys too (rack lib/rack/query_parser.rb #parse_nested_query), so \
             the query holds params[:token] (Pod 2); GitLab authenticates the JSON token (Pod 3): \
             two Pods. {RUNNER_AUTH}"
        ),
        Req::new("POST", &format!("/api/v4/jobs/request?%74oken={p2}")).body(
            "application/json",
            format!(r#"{{"token":"{p3}"}}"#).into_bytes(),
        ),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "register: form key percent-encoded (%74oken) Pod 3",
        format!(
            "Rack unescapes form keys: GitLab authenticates params[:token] (Pod 3). {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners")
            .body(form, format!("description=x&%74oken={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: query token value percent-encoded, JSON body without a token",
        format!("GitLab authenticates the decoded query token (Pod 3). {RUNNER_AUTH}"),
        Req::new(
            "POST",
            &format!(
                "/api/v4/jobs/request?token=%{:02X}{}",
                p3.as_bytes()[0],
                &p3[1..]
            ),
        )
        .body("application/json", br#"{"last_update":"x"}"#.to_vec()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: JSON key with a \\u escape (tok\\u0065n) Pod 3",
        format!("Ruby's JSON parser decodes the key to `token`: GitLab authenticates it (Pod 3). {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/runners/verify")
            .body("application/json", format!(r#"{{"tok\u0065n":"{p3}"}}"#).into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: JSON key tok\\u0065n Pod 3 + RUNNER-TOKEN Pod 2",
        format!("The escaped key is params[:token] (Pod 3); RUNNER-TOKEN names Pod 2: two Pods. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request")
            .header("runner-token", &p2)
            .body("application/json", format!(r#"{{"tok\u0065n":"{p3}"}}"#).into_bytes()),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "jobs-request: `;` in the query (a=1;token=Pod 2) + JSON token Pod 3",
        format!(
            "Rack 2.2 splits a query on `&` and `;` (rack lib/rack/request.rb #GET: \
             parse_query(query_string, '&;')), so the query holds a token (Pod 2); GitLab \
             authenticates the JSON token (Pod 3): two Pods. {RUNNER_AUTH}"
        ),
        Req::new("POST", &format!("/api/v4/jobs/request?a=1;token={p2}")).body(
            "application/json",
            format!(r#"{{"token":"{p3}"}}"#).into_bytes(),
        ),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "verify: `;` in the query (system_id=s;token=Pod 3), form body without a token",
        format!("Rack 2.2 reads token from the query (Pod 3). {RUNNER_AUTH}"),
        Req::new(
            "POST",
            &format!("/api/v4/runners/verify?system_id=s;token={p3}"),
        )
        .body(form, b"system_id=s".to_vec()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: `;` inside a form value is not a separator (x=1;token=Pod 2&token=Pod 3)",
        format!(
            "Rack parses form bodies on `&` only (rack lib/rack/request.rb #POST: \
             parse_query(form_vars, '&')), so `1;token=…` is the value of x and the only token \
             is Pod 3. {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners/verify")
            .body(form, format!("x=1;token={p2}&token={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "api: Authorization: bearer (lower case) Pod 3",
        format!("Doorkeeper matches the scheme with /^Bearer /i (doorkeeper lib/doorkeeper/oauth/token.rb #from_bearer_authorization): GitLab authenticates it (Pod 3). {API_AUTH}"),
        Req::new("GET", "/api/v4/projects/5").header("authorization", &format!("bearer {pat3}")),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "api: Authorization: bearer (lower case) Pod 3 + PRIVATE-TOKEN Pod 2",
        format!("GitLab authenticates the bearer token (Pod 3) first; PRIVATE-TOKEN names Pod 2: two Pods. {API_AUTH}"),
        Req::new("GET", "/api/v4/projects/5")
            .header("authorization", &format!("bearer {pat3}"))
            .header("private-token", &pat2),
        conflict.clone(),
    ));
    cases.push(Case::new(
        "git: Authorization: BASIC (upper case) gitlab-ci-token Pod 3",
        format!(
            "Rails compares the scheme case-insensitively (actionpack \
             ActionController::HttpAuthentication::Basic #has_basic_credentials?): GitLab \
             authenticates the job token (Pod 3). {GIT_AUTH}"
        ),
        Req::new(
            "GET",
            "/group/project.git/info/refs?service=git-upload-pack",
        )
        .header(
            "authorization",
            &basic("gitlab-ci-token", &j3).replacen("Basic", "BASIC", 1),
        ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "api: empty private_token param + PRIVATE-TOKEN Pod 3",
        format!("auth_finders.rb skips empty values (`.presence`): GitLab authenticates PRIVATE-TOKEN (Pod 3). {API_AUTH}"),
        Req::new("GET", "/api/v4/projects/5?private_token=").header("private-token", &pat3),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "jobs-request: RUNNER-TOKEN spelled in capitals Pod 2 + form token Pod 3",
        format!("Header names are case-insensitive; RUNNER-TOKEN (Pod 2) and the form token GitLab authenticates (Pod 3) name two Pods. {RUNNER_AUTH}"),
        Req::new("POST", "/api/v4/jobs/request")
            .header("RUNNER-TOKEN", &p2)
            .body(form, format!("token={p3}").into_bytes()),
        conflict,
    ));
    cases.push(Case::new(
        "jobs-request: form body without Content-Type, token Pod 3",
        format!(
            "Rack treats a POST without Content-Type as a form (rack lib/rack/request.rb \
             #form_data?: `(meth == POST && type.nil?)`, #POST parses it with \
             parse_query(form_vars, '&')); Grape keeps such a body raw (default format :txt, \
             grape lib/grape/middleware/formatter.rb), so GitLab authenticates the form token \
             (Pod 3). {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/jobs/request")
            .body("", format!("token={p3}&last_update=x").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "verify: form key `[token]` (leading brackets dropped by Rack 2.2) Pod 3",
        format!(
            "rack lib/rack/query_parser.rb #normalize_params: `name =~ %r(\\A[\\[\\]]*([^\\[\\]]+)\\]*)` \
             strips leading brackets, so `[token]=…` is params[:token]: GitLab authenticates it \
             (Pod 3). {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners/verify")
            .body(form, format!("system_id=s&[token]={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "path POST /api/v4/jobs/reques%74 (percent-encoded literal), JSON token Pod 2",
        format!(
            "Grape compiles route literals with Mustermann uri_decode (mustermann \
             ast/compiler.rb), so GitLab serves POST /api/v4/jobs/request and authenticates \
             the JSON token (Pod 2); Workhorse only skips its long poll. {PATH_RULES}. {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/jobs/reques%74")
            .body("application/json", format!(r#"{{"token":"{p2}"}}"#).into_bytes()),
        Expect::Pod(2),
    ));
    cases.push(Case::new(
        "path POST /api/v4/runners/verif%79 (percent-encoded literal), form token Pod 3",
        format!(
            "Grape (Mustermann uri_decode) serves POST /api/v4/runners/verify and authenticates \
             the form token (Pod 3). {PATH_RULES}. {RUNNER_AUTH}"
        ),
        Req::new("POST", "/api/v4/runners/verif%79").body(form, format!("token={p3}").into_bytes()),
        Expect::Pod(3),
    ));
    let override_why = |how: &str| {
        format!(
            "Rails' default middleware stack runs Rack::MethodOverride (rack \
             lib/rack/method_override.rb: a POST with {how} becomes PUT before routing), so \
             GitLab serves PUT /api/v4/jobs/7 and authenticates the body token (Pod 3). {JOB_AUTH}"
        )
    };
    cases.push(Case::new(
        "job-update via POST + X-HTTP-Method-Override: PUT, JSON token Pod 3",
        override_why("X-HTTP-Method-Override: PUT"),
        Req::new("POST", "/api/v4/jobs/7")
            .header("x-http-method-override", "PUT")
            .body(
                "application/json",
                format!(r#"{{"token":"{j3}","state":"running"}}"#).into_bytes(),
            ),
        Expect::Pod(3),
    ));
    cases.push(Case::new(
        "job-update via POST with _method=PUT in the form body, token Pod 3",
        override_why("a `_method=PUT` form field"),
        Req::new("POST", "/api/v4/jobs/7").body(
            form,
            format!("_method=PUT&state=running&token={j3}").into_bytes(),
        ),
        Expect::Pod(3),
    ));
}

fn http_edges(cases: &mut Vec<Case>) {
    let p2 = gitlab_token("glrt-", 2);
    let pat3 = gitlab_token("glpat-", 3);
    let no_host = |req: Req| Req {
        version: "HTTP/1.0",
        host: false,
        ..req
    };
    cases.push(Case::new(
        "HTTP/1.0 GET without Host",
        "no Host: no URL to serve (RFC 9112 §3.2); never forwarded (today it goes out as HTTP/1.1 without Host)",
        no_host(Req::new("GET", "/api/v4/projects/5").header("private-token", &pat3).connection("")),
        Expect::Refused(400, ""),
    ));
    cases.push(Case::new(
        "HTTP/1.0 POST jobs/request without Host",
        "no Host: never forwarded, whatever its token",
        no_host(
            Req::new("POST", "/api/v4/jobs/request")
                .connection("")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{p2}"}}"#).into_bytes(),
                ),
        ),
        Expect::Refused(400, ""),
    ));
    cases.push(Case::new(
        "HTTP/1.0 with Host (control)",
        format!("GitLab authenticates the PRIVATE-TOKEN (Pod 3). {API_AUTH}"),
        Req {
            version: "HTTP/1.0",
            ..Req::new("GET", "/api/v4/projects/5")
                .header("private-token", &pat3)
                .connection("")
        },
        Expect::Pod(3),
    ));
    cases.push(
        Case::new(
            "head written one line per write, 40 ms apart, well within the head deadline",
            format!("GitLab authenticates the JSON token (Pod 2). {RUNNER_AUTH}"),
            Req::new("POST", "/api/v4/jobs/request")
                .header("user-agent", "gitlab-runner 17.0.0")
                .header("accept", "application/json")
                .body(
                    "application/json",
                    format!(r#"{{"token":"{p2}"}}"#).into_bytes(),
                ),
            Expect::Pod(2),
        )
        .delivery(Delivery::SlowHead { pause_ms: 40 }),
    );
}

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
    bodies(&mut cases);
    paths(&mut cases);
    hop_by_hop(&mut cases);
    git(&mut cases);
    params(&mut cases);
    http_edges(&mut cases);
    cases
}

// ---------------------------------------------------------------------------------------
// Running cases.

/// A response, parsed leniently (a proxy that closes without answering gives status 0).
struct Reply {
    status: u16,
    body: String,
}

fn parse(raw: &[u8]) -> Reply {
    let mut rest = raw;
    loop {
        let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Reply {
                status: 0,
                body: String::from_utf8_lossy(rest).into_owned(),
            };
        };
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        rest = &rest[end + 4..];
        if status == 100 {
            continue;
        }
        let chunked = head.lines().any(|l| {
            l.split_once(':').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")
            })
        });
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_vec()
        };
        return Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&raw[..eol]).trim(), 16).unwrap_or(0);
        let start = eol + 2;
        if size == 0 || start + size > raw.len() {
            break;
        }
        out.extend_from_slice(&raw[start..start + size]);
        raw = &raw[(start + size + 2).min(raw.len())..];
    }
    out
}

/// Write the steps, read until the proxy closes (or 10 s pass: then what arrived, and
/// `true`). Write errors are tolerated: a refusing proxy may close before the body is
/// sent.
async fn exchange(port: u16, steps: Vec<Step>) -> Result<(Vec<u8>, bool), String> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = watch::channel(Vec::<u8>::new());
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => tx.send_modify(|b| b.extend_from_slice(&buf[..n])),
            }
        }
        tx.borrow().clone()
    });
    for step in steps {
        match step {
            Step::Send(bytes) => {
                if wr.write_all(&bytes).await.is_err() || wr.flush().await.is_err() {
                    break;
                }
            }
            Step::Pause(d) => tokio::time::sleep(d).await,
            Step::Await100 => {
                // curl waits 1 s for 100 Continue, then sends the body anyway.
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    rx.wait_for(|b| b.windows(4).any(|w| w == b"\r\n\r\n")),
                )
                .await;
            }
        }
    }
    match tokio::time::timeout(Duration::from_secs(10), reader).await {
        Ok(Ok(raw)) => Ok((raw, false)),
        Ok(Err(e)) => Err(format!("reader task: {e}")),
        Err(_) => Ok((rx.borrow().clone(), true)),
    }
}

/// What each Pod saw of request `id`.
fn seen_by(stubs: &[Stub], id: usize) -> Vec<(u64, Seen)> {
    let id = id.to_string();
    stubs
        .iter()
        .flat_map(|s| {
            s.seen()
                .into_iter()
                .filter(|r| r.headers.get("x-fidelity-case") == Some(&id))
                .map(|r| (s.pod, r))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").map(|m| m.to_string()))
        .unwrap_or_else(|| body.to_owned())
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    format!(
        "{} bytes forwarded vs {} sent, first difference at byte {at}",
        a.len(),
        b.len()
    )
}

/// Run one case; `Err` says what went wrong.
async fn run(port: u16, stubs: &[Stub], id: usize, case: &Case) -> Result<(), String> {
    let (raw, left_open) = exchange(port, case.steps(id)).await?;
    let verdict = judge(stubs, id, case, &parse(&raw));
    match (verdict, left_open) {
        (verdict, false) => verdict,
        (Ok(()), true) => Err("answered as expected, but the connection stayed open 10 s \
             although the request says `Connection: close` (RFC 9112 §9.6; Connection is a \
             list field, every line counts, RFC 9110 §7.6.1)"
            .into()),
        (Err(e), true) => Err(format!("{e}; the connection stayed open 10 s")),
    }
}

/// Check the reply and what the Pods saw against the case's expectation.
fn judge(stubs: &[Stub], id: usize, case: &Case, reply: &Reply) -> Result<(), String> {
    let hits = seen_by(stubs, id);
    let pods: Vec<u64> = hits.iter().map(|(p, _)| *p).collect();
    let got = format!(
        "got status {} ({}), reached Pods {pods:?}",
        reply.status,
        message(&reply.body).chars().take(160).collect::<String>()
    );
    match &case.expect {
        Expect::Pod(pod) => {
            if pods != [*pod] {
                return Err(got);
            }
            if reply.status != 200 || reply.body != format!("{{\"pod\":{pod}}}") {
                return Err(format!("{got}; the Pod's reply did not come back"));
            }
            let seen = &hits[0].1;
            if seen.method != case.req.method || seen.path != case.req.target {
                return Err(format!(
                    "forwarded as {} {} instead of as received ({} {})",
                    seen.method, seen.path, case.req.method, case.req.target
                ));
            }
            if seen.body != case.req.body {
                return Err(format!(
                    "body changed: {}",
                    first_difference(&seen.body, &case.req.body)
                ));
            }
            for h in &case.stripped {
                if seen.headers.contains_key(*h) {
                    return Err(format!("hop-by-hop header {h} was forwarded"));
                }
            }
            Ok(())
        }
        Expect::Refused(status, reason) => {
            let msg = message(&reply.body);
            // `a|b`: either reason is acceptable.
            let reason_ok = reason.split('|').any(|r| msg.contains(r));
            if reply.status != *status || !pods.is_empty() || !reason_ok {
                return Err(got);
            }
            Ok(())
        }
    }
}

/// The long GitLab citations, printed once under a failure list.
const LEGEND: &[(&str, &str)] = &[
    ("RUNNER_AUTH", RUNNER_AUTH),
    ("JOB_AUTH", JOB_AUTH),
    ("API_AUTH", API_AUTH),
    ("GIT_AUTH", GIT_AUTH),
    ("PATH_RULES", PATH_RULES),
    ("HOP_BY_HOP", HOP_BY_HOP),
    ("RACK_MULTIPART", RACK_MULTIPART),
];

/// A case's GitLab explanation with the long citations replaced by their tags.
fn abbreviate(text: &str) -> String {
    LEGEND.iter().fold(text.to_owned(), |t, (tag, long)| {
        t.replace(long, &format!("[{tag}]"))
    })
}

/// Run every case (8 at a time) and fail with the list of all that failed.
async fn run_all(port: u16, stubs: &[Stub], cases: Vec<Case>, first_id: usize) {
    let total = cases.len();
    let limit = Arc::new(Semaphore::new(8));
    let stubs: Arc<Vec<Stub>> = Arc::new(stubs.to_vec());
    let mut tasks = Vec::new();
    for (i, case) in cases.into_iter().enumerate() {
        let id = first_id + i;
        let (limit, stubs) = (limit.clone(), stubs.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let result = run(port, &stubs, id, &case).await;
            (id, case, result)
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        let (id, case, result) = t.await.unwrap();
        if let Err(e) = result {
            failures.push(format!(
                "[{id}] {}\n      expected: {}; {e}\n      GitLab: {}",
                case.name,
                case.expect.describe(),
                abbreviate(&case.gitlab)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} GitLab-fidelity cases fail:\n{}\n\nGitLab sources cited above:\n{}",
        failures.len(),
        failures.join("\n"),
        LEGEND
            .iter()
            .map(|(tag, text)| format!("  [{tag}] {text}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

async fn three_stubs() -> [Stub; 3] {
    [
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_reaches_the_pod_of_the_token_gitlab_authenticates() {
    let stubs = three_stubs().await;
    let config = three_pods(&stubs[0], &stubs[1], &stubs[2], "");
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let cases = all_cases();
    eprintln!("{} GitLab-fidelity cases", cases.len());
    run_all(proxy.port, &stubs, cases, 0).await;
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
    run_all(proxy.port, &stubs, cases, 100_000).await;
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
