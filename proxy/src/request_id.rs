//! `X-Request-Id`: kept when the client sent a sane one, generated otherwise; passed
//! to the Pod, returned to the client and logged.

use std::sync::atomic::{AtomicU64, Ordering};

/// Request ids for requests that come without one: a random per-process prefix and a
/// counter, 32 hex digits, unique across processes and restarts.
pub(crate) struct RequestIds {
    prefix: u64,
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
            prefix: h.finish(),
            next: AtomicU64::new(0),
        }
    }

    pub(crate) fn generate(&self) -> String {
        format!(
            "{:016x}{:016x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
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
