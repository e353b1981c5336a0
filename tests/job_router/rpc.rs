//! The Job Router's RPC, by hand: `router/rpc/rpc.proto` (gitlabhq/gitlab-runner,
//! commit d79f3e7b) has two messages and one unary method, too little to generate:
//!
//! ```proto
//! package gitlab.agent.job_router.rpc;
//! message GetJobRequest  { bytes job_request  = 1; }
//! message GetJobResponse { bytes job_response = 1; }
//! service JobRouter { rpc GetJob (GetJobRequest) returns (GetJobResponse); }
//! ```

use std::task::{Context, Poll};

use http::StatusCode;
use http::uri::PathAndQuery;
use tonic::Code;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::transport::Channel;

/// The JSON body of `POST /api/v4/jobs/request`, passed on as is.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetJobRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub job_request: Vec<u8>,
}

/// The job as Rails' `201` body, or empty: no job.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetJobResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub job_response: Vec<u8>,
}

/// `GetJob`'s full method path.
pub const GET_JOB: &str = "/gitlab.agent.job_router.rpc.JobRouter/GetJob";

/// One `GetJob` on `channel` (`rpc.NewJobRouterClient(conn).GetJob`).
pub async fn get_job(
    channel: Channel,
    request: tonic::Request<GetJobRequest>,
) -> Result<tonic::Response<GetJobResponse>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(GrpcGoHead(channel));
    // What tonic's generated clients do before each call.
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    grpc.unary(
        request,
        PathAndQuery::from_static(GET_JOB),
        tonic_prost::ProstCodec::default(),
    )
    .await
}

/// A channel that reads an answer's HTTP head as grpc-go does (gitlab-runner's
/// go.mod: google.golang.org/grpc v1.83.0; `operateHeaders` in
/// `internal/transport/http2_client.go`): an HTTP status other than 200, or a
/// content type that is not gRPC's, ends the call with the code grpc-go's
/// `HTTPStatusConvTab` gives that status (Unknown when it has none), whatever
/// `grpc-status` says. tonic alone would read the body as gRPC messages, so a
/// plain `401` (an HTTP/2 proxy that does not speak gRPC; podgate's edge answers
/// gRPC calls with a gRPC status) would be `INTERNAL` where gitlab-runner sees
/// `UNAUTHENTICATED`.
#[derive(Clone, Debug)]
struct GrpcGoHead(Channel);

impl Service<http::Request<Body>> for GrpcGoHead {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let answer = self.0.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            Ok(match not_grpc(&resp) {
                Some(status) => status.into_http(),
                None => resp,
            })
        })
    }
}

/// The status grpc-go ends a call with for this answer head, if it does.
fn not_grpc<B>(resp: &http::Response<B>) -> Option<tonic::Status> {
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    // `grpcutil.ContentSubtype`: `application/grpc`, `+subtype` or `;params`.
    let is_grpc = content_type.as_deref().is_some_and(|ct| {
        ct.strip_prefix("application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
    });
    let status = resp.status();
    if is_grpc && status == StatusCode::OK {
        return None;
    }
    let mut errs = Vec::new();
    if status != StatusCode::OK {
        errs.push(format!(
            "unexpected HTTP status code received from server: {} ({})",
            status.as_u16(),
            status.canonical_reason().unwrap_or_default()
        ));
    }
    if !is_grpc {
        errs.push(match content_type {
            Some(ct) => format!("transport: received unexpected content-type {ct:?}"),
            None => "malformed header: missing HTTP content-type".to_owned(),
        });
    }
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Some(tonic::Status::new(code, errs.join("; ")))
}
