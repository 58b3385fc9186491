# syntax=docker/dockerfile:1
#
# Two images from one Dockerfile. Build from the repository root:
#
#   docker build -t csi-provisioner-rs:0.1.0 .                                   # the sidecar
#   docker build --target reference-driver -t csi-reference-driver-rs:0.1.0 .    # the reference driver
#   docker run --rm csi-provisioner-rs:0.1.0 --version
#
# The sidecar image (the default, last stage) holds only /usr/local/bin/csi-provisioner and its
# SBOM, /usr/local/share/sbom/csi-provisioner.cdx.json (CycloneDX JSON: every crate the binary
# is built from, docs/supply-chain.md); the reference CSI driver (the demo Deployment in deploy/,
# the tests) is its own image.
#
# Both binaries are linked statically against musl, so the final images need no libc and run
# on distroless/static. Why musl rather than static glibc: glibc does not support full static
# linking (getaddrinfo/NSS would still try to load shared modules at run time), and musl's
# slower allocator does not matter for a sidecar that waits on the API server and the driver
# most of the time.
#
# Build arguments:
#   BUILDER_IMAGE  the Rust image the binaries are compiled in (stage "build").
#   BASE_IMAGE     the base of both final images: distroless/static "nonroot" or an equivalent
#                  (hack/build-images.sh builds one locally, localhost/distroless-static:nonroot).
#   BINARIES       "build" (default): compile in BUILDER_IMAGE. "prebuilt": take the binaries
#                  hack/build-static.sh OUT already built, with OUT as the build context:
#                    hack/build-static.sh out
#                    docker build --build-arg BINARIES=prebuilt -f Dockerfile out
#                  (the stage "build" and its image are then skipped; hack/build-images.sh
#                  builds the images this way with buildah, where no registry is reachable).

ARG BUILDER_IMAGE=rust:1.95-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot
ARG BINARIES=build

FROM ${BUILDER_IMAGE} AS build
WORKDIR /src
COPY . .
# The same script the test command runs (hack/test.sh), so the image's build is what CI tests:
# it adds the musl target and musl-tools, then builds both binaries from the committed
# Cargo.lock and writes the sidecar's SBOM (hack/sbom.py). The CSI proto is compiled in pure
# Rust (protox), so no protoc is needed.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    bash hack/build-static.sh /out

# The output of hack/build-static.sh OUT, with OUT as the build context (BINARIES=prebuilt).
FROM scratch AS prebuilt
COPY csi-provisioner csi-reference-driver csi-provisioner.cdx.json /out/

# /out/csi-provisioner, /out/csi-reference-driver and /out/csi-provisioner.cdx.json, from
# whichever stage BINARIES names.
# ":-build" repeats the default for buildah/podman (1.28 at least): they find the stages a
# target needs from the --build-arg values only, not from ARG defaults, so a plain
# `${BINARIES}` would skip the stage "build" and then look for an image named "build".
FROM ${BINARIES:-build} AS binaries

# The reference driver alone. Root by default (the base "nonroot" image says 65532): its node
# side bind-mounts volumes for pods (docs/reference-driver.md), as CSI node plugins do; its
# controller side needs no privileges and may run as any user the pod's securityContext sets.
FROM ${BASE_IMAGE} AS reference-driver
COPY --from=binaries /out/csi-reference-driver /usr/local/bin/
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["/usr/local/bin/csi-reference-driver"]

# The default target: the sidecar alone, with its SBOM.
FROM ${BASE_IMAGE} AS csi-provisioner
COPY --from=binaries /out/csi-provisioner /usr/local/bin/
COPY --from=binaries /out/csi-provisioner.cdx.json /usr/local/share/sbom/
# distroless "nonroot" (65532); numeric so runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/csi-provisioner"]
