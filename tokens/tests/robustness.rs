//! The classifier against hostile input: arbitrary strings and bytes never panic, and
//! no mutation of a valid token is ever routable to a different Pod.

use std::sync::OnceLock;

use podgate_tokens::gitlab::{self, RoutingKeys};
use podgate_tokens::keys;
use podgate_tokens::{
    Algorithm, Classification, Classifier, KeySet, MintRequest, PodId, TokenKind, unix_now,
};
use proptest::prelude::*;

const POD: u64 = 5;

struct Fixture {
    classifier: Classifier,
    tokens: Vec<String>,
}

/// One classifier that knows a key of every algorithm, and valid tokens of every
/// format routable to Pod 5.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let mut set = KeySet::new();
        let mut tokens = Vec::new();
        for (kid, alg) in [
            ("ed", Algorithm::EdDSA),
            ("es", Algorithm::ES256),
            ("rs", Algorithm::RS256),
            ("hs", Algorithm::HS256),
        ] {
            let one = keys::keyset_from_generated(kid, &keys::generate(alg).unwrap()).unwrap();
            let mut req = MintRequest::new(TokenKind::Job, PodId::new(POD).unwrap(), 3600);
            req.prefix = Some("glcbt-".into());
            req.project = Some(1234);
            tokens.push(mint_with(&one, &req));
            req.prefix = None;
            tokens.push(mint_with(&one, &req));
            set.merge(one).unwrap();
        }
        let keys = RoutingKeys {
            cell: Some(POD),
            organization: Some(1),
            user: Some(42),
            ..RoutingKeys::default()
        };
        tokens.push(gitlab::encode("glrt-", &keys, &gitlab::random_bytes()).unwrap());
        tokens.push(gitlab::encode("acme-glpat-", &keys, &gitlab::random_bytes()).unwrap());
        let classifier = Classifier::with_keys(set);
        for t in &tokens {
            assert_eq!(
                classifier.classify(t).pod(),
                PodId::new(POD),
                "fixture token {t} must route to Pod {POD}"
            );
        }
        Fixture { classifier, tokens }
    })
}

fn mint_with(set: &KeySet, req: &MintRequest) -> String {
    podgate_tokens::mint(req, set.signing_key().unwrap(), unix_now()).unwrap()
}

#[derive(Clone, Debug)]
enum Mutation {
    Substitute(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Delete(prop::sample::Index),
    Truncate(prop::sample::Index),
    /// Replace a span with a span of another valid token (splicing two tokens).
    Splice(prop::sample::Index, prop::sample::Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        prop::sample::select(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/".to_vec()
        ),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<prop::sample::Index>(), byte.clone()).prop_map(|(i, b)| Mutation::Substitute(i, b)),
        (any::<prop::sample::Index>(), byte).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<prop::sample::Index>().prop_map(Mutation::Delete),
        any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        (
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            1usize..40
        )
            .prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
    ]
}

fn apply(token: &str, other: &str, m: &Mutation) -> Vec<u8> {
    let mut t = token.as_bytes().to_vec();
    if t.is_empty() && !matches!(m, Mutation::Insert(..)) {
        return t;
    }
    match m {
        Mutation::Substitute(i, b) => {
            let i = i.index(t.len());
            t[i] = *b;
        }
        Mutation::Insert(i, b) => {
            let i = i.index(t.len() + 1);
            t.insert(i, *b);
        }
        Mutation::Delete(i) => {
            let i = i.index(t.len());
            t.remove(i);
        }
        Mutation::Truncate(i) => t.truncate(i.index(t.len())),
        Mutation::Splice(at, from, n) => {
            let at = at.index(t.len());
            let o = other.as_bytes();
            let from = from.index(o.len());
            let n = (*n).min(o.len() - from).min(t.len() - at);
            t[at..at + n].copy_from_slice(&o[from..from + n]);
        }
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(s in any::<String>()) {
        let c = &fixture().classifier;
        let _ = c.classify(&s);
        let _ = c.inspect(&s);
        let _ = podgate_tokens::fingerprint(&s);
    }

    #[test]
    fn token_like_strings_never_panic(
        s in "(gl[a-z]{1,6}-)?(eyJ[A-Za-z0-9_-]{0,40}\\.){0,3}[A-Za-z0-9_.-]{0,80}"
    ) {
        let c = &fixture().classifier;
        let _ = c.classify(&s);
        let _ = c.inspect(&s);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = fixture().classifier.classify_bytes(&b);
    }

    #[test]
    fn mutated_tokens_never_route_to_another_pod(
        which in any::<prop::sample::Index>(),
        other in any::<prop::sample::Index>(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let f = fixture();
        let token = &f.tokens[which.index(f.tokens.len())];
        let donor = &f.tokens[other.index(f.tokens.len())];
        let mut bytes = token.as_bytes().to_vec();
        for m in &mutations {
            let cur = String::from_utf8_lossy(&bytes).into_owned();
            bytes = apply(&cur, donor, m);
        }
        let verdict = f.classifier.classify_bytes(&bytes);
        if let Classification::Routable(id) = verdict {
            prop_assert_eq!(id.pod.get(), POD, "{:?} routed elsewhere", String::from_utf8_lossy(&bytes));
        }
        // A GitLab token with one character substituted is never accepted at all.
        // (A truncated one may lose its dots and look like a legacy token, which
        // goes to the legacy Pod and fails there: no misroute.)
        let gitlab = token.starts_with("glrt-") || token.starts_with("acme-glpat-");
        if gitlab && matches!(mutations.as_slice(), [Mutation::Substitute(..)])
            && bytes != token.as_bytes() {
                prop_assert!(
                    matches!(verdict, Classification::Invalid { .. }),
                    "{:?} -> {:?}", String::from_utf8_lossy(&bytes), verdict
                );
            }
    }
}
