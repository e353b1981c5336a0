//! Fast, lenient decoding of JWT headers and claims.
//!
//! Lenient means a claim of the wrong type does not fail the whole parse: it becomes
//! [`Scalar::Other`], so the verifier can name exactly which claim is bad. Strings
//! are borrowed from the decoded buffer where JSON escapes allow.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One JSON value, reduced to what claim checks need.
#[derive(Debug, Default, PartialEq)]
pub(crate) enum Scalar<'a> {
    /// The claim is not there.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// A non-negative integer.
    Int(u64),
    /// Any other number.
    Float(f64),
    /// A string.
    Str(Cow<'a, str>),
    /// An array of strings (for `aud`).
    Strings(Vec<Cow<'a, str>>),
    /// Anything else (bool, object, negative integer, mixed array).
    Other,
}

struct ScalarVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ScalarVisitor<'a> {
    type Value = Scalar<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Scalar::Int(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(Scalar::Other, Scalar::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Scalar::Float(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        let mut all_strings = true;
        while let Some(item) = seq.next_element::<Scalar<'a>>()? {
            match item {
                Scalar::Str(s) => out.push(s),
                _ => all_strings = false,
            }
        }
        Ok(if all_strings {
            Scalar::Strings(out)
        } else {
            Scalar::Other
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor(std::marker::PhantomData))
    }
}

/// The JOSE header fields we act on.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RawHeader<'a> {
    #[serde(default, borrow)]
    pub(crate) alg: Scalar<'a>,
    #[serde(default, borrow)]
    pub(crate) kid: Scalar<'a>,
}

/// The claims podgate reads; others are skipped without being stored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawClaims<'a> {
    #[serde(borrow)]
    pub(crate) exp: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) nbf: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) aud: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) iss: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) kind: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) c: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) o: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) g: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) p: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) u: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) a: Scalar<'a>,
    #[serde(borrow)]
    pub(crate) t: Scalar<'a>,
}

/// Parse a JSON object into `T`; `None` when it is not a valid JSON object. (Derived
/// structs would also accept an array; JOSE headers and claims are objects only.)
/// The whole text must be UTF-8 (RFC 7519 §7.2): serde_json checks only the strings
/// it keeps, not those of members it skips.
pub(crate) fn from_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_claims() {
        let c: RawClaims<'_> = from_json(
            br#"{"exp": 1.5e9, "c": "2", "o": 7, "g": true, "p": -1, "aud": ["a", "b"],
                 "iss": "x", "extra": {"nested": [1, {"k": null}]}, "u": null}"#,
        )
        .unwrap();
        assert_eq!(c.exp, Scalar::Float(1.5e9));
        assert_eq!(c.c, Scalar::Str("2".into()));
        assert_eq!(c.o, Scalar::Int(7));
        assert_eq!(c.g, Scalar::Other);
        assert_eq!(c.p, Scalar::Other);
        assert_eq!(c.aud, Scalar::Strings(vec!["a".into(), "b".into()]));
        assert_eq!((c.u, c.t), (Scalar::Null, Scalar::Absent));
        assert!(from_json::<RawClaims<'_>>(b"[1]").is_none());
        assert!(from_json::<RawClaims<'_>>(b"{").is_none());
    }

    /// Found by `fuzz/fuzz_targets/token_jwt.rs`: invalid UTF-8 in a member nobody
    /// reads (`typ`) passed, in a header that is not JSON.
    #[test]
    fn invalid_utf8_anywhere_is_not_json() {
        assert!(from_json::<RawHeader<'_>>(b"{\"alg\":\"HS256\",\"typ\":\"J\xffWT\"}").is_none());
        assert!(from_json::<RawClaims<'_>>(b"{\"c\":\"2\",\"x\":[\"\xc3\"]}").is_none());
        assert!(from_json::<RawHeader<'_>>(b"{\"alg\":\"HS256\",\"typ\":\"J\xc3\xa9\"}").is_some());
    }
}
