#!/usr/bin/env bash
# Builds csi-mock-driver: the Kubernetes end-to-end mock CSI driver served by our small wrapper
# in hack/mock-driver/ (a second driver for the integration tests, one nobody on this team wrote).
# The driver's source comes from the Go module proxy (k8s.io/kubernetes). The binary is cached
# outside the work tree, keyed by the Kubernetes and Go versions and a hash of the wrapper's
# sources and this script, so a second run builds nothing. Prints the binary's path on its last
# line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_VERSION=1.36.3

step() { printf '[mock-driver build] %s\n' "$*" >&2; }
fail() { printf '[mock-driver build] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "find Go" "the 'go' command is not on PATH; install Go >= 1.26"
[ -f "$here/mock-driver/go.mod" ] || fail "find the wrapper module" "$here/mock-driver/go.mod is missing"
go_version=$(go env GOVERSION)
sources_hash=$(cd "$here" && sha256sum build-mock-driver.sh mock-driver/go.mod mock-driver/go.sum mock-driver/*.go \
  | sha256sum | cut -c1-12)
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
bin_dir="$cache_root/mock-driver/k8s-v$K8S_VERSION-$go_version-$sources_hash"
binary="$bin_dir/csi-mock-driver"

if [ -x "$binary" ]; then
  step "cached: $binary"
  echo "$binary"
  exit 0
fi

# The control plane's settings (hack/build-control-plane.sh): with the same environment, flags
# and tags, the packages both builds compile (gRPC, protobuf, klog, ...) come from Go's build
# cache once the control plane is built.
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin_dir"
tmp_out=$(mktemp -d "$bin_dir/.partial.XXXXXX")
trap 'rm -rf "$tmp_out"' EXIT

step "downloading modules for Kubernetes v$K8S_VERSION ..."
(cd "$here/mock-driver" && go mod download) \
  || fail "download modules" "go mod download failed (is the Go module proxy reachable?)"

start=$SECONDS
step "building csi-mock-driver (Kubernetes v$K8S_VERSION e2e mock) ..."
(cd "$here/mock-driver" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="-s -w" \
    -o "$tmp_out/csi-mock-driver" .) \
  || fail "build csi-mock-driver" "go build in $here/mock-driver failed"
"$tmp_out/csi-mock-driver" -help >/dev/null 2>&1 \
  || fail "check the binary" "$tmp_out/csi-mock-driver -help did not run"
mv "$tmp_out/csi-mock-driver" "$binary"
step "built csi-mock-driver in $((SECONDS - start))s"
echo "$binary"
