//! Chunked bodies: the fast path's end finder (`ChunkScanner` in
//! `proxy/src/fast/response.rs`), which decides where a Pod's chunked response
//! ends, and pingora's request body reader behind both request paths. The first
//! two input bytes place two cuts in the rest.
//!
//! - nothing panics or overflows;
//! - the verdict does not depend on how the bytes arrive: whole, or in three reads
//!   cut anywhere, give the same end (or both fail);
//! - the end is decided by the bytes before it: the prefix up to the end ends at
//!   the same place, and one byte less has not ended;
//! - **no 5xx**: the same bytes as the chunked body of a runner poll, which the
//!   proxy reads to route it, down both request paths (`fast::differential`):
//!   neither answers with a 5xx, and both answer alike.

use podgate_proxy::fast::fuzzing::ChunkScanner;

/// Scan `pieces` in order as reads; the end's offset from the first byte.
fn scan(pieces: &[&[u8]]) -> Result<Option<usize>, &'static str> {
    let mut s = ChunkScanner::default();
    let mut offset = 0;
    for p in pieces {
        if let Some(n) = s.scan(p)? {
            assert!(n <= p.len());
            return Ok(Some(offset + n));
        }
        offset += p.len();
    }
    Ok(None)
}

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let [a, b, body @ ..] = data else {
        return;
    };
    let cut1 = body.len() * usize::from(*a) / 256;
    let cut2 = cut1 + (body.len() - cut1) * usize::from(*b) / 256;
    let whole = scan(&[body]);
    let split = scan(&[&body[..cut1], &body[cut1..cut2], &body[cut2..]]);
    match (&whole, &split) {
        (Ok(w), Ok(s)) => assert_eq!(w, s),
        (Err(_), Err(_)) => {}
        _ => panic!("whole {whole:?}, split at {cut1}/{cut2} {split:?}"),
    }
    if let Ok(Some(end)) = whole {
        assert_eq!(scan(&[&body[..end]]), Ok(Some(end)));
        assert_eq!(scan(&[&body[..end - 1]]), Ok(None));
    }
    // The same bytes as a runner poll's chunked body, down both request paths.
    let mut request = POLL_HEAD.to_vec();
    request.extend_from_slice(body);
    crate::no_server_error(&request);
}

/// A runner poll whose chunked body the proxy reads to route it (its JSON
/// `token`), as the fuzzed bytes follow it.
const POLL_HEAD: &[u8] = b"POST /api/v4/jobs/request HTTP/1.1\r\nHost: gitlab\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
