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
mod session;
mod state;

use std::io::{self, Read as _};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{ArgAction, Args, ValueEnum};

use self::dial::Target;
use self::request::RequestFlags;
use self::session::SessionOptions;

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

    /// Keep printing actions until interrupted (default: exit once the initial
    /// graph has arrived).
    #[arg(long)]
    watch: bool,
    /// Without `--watch`: the initial graph may span several messages (each under
    /// 1 MiB), sent back to back; it is taken as complete once no message has come
    /// for this many milliseconds after the first.
    #[arg(long, default_value_t = 500)]
    settle_ms: u64,
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

/// Run `podgate graph`: usage problems are errors (exit 2); the session's outcome
/// is the exit code (0 or 1).
pub(crate) fn run(args: GraphArgs) -> anyhow::Result<ExitCode> {
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("reading --token-file {}", path.display()))?
            .trim()
            .to_owned(),
        (None, None) => {
            return Err(super::usage(
                "give the access token with --token-file FILE or --token TOKEN",
            ));
        }
    };
    if token.is_empty() {
        return Err(super::usage("the access token is empty"));
    }
    let target = Target::from_proxy_url(&args.url).map_err(super::usage)?;
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
        settle: std::time::Duration::from_millis(args.settle_ms),
        output: args.output,
        summary_only: args.summary_only,
    };
    Ok(ExitCode::from(rt.block_on(session::session(
        &target,
        &authorization,
        request,
        opts,
    ))))
}
