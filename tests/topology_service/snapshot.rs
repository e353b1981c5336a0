//! The paths of GitLab's own route snapshot (`gitlab_routes.tsv`: a selection of
//! `config/routing/gitlab_routes.json` in gitlabhq/gitlabhq, which
//! `scripts/check-routes-snapshot.sh` checks against the original) through the
//! proxy's path rules, as GitLab's HTTP Router replays them: each route's `example`
//! and `dottedExample`, and their `.json` variants where the route takes a format.
//!
//! The Topology Service holds the namespaces the examples name (`foo`, `john.doe`)
//! on Cell 2, the organizations of the same names on Cell 3, and, as a trap, every
//! top-level word of the snapshot as a namespace on Cell 3 (Rails would never
//! claim one; a word the proxy failed to guard would reach Cell 3 by it). A route
//! whose path starts with a parameter must reach Pod 2 as a `route` claim, an
//! organization's route Pod 3 as an `organizationPath` claim, and a route under a
//! top-level word no claim at all: the default Pod, Pod 1, by the rules after.

use std::collections::BTreeSet;

use podgate_topology_service::proto::gitlab::cells::topology_service::claims::v1::bucket::Type;

use crate::common::{send, start_proxy};

/// One route of the snapshot.
struct Route {
    template: &'static str,
    example: &'static str,
    accepts_format: bool,
    dotted: Option<&'static str>,
}

fn routes() -> Vec<Route> {
    include_str!("gitlab_routes.tsv")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 4, "{l}");
            Route {
                template: f[0],
                example: f[1],
                accepts_format: f[2] == "1",
                dotted: (f[3] != "-").then_some(f[3]),
            }
        })
        .collect()
}

/// A template's top-level word: its first segment when that is literal.
fn word(template: &str) -> Option<&str> {
    if template.starts_with('(') {
        return None;
    }
    let first = template[1..].split('/').next()?.split('(').next()?;
    (!first.contains([':', '*'])).then_some(first)
}

/// What GitLab's HTTP Router makes of a route's paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// A top-level word: no claim; the rules after decide.
    Guarded,
    /// The first segment names a namespace (a `route` claim).
    Route,
    /// An organization's path (an `organizationPath` claim).
    Organization,
}

fn want(r: &Route, words: &BTreeSet<&str>) -> Want {
    if r.template.starts_with("/o/:organization_path") {
        return Want::Organization;
    }
    let first = r.example[1..].split(['/', '?']).next().unwrap_or("");
    if words.contains(first) {
        Want::Guarded
    } else {
        Want::Route
    }
}

#[test]
fn every_top_level_word_of_the_snapshot_is_guarded() {
    let routes = routes();
    let words: BTreeSet<&str> = routes.iter().filter_map(|r| word(r.template)).collect();
    assert!(words.len() >= 20, "{words:?}");
    for w in words.iter().filter(|w| !w.is_empty()) {
        assert!(
            podgate_proxy::claims::path::RESERVED
                .iter()
                .any(|r| r.eq_ignore_ascii_case(w)),
            "{w} is a top-level route of Rails and not guarded"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshots_paths_reach_the_cell_of_their_claim() {
    let routes = routes();
    let words: BTreeSet<&str> = routes.iter().filter_map(|r| word(r.template)).collect();
    let ts = super::start();
    super::claim(&ts, 2, &[(Type::Routes, "foo"), (Type::Routes, "john.doe")]).await;
    let mut cell_3: Vec<(Type, &str)> = vec![
        (Type::OrganizationPath, "foo"),
        (Type::OrganizationPath, "john.doe"),
    ];
    cell_3.extend(
        words
            .iter()
            .filter(|w| !w.is_empty())
            .map(|w| (Type::Routes, *w)),
    );
    super::claim(&ts, 3, &cell_3).await;
    let pods3 = super::proxy::three_pods().await;
    let stubs = [&pods3[0], &pods3[1], &pods3[2]];
    let config = format!(
        "[topology_service]\naddress = \"{}\"\n{}",
        ts.addr,
        super::proxy::pods(&stubs)
    );
    let proxy = start_proxy(&config, tempfile::tempdir().unwrap()).await;

    let mut asked = 0;
    let mut kinds = [0usize; 3];
    for r in &routes {
        let want = want(r, &words);
        kinds[want as usize] += 1;
        let mut paths = vec![r.example.to_owned()];
        paths.extend(r.dotted.map(str::to_owned));
        if r.accepts_format {
            let json: Vec<String> = paths.iter().map(|p| format!("{p}.json")).collect();
            paths.extend(json);
        }
        for path in paths {
            asked += 1;
            let id = asked.to_string();
            let (status, _, body) = send(
                proxy.port,
                &format!("GET {path} HTTP/1.1\r\nx-test-id: {id}"),
                b"",
            )
            .await;
            let seen_by: Vec<(u64, String, String)> = stubs
                .iter()
                .filter_map(|s| {
                    let seen = s.seen();
                    let req = seen
                        .iter()
                        .find(|q| q.headers.get("x-test-id") == Some(&id))?;
                    let h = |n: &str| req.headers.get(n).cloned().unwrap_or_default();
                    Some((
                        s.pod,
                        h("x-gitlab-http-router-rule-action"),
                        h("x-gitlab-http-router-rule-type"),
                    ))
                })
                .collect();
            let what = format!("{path} ({}): {status} {body}", r.template);
            match want {
                Want::Route => {
                    assert_eq!(seen_by, [(2, "classify".into(), "route".into())], "{what}")
                }
                Want::Organization => assert_eq!(
                    seen_by,
                    [(3, "classify".into(), "organizationPath".into())],
                    "{what}"
                ),
                // Pod 1 by the rules after path rules, or an answer of the proxy's
                // own (a rule that needs a token); never by a claim.
                Want::Guarded => assert!(
                    seen_by.is_empty() || seen_by == [(1, "proxy".into(), String::new())],
                    "{what}: {seen_by:?}"
                ),
            }
        }
    }
    assert!(
        kinds.iter().all(|&k| k > 0),
        "each kind of route is asked: {kinds:?}"
    );
    assert!(asked > 600, "{asked} paths");
}
