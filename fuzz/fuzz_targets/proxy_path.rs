//! Path normalisation for rule matching (`podgate_proxy::path::normalize`).
//!
//! - nothing panics; a borrowed result is the input unchanged;
//! - the result is rooted, has no empty, `.` or `..` segment and no trailing `/`
//!   (but `/` itself), except where Grape's `.json` strip leaves one behind;
//! - normalising is idempotent: `normalize(normalize(p)) == normalize(p)`, except
//!   where the result holds a `%` (percent-decoding twice would be a bug: Workhorse
//!   decodes once) or is itself changed by Grape's one `.json` strip (`/a.json.json`
//!   is `/a.json` to Grape; `/x/...json` is `/x/..`).

use std::borrow::Cow;

use podgate_proxy::path::normalize;

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let once = normalize(path);
    if let Cow::Borrowed(b) = &once {
        assert_eq!(*b, path);
    }
    assert!(once.starts_with('/'), "{path:?} -> {once:?}");
    assert!(once == "/" || !once.ends_with('/'), "{path:?} -> {once:?}");
    // What only the `.json` strip can produce: a last segment that became `.`/`..`
    // or that ends `.json` again.
    let last = once.rsplit('/').next().unwrap_or("");
    let json_left = once.ends_with(".json") || last == "." || last == "..";
    if !json_left {
        assert!(
            once[1..]
                .split('/')
                .all(|s| !matches!(s, "." | "..") && (s.is_empty() == (once == "/"))),
            "{path:?} -> {once:?}"
        );
    }
    if !once.contains('%') && !json_left {
        let twice = normalize(&once);
        assert_eq!(twice, once, "{path:?}");
    }
}
