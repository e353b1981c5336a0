//! `X-Request-Id`: kept when the client sent a sane one, generated otherwise; passed
//! to the Pod, returned to the client and logged.

use std::sync::atomic::{AtomicU64, Ordering};

/// Request ids for requests that come without one: a random per-process prefix and a
/// counter, 32 hex digits, unique across processes and restarts.
pub(crate) struct RequestIds {
    /// The prefix's 16 hex digits.
    prefix: String,
    next: AtomicU64,
}

impl RequestIds {
    pub(crate) fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        RequestIds {
            prefix: hex::encode(h.finish().to_be_bytes()),
            next: AtomicU64::new(0),
        }
    }

    /// The prefix, then the counter's 16 hex digits: one allocation, no formatting
    /// machinery (this runs on every request that comes without an id).
    pub(crate) fn generate(&self) -> String {
        let mut digits = [0u8; 16];
        hex::encode_to_slice(
            self.next.fetch_add(1, Ordering::Relaxed).to_be_bytes(),
            &mut digits,
        )
        .expect("8 bytes make 16 hex digits");
        let mut id = String::with_capacity(32);
        id.push_str(&self.prefix);
        id.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
        id
    }
}

/// A client's `X-Request-Id` is kept if it is short and plain (it goes into logs and
/// upstream headers); anything else is replaced.
pub(crate) fn sane_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= 128
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::{RequestIds, sane_request_id};

    #[test]
    fn generated_ids_are_32_hex_digits_a_counter_apart() {
        let ids = RequestIds::new();
        let (a, b) = (ids.generate(), ids.generate());
        for id in [&a, &b] {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
            assert!(sane_request_id(id.as_bytes()));
        }
        assert_eq!(a[..16], b[..16], "one prefix per process");
        let n = |id: &str| u64::from_str_radix(&id[16..], 16).unwrap();
        assert_eq!(n(&b), n(&a) + 1);
    }
}
