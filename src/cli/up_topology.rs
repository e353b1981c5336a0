//! `podgate up`'s Topology Service: one Cell per simulated Pod (its address the
//! Pod's web listener, which is also the Pod's `cell_address` in the proxy's
//! topology), served in this process on a free loopback port, and each Pod's
//! claims made as a Cell's Rails makes them at start: its group's top-level
//! namespace and its organization, `BeginUpdate` then `CommitUpdate` (`claim`,
//! which `podgate loadtest drill claim` makes too).

use std::net::SocketAddr;

use anyhow::Context as _;
use podgate_loadtest::pod_sim::{PodSim, namespace, organization};
use podgate_registry::BackendConfig;
use podgate_tokens::PodId;
use podgate_topology_service::config::{CellConfig, ClaimsConfig, Config, SequenceRange};
use podgate_topology_service::proto::gitlab::cells::topology_service::claims::v1 as cv1;
use podgate_topology_service::server::Bound;

/// Browses the Pods' namespaces through the proxy at `proxy`, as people open
/// project and organization pages, until `stop`: a page of each Pod's group and
/// organization a second, which the proxy's path rules send by their claims (each
/// Pod counts what it served, and a page of another's namespace as a misroute).
pub(crate) async fn browse(proxy: SocketAddr, sims: Vec<podgate_tokens::PodId>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
    let mut n = 0usize;
    loop {
        tick.tick().await;
        let pod = sims[n % sims.len()];
        let path = if n.is_multiple_of(2) {
            format!("/{}/project/-/issues/{n}", namespace(pod))
        } else {
            format!("/o/{}/groups/{}", organization(pod), namespace(pod))
        };
        // Errors show in the Pods' counts and the proxy's metrics; the browsing goes on.
        let _ = super::http_client::get(proxy, &path).await;
        n += 1;
    }
}

/// Each Cell's ids: a trillion apiece, the first from 1 (GitLab's legacy Cell
/// starts at 1; new Cells at 100 billion and more).
const RANGE: i64 = 1_000_000_000_000;

/// Starts the service for `sims`, its claims in memory or, with `redis`, in that
/// Redis (where the topology is), and makes each Pod's claims; returns where it
/// listens.
pub(crate) async fn start(sims: &[PodSim], redis: Option<&str>) -> anyhow::Result<SocketAddr> {
    let cells = sims
        .iter()
        .map(|s| {
            let id = i64::try_from(s.state().pod().get()).unwrap_or(i64::MAX);
            CellConfig {
                id,
                address: s.addr().to_string(),
                session_prefix: format!("cell-{id}"),
                sequence_ranges: vec![SequenceRange {
                    minval: (id - 1) * RANGE + 1,
                    maxval: id * RANGE,
                }],
            }
        })
        .collect();
    let config = Config {
        listen: "127.0.0.1:0".parse()?,
        cells,
        claims: ClaimsConfig {
            backend: match redis {
                Some(url) => BackendConfig::Redis {
                    url: url.to_owned(),
                },
                None => BackendConfig::Memory,
            },
            ..ClaimsConfig::default()
        },
        // On loopback, as `podgate up`'s other listeners: every caller an
        // administrator.
        tls: None,
    };
    config.validate("podgate up")?;
    let bound = Bound::bind(&config).await?;
    let addr = bound.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = bound.serve(std::future::pending()).await {
            tracing::error!(error = %e, "the topology service stopped");
        }
    });
    let mut claims = client(addr).await?;
    for s in sims {
        let pod = s.state().pod();
        claim(
            &mut claims,
            pod,
            &[(namespace(pod), pod.get())],
            Some(organization(pod)),
        )
        .await?;
    }
    Ok(addr)
}

/// A `ClaimService` client of the service at `addr` (plain HTTP/2).
pub(crate) async fn client(
    addr: SocketAddr,
) -> anyhow::Result<cv1::claim_service_client::ClaimServiceClient<tonic::transport::Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to the topology service at {addr}"))?;
    Ok(cv1::claim_service_client::ClaimServiceClient::new(channel))
}

/// Claims for Pod `pod`'s Cell, in one lease, as its Rails does when it creates
/// them: `routes` (top-level namespaces, each with its `routes` row's primary key)
/// and `organization`, `BeginUpdate` then `CommitUpdate`. Already claimed by this
/// Cell (an earlier run on the same Redis): nothing to do; by another: an error.
pub(crate) async fn claim(
    claims: &mut cv1::claim_service_client::ClaimServiceClient<tonic::transport::Channel>,
    pod: PodId,
    routes: &[(String, u64)],
    organization: Option<String>,
) -> anyhow::Result<()> {
    let cell_id = i64::try_from(pod.get()).unwrap_or(i64::MAX);
    let record = |bucket: cv1::bucket::Type, value: String, source: cv1::source::Type, key: u64| {
        cv1::Metadata {
            bucket: Some(cv1::Bucket {
                r#type: bucket as i32,
                value,
            }),
            subject: None,
            source: Some(cv1::Source {
                r#type: source as i32,
                // Rails' encoding of an integer primary key: 8 bytes, big-endian.
                rails_primary_key_id: key.to_be_bytes().to_vec(),
            }),
            user_data: None,
            claim: None,
        }
    };
    let mut create_records: Vec<_> = routes
        .iter()
        .map(|(name, key)| {
            record(
                cv1::bucket::Type::Routes,
                name.clone(),
                cv1::source::Type::RailsTableRoutes,
                *key,
            )
        })
        .collect();
    create_records.extend(organization.map(|o| {
        record(
            cv1::bucket::Type::OrganizationPath,
            o,
            cv1::source::Type::RailsTableOrganizations,
            pod.get(),
        )
    }));
    let begun = claims
        .begin_update(cv1::BeginUpdateRequest {
            create_records,
            destroy_records: Vec::new(),
            cell_id,
            organization_id: cell_id,
        })
        .await;
    let lease = match begun {
        Ok(r) => r.into_inner().lease_uuid,
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            let first = routes.first().map(|(n, _)| n.clone()).unwrap_or_default();
            let owner = claims
                .get_record(cv1::GetRecordRequest {
                    bucket: Some(cv1::Bucket {
                        r#type: cv1::bucket::Type::Routes as i32,
                        value: first.clone(),
                    }),
                    claim: None,
                })
                .await
                .with_context(|| format!("Pod {pod}'s earlier claims"))?
                .into_inner()
                .record
                .map(|r| r.cell_id);
            anyhow::ensure!(
                owner == Some(cell_id),
                "Pod {pod}'s namespace {first} is claimed by Cell {owner:?} at the topology service"
            );
            return Ok(());
        }
        Err(s) => return Err(s).with_context(|| format!("Pod {pod}'s claims")),
    };
    claims
        .commit_update(cv1::CommitUpdateRequest {
            cell_id,
            lease_uuid: lease,
        })
        .await
        .with_context(|| format!("committing Pod {pod}'s claims"))?;
    Ok(())
}
