//! JWT routable tokens: every algorithm, every rejection reason, rotation, the cache,
//! and key files.

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use podgate_tokens::keys::{self, GeneratedKey};
use podgate_tokens::{
    Algorithm, Classification, Classifier, ClassifierConfig, InvalidReason, KeySet, MintRequest,
    PodId, TokenFormat, TokenKind, UnroutableReason, mint, unix_now,
};
use serde_json::json;
use sha2::Sha256;

const ALGS: [Algorithm; 4] = [
    Algorithm::EdDSA,
    Algorithm::ES256,
    Algorithm::RS256,
    Algorithm::HS256,
];

fn generated(alg: Algorithm) -> GeneratedKey {
    keys::generate(alg).unwrap()
}

fn keyset(kid: &str, key: &GeneratedKey) -> KeySet {
    keys::keyset_from_generated(kid, key).unwrap()
}

fn pod(n: u64) -> PodId {
    PodId::new(n).unwrap()
}

fn invalid(reason: InvalidReason) -> Classification {
    Classification::Invalid { reason }
}

/// Sign arbitrary header and claims JSON with HMAC-SHA256, to craft hostile tokens.
fn hs256_raw(header: serde_json::Value, claims: serde_json::Value, secret: &[u8]) -> String {
    let h = URL_SAFE_NO_PAD.encode(header.to_string());
    let c = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(format!("{h}.{c}").as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{h}.{c}.{sig}")
}

#[test]
fn every_algorithm_mints_and_verifies() {
    for alg in ALGS {
        let key = generated(alg);
        let set = keyset("k1", &key);
        let mut req = MintRequest::new(TokenKind::Runner, pod(3), 3600);
        req.organization = Some(1);
        req.project = Some(77);
        req.runner_type = Some(podgate_tokens::RunnerType::Project);
        let token = mint(&req, set.signing_key().unwrap(), unix_now()).unwrap();
        let c = Classifier::with_keys(set);
        let Classification::Routable(id) = c.classify(&token) else {
            panic!("{alg}: {:?}", c.classify(&token));
        };
        assert_eq!(id.pod, pod(3), "{alg}");
        assert_eq!(id.kind, TokenKind::Runner);
        assert_eq!(id.format, TokenFormat::Jwt);
        assert_eq!(id.organization, Some(1));
        assert_eq!(id.project, Some(77));
        assert_eq!(id.runner_type, Some(podgate_tokens::RunnerType::Project));
        assert!(id.expires_at.is_some());
    }
}

#[test]
fn tampered_signature_and_claims_are_bad_signature() {
    for alg in ALGS {
        let set = keyset("k1", &generated(alg));
        let token = mint(
            &MintRequest::new(TokenKind::Job, pod(2), 600),
            set.signing_key().unwrap(),
            unix_now(),
        )
        .unwrap();
        let c = Classifier::with_keys(set);
        // Flip a bit in the middle of the signature.
        let (body, sig) = token.rsplit_once('.').unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(sig).unwrap();
        let mid = raw.len() / 2;
        raw[mid] ^= 0x01;
        let tampered = format!("{body}.{}", URL_SAFE_NO_PAD.encode(&raw));
        assert_eq!(
            c.classify(&tampered),
            invalid(InvalidReason::BadSignature),
            "{alg}"
        );

        // Re-point the token at Pod 3, keeping the signature.
        let mut parts: Vec<&str> = token.split('.').collect();
        let mut claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        claims["c"] = json!("3");
        let forged = URL_SAFE_NO_PAD.encode(claims.to_string());
        parts[1] = &forged;
        assert_eq!(
            c.classify(&parts.join(".")),
            invalid(InvalidReason::BadSignature),
            "{alg}"
        );
    }
}

#[test]
fn expired_and_not_yet_valid_honour_the_leeway() {
    let set = keyset("k1", &generated(Algorithm::EdDSA));
    let sk = set.signing_key().unwrap().clone();
    let config = ClassifierConfig {
        leeway_secs: 30,
        ..ClassifierConfig::default()
    };
    let c = Classifier::new(config, set).unwrap();
    let now = unix_now();
    let req = MintRequest::new(TokenKind::Job, pod(2), 100);

    let issued_long_ago = mint(&req, &sk, now - 1000).unwrap(); // exp = now - 900
    assert_eq!(
        c.classify_at(&issued_long_ago, now),
        invalid(InvalidReason::Expired)
    );
    let just_expired = mint(&req, &sk, now - 120).unwrap(); // exp = now - 20, within leeway
    assert_eq!(c.classify_at(&just_expired, now).pod(), Some(pod(2)));

    let future = mint(&req, &sk, now + 1000).unwrap(); // nbf = now + 1000
    assert_eq!(
        c.classify_at(&future, now),
        invalid(InvalidReason::NotYetValid)
    );
    // Not-yet-valid is never cached: the same token becomes valid when its time comes.
    assert_eq!(c.classify_at(&future, now + 1000).pod(), Some(pod(2)));
    let skewed = mint(&req, &sk, now + 20).unwrap(); // within leeway
    assert_eq!(c.classify_at(&skewed, now).pod(), Some(pod(2)));
}

#[test]
fn unknown_kid_and_missing_kid() {
    let a = generated(Algorithm::EdDSA);
    let b = generated(Algorithm::EdDSA);
    let token = mint(
        &MintRequest::new(TokenKind::Job, pod(2), 600),
        keyset("other", &b).signing_key().unwrap(),
        unix_now(),
    )
    .unwrap();
    let c = Classifier::with_keys(keyset("k1", &a));
    assert_eq!(c.classify(&token), invalid(InvalidReason::UnknownKeyId));

    // No kid: fine when the set holds a single key of that algorithm...
    let secret = [7u8; 32];
    let mut set = KeySet::new();
    set.add_hs256("only", &secret, Path::new("test")).unwrap();
    let claims = json!({"c": "2", "exp": unix_now() + 60});
    let no_kid = hs256_raw(json!({"alg": "HS256"}), claims.clone(), &secret);
    assert_eq!(
        Classifier::with_keys(set.clone()).classify(&no_kid).pod(),
        Some(pod(2))
    );
    // ...and refused when it holds several.
    set.add_hs256("second", &[8u8; 32], Path::new("test"))
        .unwrap();
    assert_eq!(
        Classifier::with_keys(set).classify(&no_kid),
        invalid(InvalidReason::MissingKeyId)
    );
    assert_eq!(
        Classifier::with_keys(KeySet::new()).classify(&no_kid),
        invalid(InvalidReason::NoKeys)
    );
}

#[test]
fn alg_none_is_rejected() {
    let set = keyset("k1", &generated(Algorithm::EdDSA));
    let c = Classifier::with_keys(set);
    let claims = URL_SAFE_NO_PAD.encode(json!({"c": "2", "exp": unix_now() + 60}).to_string());
    for alg in ["none", "None", "NONE"] {
        let header = URL_SAFE_NO_PAD.encode(json!({"alg": alg, "kid": "k1"}).to_string());
        assert_eq!(
            c.classify(&format!("{header}.{claims}.")),
            invalid(InvalidReason::AlgorithmNone),
            "{alg}"
        );
    }
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "HS512", "kid": "k1"}).to_string());
    assert_eq!(
        c.classify(&format!("{header}.{claims}.c2ln")),
        invalid(InvalidReason::AlgorithmNotAllowed)
    );
}

#[test]
fn hs256_signed_with_a_public_key_is_algorithm_confusion() {
    for alg in [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA] {
        let key = generated(alg);
        let public_pem = key.public.clone().unwrap();
        let c = Classifier::with_keys(keyset("pub1", &key));
        // The classic attack: sign HS256 with the (public) verification key as secret.
        let forged = hs256_raw(
            json!({"alg": "HS256", "kid": "pub1"}),
            json!({"c": "9", "exp": unix_now() + 60}),
            public_pem.as_bytes(),
        );
        assert_eq!(
            c.classify(&forged),
            invalid(InvalidReason::AlgorithmMismatch),
            "{alg}"
        );
    }
}

#[test]
fn claim_problems_have_their_own_reasons() {
    let secret = [9u8; 32];
    let mut set = KeySet::new();
    set.add_hs256("k", &secret, Path::new("test")).unwrap();
    let c = Classifier::new(
        ClassifierConfig {
            audience: Some("podgate".into()),
            issuer: Some("gitlab".into()),
            ..ClassifierConfig::default()
        },
        set,
    )
    .unwrap();
    let exp = unix_now() + 60;
    let h = json!({"alg": "HS256", "kid": "k"});
    let sign = |claims| c.classify(&hs256_raw(h.clone(), claims, &secret));
    let good = json!({"c": "2", "exp": exp, "aud": ["x", "podgate"], "iss": "gitlab"});
    assert_eq!(sign(good).pod(), Some(pod(2)));
    assert_eq!(
        sign(json!({"c": "2", "aud": "podgate", "iss": "gitlab"})),
        invalid(InvalidReason::MissingClaim("exp"))
    );
    assert_eq!(
        sign(json!({"c": "2", "exp": exp, "aud": "other", "iss": "gitlab"})),
        invalid(InvalidReason::WrongAudience)
    );
    assert_eq!(
        sign(json!({"c": "2", "exp": exp, "aud": "podgate", "iss": "evil"})),
        invalid(InvalidReason::WrongIssuer)
    );
    assert_eq!(
        sign(json!({"c": "0", "exp": exp, "aud": "podgate", "iss": "gitlab"})),
        invalid(InvalidReason::BadClaim("c"))
    );
    assert_eq!(
        sign(json!({"c": true, "exp": exp, "aud": "podgate", "iss": "gitlab"})),
        invalid(InvalidReason::BadClaim("c"))
    );
    assert_eq!(
        sign(json!({"c": "2", "exp": "soon", "aud": "podgate", "iss": "gitlab"})),
        invalid(InvalidReason::BadClaim("exp"))
    );
    assert_eq!(
        sign(json!({"c": "2", "kind": "wizard", "exp": exp, "aud": "podgate", "iss": "gitlab"})),
        invalid(InvalidReason::BadClaim("kind"))
    );
    assert_eq!(
        sign(json!({"exp": exp, "aud": "podgate", "iss": "gitlab"})),
        Classification::Unroutable {
            reason: UnroutableReason::NoPodKey
        }
    );
    // Integers and base-36 strings both work: "a" is 10 in base 36.
    assert_eq!(
        sign(json!({"c": 10, "exp": exp, "aud": "podgate", "iss": "gitlab"})).pod(),
        Some(pod(10))
    );
    assert_eq!(
        sign(json!({"c": "a", "exp": exp, "aud": "podgate", "iss": "gitlab"})).pod(),
        Some(pod(10))
    );
}

#[test]
fn gitlab_style_glcbt_job_jwt_routes_by_its_cell_claim() {
    // GitLab's JWT job tokens: RS256, glcbt- prefix, routing ids as base-36 strings,
    // no `kind` claim (the prefix says "job").
    let key = generated(Algorithm::RS256);
    let set = keyset("gitlab-ci", &key);
    let ek = jsonwebtoken::EncodingKey::from_rsa_pem(key.private.as_bytes()).unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("gitlab-ci".into());
    let now = unix_now();
    let claims = json!({
        "sub": "gid://gitlab/Ci::Build/1234", "aud": "gitlab-authz-token",
        "iat": now, "nbf": now - 5, "exp": now + 300, "jti": "abc",
        "c": "2", "o": "1", "u": "16", "p": "2n9c", "g": "9ix", "scoped_user_id": 42
    });
    let jwt = jsonwebtoken::encode(&header, &claims, &ek).unwrap();
    let token = format!("glcbt-{jwt}");
    let c = Classifier::with_keys(set);
    let Classification::Routable(id) = c.classify(&token) else {
        panic!("{:?}", c.classify(&token))
    };
    assert_eq!(id.pod, pod(2));
    assert_eq!(id.kind, TokenKind::Job);
    assert_eq!(id.user, Some(42));
    assert_eq!(id.project, Some(123_456));
    assert_eq!(id.group, Some(12_345));
    let report = serde_json::to_value(c.inspect(&token)).unwrap();
    assert_eq!(report["format"], "jwt");
    assert_eq!(report["prefix"], "glcbt-");
    assert_eq!(report["fields"]["g"], 12345);
    assert_eq!(report["fields"]["sub"], "gid://gitlab/Ci::Build/1234");
}

#[test]
fn key_rotation_keeps_old_tokens_valid_until_the_old_key_leaves() {
    let old = generated(Algorithm::EdDSA);
    let new = generated(Algorithm::EdDSA);
    let req = MintRequest::new(TokenKind::Runner, pod(4), 3600);
    let now = unix_now();

    let mut set = keyset("2026-10", &old);
    let c = Classifier::with_keys(set.clone());
    let old_token = mint(&req, c.keys().signing_key().unwrap(), now).unwrap();
    assert_eq!(c.classify(&old_token).pod(), Some(pod(4)));

    // Step 1: add the new key and sign with it; the old one stays for verification.
    set.merge(keyset("2026-11", &new)).unwrap();
    set.set_signing("2026-11").unwrap();
    c.set_keys(set.clone());
    let new_token = mint(&req, c.keys().signing_key().unwrap(), now).unwrap();
    assert!(new_token.starts_with("eyJ"));
    assert_eq!(c.classify(&new_token).pod(), Some(pod(4)));
    assert_eq!(
        c.classify(&old_token).pod(),
        Some(pod(4)),
        "old token during rotation"
    );

    // Step 2: the old key leaves; its tokens stop verifying at once, cache or not.
    assert!(set.remove("2026-10"));
    c.set_keys(set);
    assert_eq!(c.classify(&old_token), invalid(InvalidReason::UnknownKeyId));
    assert_eq!(c.classify(&new_token).pod(), Some(pod(4)));
}

#[test]
fn the_cache_answers_repeats_and_honours_expiry() {
    let set = keyset("k1", &generated(Algorithm::EdDSA));
    let sk = set.signing_key().unwrap().clone();
    let c = Classifier::new(
        ClassifierConfig {
            leeway_secs: 0,
            ..ClassifierConfig::default()
        },
        set,
    )
    .unwrap();
    let now = unix_now();
    let token = mint(&MintRequest::new(TokenKind::Runner, pod(5), 100), &sk, now).unwrap();
    assert_eq!(c.classify_at(&token, now).pod(), Some(pod(5)));
    let s0 = c.cache_stats();
    assert_eq!((s0.hits, s0.misses, s0.len), (0, 1, 1));
    for _ in 0..10 {
        assert_eq!(c.classify_at(&token, now + 50).pod(), Some(pod(5)));
    }
    assert_eq!(c.cache_stats().hits, 10);
    // Past `exp` the cached verdict is not used: the token is re-checked and expired.
    assert_eq!(
        c.classify_at(&token, now + 101),
        invalid(InvalidReason::Expired)
    );
    assert_eq!(c.cache_stats().misses, 2);

    // A bad token is cached too (negatively), so retries cost no signature check.
    let (body, _) = token.rsplit_once('.').unwrap();
    let bad = format!("{body}.AAAA");
    assert_eq!(
        c.classify_at(&bad, now),
        invalid(InvalidReason::BadSignature)
    );
    assert_eq!(
        c.classify_at(&bad, now),
        invalid(InvalidReason::BadSignature)
    );
    assert_eq!(c.cache_stats().hits, 11);
}

#[test]
fn keys_load_from_pem_files_jwks_and_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ed = generated(Algorithm::EdDSA);
    let es = generated(Algorithm::ES256);
    let rs = generated(Algorithm::RS256);
    let hs = generated(Algorithm::HS256);
    std::fs::write(d.join("ed1.pem"), ed.public.as_ref().unwrap()).unwrap();
    std::fs::write(d.join("ed1.private.pem"), ed.private.as_bytes()).unwrap();
    std::fs::write(d.join("es1.pem"), es.public.as_ref().unwrap()).unwrap();
    std::fs::write(d.join("hs1.hs256"), format!("{}\n", hs.private.as_str())).unwrap();
    std::fs::write(d.join("README"), "ignored").unwrap();

    // A JWKS holding the RSA public key, built from its components.
    let rs_pk = {
        use rsa::pkcs8::DecodePublicKey;
        use rsa::traits::PublicKeyParts;
        let k = rsa::RsaPublicKey::from_public_key_pem(rs.public.as_ref().unwrap()).unwrap();
        (k.n().to_bytes_be(), k.e().to_bytes_be())
    };
    let jwks = json!({"keys": [{
        "kty": "RSA", "kid": "rs1", "alg": "RS256", "use": "sig",
        "n": URL_SAFE_NO_PAD.encode(&rs_pk.0), "e": URL_SAFE_NO_PAD.encode(&rs_pk.1)
    }]});
    std::fs::write(d.join("jwks.json"), jwks.to_string()).unwrap();

    let mut set = KeySet::load(d).unwrap();
    assert_eq!(set.kids().collect::<Vec<_>>(), ["ed1", "es1", "hs1", "rs1"]);
    assert_eq!(set.get("rs1").unwrap().algorithm(), Algorithm::RS256);
    // Two private keys (ed1, hs1): the signing key must be chosen.
    assert!(set.signing_key().is_err());
    set.set_signing("ed1").unwrap();

    let c = Classifier::with_keys(set);
    let req = MintRequest::new(TokenKind::Agent, pod(6), 60);
    for (kid, key) in [("es1", &es), ("rs1", &rs), ("hs1", &hs)] {
        let signer = keys::keyset_from_generated(kid, key).unwrap();
        let t = mint(&req, signer.signing_key().unwrap(), unix_now()).unwrap();
        assert_eq!(c.classify(&t).pod(), Some(pod(6)), "{kid}");
    }
    let t = mint(&req, c.keys().signing_key().unwrap(), unix_now()).unwrap();
    assert_eq!(c.classify(&t).pod(), Some(pod(6)), "ed1");
}

#[test]
fn bad_key_files_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("short.hs256"), "c2hvcnQ=").unwrap();
    let err = KeySet::load(d).unwrap_err().to_string();
    assert!(err.contains("short.hs256") && err.contains("32"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("k.pem"),
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let err = KeySet::load(d).unwrap_err().to_string();
    assert!(err.contains("k.pem"), "{err}");

    // The same kid twice with different keys is refused.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = generated(Algorithm::EdDSA);
    let b = generated(Algorithm::EdDSA);
    std::fs::write(d.join("k.pem"), a.public.as_ref().unwrap()).unwrap();
    std::fs::write(d.join("k.private.pem"), b.private.as_bytes()).unwrap();
    assert!(matches!(
        KeySet::load(d),
        Err(keys::Error::DuplicateKid { .. })
    ));
}
