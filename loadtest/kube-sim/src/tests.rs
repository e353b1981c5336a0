//! Tests of the [`KubeSim`](super::KubeSim) handle: seeding, reads and writes, denials, refusals and audit.

use serde_json::Value;

use super::*;

#[test]
fn seeds_load_and_bad_documents_are_named() {
    let sim = KubeSim::new(10);
    let n = sim
        .load_seed(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n---\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: apps, labels: {app: web}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: b}\n",
        )
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        sim.get("pods", "apps", "web").unwrap()["status"]["phase"],
        "Pending"
    );
    assert_eq!(
        sim.get("configmaps", "default", "cfg").unwrap()["data"]["a"],
        "b"
    );
    assert!(sim.get("namespaces", "", "apps").is_some());

    let e = sim
        .load_seed("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: d}\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("seed document 2:"), "{e}");
    assert!(e.contains("\"policy/v1\""), "{e}");
    let e = sim
        .load_seed("apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\n")
        .unwrap_err()
        .to_string();
    assert_eq!(e, "seed document 1 (Pod x/): metadata.name: Required value");
    let e = sim.load_seed("a: [\n").unwrap_err().to_string();
    assert!(e.starts_with("seed document 1: "), "{e}");
    let e = sim.load_seed("- 1\n").unwrap_err().to_string();
    assert_eq!(e, "seed document 1: not a mapping");
    let e = sim
        .load_seed("apiVersion: v1\nkind: Pod\nmetadata: {name: b}\n---\nkind: [\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("seed document 2: "), "{e}");
    assert!(sim.get("pods", "default", "b").is_some());
}

/// When the shutdown future resolves, `serve` returns and open watches end.
#[tokio::test]
async fn stopping_ends_open_watches() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sim = KubeSim::new(10);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn({
        let sim = sim.clone();
        async move {
            sim.serve(listener, async {
                let _ = stopped.await;
            })
            .await;
        }
    });
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /api/v1/namespaces?watch=true HTTP/1.1\r\nhost: k\r\n\r\n")
        .await
        .unwrap();
    // The synthetic ADDED events arrive: the watch is open.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&buf).contains("kube-system") {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "watch ended early");
        buf.extend_from_slice(&chunk[..n]);
    }
    stop.send(()).unwrap();
    server.await.unwrap();
    // The connection is closed, not left hanging.
    let closed = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the watch connection closed when the server stopped");
}

/// `sim` served on a free port until the task ends or is aborted: its address.
async fn serve(sim: &KubeSim) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sim = sim.clone();
    let server = tokio::spawn(async move { sim.serve(listener, std::future::pending()).await });
    (addr, server)
}

/// One HTTP/1.1 request to `addr`: (status, body).
async fn request(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: k\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap();
    (status, body)
}

/// Requests are served as the impersonated user, who the audit log and the
/// 403 of a denied resource name.
#[tokio::test]
async fn impersonated_requests_are_audited_and_denials_name_the_user() {
    let sim = KubeSim::new(10);
    let (addr, server) = serve(&sim).await;
    sim.put(
        "deployments",
        "default",
        json!({"metadata": {"name": "web"}, "spec": {}}),
    );

    let (code, _) = request(addr, "/apis/apps/v1/deployments", &[]).await;
    assert_eq!(code, 200);
    sim.deny("apps", "deployments");
    let (code, body) = request(addr, "/apis/apps/v1/deployments", &[]).await;
    assert_eq!(code, 403, "{body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        r#"deployments.apps is forbidden: User "system:anonymous" cannot list resource "deployments" in API group "apps" at the cluster scope"#
    );
    let as_alice = [
        ("Impersonate-User", "gitlab:user:alice"),
        ("Impersonate-Group", "gitlab:user"),
        ("Impersonate-Group", "gitlab:project_role:7:developer"),
        ("Impersonate-Extra-agent.gitlab.com%2Fid", "9"),
    ];
    let (code, body) = request(
        addr,
        "/apis/apps/v1/namespaces/default/deployments?watch=true",
        &as_alice,
    )
    .await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"User \"gitlab:user:alice\" cannot watch resource \"deployments\" in API group \"apps\" in the namespace \"default\""#),
        "{body}"
    );
    let (code, body) = request(
        addr,
        "/apis/apps/v1/namespaces/default/deployments/web",
        &[],
    )
    .await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"deployments.apps \"web\" is forbidden"#),
        "{body}"
    );
    // Other resources are served, to the impersonated user too.
    let (code, _) = request(addr, "/api/v1/namespaces/default/pods", &as_alice).await;
    assert_eq!(code, 200);
    // Groups without a user: refused, as kube-apiserver refuses them.
    let (code, body) = request(addr, "/api/v1/pods", &[("Impersonate-Group", "g")]).await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("without impersonating a user"), "{body}");
    sim.allow("apps", "deployments");
    let (code, _) = request(addr, "/apis/apps/v1/deployments", &as_alice).await;
    assert_eq!(code, 200);

    let audit = sim.audit();
    let seen: Vec<(&str, &str, Option<&str>)> = audit
        .iter()
        .map(|e| (e.verb.as_str(), e.path.as_str(), e.user.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            ("list", "/apis/apps/v1/deployments", None),
            ("list", "/apis/apps/v1/deployments", None),
            (
                "watch",
                "/apis/apps/v1/namespaces/default/deployments",
                Some("gitlab:user:alice")
            ),
            (
                "get",
                "/apis/apps/v1/namespaces/default/deployments/web",
                None
            ),
            (
                "list",
                "/api/v1/namespaces/default/pods",
                Some("gitlab:user:alice")
            ),
            ("get", "/api/v1/pods", None),
            (
                "list",
                "/apis/apps/v1/deployments",
                Some("gitlab:user:alice")
            ),
        ]
    );
    let last = audit.last().unwrap();
    assert_eq!(
        last.groups,
        ["gitlab:user", "gitlab:project_role:7:developer"]
    );
    assert_eq!(last.extra["agent.gitlab.com/id"], ["9"]);
    assert!(audit[0].groups.is_empty() && audit[0].extra.is_empty());

    // The log is bounded: the newest 1,000 are kept.
    for _ in 0..access::AUDIT_LIMIT {
        request(addr, "/version", &[]).await;
    }
    let audit = sim.audit();
    assert_eq!(audit.len(), access::AUDIT_LIMIT);
    assert!(
        audit
            .iter()
            .all(|e| e.path == "/version" && e.verb == "get")
    );
    server.abort();
}

#[test]
fn objects_lists_everything_with_its_kind() {
    let sim = KubeSim::new(10);
    sim.put("widgets", "default", json!({"apiVersion": "example.podgate.dev/v1beta1", "kind": "Widget", "metadata": {"name": "w"}}));
    sim.put("nodes", "", json!({"metadata": {"name": "worker-0"}}));
    let objects = sim.objects();
    let find = |resource: &str, name: &str| {
        objects
            .iter()
            .find(|o| o.resource == resource && o.name == name)
            .unwrap_or_else(|| panic!("{resource} {name}"))
    };
    let w = find("widgets", "w");
    assert_eq!(
        (w.group, w.version, w.namespaced),
        ("example.podgate.dev", "v1", true)
    );
    assert_eq!(w.namespace, "default");
    assert_eq!(
        w.value()["apiVersion"],
        "example.podgate.dev/v1",
        "stored in the preferred version"
    );
    assert!(w.json().contains("\"name\":\"w\""));
    let n = find("nodes", "worker-0");
    assert_eq!(
        (n.group, n.namespaced, n.namespace.as_str()),
        ("", false, "")
    );
    // The CustomResourceDefinitions of every custom kind.
    let crds: Vec<&str> = objects
        .iter()
        .filter(|o| o.resource == "customresourcedefinitions")
        .map(|o| o.name.as_str())
        .collect();
    assert_eq!(
        crds,
        [
            "gitrepositories.source.toolkit.fluxcd.io",
            "helmreleases.helm.toolkit.fluxcd.io",
            "helmrepositories.source.toolkit.fluxcd.io",
            "kustomizations.kustomize.toolkit.fluxcd.io",
            "ocirepositories.source.toolkit.fluxcd.io",
            "widgets.example.podgate.dev",
        ]
    );
    let crd = find("customresourcedefinitions", "widgets.example.podgate.dev").value();
    assert_eq!(crd["spec"]["versions"][1]["name"], "v1beta1");
    assert_eq!(crd["spec"]["versions"][1]["storage"], false);
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(objects.len(), 2 + 6 + 2);
}

/// With RBAC enforced: ServiceAccount tokens authenticate (an unknown one is
/// 401), bindings authorize (403 names the user), impersonation needs
/// `impersonate`, discovery stays open; turned off, everyone is served again.
#[tokio::test]
async fn enforced_rbac_authenticates_tokens_and_authorizes_by_bindings() {
    use base64::Engine as _;
    let sim = KubeSim::new(10);
    let (addr, _server) = serve(&sim).await;
    sim.put(
        "deployments",
        "default",
        json!({"metadata": {"name": "web"}, "spec": {}}),
    );
    let token = base64::engine::general_purpose::STANDARD.encode("sekrit");
    for (resource, ns, o) in [
        (
            "secrets",
            "default",
            json!({"metadata": {"name": "agentk-token", "annotations": {"kubernetes.io/service-account.name": "agentk"}},
                   "type": "kubernetes.io/service-account-token", "data": {"token": token}}),
        ),
        (
            "clusterroles",
            "",
            json!({"metadata": {"name": "read-deployments"},
                   "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch"]}]}),
        ),
        (
            "clusterrolebindings",
            "",
            json!({"metadata": {"name": "agentk-reads"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "read-deployments"},
                   "subjects": [{"kind": "ServiceAccount", "name": "agentk", "namespace": "default"}]}),
        ),
    ] {
        let v = sim.put(resource, ns, o);
        assert_ne!(v["kind"], "Status", "{v}");
    }
    sim.enforce_rbac(true);
    let deployments = "/apis/apps/v1/namespaces/default/deployments";
    let agentk = [("Authorization", "Bearer sekrit")];

    assert_eq!(request(addr, "/api", &[]).await.0, 200, "discovery is open");
    let (code, body) = request(addr, deployments, &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"User \"system:anonymous\" cannot list"#),
        "{body}"
    );
    let (code, _) = request(addr, deployments, &[("Authorization", "Bearer nope")]).await;
    assert_eq!(code, 401);
    assert_eq!(request(addr, deployments, &agentk).await.0, 200);
    assert_eq!(
        request(addr, &format!("{deployments}/web"), &agentk)
            .await
            .0,
        200
    );
    let (code, body) = request(addr, "/api/v1/namespaces/default/pods", &agentk).await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"User \"system:serviceaccount:default:agentk\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""#),
        "{body}"
    );

    // Impersonation: refused until agentk may impersonate, then served as the
    // impersonated user, who needs rights of its own.
    let as_alice = [
        ("Authorization", "Bearer sekrit"),
        ("Impersonate-User", "gitlab:user:alice"),
        ("Impersonate-Group", "gitlab:user"),
    ];
    let (code, body) = request(addr, deployments, &as_alice).await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"cannot impersonate resource \"users\""#),
        "{body}"
    );
    sim.put(
        "clusterroles",
        "",
        json!({"metadata": {"name": "impersonate"},
               "rules": [{"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]}]}),
    );
    sim.put(
        "clusterrolebindings",
        "",
        json!({"metadata": {"name": "agentk-impersonates"},
               "roleRef": {"kind": "ClusterRole", "name": "impersonate"},
               "subjects": [{"kind": "ServiceAccount", "name": "agentk", "namespace": "default"}]}),
    );
    let (code, body) = request(addr, deployments, &as_alice).await;
    assert_eq!(code, 403);
    assert!(
        body.contains(r#"User \"gitlab:user:alice\" cannot list"#),
        "{body}"
    );
    sim.put(
        "rolebindings",
        "default",
        json!({"metadata": {"name": "gitlab-users-read"},
               "roleRef": {"kind": "ClusterRole", "name": "read-deployments"},
               "subjects": [{"kind": "Group", "name": "gitlab:user"}]}),
    );
    assert_eq!(request(addr, deployments, &as_alice).await.0, 200);
    // The RoleBinding is namespaced: not at the cluster scope.
    assert_eq!(
        request(addr, "/apis/apps/v1/deployments", &as_alice)
            .await
            .0,
        403
    );

    sim.enforce_rbac(false);
    assert_eq!(request(addr, deployments, &[]).await.0, 200);
}
