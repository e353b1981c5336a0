# The podgate image: one binary for every role. `deploy/` runs it with the role as
# its first argument (`proxy`, `kas`, `agentk`).
#
#   docker build -t registry.example.com/podgate:$(git rev-parse --short HEAD) .
#   (cd deploy/kas && kustomize edit set image podgate=registry.example.com/podgate:…)
#
# tests/deploy.rs checks what it can without a Docker engine: the runtime stage
# installs every shared library the binary links, and each Deployment's first
# argument is a podgate subcommand.

FROM rust:1.95-bookworm AS build
# cmake: pingora's zlib-ng; protobuf-compiler and libprotobuf-dev: tonic and the well-known protobufs; libssl-dev and pkg-config:
# Debian's OpenSSL, linked rather than vendored (.cargo/config.toml).
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake protobuf-compiler libprotobuf-dev libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Without the default feature `sim`: the product's commands only, no simulators
# (`podgate up`, `pod-sim`, `kube-sim`, `loadtest`, `workspaces`).
RUN cargo build --release --locked --no-default-features --bin podgate \
 && cp target/release/podgate /podgate

FROM debian:bookworm-slim
# libssl3: the binary's one shared library beyond libc6 and libgcc-s1, which the
# base has; ca-certificates: TLS to GitLab, kas and Redis.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /podgate /usr/local/bin/podgate
# The manifests' runAsUser; no shell needed at run time.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/podgate"]
