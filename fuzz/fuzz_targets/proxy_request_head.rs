//! The fast path's request head parser (`proxy/src/fast/head.rs`, through
//! `podgate_proxy::fast::fuzzing::request_head`) and the request it writes to the Pod
//! (`fast/forward.rs`, `upstream_request`).
//!
//! - nothing panics; every span lies in the buffer (resolved by the wrapper);
//! - **no 5xx**: the bytes down both paths, the fast path and pingora-proxy alone
//!   (`fast::differential`), the client closing after them: whatever they are,
//!   neither path answers with a 5xx, and both answer alike;
//! - a taken head is rooted, has a `Host`, one plain `Content-Length` at most and no
//!   `Transfer-Encoding`; `Partial` only below the 16 KiB head limit;
//! - the head alone parses to the same head; one byte less is never a head;
//! - **framing survives forwarding**: the request the Pod receives, read by an
//!   independent parser (httparse), has the same body length the fast path
//!   forwards, and no other framing (else the Pod would read part of the body as a
//!   second request: smuggling).

use podgate_proxy::fast::fuzzing::{Request, request_head};

/// Checks one input (module docs); panics on a violated property.
pub fn run(data: &[u8]) {
    crate::no_server_error(data);
    let h = match request_head(data) {
        Request::Partial => {
            assert!(data.len() < 16 * 1024);
            return;
        }
        Request::HandOff(_) => return,
        Request::Head(h) => h,
    };
    assert!(h.len <= data.len());
    assert!(h.path.starts_with('/'), "{:?}", h.path);
    let _ = podgate_proxy::path::normalize(h.path);
    assert!(h.headers.contains_key(http::header::HOST));
    assert!(!h.headers.contains_key(http::header::TRANSFER_ENCODING));
    let lengths: Vec<_> = h
        .headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .collect();
    assert!(lengths.len() <= 1);
    let declared = lengths.first().map_or(0, |v| {
        v.to_str()
            .expect("digits")
            .parse::<usize>()
            .expect("digits")
    });
    assert_eq!(declared, h.body_len);
    assert_eq!(h.lines.len(), h.headers.len());

    match request_head(&data[..h.len]) {
        Request::Head(again) => {
            assert_eq!(again.len, h.len);
            assert_eq!(again.body_len, h.body_len);
            assert_eq!(again.lines, h.lines);
        }
        other => panic!("the head alone: {other:?}"),
    }
    assert!(!matches!(
        request_head(&data[..h.len - 1]),
        Request::Head(_)
    ));

    let Some(up) = h.upstream else {
        return;
    };
    let mut raw = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut raw);
    let head_len = match req.parse(&up) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!(
            "the Pod cannot parse {:?}: {other:?}",
            String::from_utf8_lossy(&up)
        ),
    };
    let mut length = None;
    for hd in req.headers.iter() {
        assert!(
            !hd.name.eq_ignore_ascii_case("transfer-encoding"),
            "{:?}",
            String::from_utf8_lossy(&up)
        );
        if hd.name.eq_ignore_ascii_case("content-length") {
            assert!(length.is_none(), "two Content-Length");
            length = Some(
                std::str::from_utf8(hd.value)
                    .unwrap()
                    .parse::<usize>()
                    .unwrap(),
            );
        }
    }
    assert_eq!(
        length.unwrap_or(0),
        h.body_len,
        "the Pod reads another body length: {:?}",
        String::from_utf8_lossy(&up)
    );
    assert_eq!(up.len() - head_len, h.body_len);
    assert_eq!(&up[head_len..], &data[h.len..h.len + h.body_len]);
}
