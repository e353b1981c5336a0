//! Pods' streaming subresources with the installed `kubectl` pointed straight at
//! kube-sim: `exec` (output, stdin, exit codes), `attach`, `port-forward` (bytes
//! both ways through the WebSocket-tunnelled SPDY) and `logs -f`, each over
//! kubectl's default WebSocket and over its SPDY fallback; RBAC on each
//! subresource (`rbac`); requests kube-sim refuses (`refusals`).

mod rbac;
mod refusals;

use std::process::Stdio;
use std::time::Duration;

use podgate_testkit::kube::{KubeTestServer, Kubectl};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout};

/// How long any one expected output may take (kubectl starts in well under it).
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) async fn server() -> KubeTestServer {
    let server = KubeTestServer::start(1000).await.unwrap();
    server.put(
        "pods",
        "default",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1"},
            "spec": {"containers": [
                {"name": "app", "image": "nginx:1.27",
                 "env": [{"name": "GREETING", "value": "hello from app"}],
                 "ports": [{"containerPort": 8080}]},
                {"name": "side", "image": "busybox:1.36"},
            ]},
            "status": {"phase": "Running"},
        }),
    );
    server
}

/// `kubectl ARGS` with `stdin` written and closed: (exit code, stdout, stderr).
pub(crate) async fn kubectl(k: &Kubectl, args: &[&str], stdin: &str) -> (i32, String, String) {
    kubectl_env(k, args, stdin, &[]).await
}

/// kubectl's switches that turn its WebSocket use off: it speaks SPDY, its
/// fallback, from the start.
pub(crate) const SPDY_ONLY: &[(&str, &str)] = &[
    ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"),
    ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
];

/// kubectl with `args` and `env`, its three streams piped, killed when dropped.
fn spawn_kubectl(k: &Kubectl, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Child {
    let mut command = k.command(args);
    command.envs(env.iter().copied());
    tokio::process::Command::from(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl is installed")
}

/// [`kubectl`] with environment variables set.
pub(crate) async fn kubectl_env(
    k: &Kubectl,
    args: &[&str],
    stdin: &str,
    env: &[(&str, &str)],
) -> (i32, String, String) {
    let mut child = spawn_kubectl(k, args, env);
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not end"))
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl ARGS` left running, its output read line by line.
/// A running kubectl and its output, line by line.
type Running = (
    Child,
    Lines<BufReader<ChildStdout>>,
    Lines<BufReader<ChildStderr>>,
);

fn start(k: &Kubectl, args: &[&str]) -> Running {
    start_env(k, args, &[])
}

/// [`start`] with environment variables set.
fn start_env(k: &Kubectl, args: &[&str], env: &[(&str, &str)]) -> Running {
    let mut child = spawn_kubectl(k, args, env);
    let out = BufReader::new(child.stdout.take().unwrap()).lines();
    let err = BufReader::new(child.stderr.take().unwrap()).lines();
    (child, out, err)
}

/// The next line that contains `want`.
async fn line_with<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut Lines<R>, want: &str) -> String {
    loop {
        let line = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no line with {want:?} in time"))
            .unwrap()
            .unwrap_or_else(|| panic!("output ended before a line with {want:?}"));
        if line.contains(want) {
            return line;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_execs_commands_with_output_stdin_and_exit_codes() {
    let server = server().await;
    let k = Kubectl::new(&server);

    let (code, out, err) =
        kubectl(&k, &["exec", "web-1", "-c", "app", "--", "echo", "hi"], "").await;
    assert_eq!((code, out.as_str()), (0, "hi\n"), "{err}");

    // stdin reaches the process and its end ends `cat` (v5's close signal).
    let (code, out, err) = kubectl(
        &k,
        &["exec", "-i", "web-1", "-c", "app", "--", "cat"],
        "data\nmore\n",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "data\nmore\n"), "{err}");

    // A script's status is kubectl's exit code; its stderr is kubectl's.
    let (code, out, err) = kubectl(
        &k,
        &[
            "exec",
            "web-1",
            "-c",
            "app",
            "--",
            "sh",
            "-c",
            "echo \"$GREETING\" on $HOSTNAME; nope; exit 3",
        ],
        "",
    )
    .await;
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(out.starts_with("hello from app on"), "{out}");
    assert!(err.contains("sh: nope: not found"), "{err}");

    // The container is the one asked for; without one, kubectl picks the first.
    let (code, out, err) = kubectl(&k, &["exec", "web-1", "--", "env"], "").await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("GREETING=hello from app\n") && out.contains("HOSTNAME=web-1\n"),
        "{out}"
    );
    let (_, out, _) = kubectl(&k, &["exec", "web-1", "-c", "side", "--", "env"], "").await;
    assert!(!out.contains("GREETING"), "{out}");

    // A command that does not exist never starts: the kubelet's internal error.
    let (code, _, err) = kubectl(&k, &["exec", "web-1", "-c", "app", "--", "nope"], "").await;
    assert_eq!(code, 1);
    assert!(err.contains("executable file not found in $PATH"), "{err}");

    // Over WebSocket, as a `get` of pods/exec.
    let audit = server.sim().audit();
    let exec = audit
        .iter()
        .find(|a| a.path == "/api/v1/namespaces/default/pods/web-1/exec")
        .expect("the exec request");
    assert_eq!(exec.verb, "get");
    assert!(
        exec.query.contains("command=echo&command=hi"),
        "{}",
        exec.query
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_execs_and_attaches_over_its_spdy_fallback() {
    let server = server().await;
    let k = Kubectl::new(&server);
    let (code, out, err) = kubectl_env(
        &k,
        &[
            "exec",
            "-i",
            "web-1",
            "-c",
            "app",
            "--",
            "sh",
            "-c",
            "cat; nope; exit 5",
        ],
        "over spdy\n",
        SPDY_ONLY,
    )
    .await;
    assert_eq!((code, out.as_str()), (5, "over spdy\n"), "{err}");
    assert!(err.contains("sh: nope: not found"), "{err}");
    let (code, out, err) = kubectl_env(
        &k,
        &["exec", "web-1", "-c", "side", "--", "hostname"],
        "",
        SPDY_ONLY,
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "web-1\n"), "{err}");

    let (mut child, mut out, _err) =
        start_env(&k, &["attach", "-i", "web-1", "-c", "app"], SPDY_ONLY);
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"echo attached over spdy\nexit\n")
        .await
        .unwrap();
    assert_eq!(line_with(&mut out, "attached").await, "attached over spdy");
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());

    let verbs: Vec<String> = server
        .sim()
        .audit()
        .into_iter()
        .filter(|a| a.path.ends_with("/exec") || a.path.ends_with("/attach"))
        .map(|a| a.verb)
        .collect();
    assert_eq!(verbs, ["create", "create", "create"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forwards_bytes_both_ways() {
    port_forward(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forwards_over_its_spdy_fallback() {
    port_forward(SPDY_ONLY).await;
}

async fn port_forward(env: &[(&str, &str)]) {
    let server = server().await;
    let k = Kubectl::new(&server);
    let (mut child, mut out, _err) = start_env(&k, &["port-forward", "pod/web-1", ":8080"], env);
    // `Forwarding from 127.0.0.1:PORT -> 8080`
    let line = line_with(&mut out, "Forwarding from 127.0.0.1:").await;
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a port in {line:?}"));
    assert!(line.ends_with("-> 8080"), "{line}");

    // Two connections, one after the other, each echoed, and their ends.
    for payload in [
        &b"ping through the tunnel\n"[..],
        &[0u8, 255, 1, 254, 10][..],
    ] {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        conn.write_all(payload).await.unwrap();
        let mut back = vec![0u8; payload.len()];
        tokio::time::timeout(PATIENCE, conn.read_exact(&mut back))
            .await
            .expect("the echo in time")
            .unwrap();
        assert_eq!(back, payload);
        conn.shutdown().await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, conn.read_to_end(&mut rest))
            .await
            .expect("the end in time")
            .unwrap();
        assert!(rest.is_empty());
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "kubectl still forwards"
    );
    child.kill().await.unwrap();

    // A port nothing listens on: the kubelet's refusal reaches kubectl.
    let (mut child, mut out, mut err) = start_env(&k, &["port-forward", "web-1", ":9999"], env);
    let line = line_with(&mut out, "Forwarding from 127.0.0.1:").await;
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, conn.read_to_end(&mut rest))
        .await
        .expect("closed in time");
    assert!(rest.is_empty());
    line_with(&mut err, "connect: connection refused").await;
    let _ = child.kill().await;

    // The transport kubectl chose: a WebSocket `GET`, or SPDY's `POST`.
    let verbs: Vec<String> = server
        .sim()
        .audit()
        .into_iter()
        .filter(|a| a.path.ends_with("/portforward"))
        .map(|a| a.verb)
        .collect();
    let want = if env.is_empty() { "get" } else { "create" };
    assert_eq!(verbs, [want, want]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_follows_logs_as_lines_are_appended() {
    let server = server().await;
    let k = Kubectl::new(&server);
    server
        .sim()
        .container_log("default", "web-1", "app", "first line");
    server
        .sim()
        .container_log("default", "web-1", "app", "second line");

    let (code, out, err) = kubectl(&k, &["logs", "web-1", "-c", "app", "--tail", "1"], "").await;
    assert_eq!((code, out.as_str()), (0, "second line\n"), "{err}");

    let (mut child, mut out, _err) = start(&k, &["logs", "-f", "web-1", "-c", "app"]);
    line_with(&mut out, "first line").await;
    line_with(&mut out, "second line").await;
    // Printed: kubectl is following now; what is appended arrives as it is.
    server
        .sim()
        .container_log("default", "web-1", "app", "third line");
    assert_eq!(line_with(&mut out, "line").await, "third line");
    server
        .sim()
        .container_log("default", "web-1", "app", "fourth line");
    assert_eq!(line_with(&mut out, "line").await, "fourth line");
    // The container's process ends: so does `logs -f`, successfully.
    server.sim().end_container("default", "web-1", "app");
    assert!(
        tokio::time::timeout(PATIENCE, out.next_line())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());

    // Deleting the Pod ends a follower too.
    let (mut child, mut out, _err) = start(&k, &["logs", "-f", "web-1", "-c", "app"]);
    line_with(&mut out, "fourth line").await;
    server.delete("pods", "default", "web-1");
    assert!(
        tokio::time::timeout(PATIENCE, out.next_line())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
    assert!(
        tokio::time::timeout(PATIENCE, child.wait())
            .await
            .unwrap()
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_attaches_to_the_main_process() {
    let server = server().await;
    let k = Kubectl::new(&server);
    let (mut child, mut out, _err) = start(&k, &["attach", "-i", "web-1", "-c", "app"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"echo attached to $HOSTNAME\n")
        .await
        .unwrap();
    assert_eq!(line_with(&mut out, "attached").await, "attached to web-1");
    // Output of the container reaches attached clients as it is written.
    server
        .sim()
        .container_log("default", "web-1", "app", "from elsewhere");
    assert_eq!(line_with(&mut out, "elsewhere").await, "from elsewhere");
    // `exit` ends the main process, and with it the attach.
    stdin.write_all(b"exit 0\n").await.unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    // What it wrote is the container's log.
    let (code, out, err) = kubectl(&k, &["logs", "web-1", "-c", "app"], "").await;
    assert_eq!(
        (code, out.as_str()),
        (0, "attached to web-1\nfrom elsewhere\n"),
        "{err}"
    );
}

/// `kubectl exec -it` needs a terminal: `script` gives it one (a pty), as a
/// user's shell would. stdin is written through it, then closed.
async fn kubectl_in_terminal(k: &Kubectl, args: &[&str], input: &str) -> (i32, String) {
    let command = k.command(args);
    let quoted: Vec<String> = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', r"'\''")))
        .collect();
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &quoted.join(" "), "/dev/null"]);
    for (k, v) in command.get_envs() {
        if let Some(v) = v {
            script.env(k, v);
        }
    }
    let mut child = tokio::process::Command::from(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script (util-linux) is installed");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // The input waits in the terminal until kubectl reads it.
    stdin.write_all(input.as_bytes()).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(PATIENCE, out.read_to_string(&mut text))
        .await
        .expect("kubectl in a terminal ends")
        .unwrap();
    drop(stdin);
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .unwrap()
        .unwrap();
    (status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_execs_a_shell_in_a_terminal() {
    let server = server().await;
    let k = Kubectl::new(&server);
    // A TTY: kubectl asks for `tty=true` and sends the terminal's size on the
    // resize channel (4), which the session takes and ignores.
    let (code, out) = kubectl_in_terminal(
        &k,
        &["exec", "-it", "web-1", "-c", "app", "--", "sh"],
        "echo in a terminal\nnope\nexit 4\n",
    )
    .await;
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("in a terminal"), "{out}");
    assert!(out.contains("sh: nope: not found"), "{out}");
    let exec = server
        .sim()
        .audit()
        .into_iter()
        .find(|a| a.path.ends_with("/exec"))
        .expect("the exec request");
    assert!(exec.query.contains("tty=true"), "{}", exec.query);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_writes_a_started_containers_first_log_line() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let _controllers = server.sim().start_controllers();
    let k = Kubectl::new(&server);
    let deployment = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: api}
spec:
  replicas: 1
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      containers:
      - {name: app, image: "nginx:1.27"}
      - {name: broken, image: "busybox:crashloop"}
"#;
    let (code, _, err) = kubectl(&k, &["apply", "-f", "-"], deployment).await;
    assert_eq!(code, 0, "{err}");
    // A watch tells when the kubelet has started the Pod.
    let (code, _, err) = kubectl(
        &k,
        &[
            "wait",
            "--for=jsonpath={.status.phase}=Running",
            "pod",
            "-l",
            "app=api",
            "--timeout=30s",
        ],
        "",
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = kubectl(&k, &["logs", "deploy/api", "-c", "app"], "").await;
    assert_eq!(
        (code, out.as_str()),
        (0, "kube-sim: nginx:1.27 started\n"),
        "{err}"
    );
    let (_, out, _) = kubectl(&k, &["logs", "deploy/api", "-c", "broken"], "").await;
    assert_eq!(out, "kube-sim: busybox:crashloop exited with status 1\n");
}
