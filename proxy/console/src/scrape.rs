//! One scrape of a `/metrics` endpoint over HTTP/1.1, as Prometheus scrapes it:
//! `GET` with `Accept: text/plain;version=0.0.4`, an optional bearer token read
//! from a file at each scrape (so a rotated token is picked up), a deadline.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use thiserror::Error;

use super::exposition::{self, Sample};

/// The most a scrape may return (Prometheus's `body_size_limit` is unlimited by
/// default; the console keeps itself bounded).
const MAX_BODY: usize = 16 << 20;

/// A failed scrape. Transient: the next interval tries again.
#[derive(Debug, Error)]
pub enum ScrapeError {
    /// The bearer token file could not be read.
    #[error("reading the bearer token file {path}: {source}")]
    Token {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Connecting or reading failed.
    #[error("{0}")]
    Http(String),
    /// An answer other than 200.
    #[error("HTTP {0}")]
    Status(u16),
    /// The body is not the text format.
    #[error("not the text format: {0}")]
    Parse(#[from] exposition::ParseError),
}

/// An HTTP client for scrapes (one connection pool for all sources).
#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for Scraper {
    fn default() -> Self {
        Scraper {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build_http(),
        }
    }
}

impl Scraper {
    /// Scrape `url`: its samples, histogram buckets left out.
    pub async fn scrape(
        &self,
        url: &http::Uri,
        bearer_token_file: Option<&Path>,
        deadline: Duration,
    ) -> Result<Vec<Sample>, ScrapeError> {
        let mut req = http::Request::get(url.clone())
            .header(http::header::ACCEPT, "text/plain;version=0.0.4")
            .header(http::header::USER_AGENT, "podgate-console");
        if let Some(path) = bearer_token_file {
            let token = std::fs::read_to_string(path).map_err(|source| ScrapeError::Token {
                path: path.display().to_string(),
                source,
            })?;
            req = req.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| ScrapeError::Http(e.to_string()))?;
        let fetch = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| ScrapeError::Http(e.to_string()))?;
            if resp.status() != http::StatusCode::OK {
                return Err(ScrapeError::Status(resp.status().as_u16()));
            }
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| ScrapeError::Http(e.to_string()))?
                .to_bytes();
            Ok(body)
        };
        let body = tokio::time::timeout(deadline, fetch)
            .await
            .map_err(|_| ScrapeError::Timeout(deadline))??;
        let text = String::from_utf8_lossy(&body);
        Ok(exposition::parse(&text, keep)?)
    }
}

/// What the console keeps of a scrape: not histogram buckets (the page shows
/// rates and counts, and buckets are most of a scrape's lines).
pub fn keep(name: &str) -> bool {
    !name.ends_with("_bucket")
}
