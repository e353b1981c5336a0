//! kube-sim over HTTPS: a self-signed certificate made at start, as `kubeadm`
//! makes a cluster's CA. client-go sends a bearer token only over TLS
//! (`clientcmd`'s user identification is set for TLS connections only;
//! kubernetes/kubectl#744), so `kubectl` can authenticate to a kube-sim that
//! enforces RBAC only when it serves HTTPS.

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509, X509Builder, X509NameBuilder};

/// A certificate for `localhost` and `127.0.0.1` (its own CA, valid 30 days) and
/// its P-256 key.
pub fn self_signed() -> Result<(X509, PKey<Private>), openssl::error::ErrorStack> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("CN", "localhost")?;
    let name = name.build();
    let mut b = X509Builder::new()?;
    b.set_version(2)?;
    let serial = BigNum::from_u32(rand::random::<u32>())?.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(&name)?;
    b.set_pubkey(&key)?;
    b.set_not_before(Asn1Time::days_from_now(0)?.as_ref())?;
    b.set_not_after(Asn1Time::days_from_now(30)?.as_ref())?;
    let san = SubjectAlternativeName::new()
        .dns("localhost")
        .ip("127.0.0.1")
        .build(&b.x509v3_context(None, None))?;
    b.append_extension(san)?;
    b.sign(&key, MessageDigest::sha256())?;
    Ok((b.build(), key))
}

/// What kube-sim serves HTTPS with: the acceptor, and the certificate clients
/// trust (PEM).
#[derive(Clone)]
pub struct Tls {
    pub(super) acceptor: SslAcceptor,
    ca_pem: String,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// HTTPS with a fresh [`self_signed`] certificate; HTTP/1.1 only (kube-sim
    /// serves no HTTP/2).
    pub fn self_signed() -> Result<Tls, openssl::error::ErrorStack> {
        let (cert, key) = self_signed()?;
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
        b.set_certificate(&cert)?;
        b.set_private_key(&key)?;
        b.check_private_key()?;
        b.set_alpn_select_callback(|_, client| {
            openssl::ssl::select_next_proto(b"\x08http/1.1", client)
                .ok_or(openssl::ssl::AlpnError::NOACK)
        });
        Ok(Tls {
            acceptor: b.build(),
            ca_pem: String::from_utf8_lossy(&cert.to_pem()?).into_owned(),
        })
    }

    /// The certificate to trust, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}
