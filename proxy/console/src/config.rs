//! `[console]` in `proxy.toml`: what the console scrapes and how often.

use std::path::PathBuf;

use serde::Deserialize;

/// `[console]` in `proxy.toml`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console on the admin listener (default false).
    #[serde(default)]
    pub enabled: bool,
    /// Milliseconds between scrapes, and so between events (default 1000, 100 to
    /// 60000).
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Other processes whose `/metrics` the page shows.
    #[serde(default)]
    pub sources: Vec<SourceConfig>,
}

/// One scraped process.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Its name on the page (unique; `proxy` is the proxy itself).
    pub name: String,
    /// Its metrics URL (`http://host:port/metrics`).
    pub url: String,
    /// A file holding a bearer token for it (kas's `observability.prometheus`
    /// token), read at each scrape.
    #[serde(default)]
    pub bearer_token_file: Option<PathBuf>,
    /// Labels added to every sample of this source, as Prometheus adds a target's
    /// labels (`static_configs: labels:`), replacing a scraped label of the same
    /// name: `labels = { pod = "2" }` says which Pod a kas serves.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

fn default_interval() -> u64 {
    1000
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: false,
            interval_ms: default_interval(),
            sources: Vec::new(),
        }
    }
}

impl ConsoleConfig {
    /// Every problem, each naming its field (`console.…`).
    pub fn problems(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if !(100..=60_000).contains(&self.interval_ms) {
            bad.push(format!(
                "console.interval_ms = {}: between 100 and 60000",
                self.interval_ms
            ));
        }
        let mut names = std::collections::BTreeSet::from(["proxy"]);
        for (i, s) in self.sources.iter().enumerate() {
            if s.name.is_empty() || !names.insert(s.name.as_str()) {
                bad.push(format!(
                    "console.sources[{i}].name = {:?}: a unique, non-empty name other than \"proxy\"",
                    s.name
                ));
            }
            match s.url.parse::<http::Uri>() {
                Ok(u) if u.scheme_str() == Some("http") && u.authority().is_some() => {}
                _ => bad.push(format!(
                    "console.sources[{i}].url = {:?}: expected http://host:port/path",
                    s.url
                )),
            }
            for name in s.labels.keys() {
                if !is_label_name(name) {
                    bad.push(format!(
                        "console.sources[{i}].labels.{name:?}: a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not __-prefixed)"
                    ));
                }
            }
            if let Some(p) = &s.bearer_token_file
                && !p.is_file()
            {
                bad.push(format!(
                    "console.sources[{i}].bearer_token_file = {}: no such file",
                    p.display()
                ));
            }
        }
        bad
    }
}

/// A label name Prometheus accepts for a target label (`__` names are reserved).
fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_fields() {
        let c: ConsoleConfig = toml::from_str(
            r#"
            interval_ms = 5
            [[sources]]
            name = "proxy"
            url = "ftp://x/metrics"
            [[sources]]
            name = "kas"
            url = "http://127.0.0.1:1/metrics"
            bearer_token_file = "/nonexistent/token"
            [[sources]]
            name = "kas"
            url = "http://127.0.0.1:2/metrics"
            labels = { pod = "1", "9x" = "no", __name__ = "no" }
            "#,
        )
        .unwrap();
        let p = c.problems();
        assert_eq!(p.len(), 7, "{p:#?}");
        for needle in [
            "console.interval_ms = 5",
            "console.sources[0].name = \"proxy\"",
            "console.sources[0].url",
            "console.sources[1].bearer_token_file",
            "console.sources[2].name = \"kas\"",
            "console.sources[2].labels.\"9x\"",
            "console.sources[2].labels.\"__name__\"",
        ] {
            assert!(p.iter().any(|x| x.contains(needle)), "{needle}: {p:#?}");
        }
        assert!(
            toml::from_str::<ConsoleConfig>("enabled = true\nport = 1")
                .unwrap_err()
                .to_string()
                .contains("port")
        );
    }
}
