//! podgate's fuzz targets ([`targets`], in `fuzz_targets/`: one per parser that sees
//! network input; `README.md` lists them and the property each checks) and the
//! fixtures they share.

#[path = "../fuzz_targets/mod.rs"]
pub mod targets;

use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};
use podgate_proxy::fast::differential::{Differential, Observed};
use podgate_tokens::{Classifier, KeySet};
use serde_json::Value;

/// The time every target classifies at (2030-03-17): after the seed JWTs' `nbf`,
/// before their `exp`.
pub const NOW: u64 = 1_900_000_000;

/// The HS256 secret of kid `fuzz`: the seed JWTs are signed with it, and
/// [`sign_hs256`] signs with it.
pub const HS256_SECRET: &[u8; 32] = b"podgate-fuzz-hs256-secret-000000";

/// A key set with `fuzz` (HS256, the secret above) and freshly generated `ed`
/// (EdDSA) and `es` (ES256) keys, so that every algorithm's checks are reached.
pub fn keys() -> KeySet {
    let src = Path::new("<fuzz>");
    let mut set = KeySet::new();
    set.add_hs256("fuzz", HS256_SECRET, src)
        .expect("a 32-byte secret");
    for (kid, alg) in [
        ("ed", podgate_tokens::Algorithm::EdDSA),
        ("es", podgate_tokens::Algorithm::ES256),
    ] {
        let k = podgate_tokens::keys::generate(alg).expect("key generation");
        set.add_pem(kid, &k.private, src).expect("a generated key");
    }
    set
}

/// One classifier per process, with a verdict cache, as the proxy has.
pub static CLASSIFIER: LazyLock<Classifier> = LazyLock::new(|| Classifier::with_keys(keys()));

/// Both request paths (the fast path and pingora-proxy alone) over loopback, with
/// [`keys`], started once per process (`podgate_proxy::fast::differential`).
pub static PATHS: LazyLock<Mutex<Differential>> =
    LazyLock::new(|| Mutex::new(Differential::new(Arc::new(Classifier::with_keys(keys())))));

/// `bytes` down both paths, the client closing its side after them. Panics if
/// either answers with a 5xx: the Pod stub answers 200, so a 5xx is the proxy's
/// own, and whatever the client sent, it is not a server error. (Whether a request
/// whose client closed is still forwarded differs between the paths: the fast
/// path serves it, pingora-proxy takes the close for the client going away.)
pub fn no_server_error(bytes: &[u8]) -> (Observed, Observed) {
    let (fast, pingora) = PATHS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .run_then_close(bytes);
    for o in [&fast, &pingora] {
        if let Some(answer) = &o.answer {
            assert!(
                !answer.start.starts_with("HTTP/1.1 5"),
                "a 5xx for {:?}: {o:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
    (fast, pingora)
}

/// `prefix` + a JWT of `header` and `claims` (any bytes, base64url-encoded as they
/// are) signed with [`HS256_SECRET`].
pub fn sign_hs256(prefix: &str, header: &[u8], claims: &[u8]) -> String {
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(HS256_SECRET).expect("any key length");
    mac.update(signed.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{prefix}{signed}.{sig}")
}

/// Split `data` at the first `n - 1` NUL bytes (JSON and tokens hold none) into `n`
/// parts; missing parts are empty.
pub fn split_nul<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&b""[..]; N];
    let mut rest = data;
    for (i, slot) in out.iter_mut().enumerate() {
        if i == N - 1 {
            *slot = rest;
            break;
        }
        match rest.iter().position(|b| *b == 0) {
            Some(at) => {
                *slot = &rest[..at];
                rest = &rest[at + 1..];
            }
            None => {
                *slot = rest;
                rest = b"";
            }
        }
    }
    out
}

/// JSON equality where two floats may differ in their last bit: serde_json's
/// default float parsing is best-effort (without its `float_roundtrip` feature), so
/// a float that is written and read back may come back one ULP away.
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => x == y || x.to_bits().abs_diff(y.to_bits()) <= 1,
                _ => false,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}
