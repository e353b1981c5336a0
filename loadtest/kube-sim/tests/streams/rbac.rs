//! RBAC on Pods' streaming subresources, decided for the impersonated user with
//! kube-apiserver 1.32's verbs, through the installed kubectl.

use podgate_testkit::kube::Kubectl;

use super::{kubectl, server};

const RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: impersonator}
rules:
- {apiGroups: [""], resources: [users], verbs: [impersonate]}
- {nonResourceURLs: ["*"], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: anonymous-impersonates}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: impersonator}
subjects:
- {kind: Group, apiGroup: rbac.authorization.k8s.io, name: "system:unauthenticated"}
- {kind: Group, apiGroup: rbac.authorization.k8s.io, name: "system:authenticated"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: shell, namespace: default}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
- {apiGroups: [""], resources: [pods/exec, pods/log], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: default}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-shell, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: shell}
subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: spdy-shell, namespace: default}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
- {apiGroups: [""], resources: [pods/exec], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: carol-spdy-shell, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: spdy-shell}
subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: carol}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-reader, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: [{kind: User, apiGroup: rbac.authorization.k8s.io, name: bob}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_decides_each_subresource_for_the_impersonated_user() {
    let server = server().await;
    server.sim().load_seed(RBAC).unwrap();
    server
        .sim()
        .container_log("default", "web-1", "app", "a log line");
    server.sim().enforce_rbac(true);
    let k = Kubectl::new(&server);

    // alice may `get` pods/exec and pods/log: enough for kube-apiserver 1.32's
    // WebSocket exec.
    let (code, out, err) = kubectl(
        &k,
        &[
            "--as", "alice", "exec", "web-1", "-c", "app", "--", "echo", "hi",
        ],
        "",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hi\n"), "{err}");
    let (code, out, err) = kubectl(&k, &["--as", "alice", "logs", "web-1", "-c", "app"], "").await;
    assert_eq!((code, out.as_str()), (0, "a log line\n"), "{err}");

    // bob may read the Pod only: the WebSocket upgrade is forbidden, kubectl
    // falls back to SPDY, whose `create` is forbidden too.
    let (code, _, err) = kubectl(
        &k,
        &[
            "--as", "bob", "exec", "web-1", "-c", "app", "--", "echo", "hi",
        ],
        "",
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains(r#"User "bob" cannot create resource "pods/exec" in API group "" in the namespace "default""#),
        "{err}"
    );
    let verbs: Vec<(String, u16)> = server
        .sim()
        .audit()
        .into_iter()
        .filter(|a| a.path.ends_with("/pods/web-1/exec") && a.user.as_deref() == Some("bob"))
        .map(|a| (a.verb, a.code))
        .collect();
    assert_eq!(verbs, [("get".to_owned(), 403), ("create".to_owned(), 403)]);
    let (code, _, err) = kubectl(&k, &["--as", "bob", "logs", "web-1", "-c", "app"], "").await;
    assert_ne!(code, 0);
    assert!(err.contains(r#"cannot get resource "pods/log""#), "{err}");
    let (code, _, err) = kubectl(&k, &["--as", "bob", "port-forward", "web-1", ":8080"], "").await;
    assert_ne!(code, 0);
    assert!(
        err.contains(r#"cannot create resource "pods/portforward""#),
        "{err}"
    );

    // carol may `create` pods/exec only, as Roles written for SPDY say: the
    // WebSocket is refused, the SPDY fallback served.
    let (code, out, err) = kubectl(
        &k,
        &[
            "--as", "carol", "exec", "web-1", "-c", "app", "--", "echo", "hi",
        ],
        "",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hi\n"), "{err}");
    let verbs: Vec<(String, u16)> = server
        .sim()
        .audit()
        .into_iter()
        .filter(|a| a.path.ends_with("/pods/web-1/exec") && a.user.as_deref() == Some("carol"))
        .map(|a| (a.verb, a.code))
        .collect();
    assert_eq!(verbs, [("get".to_owned(), 403), ("create".to_owned(), 101)]);
}
