use super::*;

fn form(s: &str) -> Result<Vec<String>, Malformed> {
    let mut out = Vec::new();
    form_values(s.as_bytes(), "token", Pairs::Query, &mut out).map(|()| out)
}

fn json(s: &str) -> Result<Vec<String>, Malformed> {
    let mut out = Vec::new();
    json_values(s.as_bytes(), "token", &mut out).map(|()| out)
}

fn multipart(body: &[u8], complete: bool) -> Result<(Vec<String>, MultipartEnd), Malformed> {
    let mut out = Vec::new();
    multipart_values(body, "XyZ", "token", complete, &mut out).map(|end| (out, end))
}

#[test]
fn forms_and_queries_keep_every_value_in_order() {
    assert_eq!(form("a=1&token=x&token=y").unwrap(), ["x", "y"]);
    assert_eq!(form("token=a%2Bb+c").unwrap(), ["a+b c"]);
    assert_eq!(form("a=1; token=semi").unwrap(), ["semi"]);
    assert_eq!(form("tok%65n=enc").unwrap(), ["enc"]);
    assert_eq!(form("token=&x=1").unwrap(), Vec::<String>::new());
    assert_eq!(form("tokens=x&xtoken=y").unwrap(), Vec::<String>::new());
    // Rack 2.2 drops leading brackets and trailing `]`s of the top-level key.
    assert_eq!(form("[token]=a&token]=b&token[=c").unwrap(), ["a", "b"]);
    assert_eq!(
        form("token[]=x"),
        Err(Malformed::NotAString("token".into()))
    );
    assert_eq!(
        form("token[a]=x"),
        Err(Malformed::NotAString("token".into()))
    );
    assert_eq!(
        form("a=%zz"),
        Err(Malformed::PercentEncoding("query string"))
    );
    assert_eq!(
        form("token=%4"),
        Err(Malformed::PercentEncoding("query string"))
    );
    // Two hex digits, no sign (`u8::from_str_radix` would take `+f`).
    assert_eq!(
        form("token=%+f"),
        Err(Malformed::PercentEncoding("query string"))
    );
    // A form body splits on `&` only: `1;token=x` is the value of `a`.
    let mut out = Vec::new();
    form_values(b"a=1;token=x&token=y", "token", Pairs::Form, &mut out).unwrap();
    assert_eq!(out, ["y"]);
}

#[test]
fn json_bodies_count_repeated_keys_and_coerce_like_grape() {
    assert_eq!(
        json(r#"{"info":{"token":"no"},"token":"a","token":"b"}"#).unwrap(),
        ["a", "b"]
    );
    assert_eq!(json(r#"{"token": 42}"#).unwrap(), ["42"]);
    assert_eq!(json(r#"{"token": null}"#).unwrap(), Vec::<String>::new());
    assert_eq!(json(r#"["token", "x"]"#).unwrap(), Vec::<String>::new());
    assert_eq!(json("  ").unwrap(), Vec::<String>::new());
    assert_eq!(
        json(r#"{"token": ["a"]}"#),
        Err(Malformed::NotAString("token".into()))
    );
    assert_eq!(json(r#"{"token": "a""#), Err(Malformed::Json));
    assert_eq!(json(r#"{"token": "a"} x"#), Err(Malformed::Json));
    assert_eq!(json(r#"{"tok\u0065n": "esc"}"#).unwrap(), ["esc"]);
}

#[test]
fn body_kinds() {
    let post = http::Method::POST;
    assert_eq!(
        BodyKind::of(Some("application/json; charset=utf-8"), &post),
        Ok(BodyKind::Json)
    );
    assert_eq!(
        BodyKind::of(Some("Application/X-WWW-Form-Urlencoded"), &post),
        Ok(BodyKind::Form)
    );
    assert_eq!(
        BodyKind::of(Some("multipart/form-data; BOUNDARY=\"XyZ\""), &post),
        Ok(BodyKind::Multipart("XyZ".into()))
    );
    assert!(BodyKind::of(Some("multipart/form-data"), &post).is_err());
    assert_eq!(BodyKind::of(None, &post), Ok(BodyKind::Form));
    assert_eq!(BodyKind::of(None, &http::Method::PUT), Ok(BodyKind::Opaque));
    assert_eq!(BodyKind::of(None, &http::Method::GET), Ok(BodyKind::Opaque));
    assert_eq!(
        BodyKind::of(Some("text/plain"), &post),
        Ok(BodyKind::Opaque)
    );
}

/// Found by `fuzz/fuzz_targets/proxy_multipart.rs`: a media type whose last five or
/// first ten bytes end inside a multi-byte character panicked (a `str` slice).
#[test]
fn body_kinds_of_non_ascii_media_types() {
    let post = http::Method::POST;
    for ct in [
        "application/\u{fffd}json",
        "text/\u{fffd}\u{fffd}",
        "multipart\u{fffd}/x",
    ] {
        assert_eq!(
            BodyKind::of(Some(ct), &post),
            Ok(BodyKind::Opaque),
            "{ct:?}"
        );
    }
    assert_eq!(
        BodyKind::of(Some("application/\u{e9}+json"), &post),
        Ok(BodyKind::Json)
    );
}

const TOKEN_THEN_FILE: &[u8] = b"--XyZ\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nglcbt-77\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.zip\"\r\n\r\nPK....";

#[test]
fn multipart_token_before_the_file() {
    let (v, end) = multipart(TOKEN_THEN_FILE, false).unwrap();
    assert_eq!(
        (v, end),
        (vec!["glcbt-77".to_owned()], MultipartEnd::Truncated)
    );
    // Only part of the token part has arrived: nothing yet, more needed.
    let (v, end) = multipart(&TOKEN_THEN_FILE[..50], false).unwrap();
    assert!(v.is_empty());
    assert_eq!(end, MultipartEnd::Truncated);
}

#[test]
fn multipart_token_after_a_small_file_and_case_insensitive_headers() {
    let body = b"preamble\r\n--XyZ\r\ncontent-disposition: form-data; NAME=\"file\"; FileName=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\x01--XyZ-not-a-delimiter\r\n--XyZ\r\nCONTENT-DISPOSITION: form-data; Name=token\r\n\r\nglcbt-9\r\n--XyZ--\r\n";
    let (v, end) = multipart(body, true).unwrap();
    assert_eq!(v, ["glcbt-9"]);
    assert_eq!(end, MultipartEnd::Complete);
}

#[test]
fn multipart_repeated_fields_names_are_case_sensitive_and_files_are_not_strings() {
    let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\na\r\n--XyZ\r\nContent-Disposition: form-data; name=\"TOKEN\"\r\n\r\nupper\r\n--XyZ\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nb\r\n--XyZ--";
    assert_eq!(multipart(body, true).unwrap().0, ["a", "b"]);
    let file_token = b"--XyZ\r\nContent-Disposition: form-data; name=\"token\"; filename=\"t\"\r\n\r\nx\r\n--XyZ--";
    assert_eq!(
        multipart(file_token, true),
        Err(Malformed::NotAString("token".into()))
    );
    // Rack 2.2's greedy pattern takes the last `; name=` before a `:`, even inside
    // quotes: both parts below are `token` to Rack.
    let quoted =
        b"--XyZ\r\nContent-Disposition: form-data; name=\"a;name=token\"\r\n\r\nx\r\n--XyZ--";
    assert_eq!(multipart(quoted, true).unwrap().0, ["x"]);
    let greedy = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; x=\"; name=token\"\r\n\r\nglcbt-g\r\n--XyZ--";
    assert_eq!(multipart(greedy, true).unwrap().0, ["glcbt-g"]);
    // No name: Rack falls back to Content-ID.
    let content_id = b"--XyZ\r\nContent-ID: token\r\n\r\nglcbt-c\r\n--XyZ--";
    assert_eq!(multipart(content_id, true).unwrap().0, ["glcbt-c"]);
    // Rack's `dequote` drops backslashes.
    let escaped =
        b"--XyZ\r\nContent-Disposition: form-data; name=\"to\\ken\"\r\n\r\nglcbt-e\r\n--XyZ--";
    assert_eq!(multipart(escaped, true).unwrap().0, ["glcbt-e"]);
}

#[test]
fn broken_multipart_is_malformed_only_when_complete() {
    assert!(multipart(b"no delimiter at all", true).is_err());
    assert_eq!(
        multipart(b"no delimiter yet", false).unwrap().1,
        MultipartEnd::Truncated
    );
    let unterminated = b"--XyZ\r\nContent-Disposition: form-data; name=\"token\"\r\n\r\nglcbt-1";
    assert!(multipart(unterminated, true).is_err());
    assert!(multipart(b"--XyZjunk", true).is_err());
}
