# syntax=docker/dockerfile:1
#
# The csi-provisioner sidecar image (the reference CSI driver is included for the demo
# Deployment in deploy/). Build from the repository root:
#
#   docker build -t csi-provisioner-rs:0.1.0 .
#   docker run --rm csi-provisioner-rs:0.1.0 --version
#
# Both binaries are linked statically against musl, so the final image needs no libc and
# runs on distroless/static. Why musl rather than static glibc: glibc does not support full
# static linking (getaddrinfo/NSS would still try to load shared modules at run time), and
# musl's slower allocator does not matter for a sidecar that waits on the API server and the
# driver most of the time.

ARG RUST_VERSION=1.95
ARG TARGET=x86_64-unknown-linux-musl

FROM rust:${RUST_VERSION}-bookworm AS build
ARG TARGET
# musl-tools: a musl C compiler for the C and assembly parts of ring (TLS). The CSI proto is
# compiled in pure Rust (protox), so no protoc is needed.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "${TARGET}"
WORKDIR /src
COPY . .
# The release build of the two shipped binaries from the committed Cargo.lock; docs/deploy.md
# gives the same command for a build without Docker.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target "${TARGET}" \
        --bin csi-provisioner --bin csi-reference-driver \
    && mkdir -p /out \
    && cp "target/${TARGET}/release/csi-provisioner" \
          "target/${TARGET}/release/csi-reference-driver" /out/

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/csi-provisioner /out/csi-reference-driver /usr/local/bin/
# distroless "nonroot" (65532); numeric so runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/csi-provisioner"]
