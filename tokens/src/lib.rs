//! # podgate-tokens
//!
//! Everything podgate routes on starts here: given any token string, say which Pod
//! it belongs to, or why it belongs to none in particular, or why it must be refused.
//!
//! ```
//! use podgate_tokens::{Classification, Classifier, KeySet};
//!
//! let classifier = Classifier::with_keys(KeySet::new());
//! let token = "glrt-AAAAAAAAAAAAAAAAAAAAAGM6MgpnOjlpeApvOjEKdToxNhI.01.1b0zz5pn1";
//! match classifier.classify(token) {
//!     Classification::Routable(id) => assert_eq!(id.pod.get(), 2),
//!     other => panic!("{other:?}"),
//! }
//! ```
//!
//! ## Where to start reading
//!
//! - [`identity`]: the domain types: [`PodId`], [`TokenKind`], [`Identity`] and the
//!   three-way [`Classification`] (`Routable` / `Unroutable` / `Invalid`, each
//!   reason with a stable code for metrics).
//! - [`classifier`]: [`Classifier`], which picks the format by shape, verifies, and
//!   caches verified JWT verdicts.
//! - [`gitlab`]: GitLab's routable token v1 (encode, decode) and v0 (decode).
//! - [`jwt`]: podgate's JWT routable tokens; the claim set is documented there.
//! - [`keys`]: [`KeySet`], verification keys by `kid` and the signing key, loaded
//!   from PEM, JWKS and HS256 secret files; key generation.
//! - [`inspect`] and [`fingerprint()`]: what operators and logs get to see.
//!
//! ## Guarantees
//!
//! - A token that is routable names its Pod honestly: a JWT's signature verified
//!   with a key of the algorithm it names; a GitLab v1 token's CRC matched (GitLab v1
//!   tokens are not signed: GitLab itself authenticates them, the CRC only guards
//!   against corruption).
//! - No single-character change to a GitLab routable token keeps it routable.
//! - Nothing here panics on any input, and nothing exposes a token's secret part.

pub mod classifier;
pub mod fingerprint;
pub mod gitlab;
pub mod identity;
pub mod inspect;
pub mod jwt;
pub mod keys;

pub use classifier::{CacheStats, Classifier, ClassifierConfig, unix_now};
pub use fingerprint::fingerprint;
pub use identity::{
    Classification, Identity, InvalidReason, PodId, RunnerType, TokenFormat, TokenKind,
    UnroutableReason,
};
pub use inspect::Inspection;
pub use jwt::{MintRequest, mint};
pub use keys::{Algorithm, KeySet, SigningKey};
