//! GitLab routable tokens v1: the reference vector, round trips, and corruption.

use podgate_tokens::gitlab::{self, RANDOM_BYTES, RoutingKeys};
use podgate_tokens::{Classification, Classifier, InvalidReason, KeySet, TokenFormat, TokenKind};
use proptest::prelude::*;

const VECTOR: &str = "glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhI.01.1b0zz5pn1";

/// Every character a token may hold, plus a few it may not.
const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.+/=~:!%";

fn classifier() -> Classifier {
    Classifier::with_keys(KeySet::new())
}

#[test]
fn reference_vector_is_routable_to_pod_2_with_its_fields() {
    let c = classifier();
    let Classification::Routable(id) = c.classify(VECTOR) else {
        panic!("not routable: {:?}", c.classify(VECTOR));
    };
    assert_eq!(id.pod.get(), 2);
    assert_eq!(id.format, TokenFormat::GitlabV1);
    assert_eq!(id.kind, TokenKind::Runner);
    assert_eq!(id.group, Some(12_345));
    assert_eq!(id.organization, Some(1));
    assert_eq!(id.user, Some(42));
    assert_eq!(id.project, None);

    let report = serde_json::to_value(c.inspect(VECTOR)).unwrap();
    assert_eq!(report["format"], "gitlab-v1");
    assert_eq!(report["status"], "routable");
    assert_eq!(report["pod"], 2);
    assert_eq!(report["kind"], "runner");
    assert_eq!(
        report["fields"],
        serde_json::json!({"c": 2, "g": 12345, "o": 1, "u": 42})
    );
    assert!(report["reason"].is_null());
}

/// Every single-character substitution of a routable token is invalid: never
/// routable (to any Pod), never unroutable (which would send it to the legacy Pod).
fn assert_every_substitution_invalid(token: &str) {
    let c = classifier();
    let original_pod = c.classify(token).pod().expect("routable to begin with");
    for (i, orig) in token.char_indices() {
        for sub in ALPHABET.chars().filter(|&s| s != orig) {
            let mut t = String::with_capacity(token.len());
            t.push_str(&token[..i]);
            t.push(sub);
            t.push_str(&token[i + orig.len_utf8()..]);
            let verdict = c.classify(&t);
            assert!(
                matches!(verdict, Classification::Invalid { .. }),
                "{t} (pos {i}: {orig} -> {sub}) was {verdict:?}, token routes to {original_pod}"
            );
        }
    }
}

#[test]
fn every_single_character_corruption_of_the_vector_is_invalid() {
    assert_every_substitution_invalid(VECTOR);
}

#[test]
fn corruption_keeping_the_shape_is_a_crc_failure() {
    let c = classifier();
    // Change a payload character and a CRC digit: both keep the v1 shape.
    let payload_changed = VECTOR.replacen("GM6Mg", "GM6Mw", 1);
    assert_eq!(
        c.classify(&payload_changed),
        Classification::Invalid {
            reason: InvalidReason::BadCrc
        }
    );
    let crc_changed = format!("{}2", &VECTOR[..VECTOR.len() - 1]);
    assert_eq!(
        c.classify(&crc_changed),
        Classification::Invalid {
            reason: InvalidReason::BadCrc
        }
    );
}

fn keys_strategy() -> impl Strategy<Value = RoutingKeys> {
    (
        proptest::option::of(1u64..),
        any::<u64>(),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
        proptest::option::of(1u64..=3),
    )
        .prop_map(|(cell, org, group, project, user, t)| RoutingKeys {
            cell,
            organization: Some(org),
            group,
            project,
            user,
            runner_type: t,
            other: Default::default(),
        })
}

fn prefix_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("glrt-".to_string()),
        Just("glrtr-".to_string()),
        Just("glpat-".to_string()),
        Just("glcbt-".to_string()),
        Just("glagent-".to_string()),
        "[a-z]{1,8}-gl[a-z]{2,5}-",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_then_decode_round_trips(
        keys in keys_strategy(),
        prefix in prefix_strategy(),
        random in any::<[u8; RANDOM_BYTES]>(),
    ) {
        let token = gitlab::encode(&prefix, &keys, &random).unwrap();
        let decoded = gitlab::decode(&token).unwrap();
        prop_assert_eq!(decoded.version, 1);
        prop_assert_eq!(&decoded.prefix, &prefix);
        prop_assert_eq!(&decoded.keys, &keys);
        let verdict = classifier().classify(&token);
        match keys.cell {
            Some(cell) => prop_assert_eq!(verdict.pod().map(|p| p.get()), Some(cell)),
            None => prop_assert!(matches!(verdict, Classification::Unroutable { .. }), "{:?}", verdict),
        }
    }

    #[test]
    fn random_single_substitutions_are_invalid(
        keys in keys_strategy(),
        random in any::<[u8; RANDOM_BYTES]>(),
        pos in any::<prop::sample::Index>(),
        sub in prop::sample::select(ALPHABET.chars().collect::<Vec<_>>()),
    ) {
        let mut keys = keys;
        keys.cell.get_or_insert(1);
        let token = gitlab::encode("glrt-", &keys, &random).unwrap();
        let i = pos.index(token.len());
        prop_assume!(token.as_bytes()[i] != sub as u8);
        let mut t = token.clone();
        t.replace_range(i..=i, &sub.to_string());
        let verdict = classifier().classify(&t);
        prop_assert!(matches!(verdict, Classification::Invalid { .. }), "{} -> {:?}", t, verdict);
    }
}

#[test]
fn exhaustive_corruption_of_a_few_random_tokens() {
    let keys = RoutingKeys {
        cell: Some(7),
        organization: Some(99),
        project: Some(123_456_789),
        runner_type: Some(3),
        ..RoutingKeys::default()
    };
    for prefix in ["glrt-", "acme-glcbt-", ""] {
        let t = gitlab::encode(prefix, &keys, &gitlab::random_bytes()).unwrap();
        assert_every_substitution_invalid(&t);
    }
}
