//! podgate's proxy with path rules, asking `podgate topology-service`: a request
//! whose path names a claimed namespace or organization reaches the Pod whose
//! `cell_address` is the owning Cell's, before any token or cookie rule; Rails'
//! own paths and unclaimed ones go on to the token rules, the session cookie, the
//! default Pod. The Pod sees `X-GitLab-HTTP-Router-Rule-Action` / `-Type` as
//! GitLab's HTTP Router sets them. With the Topology Service gone no request
//! fails (a known owner keeps routing, past its cache time too), and when it is
//! back, routing by claims resumes without a restart.

use std::time::Duration;

use podgate_registry::testing::{eventually, free_port};
use podgate_topology_service::proto::gitlab::cells::topology_service::claims::v1::bucket::Type;

use crate::common::{Stub, send, start_proxy};

pub(super) fn pods(stubs: &[&Stub]) -> String {
    let address = [
        "cell-1.example.com:443",
        "cell-2.example.com:443",
        "cell-3.example.com",
    ];
    crate::common::topology(
        &stubs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                crate::common::pod_entry(
                    i as u64 + 1,
                    &[s.addr.to_string()],
                    &format!("cell_address = \"{}\"", address[i]),
                )
            })
            .collect::<Vec<_>>(),
    )
}

/// Pods 1 to 3, answering with their id.
pub(super) async fn three_pods() -> [Stub; 3] {
    [
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    ]
}

/// The Pod that answered a GET of `path` (with `extra` header lines), and the
/// router headers it saw.
async fn get(port: u16, path: &str, extra: &str, stubs: &[&Stub]) -> (u64, String, String) {
    let (status, _, body) = send(port, &format!("GET {path} HTTP/1.1{extra}"), b"").await;
    assert_eq!(status, 200, "{path}: {body}");
    let pod: serde_json::Value = serde_json::from_str(&body).unwrap();
    let pod = pod["pod"].as_u64().unwrap();
    let seen = stubs[pod as usize - 1].seen();
    let last = seen.iter().rev().find(|s| s.path == path).unwrap();
    let h = |n: &str| last.headers.get(n).cloned().unwrap_or_default();
    (
        pod,
        h("x-gitlab-http-router-rule-action"),
        h("x-gitlab-http-router-rule-type"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_reach_the_pod_that_claimed_their_namespace() {
    let ts = super::start();
    super::claim(
        &ts,
        2,
        &[
            (Type::Routes, "gitlab-org"),
            (Type::RedirectRoutes, "old-org"),
        ],
    )
    .await;
    super::claim(&ts, 3, &[(Type::OrganizationPath, "acme")]).await;
    let pods3 = three_pods().await;
    let stubs = [&pods3[0], &pods3[1], &pods3[2]];
    // The service by a DNS name, as a deployment names it.
    let config = format!(
        "[topology_service]\naddress = \"localhost:{}\"\n{}",
        ts.addr.port(),
        pods(&stubs)
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let p = proxy.port;
    let route = |pod| (pod, "classify".to_owned(), "route".to_owned());
    for (path, want) in [
        // Rails' route snapshot's shapes: example, dotted, `.json`.
        ("/gitlab-org/gitlab", route(2)),
        ("/gitlab-org/gitlab.json", route(2)),
        ("/gitlab-org/gitlab/-/issues/1", route(2)),
        ("/Gitlab-Org/gitlab", route(2)),
        ("/gitlab-org.atom", route(2)),
        (
            "/gitlab-org/gitlab.git/info/refs?service=git-upload-pack",
            route(2),
        ),
        // A redirect route follows its namespace.
        ("/old-org/project", route(2)),
        (
            "/o/acme/groups/x/-/boards/1",
            (3, "classify".into(), "organizationPath".into()),
        ),
        // Unclaimed, and Rails' own: the rules after, here the default Pod.
        ("/john.doe/bar", (1, "proxy".into(), String::new())),
        ("/users/sign_in", (1, "proxy".into(), String::new())),
        (
            "/api/v4/projects/gitlab-org%2Fgitlab",
            (1, "proxy".into(), String::new()),
        ),
        ("/-/health", (1, "proxy".into(), String::new())),
    ] {
        assert_eq!(get(p, path, "", &stubs).await, want, "{path}");
    }
    // The session cookie decides for a path no claim places; a claim beats it.
    let cookie = "\r\ncookie: _gitlab_session=cell-3-abcdef";
    assert_eq!(
        get(p, "/dashboard/projects", cookie, &stubs).await,
        (3, "classify".into(), "SESSION_PREFIX".into())
    );
    assert_eq!(get(p, "/gitlab-org/x", cookie, &stubs).await, route(2));
    // `force-cell` first (GitLab's HTTP Router's `session_prefix` rules), and the
    // session cookie under its development name.
    let session = (3, "classify".to_owned(), "SESSION_PREFIX".to_owned());
    let forced = "\r\ncookie: _gitlab_session=cell-2-abcdef; force-cell=cell-3";
    assert_eq!(get(p, "/dashboard/groups", forced, &stubs).await, session);
    assert_eq!(get(p, "/gitlab-org/y", forced, &stubs).await, route(2));
    let dev = "\r\ncookie: _gitlab_session_9f86d081=cell-3-abcdef";
    assert_eq!(get(p, "/dashboard/todos", dev, &stubs).await, session);
    // A client's own router headers never reach the Pod.
    assert_eq!(
        get(
            p,
            "/unclaimed/x",
            "\r\nx-gitlab-http-router-rule-type: route",
            &stubs
        )
        .await,
        (1, "proxy".into(), String::new())
    );
}

/// The Topology Service stopped under traffic: claims already known keep routing
/// from the cache, the rest fall through to the rules after (here the default Pod)
/// within the deadline, and nothing fails; when it is back, new claims route again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_service_outage_fails_no_request_and_routing_resumes() {
    let port = free_port();
    let ts = super::start_on(port);
    super::claim(&ts, 2, &[(Type::Routes, "gitlab-org")]).await;
    let pods3 = three_pods().await;
    let stubs = [&pods3[0], &pods3[1], &pods3[2]];
    let config = format!(
        "[topology_service]\naddress = \"{}\"\ndeadline_ms = 200\nretry_after_ms = 100\ncache_ttl_secs = 1\n{}",
        ts.addr,
        pods(&stubs)
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let p = proxy.port;
    assert_eq!(get(p, "/gitlab-org/a", "", &stubs).await.0, 2);

    drop(ts);
    for i in 0..20 {
        assert_eq!(
            get(p, "/gitlab-org/a", "", &stubs).await.0,
            2,
            "cached owner"
        );
        assert_eq!(
            get(p, &format!("/fresh-{i}/x"), "", &stubs).await.0,
            1,
            "falls through"
        );
    }
    // Past its cache time (1 s), the owner still routes while no answer comes.
    eventually(Duration::from_secs(10), "an expired owner kept", || async {
        assert_eq!(
            get(p, "/gitlab-org/a", "", &stubs).await.0,
            2,
            "stale owner"
        );
        let metrics = crate::common::admin_get(&proxy, "/metrics").await.1;
        metrics
            .contains("podgate_proxy_classify_cache_total{event=\"stale\"}")
            .then_some(())
    })
    .await;
    // And for every request after: the stale owner stays in the cache while the
    // service gives no answer.
    for _ in 0..20 {
        assert_eq!(
            get(p, "/gitlab-org/b", "", &stubs).await.0,
            2,
            "stale owner"
        );
    }

    let ts = super::start_on(port);
    super::claim(&ts, 3, &[(Type::Routes, "newcomer")]).await;
    eventually(
        Duration::from_secs(10),
        "routing by claims to resume",
        || async { (get(p, "/newcomer/x", "", &stubs).await.0 == 3).then_some(()) },
    )
    .await;
    let metrics = crate::common::admin_get(&proxy, "/metrics").await.1;
    for line in [
        "podgate_proxy_path_rules_total{outcome=\"unavailable\"}",
        "podgate_proxy_path_rules_total{outcome=\"claimed\"}",
        "podgate_proxy_classify_cache_total{event=\"hit\"}",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}
