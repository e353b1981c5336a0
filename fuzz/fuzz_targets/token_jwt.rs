//! JWT routable tokens past the signature check: the input is `prefix NUL header
//! NUL claims`; the target signs header and claims with the `fuzz` HS256 key, so
//! the fuzzer reaches the header and claim parsers (`podgate_tokens::jwt`) that a
//! forged token never would.
//!
//! - nothing panics; the cached and uncached verdicts agree;
//! - a routable verdict has a JSON-object header naming `HS256` (and kid `fuzz` or
//!   none) and claims with `exp` in the future and a `c` that is the Pod (an integer,
//!   or a lowercase base-36 string);
//! - the same token with one signature character changed, or with its claims
//!   changed, is never routable.

use std::collections::BTreeMap;

use crate::{CLASSIFIER, NOW, sign_hs256, split_nul};
use podgate_tokens::Classification;
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON object's members, unparsed.
fn members(json: &[u8]) -> Option<BTreeMap<String, Box<RawValue>>> {
    serde_json::from_slice(json).ok()
}

/// Member `name` of an object, parsed as `T`.
fn member<T: serde::de::DeserializeOwned>(
    m: &BTreeMap<String, Box<RawValue>>,
    name: &str,
) -> Option<T> {
    serde_json::from_str(m.get(name)?.get()).ok()
}

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let [prefix, header, claims] = split_nul::<3>(data);
    let Ok(prefix) = std::str::from_utf8(prefix) else {
        return;
    };
    let token = sign_hs256(prefix, header, claims);
    let verdict = CLASSIFIER.classify_uncached_at(&token, NOW);
    assert_eq!(CLASSIFIER.classify_at(&token, NOW), verdict, "{token}");
    let Classification::Routable(id) = verdict else {
        return;
    };

    // Members read one by one: JSON may hold numbers no f64 holds (`1e999`) in
    // members nobody reads, which a whole `Value` refuses.
    let h = members(header).expect("a routable JWT's header is a JSON object");
    assert_eq!(member::<String>(&h, "alg").as_deref(), Some("HS256"));
    let kid = member::<Option<String>>(&h, "kid").flatten();
    assert!(kid.is_none() || kid.as_deref() == Some("fuzz"), "{kid:?}");
    let c = members(claims).expect("a routable JWT's claims are a JSON object");
    let exp = member::<f64>(&c, "exp").expect("a routable JWT has a numeric exp");
    assert!(exp + CLASSIFIER.config().leeway_secs as f64 >= NOW as f64);
    let pod = match member::<Value>(&c, "c") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => {
            assert!(
                s.bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
            );
            u64::from_str_radix(&s, 36).ok()
        }
        other => panic!("routable with c = {other:?}"),
    };
    assert_eq!(pod, Some(id.pod.get()));

    // Tampered copies: never routable.
    let sig_at = token.rfind('.').expect("three parts") + 1;
    let mut forged = token.clone().into_bytes();
    forged[sig_at] = if forged[sig_at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).expect("ASCII");
    let v = CLASSIFIER.classify_uncached_at(&forged, NOW);
    assert!(v.pod().is_none(), "{forged}: {v:?}");
    let claims_at = token[..sig_at - 1].rfind('.').expect("three parts") + 1;
    let mut forged = token.clone();
    forged.insert_str(claims_at, "eyJjIjoiMiJ9");
    let v = CLASSIFIER.classify_uncached_at(&forged, NOW);
    assert!(v.pod().is_none(), "{forged}: {v:?}");
}
