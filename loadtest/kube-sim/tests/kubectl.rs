//! The Kubernetes test server checked with a real client: the installed `kubectl`
//! applies, gets (with label and field selectors) and watches through it.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use podgate_testkit::kube::{KubeTestServer, Kubectl};
use serde_json::{Value, json};

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
    let (mut watch, mut rx) = spawn_lines(
        &k,
        &[
            "get",
            "pods",
            "-w",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,NAME:.object.metadata.name",
        ],
    );
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

/// `kubectl <args>` started, and the lines it prints, as they come.
fn spawn_lines(
    k: &Kubectl,
    args: &[&str],
) -> (
    std::process::Child,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let mut child = k
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
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
    let (mut watch, mut rx) = spawn_lines(
        &k,
        &[
            "get",
            "deploy",
            "-A",
            "-w",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,NAME:.object.metadata.name,API:.object.apiVersion",
        ],
    );
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

const KUSTOMIZATION: &str = r#"
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: podinfo
  namespace: default
spec:
  interval: 10m
  path: ./kustomize
  prune: true
  sourceRef:
    kind: GitRepository
    name: podinfo
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_is_forbidden_a_denied_resource_and_impersonates() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let k = Kubectl::new(&server);
    server.put(
        "deployments",
        "default",
        json!({"metadata": {"name": "web"}, "spec": {}}),
    );
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["get", "deploy", "-o", "name"], None));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "deployment.apps/web");

    server.sim().deny("apps", "deployments");
    let (ok, _, err) = tokio::task::block_in_place(|| k.run(&["get", "deployments"], None));
    assert!(!ok);
    assert_eq!(
        err.trim(),
        r#"Error from server (Forbidden): deployments.apps is forbidden: User "system:anonymous" cannot list resource "deployments" in API group "apps" in the namespace "default""#
    );
    let (ok, _, err) = tokio::task::block_in_place(|| k.run(&["get", "deploy", "-A"], None));
    assert!(!ok);
    assert!(
        err.contains(
            r#"cannot list resource "deployments" in API group "apps" at the cluster scope"#
        ),
        "{err}"
    );
    let (ok, _, err) = tokio::task::block_in_place(|| {
        k.run(
            &[
                "get",
                "deploy",
                "web",
                "--as",
                "gitlab:user:alice",
                "--as-group",
                "gitlab:user",
                "--as-group",
                "devs",
            ],
            None,
        )
    });
    assert!(!ok);
    assert_eq!(
        err.trim(),
        r#"Error from server (Forbidden): deployments.apps "web" is forbidden: User "gitlab:user:alice" cannot get resource "deployments" in API group "apps" in the namespace "default""#
    );
    let audit = server.sim().audit();
    let get = audit
        .iter()
        .rev()
        .find(|e| e.path == "/apis/apps/v1/namespaces/default/deployments/web")
        .expect("the get was audited");
    assert_eq!(get.verb, "get");
    assert_eq!(get.user.as_deref(), Some("gitlab:user:alice"));
    assert_eq!(get.groups, ["gitlab:user", "devs"]);
    // Other resources are still served.
    let (ok, _, err) = tokio::task::block_in_place(|| k.run(&["get", "pods", "--as", "bob"], None));
    assert!(ok, "{err}");
    assert!(
        server.sim().audit().iter().any(|e| e.verb == "list"
            && e.path == "/api/v1/namespaces/default/pods"
            && e.user.as_deref() == Some("bob")),
        "the list as bob was audited"
    );
    // `get -w` lists before it watches: the list is refused first.
    let (ok, _, err) = tokio::task::block_in_place(|| {
        k.run(&["get", "deploy", "-w", "--request-timeout", "5s"], None)
    });
    assert!(!ok);
    assert!(
        err.contains("Error from server (Forbidden): deployments.apps is forbidden"),
        "{err}"
    );
    server.sim().allow("apps", "deployments");
    let (ok, _, err) = tokio::task::block_in_place(|| k.run(&["get", "deployments"], None));
    assert!(ok, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_flux_kinds_and_crds_and_applies_a_kustomization() {
    let server = KubeTestServer::start(1000).await.unwrap();
    let k = Kubectl::new(&server);
    let generated = server.sim().generate(300, 4);
    assert_eq!(generated, 300);

    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["get", "crds", "-o", "name"], None));
    assert!(ok, "get crds: {err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "customresourcedefinition.apiextensions.k8s.io/gitrepositories.source.toolkit.fluxcd.io",
            "customresourcedefinition.apiextensions.k8s.io/helmreleases.helm.toolkit.fluxcd.io",
            "customresourcedefinition.apiextensions.k8s.io/helmrepositories.source.toolkit.fluxcd.io",
            "customresourcedefinition.apiextensions.k8s.io/kustomizations.kustomize.toolkit.fluxcd.io",
            "customresourcedefinition.apiextensions.k8s.io/ocirepositories.source.toolkit.fluxcd.io",
            "customresourcedefinition.apiextensions.k8s.io/widgets.example.podgate.dev",
        ]
    );
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &[
                "get",
                "crd",
                "kustomizations.kustomize.toolkit.fluxcd.io",
                "-o",
                "jsonpath={.spec.names.kind} {.spec.scope} {.spec.versions[0].name}",
            ],
            None,
        )
    });
    assert!(ok, "get crd: {err}");
    assert_eq!(out, "Kustomization Namespaced v1");

    // Every Flux kind, by short name, across namespaces.
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(&["get", "ks,hr,gitrepo,helmrepo", "-A", "-o", "json"], None)
    });
    assert!(ok, "get flux kinds: {err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let items = list["items"].as_array().unwrap();
    let kinds: std::collections::BTreeSet<(&str, &str)> = items
        .iter()
        .map(|i| {
            (
                i["apiVersion"].as_str().unwrap(),
                i["kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            ("helm.toolkit.fluxcd.io/v2", "HelmRelease"),
            ("kustomize.toolkit.fluxcd.io/v1", "Kustomization"),
            ("source.toolkit.fluxcd.io/v1", "GitRepository"),
            ("source.toolkit.fluxcd.io/v1", "HelmRepository"),
        ]
    );
    let apps = items
        .iter()
        .find(|i| i["kind"] == "Kustomization" && i["metadata"]["name"] == "apps")
        .unwrap();
    let entry = apps["status"]["inventory"]["entries"][0]["id"]
        .as_str()
        .unwrap();
    let ns = apps["metadata"]["namespace"].as_str().unwrap();
    assert!(entry.starts_with(&format!("{ns}_")), "{entry}");
    // An inventory entry names an object kubectl can get.
    let parts: Vec<&str> = entry.split('_').collect();
    let (name, group, kind_name) = (parts[1], parts[2], parts[3]);
    let resource = if group.is_empty() {
        kind_name.to_lowercase()
    } else {
        format!("{}.{group}", kind_name.to_lowercase())
    };
    let (ok, _, err) =
        tokio::task::block_in_place(|| k.run(&["get", &resource, "-n", ns, name], None));
    assert!(ok, "get {resource} {ns}/{name}: {err}");

    // Discovery names the Flux kinds in their groups.
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["api-resources", "-o", "name"], None));
    assert!(ok, "api-resources: {err}");
    for want in [
        "kustomizations.kustomize.toolkit.fluxcd.io",
        "helmreleases.helm.toolkit.fluxcd.io",
        "gitrepositories.source.toolkit.fluxcd.io",
        "helmrepositories.source.toolkit.fluxcd.io",
        "ocirepositories.source.toolkit.fluxcd.io",
        "customresourcedefinitions.apiextensions.k8s.io",
        "nodes",
        "persistentvolumes",
        "daemonsets.apps",
        "storageclasses.storage.k8s.io",
        "ingressclasses.networking.k8s.io",
        "priorityclasses.scheduling.k8s.io",
        "runtimeclasses.node.k8s.io",
    ] {
        assert!(out.lines().any(|l| l == want), "{want} missing from\n{out}");
    }

    // apply a Kustomization: created, then configured.
    let (ok, out, err) =
        tokio::task::block_in_place(|| k.run(&["apply", "-f", "-"], Some(KUSTOMIZATION)));
    assert!(ok, "apply: {out}\n{err}");
    assert!(
        out.contains("kustomization.kustomize.toolkit.fluxcd.io/podinfo created"),
        "{out}"
    );
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["apply", "-f", "-"],
            Some(&KUSTOMIZATION.replace("interval: 10m", "interval: 5m")),
        )
    });
    assert!(ok, "re-apply: {out}\n{err}");
    assert!(
        out.contains("kustomization.kustomize.toolkit.fluxcd.io/podinfo configured"),
        "{out}"
    );
    let stored = server.get("kustomizations", "default", "podinfo").unwrap();
    assert_eq!(stored["apiVersion"], "kustomize.toolkit.fluxcd.io/v1");
    assert_eq!(stored["spec"]["interval"], "5m");
    assert_eq!(stored["spec"]["sourceRef"]["name"], "podinfo");
    let (ok, out, err) = tokio::task::block_in_place(|| {
        k.run(
            &["get", "ks", "podinfo", "-o", "jsonpath={.spec.path}"],
            None,
        )
    });
    assert!(ok, "{err}");
    assert_eq!(out, "./kustomize");
}

/// `kubectl get --chunk-size` pages through lists with `limit` and `continue`: the
/// same objects as in one response, fetched in several list requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_gets_lists_in_chunks() {
    let server = KubeTestServer::start(1000).await.unwrap();
    server.sim().generate(600, 3);
    let kubectl = Kubectl::new(&server);
    let columns = "custom-columns=NS:.metadata.namespace,NAME:.metadata.name";
    let get = |args: &[&str]| {
        let mut all = vec!["get", "--no-headers", "-o", columns];
        all.extend_from_slice(args);
        let (ok, out, err) = kubectl.run(&all, None);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    };
    let lists_with_continue = |path: &str| {
        server
            .sim()
            .audit()
            .iter()
            .filter(|e| e.verb == "list" && e.path == path && e.query.contains("continue="))
            .count()
    };

    let whole = get(&["pods", "-A", "--chunk-size=0"]);
    let pods = whole.lines().count();
    assert!(pods > 50, "{pods} Pods generated");
    assert_eq!(lists_with_continue("/api/v1/pods"), 0);
    let chunked = get(&["pods", "-A", "--chunk-size=7"]);
    assert_eq!(chunked, whole);
    // The first page, then one request per further page of 7.
    assert_eq!(lists_with_continue("/api/v1/pods"), pods.div_ceil(7) - 1);
    let first = server
        .sim()
        .audit()
        .into_iter()
        .rfind(|e| e.verb == "list" && e.path == "/api/v1/pods" && e.query.contains("limit=7"))
        .expect("chunked list requests");
    assert!(first.query.contains("continue="), "{}", first.query);

    // Selectors apply before the limit: the same matching objects, in pages.
    let web = get(&["pods", "-A", "-l", "!app", "--chunk-size=0"]);
    assert!((1..pods).contains(&web.lines().count()), "{web}");
    assert_eq!(get(&["pods", "-A", "-l", "!app", "--chunk-size=3"]), web);
    // In one namespace, and for cluster-scoped kinds.
    let ns = whole.split_whitespace().next().unwrap().to_owned();
    let in_ns = get(&["pods", "-n", &ns, "--chunk-size=0"]);
    assert_eq!(get(&["pods", "-n", &ns, "--chunk-size=2"]), in_ns);
    assert_eq!(
        get(&["namespaces", "--chunk-size=2"]),
        get(&["namespaces", "--chunk-size=0"])
    );
    assert!(lists_with_continue("/api/v1/namespaces") > 0);
}
