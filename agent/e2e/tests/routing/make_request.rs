//! agentk's `MakeRequest` against kube-sim through two kas instances, in GitLab's
//! `grpctool.HttpRequest` frames: a list, a create, a 404 passed through as HTTP,
//! and a watch whose events arrive while it is open.

use std::sync::Arc;
use std::time::Duration;

use podgate_agent::proto::gitlab::agent::grpctool::{
    HttpRequest, HttpResponse, http_request, http_response,
};
use podgate_agent::proto::gitlab::agent::prototool;
use podgate_agentk::KubeHandler;
use podgate_testkit::kube::KubeTestServer;
use prost::Message as _;
use serde_json::{Value, json};

use super::{replica, two_kas};

/// A request of `method` for `path` (and `query`) accepting JSON, with `body`.
struct Req {
    method: &'static str,
    path: String,
    query: Vec<(&'static str, String)>,
    content_type: bool,
    body: Vec<u8>,
}

fn get(path: &str) -> Req {
    Req {
        method: "GET",
        path: path.into(),
        query: Vec::new(),
        content_type: false,
        body: Vec::new(),
    }
}

/// `req` as GitLab's kas sends it: Header, the body as Data, Trailer, half-close.
async fn send_request(r: &podgate_kas::routing::Routed, req: Req) {
    let mut header: std::collections::HashMap<String, prototool::Values> = Default::default();
    header.insert(
        "Accept".into(),
        prototool::Values {
            value: vec!["application/json".into()],
        },
    );
    if req.content_type {
        header.insert(
            "Content-Type".into(),
            prototool::Values {
                value: vec!["application/json".into()],
            },
        );
    }
    let query = req
        .query
        .into_iter()
        .map(|(k, v)| (k.to_owned(), prototool::Values { value: vec![v] }))
        .collect();
    let frame = |m| HttpRequest { message: Some(m) }.encode_to_vec();
    let head = http_request::Header {
        request: Some(prototool::HttpRequest {
            method: req.method.into(),
            header,
            url_path: req.path,
            query,
        }),
        extra: None,
        content_length: Some(i64::try_from(req.body.len()).unwrap()),
    };
    r.send(frame(http_request::Message::Header(head)))
        .await
        .unwrap();
    if !req.body.is_empty() {
        let data = http_request::Data { data: req.body };
        r.send(frame(http_request::Message::Data(data)))
            .await
            .unwrap();
    }
    r.send(frame(http_request::Message::Trailer(
        http_request::Trailer {},
    )))
    .await
    .unwrap();
    r.close_send().await.unwrap();
}

fn response(m: &[u8]) -> http_response::Message {
    HttpResponse::decode(m).unwrap().message.unwrap()
}

/// The header of a MakeRequest response: status and headers.
async fn head(
    r: &mut podgate_kas::routing::Routed,
) -> (i32, std::collections::HashMap<String, prototool::Values>) {
    match response(&r.message().await.unwrap().unwrap()) {
        http_response::Message::Header(h) => {
            let h = h.response.unwrap();
            (h.status_code, h.header)
        }
        other => panic!("expected a header first, got {other:?}"),
    }
}

/// The rest of a MakeRequest response: its body (Data until Trailer, then the end).
async fn body(r: &mut podgate_kas::routing::Routed) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        match response(&r.message().await.unwrap().unwrap()) {
            http_response::Message::Data(d) => out.extend(d.data),
            http_response::Message::Trailer(_) => break,
            other => panic!("expected data, got {other:?}"),
        }
    }
    assert!(
        r.message().await.unwrap().is_none(),
        "the call ends after the Trailer"
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_request_reaches_kube_sim_through_two_kas() {
    let kube = KubeTestServer::start(1000).await.unwrap();
    kube.put(
        "configmaps",
        "default",
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "first", "namespace": "default"}}),
    );
    let client = kube.client().await;
    let (kas1, kas2, _keys, mint) = two_kas(Duration::from_secs(5)).await;
    let (_conn, _presence, tunnels) =
        replica(&kas2, mint(Some(3)), 3, Arc::new(KubeHandler::new(client))).await;
    let router = kas1.router();
    let make = |req: Req| {
        let router = router.clone();
        async move {
            let r = router
                .call(
                    3,
                    0,
                    podgate_agent::tunnel::MAKE_REQUEST,
                    &Default::default(),
                )
                .await
                .unwrap();
            send_request(&r, req).await;
            r
        }
    };

    // A list.
    let mut r = make(get("/api/v1/namespaces/default/configmaps")).await;
    let (status, headers) = head(&mut r).await;
    assert_eq!(status, 200);
    assert!(headers["Content-Type"].value[0].starts_with("application/json"));
    let via = &headers["Via"];
    assert!(
        via.value.iter().any(|v| v.contains("podgate-agentk/")),
        "{via:?}"
    );
    let list: Value = serde_json::from_slice(&body(&mut r).await).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "first");

    // A 404 is an HTTP answer, passed through with its Status body.
    let mut r = make(get("/api/v1/namespaces/default/configmaps/nope")).await;
    assert_eq!(head(&mut r).await.0, 404);
    let status: Value = serde_json::from_slice(&body(&mut r).await).unwrap();
    assert_eq!(status["kind"], "Status");

    // A watch: its events arrive while it is open, chunk by chunk.
    let mut watch = get("/api/v1/namespaces/default/configmaps");
    watch.query = vec![
        ("watch", "1".into()),
        ("resourceVersion", kube.resource_version().to_string()),
    ];
    let mut watch = make(watch).await;
    assert_eq!(head(&mut watch).await.0, 200);
    // A create through the proxy (a body, POST).
    let mut create = get("/api/v1/namespaces/default/configmaps");
    create.method = "POST";
    create.content_type = true;
    create.body = serde_json::to_vec(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "second", "namespace": "default"},
        "data": {"k": "v"}
    }))
    .unwrap();
    let mut r = make(create).await;
    assert_eq!(head(&mut r).await.0, 201);
    body(&mut r).await;
    assert_eq!(
        kube.get("configmaps", "default", "second").unwrap()["data"]["k"],
        "v"
    );
    let mut seen = Vec::new();
    let event: Value = loop {
        let m = watch
            .message()
            .await
            .unwrap()
            .expect("the watch stays open");
        match response(&m) {
            http_response::Message::Data(d) => seen.extend(d.data),
            other => panic!("expected data, got {other:?}"),
        }
        if let Some(end) = seen.iter().position(|b| *b == b'\n') {
            break serde_json::from_slice(&seen[..end]).unwrap();
        }
    };
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "second");
    assert_eq!(
        kas2.metrics().tunnels_busy.get(),
        1,
        "the watch holds a tunnel"
    );
    // Dropping the watch at kas1 ends it at agentk: kas2's tunnel is released.
    drop(watch);
    podgate_registry::testing::eventually(
        Duration::from_secs(5),
        "the watch's tunnel is released",
        || async { (kas2.metrics().tunnels_busy.get() == 0).then_some(()) },
    )
    .await;
    tunnels.abort();
}
