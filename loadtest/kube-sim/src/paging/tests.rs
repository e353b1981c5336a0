//! Tests of paged lists: pages, continue tokens, snapshots and their expiry.

use super::*;
use crate::KubeSim;
use crate::resources::kind;

/// A cluster with `n` Pods in each of the namespaces `a`, `b`, `c` (`p00`, `p01`,
/// …; the even ones labelled `tier=web`), and a ConfigMap in each.
fn cluster(n: usize) -> KubeSim {
    let sim = KubeSim::new(1000);
    for ns in ["a", "b", "c"] {
        sim.put("namespaces", "", json!({"metadata": {"name": ns}}));
        sim.put("configmaps", ns, json!({"metadata": {"name": "cfg"}}));
        for i in 0..n {
            let tier = if i % 2 == 0 { "web" } else { "db" };
            sim.put(
                "pods",
                ns,
                json!({"metadata": {"name": format!("p{i:02}"), "labels": {"tier": tier}}}),
            );
        }
    }
    sim
}

fn q(params: &[(&str, &str)]) -> BTreeMap<String, String> {
    params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// One list request for `resource` (`namespace` `None`: all namespaces).
fn list(
    sim: &KubeSim,
    resource: &str,
    namespace: Option<&str>,
    params: &[(&str, &str)],
) -> Result<Value, ListError> {
    let k = kind(resource).expect("served");
    let text = sim.shared.list(k, k.versions[0], namespace, &q(params))?;
    Ok(serde_json::from_str(&text).expect("a JSON list"))
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            let m = &o["metadata"];
            match m["namespace"].as_str() {
                Some(ns) => format!("{ns}/{}", m["name"].as_str().unwrap()),
                None => m["name"].as_str().unwrap().to_owned(),
            }
        })
        .collect()
}

/// Every page of a list of `limit`: (pages, all names in order).
fn all_pages(
    sim: &KubeSim,
    resource: &str,
    namespace: Option<&str>,
    params: &[(&str, &str)],
    limit: usize,
) -> (Vec<Value>, Vec<String>) {
    let limit = limit.to_string();
    let mut out = Vec::new();
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let mut p = params.to_vec();
        p.push(("limit", &limit));
        if !token.is_empty() {
            p.push(("continue", &token));
        }
        let page = list(sim, resource, namespace, &p).expect("a page");
        all.extend(names(&page));
        token = page["metadata"]["continue"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        out.push(page);
        if token.is_empty() {
            return (out, all);
        }
        assert!(out.len() < 1000, "the pages never end");
    }
}

#[test]
fn pages_cover_the_whole_list_in_order() {
    let sim = cluster(7);
    for (resource, namespace, limit) in [
        ("pods", None, 5),
        ("pods", None, 1),
        ("pods", None, 21),
        ("pods", Some("b"), 3),
        ("namespaces", None, 2),
        ("configmaps", None, 2),
    ] {
        let whole = list(&sim, resource, namespace, &[]).unwrap();
        let want = names(&whole);
        assert!(whole["metadata"].get("continue").is_none());
        let (pages, got) = all_pages(&sim, resource, namespace, &[], limit);
        assert_eq!(got, want, "{resource} {namespace:?} by {limit}");
        assert_eq!(pages.len(), want.len().div_ceil(limit));
        let mut left = want.len();
        for (i, p) in pages.iter().enumerate() {
            let n = p["items"].as_array().unwrap().len();
            left -= n;
            assert_eq!(
                p["metadata"]["resourceVersion"],
                whole["metadata"]["resourceVersion"]
            );
            if i + 1 < pages.len() {
                assert_eq!(n, limit);
                assert_eq!(p["metadata"]["remainingItemCount"], left, "page {i}");
                assert!(p["metadata"]["continue"].is_string());
            } else {
                // The last page: neither a token nor a count.
                assert_eq!(left, 0);
                assert_eq!(
                    p["metadata"],
                    json!({"resourceVersion": whole["metadata"]["resourceVersion"]})
                );
            }
        }
    }
    assert_eq!(
        all_pages(&sim, "pods", None, &[], 5).1[..6],
        ["a/p00", "a/p01", "a/p02", "a/p03", "a/p04", "a/p05"]
    );
    // limit=0 (or none) is the whole list; a limit past the end is one page.
    let whole = list(&sim, "pods", None, &[("limit", "0")]).unwrap();
    assert_eq!(names(&whole).len(), 21);
    assert!(whole["metadata"].get("continue").is_none());
    let kept = sim.shared.pages.len();
    let one = list(&sim, "pods", None, &[("limit", "500")]).unwrap();
    assert_eq!(names(&one), names(&whole));
    assert!(one["metadata"].get("remainingItemCount").is_none());
    assert_eq!(
        sim.shared.pages.len(),
        kept,
        "no snapshot for a single page"
    );
    let (code, _) = list(&sim, "pods", None, &[("limit", "x")]).unwrap_err();
    assert_eq!(code, StatusCode::BAD_REQUEST);
}

#[test]
fn selectors_apply_before_the_limit_and_hide_the_count() {
    let sim = cluster(7);
    let sel = [("labelSelector", "tier=web")];
    let want = names(&list(&sim, "pods", None, &sel).unwrap());
    assert_eq!(want.len(), 12);
    let (pages, got) = all_pages(&sim, "pods", None, &sel, 5);
    assert_eq!(got, want);
    // Pages are full of matching objects: 5, 5, 2.
    let sizes: Vec<usize> = pages
        .iter()
        .map(|p| p["items"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [5, 5, 2]);
    assert!(pages[0]["metadata"]["continue"].is_string());
    assert!(
        pages[0]["metadata"].get("remainingItemCount").is_none(),
        "the apiserver gives no count with a selector"
    );
    let fields = [("fieldSelector", "metadata.name!=p03")];
    let (_, got) = all_pages(&sim, "pods", Some("c"), &fields, 2);
    assert_eq!(got.len(), 6);
    assert!(!got.contains(&"c/p03".to_owned()));
    assert!(got.iter().all(|n| n.starts_with("c/")));
}

/// Every page reflects the store at the first page's resourceVersion.
#[test]
fn later_pages_show_the_list_as_of_the_first() {
    let sim = cluster(4);
    let first = list(&sim, "pods", None, &[("limit", "3")]).unwrap();
    let rv = first["metadata"]["resourceVersion"].clone();
    assert_eq!(names(&first), ["a/p00", "a/p01", "a/p02"]);
    // After the first page: b/p01 relabelled, c/p02 deleted, a/p99 and b/p00x
    // created (both sort after the first page).
    let mut p = sim.get("pods", "b", "p01").unwrap();
    p["metadata"]["labels"]["tier"] = json!("changed");
    sim.put("pods", "b", p);
    assert!(sim.delete("pods", "c", "p02"));
    sim.put("pods", "a", json!({"metadata": {"name": "p99"}}));
    sim.put("pods", "b", json!({"metadata": {"name": "p00x"}}));

    let mut token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    let mut rest = Vec::new();
    let mut b_p01 = Value::Null;
    while !token.is_empty() {
        let page = list(&sim, "pods", None, &[("limit", "3"), ("continue", &token)]).unwrap();
        assert_eq!(page["metadata"]["resourceVersion"], rv);
        for o in page["items"].as_array().unwrap() {
            if o["metadata"]["namespace"] == "b" && o["metadata"]["name"] == "p01" {
                b_p01 = o.clone();
            }
        }
        rest.extend(names(&page));
        token = page["metadata"]["continue"]
            .as_str()
            .unwrap_or("")
            .to_owned();
    }
    assert_eq!(
        rest,
        [
            "a/p03", "b/p00", "b/p01", "b/p02", "b/p03", "c/p00", "c/p01", "c/p02", "c/p03"
        ]
    );
    assert_eq!(b_p01["metadata"]["labels"]["tier"], "db", "as it was");
    // A new list sees the changes.
    let now = names(&list(&sim, "pods", None, &[]).unwrap());
    assert!(now.contains(&"a/p99".to_owned()) && now.contains(&"b/p00x".to_owned()));
    assert!(!now.contains(&"c/p02".to_owned()));
    // A token can be used again (a client retrying a page).
    let again = list(
        &sim,
        "pods",
        None,
        &[
            ("limit", "3"),
            ("continue", first["metadata"]["continue"].as_str().unwrap()),
        ],
    )
    .unwrap();
    assert_eq!(names(&again), ["a/p03", "b/p00", "b/p01"]);
}

#[test]
fn bad_tokens_are_bad_requests() {
    let sim = cluster(3);
    let first = list(&sim, "pods", None, &[("limit", "2")]).unwrap();
    let token = first["metadata"]["continue"].as_str().unwrap();
    // The apiserver's format: base64url JSON naming the revision and the key after
    // the last item.
    let decoded: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token).unwrap()).unwrap();
    assert_eq!(
        decoded,
        json!({"v": "meta.k8s.io/v1", "rv": first["metadata"]["resourceVersion"].as_str().unwrap().parse::<i64>().unwrap(), "start": "a/p01\u{0}"})
    );
    for (bad, why) in [
        ("not*base64", "continue key is not valid: "),
        (
            &URL_SAFE_NO_PAD.encode(b"[1]"),
            "continue key is not valid: ",
        ),
        (
            &URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v2","rv":5,"start":"a"}"#),
            "server does not recognize this encoded version meta.k8s.io/v2",
        ),
        (
            &URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":0,"start":"a"}"#),
            "incorrect encoded start resourceVersion",
        ),
        (
            &URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":5,"start":""}"#),
            "encoded start key empty",
        ),
        (
            &URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":5,"start":"../x"}"#),
            "continue key is not valid: ../x",
        ),
    ] {
        let (code, status) =
            list(&sim, "pods", None, &[("limit", "2"), ("continue", bad)]).unwrap_err();
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(status["reason"], "BadRequest");
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with("invalid continue token: continue key is not valid"),
            "{message}"
        );
        assert!(message.contains(why), "{message}");
    }
    let (code, status) = list(
        &sim,
        "pods",
        None,
        &[("continue", token), ("resourceVersion", "7")],
    )
    .unwrap_err();
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        status["message"],
        "specifying resource version is not allowed when using continue"
    );
    // resourceVersion=0 with continue is allowed (client-go's pager may send it).
    let page = list(
        &sim,
        "pods",
        None,
        &[("continue", token), ("resourceVersion", "0")],
    )
    .unwrap();
    assert_eq!(names(&page).len(), 7, "without a limit: the rest");
}

/// A token whose snapshot is gone: 410 Expired with the apiserver's message and
/// a token that finishes the list at the current revision.
#[tokio::test(start_paused = true)]
async fn expired_tokens_are_gone_with_an_inconsistent_continuation() {
    let sim = cluster(3);
    let first = list(&sim, "pods", None, &[("limit", "4")]).unwrap();
    let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
    assert_eq!(sim.shared.pages.len(), 1);
    // Still there just before the expiry.
    tokio::time::advance(SNAPSHOT_TTL - Duration::from_secs(1)).await;
    list(&sim, "pods", None, &[("limit", "4"), ("continue", &token)]).unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    sim.put("pods", "c", json!({"metadata": {"name": "p99"}}));
    assert!(sim.delete("pods", "b", "p02"));
    let (code, gone) =
        list(&sim, "pods", None, &[("limit", "4"), ("continue", &token)]).unwrap_err();
    assert_eq!(code, StatusCode::GONE);
    assert_eq!(gone["kind"], "Status");
    assert_eq!(gone["reason"], "Expired");
    assert_eq!(gone["code"], 410);
    assert_eq!(gone["message"], INCONSISTENT_CONTINUE);
    assert_eq!(sim.shared.pages.len(), 0, "expired snapshots are dropped");
    // The inconsistent continuation: after the same key, at the current revision,
    // and consistent from there on.
    let inconsistent = gone["metadata"]["continue"].as_str().unwrap();
    let decoded: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(inconsistent).unwrap()).unwrap();
    assert_eq!(decoded["rv"], -1);
    let page = list(
        &sim,
        "pods",
        None,
        &[("limit", "4"), ("continue", inconsistent)],
    )
    .unwrap();
    assert_eq!(names(&page), ["b/p01", "c/p00", "c/p01", "c/p02"]);
    assert_eq!(
        page["metadata"]["resourceVersion"],
        sim.resource_version().to_string()
    );
    let last = list(
        &sim,
        "pods",
        None,
        &[
            ("limit", "4"),
            ("continue", page["metadata"]["continue"].as_str().unwrap()),
        ],
    )
    .unwrap();
    assert_eq!(names(&last), ["c/p99"]);
    assert!(last["metadata"].get("continue").is_none());

    // A token presented with another list names no snapshot: 410 as well.
    let first = list(&sim, "pods", None, &[("limit", "4")]).unwrap();
    let token = first["metadata"]["continue"].as_str().unwrap();
    let (code, _) = list(
        &sim,
        "pods",
        None,
        &[
            ("limit", "4"),
            ("continue", token),
            ("labelSelector", "tier=web"),
        ],
    )
    .unwrap_err();
    assert_eq!(code, StatusCode::GONE);
}

/// At most [`MAX_SNAPSHOTS`] are kept; the least recently used goes first.
#[tokio::test(start_paused = true)]
async fn snapshots_are_bounded_least_recently_used_first() {
    let sim = cluster(2);
    let first = |sel: &str| {
        let p = list(
            &sim,
            "pods",
            None,
            &[("limit", "1"), ("labelSelector", sel)],
        )
        .unwrap();
        p["metadata"]["continue"].as_str().unwrap().to_owned()
    };
    let oldest = first("tier in (web,db,x0)");
    tokio::time::advance(Duration::from_millis(1)).await;
    let used = first("tier in (web,db,x1)");
    for i in 2..MAX_SNAPSHOTS {
        tokio::time::advance(Duration::from_millis(1)).await;
        first(&format!("tier in (web,db,x{i})"));
    }
    assert_eq!(sim.shared.pages.len(), MAX_SNAPSHOTS);
    tokio::time::advance(Duration::from_millis(1)).await;
    // Using the oldest makes it recent: the second oldest is dropped next.
    let cont = |sel: &str, token: &str| {
        list(
            &sim,
            "pods",
            None,
            &[("limit", "1"), ("labelSelector", sel), ("continue", token)],
        )
        .map(|_| ())
        .map_err(|(code, _)| code)
    };
    cont("tier in (web,db,x0)", &oldest).unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    first("tier in (web,db,new)");
    assert_eq!(sim.shared.pages.len(), MAX_SNAPSHOTS);
    assert_eq!(cont("tier in (web,db,x0)", &oldest), Ok(()));
    assert_eq!(cont("tier in (web,db,x1)", &used), Err(StatusCode::GONE));
}

/// Over HTTP: the codes, and `Status` bodies.
#[tokio::test]
async fn served_pages_and_errors() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sim = cluster(3);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn({
        let sim = sim.clone();
        async move { sim.serve(listener, std::future::pending()).await }
    });
    let get = |path: String| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: k\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let code: u16 = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body: Value = serde_json::from_str(raw.split_once("\r\n\r\n").unwrap().1).unwrap();
        (code, body)
    };
    let (code, page) = get("/api/v1/namespaces/a/pods?limit=2".into()).await;
    assert_eq!(code, 200);
    assert_eq!(names(&page), ["a/p00", "a/p01"]);
    assert_eq!(page["metadata"]["remainingItemCount"], 1);
    let token = page["metadata"]["continue"].as_str().unwrap();
    let (code, page) = get(format!(
        "/api/v1/namespaces/a/pods?limit=2&continue={token}"
    ))
    .await;
    assert_eq!(code, 200);
    assert_eq!(names(&page), ["a/p02"]);
    let (code, status) = get("/api/v1/pods?limit=2&continue=%21".into()).await;
    assert_eq!((code, &status["reason"]), (400, &json!("BadRequest")));
    // The token of a namespaced list, at the cluster scope: no such snapshot.
    let (code, status) = get(format!("/api/v1/pods?limit=2&continue={token}")).await;
    assert_eq!((code, &status["reason"]), (410, &json!("Expired")));
    server.abort();
}

/// kube-runtime's watcher (pages of 500) over a generated cluster: every Pod
/// arrives, over several list requests.
#[tokio::test]
async fn kube_runtime_watcher_pages_through_a_generated_cluster() {
    use futures_util::StreamExt as _;
    use kube::runtime::watcher;
    let sim = KubeSim::new(1000);
    sim.generate(5000, 2);
    let want: std::collections::BTreeSet<(String, String)> = sim
        .objects()
        .into_iter()
        .filter(|o| o.resource == "pods")
        .map(|o| (o.namespace, o.name))
        .collect();
    assert!(want.len() > 1000, "{} Pods", want.len());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn({
        let sim = sim.clone();
        async move { sim.serve(listener, std::future::pending()).await }
    });
    let kc = kube::config::Kubeconfig::from_yaml(&crate::kubeconfig(&url)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let api = kube::Api::<k8s_openapi::api::core::v1::Pod>::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let mut got = std::collections::BTreeSet::new();
    while let Some(e) = stream.next().await {
        match e.expect("the watch") {
            watcher::Event::InitApply(p) => {
                got.insert((
                    p.metadata.namespace.unwrap_or_default(),
                    p.metadata.name.unwrap_or_default(),
                ));
            }
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(got, want);
    let lists: Vec<String> = sim
        .audit()
        .into_iter()
        .filter(|e| e.verb == "list" && e.path == "/api/v1/pods")
        .map(|e| e.query)
        .collect();
    assert_eq!(lists.len(), want.len().div_ceil(500), "{lists:?}");
    assert!(lists[0].contains("limit=500") && !lists[0].contains("continue="));
    assert!(lists[1..].iter().all(|q| q.contains("continue=")));
    server.abort();
}
