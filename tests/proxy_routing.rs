//! The proxy end to end: the real `podgate proxy` binary in front of recording stub
//! Pods, checked over raw HTTP/1.1.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{Stub, send, send_chunked, start_proxy, v1};
use podgate_registry::testing::{eventually, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_traffic_reaches_the_pod_its_token_names() {
    let legacy = Stub::start(1).await;
    let pod2 = Stub::start(2).await;
    let pod3 = Stub::start(3).await;
    // Pod 2's first upstream is dead: requests must fail over to its second one.
    let dead = free_port();
    let dir = tempfile::tempdir().unwrap();
    let key = podgate_tokens::keys::generate(podgate_tokens::Algorithm::EdDSA).unwrap();
    std::fs::write(dir.path().join("k1.pem"), key.public.as_ref().unwrap()).unwrap();
    let signer = podgate_tokens::keys::keyset_from_generated("k1", &key).unwrap();
    let jwt = podgate_tokens::mint(
        &podgate_tokens::MintRequest::new(
            podgate_tokens::TokenKind::Job,
            podgate_tokens::PodId::new(2).unwrap(),
            600,
        ),
        signer.signing_key().unwrap(),
        podgate_tokens::unix_now(),
    )
    .unwrap();
    let config = format!(
        "keys = [\"{}\"]\n{}",
        dir.path().display(),
        common::topology(&[
            common::pod_entry(1, &[legacy.addr.to_string()], ""),
            common::pod_entry(2, &[format!("127.0.0.1:{dead}"), pod2.addr.to_string()], "",),
            common::pod_entry(3, &[pod3.addr.to_string()], "state = \"draining\""),
        ])
    );
    let proxy = start_proxy(&config, dir).await;
    let p = proxy.port;

    // New runner: token in the RUNNER-TOKEN header; the body passes byte-equal.
    let t2 = v1(2);
    let body = format!(r#"{{"token":"{t2}","system_id":"s_1","info":{{"name":"gitlab-runner"}}}}"#);
    for _ in 0..4 {
        let (status, _, reply) = send(
            p,
            &format!("POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json\r\nrunner-token: {t2}"),
            body.as_bytes(),
        )
        .await;
        assert_eq!((status, reply.as_str()), (200, r#"{"pod":2}"#));
    }
    // Old runner: the token only in the JSON body.
    let (status, _, reply) = send(
        p,
        "POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json",
        body.as_bytes(),
    )
    .await;
    assert_eq!((status, reply.as_str()), (200, r#"{"pod":2}"#));
    // With Expect: 100-continue too.
    let (status, _, reply) = send(
        p,
        "POST /api/v4/runners/verify HTTP/1.1\r\ncontent-type: application/json\r\nexpect: 100-continue",
        body.as_bytes(),
    )
    .await;
    assert_eq!(
        (status, reply.as_str()),
        (200, r#"{"pod":2}"#),
        "expect-continue"
    );
    // A JWT job token in JOB-TOKEN.
    let (status, _, reply) = send(
        p,
        &format!(
            "PUT /api/v4/jobs/7 HTTP/1.1\r\njob-token: {jwt}\r\ncontent-type: application/json"
        ),
        br#"{"state":"running"}"#,
    )
    .await;
    assert_eq!((status, reply.as_str()), (200, r#"{"pod":2}"#));

    let seen2 = pod2.seen();
    assert_eq!(seen2.len(), 7);
    for s in &seen2[..6] {
        assert_eq!(
            s.body,
            body.as_bytes(),
            "{} {} body changed",
            s.method,
            s.path
        );
        assert_eq!(
            s.headers.get("x-podgate-pod").map(String::as_str),
            Some("2")
        );
        assert!(!s.headers.contains_key("expect"));
    }
    assert_eq!(seen2[6].path, "/api/v4/jobs/7");
    assert_eq!(
        seen2[6].headers.get("x-podgate-rule").map(String::as_str),
        Some("job-update")
    );

    // Invalid token: 401 with a reason, forwarded nowhere.
    let bad = t2.replacen("glrt-", "glrt-X", 1);
    let (status, headers, reply) = send(
        p,
        &format!("POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {bad}"),
        b"{}",
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert!(
        reply.contains("\"message\"") && reply.contains("401"),
        "{reply}"
    );
    // Unroutable (legacy) token: the default Pod.
    let (status, _, reply) = send(
        p,
        "PATCH /api/v4/jobs/7/trace HTTP/1.1\r\njob-token: glcbt-64_legacyRandom",
        b"log",
    )
    .await;
    assert_eq!((status, reply.as_str()), (200, r#"{"pod":1}"#));
    // A draining Pod: 503 with Retry-After; nothing forwarded.
    let (status, headers, _) = send(
        p,
        &format!(
            "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {}",
            v1(3)
        ),
        b"{}",
    )
    .await;
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));
    // An unknown Pod: 503 as well, never the legacy Pod.
    let (status, _, _) = send(
        p,
        &format!(
            "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {}",
            v1(9)
        ),
        b"{}",
    )
    .await;
    assert_eq!(status, 503);

    assert_eq!(pod2.seen().len(), 7, "nothing more reached Pod 2");
    assert!(pod3.seen().is_empty(), "a draining Pod got traffic");
    assert_eq!(
        legacy.seen().len(),
        1,
        "only the unroutable request reached the legacy Pod"
    );
}

/// The topology lives in Redis: changes made with `podgate registry` apply without a
/// restart, and with Redis gone the proxy keeps routing on its last snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_changes_in_redis_apply_live_and_survive_redis_going_away() {
    use podgate_registry::testing::RedisServer;
    let mut redis = RedisServer::start();
    let legacy = Stub::start(1).await;
    let pod2 = Stub::start(2).await;
    let pod2b = Stub::start(22).await;
    let registry = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_podgate"))
            .args(["registry", "--redis", &redis.url()])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    registry(&[
        "pods",
        "add",
        "--id",
        "1",
        "--name",
        "legacy",
        "--web",
        &legacy.addr.to_string(),
        "--default",
    ]);
    let config = format!(
        r#"[registry]
        backend = {{ kind = "redis", url = "{url}" }}
        topology_resync_interval = "200ms"
        backoff_max = "200ms"
        "#,
        url = redis.url()
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let p = proxy.port;
    let t2 = v1(2);
    let req = format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json\r\nrunner-token: {t2}"
    );

    // Pod 2 does not exist yet: 503, never the legacy Pod.
    assert_eq!(send(p, &req, b"{}").await.0, 503);
    // Added in Redis: routed there without a restart (woken by the change event).
    registry(&[
        "pods",
        "add",
        "--id",
        "2",
        "--name",
        "pod-2",
        "--web",
        &pod2.addr.to_string(),
    ]);
    let reply = eventually(Duration::from_secs(10), "Pod 2 to take traffic", || async {
        let (status, _, body) = send(p, &req, b"{}").await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(reply, r#"{"pod":2}"#);
    // Its upstream changed: traffic follows.
    registry(&[
        "pods",
        "add",
        "--id",
        "2",
        "--name",
        "pod-2",
        "--web",
        &pod2b.addr.to_string(),
    ]);
    eventually(
        Duration::from_secs(10),
        "the new upstream to take traffic",
        || async {
            let (_, _, body) = send(p, &req, b"{}").await;
            (body == r#"{"pod":22}"#).then_some(())
        },
    )
    .await;
    // Drained: 503 + Retry-After.
    registry(&["pods", "drain", "2"]);
    let headers = eventually(Duration::from_secs(10), "the drain to apply", || async {
        let (status, headers, _) = send(p, &req, b"{}").await;
        (status == 503).then_some(headers)
    })
    .await;
    assert!(headers.contains_key("retry-after"));
    registry(&["pods", "undrain", "2"]);
    eventually(Duration::from_secs(10), "the undrain to apply", || async {
        (send(p, &req, b"{}").await.0 == 200).then_some(())
    })
    .await;

    // Redis goes away: routing goes on with the last snapshot.
    redis.kill();
    for _ in 0..20 {
        let (status, _, body) = send(p, &req, b"{}").await;
        assert_eq!((status, body.as_str()), (200, r#"{"pod":22}"#));
    }
    let (status, _, body) = send(p, "GET /dashboard HTTP/1.1", b"").await;
    assert_eq!((status, body.as_str()), (200, r#"{"pod":1}"#));
    assert!(
        legacy.seen().iter().all(|s| s.path == "/dashboard"),
        "no runner request reached the legacy Pod"
    );
}

/// A 64 MiB artifact upload, chunked, token only in the leading multipart field (an
/// old runner) or in `JOB-TOKEN`: reaches its Pod byte for byte, streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_chunked_artifact_upload_streams_to_its_pod() {
    let legacy = Stub::start(1).await;
    let pod2 = Stub::start(2).await;
    let config = common::topology(&[
        common::pod_entry(1, &[legacy.addr.to_string()], ""),
        common::pod_entry(2, &[pod2.addr.to_string()], ""),
    ]);
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let token = podgate_tokens::gitlab::encode(
        "glcbt-",
        &podgate_tokens::gitlab::RoutingKeys {
            cell: Some(2),
            organization: Some(1),
            ..Default::default()
        },
        &podgate_tokens::gitlab::random_bytes(),
    )
    .unwrap();
    let boundary = "----podgate-test-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\n{token}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"artifacts.zip\"\r\n\
         Content-Type: application/zip\r\n\r\n"
    )
    .into_bytes();
    // 64 MiB of non-repeating bytes, so a dropped or reordered chunk shows.
    let mut x: u32 = 2_463_534_242;
    body.extend((0..64 << 20).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x as u8
    }));
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let ct = format!("content-type: multipart/form-data; boundary={boundary}");

    let (status, reply) = send_chunked(
        proxy.port,
        &format!("POST /api/v4/jobs/7/artifacts?artifact_format=zip HTTP/1.1\r\n{ct}"),
        &body,
    )
    .await;
    assert_eq!(
        (status, reply.as_str()),
        (200, r#"{"pod":2}"#),
        "old runner: token in the form"
    );
    let (status, reply) = send_chunked(
        proxy.port,
        &format!("POST /api/v4/jobs/7/artifacts HTTP/1.1\r\n{ct}\r\njob-token: {token}"),
        &body,
    )
    .await;
    assert_eq!(
        (status, reply.as_str()),
        (200, r#"{"pod":2}"#),
        "new runner: JOB-TOKEN"
    );
    let seen = pod2.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.body.len(), body.len());
        assert!(s.body == body, "upload changed on the way");
    }
    assert!(legacy.seen().is_empty());

    // A JSON body over 32 KiB on a route that reads it: 413, forwarded nowhere.
    let big = format!(r#"{{"token":"x","pad":"{}"}}"#, "a".repeat(40 * 1024));
    let (status, _, _) = send(
        proxy.port,
        "POST /api/v4/jobs/request HTTP/1.1\r\ncontent-type: application/json",
        big.as_bytes(),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(pod2.seen().len(), 2);
}

/// Failover moves on from wherever round robin started: with the dead upstream listed
/// second, a request whose first pick is the dead one must retry on the live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_reaches_the_live_upstream_whichever_is_tried_first() {
    let alive = Stub::start(4).await;
    let dead = free_port();
    let config = format!(
        r#"[topology]
        default_pod = 4
        [[topology.pods]]
        id = 4
        name = "pod-4"
        web = ["{alive}", "127.0.0.1:{dead}"]
        "#,
        alive = alive.addr,
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;
    let req = format!(
        "POST /api/v4/jobs/request HTTP/1.1\r\nrunner-token: {}",
        v1(4)
    );
    for i in 0..6 {
        let (status, _, body) = send(proxy.port, &req, b"{}").await;
        assert_eq!(
            (status, body.as_str()),
            (200, r#"{"pod":4}"#),
            "request {i}"
        );
    }
    assert_eq!(alive.seen().len(), 6);
}
