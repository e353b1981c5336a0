//! `topology-service.toml`: where the service listens and the Cells it knows, as
//! GitLab's Topology Service configures them (`[[cells]]` with `id`, `address`,
//! `session_prefix` and `sequence_ranges`).
//!
//! ```toml
//! listen = "127.0.0.1:9096"
//!
//! [[cells]]
//! id = 1
//! address = "cell-1.example.com:443"
//! session_prefix = "cell-1"
//! sequence_ranges = [{ minval = 1, maxval = 999999999999 }]
//! ```
//!
//! The first Cell listed answers `FIRST_CELL` (the legacy Cell, where whatever no
//! claim places lives). With `[tls]` (`cert`, `key`, `client_ca`) every caller
//! shows a client certificate naming its role ([`crate::tls`]); without it,
//! `listen` must be a loopback address, where every caller counts as an
//! administrator.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is invalid; every problem is listed, each naming its field.
    #[error("invalid topology service configuration in {origin}: {}", problems.join("; "))]
    Invalid {
        /// The file.
        origin: String,
        /// Each problem.
        problems: Vec<String>,
    },
}

/// The whole configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// gRPC (h2c) and the REST mapping (HTTP/1.1), on one port.
    pub listen: SocketAddr,
    /// The Cells, the first one answering `FIRST_CELL`.
    pub cells: Vec<CellConfig>,
    /// Where claims are kept.
    #[serde(default)]
    pub claims: ClaimsConfig,
    /// Mutual TLS ([`crate::tls`]): callers identified by their certificates.
    /// Without it, the listener must be a loopback address.
    #[serde(default)]
    pub tls: Option<crate::tls::TlsConfig>,
}

/// `[claims]`: where claims are kept, written as the registry's backends are:
/// `backend = { kind = "memory" }` (the default: lost with the process),
/// `{ kind = "redis", url = "redis://host:port" }` or `{ kind = "redis-cluster",
/// nodes = ["redis://host:port", …] }`; keys under `key_prefix` (`P:{ts}:…`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsConfig {
    /// The backend.
    #[serde(default)]
    pub backend: podgate_registry::BackendConfig,
    /// Prefix of every Redis key.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        ClaimsConfig {
            backend: podgate_registry::BackendConfig::Memory,
            key_prefix: default_prefix(),
        }
    }
}

fn default_prefix() -> String {
    "podgate".into()
}

/// One Cell.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellConfig {
    /// GitLab's `cell.id`: what Rails sends as `cell_id`, and routable tokens carry.
    pub id: i64,
    /// Where a classified request goes: `host:port` or a bare host, no scheme or path
    /// (clients such as gitlab-shell take the host and add their own port).
    pub address: String,
    /// The prefix of the Cell's session ids (`cell-<id>`, Rails'
    /// `session_cookie_token_prefix`): `SESSION_PREFIX` classification.
    pub session_prefix: String,
    /// The Cell's ranges of database ids, inclusive, which Rails applies to its
    /// sequences once at bootstrap.
    #[serde(default)]
    pub sequence_ranges: Vec<SequenceRange>,
}

/// Inclusive `[minval, maxval]`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SequenceRange {
    /// First id.
    pub minval: i64,
    /// Last id.
    pub maxval: i64,
}

impl Config {
    /// Parses and validates `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, Error> {
        let config: Config = toml::from_str(text).map_err(|e| Error::Invalid {
            origin: origin.to_owned(),
            problems: vec![e.to_string()],
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Reads, parses and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Every problem, each naming its field (`cells[1].session_prefix`).
    pub fn validate(&self, origin: &str) -> Result<(), Error> {
        let mut bad = Vec::new();
        if !self.listen.ip().is_loopback() && self.tls.is_none() {
            bad.push(format!(
                "listen = \"{}\": a loopback address, or set [tls]: without mutual TLS \
                 every caller counts as an administrator",
                self.listen
            ));
        }
        if let Some(t) = &self.tls {
            for (field, path) in [
                ("cert", &t.cert),
                ("key", &t.key),
                ("client_ca", &t.client_ca),
            ] {
                if !path.is_file() {
                    bad.push(format!("tls.{field} = {}: no such file", path.display()));
                }
            }
        }
        match &self.claims.backend {
            podgate_registry::BackendConfig::Redis { url } if !url.starts_with("redis") => {
                bad.push(format!("claims.backend.url = {url:?}: redis://host:port"));
            }
            podgate_registry::BackendConfig::RedisCluster { nodes } if nodes.is_empty() => {
                bad.push("claims.backend.nodes: at least one seed node".into());
            }
            _ => {}
        }
        if self.key_prefix_invalid() {
            bad.push(format!(
                "claims.key_prefix = {:?}: letters, digits, '-', '_' and ':'",
                self.claims.key_prefix
            ));
        }
        if self.cells.is_empty() {
            bad.push("cells: at least one Cell (the first answers FIRST_CELL)".to_owned());
        }
        let mut ranges: Vec<(i64, i64, usize)> = Vec::new();
        for (i, c) in self.cells.iter().enumerate() {
            let at = format!("cells[{i}]");
            if c.id <= 0 {
                bad.push(format!("{at}.id = {}: a positive Cell id", c.id));
            }
            if self.cells[..i].iter().any(|o| o.id == c.id) {
                bad.push(format!("{at}.id = {}: another Cell has it", c.id));
            }
            if !valid_address(&c.address) {
                bad.push(format!(
                    "{at}.address = {:?}: host or host:port, no scheme or path",
                    c.address
                ));
            }
            if c.session_prefix.is_empty()
                || !c
                    .session_prefix
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                bad.push(format!(
                    "{at}.session_prefix = {:?}: letters, digits, '-' and '_', such as \"cell-{}\"",
                    c.session_prefix, c.id
                ));
            }
            if self.cells[..i]
                .iter()
                .any(|o| o.session_prefix == c.session_prefix)
            {
                bad.push(format!(
                    "{at}.session_prefix = {:?}: another Cell has it",
                    c.session_prefix
                ));
            }
            for (j, r) in c.sequence_ranges.iter().enumerate() {
                if r.minval <= 0 || r.maxval < r.minval {
                    bad.push(format!(
                        "{at}.sequence_ranges[{j}]: 0 < minval <= maxval ({}..{})",
                        r.minval, r.maxval
                    ));
                } else if let Some((_, _, other)) = ranges
                    .iter()
                    .find(|(lo, hi, _)| r.minval <= *hi && *lo <= r.maxval)
                {
                    bad.push(format!(
                        "{at}.sequence_ranges[{j}]: overlaps cells[{other}]'s ({}..{})",
                        r.minval, r.maxval
                    ));
                }
                ranges.push((r.minval, r.maxval, i));
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid {
                origin: origin.to_owned(),
                problems: bad,
            })
        }
    }
}

impl Config {
    fn key_prefix_invalid(&self) -> bool {
        let p = &self.claims.key_prefix;
        p.is_empty()
            || !p
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':'))
    }
}

/// `host` or `host:port`: what GitLab's clients accept in `proxy.address` (mail
/// room takes a hostname or IPv4 address with an optional port; gitlab-shell strips
/// the port and refuses `/`).
fn valid_address(a: &str) -> bool {
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (a, None),
    };
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_file_parses_and_problems_name_their_fields() {
        let ok = Config::parse(
            "listen = '127.0.0.1:0'\n[[cells]]\nid = 1\naddress = 'cell-1.example.com:443'\n\
             session_prefix = 'cell-1'\nsequence_ranges = [{ minval = 1, maxval = 99 }]\n\
             [[cells]]\nid = 2\naddress = 'cell-2.example.com'\nsession_prefix = 'cell-2'\n\
             sequence_ranges = [{ minval = 100, maxval = 199 }]",
            "t",
        )
        .unwrap();
        assert_eq!(ok.cells[1].address, "cell-2.example.com");
        let err = Config::parse(
            "listen = '127.0.0.1:0'\n[[cells]]\nid = 1\naddress = 'https://x/'\n\
             session_prefix = 'cell 1'\nsequence_ranges = [{ minval = 1, maxval = 99 }]\n\
             [[cells]]\nid = 1\naddress = 'y:0'\nsession_prefix = 'cell-2'\n\
             sequence_ranges = [{ minval = 50, maxval = 199 }]",
            "t",
        )
        .unwrap_err()
        .to_string();
        for field in [
            "cells[0].address",
            "cells[0].session_prefix",
            "cells[1].id = 1: another Cell",
            "cells[1].address",
            "cells[1].sequence_ranges[0]: overlaps cells[0]",
        ] {
            assert!(err.contains(field), "{field}: {err}");
        }
        let none = Config::parse("listen = '0.0.0.0:9096'\ncells = []", "t")
            .unwrap_err()
            .to_string();
        assert!(none.contains("cells: at least one"), "{none}");
        assert!(
            none.contains("listen = \"0.0.0.0:9096\": a loopback address"),
            "{none}"
        );
    }
}
