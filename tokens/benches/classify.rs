//! Classifier benchmarks, one per format, plus the cache hit.
//!
//! Run: `cargo bench -p podgate-tokens --bench classify`
//! Goals (issue 2): cache hit ≤ 1 µs, Ed25519 uncached ≤ 60 µs.

// criterion_group! defines an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use podgate_tokens::gitlab::{self, RoutingKeys};
use podgate_tokens::keys::{self, Algorithm};
use podgate_tokens::{Classifier, KeySet, MintRequest, PodId, TokenKind, unix_now};

fn bench(c: &mut Criterion) {
    let mut set = KeySet::new();
    let mut jwts = Vec::new();
    let now = unix_now();
    for (kid, alg) in [
        ("hs", Algorithm::HS256),
        ("ed", Algorithm::EdDSA),
        ("es", Algorithm::ES256),
        ("rs", Algorithm::RS256),
    ] {
        let one = keys::keyset_from_generated(kid, &keys::generate(alg).unwrap()).unwrap();
        let mut req = MintRequest::new(TokenKind::Job, PodId::new(2).unwrap(), 3600);
        req.organization = Some(1);
        req.project = Some(123_456);
        req.prefix = Some("glcbt-".into());
        jwts.push((
            alg,
            podgate_tokens::mint(&req, one.signing_key().unwrap(), now).unwrap(),
        ));
        set.merge(one).unwrap();
    }
    let classifier = Classifier::with_keys(set);
    let v1 = gitlab::encode(
        "glrt-",
        &RoutingKeys {
            cell: Some(2),
            organization: Some(1),
            group: Some(12_345),
            user: Some(42),
            runner_type: Some(2),
            ..RoutingKeys::default()
        },
        &gitlab::random_bytes(),
    )
    .unwrap();

    let mut g = c.benchmark_group("classify");
    g.bench_function("gitlab_v1_decode", |b| {
        b.iter(|| classifier.classify_uncached_at(black_box(&v1), now))
    });
    g.bench_function("opaque_legacy", |b| {
        b.iter(|| classifier.classify_uncached_at(black_box("glrt-t1_xK3jd8Qp2LmNvB7wZ9aY"), now))
    });
    for (alg, token) in &jwts {
        assert_eq!(
            classifier
                .classify_uncached_at(token, now)
                .pod()
                .map(PodId::get),
            Some(2)
        );
        g.bench_function(
            format!("jwt_{}_uncached", alg.as_str().to_lowercase()),
            |b| b.iter(|| classifier.classify_uncached_at(black_box(token), now)),
        );
    }
    let (_, ed) = jwts.iter().find(|(a, _)| *a == Algorithm::EdDSA).unwrap();
    classifier.classify(ed);
    g.bench_function("jwt_cache_hit", |b| {
        b.iter(|| classifier.classify(black_box(ed)))
    });
    g.bench_function("fingerprint", |b| {
        b.iter(|| podgate_tokens::fingerprint(black_box(ed)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
