//! Every runner endpoint of `runner-protocol.md` with every token source it can carry,
//! request ids, a long poll held 90 s, and agent traffic (gRPC over h2c with trailers,
//! WebSocket upgrade) to the right Pod's kas: the real binary against stub Pods.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use common::{Stub, gitlab_token, jwt_minter, request, start_proxy, three_pods};
use podgate_tokens::TokenKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request of the matrix.
struct Case {
    method: &'static str,
    /// Path and query; `{t}` is replaced by the token.
    target: String,
    /// Extra headers; `{t}` is replaced by the token.
    headers: Vec<(&'static str, String)>,
    content_type: Option<String>,
    /// The body; `{t}` is replaced by the token.
    body: Vec<u8>,
    /// The token's Pod.
    pod: u64,
    token: String,
    rule: &'static str,
}

fn fill(s: &str, token: &str) -> String {
    s.replace("{t}", token)
}

fn json(fields: &str) -> Vec<u8> {
    format!(r#"{{"token":"{{t}}"{fields}}}"#).into_bytes()
}

const BOUNDARY: &str = "podgate-boundary-7MA4YWxkTrZu0gW";

fn multipart() -> Vec<u8> {
    format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{{t}}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\n\
         Content-Type: application/zip\r\n\r\nPK\x03\x04 zip bytes\r\n--{BOUNDARY}--\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runner_endpoint_and_token_source_reaches_its_pod() {
    let legacy = Stub::start(1).await;
    let pod2 = Stub::start(2).await;
    let pod3 = Stub::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let mint = jwt_minter(dir.path());
    let config = three_pods(
        &legacy,
        &pod2,
        &pod3,
        &format!("keys = [\"{}\"]", dir.path().display()),
    );
    let proxy = start_proxy(&config, dir).await;

    let runner = |pod| gitlab_token("glrt-", pod);
    let job = |pod| gitlab_token("glcbt-", pod);
    let pat = |pod| gitlab_token("glpat-", pod);
    let json_ct = Some("application/json".to_owned());
    let mut cases = Vec::new();
    let mut case = |method,
                    target: &str,
                    headers: &[(&'static str, &str)],
                    content_type: Option<String>,
                    body: Vec<u8>,
                    pod: u64,
                    token: String,
                    rule| {
        cases.push(Case {
            method,
            target: target.to_owned(),
            headers: headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
            content_type,
            body,
            pod,
            token,
            rule,
        });
    };
    // Runner endpoints: old runners put the token in the body only, new ones in
    // RUNNER-TOKEN too (the header wins), and JWT runner tokens route the same.
    for (method, path, body) in [
        (
            "POST",
            "/api/v4/runners",
            json(
                r#","description":"r1","tag_list":"a,b","run_untagged":true,"info":{"name":"gitlab-runner"}"#,
            ),
        ),
        (
            "POST",
            "/api/v4/runners/verify",
            json(r#","system_id":"s_0123456789ab""#),
        ),
        ("DELETE", "/api/v4/runners", json("")),
        (
            "DELETE",
            "/api/v4/runners/managers",
            json(r#","system_id":"s_0123456789ab""#),
        ),
        (
            "POST",
            "/api/v4/runners/reset_authentication_token",
            json(""),
        ),
        (
            "POST",
            "/api/v4/jobs/request",
            json(r#","system_id":"s_1","last_update":"0","info":{"features":{"variables":true}}"#),
        ),
    ] {
        let rule = if path == "/api/v4/jobs/request" {
            "jobs-request"
        } else {
            "runners"
        };
        case(
            method,
            path,
            &[],
            json_ct.clone(),
            body.clone(),
            2,
            runner(2),
            rule,
        );
        case(
            method,
            path,
            &[("RUNNER-TOKEN", "{t}")],
            json_ct.clone(),
            body.clone(),
            3,
            runner(3),
            rule,
        );
        case(
            method,
            path,
            &[],
            json_ct.clone(),
            body,
            3,
            mint(TokenKind::Runner, 3),
            rule,
        );
    }
    // Job update: JOB-TOKEN and/or the body's token.
    let update =
        json(r#","state":"success","exit_code":0,"output":{"checksum":"crc32:1","bytesize":3}"#);
    case(
        "PUT",
        "/api/v4/jobs/7",
        &[("JOB-TOKEN", "{t}")],
        json_ct.clone(),
        update.clone(),
        2,
        job(2),
        "job-update",
    );
    case(
        "PUT",
        "/api/v4/jobs/7",
        &[],
        json_ct.clone(),
        update,
        3,
        mint(TokenKind::Job, 3),
        "job-update",
    );
    // Trace: JOB-TOKEN, or `?token=` (`params[:token]`; GitLab's `authenticate_job!`
    // does not read `job_token`, lib/api/ci/helpers/runner.rb).
    let trace = b"\x1b[32mRunning with gitlab-runner 17.6.0\x1b[0m\n".to_vec();
    let text = Some("text/plain".to_owned());
    case(
        "PATCH",
        "/api/v4/jobs/7/trace",
        &[("JOB-TOKEN", "{t}"), ("Content-Range", "0-43")],
        text.clone(),
        trace.clone(),
        2,
        job(2),
        "job-trace",
    );
    case(
        "PATCH",
        "/api/v4/jobs/7/trace?token={t}",
        &[("Content-Range", "0-43")],
        text.clone(),
        trace.clone(),
        3,
        job(3),
        "job-trace",
    );
    case(
        "PATCH",
        "/api/v4/jobs/7/trace?token={t}",
        &[("Content-Range", "0-43")],
        text,
        trace,
        2,
        mint(TokenKind::Job, 2),
        "job-trace",
    );
    // Artifacts upload: JOB-TOKEN, the query, or (older clients) the multipart field.
    let mp = Some(format!("multipart/form-data; boundary={BOUNDARY}"));
    case(
        "POST",
        "/api/v4/jobs/7/artifacts?artifact_format=zip&artifact_type=archive",
        &[("JOB-TOKEN", "{t}")],
        mp.clone(),
        multipart(),
        3,
        job(3),
        "job-artifacts-upload",
    );
    case(
        "POST",
        "/api/v4/jobs/7/artifacts?expire_in=1d",
        &[],
        mp.clone(),
        multipart(),
        2,
        job(2),
        "job-artifacts-upload",
    );
    case(
        "POST",
        "/api/v4/jobs/7/artifacts/authorize?token={t}",
        &[],
        mp,
        multipart(),
        3,
        job(3),
        "job-artifacts-upload",
    );
    // Artifacts download (a dependency's job token): JOB-TOKEN or ?token= / ?job_token=.
    case(
        "GET",
        "/api/v4/jobs/8/artifacts",
        &[("JOB-TOKEN", "{t}")],
        None,
        vec![],
        2,
        job(2),
        "job-artifacts-download",
    );
    case(
        "GET",
        "/api/v4/jobs/8/artifacts?token={t}",
        &[],
        None,
        vec![],
        3,
        job(3),
        "job-artifacts-download",
    );
    case(
        "HEAD",
        "/api/v4/jobs/8/artifacts/path/to/file?job_token={t}",
        &[],
        None,
        vec![],
        2,
        mint(TokenKind::Job, 2),
        "job-artifacts-download",
    );
    // Other API calls: PRIVATE-TOKEN, Bearer, Basic (token as password), query.
    case(
        "GET",
        "/api/v4/projects/42",
        &[("PRIVATE-TOKEN", "{t}")],
        None,
        vec![],
        3,
        pat(3),
        "api-token",
    );
    case(
        "GET",
        "/api/v4/projects/42",
        &[("Authorization", "Bearer {t}")],
        None,
        vec![],
        2,
        pat(2),
        "api-token",
    );
    case(
        "GET",
        "/api/v4/projects/42?private_token={t}",
        &[],
        None,
        vec![],
        3,
        pat(3),
        "api-token",
    );
    case(
        "DELETE",
        "/api/v4/projects/42/pipelines/9",
        &[("JOB-TOKEN", "{t}")],
        None,
        vec![],
        2,
        job(2),
        "api-token",
    );
    let basic = |t: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("gitlab-ci-token:{t}"))
        )
    };
    let t = job(3);
    let auth = basic(&t);
    case(
        "GET",
        "/api/v4/projects/42/packages/generic/x/1/f",
        &[("Authorization", auth.as_str())],
        None,
        vec![],
        3,
        t,
        "api-token",
    );

    for (n, c) in cases.iter().enumerate() {
        let target = fill(&c.target, &c.token);
        let body = fill(&String::from_utf8_lossy(&c.body), &c.token).into_bytes();
        let mut head = format!(
            "{} {target} HTTP/1.1\r\nuser-agent: gitlab-runner 17.6.0 (main; go1.23; linux/amd64)\r\nx-case: {n}\r\nx-custom: kept, as is ;q=1",
            c.method
        );
        let mut sent: HashMap<String, String> = HashMap::new();
        for (k, v) in &c.headers {
            let v = fill(v, &c.token);
            head.push_str(&format!("\r\n{k}: {v}"));
            sent.insert(k.to_ascii_lowercase(), v);
        }
        if let Some(ct) = &c.content_type {
            head.push_str(&format!("\r\ncontent-type: {ct}"));
            sent.insert("content-type".into(), ct.clone());
        }
        sent.insert("x-custom".into(), "kept, as is ;q=1".into());
        let reply = request(proxy.port, &head, &body).await;
        let what = format!("case {n}: {} {target} ({})", c.method, c.rule);
        assert_eq!(
            reply.status,
            200,
            "{what}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        if c.method != "HEAD" {
            assert_eq!(
                reply.body,
                format!(r#"{{"pod":{}}}"#, c.pod).into_bytes(),
                "{what}"
            );
        }
        let target_stub = [&pod2, &pod3][(c.pod - 2) as usize];
        let seen: Vec<_> = target_stub
            .seen()
            .into_iter()
            .filter(|s| s.headers.get("x-case") == Some(&n.to_string()))
            .collect();
        assert_eq!(seen.len(), 1, "{what}: reached Pod {} once", c.pod);
        let s = &seen[0];
        assert_eq!(
            (s.method.as_str(), s.path.as_str()),
            (c.method, target.as_str()),
            "{what}"
        );
        assert!(s.body == body, "{what}: body changed");
        for (k, v) in &sent {
            assert_eq!(s.headers.get(k), Some(v), "{what}: header {k}");
        }
        assert_eq!(
            s.headers.get("x-podgate-pod"),
            Some(&c.pod.to_string()),
            "{what}"
        );
        assert_eq!(
            s.headers.get("x-podgate-rule").map(String::as_str),
            Some(c.rule),
            "{what}"
        );
    }
    let total = cases.len();
    assert_eq!(
        pod2.seen().len() + pod3.seen().len(),
        total,
        "each request reached exactly one Pod"
    );
    assert!(
        legacy.seen().is_empty(),
        "nothing routable reached the legacy Pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_propagated_or_generated() {
    let (legacy, pod2, pod3) = (
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    );
    let proxy = start_proxy(
        &three_pods(&legacy, &pod2, &pod3, ""),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let t = gitlab_token("glrt-", 2);
    let r = request(
        proxy.port,
        &format!("POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {t}\r\nx-request-id: 01JCXYZ-runner-abc"),
        b"{}",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers.get("x-request-id").map(String::as_str),
        Some("01JCXYZ-runner-abc")
    );
    assert_eq!(
        pod2.seen()[0]
            .headers
            .get("x-request-id")
            .map(String::as_str),
        Some("01JCXYZ-runner-abc")
    );
    // None, or one unfit for logs: a fresh 32-hex-digit id, different every time.
    let mut ids = Vec::new();
    for extra in ["", "\r\nx-request-id: has spaces and \"quotes\""] {
        let r = request(
            proxy.port,
            &format!("POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {t}{extra}"),
            b"{}",
        )
        .await;
        let id = r.headers.get("x-request-id").cloned().unwrap_or_default();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id:?}"
        );
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1]);
    let upstream: Vec<_> = pod2
        .seen()
        .iter()
        .skip(1)
        .filter_map(|s| s.headers.get("x-request-id").cloned())
        .collect();
    assert_eq!(upstream, ids, "the Pod sees the id the client got");
    // Answers from the proxy itself carry one too.
    let bad = t.replacen("glrt-", "glrt-X", 1);
    let r = request(
        proxy.port,
        &format!("POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {bad}"),
        b"{}",
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.headers.get("x-request-id").map(String::len), Some(32));
}

/// A `jobs/request` long poll held by the Pod for 90 s passes through untouched (the
/// rule's upstream timeout is 150 s), and one answered mid-hold gets its job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_held_90_s_comes_back_through_the_proxy() {
    let (legacy, pod2, pod3) = (
        Stub::start(1).await,
        Stub::start(2).await,
        Stub::start(3).await,
    );
    let proxy = start_proxy(
        &three_pods(&legacy, &pod2, &pod3, ""),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let t = gitlab_token("glrt-", 2);
    let body = format!(r#"{{"token":"{t}","last_update":"t0"}}"#);
    let head = "POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json\r\nx-test-long-poll: 90";
    let started = Instant::now();
    let held = tokio::spawn({
        let body = body.clone();
        async move { request(proxy.port, head, body.as_bytes()).await }
    });
    // A second poll on Pod 3, woken by a job as soon as the Pod holds it.
    let t3 = gitlab_token("glrt-", 3);
    let woken = tokio::spawn({
        let body = format!(r#"{{"token":"{t3}","last_update":"t0"}}"#);
        async move { request(proxy.port, head, body.as_bytes()).await }
    });
    podgate_registry::testing::eventually(
        Duration::from_secs(10),
        "Pod 3 to hold the poll",
        || async { (!pod3.seen().is_empty()).then_some(()) },
    )
    .await;
    pod3.queue_job();
    let r = woken.await.unwrap();
    assert_eq!(
        (r.status, r.body.as_slice()),
        (201, br#"{"id":1,"pod":3}"#.as_slice())
    );

    let r = held.await.unwrap();
    let waited = started.elapsed();
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.headers.get("x-gitlab-last-update").map(String::as_str),
        Some("t1")
    );
    assert!(waited >= Duration::from_secs(90), "held {waited:?}");
    assert_eq!(pod2.seen().len(), 1);
    assert!(pod2.seen()[0].body == body.as_bytes());
}

/// A stub kas speaking gRPC over h2c: records (path, authorization, body) and answers
/// one message and `grpc-status: 0` in trailers.
async fn grpc_kas() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(String, String, Vec<u8>)>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                // Each stream in its own task: the connection must keep being polled
                // (by `accept`) for stream data to flow.
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let (parts, mut body) = req.into_parts();
                        let mut data = Vec::new();
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                            data.extend_from_slice(&chunk);
                        }
                        let auth = parts
                            .headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let _ = tx.send((parts.uri.path().to_owned(), auth, data));
                        let resp = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let mut send = respond.send_response(resp, false).unwrap();
                        // One length-prefixed gRPC message: "pods".
                        send.send_data(Bytes::from_static(b"\x00\x00\x00\x00\x04pods"), false)
                            .unwrap();
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        trailers.insert("grpc-message", "served-by-kas".parse().unwrap());
                        send.send_trailers(trailers).unwrap();
                    });
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_grpc_over_h2c_and_websockets_reach_the_pods_kas() {
    let legacy = Stub::start(1).await;
    let web2 = Stub::start(2).await;
    let (kas2, mut kas2_seen) = grpc_kas().await;
    let ws3 = Stub::start(33).await;
    let dir = tempfile::tempdir().unwrap();
    let mint = jwt_minter(dir.path());
    let web = [web2.addr.to_string()];
    let config = format!(
        "keys = [\"{}\"]\n{}",
        dir.path().display(),
        common::topology(&[
            common::pod_entry(1, &[legacy.addr.to_string()], ""),
            common::pod_entry(2, &web, &format!("kas = [\"{kas2}\"]")),
            common::pod_entry(3, &web, &format!("kas = [\"{}\"]", ws3.addr)),
        ])
    );
    let proxy = start_proxy(&config, dir).await;

    // gRPC over h2c, prior knowledge, as agentk dials kas.
    let tcp = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let agent2 = mint(TokenKind::Agent, 2);
    let req = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://127.0.0.1:{}/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect",
            proxy.port
        ))
        .header("authorization", format!("Bearer {agent2}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(req, false).unwrap();
    send.send_data(Bytes::from_static(b"\x00\x00\x00\x00\x05hello"), true)
        .unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    assert_eq!(data, b"\x00\x00\x00\x00\x04pods");
    let trailers = body
        .trailers()
        .await
        .unwrap()
        .expect("gRPC trailers pass through");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(trailers.get("grpc-message").unwrap(), "served-by-kas");
    let (path, auth, got) = kas2_seen.recv().await.unwrap();
    assert_eq!(
        path,
        "/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect"
    );
    assert_eq!(auth, format!("Bearer {agent2}"));
    assert_eq!(got, b"\x00\x00\x00\x00\x05hello");
    assert!(ws3.seen().is_empty(), "Pod 3's kas saw Pod 2's agent");

    // WebSocket (agentk behind HTTP/1.1-only networks): upgraded and piped both ways
    // to Pod 3's kas.
    let agent3 = mint(TokenKind::Agent, 3);
    let mut s = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
    let head = format!(
        "GET /-/kubernetes-agent/ HTTP/1.1\r\nhost: gitlab.example.com\r\nauthorization: Bearer {agent3}\r\n\
         upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).await.unwrap();
        response.push(byte[0]);
    }
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 101"), "{response}");
    for msg in [&b"\x81\x05hello"[..], &b"\x82\x03\x01\x02\x03"[..]] {
        s.write_all(msg).await.unwrap();
        let mut echo = vec![0; msg.len()];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, msg, "frames pass both ways");
    }
    let seen = ws3.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers.get("authorization"),
        Some(&format!("Bearer {agent3}"))
    );
    assert!(
        web2.seen().is_empty() && legacy.seen().is_empty(),
        "agent traffic went to kas only"
    );
}
