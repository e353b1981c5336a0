//! Mutual TLS: each caller's certificate names its role (`OU=cell` with
//! `CN=cell-<id>`, `OU=router`, `OU=admin`), and each method admits the roles
//! GitLab's schema gives it (its `access_control` option): a Cell claims for
//! itself only, the Router classifies, an administrator reads records. A
//! certificate of no known role is unauthenticated; one of another CA, or none,
//! does not get through the handshake.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod};
use podgate_topology_service::classify::ClassifyRequest;
use podgate_topology_service::proto::gitlab::cells::topology_service as ts;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use ts::claims::v1::{self as cv1, claim_service_client::ClaimServiceClient};

use crate::common::{Running, first_line, spawn_podgate};

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl {args:?}");
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// A CA named `ca` in `dir`: `ca.crt`, `ca.key`.
fn ca(dir: &Path, ca: &str) {
    let mut args = vec!["req", "-x509"];
    args.extend(EC);
    let (crt, key, subj) = (
        format!("{ca}.crt"),
        format!("{ca}.key"),
        format!("/CN={ca}"),
    );
    args.extend([
        "-nodes", "-days", "1", "-subj", &subj, "-keyout", &key, "-out", &crt,
    ]);
    openssl(dir, &args);
}

/// `name.crt` and `name.key` for `subject`, signed by `ca`.
fn leaf(dir: &Path, ca: &str, name: &str, subject: &str, server: bool) -> (PathBuf, PathBuf) {
    let (crt, key, csr) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("{name}.csr"),
    );
    let mut args = vec!["req"];
    args.extend(EC);
    args.extend(["-nodes", "-subj", subject, "-keyout", &key, "-out", &csr]);
    openssl(dir, &args);
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(
        &ext,
        if server {
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        } else {
            "extendedKeyUsage=clientAuth\n"
        },
    )
    .unwrap();
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            &crt,
            "-extfile",
            ext.to_str().unwrap(),
        ],
    );
    (dir.join(crt), dir.join(key))
}

/// `podgate topology-service` with mutual TLS: `server`'s certificate, callers'
/// signed by `dir`'s `ca`. The process and where it listens.
fn start_tls(dir: &Path, server: &(PathBuf, PathBuf)) -> (Running, std::net::SocketAddr) {
    let config = dir.join("ts.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\n{}[tls]\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n",
            super::CELLS,
            server.0.display(),
            server.1.display(),
            dir.join("ca.crt").display()
        ),
    )
    .unwrap();
    let (child, lines) = spawn_podgate(["topology-service", "--config", config.to_str().unwrap()]);
    let ts = Running(child);
    let addr = first_line(&lines, Duration::from_secs(30), "topology-service", |l| {
        l.strip_prefix("topology_service address=")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    });
    (ts, addr)
}

/// A gRPC channel over TLS to `addr`, showing `cert`.
async fn channel(
    addr: std::net::SocketAddr,
    dir: &Path,
    cert: &(PathBuf, PathBuf),
) -> Result<Channel, tonic::transport::Error> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(dir.join("ca.crt")).unwrap();
    b.set_certificate_file(&cert.0, SslFiletype::PEM).unwrap();
    b.set_private_key_file(&cert.1, SslFiletype::PEM).unwrap();
    b.set_alpn_protos(b"\x02h2").unwrap();
    let connector = b.build();
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let ssl = connector
                    .configure()
                    .and_then(|c| c.into_ssl("localhost"))
                    .map_err(std::io::Error::other)?;
                let mut s =
                    tokio_openssl::SslStream::new(ssl, tcp).map_err(std::io::Error::other)?;
                std::pin::Pin::new(&mut s)
                    .connect()
                    .await
                    .map_err(std::io::Error::other)?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }
        }))
        .await
}

fn route(path: &str) -> cv1::Metadata {
    cv1::Metadata {
        bucket: Some(cv1::Bucket {
            r#type: cv1::bucket::Type::Routes as i32,
            value: path.into(),
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_gets_what_gitlabs_schema_gives_it() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ca(dir, "ca");
    ca(dir, "other-ca");
    let server = leaf(dir, "ca", "server", "/CN=localhost", true);
    let cell2 = leaf(dir, "ca", "cell2", "/OU=cell/CN=cell-2", false);
    let router = leaf(dir, "ca", "router", "/OU=router/CN=router", false);
    let admin = leaf(dir, "ca", "admin", "/OU=admin/CN=ops", false);
    let nobody = leaf(dir, "ca", "nobody", "/OU=intern/CN=x", false);
    let stranger = leaf(dir, "other-ca", "stranger", "/OU=admin/CN=ops", false);
    let (_ts, addr) = start_tls(dir, &server);

    // A Cell claims for itself, not for another; classifies; reads no records.
    let mut c = ClaimServiceClient::new(channel(addr, dir, &cell2).await.unwrap());
    let begin = |cell_id, path: &str| cv1::BeginUpdateRequest {
        create_records: vec![route(path)],
        cell_id,
        ..Default::default()
    };
    let lease = c
        .begin_update(begin(2, "team"))
        .await
        .unwrap()
        .into_inner()
        .lease_uuid;
    c.commit_update(cv1::CommitUpdateRequest {
        cell_id: 2,
        lease_uuid: lease,
    })
    .await
    .unwrap();
    let other = c.begin_update(begin(1, "not-mine")).await.unwrap_err();
    assert_eq!(other.code(), Code::PermissionDenied, "{other:?}");
    let get = cv1::GetRecordRequest {
        bucket: Some(cv1::Bucket {
            r#type: cv1::bucket::Type::Routes as i32,
            value: "team".into(),
        }),
        claim: None,
    };
    assert_eq!(
        c.get_record(get.clone()).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let classify = ClassifyRequest {
        claims: vec![ts::types::v1::Claim {
            claim: Some(ts::types::v1::claim::Claim::Route("team".into())),
        }],
        ..Default::default()
    };
    for cert in [&cell2, &router, &admin] {
        let mut k = ts::classify_service_client::ClassifyServiceClient::new(
            channel(addr, dir, cert).await.unwrap(),
        );
        let r = k.classify(classify.clone()).await.unwrap().into_inner();
        assert_eq!(r.proxy.unwrap().address, "cell-2.example.com:443");
    }

    // The Router claims nothing; an administrator reads records and may claim for any Cell.
    let mut r = ClaimServiceClient::new(channel(addr, dir, &router).await.unwrap());
    assert_eq!(
        r.begin_update(begin(2, "x")).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let mut a = ClaimServiceClient::new(channel(addr, dir, &admin).await.unwrap());
    assert_eq!(
        a.get_record(get)
            .await
            .unwrap()
            .into_inner()
            .record
            .unwrap()
            .cell_id,
        2
    );
    a.begin_update(begin(3, "ops")).await.unwrap();

    // No known role: unauthenticated. Another CA's certificate: no connection.
    let mut n = ts::classify_service_client::ClassifyServiceClient::new(
        channel(addr, dir, &nobody).await.unwrap(),
    );
    assert_eq!(
        n.classify(classify.clone()).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let refused = match channel(addr, dir, &stranger).await {
        Err(_) => true,
        Ok(ch) => ts::classify_service_client::ClassifyServiceClient::new(ch)
            .classify(classify)
            .await
            .is_err(),
    };
    assert!(refused, "a certificate of another CA got an answer");
}

/// The proxy reaches a Topology Service that requires mutual TLS as GitLab's HTTP
/// Router does, with the Router's certificate: path rules route by its claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_asks_over_mutual_tls_with_the_routers_certificate() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    ca(dir, "ca");
    let server = leaf(dir, "ca", "server", "/CN=localhost", true);
    let router = leaf(dir, "ca", "router", "/OU=router/CN=router", false);
    let admin = leaf(dir, "ca", "admin", "/OU=admin/CN=ops", false);
    let (_ts, addr) = start_tls(dir, &server);
    let mut a = ClaimServiceClient::new(channel(addr, dir, &admin).await.unwrap());
    super::commit(&mut a, 3, vec![route("secure-group")]).await;

    let (s1, s3) = (
        crate::common::Stub::start(1).await,
        crate::common::Stub::start(3).await,
    );
    let proxy_config = format!(
        "[topology_service]\naddress = \"{addr}\"\n[topology_service.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n{}",
        dir.join("ca.crt").display(),
        router.0.display(),
        router.1.display(),
        crate::common::topology(&[
            crate::common::pod_entry(
                1,
                &[s1.addr.to_string()],
                "cell_address = \"cell-1.example.com:443\""
            ),
            crate::common::pod_entry(
                3,
                &[s3.addr.to_string()],
                "cell_address = \"cell-3.example.com\""
            ),
        ])
    );
    let proxy = crate::common::start_proxy(&proxy_config, tempfile::tempdir().unwrap()).await;
    let (status, _, body) =
        crate::common::send(proxy.port, "GET /secure-group/project HTTP/1.1", b"").await;
    assert_eq!((status, body.as_str()), (200, r#"{"pod":3}"#));
    let metrics = crate::common::admin_get(&proxy, "/metrics").await.1;
    assert!(
        metrics.contains("podgate_proxy_topology_service_calls_total{result=\"owner\"} 1"),
        "{metrics}"
    );
}
