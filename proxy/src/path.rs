//! The path GitLab would serve for a request, for matching rules only: the request
//! itself is forwarded exactly as received.
//!
//! Two GitLab components decide which endpoint a path reaches, and the proxy must
//! match what they match, or a crafted path reaches an endpoint whose rule it did not
//! pass through:
//!
//! 1. **Workhorse** parses the URL with Go's `net/url` (so `URL.Path` is
//!    percent-decoded) and cleans it before routing
//!    (`workhorse/internal/upstream/routes.go`, `CleanURIPath` in
//!    `workhorse/internal/helper/helpers.go`: Go's `path.Clean`, which squeezes `//`
//!    and resolves `.` and `..`, with a trailing `/` kept).
//! 2. **Grape** then normalises what Rails receives (`Grape::Router.normalize_path`
//!    in `lib/grape/router.rb`: `//` squeezed, trailing `/` dropped) and every GitLab
//!    API route accepts an optional format suffix, `(.json)`
//!    (`lib/api/api.rb`: `format :json`; Grape's route pattern `…(.:format)`).
//!
//! [`normalize`] applies all of that; rules match its result.

use std::borrow::Cow;

/// The path a rule matches: percent-decoded, cleaned like Workhorse, without a
/// trailing `/` or a `.json` suffix like Grape. Borrows when nothing changes (the
/// common case costs one scan).
pub fn normalize(path: &str) -> Cow<'_, str> {
    if is_plain(path) {
        return Cow::Borrowed(path);
    }
    // `%XX` decoded (Go's `URL.Path`). An invalid escape is kept as it is: Go would
    // refuse the whole request with 400, so nothing is served for it either way.
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let mut cleaned = clean(&decoded);
    // Grape: trailing slashes dropped, then an optional `.json` format suffix.
    while cleaned.len() > 1 && cleaned.ends_with('/') {
        cleaned.pop();
    }
    if let Some(stem) = cleaned.strip_suffix(".json")
        && !stem.is_empty()
        && !stem.ends_with('/')
    {
        cleaned.truncate(stem.len());
    }
    Cow::Owned(cleaned)
}

/// Nothing to decode, squeeze, clean or strip.
fn is_plain(path: &str) -> bool {
    let b = path.as_bytes();
    b.first() == Some(&b'/')
        && (b.len() == 1 || b[b.len() - 1] != b'/')
        && !b.contains(&b'%')
        && !path.contains("//")
        && !path.contains("/.")
        && !path.ends_with(".json")
}

/// Go's `path.Clean` on a rooted path, with a trailing `/` kept (Workhorse's
/// `CleanURIPath`): `//` squeezed, `.` dropped, `..` removes the segment before it
/// and never climbs above the root.
fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len() + 1);
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    let trailing = path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..");
    if out.is_empty() || trailing {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn gitlab_path_forms() {
        for (raw, want) in [
            ("/api/v4/jobs/request", "/api/v4/jobs/request"),
            ("/api/v4/jobs/1//", "/api/v4/jobs/1"),
            ("/api/v4/jobs/1/", "/api/v4/jobs/1"),
            ("//api//v4/jobs/request", "/api/v4/jobs/request"),
            ("/api/v4/jobs/request.json", "/api/v4/jobs/request"),
            ("/api/v4/jobs/1.json/", "/api/v4/jobs/1"),
            ("/api/v4/jobs/1/./trace", "/api/v4/jobs/1/trace"),
            ("/api/v4/runners/x/../verify", "/api/v4/runners/verify"),
            ("/api/v4/jobs/%72equest", "/api/v4/jobs/request"),
            ("/api/v4/jobs/1/%2e%2e/request", "/api/v4/jobs/request"),
            ("/../../api/v4/jobs/request", "/api/v4/jobs/request"),
            ("/", "/"),
            ("/.json", "/.json"),
            ("/g/p.git/info/refs", "/g/p.git/info/refs"),
            ("/bad%zzescape", "/bad%zzescape"),
            ("/api/v4/jobs/%+1equest", "/api/v4/jobs/%+1equest"),
        ] {
            assert_eq!(normalize(raw), want, "{raw}");
        }
    }

    #[test]
    fn plain_paths_are_borrowed() {
        assert!(matches!(
            normalize("/api/v4/jobs/request"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
