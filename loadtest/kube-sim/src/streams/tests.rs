//! Tests of the SPDY framing and the subresource helpers (the protocols as a
//! whole are tested with the installed kubectl in `tests/streams.rs`).

use bytes::BufMut;
use flate2::{Compress, Compression};
use serde_json::json;

use super::dictionary::DICTIONARY;
use super::spdy::{self, Frame, Reader, Writer};
use super::{pick_container, protocols, query_pairs};

/// Adler-32, as zlib checks a preset dictionary by.
fn adler32(b: &[u8]) -> u32 {
    let (mut a, mut s) = (1u32, 0u32);
    for x in b {
        a = (a + u32::from(*x)) % 65521;
        s = (s + a) % 65521;
    }
    (s << 16) | a
}

#[test]
fn the_dictionary_is_spdy3s() {
    assert_eq!(DICTIONARY.len(), 1423);
    assert_eq!(adler32(DICTIONARY), 0xe3c6_a7c2);
    assert!(DICTIONARY.starts_with(b"\0\0\0\x07options"));
    assert!(DICTIONARY.ends_with(b",*,enq=0."));
}

#[test]
fn frames_are_read_as_they_arrive_with_headers_across_blocks() {
    // The client's compressor, with the dictionary, carried across frames.
    let mut deflate = Compress::new(Compression::default(), true);
    deflate.set_dictionary(DICTIONARY).unwrap();
    let first = spdy::syn_stream(
        &mut deflate,
        1,
        &[
            ("streamtype", "error"),
            ("port", "8080"),
            ("requestid", "0"),
        ],
    );
    let second = spdy::syn_stream(
        &mut deflate,
        3,
        &[("streamtype", "data"), ("port", "8080"), ("requestid", "0")],
    );
    let mut bytes = first.to_vec();
    bytes.extend_from_slice(&second);
    bytes.extend_from_slice(&spdy::data(3, true, b"hello"));
    let mut ping = vec![0x80, 3, 0, 6, 0, 0, 0, 4];
    ping.put_u32(7);
    bytes.extend_from_slice(&ping);

    let mut r = Reader::new();
    // Byte by byte: nothing is read before a frame is whole.
    let mut frames = Vec::new();
    for b in &bytes {
        r.extend(&[*b]);
        while let Some(f) = r.next().unwrap() {
            frames.push(f);
        }
    }
    let headers = |t: &str| {
        vec![
            ("streamtype".to_owned(), t.to_owned()),
            ("port".to_owned(), "8080".to_owned()),
            ("requestid".to_owned(), "0".to_owned()),
        ]
    };
    assert_eq!(
        frames,
        [
            Frame::SynStream {
                stream: 1,
                fin: false,
                headers: headers("error")
            },
            Frame::SynStream {
                stream: 3,
                fin: false,
                headers: headers("data")
            },
            Frame::Data {
                stream: 3,
                fin: true,
                data: bytes::Bytes::from_static(b"hello")
            },
            Frame::Ping { id: 7 },
        ]
    );
}

#[test]
fn replies_inflate_with_the_dictionary_and_bad_frames_are_errors() {
    let mut w = Writer::new().unwrap();
    let reply = w.syn_reply(5).unwrap();
    assert_eq!(&reply[..4], &[0x80, 3, 0, 2], "a SYN_REPLY control frame");
    assert_eq!(&reply[8..12], &5u32.to_be_bytes());
    // The block is zlib with the dictionary preset (FDICT set, its Adler-32).
    assert_eq!(reply[13] & 0x20, 0x20);
    assert_eq!(&reply[14..18], &0xe3c6_a7c2u32.to_be_bytes());
    let mut inflate = flate2::Decompress::new(true);
    let mut out = Vec::with_capacity(64);
    let err = inflate
        .decompress_vec(&reply[12..], &mut out, flate2::FlushDecompress::Sync)
        .unwrap_err();
    assert!(err.needs_dictionary().is_some());
    inflate.set_dictionary(DICTIONARY).unwrap();
    let used = inflate.total_in() as usize;
    inflate
        .decompress_vec(&reply[12 + used..], &mut out, flate2::FlushDecompress::Sync)
        .unwrap();
    assert_eq!(out, [0, 0, 0, 0], "no headers");

    let mut r = Reader::new();
    r.extend(&[0x80, 2, 0, 1, 0, 0, 0, 0]);
    assert!(r.next().unwrap_err().to_string().contains("version 2"));
    let mut r = Reader::new();
    r.extend(&[
        0x80, 3, 0, 1, 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2,
    ]);
    assert!(r.next().is_err(), "a header block that is not zlib");
}

#[test]
fn containers_are_picked_as_kube_apiserver_picks_them() {
    let pod = json!({"spec": {"containers": [{"name": "app"}, {"name": "side"}]}});
    assert_eq!(
        pick_container(&pod, "web", Some("side")).unwrap()["name"],
        "side"
    );
    assert_eq!(
        pick_container(&pod, "web", None).unwrap_err(),
        "a container name must be specified for pod web, choose one of: [app side]"
    );
    assert_eq!(
        pick_container(&pod, "web", Some("db")).unwrap_err(),
        "container db is not valid for pod web"
    );
    let one = json!({"spec": {"containers": [{"name": "app"}]}});
    assert_eq!(pick_container(&one, "web", None).unwrap()["name"], "app");
}

#[test]
fn repeated_query_keys_and_offered_protocols_are_all_kept() {
    let uri: http::Uri = "/x?command=sh&command=-c&command=echo+%22a%22&stdin=true"
        .parse()
        .unwrap();
    let q = query_pairs(&uri);
    let argv: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(argv, ["sh", "-c", "echo \"a\""]);
    let mut h = http::HeaderMap::new();
    h.append(
        "sec-websocket-protocol",
        "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
    );
    h.append(
        "sec-websocket-protocol",
        "v3.channel.k8s.io".parse().unwrap(),
    );
    assert_eq!(
        protocols(&h, "sec-websocket-protocol"),
        [
            "v5.channel.k8s.io",
            "v4.channel.k8s.io",
            "v3.channel.k8s.io"
        ]
    );
}
