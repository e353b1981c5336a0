//! `podgate graph`: a Graph API client that behaves like GitLab's `glab cluster graph`
//! (gitlab-org/cli `internal/commands/cluster/graph/`: `graph.go` for the flags and
//! the request, `server.go` for the WebSocket) but prints the graph instead of
//! rendering it in a browser.
//!
//! stdout carries the stream: one line per warning and action (`--output text`) or
//! each message verbatim (`--output json`). stderr carries the summary (vertices by
//! group/resource, arcs by type and with `e`, warnings by type with their messages,
//! bytes received, time to the first message) and any error. Exit codes: 0 ok, 1 a
//! server or transport error, 2 usage.

mod dial;
mod request;
mod state;

use std::io::{self, Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{ArgAction, Args, ValueEnum};
use futures_util::{SinkExt as _, StreamExt as _};
use podgate_agent::graph::wire::{self, ErrorInfo, Message as WireMessage};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

use self::dial::{Socket, Target};
use self::request::RequestFlags;
use self::state::GraphState;

/// Exit code for a server or transport error.
const EXIT_SERVER: u8 = 1;
/// After an `error` message, how long to wait for the close frame that follows it.
const CLOSE_AFTER_ERROR: Duration = Duration::from_secs(5);
/// How long our own close handshake may take before we give up on it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The flags glab marks as mutually exclusive with `--stdin` (and podgate's
/// `--query`, which does the same from a file).
const QUERY_BUILDING: [&str; 12] = [
    "namespace",
    "ns_label_selector",
    "ns_field_selector",
    "ns_expression",
    "root_expression",
    "resource",
    "core",
    "batch",
    "apps",
    "rbac",
    "cluster_rbac",
    "crd",
];

/// What stdout shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// One line per warning and action (`svx apps/v1/deployments ns/name`).
    Text,
    /// Each received message verbatim, one per line.
    Json,
}

/// Flags of `podgate graph`. The query flags are glab's (`glab cluster graph
/// --help`); as with pflag, booleans take an optional `=true`/`=false` and a flag
/// given twice keeps its last value (repeatable ones collect every value).
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub(crate) struct GraphArgs {
    /// The numeric agent ID to connect to.
    #[arg(short = 'a', long = "agent", value_name = "ID")]
    agent: i64,
    /// The Kubernetes API proxy's base URL (what GitLab's metadata calls
    /// `kas.externalK8sProxyUrl`), e.g.
    /// http://127.0.0.1:8080/-/kubernetes-agent/k8s-proxy/; `graph` is appended.
    #[arg(long, value_name = "URL")]
    url: String,
    /// A file holding the personal or project access token (scope `k8s_proxy`).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "token",
        required_unless_present = "token"
    )]
    token_file: Option<PathBuf>,
    /// The personal or project access token (prefer --token-file: arguments are
    /// visible to other users of the machine).
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Read the watch request JSON from this file.
    #[arg(long, value_name = "FILE", conflicts_with = "stdin", conflicts_with_all = QUERY_BUILDING)]
    query: Option<PathBuf>,
    /// Read watch request from standard input.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true",
          conflicts_with_all = QUERY_BUILDING)]
    stdin: bool,
    /// Log watch request to stdout. Helpful for debugging.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    log_watch_request: bool,

    /// Namespaces to watch. If not specified, all namespaces are watched with label
    /// and field selectors filtering.
    #[arg(short = 'n', long = "namespace", value_name = "NAME")]
    namespace: Vec<String>,
    /// Label selector to select namespaces.
    #[arg(long, value_name = "SELECTOR")]
    ns_label_selector: Option<String>,
    /// Field selector to select namespaces.
    #[arg(long, value_name = "SELECTOR")]
    ns_field_selector: Option<String>,
    /// CEL expression to select namespaces. Evaluated before a namespace is watched
    /// and on any updates for the namespace object.
    #[arg(long, value_name = "CEL")]
    ns_expression: Option<String>,
    /// CEL expression to select root objects (repeatable, OR-ed). Requires GitLab and
    /// agent version 18.3 or later.
    #[arg(long, value_name = "CEL")]
    root_expression: Vec<String>,
    /// Ignore arc direction when evaluating root connectivity. Requires GitLab and
    /// agent version 18.3 or later.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    ignore_arc_direction: bool,
    /// Resources to watch (repeatable). `kubectl api-resources` lists what a cluster
    /// supports.
    #[arg(short = 'r', long = "resource", value_name = "RESOURCE")]
    resource: Vec<String>,
    /// Watch pods, secrets, configmaps, and serviceaccounts in the core/v1 group.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    core: bool,
    /// Watch jobs and cronjobs in the batch/v1 group.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    batch: bool,
    /// Watch deployments, replicasets, daemonsets, and statefulsets in the apps/v1 group.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    apps: bool,
    /// Watch roles and rolebindings in the rbac.authorization.k8s.io/v1 group.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    rbac: bool,
    /// Watch clusterroles and clusterrolebindings in the rbac.authorization.k8s.io/v1 group.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    cluster_rbac: bool,
    /// Watch customresourcedefinitions in the apiextensions.k8s.io/v1 group.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value_t = false, default_missing_value = "true")]
    crd: bool,

    /// Keep printing actions until interrupted (default: exit once the first
    /// message, the initial graph, has arrived).
    #[arg(long)]
    watch: bool,
    /// What stdout shows.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Print only the summary (and errors), not the stream.
    #[arg(long)]
    summary_only: bool,
}

impl GraphArgs {
    fn request_flags(&self) -> RequestFlags {
        RequestFlags {
            namespaces: self.namespace.clone(),
            ns_label_selector: self.ns_label_selector.clone().unwrap_or_default(),
            ns_field_selector: self.ns_field_selector.clone().unwrap_or_default(),
            ns_expression: self.ns_expression.clone().unwrap_or_default(),
            root_expressions: self.root_expression.clone(),
            ignore_arc_direction: self.ignore_arc_direction,
            resources: self.resource.clone(),
            core: self.core,
            batch: self.batch,
            apps: self.apps,
            rbac: self.rbac,
            cluster_rbac: self.cluster_rbac,
            crd: self.crd,
        }
    }
}

pub(crate) fn run(args: GraphArgs) -> anyhow::Result<ExitCode> {
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("reading --token-file {}", path.display()))?
            .trim()
            .to_owned(),
        (None, None) => bail!("give the access token with --token-file FILE or --token TOKEN"),
    };
    if token.is_empty() {
        bail!("the access token is empty");
    }
    let target = Target::from_proxy_url(&args.url).map_err(anyhow::Error::msg)?;
    // glab sends --stdin's bytes as they are; a text frame needs UTF-8.
    let request = if args.stdin {
        let mut buf = Vec::new();
        io::stdin()
            .read_to_end(&mut buf)
            .context("reading request from stdin")?;
        String::from_utf8(buf).context("the request on stdin is not UTF-8")?
    } else if let Some(path) = &args.query {
        let buf =
            std::fs::read(path).with_context(|| format!("reading --query {}", path.display()))?;
        String::from_utf8(buf)
            .with_context(|| format!("--query {} is not UTF-8", path.display()))?
    } else {
        request::build(&args.request_flags())
    };
    if args.log_watch_request {
        // glab: `o.io.LogInfo(string(watchReq))`, to stdout.
        println!("{request}");
    }
    // glab: fmt.Sprintf("Bearer pat:%d:%s", o.agentID, authSource.Token).
    let authorization = format!("Bearer pat:{}:{token}", args.agent);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let opts = SessionOptions {
        watch: args.watch,
        output: args.output,
        summary_only: args.summary_only,
    };
    Ok(ExitCode::from(rt.block_on(session(
        &target,
        &authorization,
        request,
        opts,
    ))))
}

#[derive(Debug, Clone, Copy)]
struct SessionOptions {
    watch: bool,
    output: Output,
    summary_only: bool,
}

/// How reading the stream ended.
#[derive(Debug)]
enum End {
    /// The first message arrived (without `--watch`).
    Done,
    /// SIGINT or SIGTERM.
    Interrupted,
    /// stdout was closed (e.g. `| head`).
    StdoutClosed,
    /// The server sent a close frame.
    Closed(Option<CloseFrame>),
    /// An `error` message came but no close frame followed in time.
    ErrorWithoutClose,
    /// The connection ended without a close frame.
    Dropped,
    /// A binary message (glab: "unexpected message type").
    Binary,
    /// A message that is not the Graph API's JSON.
    BadJson(String),
    /// A message over the 4 MiB limit.
    TooBig(String),
    /// Any other read or write error.
    Transport(String),
}

async fn session(
    target: &Target,
    authorization: &str,
    request: String,
    opts: SessionOptions,
) -> u8 {
    let started = Instant::now();
    let mut ws = match dial::connect(target, authorization).await {
        Ok(ws) => ws,
        Err(e) => {
            // A refused upgrade, a subprotocol not agreed, or no connection at all.
            eprintln!("podgate graph: {e}");
            return EXIT_SERVER;
        }
    };
    let mut state = GraphState::new(started.elapsed());
    if let Err(e) = ws.send(Message::text(request)).await {
        eprintln!("podgate graph: WebSocket write: {e}");
        return EXIT_SERVER;
    }
    let sent = Instant::now();
    let mut stdout = io::BufWriter::new(io::stdout().lock());
    let mut error: Option<ErrorInfo> = None;
    let end = read_stream(&mut ws, &mut state, &mut error, &mut stdout, sent, opts).await;
    let _ = stdout.flush();
    drop(stdout);

    // Our side of the close, where the server has not closed.
    let our_close = match &end {
        End::Done | End::Interrupted | End::StdoutClosed => Some(CloseCode::Normal),
        End::Binary => Some(CloseCode::Unsupported),
        End::BadJson(_) => Some(CloseCode::Invalid),
        End::TooBig(_) => Some(CloseCode::Size),
        End::ErrorWithoutClose => Some(CloseCode::Normal),
        End::Closed(_) | End::Dropped | End::Transport(_) => None,
    };
    match our_close {
        Some(code) => close(&mut ws, code).await,
        // Send the reply to the server's close frame that tungstenite queued.
        None if matches!(end, End::Closed(_)) => {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, ws.flush()).await;
        }
        None => {}
    }

    eprint!("{}", state.summary());
    let (code, line) = verdict(&end, error.as_ref(), &state, opts);
    if let Some(line) = line {
        eprintln!("podgate graph: {line}");
    }
    code
}

/// Read messages until the stream ends (see [`End`]), printing each one.
async fn read_stream(
    ws: &mut Socket,
    state: &mut GraphState,
    error: &mut Option<ErrorInfo>,
    out: &mut impl io::Write,
    sent: Instant,
    opts: SessionOptions,
) -> End {
    let interrupt = super::shutdown_signal();
    tokio::pin!(interrupt);
    let mut error_deadline: Option<tokio::time::Instant> = None;
    loop {
        let error_wait = async {
            match error_deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            _ = &mut interrupt => return End::Interrupted,
            _ = error_wait => return End::ErrorWithoutClose,
            next = ws.next() => next,
        };
        let text = match next {
            None => return End::Dropped,
            Some(Err(e)) => return read_error(e),
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Binary(_))) => return End::Binary,
            Some(Ok(Message::Close(frame))) => return End::Closed(frame),
            Some(Ok(_)) => continue,
        };
        state.received(text.len(), sent.elapsed());
        let parsed = serde_json::from_str::<WireMessage>(&text);
        if !opts.summary_only {
            let written = match (&parsed, opts.output) {
                (_, Output::Json) => writeln!(out, "{}", one_line(&text)),
                (Ok(msg), Output::Text) => state::message_lines(msg)
                    .iter()
                    .try_for_each(|line| writeln!(out, "{line}")),
                (Err(_), Output::Text) => Ok(()),
            };
            if let Err(e) = written.and_then(|()| out.flush()) {
                return if e.kind() == io::ErrorKind::BrokenPipe {
                    End::StdoutClosed
                } else {
                    End::Transport(format!("writing stdout: {e}"))
                };
            }
        }
        let msg = match parsed {
            Ok(msg) => msg,
            Err(e) => return End::BadJson(e.to_string()),
        };
        state.apply(&msg);
        if let Some(e) = msg.error {
            // The close frame follows with a truncated reason; keep the full one.
            *error = Some(e);
            error_deadline = Some(tokio::time::Instant::now() + CLOSE_AFTER_ERROR);
            continue;
        }
        if !opts.watch && error.is_none() {
            return End::Done;
        }
    }
}

fn read_error(e: tungstenite::Error) -> End {
    use tungstenite::Error as E;
    use tungstenite::error::{CapacityError, ProtocolError};
    match e {
        E::Capacity(CapacityError::MessageTooLong { size, max_size }) => End::TooBig(format!(
            "a message of {size} bytes is over the {max_size}-byte (4 MiB) limit GitLab's client sets"
        )),
        E::Protocol(ProtocolError::ResetWithoutClosingHandshake) | E::ConnectionClosed => {
            End::Dropped
        }
        E::Io(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof
            ) =>
        {
            End::Dropped
        }
        e => End::Transport(format!("WebSocket read: {e}")),
    }
}

/// A message as one line: JSON strings cannot hold raw line breaks, so any in a
/// message are whitespace between tokens and can go.
fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(['\n', '\r']) {
        text.replace(['\n', '\r'], "").into()
    } else {
        text.into()
    }
}

/// Close our side with `code` and wait (briefly) for the server's reply.
async fn close(ws: &mut Socket, code: CloseCode) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let frame = CloseFrame {
            code,
            reason: "".into(),
        };
        if ws.close(Some(frame)).await.is_err() {
            return;
        }
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// `1007 StatusInvalidFramePayloadData`.
fn code_text(code: u16) -> String {
    format!("{code} {}", wire::close_code_string(code))
}

/// The exit code and the final error line for how the stream ended.
fn verdict(
    end: &End,
    error: Option<&ErrorInfo>,
    state: &GraphState,
    opts: SessionOptions,
) -> (u8, Option<String>) {
    // The full reason of an `error` message beats a close frame's truncated one.
    let error_line = |code: u16, close_reason: &str| -> String {
        let reason = error.map_or(close_reason, |e| e.reason.as_str());
        if reason.is_empty() {
            code_text(code)
        } else {
            format!("{}: {reason}", code_text(code))
        }
    };
    match end {
        End::Done | End::StdoutClosed => (0, None),
        End::Interrupted => match error {
            Some(e) => (
                EXIT_SERVER,
                Some(format!(
                    "interrupted after an error: {}",
                    error_line(e.code, "")
                )),
            ),
            None if opts.watch || state.any_message() => (0, None),
            None => (
                EXIT_SERVER,
                Some("interrupted before the first message".into()),
            ),
        },
        End::Closed(frame) => {
            let (code, reason) = match frame {
                Some(f) => (u16::from(f.code), f.reason.as_str()),
                None => (1005, ""),
            };
            let line = format!(
                "the server closed the connection: {}",
                error_line(code, reason)
            );
            let ok = code == 1000 && error.is_none() && state.any_message();
            (if ok { 0 } else { EXIT_SERVER }, Some(line))
        }
        End::ErrorWithoutClose => {
            let e = error.expect("only after an error message");
            (
                EXIT_SERVER,
                Some(format!(
                    "the server sent an error and did not close within {} s: {}",
                    CLOSE_AFTER_ERROR.as_secs(),
                    error_line(e.code, "")
                )),
            )
        }
        End::Dropped => {
            let mut line = format!(
                "the connection ended without a close frame ({})",
                code_text(1006)
            );
            if let Some(e) = error {
                line.push_str(&format!("; the server's error: {}", error_line(e.code, "")));
            }
            (EXIT_SERVER, Some(line))
        }
        End::Binary => (
            EXIT_SERVER,
            Some("unexpected message type (binary; the Graph API sends text)".into()),
        ),
        End::BadJson(e) => (EXIT_SERVER, Some(format!("JSON unmarshal: {e}"))),
        End::TooBig(e) | End::Transport(e) => (EXIT_SERVER, Some(e.clone())),
    }
}
