//! The Kubernetes test server checked with a real client: the installed `kubectl`
//! applies, gets (with label and field selectors) and watches through it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use podgate_agent::testing::kube::KubeTestServer;
use serde_json::{Value, json};

struct Kubectl {
    config: tempfile::NamedTempFile,
}

impl Kubectl {
    fn new(server: &KubeTestServer) -> Self {
        let config = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(config.path(), server.kubeconfig()).unwrap();
        Kubectl { config }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig").arg(self.config.path()).args(args);
        c.env("HOME", std::env::temp_dir()); // no discovery cache from elsewhere
        c
    }

    /// Run to completion; (success, stdout, stderr).
    fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut c = self.command(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("kubectl is installed");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  labels:
    app: web
    tier: front
spec:
  containers:
  - name: nginx
    image: nginx:1.27
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_and_watches_through_the_test_server() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let k = Kubectl::new(&server);

    // apply: created, then unchanged/configured on a second apply.
    let (ok, out, err) = tokio::task::block_in_place(|| k.run(&["apply", "-f", "-"], Some(POD)));
    assert!(ok, "apply: {out}\n{err}");
    assert!(out.contains("pod/web-1 created"), "{out}");
    let created = server.get("pods", "default", "web-1").expect("stored");
    assert_eq!(created["metadata"]["labels"]["app"], "web");
    assert!(
        created["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["apply", "-f", "-"],
            Some(&POD.replace("tier: front", "tier: back")),
        )
    });
    assert!(ok, "re-apply: {out}\n{err}");
    assert!(out.contains("pod/web-1 configured"), "{out}");
    assert_eq!(
        server.get("pods", "default", "web-1").unwrap()["metadata"]["labels"]["tier"],
        "back"
    );

    server.put("pods", "default", json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-1", "labels": {"app": "db"}}, "spec": {"containers": [{"name": "pg", "image": "postgres:16"}]}, "status": {"phase": "Running"}}));
    server.put("pods", "kube-system", json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dns", "labels": {"app": "dns"}}, "spec": {"containers": []}}));

    // get, as a table and as JSON, with selectors.
    let (ok, out, err) = tokio::task::block_in_place(|| k.run(&["get", "pods"], None));
    assert!(ok, "get: {err}");
    assert!(
        out.contains("web-1") && out.contains("db-1") && !out.contains("dns"),
        "{out}"
    );
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["get", "pods", "-l", "app in (web,cache)", "-o", "json"],
            None,
        )
    });
    assert!(ok, "get -l: {err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web-1"]);
    let (ok, out, _) = tokio::task::block_in_place(|| {
        k.run(
            &[
                "get",
                "pods",
                "-A",
                "--field-selector",
                "status.phase=Running",
                "-o",
                "name",
            ],
            None,
        )
    });
    assert!(ok);
    assert_eq!(out.trim(), "pod/db-1");
    let (ok, _, err) = tokio::task::block_in_place(|| k.run(&["get", "pod", "nope"], None));
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, out, _) =
        tokio::task::block_in_place(|| k.run(&["get", "namespaces", "-o", "name"], None));
    assert!(ok && out.contains("namespace/kube-system"), "{out}");

    // get -w: the initial state, then live changes as they happen.
    let mut watch = k
        .command(&[
            "get",
            "pods",
            "-w",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,NAME:.object.metadata.name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    // The initial list, in name order.
    seen.push(expect_line("ADDED db-1", &mut rx).await);
    seen.push(expect_line("ADDED web-1", &mut rx).await);
    server.put("pods", "default", json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cache-1", "labels": {"app": "cache"}}, "spec": {"containers": []}}));
    seen.push(expect_line("ADDED cache-1", &mut rx).await);
    let mut db = server.get("pods", "default", "db-1").unwrap();
    db["status"]["phase"] = json!("Succeeded");
    server.put("pods", "default", db);
    seen.push(expect_line("MODIFIED db-1", &mut rx).await);
    assert!(server.delete("pods", "default", "web-1"));
    seen.push(expect_line("DELETED web-1", &mut rx).await);
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(seen.len(), 5);

    // delete through kubectl.
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["delete", "pod", "cache-1", "--wait=false"], None));
    assert!(ok, "delete: {out}\n{err}");
    assert!(server.get("pods", "default", "cache-1").is_none());
}

/// Read `kubectl -w` lines until one reads `want` (columns joined by one space).
async fn expect_line(
    want: &str,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) -> Vec<String> {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("kubectl -w never printed {want:?}"))
            .expect("kubectl -w ended");
        let cols: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if cols.join(" ") == want {
            return cols;
        }
    }
}

/// Watch events read off a raw HTTP/1.1 stream (JSON lines inside chunked framing).
async fn watch_events(url: &str, path: &str, want: usize) -> Vec<Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: k\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let events: Vec<Value> = String::from_utf8_lossy(&buf)
            .lines()
            .filter(|l| l.starts_with('{'))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if events.len() >= want {
            return events;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("watch events in time")
            .unwrap();
        if n == 0 {
            return events;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_from_a_resource_version_and_expire_with_410() {
    // Keep only 4 events of history.
    let server = KubeTestServer::start(4).await.unwrap();
    let pod = |name: &str, app: &str| json!({"metadata": {"name": name, "labels": {"app": app}}, "spec": {}});
    let before = server.resource_version();
    for i in 0..3 {
        server.put("pods", "default", pod(&format!("p{i}"), "a"));
    }
    let mid = server.resource_version();
    server.put("pods", "default", pod("p3", "b"));
    server.put("pods", "default", pod("p4", "a"));

    // Resumed from `mid`: only what came after, filtered by label.
    let events = watch_events(
        &server.url(),
        &format!(
            "/api/v1/namespaces/default/pods?watch=true&resourceVersion={mid}&labelSelector=app%3Da"
        ),
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "p4");

    // From before the retained history: 410 Gone, as an ERROR event with a Status.
    let events = watch_events(
        &server.url(),
        &format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={before}"),
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");

    // Bookmarks when asked for, carrying the current resourceVersion.
    let now = server.resource_version();
    let events = watch_events(
        &server.url(),
        &format!("/api/v1/namespaces/default/pods?watch=true&resourceVersion={now}&allowWatchBookmarks=true"),
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "BOOKMARK");
    assert_eq!(
        events[0]["object"]["metadata"]["resourceVersion"],
        now.to_string()
    );

    // A stale replace is a 409 Conflict.
    let mut p = server.get("pods", "default", "p4").unwrap();
    p["metadata"]["resourceVersion"] = json!("1");
    let (status, body) = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(server.url().trim_start_matches("http://"))
            .await
            .unwrap();
        let b = p.to_string();
        s.write_all(format!("PUT /api/v1/namespaces/default/pods/p4 HTTP/1.1\r\nhost: k\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}", b.len()).as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let status: u16 = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, raw)
    };
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("\"reason\":\"Conflict\""), "{body}");
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.27
"#;

const WIDGET_BETA: &str = r#"
apiVersion: example.podgate.dev/v1beta1
kind: Widget
metadata:
  name: w1
spec:
  size: 3
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_api_groups_and_chooses_versions() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let k = Kubectl::new(&server);
    server.put("namespaces", "", json!({"metadata": {"name": "shop"}}));
    server.put(
        "replicasets.apps",
        "shop",
        json!({"metadata": {"name": "web-5d9f", "labels": {"app": "web"}}, "spec": {}}),
    );
    server.put(
        "statefulsets",
        "kube-system",
        json!({"metadata": {"name": "db"}, "spec": {}}),
    );
    server.put(
        "deployments",
        "kube-system",
        json!({"metadata": {"name": "coredns"}, "spec": {}}),
    );

    // get -w on deployments, then an apply through apps/v1 shows up in it.
    let mut watch = k
        .command(&[
            "get",
            "deploy",
            "-A",
            "-w",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,NAME:.object.metadata.name,API:.object.apiVersion",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // The watch is open once the initial list is out.
    expect_line("ADDED coredns apps/v1", &mut rx).await;
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["apply", "-f", "-"], Some(DEPLOYMENT)));
    assert!(ok, "apply: {out}\n{err}");
    assert!(out.contains("deployment.apps/web created"), "{out}");
    expect_line("ADDED web apps/v1", &mut rx).await;
    let stored = server.get("deployments.apps", "shop", "web").unwrap();
    assert_eq!(stored["apiVersion"], "apps/v1");
    assert_eq!(stored["spec"]["replicas"], 2);
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["apply", "-f", "-"],
            Some(&DEPLOYMENT.replace("replicas: 2", "replicas: 3")),
        )
    });
    assert!(ok, "re-apply: {out}\n{err}");
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    expect_line("MODIFIED web apps/v1", &mut rx).await;
    let _ = watch.kill();
    let _ = watch.wait();

    // Several kinds of two groups at once, across namespaces.
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["get", "deploy,rs,sts", "-A", "-o", "name"], None));
    assert!(ok, "get deploy,rs,sts: {err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "deployment.apps/coredns",
            "deployment.apps/web",
            "replicaset.apps/web-5d9f",
            "statefulset.apps/db"
        ]
    );
    let (ok, _, err) =
        tokio::task::block_in_place(|| k.run(&["get", "deploy", "-n", "shop", "nope"], None));
    assert!(
        !ok && err.contains("deployments.apps \"nope\" not found"),
        "{err}"
    );
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["delete", "deployment", "-n", "shop", "web", "--wait=false"],
            None,
        )
    });
    assert!(ok, "delete: {out}\n{err}");
    assert!(server.get("deployments", "shop", "web").is_none());

    // Discovery names every kind with its group.
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["api-resources", "-o", "name"], None));
    assert!(ok, "api-resources: {err}");
    for want in [
        "pods",
        "services",
        "persistentvolumeclaims",
        "serviceaccounts",
        "secrets",
        "cronjobs.batch",
        "jobs.batch",
        "ingresses.networking.k8s.io",
        "widgets.example.podgate.dev",
        "events",
        "events.events.k8s.io",
    ] {
        assert!(out.lines().any(|l| l == want), "{want} missing from\n{out}");
    }
    // Subresources are in discovery, but kubectl does not list them as resources.
    assert!(!out.contains('/'), "{out}");

    // A group in two versions: objects written in either are served in the one asked
    // for, the preferred (v1) by default.
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["apply", "-f", "-"], Some(WIDGET_BETA)));
    assert!(ok, "apply widget: {out}\n{err}");
    assert!(
        out.contains("widget.example.podgate.dev/w1 created"),
        "{out}"
    );
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["get", "widgets", "w1", "-o", "jsonpath={.apiVersion}"],
            None,
        )
    });
    assert!(ok, "get widget: {err}");
    assert_eq!(out, "example.podgate.dev/v1");
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &[
                "get",
                "widgets.v1beta1.example.podgate.dev",
                "w1",
                "-o",
                "jsonpath={.apiVersion} {.spec.size}",
            ],
            None,
        )
    });
    assert!(ok, "get widget v1beta1: {err}");
    assert_eq!(out, "example.podgate.dev/v1beta1 3");
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["get", "widgets.v1beta1.example.podgate.dev", "-o", "json"],
            None,
        )
    });
    assert!(ok, "list widgets v1beta1: {err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        list["items"][0]["apiVersion"],
        "example.podgate.dev/v1beta1"
    );
    assert_eq!(
        server.get("widgets", "default", "w1").unwrap()["apiVersion"],
        "example.podgate.dev/v1",
        "stored in the preferred version"
    );
    // Watches too serve the version asked for.
    for version in ["v1", "v1beta1"] {
        let events = watch_events(
            &server.url(),
            &format!("/apis/example.podgate.dev/{version}/namespaces/default/widgets?watch=true"),
            1,
        )
        .await;
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(
            events[0]["object"]["apiVersion"],
            format!("example.podgate.dev/{version}")
        );
    }
    // A version or group not served is no resource.
    let events = watch_events(
        &server.url(),
        "/apis/example.podgate.dev/v2/namespaces/default/widgets",
        1,
    )
    .await;
    assert_eq!(events[0]["code"], 404, "{events:?}");
}
