//! GitLab routable tokens: format v1 (encode and decode) and the older v0 (decode).
//!
//! ```text
//! v1: <prefix><b64url( random(16) ‖ payload ‖ u8(len(payload)) )>.01.<b64len><crc>
//! v0: <prefix><b64url( payload ‖ random ‖ u8(len(random)) )>.<b64len><crc>
//! ```
//!
//! `payload` is `key:value` lines sorted by key, values in base 36; `b64len` is the
//! length of the base64 part in base 36 (2 characters); `crc` is the zlib CRC-32 of
//! everything before it in base 36 (7 characters). The suffix fields are parsed
//! strictly (lowercase digits only, no signs) so that no single-character change to
//! a token survives the CRC check.
//!
//! The random part never leaves this module: [`Decoded`] holds the routing keys only.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use thiserror::Error;

use crate::identity::{InvalidReason, RunnerType, TokenKind};

/// Bytes of randomness GitLab puts in every routable token.
pub const RANDOM_BYTES: usize = 16;
/// The largest routing payload GitLab issues, in bytes.
pub const MAX_PAYLOAD: usize = 159;
/// The only versioned format this build knows.
pub const VERSION: u64 = 1;
const CRC_CHARS: usize = 7;
const LEN_CHARS: usize = 2;

/// Errors from [`encode`]. Caller mistakes; retrying the same call fails again.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The routing payload would exceed [`MAX_PAYLOAD`] bytes.
    #[error("routing payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    PayloadTooLarge(usize),
    /// GitLab requires the organization (`o`) in every routable token.
    #[error("routing key `o` (organization) is required")]
    MissingOrganization,
    /// The prefix may hold only ASCII letters, digits, `_` and `-`.
    #[error("prefix {0:?} may hold only ASCII letters, digits, '_' and '-'")]
    BadPrefix(String),
    /// Routing keys are single lowercase letters.
    #[error("routing key {0:?} must be one lowercase ASCII letter")]
    BadKey(String),
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The routing keys of a GitLab routable token (`c o g p u t` and any others).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingKeys {
    /// `c`: the cell (Pod) id.
    pub cell: Option<u64>,
    /// `o`: the organization id (required when encoding).
    pub organization: Option<u64>,
    /// `g`: the group id.
    pub group: Option<u64>,
    /// `p`: the project id.
    pub project: Option<u64>,
    /// `u`: the user id.
    pub user: Option<u64>,
    /// `t`: the runner type code (1 instance, 2 group, 3 project).
    pub runner_type: Option<u64>,
    /// Keys GitLab may add later; kept so decoding stays forward-compatible.
    pub other: BTreeMap<char, u64>,
}

impl RoutingKeys {
    /// All keys as `(letter, value)` pairs, sorted by letter.
    pub fn entries(&self) -> Vec<(char, u64)> {
        let known = [
            ('c', self.cell),
            ('g', self.group),
            ('o', self.organization),
            ('p', self.project),
            ('t', self.runner_type),
            ('u', self.user),
        ];
        let mut all: Vec<(char, u64)> = known
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .chain(self.other.iter().map(|(k, v)| (*k, *v)))
            .collect();
        all.sort_unstable_by_key(|(k, _)| *k);
        all
    }

    /// The runner type, when `t` holds a known code.
    pub fn runner_type(&self) -> Option<RunnerType> {
        self.runner_type.and_then(RunnerType::from_code)
    }

    fn set(&mut self, key: char, value: u64) -> std::result::Result<(), InvalidReason> {
        let slot = match key {
            'c' => &mut self.cell,
            'o' => &mut self.organization,
            'g' => &mut self.group,
            'p' => &mut self.project,
            'u' => &mut self.user,
            't' => &mut self.runner_type,
            other => {
                return match self.other.insert(other, value) {
                    None => Ok(()),
                    Some(_) => Err(InvalidReason::BadPayload("duplicate key")),
                };
            }
        };
        match slot.replace(value) {
            None => Ok(()),
            Some(_) => Err(InvalidReason::BadPayload("duplicate key")),
        }
    }
}

/// A decoded GitLab routable token (without its random part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// 0 for the unversioned layout, 1 for v1.
    pub version: u8,
    /// Everything before the base64 part, e.g. `glrt-` or `acme-glpat-`.
    pub prefix: String,
    /// The routing keys.
    pub keys: RoutingKeys,
}

impl Decoded {
    /// The kind the prefix stands for (`glrt-` → runner, `glcbt-` → job, …).
    pub fn kind(&self) -> TokenKind {
        kind_of_prefix(&self.prefix)
    }
}

/// The kind a prefix such as `glrt-` or `acme-glcbt-` stands for.
pub(crate) fn kind_of_prefix(prefix: &str) -> TokenKind {
    // The GitLab part is the last dash-terminated segment; an instance prefix may
    // stand before it.
    let trimmed = prefix.strip_suffix('-').unwrap_or(prefix);
    let last = trimmed.rsplit('-').next().unwrap_or("");
    TokenKind::from_gitlab_prefix(last)
}

/// The shape of a token's suffix: which routable layout it claims to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `….<vv>.<ll><ccccccc>`
    V1,
    /// `….<ll><ccccccc>` with exactly one dot.
    V0,
}

/// Which routable layout `token` has the shape of, if any. Cheap; checks no CRC.
pub(crate) fn shape(token: &str) -> Option<Shape> {
    let b = token.as_bytes();
    let tail = LEN_CHARS + CRC_CHARS;
    // v1: `.` vv `.` ll ccccccc
    if b.len() > tail + 4
        && b[b.len() - tail - 1] == b'.'
        && b[b.len() - tail - 4] == b'.'
        && is_base36(&b[b.len() - tail..])
        && is_base36(&b[b.len() - tail - 3..b.len() - tail - 1])
    {
        return Some(Shape::V1);
    }
    if b.len() > tail + 1
        && b[b.len() - tail - 1] == b'.'
        && is_base36(&b[b.len() - tail..])
        && b.iter().filter(|&&c| c == b'.').count() == 1
    {
        return Some(Shape::V0);
    }
    None
}

fn is_base36(s: &[u8]) -> bool {
    s.iter()
        .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
}

/// Parse lowercase base 36 strictly: digits and `a`–`z` only, no sign, no overflow.
pub(crate) fn parse_base36(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !is_base36(s) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &c| {
        let d = if c.is_ascii_digit() {
            c - b'0'
        } else {
            c - b'a' + 10
        };
        acc.checked_mul(36)?.checked_add(u64::from(d))
    })
}

/// `n` in lowercase base 36, left-padded with `0` to `width`.
pub fn to_base36(mut n: u64, width: usize) -> String {
    let mut digits = Vec::with_capacity(13);
    loop {
        let d = (n % 36) as u8;
        digits.push(if d < 10 { b'0' + d } else { b'a' + d - 10 });
        n /= 36;
        if n == 0 {
            break;
        }
    }
    while digits.len() < width {
        digits.push(b'0');
    }
    digits.reverse();
    String::from_utf8(digits).expect("base 36 digits are ASCII")
}

/// Decode a token already known to have a routable [`shape`]: check the CRC, then
/// read the payload. Any failure is an [`InvalidReason`].
pub(crate) fn decode_shaped(token: &str, shape: Shape) -> Result<Decoded, InvalidReason> {
    let b = token.as_bytes();
    let crc_at = b.len() - CRC_CHARS;
    let expected = parse_base36(&b[crc_at..]).ok_or(InvalidReason::BadCrc)?;
    if u64::from(crc32fast::hash(&b[..crc_at])) != expected {
        return Err(InvalidReason::BadCrc);
    }
    let len_at = crc_at - LEN_CHARS;
    let b64_len = parse_base36(&b[len_at..crc_at]).ok_or(InvalidReason::BadCrc)? as usize;
    let (version, body_end) = match shape {
        Shape::V1 => {
            let v = parse_base36(&b[len_at - 3..len_at - 1]).ok_or(InvalidReason::BadCrc)?;
            if v != VERSION {
                return Err(InvalidReason::UnknownVersion);
            }
            (1u8, len_at - 4)
        }
        Shape::V0 => (0u8, len_at - 1),
    };
    let body = &token[..body_end];
    if b64_len == 0 || b64_len > body.len() {
        return Err(InvalidReason::BadPayload("length field out of range"));
    }
    let (prefix, b64) = body.split_at(body.len() - b64_len);
    if !prefix
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    {
        return Err(InvalidReason::BadPayload("prefix"));
    }
    let raw = URL_SAFE_NO_PAD
        .decode(b64)
        .map_err(|_| InvalidReason::BadPayload("not base64url"))?;
    let (&len_byte, rest) = raw.split_last().ok_or(InvalidReason::BadPayload("empty"))?;
    let n = usize::from(len_byte);
    if n > rest.len() {
        return Err(InvalidReason::BadPayload("length byte out of range"));
    }
    let payload = match version {
        // random ‖ payload ‖ u8(len(payload))
        1 => &rest[rest.len() - n..],
        // payload ‖ random ‖ u8(len(random))
        _ => &rest[..rest.len() - n],
    };
    if payload.len() > MAX_PAYLOAD {
        return Err(InvalidReason::BadPayload("payload too large"));
    }
    Ok(Decoded {
        version,
        prefix: prefix.to_owned(),
        keys: parse_payload(payload)?,
    })
}

fn parse_payload(payload: &[u8]) -> Result<RoutingKeys, InvalidReason> {
    let mut keys = RoutingKeys::default();
    if payload.is_empty() {
        return Ok(keys);
    }
    for line in payload.split(|&c| c == b'\n') {
        let colon = line
            .iter()
            .position(|&c| c == b':')
            .ok_or(InvalidReason::BadPayload("line without ':'"))?;
        let (k, v) = (&line[..colon], &line[colon + 1..]);
        let key = match k {
            [c] if c.is_ascii_lowercase() => char::from(*c),
            _ => return Err(InvalidReason::BadPayload("key is not one letter")),
        };
        if v.is_empty() {
            // GitLab drops blank values when it encodes; tolerate them when decoding.
            continue;
        }
        let value = parse_base36(v).ok_or(InvalidReason::BadPayload("value is not base 36"))?;
        keys.set(key, value)?;
    }
    Ok(keys)
}

/// Encode a GitLab v1 routable token exactly as GitLab does.
///
/// `prefix` is written as given (`glrt-`, `acme-glpat-`, or empty); `random` is the
/// token's secret, which the caller draws from a CSPRNG (see [`random_bytes`]).
pub fn encode(prefix: &str, keys: &RoutingKeys, random: &[u8; RANDOM_BYTES]) -> Result<String> {
    if !prefix
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    {
        return Err(Error::BadPrefix(prefix.to_owned()));
    }
    if keys.organization.is_none() {
        return Err(Error::MissingOrganization);
    }
    if let Some(k) = keys.other.keys().find(|k| !k.is_ascii_lowercase()) {
        return Err(Error::BadKey(k.to_string()));
    }
    let payload = keys
        .entries()
        .into_iter()
        .map(|(k, v)| format!("{k}:{}", to_base36(v, 0)))
        .collect::<Vec<_>>()
        .join("\n");
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::PayloadTooLarge(payload.len()));
    }
    let mut raw = Vec::with_capacity(RANDOM_BYTES + payload.len() + 1);
    raw.extend_from_slice(random);
    raw.extend_from_slice(payload.as_bytes());
    raw.push(payload.len() as u8);
    let b64 = URL_SAFE_NO_PAD.encode(&raw);
    let mut token = format!(
        "{prefix}{b64}.{}.{}",
        to_base36(VERSION, LEN_CHARS),
        to_base36(b64.len() as u64, LEN_CHARS)
    );
    let crc = crc32fast::hash(token.as_bytes());
    token.push_str(&to_base36(u64::from(crc), CRC_CHARS));
    Ok(token)
}

/// Fresh secret bytes for [`encode`], from the operating system's CSPRNG.
pub fn random_bytes() -> [u8; RANDOM_BYTES] {
    use rand::RngCore as _;
    let mut r = [0u8; RANDOM_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut r);
    r
}

/// Decode any GitLab routable token (v1 or v0), checking its CRC.
pub fn decode(token: &str) -> Result<Decoded, InvalidReason> {
    let s = shape(token).ok_or(InvalidReason::Malformed(
        "not a GitLab routable token (no .<len><crc> suffix)",
    ))?;
    decode_shaped(token, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 zero random bytes with the payload `c:2`, `g:9ix`, `o:1`, `u:16` (cell 2,
    /// group 12,345 in base 36, organization 1, user 42), encoded as above.
    const VECTOR: &str = "glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhI.01.1b0zz5pn1";

    fn vector_keys() -> RoutingKeys {
        RoutingKeys {
            cell: Some(2),
            organization: Some(1),
            group: Some(12_345),
            user: Some(42),
            ..RoutingKeys::default()
        }
    }

    #[test]
    fn decodes_the_reference_vector() {
        let d = decode(VECTOR).unwrap();
        assert_eq!(d.version, 1);
        assert_eq!(d.prefix, "glrt-");
        assert_eq!(d.kind(), TokenKind::Runner);
        assert_eq!(d.keys, vector_keys());
    }

    #[test]
    fn encodes_the_reference_vector_byte_for_byte() {
        let t = encode("glrt-", &vector_keys(), &[0; RANDOM_BYTES]).unwrap();
        assert_eq!(t, VECTOR);
    }

    #[test]
    fn base36_is_strict() {
        assert_eq!(parse_base36(b"9ix"), Some(12_345));
        assert_eq!(parse_base36(b"3w5e11264sgsf"), Some(u64::MAX));
        assert_eq!(parse_base36(b"3w5e11264sgsg"), None, "overflow");
        assert_eq!(parse_base36(b"9IX"), None, "uppercase");
        assert_eq!(parse_base36(b"+1"), None, "sign");
        assert_eq!(parse_base36(b""), None);
        assert_eq!(to_base36(12_345, 0), "9ix");
        assert_eq!(to_base36(1, 2), "01");
        assert_eq!(to_base36(0, 0), "0");
    }

    #[test]
    fn decodes_v0_layout() {
        // Build a v0 token the way GitLab's first generator did.
        let payload = b"c:3\no:1";
        let mut raw = payload.to_vec();
        raw.extend_from_slice(&[7u8; RANDOM_BYTES]);
        raw.push(RANDOM_BYTES as u8);
        let b64 = URL_SAFE_NO_PAD.encode(&raw);
        let mut t = format!("glpat-{b64}.{}", to_base36(b64.len() as u64, 2));
        let crc = crc32fast::hash(t.as_bytes());
        t.push_str(&to_base36(u64::from(crc), 7));
        let d = decode(&t).unwrap();
        assert_eq!(d.version, 0);
        assert_eq!(d.kind(), TokenKind::PersonalAccess);
        assert_eq!(d.keys.cell, Some(3));
        assert_eq!(d.keys.organization, Some(1));
    }

    #[test]
    fn instance_prefix_keeps_the_kind() {
        assert_eq!(kind_of_prefix("acme-glcbt-"), TokenKind::Job);
        assert_eq!(kind_of_prefix("glagent-"), TokenKind::Agent);
        assert_eq!(kind_of_prefix(""), TokenKind::Other);
    }

    #[test]
    fn encode_refuses_what_gitlab_refuses() {
        let mut k = vector_keys();
        k.organization = None;
        assert_eq!(
            encode("glrt-", &k, &[0; 16]),
            Err(Error::MissingOrganization)
        );
        assert!(matches!(
            encode("gl rt-", &vector_keys(), &[0; 16]),
            Err(Error::BadPrefix(_))
        ));
        let mut big = vector_keys();
        for c in 'h'..='n' {
            big.other.insert(c, u64::MAX);
        }
        for c in 'q'..='s' {
            big.other.insert(c, u64::MAX);
        }
        assert!(matches!(
            encode("glrt-", &big, &[0; 16]),
            Err(Error::PayloadTooLarge(_))
        ));
    }

    #[test]
    fn bad_version_and_bad_payload_are_invalid() {
        // Same structure, version 02, CRC recomputed: a version we do not know.
        let body = &VECTOR[..VECTOR.len() - 12];
        let mut t = format!("{body}.02.1b");
        let crc = crc32fast::hash(t.as_bytes());
        t.push_str(&to_base36(u64::from(crc), 7));
        assert_eq!(decode(&t), Err(InvalidReason::UnknownVersion));
    }
}
