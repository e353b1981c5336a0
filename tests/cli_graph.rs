//! `podgate graph` as a process against a small WebSocket server written here with
//! tokio-tungstenite (not podgate code): the upgrade (path, subprotocol,
//! `Bearer pat:<agent>:<token>`), the first message byte for byte as glab
//! (gitlab-org/cli `internal/commands/cluster/graph/graph.go`, `json_types.go`) would
//! send it for the same flags, the example messages of GitLab's Graph API design
//! document (docs/graph-api.md, "Sources") printed as lines and
//! summed up, an `error` message's full reason preferred to a truncated close reason,
//! a refused upgrade's `Status` message, binary and oversized messages, usage errors,
//! and `--watch` ending on SIGTERM.

use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

const TOKEN: &str = "glpat-Sup3rSecretTokenValue";
const PREFIX: &str = "/-/kubernetes-agent/k8s-proxy";
/// A safety net against a hang, not a timing assertion.
const LIMIT: Duration = Duration::from_secs(60);

// The example messages of GitLab's Graph API design document (gitlab-agent
// `doc/graph_api.md`, "Response to client"), verbatim.
const EXAMPLE_SVX: &str = r#"{
  "svx": {
    "vx": {
      "g": "apps",
      "v": "v1",
      "r": "deployments",
      "ns": "myns",
      "n": "my_deployment"
    },
    "o": {},
    "j": []
  }
}"#;
const EXAMPLE_DVX: &str = r#"{
  "dvx": {
    "vx": {
      "g": "apps",
      "v": "v1",
      "r": "deployments",
      "ns": "myns",
      "n": "my_deployment"
    }
  }
}"#;
const EXAMPLE_SARC: &str = r#"{
  "sarc": {
    "s": {
      "g": "",
      "v": "v1",
      "r": "pods",
      "ns": "myns",
      "n": "pod1"
    },
    "d": {
      "g": "apps",
      "v": "v1",
      "r": "deployments",
      "ns": "myns",
      "n": "my_deployment"
    },
    "t": "or",
    "a": {
      "c": true
    }
  }
}"#;
const EXAMPLE_DARC: &str = r#"{
  "darc": {
    "s": {
      "g": "",
      "v": "v1",
      "r": "pods",
      "ns": "myns",
      "n": "pod1"
    },
    "d": {
      "g": "apps",
      "v": "v1",
      "r": "deployments",
      "ns": "myns",
      "n": "my_deployment"
    },
    "t": "or"
  }
}"#;
const EXAMPLE_WARNING: &str = r#"{
  "t": "INFORMER_SYNC_FAILED",
  "m": "Failed to sync informer for apps/v1/deployments in myns in 30 seconds. Check agent's log, agent's permissions",
  "a": {
    "g": "apps",
    "v": "v1",
    "r": "deployments",
    "ns": "myns"
  }
}"#;

/// What glab sends with no query flags: its `defaultWatchQueries` and the
/// `name != 'kube-system'` namespaces, as Go's `json.Marshal` writes them (`&` as
/// `\u0026`, empty fields omitted).
const GLAB_DEFAULT_REQUEST: &str = concat!(
    r#"{"queries":["#,
    r#"{"include":{"resource_selector_expression":"group == '' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['pods', 'secrets', 'configmaps', 'serviceaccounts'])"}},"#,
    r#"{"include":{"resource_selector_expression":"group == 'apps' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['deployments', 'replicasets', 'daemonsets', 'statefulsets'])"}},"#,
    r#"{"include":{"resource_selector_expression":"group == 'batch' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['jobs', 'cronjobs'])"}},"#,
    r#"{"include":{"resource_selector_expression":"group == 'rbac.authorization.k8s.io' \u0026\u0026 version == 'v1' \u0026\u0026 !(resource in ['clusterrolebindings', 'clusterroles'])"}}"#,
    r#"],"namespaces":{"object_selector_expression":"name != 'kube-system'"}}"#,
);

/// One thing the test server does after reading the request.
enum Step {
    Text(String),
    Binary(Vec<u8>),
    /// Send a close frame and wait for the client's reply.
    Close(u16, String),
    /// Wait for the client's close frame.
    AwaitClientClose,
}

/// What the test server saw.
#[derive(Debug, Default)]
struct Seen {
    path: String,
    protocol: Option<String>,
    authorization: Option<String>,
    request: String,
    client_close: Option<u16>,
}

/// Serve one WebSocket connection on a free port: record the upgrade and the first
/// message, then play `steps`. `echo_protocol`: agree to the offered subprotocol.
async fn server(echo_protocol: bool, steps: Vec<Step>) -> (String, tokio::task::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{PREFIX}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let record = Arc::clone(&seen);
        // tungstenite's callback type returns its (large) ErrorResponse.
        #[allow(clippy::result_large_err)]
        let callback = move |req: &Request, mut resp: Response| {
            let header = |name: &str| {
                req.headers()
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            let mut s = record.lock().unwrap();
            s.path = req.uri().path().to_owned();
            s.protocol = header("sec-websocket-protocol");
            s.authorization = header("authorization");
            if echo_protocol && let Some(p) = &s.protocol {
                resp.headers_mut()
                    .insert("sec-websocket-protocol", p.parse().unwrap());
            }
            Ok(resp)
        };
        let mut ws = tokio_tungstenite::accept_hdr_async(tcp, callback)
            .await
            .unwrap();
        let first = ws.next().await.unwrap().unwrap();
        let Message::Text(first) = first else {
            panic!("the first message is not text: {first:?}")
        };
        seen.lock().unwrap().request = first.to_string();
        for step in steps {
            match step {
                Step::Text(t) => {
                    // The client may already be gone (it exits after what it needed).
                    if ws.send(Message::text(t)).await.is_err() {
                        break;
                    }
                }
                Step::Binary(b) => {
                    if ws.send(Message::binary(b)).await.is_err() {
                        break;
                    }
                }
                Step::Close(code, reason) => {
                    let frame = CloseFrame {
                        code: code.into(),
                        reason: reason.into(),
                    };
                    let _ = ws.close(Some(frame)).await;
                    while let Some(Ok(_)) = ws.next().await {}
                }
                Step::AwaitClientClose => {
                    while let Some(msg) = ws.next().await {
                        match msg {
                            Ok(Message::Close(f)) => {
                                seen.lock().unwrap().client_close = f.map(|f| f.code.into());
                            }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                }
            }
        }
        std::mem::take(&mut *seen.lock().unwrap())
    });
    (url, task)
}

fn token_file() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), format!("{TOKEN}\n")).unwrap();
    f
}

fn podgate(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podgate"));
    cmd.arg("graph")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(args: &[&str]) -> Output {
    tokio::time::timeout(LIMIT, podgate(args).output())
        .await
        .expect("podgate graph ended")
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

/// Assert the exit code, and that the token was printed nowhere.
fn check(out: &Output, code: i32) -> (String, String) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(!stdout.contains(TOKEN) && !stderr.contains(TOKEN));
    (stdout, stderr)
}

/// The design document's messages in three batches, then its `error` shape with a reason
/// too long for a close frame, then a close whose reason is cut at 123 bytes.
#[tokio::test]
async fn watch_prints_the_design_documents_messages_and_prefers_the_full_error_reason() {
    let m1 = format!(
        r#"{{"actions": [{EXAMPLE_SVX}, {EXAMPLE_SARC}], "warnings": [{EXAMPLE_WARNING}]}}"#
    );
    let m2 = concat!(
        r#"{"actions":[{"svx":{"vx":{"g":"","v":"v1","r":"pods","ns":"myns","n":"pod1"},"o":{"metadata":{"name":"pod1"}}}},"#,
        r#"{"sarc":{"s":{"g":"","v":"v1","r":"pods","ns":"myns","n":"pod1"},"d":{"g":"","v":"v1","r":"configmaps","ns":"myns","n":"cm1"},"t":"r","a":{"e":true}}}]}"#
    )
    .to_owned();
    let m3 = format!(r#"{{"actions": [{EXAMPLE_DARC}, {EXAMPLE_DVX}]}}"#);
    let reason = format!(
        "queries[0].include.resource_selector_expression: {}",
        "undeclared reference to 'resourcez' ".repeat(6)
    );
    assert!(reason.len() > 123);
    let m4 = format!(
        r#"{{"error":{{"code":1007,"code_string":"StatusInvalidFramePayloadData","reason":"{reason}"}}}}"#
    );
    let bytes = m1.len() + m2.len() + m3.len() + m4.len();
    let (url, srv) = server(
        true,
        vec![
            Step::Text(m1),
            Step::Text(m2),
            Step::Text(m3),
            Step::Text(m4),
            Step::Close(1007, reason[..123].to_owned()),
        ],
    )
    .await;
    let tf = token_file();
    let out = run(&[
        "-a",
        "42",
        "--url",
        &url,
        "--token-file",
        tf.path().to_str().unwrap(),
        "--watch",
    ])
    .await;
    let seen = srv.await.unwrap();
    assert_eq!(seen.path, format!("{PREFIX}/graph"));
    assert_eq!(seen.protocol.as_deref(), Some("gitlab-agent-graph-api"));
    assert_eq!(
        seen.authorization,
        Some(format!("Bearer pat:42:{TOKEN}")),
        "the token file's trailing newline is not part of the token"
    );
    assert_eq!(seen.request, GLAB_DEFAULT_REQUEST);

    let (stdout, stderr) = check(&out, 1);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "warning INFORMER_SYNC_FAILED: Failed to sync informer for apps/v1/deployments in myns in 30 seconds. Check agent's log, agent's permissions (g=apps ns=myns r=deployments v=v1)",
            "svx apps/v1/deployments myns/my_deployment j=[]",
            "sarc v1/pods myns/pod1 -> apps/v1/deployments myns/my_deployment or c",
            "svx v1/pods myns/pod1",
            "sarc v1/pods myns/pod1 -> v1/configmaps myns/cm1 r e",
            "darc v1/pods myns/pod1 -> apps/v1/deployments myns/my_deployment or",
            "dvx apps/v1/deployments myns/my_deployment",
        ]
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "summary: 1 vertices, 1 arcs, 1 warnings; 4 messages, {bytes} bytes received; connected in "
        )),
        "{stderr}"
    );
    assert!(lines[0].contains(" ms after the request"), "{stderr}");
    assert_eq!(lines[1], "vertices: pods 1");
    assert_eq!(lines[2], "arcs: or 0, r 1, t 0; with e 1");
    assert_eq!(lines[3], "warnings: INFORMER_SYNC_FAILED 1");
    assert_eq!(
        lines[4],
        "  INFORMER_SYNC_FAILED: Failed to sync informer for apps/v1/deployments in myns in 30 seconds. Check agent's log, agent's permissions (g=apps ns=myns r=deployments v=v1)"
    );
    assert_eq!(
        lines[5],
        format!(
            "podgate graph: the server closed the connection: 1007 StatusInvalidFramePayloadData: {reason}"
        ),
        "the full reason from the error message, not the close frame's 123 bytes"
    );
    assert_eq!(lines.len(), 6, "{stderr}");
}

/// Without `--watch` the client exits 0 once the initial graph has arrived (here in
/// two messages sent back to back, as a server splits a large one) and no more came
/// within the settle time, closing with 1000 (the server sends nothing until then);
/// `--output json` prints each message verbatim on one line; the request is glab's
/// for `-r pods -r configmaps` with namespaces and roots.
#[tokio::test]
async fn first_message_then_exit_with_json_output() {
    let m1 = format!(
        r#"{{"actions": [{EXAMPLE_SVX}, {EXAMPLE_SARC}], "warnings": [{EXAMPLE_WARNING}]}}"#
    );
    let m2 = r#"{"actions": [{"svx": {"vx": {"g": "", "v": "v1", "r": "pods", "ns": "myns", "n": "pod1"}}}]}"#;
    let (url, srv) = server(
        true,
        vec![
            Step::Text(m1.clone()),
            Step::Text(m2.to_owned()),
            Step::AwaitClientClose,
        ],
    )
    .await;
    let out = run(&[
        "--agent=7",
        "--url",
        &format!("{url}/"),
        "--token",
        TOKEN,
        "-r",
        "pods",
        "-r",
        "configmaps",
        "-n",
        "shop",
        "-n=web",
        "--root-expression",
        "resource == 'deployments' && name == 'web'",
        "--ignore-arc-direction",
        "--output",
        "json",
    ])
    .await;
    let seen = srv.await.unwrap();
    assert_eq!(seen.path, format!("{PREFIX}/graph"), "no double slash");
    assert_eq!(seen.authorization, Some(format!("Bearer pat:7:{TOKEN}")));
    assert_eq!(
        seen.request,
        concat!(
            r#"{"queries":[{"include":{"resource_selector_expression":"resource in ['pods','configmaps']"}}],"#,
            r#""namespaces":{"names":["shop","web"]},"#,
            r#""roots":{"object_selector_expressions":["resource == 'deployments' \u0026\u0026 name == 'web'"],"ignore_arc_direction":["or","r","t"]}}"#
        )
    );
    assert_eq!(seen.client_close, Some(1000));
    let (stdout, stderr) = check(&out, 0);
    assert_eq!(stdout, format!("{}\n{m2}\n", m1.replace('\n', "")));
    let first_line = stdout.lines().next().unwrap();
    let v: serde_json::Value = serde_json::from_str(first_line).unwrap();
    assert_eq!(v["actions"][1]["sarc"]["a"]["c"], true);
    assert!(
        stderr.starts_with(&format!(
            "summary: 2 vertices, 1 arcs, 1 warnings; 2 messages, {} bytes received",
            m1.len() + m2.len()
        )),
        "{stderr}"
    );
    // The arc's source (pod1) came in the second message.
    assert!(
        stderr.contains("\nvertices: apps/deployments 1, pods 1\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("\narcs: or 1, r 0, t 0; with e 0\n"),
        "{stderr}"
    );
}

/// Run with `args` against a server that answers the request with `{}`; return the
/// request it received.
async fn request_for(args: &[&str], stdin: Option<&str>) -> String {
    let (url, srv) = server(true, vec![Step::Text("{}".into()), Step::AwaitClientClose]).await;
    let mut full = vec!["-a", "1", "--url", &url, "--token", TOKEN];
    full.extend_from_slice(args);
    let mut cmd = podgate(&full);
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        let mut w = child.stdin.take().unwrap();
        w.write_all(input.as_bytes()).await.unwrap();
        drop(w);
    }
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let (_, stderr) = check(&out, 0);
    assert!(
        stderr.starts_with("summary: 0 vertices, 0 arcs, 0 warnings; 1 messages, 2 bytes"),
        "{stderr}"
    );
    srv.await.unwrap().request
}

#[tokio::test]
async fn group_flags_namespace_selectors_stdin_and_query_file() {
    let got = request_for(
        &[
            "--crd",
            "--core",
            "--apps",
            "--batch",
            "--rbac",
            "--cluster-rbac",
            "--batch=false",
            "-r",
            "widgets",
            "--ns-label-selector",
            "env=prod",
            "--ns-field-selector",
            "metadata.name!=kube-system",
            "--ns-expression",
            "name.startsWith('s') && 'team' in labels",
            "--root-expression",
            "resource == 'pods'",
        ],
        None,
    )
    .await;
    // glab's order (core, batch, apps, rbac, cluster-rbac, crd, then resources),
    // whatever the order on the command line; `--batch=false` as pflag reads it.
    let want = concat!(
        r#"{"queries":["#,
        r#"{"include":{"resource_selector_expression":"group == '' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['pods', 'secrets', 'configmaps', 'serviceaccounts'])"}},"#,
        r#"{"include":{"resource_selector_expression":"group == 'apps' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['deployments', 'replicasets', 'daemonsets', 'statefulsets'])"}},"#,
        r#"{"include":{"resource_selector_expression":"group == 'rbac.authorization.k8s.io' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['roles', 'rolebindings'])"}},"#,
        r#"{"include":{"resource_selector_expression":"group == 'rbac.authorization.k8s.io' \u0026\u0026 version == 'v1' \u0026\u0026 (resource in ['clusterroles', 'clusterrolebindings'])"}},"#,
        r#"{"include":{"resource_selector_expression":"group == 'apiextensions.k8s.io' \u0026\u0026 version == 'v1' \u0026\u0026 resource == 'customresourcedefinitions'"}},"#,
        r#"{"include":{"resource_selector_expression":"resource in ['widgets']"}}],"#,
        r#""namespaces":{"label_selector":"env=prod","field_selector":"metadata.name!=kube-system","object_selector_expression":"name.startsWith('s') \u0026\u0026 'team' in labels"},"#,
        r#""roots":{"object_selector_expressions":["resource == 'pods'"]}}"#
    );
    assert_eq!(got, want);

    // --stdin and --query send the bytes as they are, unparsed.
    let custom =
        "{ \"queries\": [ {\"include\": {\"resource_selector_expression\": \"true\"}} ] }\n";
    assert_eq!(request_for(&["--stdin"], Some(custom)).await, custom);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), custom).unwrap();
    assert_eq!(
        request_for(&["--query", f.path().to_str().unwrap()], None).await,
        custom
    );
}

/// A 401 from kas: the status, the `Status` message and `Gitlab-Unauthorized` are
/// printed (the body arrives after the head, in a second write).
#[tokio::test]
async fn refused_upgrade_prints_the_status_message() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{PREFIX}/", listener.local_addr().unwrap());
    let srv = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request head ended early");
            head.extend_from_slice(&buf[..n]);
        }
        let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"GitLab Agent Server: Unauthorized","reason":"Unauthorized","code":401}"#;
        let resp_head = format!(
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nGitlab-Unauthorized: true\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        tcp.write_all(resp_head.as_bytes()).await.unwrap();
        tcp.flush().await.unwrap();
        tcp.write_all(body.as_bytes()).await.unwrap();
        tcp.flush().await.unwrap();
        // Keep the connection open: the client must stop at Content-Length.
        let _ = tcp.read(&mut buf).await;
        text(&head)
    });
    let out = run(&["-a", "5", "--url", &url, "--token", TOKEN]).await;
    let head = srv.await.unwrap();
    assert!(
        head.starts_with(&format!("GET {PREFIX}/graph HTTP/1.1\r\n")),
        "{head}"
    );
    let (stdout, stderr) = check(&out, 1);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr.trim_end(),
        "podgate graph: the server refused the WebSocket upgrade: HTTP 401 Unauthorized: \
         GitLab Agent Server: Unauthorized (Gitlab-Unauthorized: true: kas refused the \
         credentials, not the cluster)"
    );
}

#[tokio::test]
async fn upgrade_without_the_subprotocol_is_an_error() {
    let (url, srv) = server(false, vec![]).await;
    let out = run(&["-a", "5", "--url", &url, "--token", TOKEN]).await;
    let (_, stderr) = check(&out, 1);
    assert!(
        stderr.contains("did not accept the WebSocket subprotocol gitlab-agent-graph-api"),
        "{stderr}"
    );
    drop(srv);
}

#[tokio::test]
async fn binary_message_is_an_error() {
    let (url, srv) = server(
        true,
        vec![Step::Binary(b"{}".to_vec()), Step::AwaitClientClose],
    )
    .await;
    let out = run(&["-a", "5", "--url", &url, "--token", TOKEN]).await;
    let seen = srv.await.unwrap();
    assert_eq!(seen.client_close, Some(1003), "unsupported data");
    let (stdout, stderr) = check(&out, 1);
    assert_eq!(stdout, "");
    assert!(
        stderr.ends_with(
            "podgate graph: unexpected message type (binary; the Graph API sends text)\n"
        ),
        "{stderr}"
    );
}

/// glab's read limit is 4 MiB: a larger message is refused, a message of exactly
/// 4 MiB is not.
#[tokio::test]
async fn messages_over_4_mib_are_refused() {
    let fits = |len: usize| {
        let head = r#"{"warnings":[{"t":"INTERNAL_ERROR","m":""#;
        let tail = r#""}]}"#;
        format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
    };
    let (url, srv) = server(
        true,
        vec![Step::Text(fits(4 << 20)), Step::AwaitClientClose],
    )
    .await;
    let out = run(&["-a", "5", "--url", &url, "--token", TOKEN, "--summary-only"]).await;
    srv.await.unwrap();
    let (stdout, stderr) = check(&out, 0);
    assert_eq!(stdout, "", "--summary-only prints no stream");
    assert!(
        stderr.contains("1 messages, 4194304 bytes received"),
        "{stderr}"
    );

    let (url, srv) = server(true, vec![Step::Text(fits((4 << 20) + 1))]).await;
    let out = run(&["-a", "5", "--url", &url, "--token", TOKEN]).await;
    let _ = srv.await;
    let (_, stderr) = check(&out, 1);
    assert!(
        stderr.contains(
            "podgate graph: a message of 4194305 bytes is over the 4194304-byte (4 MiB) limit"
        ),
        "{stderr}"
    );
}

/// `--watch` keeps reading until SIGTERM, then closes with 1000 and exits 0.
#[tokio::test]
async fn watch_ends_on_sigterm() {
    let m1 = format!(r#"{{"actions": [{EXAMPLE_SVX}]}}"#);
    let (url, srv) = server(true, vec![Step::Text(m1), Step::AwaitClientClose]).await;
    let mut child = podgate(&["-a", "5", "--url", &url, "--token", TOKEN, "--watch"])
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(LIMIT, stdout.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        line.as_deref(),
        Some("svx apps/v1/deployments myns/my_deployment j=[]")
    );
    crate::common::process::terminate(child.id().unwrap());
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let seen = srv.await.unwrap();
    assert_eq!(seen.client_close, Some(1000));
    let (_, stderr) = check(&out, 0);
    assert!(
        stderr.starts_with("summary: 1 vertices, 0 arcs"),
        "{stderr}"
    );
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let cases: [&[&str]; 6] = [
        // glab: --stdin and the query-building flags are mutually exclusive.
        &[
            "-a",
            "1",
            "--url",
            "http://127.0.0.1:9/",
            "--token",
            "t",
            "--stdin",
            "-r",
            "pods",
        ],
        &[
            "-a",
            "1",
            "--url",
            "http://127.0.0.1:9/",
            "--token",
            "t",
            "--query",
            "q.json",
            "--core",
        ],
        // --agent is required.
        &["--url", "http://127.0.0.1:9/", "--token", "t"],
        // A token is required, once.
        &["-a", "1", "--url", "http://127.0.0.1:9/"],
        &[
            "-a",
            "1",
            "--url",
            "http://127.0.0.1:9/",
            "--token",
            "t",
            "--token-file",
            "f",
        ],
        &["-a", "1", "--url", "ftp://127.0.0.1:9/", "--token", "t"],
    ];
    for args in cases {
        let out = run(args).await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "", "{args:?}");
    }
}
