//! An agent's configuration file (`config.yaml`) as GitLab's kas reads it: YAML
//! turned into JSON, then JSON into `agentcfg.ConfigurationFile` by protobuf's JSON
//! mapping, then the file's validation rules (`parseYAMLToConfiguration` and
//! `fetchConfiguration` in
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/internal/module/agent_configuration/server/server.go>;
//! the fields and rules in
//! <https://github.com/pluralsh/kubernetes-agent/blob/e02ad05f88598c93c414c52dd4a89e58a75adb4a/pkg/agentcfg/agentcfg.proto>).
//!
//! What that mapping decides, and this module does too:
//! - an empty file (YAML `null`) is the empty configuration; any other top level
//!   than a mapping is refused;
//! - a field GitLab does not know is refused (`protojson.Unmarshal` without
//!   `DiscardUnknown`); the names are the snake_case `json_name`s of GitLab's proto;
//! - a JSON `null` is the field's default; a string field takes only a string, a
//!   bool only a bool (no coercion from numbers);
//! - durations are protobuf JSON durations (`"90s"`, `"1.5s"`);
//! - enums take their name (`debug`) or number;
//! - a `oneof` (`ref`, `access_as`) takes at most one member, and where GitLab
//!   requires one (`validate.required`), one.
//!
//! Why hand-written mirror types rather than generated JSON code (`pbjson`): the
//! generated agentcfg types are shared with everyone (`podgate_agent::proto`), and
//! `pbjson` would need its own build step, runtime crates and well-known types
//! (`pbjson-types` in place of `prost-types`), for about 30 small messages; it also
//! accepts camelCase names GitLab refuses. serde (already built) and one `From`
//! per message cost nothing more to compile and follow GitLab's rules exactly.

#[path = "mirror.rs"]
mod mirror;

use podgate_agent::proto::gitlab::agent::agentcfg as cfg;

/// Why a configuration file was refused (a user error: GitLab answers it with
/// `FailedPrecondition`; retrying the same file cannot help).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not YAML, not a mapping, or a field of the wrong type or unknown.
    #[error("failed to parse agent configuration: {0}")]
    Parse(String),
    /// It parsed, but breaks one of GitLab's validation rules (every one listed).
    #[error("invalid agent configuration: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// The result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A parsed configuration file: the protobuf, and the JSON it came from (what kas
/// posts to GitLab).
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The configuration as GitLab's `ConfigurationFile`.
    pub file: cfg::ConfigurationFile,
    /// The YAML as JSON (`{}` for an empty file).
    pub json: serde_json::Value,
}

/// Parse `text` as GitLab parses `config.yaml`.
pub fn parse(text: &str) -> Result<Parsed> {
    let json = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_yaml::from_str::<serde_json::Value>(text)
            .map_err(|e| Error::Parse(format!("YAMLToJSON: {e}")))?
    };
    let json = match json {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        v @ serde_json::Value::Object(_) => v,
        _ => {
            return Err(Error::Parse(
                "the configuration must be a mapping".to_owned(),
            ));
        }
    };
    let mirror: mirror::FileCf = serde_json::from_value(json.clone())
        .map_err(|e| Error::Parse(format!("protojson.Unmarshal: {e}")))?;
    let mut bad = Vec::new();
    let file = mirror.into_proto(&mut bad);
    if bad.is_empty() {
        Ok(Parsed { file, json })
    } else {
        Err(Error::Invalid(bad))
    }
}

/// A protobuf JSON duration: decimal seconds with at most 9 fractional digits and
/// an `s` (`"10s"`, `"-1.5s"`).
fn duration(field: &str, s: &str, bad: &mut Vec<String>) -> Option<prost_types::Duration> {
    let parsed = (|| {
        let body = s.strip_suffix('s')?;
        let (neg, body) = match body.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        let (whole, frac) = body.split_once('.').unwrap_or((body, ""));
        if whole.is_empty()
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || frac.len() > 9
            || !frac.bytes().all(|b| b.is_ascii_digit())
            || (body.contains('.') && frac.is_empty())
        {
            return None;
        }
        let seconds: i64 = whole.parse().ok().filter(|s| *s <= 315_576_000_000)?;
        let nanos: i32 = format!("{frac:0<9}").parse().ok()?;
        Some(if neg {
            prost_types::Duration {
                seconds: -seconds,
                nanos: -nanos,
            }
        } else {
            prost_types::Duration { seconds, nanos }
        })
    })();
    if parsed.is_none() {
        bad.push(format!("{field}: {s:?} is not a duration (e.g. \"90s\")"));
    }
    parsed
}

/// `field` must be positive (`(validate.rules).duration = {gt: {}}`).
fn positive(field: &str, d: Option<prost_types::Duration>, bad: &mut Vec<String>) {
    if let Some(d) = d
        && (d.seconds < 0 || (d.seconds == 0 && d.nanos <= 0))
    {
        bad.push(format!("{field}: must be greater than 0s"));
    }
}

/// `(validate.rules).string.min_bytes = 1`.
fn non_empty(field: &str, s: &str, bad: &mut Vec<String>) {
    if s.is_empty() {
        bad.push(format!("{field}: must not be empty"));
    }
}

/// `(validate.rules).string = {in: [...]}`.
fn one_of(field: &str, s: &str, allowed: &[&str], bad: &mut Vec<String>) {
    if !allowed.contains(&s) {
        bad.push(format!("{field}: {s:?} is not one of {allowed:?}"));
    }
}

/// Every item of `list` non-empty (`repeated.items.string.min_bytes = 1`).
fn items_non_empty(field: &str, list: &[String], bad: &mut Vec<String>) {
    for (i, s) in list.iter().enumerate() {
        non_empty(&format!("{field}[{i}]"), s, bad);
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
