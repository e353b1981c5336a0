//! The service's metrics, on its own listener's `GET /metrics` (Prometheus text):
//! requests by method and gRPC code, the REST mapping's included.

use std::sync::LazyLock;

use prometheus::{Encoder as _, IntCounterVec, Opts, Registry, TextEncoder};

/// The metrics, registered once in [`REGISTRY`].
pub struct Metrics {
    /// `podgate_topology_service_requests_total{method,code}`: calls by method
    /// (`Classify`, `BeginUpdate`, …; `rest:Classify` for `POST /v1/classify`) and
    /// the gRPC code they ended with (`OK`, `NOT_FOUND`, `ALREADY_EXISTS`, …).
    pub requests: IntCounterVec,
}

/// This service's registry (apart from the process's default one).
pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

/// The metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let requests = IntCounterVec::new(
        Opts::new(
            "podgate_topology_service_requests_total",
            "Topology Service calls by method and gRPC code.",
        ),
        &["method", "code"],
    )
    .expect("a valid metric");
    REGISTRY
        .register(Box::new(requests.clone()))
        .expect("registered once");
    Metrics { requests }
});

/// Counts a call of `method` that ended as `result`, and passes it on.
pub fn counted<T>(method: &str, result: Result<T, tonic::Status>) -> Result<T, tonic::Status> {
    let code = match &result {
        Ok(_) => "OK",
        Err(s) => code_name(s.code()),
    };
    METRICS.requests.with_label_values(&[method, code]).inc();
    result
}

/// The code's name as gRPC writes it (`NOT_FOUND`).
fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match c {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The text exposition of [`REGISTRY`].
pub fn render() -> String {
    LazyLock::force(&METRICS);
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&REGISTRY.gather(), &mut out)
        .expect("text encoding");
    String::from_utf8(out).unwrap_or_default()
}
