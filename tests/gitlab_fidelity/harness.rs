//! Running GitLab-fidelity cases against the proxy and judging what each Pod saw.

use super::*;

// ---------------------------------------------------------------------------------------
// Running cases.

/// A response, parsed leniently (a proxy that closes without answering gives status 0).
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) body: String,
}

pub(super) fn parse(raw: &[u8]) -> Reply {
    let mut rest = raw;
    loop {
        let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Reply {
                status: 0,
                body: String::from_utf8_lossy(rest).into_owned(),
            };
        };
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        rest = &rest[end + 4..];
        if status == 100 {
            continue;
        }
        let chunked = head.lines().any(|l| {
            l.split_once(':').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")
            })
        });
        let body = if chunked {
            // Cut short (the 10 s bound): what came, as it came.
            podgate_testkit::http::dechunk(rest).unwrap_or_else(|| rest.to_vec())
        } else {
            rest.to_vec()
        };
        return Reply {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
    }
}

/// Write the steps, read until the proxy closes (or 10 s pass: then what arrived, and
/// `true`). Write errors are tolerated: a refusing proxy may close before the body is
/// sent.
pub(super) async fn exchange(port: u16, steps: Vec<Step>) -> Result<(Vec<u8>, bool), String> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = watch::channel(Vec::<u8>::new());
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => tx.send_modify(|b| b.extend_from_slice(&buf[..n])),
            }
        }
        tx.borrow().clone()
    });
    for step in steps {
        match step {
            Step::Send(bytes) => {
                if wr.write_all(&bytes).await.is_err() || wr.flush().await.is_err() {
                    break;
                }
            }
            Step::Pause(d) => tokio::time::sleep(d).await,
            Step::Await100 => {
                // curl waits 1 s for 100 Continue, then sends the body anyway.
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    rx.wait_for(|b| b.windows(4).any(|w| w == b"\r\n\r\n")),
                )
                .await;
            }
        }
    }
    match tokio::time::timeout(Duration::from_secs(10), reader).await {
        Ok(Ok(raw)) => Ok((raw, false)),
        Ok(Err(e)) => Err(format!("reader task: {e}")),
        Err(_) => Ok((rx.borrow().clone(), true)),
    }
}

/// What each Pod saw of request `id`.
pub(super) fn seen_by(stubs: &[Stub], id: usize) -> Vec<(u64, Seen)> {
    let id = id.to_string();
    stubs
        .iter()
        .flat_map(|s| {
            s.seen()
                .into_iter()
                .filter(|r| r.headers.get("x-fidelity-case") == Some(&id))
                .map(|r| (s.pod, r))
                .collect::<Vec<_>>()
        })
        .collect()
}

pub(super) fn message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").map(|m| m.to_string()))
        .unwrap_or_else(|| body.to_owned())
}

fn first_difference(a: &[u8], b: &[u8]) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    format!(
        "{} bytes forwarded vs {} sent, first difference at byte {at}",
        a.len(),
        b.len()
    )
}

/// Run one case; `Err` says what went wrong.
pub(super) async fn run(port: u16, stubs: &[Stub], id: usize, case: &Case) -> Result<(), String> {
    let (raw, left_open) = exchange(port, case.steps(id)).await?;
    let verdict = judge(stubs, id, case, &parse(&raw));
    match (verdict, left_open) {
        (verdict, false) => verdict,
        (Ok(()), true) => Err("answered as expected, but the connection stayed open 10 s \
             although the request says `Connection: close` (RFC 9112 §9.6; Connection is a \
             list field, every line counts, RFC 9110 §7.6.1)"
            .into()),
        (Err(e), true) => Err(format!("{e}; the connection stayed open 10 s")),
    }
}

/// Check the reply and what the Pods saw against the case's expectation.
pub(super) fn judge(stubs: &[Stub], id: usize, case: &Case, reply: &Reply) -> Result<(), String> {
    let hits = seen_by(stubs, id);
    let pods: Vec<u64> = hits.iter().map(|(p, _)| *p).collect();
    let got = format!(
        "got status {} ({}), reached Pods {pods:?}",
        reply.status,
        message(&reply.body).chars().take(160).collect::<String>()
    );
    match &case.expect {
        Expect::Pod(pod) => {
            if pods != [*pod] {
                return Err(got);
            }
            if reply.status != 200 || reply.body != format!("{{\"pod\":{pod}}}") {
                return Err(format!("{got}; the Pod's reply did not come back"));
            }
            let seen = &hits[0].1;
            if seen.method != case.req.method || seen.path != case.req.target {
                return Err(format!(
                    "forwarded as {} {} instead of as received ({} {})",
                    seen.method, seen.path, case.req.method, case.req.target
                ));
            }
            if seen.body != case.req.body {
                return Err(format!(
                    "body changed: {}",
                    first_difference(&seen.body, &case.req.body)
                ));
            }
            for h in &case.stripped {
                if seen.headers.contains_key(*h) {
                    return Err(format!("hop-by-hop header {h} was forwarded"));
                }
            }
            Ok(())
        }
        Expect::Refused(status, reason) => {
            let msg = message(&reply.body);
            // `a|b`: either reason is acceptable.
            let reason_ok = reason.split('|').any(|r| msg.contains(r));
            if reply.status != *status || !pods.is_empty() || !reason_ok {
                return Err(got);
            }
            Ok(())
        }
    }
}

/// The long GitLab citations, printed once under a failure list.
const LEGEND: &[(&str, &str)] = &[
    ("RUNNER_AUTH", RUNNER_AUTH),
    ("JOB_AUTH", JOB_AUTH),
    ("API_AUTH", API_AUTH),
    ("GIT_AUTH", GIT_AUTH),
    ("PATH_RULES", PATH_RULES),
    ("HOP_BY_HOP", HOP_BY_HOP),
    ("RACK_MULTIPART", RACK_MULTIPART),
];

/// A case's GitLab explanation with the long citations replaced by their tags.
fn abbreviate(text: &str) -> String {
    LEGEND.iter().fold(text.to_owned(), |t, (tag, long)| {
        t.replace(long, &format!("[{tag}]"))
    })
}

/// Run every case (8 at a time) and fail with the list of all that failed.
pub(super) async fn run_all(port: u16, stubs: &[Stub], cases: Vec<Case>, first_id: usize) {
    let total = cases.len();
    let limit = Arc::new(Semaphore::new(8));
    let stubs: Arc<Vec<Stub>> = Arc::new(stubs.to_vec());
    let mut tasks = Vec::new();
    for (i, case) in cases.into_iter().enumerate() {
        let id = first_id + i;
        let (limit, stubs) = (limit.clone(), stubs.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let result = run(port, &stubs, id, &case).await;
            (id, case, result)
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        let (id, case, result) = t.await.unwrap();
        if let Err(e) = result {
            failures.push(format!(
                "[{id}] {}\n      expected: {}; {e}\n      GitLab: {}",
                case.name,
                case.expect.describe(),
                abbreviate(&case.gitlab)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} GitLab-fidelity cases fail:\n{}\n\nGitLab sources cited above:\n{}",
        failures.len(),
        failures.join("\n"),
        LEGEND
            .iter()
            .map(|(tag, text)| format!("  [{tag}] {text}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
