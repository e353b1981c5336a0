//! gitlab-shell's Topology Service client, as gitlabhq/gitlab-shell writes it in
//! `internal/topology/` (client.go, resolver.go, claims.go, config.go):
//!
//! - only `ClassifyService/Classify`, one claim: at its mirror's HEAD in the
//!   retired field 4 (`ClassifyRequest_Claim`), after its MR !1541 in `claims`;
//! - the claim: the top-level namespace of the repository path (`.git` stripped)
//!   for `/allowed` and LFS, the SSH key's SHA-256 fingerprint (base64 of the
//!   digest of the key blob, no padding, no `SHA256:` prefix) for key lookups, the
//!   username for `/discover` and the token endpoints;
//! - 5 s per call; 3 attempts, back-off from 50 ms doubling to at most 250 ms, on
//!   `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`,
//!   `DEADLINE_EXCEEDED`, `UNKNOWN` and transport errors; any other status is final;
//! - any failure, or an answer without a `PROXY` address, means the default host;
//!   of `proxy.address` only the host is kept, with the configured scheme and port.

use std::time::Duration;

use base64::Engine as _;
use podgate_topology_service::classify::ClassifyRequest;
use podgate_topology_service::proto::gitlab::cells::topology_service as ts;
use tonic::Code;
use ts::claims::v1::{self as cv1, claim_service_client::ClaimServiceClient};
use ts::types::v1::{Claim, claim};

/// gitlab-shell's `topology` configuration: how it builds a Cell's URL.
struct Shell {
    address: String,
    /// Which field carries the claim: the retired field 4, or `claims`.
    legacy: bool,
    scheme: &'static str,
    port: u16,
    default_host: &'static str,
}

/// What one resolution did.
struct Resolved {
    url: String,
    attempts: u32,
}

fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
            | Code::DeadlineExceeded
            | Code::Unknown
    )
}

impl Shell {
    async fn resolve(&self, claim: Claim) -> Resolved {
        let req = if self.legacy {
            ClassifyRequest {
                claim: Some(claim),
                ..Default::default()
            }
        } else {
            ClassifyRequest {
                claims: vec![claim],
                ..Default::default()
            }
        };
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0;
        let answer = loop {
            attempts += 1;
            let result = async {
                let ch =
                    tonic::transport::Endpoint::from_shared(format!("http://{}", self.address))
                        .unwrap()
                        .timeout(Duration::from_secs(5))
                        .connect()
                        .await
                        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                ts::classify_service_client::ClassifyServiceClient::new(ch)
                    .classify(req.clone())
                    .await
            }
            .await;
            match result {
                Ok(r) => break Some(r.into_inner()),
                Err(s) if retryable(s.code()) && attempts < 3 => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
                Err(_) => break None,
            }
        };
        let host = answer
            .filter(|r| r.action == ts::ClassifyAction::Proxy as i32)
            .and_then(|r| r.proxy)
            .map(|p| p.address.split(':').next().unwrap_or_default().to_owned())
            .filter(|h| !h.is_empty() && !h.contains('/'));
        Resolved {
            url: match host {
                Some(h) => format!("{}://{h}:{}", self.scheme, self.port),
                None => self.default_host.to_owned(),
            },
            attempts,
        }
    }
}

/// `ExtractTopLevelNamespace`: the repository path's first segment.
fn route_claim(repo: &str) -> Claim {
    let top = repo
        .trim_start_matches('/')
        .trim_end_matches(".git")
        .split('/')
        .next()
        .unwrap_or_default();
    Claim {
        claim: Some(claim::Claim::Route(top.to_owned())),
    }
}

/// The key's SHA-256 fingerprint as gitlab-shell sends it.
fn fingerprint(authorized_key: &str) -> String {
    let blob = authorized_key.split_whitespace().nth(1).unwrap();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(blob)
        .unwrap();
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(openssl::sha::sha256(&raw))
}

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host";

fn metadata(bucket: cv1::bucket::Type, value: &str, row: u64) -> cv1::Metadata {
    cv1::Metadata {
        bucket: Some(cv1::Bucket {
            r#type: bucket as i32,
            value: value.into(),
        }),
        source: Some(cv1::Source {
            r#type: cv1::source::Type::RailsTableKeys as i32,
            rails_primary_key_id: row.to_be_bytes().to_vec(),
        }),
        ..Default::default()
    }
}

super::on_every_backend! {
    gitlab_shell_finds_the_cell_by_route_key_fingerprint_and_username => by_claims;
}

async fn by_claims(t: &super::Ts) {
    // Cell 2's Rails has claimed a group, a key and a username.
    let mut c = ClaimServiceClient::new(t.channel().await);
    let fp = fingerprint(KEY);
    assert_eq!(fp.len(), 43);
    super::commit(
        &mut c,
        2,
        vec![
            metadata(cv1::bucket::Type::Routes, "gitlab-org", 1),
            metadata(cv1::bucket::Type::SshKeyFingerprints, &fp, 2),
            metadata(cv1::bucket::Type::Usernames, "alice", 3),
        ],
    )
    .await;

    for legacy in [true, false] {
        let shell = Shell {
            address: t.addr.to_string(),
            legacy,
            scheme: "https",
            port: 8443,
            default_host: "https://cell-1.internal:8443",
        };
        let cell2 = "https://cell-2.example.com:8443";
        let by_route = shell.resolve(route_claim("/gitlab-org/gitlab.git")).await;
        assert_eq!(
            (by_route.url.as_str(), by_route.attempts),
            (cell2, 1),
            "legacy {legacy}"
        );
        let by_key = shell
            .resolve(Claim {
                claim: Some(claim::Claim::SshKeyFingerprint(fp.clone())),
            })
            .await;
        assert_eq!(by_key.url, cell2, "legacy {legacy}");
        let by_user = shell
            .resolve(Claim {
                claim: Some(claim::Claim::Username("ALICE".into())),
            })
            .await;
        assert_eq!(by_user.url, cell2, "legacy {legacy}");
        // Unclaimed: NOT_FOUND is final, the default host serves it.
        let nobody = shell
            .resolve(Claim {
                claim: Some(claim::Claim::Username("bob".into())),
            })
            .await;
        assert_eq!(
            (nobody.url.as_str(), nobody.attempts),
            ("https://cell-1.internal:8443", 1),
            "legacy {legacy}"
        );
    }
}

/// With no Topology Service answering, three attempts, then the default host.
#[tokio::test]
async fn gitlab_shell_retries_an_unavailable_service_then_uses_the_default_host() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap().to_string();
    drop(closed);
    let shell = Shell {
        address,
        legacy: false,
        scheme: "https",
        port: 443,
        default_host: "https://legacy.internal",
    };
    let r = shell.resolve(route_claim("gitlab-org/gitlab")).await;
    assert_eq!((r.url.as_str(), r.attempts), ("https://legacy.internal", 3));
}
