//! The Graph API's pure parts (the Graph API as gitlab-org/cli `internal/commands/cluster/graph/graph.go`, <https://docs.gitlab.com/cli/cluster/graph/>), shared by
//! kas (validating the request, encoding messages), agentk (evaluating queries and
//! filters), the `podgate graph` client and the tests. No I/O.
//!
//! - [`request`]: the client's request JSON and [`request::compile`], which validates
//!   it into a [`request::Compiled`] request;
//! - [`cel`]: CEL programs, compiled once, evaluated per resource or object;
//! - [`jsonpath`]: kubectl JSONPath templates (`json_path`) on an RFC 9535 engine;
//! - [`wire`]: the server → client JSON messages, and the proto → JSON encoding kas
//!   uses per `WatchGraphResponse` batch.

pub mod cel;
mod cel_json;
mod cel_syntax;
mod decode;
pub mod jsonpath;
pub mod request;
pub mod wire;
