//! `google.protobuf.Any` as Go's `anypb` packs and unpacks it: GitLab's kas and
//! agentk carry module-specific header fields in `grpctool.HttpRequest.Header.extra`
//! (`kubernetes_api.rpc.HeaderExtra`, `gitlab_access.rpc.HeaderExtra`).
//!
//! Packing writes `type.googleapis.com/<full name>` (`anypb.New`); unpacking accepts
//! any type URL whose last `/`-separated part is the message's full name
//! (`anypb.UnmarshalTo` → `Any.MessageIs`), else it names both types, as Go's
//! `mismatched message type: got "…", want "…"`.

use thiserror::Error;

/// The prefix `anypb.New` writes.
pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// Why an `Any` does not hold the message wanted. Not retryable: the sender must
/// send another message.
#[derive(Debug, Error)]
pub enum Error {
    /// The type URL names another message (or none).
    #[error("mismatched message type: got {got:?}, want {want:?}")]
    Mismatched {
        /// The type URL sent.
        got: String,
        /// The full name wanted.
        want: &'static str,
    },
    /// The type URL is right but the bytes are not that message.
    #[error("{want}: {source}")]
    Decode {
        /// The full name wanted.
        want: &'static str,
        /// prost's reason.
        #[source]
        source: prost::DecodeError,
    },
}

/// `message` (whose protobuf full name is `full_name`) in an `Any`.
pub fn pack<M: prost::Message>(full_name: &str, message: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("{TYPE_URL_PREFIX}{full_name}"),
        value: message.encode_to_vec(),
    }
}

/// The `full_name` message in `any`.
pub fn unpack<M: prost::Message + Default>(
    any: &prost_types::Any,
    full_name: &'static str,
) -> Result<M, Error> {
    let named = any.type_url.rsplit('/').next().unwrap_or_default();
    if named != full_name {
        return Err(Error::Mismatched {
            got: any.type_url.clone(),
            want: full_name,
        });
    }
    M::decode(any.value.as_slice()).map_err(|source| Error::Decode {
        want: full_name,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::gitlab_access::HeaderExtra;

    const NAME: &str = "gitlab.agent.gitlab_access.rpc.HeaderExtra";

    #[test]
    fn packs_and_unpacks_as_go_anypb() {
        let extra = HeaderExtra {
            module_name: "remote_development".into(),
        };
        let any = pack(NAME, &extra);
        assert_eq!(
            any.type_url,
            "type.googleapis.com/gitlab.agent.gitlab_access.rpc.HeaderExtra"
        );
        assert_eq!(unpack::<HeaderExtra>(&any, NAME).unwrap(), extra);
        // Another domain is fine (MessageIs compares the name only).
        let other = prost_types::Any {
            type_url: format!("example.com/x/{NAME}"),
            value: any.value.clone(),
        };
        assert_eq!(unpack::<HeaderExtra>(&other, NAME).unwrap(), extra);
        let wrong = prost_types::Any {
            type_url: "type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra".into(),
            value: any.value.clone(),
        };
        assert_eq!(
            unpack::<HeaderExtra>(&wrong, NAME).unwrap_err().to_string(),
            "mismatched message type: got \"type.googleapis.com/gitlab.agent.kubernetes_api.rpc.HeaderExtra\", \
             want \"gitlab.agent.gitlab_access.rpc.HeaderExtra\""
        );
        let garbage = prost_types::Any {
            type_url: any.type_url.clone(),
            value: vec![0xff],
        };
        assert!(matches!(
            unpack::<HeaderExtra>(&garbage, NAME),
            Err(Error::Decode { .. })
        ));
    }
}
