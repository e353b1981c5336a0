//! Which claim a request's path names, as GitLab's HTTP Router reads it before any
//! token: `/o/<organization>/…` an organization's path, `/<top-level
//! namespace>/…` a namespace's route, unless the first segment is one of Rails'
//! own top-level routes.

/// A path's claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PathClaim {
    /// `/<namespace>/…`: the top-level namespace's route (GitLab's router asks for
    /// `[{route}, {redirectRoute}]`, so an old path that redirects resolves too).
    Route(String),
    /// `/o/<organization>/…`: the organization's path.
    Organization(String),
}

/// Rails' top-level routes: a first segment that no namespace can take
/// (`Gitlab::PathRegex::TOP_LEVEL_ROUTES`, `lib/gitlab/path_regex.rb` in
/// gitlabhq/gitlabhq at 03b596d47dd85b115bf605c1e27f9d044ed8a256), and the routes
/// since added at the top level that GitLab's HTTP Router guards from its route
/// snapshot (`config/routing/gitlab_routes.json` in gitlabhq/gitlabhq at
/// 0739b8bfefeec6f2a70684c5e3dbe47c82c0acbd): `rails`, `cable`, `o`,
/// `organizations`, `sitemap`, `v2` (the dependency proxy's registry API). Every
/// literal first segment of that snapshot is here (the table test in
/// `tests/topology_service/snapshot.rs` checks it). `[topology_service] reserved`
/// adds more.
pub const RESERVED: &[&str] = &[
    "-",
    ".well-known",
    "404.html",
    "422.html",
    "500.html",
    "502.html",
    "503.html",
    "abuse_reports",
    "admin",
    "api",
    "apple-touch-icon-precomposed.png",
    "apple-touch-icon.png",
    "assets",
    "autocomplete",
    "cable",
    "ci",
    "dashboard",
    "deploy.html",
    "explore",
    "favicon.ico",
    "favicon.png",
    "files",
    "groups",
    "header_logo_dark.png",
    "header_logo_light.png",
    "health_check",
    "help",
    "import",
    "invites",
    "jwt",
    "koding",
    "notification_settings",
    "o",
    "oauth",
    "organizations",
    "profile",
    "projects",
    "public",
    "rails",
    "robots.txt",
    "s",
    "search",
    "sent_notifications",
    "sitemap",
    "slash-command-logo.png",
    "snippets",
    "u",
    "unsubscribes",
    "uploads",
    "users",
    "v2",
];

/// Formats Rails serves a namespace's last path segment in (`/gitlab-org.atom`,
/// `/users/john.doe.json`): stripped once, at the last dot, from the segment the
/// claim is read from when it ends the path. Only these: a dot is legal inside a
/// path (`/john.doe`).
const FORMATS: &[&str] = &["json", "atom", "rss", "xml", "html", "ics", "txt", "csv"];

/// Rails' routes that put a literal suffix on a username, `/:username.keys` and
/// `/:username.gpg` (`config/routes/user.rb` in gitlabhq/gitlabhq), each with a
/// format after it too (`/john.doe.keys.json`): the claim is the username.
const USER_SUFFIXES: &[&str] = &["keys", "gpg"];

/// The claim `path` (without its query) names, if any: `None` for `/`, a reserved
/// first segment (case-insensitively, as Rails' guard is), or one that is not a
/// namespace path (`Gitlab::PathRegex::NAMESPACE_FORMAT_REGEX`: letters, digits,
/// `_`, `-`, `.`, not starting with `-`, not ending in `.git` or `.atom`).
pub fn path_claim(path: &str, extra_reserved: &[String]) -> Option<PathClaim> {
    let mut segments = path.strip_prefix('/')?.split('/');
    let first = segments.next()?;
    let second = segments.clone().next();
    let reserved = |s: &str| {
        RESERVED.iter().any(|r| r.eq_ignore_ascii_case(s))
            || extra_reserved.iter().any(|r| r.eq_ignore_ascii_case(s))
    };
    if first == "o" {
        let org = second.filter(|s| !s.is_empty())?;
        let last = segments.nth(1).is_none();
        return namespace(org, last).map(PathClaim::Organization);
    }
    if first.is_empty() || reserved(first) {
        return None;
    }
    let last = second.is_none();
    let name = namespace(first, last)?;
    // `/gitlab-org.atom` is the group `gitlab-org`'s feed; `/api.json` still Rails'.
    if reserved(&name) {
        return None;
    }
    Some(PathClaim::Route(name))
}

/// `name` without its last `.suffix` when that is one of `suffixes`.
fn strip<'a>(name: &'a str, suffixes: &[&str]) -> &'a str {
    match name.rsplit_once('.') {
        Some((rest, suffix)) if suffixes.contains(&suffix) => rest,
        _ => name,
    }
}

/// `segment` as a namespace path: when it ends the request's path, one known
/// format suffix removed, then a username's `.keys` or `.gpg`.
fn namespace(segment: &str, last: bool) -> Option<String> {
    let name = if last {
        strip(strip(segment, FORMATS), USER_SUFFIXES)
    } else {
        segment
    };
    let valid = !name.is_empty()
        && !name.starts_with('-')
        && !name.ends_with(".git")
        && !name.ends_with(".atom")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    valid.then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(p: &str) -> Option<PathClaim> {
        path_claim(p, &[])
    }

    /// Examples shaped as Rails' route snapshot writes them (`example`,
    /// `dottedExample` and their `.json` variants): every variant of one template
    /// names the same claim.
    #[test]
    fn snapshot_examples_name_their_namespace() {
        let r = |s: &str| Some(PathClaim::Route(s.into()));
        for (path, want) in [
            ("/foo/bar", r("foo")),
            ("/foo/bar.json", r("foo")),
            ("/john.doe/bar", r("john.doe")),
            ("/john.doe/bar.json", r("john.doe")),
            ("/foo/bar/foo", r("foo")),
            ("/john.doe/bar/john.doe", r("john.doe")),
            ("/foo/bar/foo/-/archive/foo/bar", r("foo")),
            ("/gitlab-org/gitlab.git/info/refs", r("gitlab-org")),
            ("/gitlab-org", r("gitlab-org")),
            ("/gitlab-org.atom", r("gitlab-org")),
            ("/john.doe", r("john.doe")),
            ("/john.doe.json", r("john.doe")),
            ("/Gitlab-Org/x", r("Gitlab-Org")),
            ("/john.doe.keys", r("john.doe")),
            ("/foo.gpg.json", r("foo")),
            ("/foo.keys/x", r("foo.keys")),
        ] {
            assert_eq!(route(path), want, "{path}");
        }
        let o = |s: &str| Some(PathClaim::Organization(s.into()));
        assert_eq!(route("/o/foo/groups/foo/bar/-/boards/foo"), o("foo"));
        assert_eq!(route("/o/john.doe/groups/john.doe/bar"), o("john.doe"));
        assert_eq!(route("/o/swh"), o("swh"));
        assert_eq!(route("/o/swh.json"), o("swh"));
    }

    #[test]
    fn rails_own_routes_and_non_namespaces_name_none() {
        for path in [
            "/",
            "",
            "/api/v4/projects/foo/resource_groups/foo",
            "/API/v4/user",
            "/-/jira/foo/bar/foo",
            "/users/sign_in",
            "/rails/info",
            "/api.json",
            "/o/",
            "/o",
            "/-foo/bar",
            "/foo%2Fbar/x",
            "/a b/c",
            "/foo.git/info/refs",
            "/robots.txt",
            "/v2/foo/bar/dependency_proxy/containers/foo/bar/blobs/foo",
            "/sitemap.json",
        ] {
            assert_eq!(route(path), None, "{path}");
        }
        assert_eq!(
            path_claim("/healthz/x", &["healthz".into()]),
            None,
            "configured"
        );
    }
}
