//! `podgate workspaces`: create, stop, restart, terminate and list workspaces in a
//! simulated GitLab (`podgate pod-sim`), through its control API (`/-/podsim/workspaces`,
//! `loadtest/src/pod_sim/http/control.rs`) — the simulator's stand-in for GitLab's
//! workspace GraphQL mutations (`workspaceCreate`, `workspaceUpdate` with a desired
//! state).
//!
//! stdout carries a table of workspaces (id, name, desired state, actual state, URL):
//! the one a command created or changed, or all of them (`list`; `--watch` prints it
//! again whenever it changes, until Ctrl-C or SIGTERM). Errors go to stderr:
//! `podgate workspaces: <GitLab's message> (HTTP 400 Bad Request)`. Exit codes: 0
//! ok; 1 a failed request or an unreachable GitLab; 2 usage.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use http::{HeaderValue, header};
use serde_json::{Value, json};

use super::http_client::{self, Method};

/// Exit code for a failed request.
const EXIT_FAILED: u8 = 1;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Flags of `podgate workspaces`.
#[derive(Debug, Args)]
pub(crate) struct WorkspacesArgs {
    /// The simulated GitLab's URL, e.g. http://127.0.0.1:8080 (a `podgate pod-sim`).
    #[arg(long, value_name = "URL", env = "PODGATE_GITLAB")]
    gitlab: String,
    #[command(subcommand)]
    command: WorkspacesCommand,
}

/// What to do.
#[derive(Debug, Subcommand)]
enum WorkspacesCommand {
    /// Create a workspace (desired state Running) and print it.
    Create {
        /// The agent that runs it (its workspaces configuration must be enabled).
        #[arg(long, value_name = "ID")]
        agent: i64,
        /// Its owner.
        #[arg(long, value_name = "ID")]
        user: u64,
        /// The main container's image (default: GitLab's workspace image).
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// A container port exposed through the workspace's Service (repeatable).
        #[arg(long = "port", value_name = "PORT")]
        ports: Vec<u32>,
        /// An environment variable, KEY=VALUE (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
        env: Vec<(String, String)>,
    },
    /// Start a stopped workspace (desired state Running).
    Start {
        /// The workspace id.
        id: u64,
    },
    /// Stop a workspace (desired state Stopped): scaled to 0, storage kept.
    Stop {
        /// The workspace id.
        id: u64,
    },
    /// Restart a workspace (desired state RestartRequested: stopped, then Running).
    Restart {
        /// The workspace id.
        id: u64,
    },
    /// Terminate a workspace (desired state Terminated; final).
    Terminate {
        /// The workspace id.
        id: u64,
    },
    /// Print every workspace.
    List {
        /// Keep going: print the table again whenever it changes.
        #[arg(long)]
        watch: bool,
        /// How often `--watch` asks (e.g. 500ms, 2s).
        #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = interval)]
        interval: Duration,
    },
}

/// `KEY=VALUE`.
fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// `500ms`, `2s`, `1m`.
fn interval(s: &str) -> Result<Duration, String> {
    let d = if let Some(ms) = s.strip_suffix("ms") {
        ms.parse().ok().map(Duration::from_millis)
    } else {
        super::parse_duration_secs(s).ok().map(Duration::from_secs)
    };
    d.filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{s:?} is not a duration like 500ms, 2s or 1m"))
}

/// Run `podgate workspaces`.
pub(crate) fn run(args: WorkspacesArgs) -> anyhow::Result<ExitCode> {
    let gitlab = Gitlab::parse(&args.gitlab)
        .map_err(|e| super::usage(format!("--gitlab {:?}: {e}", args.gitlab)))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    Ok(rt.block_on(async move {
        match command(&gitlab, args.command).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("podgate workspaces: {e}");
                ExitCode::from(EXIT_FAILED)
            }
        }
    }))
}

/// One command; `Err` is the message for stderr.
async fn command(gitlab: &Gitlab, command: WorkspacesCommand) -> Result<(), String> {
    let desired = |id, state: &str| (id, state.to_owned());
    let (id, state) = match command {
        WorkspacesCommand::Create {
            agent,
            user,
            image,
            ports,
            env,
        } => {
            let mut body = json!({"agent_id": agent, "user_id": user});
            if let Some(image) = image {
                body["image"] = json!(image);
            }
            if !ports.is_empty() {
                body["ports"] = json!(ports);
            }
            if !env.is_empty() {
                body["env"] = Value::Object(env.into_iter().map(|(k, v)| (k, json!(v))).collect());
            }
            let view = gitlab
                .call("POST", "/-/podsim/workspaces", Some(&body))
                .await?;
            print!("{}", table(std::slice::from_ref(&view)));
            return Ok(());
        }
        WorkspacesCommand::List { watch, interval } => return list(gitlab, watch, interval).await,
        WorkspacesCommand::Start { id } => desired(id, "Running"),
        WorkspacesCommand::Stop { id } => desired(id, "Stopped"),
        WorkspacesCommand::Restart { id } => desired(id, "RestartRequested"),
        WorkspacesCommand::Terminate { id } => desired(id, "Terminated"),
    };
    let body = json!({"desired_state": state});
    let view = gitlab
        .call("PATCH", &format!("/-/podsim/workspaces/{id}"), Some(&body))
        .await?;
    print!("{}", table(std::slice::from_ref(&view)));
    Ok(())
}

/// `list`, once or (`--watch`) until a signal, printing the table when it changes.
async fn list(gitlab: &Gitlab, watch: bool, every: Duration) -> Result<(), String> {
    let mut last: Option<String> = None;
    let stop = super::shutdown_signal();
    tokio::pin!(stop);
    loop {
        let answer = gitlab.call("GET", "/-/podsim/workspaces", None).await?;
        let rows = answer
            .get("workspaces")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("unexpected answer (no \"workspaces\" array): {answer}"))?;
        let text = table(rows);
        if last.as_deref() != Some(text.as_str()) {
            let mut out = std::io::stdout().lock();
            if last.is_some() {
                let _ = writeln!(out);
            }
            // A closed stdout (`| head`) ends the watch quietly.
            if out
                .write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return Ok(());
            }
            last = Some(text);
        }
        if !watch {
            return Ok(());
        }
        tokio::select! {
            () = &mut stop => return Ok(()),
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// The table: a header and one line per workspace view, columns padded.
pub(crate) fn table(views: &[Value]) -> String {
    let field = |v: &Value, k: &str| match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "-".to_owned(),
        Some(other) => other.to_string(),
    };
    let mut rows = vec![["ID", "NAME", "DESIRED", "ACTUAL", "URL"].map(str::to_owned)];
    for v in views {
        rows.push(["id", "name", "desired_state", "actual_state", "url"].map(|k| field(v, k)));
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Where the simulated GitLab is: `http://host:port[/prefix]`.
#[derive(Debug)]
struct Gitlab {
    host: String,
    port: u16,
    /// Without a trailing `/`.
    prefix: String,
}

impl Gitlab {
    fn parse(url: &str) -> Result<Gitlab, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or("give an http:// URL (the simulator speaks plain HTTP)")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if path.contains(['?', '#']) {
            return Err("no query or fragment, please".into());
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("{p:?} is not a port number"))?,
            ),
            _ => (authority, 80),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("no host".into());
        }
        Ok(Gitlab {
            host: host.to_owned(),
            port,
            prefix: path.trim_end_matches('/').to_owned(),
        })
    }

    fn url(&self, path: &str) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("http://{host}:{}{}{path}", self.port, self.prefix)
    }

    /// `method path` with a JSON body; the JSON answer of a 2xx, else GitLab's
    /// message.
    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let url = self.url(path);
        let (status, reason, answer) =
            tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path, body))
                .await
                .map_err(|_| format!("{method} {url}: no answer in {REQUEST_TIMEOUT:?}"))?
                .map_err(|e| format!("{method} {url}: {e}"))?;
        let json: Option<Value> = serde_json::from_slice(&answer).ok();
        if (200..300).contains(&status) {
            return json.ok_or_else(|| {
                format!(
                    "{method} {url}: the answer is not JSON: {}",
                    String::from_utf8_lossy(&answer)
                )
            });
        }
        let status = format!("HTTP {status} {reason}");
        let status = status.trim_end();
        Err(match json.as_ref().and_then(message) {
            Some(m) => format!("{m} ({status})"),
            None if answer.is_empty() => status.to_owned(),
            None => format!("{status}: {}", String::from_utf8_lossy(&answer).trim()),
        })
    }

    /// One request on its own connection: status, reason, body.
    async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String, Vec<u8>), http_client::Error> {
        let method = Method::from_bytes(method.as_bytes()).expect("the commands' methods");
        let mut request = http_client::request(
            method,
            &format!("{}:{}", self.host, self.port),
            &format!("{}{path}", self.prefix),
            body.map(Value::to_string),
        );
        let headers = request.headers_mut();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static("podgate-workspaces"),
        );
        let r = http_client::send((self.host.as_str(), self.port), request).await?;
        Ok((r.status.as_u16(), r.reason, r.body.to_vec()))
    }
}

/// GitLab's error text: `{"message": "…"}`, `{"message": {"error": "…"}}` (Grape's
/// `render_api_error!` of a hash), `{"error": "…"}`.
fn message(v: &Value) -> Option<String> {
    let m = v.get("message").or_else(|| v.get("error"))?;
    Some(match m {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.len() == 1 => match o.values().next() {
            Some(Value::String(s)) => s.clone(),
            _ => m.to_string(),
        },
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let g = Gitlab::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (g.host.as_str(), g.port, g.prefix.as_str()),
            ("127.0.0.1", 8080, "")
        );
        assert_eq!(
            g.url("/-/podsim/workspaces"),
            "http://127.0.0.1:8080/-/podsim/workspaces"
        );
        let g = Gitlab::parse("http://gitlab.local/pod1/").unwrap();
        assert_eq!(
            (g.host.as_str(), g.port, g.prefix.as_str()),
            ("gitlab.local", 80, "/pod1")
        );
        let g = Gitlab::parse("http://[::1]:9000").unwrap();
        assert_eq!((g.host.as_str(), g.port), ("::1", 9000));
        assert_eq!(g.url("/x"), "http://[::1]:9000/x");
        assert!(Gitlab::parse("https://x:1").is_err());
        assert!(Gitlab::parse("http://:1").is_err());
        assert!(Gitlab::parse("http://x:port").is_err());
        assert!(Gitlab::parse("127.0.0.1:8080").is_err());
    }

    #[test]
    fn messages() {
        assert_eq!(message(&json!({"message": "no"})).as_deref(), Some("no"));
        assert_eq!(
            message(&json!({"message": {"error": "bad params"}})).as_deref(),
            Some("bad params")
        );
        assert_eq!(message(&json!({"error": "nope"})).as_deref(), Some("nope"));
        assert_eq!(
            message(&json!({"message": {"base": ["a"], "x": ["b"]}})).as_deref(),
            Some(r#"{"base":["a"],"x":["b"]}"#)
        );
        assert_eq!(message(&json!({"other": 1})), None);
    }

    #[test]
    fn tables() {
        let views = [
            json!({"id": 1, "name": "workspace-1-1-abc", "desired_state": "Running",
                   "actual_state": "CreationRequested", "url": "https://60001-workspace-1-1-abc.ws.dev/"}),
            json!({"id": 12, "name": "w", "desired_state": "Stopped", "actual_state": "Stopped", "url": null}),
        ];
        assert_eq!(
            table(&views),
            "ID  NAME               DESIRED  ACTUAL             URL\n\
             1   workspace-1-1-abc  Running  CreationRequested  https://60001-workspace-1-1-abc.ws.dev/\n\
             12  w                  Stopped  Stopped            -\n"
        );
        assert_eq!(table(&[]), "ID  NAME  DESIRED  ACTUAL  URL\n");
    }

    #[test]
    fn flags() {
        assert_eq!(interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(interval("2s"), Ok(Duration::from_secs(2)));
        assert!(interval("0ms").is_err());
        assert_eq!(key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(key_value("=x").is_err());
    }
}
