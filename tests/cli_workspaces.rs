//! `podgate workspaces` as a process against a real Pod simulator (in this process,
//! on an ephemeral port): create, list, stop, restart, start, terminate, the
//! table, GitLab's messages with exit code 1, usage errors with 2, and `list
//! --watch` printing the table again when a workspace changes.

use std::net::SocketAddr;
use std::process::{Output, Stdio};
use std::time::Duration;

use podgate_loadtest::pod_sim::{PodSim, PodSimConfig};
use podgate_tokens::PodId;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

/// The longest any one command may take.
const LIMIT: Duration = Duration::from_secs(60);

/// A Pod simulator whose agent 1 has workspaces enabled.
async fn sim() -> PodSim {
    let config = PodSimConfig::new(PodId::new(1).unwrap(), "127.0.0.1:0".parse().unwrap());
    let sim = PodSim::start(config).await.unwrap();
    add_agent(sim.addr(), 1).await;
    let (status, body) = call(
        sim.addr(),
        "PUT",
        "/-/podsim/agents/1/workspaces_config",
        Some(json!({"enabled": true, "dns_zone": "workspaces.example.dev"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    sim
}

/// Add agent `id` through the simulator's control API.
async fn add_agent(addr: SocketAddr, id: u64) {
    let (status, body) = call(addr, "POST", "/-/podsim/agents", Some(json!({"id": id}))).await;
    assert_eq!(status, 201, "{body}");
}

/// Workspace `id` as the simulator's control API shows it: status and JSON body.
async fn workspace_view(addr: SocketAddr, id: &str) -> (u16, Value) {
    call(addr, "GET", &format!("/-/podsim/workspaces/{id}"), None).await
}

/// One JSON request to the simulator's control API: status and JSON body.
async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: pod\r\nconnection: close\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn podgate(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podgate"));
    cmd.arg("workspaces")
        .args(args)
        .env_remove("PODGATE_GITLAB")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// `podgate workspaces --gitlab URL ARGS…`.
async fn ws(url: &str, args: &[&str]) -> Output {
    run(&[&["--gitlab", url][..], args].concat()).await
}

async fn run(args: &[&str]) -> Output {
    tokio::time::timeout(LIMIT, podgate(args).output())
        .await
        .expect("podgate workspaces ended")
        .expect("podgate runs")
}

/// [`ws`] that must succeed: its stdout.
async fn ws_ok(url: &str, args: &[&str]) -> String {
    check(&ws(url, args).await, 0).0
}

/// stdout and stderr, after checking the exit code.
fn check(out: &Output, code: i32) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// The table's rows (header dropped) as whitespace-split cells.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines();
    let header = lines.next().expect("a header");
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["ID", "NAME", "DESIRED", "ACTUAL", "URL"]
    );
    lines
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_list_stop_restart_terminate() {
    let sim = sim().await;
    let url = format!("http://{}", sim.addr());

    let stdout = ws_ok(
        &url,
        &["create", "--agent", "1", "--user", "1", "--port", "3000"],
    )
    .await;
    let created = rows(&stdout);
    assert_eq!(created.len(), 1, "{stdout}");
    let row = &created[0];
    let (id, name) = (row[0].clone(), row[1].clone());
    assert!(name.starts_with("workspace-1-1-"), "{stdout}");
    assert_eq!(row[2..4], ["Running", "CreationRequested"], "{stdout}");
    assert!(
        row[4].starts_with(&format!("https://60001-{name}.workspaces.example.dev/")),
        "{stdout}"
    );
    // The simulator has it, with the port.
    let (status, view) = workspace_view(sim.addr(), &id).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["name"], name.as_str());

    // A second one, then the list holds both in id order.
    let (status, user) = call(
        sim.addr(),
        "POST",
        "/-/podsim/users",
        Some(json!({"username": "dev", "role": "developer"})),
    )
    .await;
    assert_eq!(status, 201, "{user}");
    let user = user["id"].to_string();
    let stdout = ws_ok(
        &url,
        &[
            "create",
            "--agent",
            "1",
            "--user",
            &user,
            "--image",
            "busybox:1",
        ],
    )
    .await;
    let second = rows(&stdout)[0].clone();
    let stdout = ws_ok(&url, &["list"]).await;
    let listed = rows(&stdout);
    assert_eq!(listed.len(), 2, "{stdout}");
    assert_eq!(listed[0][..2], [id.clone(), name.clone()]);
    assert_eq!(listed[1][..2], second[..2]);

    for (cmd, desired) in [
        ("stop", "Stopped"),
        ("restart", "RestartRequested"),
        ("start", "Running"),
        ("terminate", "Terminated"),
    ] {
        let stdout = ws_ok(&url, &[cmd, id.as_str()]).await;
        let r = rows(&stdout);
        assert_eq!(r.len(), 1, "{cmd}: {stdout}");
        assert_eq!(
            r[0][..3],
            [id.clone(), name.clone(), desired.to_owned()],
            "{cmd}"
        );
        let (_, view) = workspace_view(sim.addr(), &id).await;
        assert_eq!(view["desired_state"], desired, "{cmd}");
    }

    // Terminated is final: GitLab's message, exit 1, nothing on stdout.
    let out = ws(&url, &["stop", id.as_str()]).await;
    let (stdout, stderr) = check(&out, 1);
    assert_eq!(stdout, "");
    assert!(stderr.starts_with("podgate workspaces: "), "{stderr}");
    assert!(
        stderr.contains("is 'Terminated', and cannot be updated. Create a new workspace instead."),
        "{stderr}"
    );
    let (_, view) = workspace_view(sim.addr(), &id).await;
    assert_eq!(view["desired_state"], "Terminated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_exit_1_with_gitlabs_message() {
    let sim = sim().await;
    let url = format!("http://{}", sim.addr());

    // An agent without an enabled workspaces configuration: 400 and its message.
    add_agent(sim.addr(), 2).await;
    let out = ws(&url, &["create", "--agent", "2", "--user", "1"]).await;
    let (stdout, stderr) = check(&out, 1);
    assert_eq!(stdout, "");
    let (status, body) = call(
        sim.addr(),
        "POST",
        "/-/podsim/workspaces",
        Some(json!({"agent_id": 2, "user_id": 1})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let message = body["message"].as_str().expect("a message");
    assert_eq!(
        stderr,
        format!("podgate workspaces: {message} (HTTP 400 Bad Request)\n")
    );

    // No such agent.
    let out = ws(&url, &["create", "--agent", "9", "--user", "1"]).await;
    let (_, stderr) = check(&out, 1);
    assert_eq!(
        stderr,
        "podgate workspaces: 404 Agent Not Found (HTTP 404 Not Found)\n"
    );

    // No such workspace.
    let out = ws(&url, &["stop", "999"]).await;
    let (_, stderr) = check(&out, 1);
    assert!(stderr.starts_with("podgate workspaces: "), "{stderr}");
    assert!(
        stderr.trim_end().ends_with("(HTTP 404 Not Found)"),
        "{stderr}"
    );

    // Nothing listening.
    let gone = format!(
        "http://127.0.0.1:{}",
        podgate_registry::testing::free_port()
    );
    let out = run(&["--gitlab", gone.as_str(), "list"]).await;
    let (_, stderr) = check(&out, 1);
    assert!(
        stderr.starts_with(&format!(
            "podgate workspaces: GET {gone}/-/podsim/workspaces: "
        )),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2() {
    for args in [
        &["list"][..],
        &["--gitlab", "http://127.0.0.1:1"],
        &["--gitlab", "https://127.0.0.1:1", "list"],
        &["--gitlab", "127.0.0.1:1", "list"],
        &["--gitlab", "http://127.0.0.1:1", "stop"],
        &["--gitlab", "http://127.0.0.1:1", "stop", "one"],
        &["--gitlab", "http://127.0.0.1:1", "create", "--agent", "1"],
        &[
            "--gitlab",
            "http://127.0.0.1:1",
            "create",
            "--agent",
            "1",
            "--user",
            "1",
            "--env",
            "X",
        ],
        &["--gitlab", "http://127.0.0.1:1", "list", "--interval", "0s"],
        &["--gitlab", "http://127.0.0.1:1", "resize", "1"],
    ] {
        let out = run(args).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.is_empty(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_watch_prints_again_on_change() {
    let sim = sim().await;
    let url = format!("http://{}", sim.addr());
    let (status, view) = call(
        sim.addr(),
        "POST",
        "/-/podsim/workspaces",
        Some(json!({"agent_id": 1, "user_id": 1})),
    )
    .await;
    assert_eq!(status, 201, "{view}");
    let id = view["id"].as_u64().unwrap();

    let mut child = podgate(&["--gitlab", &url, "list", "--watch", "--interval", "50ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(LIMIT, lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("stdout open")
    };
    assert!(next().await.starts_with("ID"));
    let first = next().await;
    assert_eq!(first.split_whitespace().nth(2), Some("Running"), "{first}");

    let (status, view) = call(
        sim.addr(),
        "PATCH",
        &format!("/-/podsim/workspaces/{id}"),
        Some(json!({"desired_state": "Stopped"})),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    // A blank line, then the table again, with the change.
    assert_eq!(next().await, "");
    assert!(next().await.starts_with("ID"));
    let second = next().await;
    assert_eq!(
        second.split_whitespace().nth(2),
        Some("Stopped"),
        "{second}"
    );

    // SIGTERM ends it cleanly.
    crate::common::process::terminate(child.id().unwrap());
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
