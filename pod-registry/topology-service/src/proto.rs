//! The generated types and stubs, one module per protobuf package: GitLab's
//! `gitlab.cells.topology_service` (and its `types.v1`, `claims.v1`), googleapis'
//! `google.api` (the `http` option's types) and gRPC's `grpc.health.v1`.

#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/_includes.rs"));

/// The descriptor set protoc made of the transcription (`build.rs`): every file,
/// imports included, as protoc serialises it.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/topology.bin"));

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    /// SHA-256 of each file's `FileDescriptorProto` as GitLab's client gem carries it
    /// (the `descriptor_data` literal of `lib/proto/**/*_pb.rb` in gitlabhq/gitlabhq
    /// `vendor/gems/gitlab-topology-service-client/`; `classify_service` at
    /// 41946e65501d176230532ae34b16e64f5cdac462, `claims/v1/*` and `types/v1/claim` at
    /// ef0ff4b5d63d1422a728195cc62eb4b6e74ba1d9, the rest at
    /// ccdff2f3cab442b4197cc9742b534e7e5645c52a), and its length. Computed with
    /// `scripts/lib/topology_descriptors.py` from those files; nothing of GitLab's is
    /// kept but these digests.
    const GITLAB: &[(&str, &str, usize)] = &[
        (
            "proto/autz.proto",
            "30df84e09be6c9339cd1bddda05478ef63cd96fc4733966d8835f387b203197b",
            775,
        ),
        (
            "proto/cell_info.proto",
            "1569efdc7718f60799626861e9bcf2200a86240a5629b247ccffbc7d22e3f648",
            757,
        ),
        (
            "proto/cell_service.proto",
            "1935f29c1d53dc70f4793ce8b0136950a4b39f9628c787798384cb2c58055505",
            634,
        ),
        (
            "proto/claims/v1/messages.proto",
            "71b14f8fd0ef9b0eed437e1b7ae882b0e7dd76ac725e9dd85c7eb484d60e6b92",
            2922,
        ),
        (
            "proto/claims/v1/service.proto",
            "9ac7a4f4cb7dc47209ec8b6e9fc74800a3665efb3121f56b34004b3f3a5c46bc",
            3587,
        ),
        (
            "proto/classify_service.proto",
            "b5f3c5c4cfc264a5e88df614bfb009da3330d2e759a425c79091d97f29ce62cf",
            1324,
        ),
        (
            "proto/types/v1/claim.proto",
            "b55929395d151d01adf0a9d2557b806e1e8975a204054ee85da30f5c99780840",
            1743,
        ),
        (
            "proto/types/v1/uuid.proto",
            "3bd5419b0db5e8410e78c372bccb8decdcc8a7c649775bb8746b36ff28ab396e",
            432,
        ),
    ];

    /// The files of a `FileDescriptorSet` (`repeated FileDescriptorProto file = 1`),
    /// each as protoc serialised it, by name (the file's field 1).
    fn files(mut set: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        while !set.is_empty() {
            let key = prost::encoding::decode_varint(&mut set).unwrap();
            assert_eq!(key, (1 << 3) | 2, "FileDescriptorSet.file");
            let len = usize::try_from(prost::encoding::decode_varint(&mut set).unwrap()).unwrap();
            let (file, rest) = set.split_at(len);
            set = rest;
            let mut f = file;
            assert_eq!(
                prost::encoding::decode_varint(&mut f).unwrap(),
                (1 << 3) | 2
            );
            let n = usize::try_from(prost::encoding::decode_varint(&mut f).unwrap()).unwrap();
            out.push((
                String::from_utf8(f[..n].to_vec()).unwrap(),
                without_source_info(file),
            ));
        }
        out
    }

    /// `file` without its `source_code_info` (field 9: comments and spans, which
    /// prost-build asks protoc for and GitLab's gem does not carry).
    fn without_source_info(file: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(file.len());
        let mut rest = file;
        while !rest.is_empty() {
            let start = rest;
            let key = prost::encoding::decode_varint(&mut rest).unwrap();
            match key & 7 {
                0 => {
                    prost::encoding::decode_varint(&mut rest).unwrap();
                }
                1 => rest = &rest[8..],
                2 => {
                    let n = usize::try_from(prost::encoding::decode_varint(&mut rest).unwrap())
                        .unwrap();
                    rest = &rest[n..];
                }
                5 => rest = &rest[4..],
                w => panic!("wire type {w} in a FileDescriptorProto"),
            }
            if key >> 3 != 9 {
                out.extend_from_slice(&start[..start.len() - rest.len()]);
            }
        }
        out
    }

    /// The transcription compiles to GitLab's descriptors byte for byte: every
    /// name, number, type, option (the `access_control` rules, `google.api.http`)
    /// and import is GitLab's. `scripts/check-topology-protos.sh` names a
    /// difference; this says whether there is one, offline.
    #[test]
    fn the_transcription_is_gitlabs_schema_byte_for_byte() {
        let ours = files(super::DESCRIPTOR_SET);
        for (name, digest, len) in GITLAB {
            let (_, bytes) = ours
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name} is not transcribed"));
            assert_eq!(bytes.len(), *len, "{name}: length");
            assert_eq!(hex(&Sha256::digest(bytes)), *digest, "{name}: digest");
        }
        let extra: Vec<&str> = ours
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| n.starts_with("proto/") && !GITLAB.iter().any(|(g, ..)| g == n))
            .collect();
        assert!(extra.is_empty(), "not GitLab's: {extra:?}");
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
