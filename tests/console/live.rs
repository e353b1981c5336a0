//! The console stays live: a real Chromium holds the page open against `podgate up`
//! with its runner fleet and a churning cluster, in real time, and every few
//! seconds the page still says "live", its tables have moved on, and the graph's
//! stream is open, or was closed and opened again by the page itself, which says
//! why it closed.
//!
//! CI holds it [`DEFAULT_SECS`]; `PODGATE_CONSOLE_LIVE_SECS=300` holds it five
//! minutes (`cargo nextest run -E 'test(console_stays_live)'`).

use std::time::Duration;

use podgate_registry::testing::eventually;
use serde_json::Value;

use super::{cdp, field, up_on_free_ports};

/// How long CI holds the page.
const DEFAULT_SECS: u64 = 30;

/// Between two looks at the page: several console events (one a second) apart.
const LOOK: Duration = Duration::from_secs(5);

/// What the page shows at one look.
const STATE: &str = "JSON.stringify({ \
    status: document.getElementById('status').textContent, \
    events: podgateConsole.events, \
    disconnects: podgateConsole.disconnects, \
    graph: podgateConsole.graph.connected, \
    vertices: podgateConsole.graph.vertices.size, \
    closes: podgateConsole.graph.closes, \
    lastClose: podgateConsole.graph.lastClose, \
    stats: document.getElementById('graph-stats').textContent, \
    byPath: [...document.querySelectorAll('#pods td[data-k=by_path]')] \
      .map((td) => Number(td.textContent.replace(/,/g, ''))) })";

/// The page's state; `None` before its scripts have run.
async fn look(page: &cdp::Page<'_>) -> Option<Value> {
    let raw = page.eval(STATE).await.ok()?;
    serde_json::from_str(raw.as_str()?).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_stays_live_with_the_fleet_running() {
    let secs: u64 = std::env::var("PODGATE_CONSOLE_LIVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let (_up, printed, _, _) = up_on_free_ports(&[
        "--runners",
        "12",
        "--job-rate",
        "1",
        "--kube-objects",
        "500",
        "--kube-churn",
        "2",
    ]);
    let url = field(&printed, "console url=", "url");

    let browser = cdp::Browser::launch().await;
    let page = browser.page().await;
    page.navigate(&url).await;
    // Each Pod's path-routed count, once the fleet's first path-routed request has
    // reached the table.
    let by_path = |s: &Value| -> Vec<u64> {
        s["byPath"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let mut last = eventually(Duration::from_secs(60), "the page is live", || async {
        let s = look(&page).await?;
        let live = s["status"] == "live" && s["graph"] == true && s["vertices"].as_u64()? > 0;
        (live && by_path(&s).len() == 3).then_some(s)
    })
    .await;

    let first = last.clone();
    let started = tokio::time::Instant::now();
    let mut looks = tokio::time::interval_at(started + LOOK, LOOK);
    let mut reconnected = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        looks.tick().await;
        let now = look(&page).await.expect("the page answers");
        assert_eq!(now["status"], "live", "at {:?}: {now}", started.elapsed());
        assert_eq!(now["disconnects"], 0, "the event stream broke: {now}");
        assert!(
            now["events"].as_u64() > last["events"].as_u64(),
            "no event since the last look: {last} then {now}"
        );
        // A closed graph session is opened again by the page (2 s later), and the
        // page says why it closed.
        if now["closes"] != last["closes"] {
            let close = now["lastClose"].clone();
            assert!(
                now["stats"].as_str().is_some_and(|s| !s.is_empty()),
                "a close the page does not explain: {now}"
            );
            reconnected.push(close);
        }
        assert!(
            now["graph"] == true || now["closes"] != last["closes"],
            "the graph is closed and was not reopened: {last} then {now}"
        );
        last = now;
    }
    println!(
        "held {secs} s: {} events, graph sessions closed and reopened: {reconnected:?}",
        last["events"]
    );
    assert!(
        reconnected.is_empty(),
        "the graph's stream closed {} times: {reconnected:?}",
        reconnected.len()
    );
    // People browsing the Pods' pages (`podgate up` with its fleet): each Pod's
    // path-routed count moved on while the page was held.
    let (before, after) = (by_path(&first), by_path(&last));
    assert_eq!(after.len(), 3, "a by-path cell per Pod: {last}");
    assert!(
        before.len() == after.len() && before.iter().zip(&after).all(|(b, a)| a > b),
        "path-routed requests per Pod did not grow: {before:?} then {after:?}"
    );
    let errors = page.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
}
