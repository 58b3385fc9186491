#!/usr/bin/env bash
# The release build of the shipped binaries, statically linked against musl: the Dockerfile
# runs exactly this script, and so does the test command, so the image's build is tested.
# Also writes the sidecar's SBOM (CycloneDX JSON, hack/sbom.py), which the sidecar image carries.
# Usage: hack/build-static.sh OUT_DIR
# Environment: CSI_PROVISIONER_STATIC_TARGET_DIR (see below), else CARGO_TARGET_DIR.
# Output: OUT_DIR/csi-provisioner, OUT_DIR/csi-reference-driver, OUT_DIR/csi-provisioner.cdx.json
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: hack/build-static.sh OUT_DIR}
target=x86_64-unknown-linux-musl

step() { printf '[build-static] %s\n' "$*" >&2; }
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  step "adding the Rust target $target"
  rustup target add "$target"
fi
if ! command -v musl-gcc >/dev/null 2>&1; then
  # A musl C compiler for the C and assembly parts of ring (TLS).
  step "installing musl-tools"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools
fi
if ! command -v python3 >/dev/null 2>&1; then
  # hack/sbom.py (the Rust images based on Debian's buildpack-deps have it already).
  step "installing python3"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3
fi
# Frame pointers: --enable-pprof's CPU profiles walk them from the SIGPROF handler, because
# musl's signal trampoline has no unwind information (Cargo.toml, src/profiling/cpu.rs).
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C force-frame-pointers=yes"
# Its own target directory if CSI_PROVISIONER_STATIC_TARGET_DIR names one (hack/test.sh does):
# cargo locks a target directory for the length of a build, and this one runs beside the tests,
# whose own builds would otherwise wait minutes for it.
target_dir=${CSI_PROVISIONER_STATIC_TARGET_DIR:-${CARGO_TARGET_DIR:-target}}
step "cargo build --release --locked --target $target (csi-provisioner, csi-reference-driver) in $target_dir"
CARGO_TARGET_DIR=$target_dir cargo build --release --locked --target "$target" --bin csi-provisioner --bin csi-reference-driver
mkdir -p "$out"
cp "$target_dir/$target/release/csi-provisioner" "$target_dir/$target/release/csi-reference-driver" "$out/"
# The crates of the build just done (the same target and cargo invocation's features).
python3 hack/sbom.py csi-provisioner-rs csi-provisioner "$target" "$out/csi-provisioner.cdx.json"
step "static binaries and the sidecar's SBOM in $out"
