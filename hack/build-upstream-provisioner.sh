#!/usr/bin/env bash
# Builds upstream kubernetes-csi/external-provisioner (the Go program we replace) from the Go
# module proxy, for the benchmarks (`cargo run --release -p csi-testbed -- bench`). Upstream's
# go.mod has replace directives, so `go install ...@v6.3.0` refuses it; the wrapper module in
# hack/upstream/ copies those replace lines and requires the program as a tool. Only the wrapper's
# go.mod/go.sum live in this repository; the source comes from the proxy and the binary is cached
# outside the work tree, keyed by upstream and Go versions, so a second run builds nothing.
# Prints the directory holding `csi-provisioner` on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UPSTREAM_VERSION=6.3.0
PKG=github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner

step() { printf '[upstream build] %s\n' "$*" >&2; }
fail() { printf '[upstream build] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "find Go" "the 'go' command is not on PATH; install Go >= 1.26"
[ -f "$here/upstream/go.mod" ] || fail "find the wrapper module" "$here/upstream/go.mod is missing"
go_version=$(go env GOVERSION)
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
bin_dir="$cache_root/upstream/external-provisioner-v$UPSTREAM_VERSION-$go_version"

if [ -x "$bin_dir/csi-provisioner" ]; then
  step "cached: $bin_dir"
  echo "$bin_dir"
  exit 0
fi

export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin_dir"
tmp_out=$(mktemp -d "$bin_dir/.partial.XXXXXX")
trap 'rm -rf "$tmp_out"' EXIT

step "downloading modules for external-provisioner v$UPSTREAM_VERSION ..."
(cd "$here/upstream" && go mod download) \
  || fail "download modules" "go mod download failed (is the Go module proxy reachable?)"

start=$SECONDS
step "building csi-provisioner v$UPSTREAM_VERSION (several minutes on a cold cache) ..."
# Upstream's release build (release-tools/build.make): static, CGO off, version stamped into
# main.version; nothing stripped.
(cd "$here/upstream" && go build -trimpath -ldflags="-X main.version=v$UPSTREAM_VERSION" \
    -o "$tmp_out/csi-provisioner" "$PKG") \
  || fail "build csi-provisioner" "go build $PKG failed"
"$tmp_out/csi-provisioner" --version >/dev/null 2>&1 \
  || fail "check the binary" "$tmp_out/csi-provisioner --version did not run"
mv "$tmp_out/csi-provisioner" "$bin_dir/csi-provisioner"
step "built csi-provisioner v$UPSTREAM_VERSION in $((SECONDS - start))s"
echo "$bin_dir"
