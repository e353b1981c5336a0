//! Request bodies of writes: JSON or YAML decoding, and the kind of patch a body is.
//!
//! Merge patches are RFC 7386's, applied with `json_patch::merge`. Strategic-merge
//! patches (kube-apiserver's own, which json-patch does not do) are applied the same
//! way: for the maps and scalars kubectl's edits touch, the two agree. Server-side
//! apply is `ssa`'s.

use http::StatusCode;
use serde_json::Value;

/// How a write's body is to be applied, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PatchKind {
    /// Not a patch, or a merge / strategic-merge patch.
    Merge,
    /// Server-side apply (`application/apply-patch+yaml`): creates when absent.
    Apply,
}

/// Decode a write's body by its content type; an error is the status and message of
/// the `Status` to answer with.
pub(super) fn decode_body(
    content_type: &str,
    bytes: &[u8],
) -> Result<(PatchKind, Value), (StatusCode, &'static str, String)> {
    // Protobuf and CBOR are not spoken here: 415, as kube-apiserver answers a media
    // type it does not accept (client-go then sends JSON instead).
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.is_empty() && !media.contains("json") && !media.contains("yaml") {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json, application/yaml, application/apply-patch+yaml, \
                 application/merge-patch+json, application/strategic-merge-patch+json (got {media})"
            ),
        ));
    }
    let body: Value = if content_type.contains("yaml") {
        serde_yaml::from_slice(bytes)
            .map_err(|e| (StatusCode::BAD_REQUEST, "BadRequest", e.to_string()))?
    } else {
        serde_json::from_slice(bytes)
            .map_err(|e| (StatusCode::BAD_REQUEST, "BadRequest", e.to_string()))?
    };
    if content_type.contains("json-patch+json") {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "JSON patch is not supported by this test server".to_owned(),
        ));
    }
    let kind = if content_type.contains("apply-patch") {
        PatchKind::Apply
    } else {
        PatchKind::Merge
    };
    Ok((kind, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patches_and_bodies() {
        let mut o = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        json_patch::merge(
            &mut o,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": 2}),
        );
        assert_eq!(
            o,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": 2})
        );
        // RFC 7386: an object replacing a scalar loses its nulls too.
        let mut o = json!({"spec": 1});
        json_patch::merge(&mut o, &json!({"spec": {"a": null, "b": 2}}));
        assert_eq!(o, json!({"spec": {"b": 2}}));
        let (k, v) = decode_body("application/apply-patch+yaml", b"a: 1\n").unwrap();
        assert_eq!((k, v), (PatchKind::Apply, json!({"a": 1})));
        let (k, _) = decode_body("application/merge-patch+json", b"{}").unwrap();
        assert_eq!(k, PatchKind::Merge);
        let e = decode_body("application/json-patch+json", b"[]").unwrap_err();
        assert_eq!(e.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(
            decode_body("application/json", b"{").unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn protobuf_and_cbor_bodies_are_415_json_and_yaml_decode() {
        for ct in ["application/vnd.kubernetes.protobuf", "application/cbor"] {
            let e = decode_body(ct, b"\x6b\x38\x73\x00").unwrap_err();
            assert_eq!(e.0, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
        }
        let (kind, v) = decode_body("application/json; charset=utf-8", br#"{"a":1}"#).unwrap();
        assert_eq!((kind, v["a"].as_i64()), (PatchKind::Merge, Some(1)));
        let (kind, _) = decode_body("application/apply-patch+yaml", b"a: 1").unwrap();
        assert_eq!(kind, PatchKind::Apply);
    }
}
