use super::*;

/// A runner's `jobs/request` body, as gitlab-runner sends it.
const RUNNER: &str = r#"{"token":"glrt-t1_abcdefghijklmnopqrstu","system_id":"s_0123456789ab","last_update":"0","info":{"name":"gitlab-runner","version":"17.6.0","executor":"docker","features":{"variables":true,"artifacts":true,"cache":true}}}"#;

/// Bodies whose one-byte changes are compared; among them every kind of value.
const BODIES: &[&str] = &[
    RUNNER,
    r#"{"token":"a","info":{"n":[1,-2.5e+3,0.1,0,-0,1E9,null,[],{}],"t":true,"f":false},"token":""}"#,
    r#" { "a" : [ { "b" : [ 1 , 2 ] } ] , "token" : null } "#,
    r#"{"token":"x","s":"a\tb","u":"\u00e9"}"#,
    r#"[{"token":"a"},"token"]"#,
    r#"{}"#,
];

/// What a byte changes to: JSON's structure, numbers, literals, whitespace (and
/// what is not whitespace to JSON), controls, and bytes past ASCII.
const BYTES: &[u8] = b" \t\n\r\x0c{}[]:,\"\\/-+.0123456789eEtrufalsn\x00\x1f\x7f\x80\xc3\xa9xz";

/// Whether the scan answered `body`; where it did, the parser agrees.
fn agree(body: &[u8]) -> bool {
    let mut scanned = Vec::new();
    if scan(body, b"token", &mut scanned).is_none() {
        return false;
    }
    let mut parsed = Vec::new();
    let shown = String::from_utf8_lossy(body);
    assert_eq!(parse(body, "token", &mut parsed), Ok(()), "{shown}");
    assert_eq!(scanned, parsed, "{shown}");
    true
}

#[test]
fn the_scan_answers_only_as_the_parser_does() {
    let (mut cases, mut answered) = (0, 0);
    for body in BODIES.iter().map(|b| b.as_bytes()) {
        let mut check = |m: &[u8]| {
            cases += 1;
            answered += usize::from(agree(m));
        };
        check(body);
        for i in 0..=body.len() {
            for &c in BYTES {
                let mut m = body.to_vec();
                m.insert(i, c);
                check(&m);
                if i < body.len() {
                    m.remove(i);
                    m[i] = c;
                    check(&m);
                }
            }
            if i < body.len() {
                let mut m = body.to_vec();
                m.remove(i);
                check(&m);
            }
        }
    }
    // The scan is tried, not just skipped: a good share of the changes are still
    // plain bodies it reads itself.
    assert!(
        cases > 30_000 && answered > cases / 5,
        "{answered} of {cases}"
    );
}

#[test]
fn a_runner_body_is_scanned_and_anything_else_parsed() {
    let mut out = Vec::new();
    assert!(scan(RUNNER.as_bytes(), b"token", &mut out).is_some());
    assert_eq!(out, ["glrt-t1_abcdefghijklmnopqrstu"]);
    let deep = format!(
        "{{\"a\":{}1{},\"token\":\"x\"}}",
        "[".repeat(70),
        "]".repeat(70)
    );
    for body in [
        r#"{"tok\u0065n":"a"}"#,
        r#"{"token":"\u0061"}"#,
        r#"{"token":1}"#,
        r#"{"token":"é"}"#,
        r#"{"token":["a"]}"#,
        r#"["token"]"#,
        r#"{"token":"a",}"#,
        deep.as_str(),
    ] {
        let mut out = Vec::new();
        assert!(
            scan(body.as_bytes(), b"token", &mut out).is_none(),
            "{body}"
        );
    }
    // The parser's answers for them.
    let json = |body: &str| {
        let mut out = Vec::new();
        json_values(body.as_bytes(), "token", &mut out).map(|()| out)
    };
    assert_eq!(json(r#"{"tok\u0065n":"a"}"#).unwrap(), ["a"]);
    assert_eq!(json(r#"{"token":1}"#).unwrap(), ["1"]);
    assert_eq!(json(r#"{"token":"é"}"#).unwrap(), ["é"]);
    assert_eq!(json(&deep).unwrap(), ["x"]);
    assert_eq!(json(r#"{"token":"a",}"#), Err(Malformed::Json));
}

/// The eight-at-a-time search ends a plain string where a byte-by-byte one does:
/// every byte value, at every offset of a chunk, behind printable bytes, and
/// two ending bytes together (the first counts).
#[test]
fn a_plain_string_ends_where_a_byte_search_ends_it() {
    let naive = |s: &[u8]| {
        s.iter()
            .position(|&c| c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c))
    };
    for len in 0..20 {
        for at in 0..=len {
            for byte in 0..=255u8 {
                let mut s = vec![b'a'; len];
                if at < len {
                    s[at] = byte;
                }
                assert_eq!(plain_len(&s), naive(&s), "{byte:#x} at {at} of {len}");
                if at + 1 < len {
                    s[at + 1] = b'"';
                    assert_eq!(plain_len(&s), naive(&s), "{byte:#x} at {at}, then a quote");
                }
            }
        }
    }
}
