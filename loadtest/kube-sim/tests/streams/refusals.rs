//! Requests for Pods' streaming subresources kube-sim cannot serve, sent raw:
//! each answer says why, in kube-apiserver's and the kubelet's words.

use podgate_testkit::kube::KubeTestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{PATIENCE, server};

/// One raw HTTP/1.1 request: the status line and headers, and the body.
async fn raw(server: &KubeTestServer, request: &str) -> (String, String) {
    let addr = server.url().trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the headers and the body they announce have arrived.
    loop {
        let n = tokio::time::timeout(PATIENCE, conn.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len || n == 0 {
                return (head.to_owned(), body.to_owned());
            }
        }
        assert!(n > 0, "the connection ended: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_kube_sim_cannot_serve_get_the_reason() {
    let server = server().await;
    let exec = "/api/v1/namespaces/default/pods/web-1/exec?command=echo&stdout=true&container=app";
    // No upgrade at all.
    let (head, body) = raw(&server, &format!("GET {exec} HTTP/1.1\r\nHost: k\r\n\r\n")).await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(
        body.contains("needs a connection upgrade to a WebSocket or to SPDY/3.1"),
        "{body}"
    );
    // A WebSocket with subprotocols kube-sim does not speak.
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let (head, body) = raw(
        &server,
        &format!("GET {exec} HTTP/1.1\r\nHost: k\r\n{ws}Sec-WebSocket-Protocol: base64.channel.k8s.io\r\n\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(body.contains("client supports [base64.channel.k8s.io], server supports [v5.channel.k8s.io v4.channel.k8s.io]"), "{body}");
    // The client's first served choice wins, with RFC 6455's accept key.
    let (head, _) = raw(
        &server,
        &format!("GET {exec} HTTP/1.1\r\nHost: k\r\n{ws}Sec-WebSocket-Protocol: v4.channel.k8s.io, v5.channel.k8s.io\r\n\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("sec-websocket-protocol: v4.channel.k8s.io"),
        "{head}"
    );
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    // Which container, and which command.
    let (_, body) = raw(
        &server,
        "GET /api/v1/namespaces/default/pods/web-1/exec?command=env&stdout=true HTTP/1.1\r\nHost: k\r\n\r\n",
    )
    .await;
    assert!(
        body.contains(
            "a container name must be specified for pod web-1, choose one of: [app side]"
        ),
        "{body}"
    );
    let (_, body) = raw(
        &server,
        &format!(
            "GET {} HTTP/1.1\r\nHost: k\r\n{ws}Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n",
            exec.replace("command=echo&", "")
        ),
    )
    .await;
    assert!(
        body.contains("you must specify at least 1 command"),
        "{body}"
    );
    let (head, body) = raw(
        &server,
        "GET /api/v1/namespaces/default/pods/gone/log HTTP/1.1\r\nHost: k\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(body.contains(r#"pods \"gone\" not found"#), "{body}");
}
