//! Unit tests of the `:authority` rewrite: frames built by hand as grpc-go's HPACK
//! encoder writes them (the URL added to the dynamic table, then referred to by
//! index), read back through [`AuthorityFix`] and decoded as h2 would.

use tokio::io::AsyncReadExt as _;

use super::*;

/// An HPACK string literal, no Huffman (lengths below 127).
fn literal(s: &[u8]) -> Vec<u8> {
    assert!(s.len() < 127);
    let mut out = vec![s.len() as u8];
    out.extend_from_slice(s);
    out
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Frames of the rewritten stream: (type, flags, stream, payload).
fn parse(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes([bytes[5] & 0x7f, bytes[6], bytes[7], bytes[8]]);
        out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    out
}

async fn through(input: Vec<u8>) -> io::Result<Vec<u8>> {
    let mut fix = AuthorityFix::new(input.as_slice());
    let mut out = Vec::new();
    fix.read_to_end(&mut out).await?;
    Ok(out)
}

#[test]
fn urls_become_authorities() {
    let a = |s: &str| authority(s.as_bytes()).map(|v| String::from_utf8(v).unwrap());
    assert_eq!(a("ws://127.0.0.1:8150").as_deref(), Some("127.0.0.1:8150"));
    assert_eq!(
        a("wss://kas.example.com/-/kubernetes-agent/").as_deref(),
        Some("kas.example.com")
    );
    assert_eq!(a("ws://[::1]:8150?x").as_deref(), Some("[::1]:8150"));
    assert_eq!(a("kas.example.com:443"), None, "already an authority");
    assert_eq!(a("not a url at all"), None);
}

#[tokio::test]
async fn grpc_go_header_blocks_are_rewritten_and_everything_else_passes() {
    let url = b"ws://127.0.0.1:8150";
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    // Stream 1: `:method POST` (static 3), `:scheme http` (static 6), `:path` as a
    // literal, `:authority` with incremental indexing (static name 1), a header of
    // its own with incremental indexing; split across HEADERS (padded, with
    // priority) and a CONTINUATION.
    let mut block = vec![0x83, 0x86, 0x04];
    block.extend(literal(
        b"/gitlab.agent.gitlab_access.rpc.GitlabAccess/MakeRequest",
    ));
    block.push(0x41);
    block.extend(literal(url));
    block.push(0x40);
    block.extend(literal(b"te"));
    block.extend(literal(b"trailers"));
    let (head, tail) = block.split_at(10);
    let mut headers = vec![3u8]; // pad length
    headers.extend([0x80, 0, 0, 0, 16]); // exclusive on stream 0, weight 17
    headers.extend_from_slice(head);
    headers.extend([0, 0, 0]);
    input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &headers));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, tail));
    input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02hi")); // DATA
    // Stream 3: the same URL and `te` by dynamic index (62 is the newest entry).
    input.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &[0x83, 0x86, 0x84, 0xbf, 0xbe],
    ));

    let out = through(input).await.unwrap();
    assert_eq!(&out[..PREFACE.len()], PREFACE);
    let frames = parse(&out[PREFACE.len()..]);
    let kinds: Vec<(u8, u8, u32)> = frames.iter().map(|f| (f.0, f.1, f.2)).collect();
    assert_eq!(
        kinds,
        [
            (0x4, 0, 0),
            (HEADERS, PRIORITY | END_HEADERS, 1),
            (0x0, END_STREAM, 1),
            (HEADERS, END_HEADERS | END_STREAM, 3),
        ]
    );
    assert_eq!(&frames[1].3[..5], &[0x80, 0, 0, 0, 16], "priority kept");
    assert_eq!(frames[2].3, b"\0\0\0\0\x02hi", "DATA unchanged");
    // Decoded as h2 decodes: one HPACK state over both blocks.
    let mut h2 = loona_hpack::Decoder::new();
    let first = h2.decode(&frames[1].3[5..]).unwrap();
    let second = h2.decode(&frames[3].3).unwrap();
    let text = |fields: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(String, String)> {
        fields
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    };
    assert_eq!(
        text(first),
        [
            (":method", "POST"),
            (":scheme", "http"),
            (
                ":path",
                "/gitlab.agent.gitlab_access.rpc.GitlabAccess/MakeRequest"
            ),
            (":authority", "127.0.0.1:8150"),
            ("te", "trailers"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
    );
    assert_eq!(
        text(second),
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "127.0.0.1:8150"),
            ("te", "trailers"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
    );
}

#[tokio::test]
async fn other_streams_and_broken_blocks() {
    // Not HTTP/2: untouched.
    let ws = b"GET / HTTP/1.1\r\n\r\n".to_vec();
    assert_eq!(through(ws.clone()).await.unwrap(), ws);
    // A header block cut by another frame, or one that does not decode: the
    // connection ends.
    let mut cut = PREFACE.to_vec();
    cut.extend(frame(HEADERS, 0, 1, &[0x83]));
    cut.extend(frame(0x0, 0, 1, b""));
    let e = through(cut).await.unwrap_err();
    assert!(e.to_string().contains("CONTINUATION of stream 1"), "{e}");
    let mut bad = PREFACE.to_vec();
    bad.extend(frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0x7f]));
    let e = through(bad).await.unwrap_err();
    assert!(e.to_string().contains("header block of stream 1"), "{e}");
    // A small block naming a large list (one 4000-byte field, then 300 references
    // to it): refused, not expanded.
    let mut bomb = PREFACE.to_vec();
    let mut block = vec![0x40, 0x01, b'x', 0x7f];
    let mut n = 4000 - 127;
    while n >= 128 {
        block.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    block.push(n as u8);
    block.extend(std::iter::repeat_n(b'y', 4000));
    block.extend(std::iter::repeat_n(0xbe, 300));
    bomb.extend(frame(HEADERS, END_HEADERS, 1, &block));
    let e = through(bomb).await.unwrap_err();
    assert!(e.to_string().contains("larger than"), "{e}");
    // Padding longer than the frame.
    let mut padded = PREFACE.to_vec();
    padded.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x83]));
    let e = through(padded).await.unwrap_err();
    assert!(e.to_string().contains("malformed HEADERS frame"), "{e}");
}
