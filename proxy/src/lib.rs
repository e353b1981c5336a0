//! # podgate-proxy
//!
//! The pingora edge router: it reads the runner, job or agent token of each request,
//! classifies it with `podgate-tokens`, and sends the request to the Pod (or that Pod's
//! kas) the token names.
//!
//! Not built yet: issue 4 fills this crate.
