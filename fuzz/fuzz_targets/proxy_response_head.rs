//! The fast path's response head parser (`proxy/src/fast/response.rs`, through
//! `podgate_proxy::fast::fuzzing::response_head`) and the head it writes for the
//! client. The first input byte picks a HEAD request (bit 0) and `Connection: close`
//! (bit 1); the rest is the Pod's bytes.
//!
//! - nothing panics; `Partial` only below the 64 KiB head limit; lengths lie in the
//!   buffer;
//! - **the client frames the body as the proxy does**: the head written for the
//!   client parses (with the same parser) to the same status and framing, and with
//!   `Connection: close` to a connection that is not reused.

use podgate_proxy::fast::fuzzing::{Framing, Response, response_head};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    let Some((&flags, buf)) = data.split_first() else {
        return;
    };
    let (head_request, close) = (flags & 1 != 0, flags & 2 != 0);
    let h = match response_head(buf, head_request, "rid-1", close) {
        Response::Partial => {
            assert!(buf.len() < 64 * 1024);
            return;
        }
        Response::Interim(n) => {
            assert!(n <= buf.len());
            return;
        }
        Response::Invalid(_) => return,
        Response::Head(h) => h,
    };
    assert!(h.len <= buf.len());
    assert!(
        (200..=999).contains(&h.status) || h.status < 100,
        "{}",
        h.status
    );
    if head_request {
        assert_eq!(h.framing, Framing::Empty);
    }
    if h.framing == Framing::Close {
        assert!(!h.reusable);
    }
    let text = String::from_utf8_lossy(&h.for_client).into_owned();
    // The parser takes 96 header lines; the proxy adds up to two to the Pod's.
    let lines = h.for_client.windows(2).filter(|w| w == b"\r\n").count() - 2;
    if lines > 96 {
        return;
    }
    match response_head(&h.for_client, head_request, "rid-2", false) {
        Response::Head(again) => {
            assert_eq!(again.status, h.status, "{text:?}");
            assert_eq!(again.framing, h.framing, "{text:?}");
            assert_eq!(again.len, h.for_client.len(), "{text:?}");
            if close {
                assert!(!again.reusable, "{text:?}");
            }
        }
        other => panic!("the client cannot read {text:?}: {other:?}"),
    }
}
