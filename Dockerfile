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

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The same script the test command runs (hack/test.sh), so the image's build is what CI tests:
# it adds the musl target and musl-tools, then builds both binaries from the committed
# Cargo.lock. The CSI proto is compiled in pure Rust (protox), so no protoc is needed.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash hack/build-static.sh /out

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/csi-provisioner /out/csi-reference-driver /usr/local/bin/
# distroless "nonroot" (65532); numeric so runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/csi-provisioner"]
