#!/usr/bin/env bash
# Builds the Kubernetes volume snapshot machinery for the integration tests: snapshot-controller
# and csi-snapshotter of kubernetes-csi/external-snapshotter (tools of our wrapper module in
# hack/snapshotter/), and collects the CRDs they need next to them: the VolumeSnapshot,
# VolumeSnapshotContent and VolumeSnapshotClass CRDs of the same release (from its client/v8
# module) and the ReferenceGrant CRD of Gateway API's standard channel (serves v1beta1, which
# cross-namespace data sources use). Everything comes from the Go module proxy and is cached
# outside the work tree, keyed by the versions, Go's version and a hash of the wrapper module and
# this script, so a second run builds nothing. Prints the directory on its last line: it holds
# `snapshot-controller`, `csi-snapshotter` and `crds/*.yaml`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SNAPSHOTTER_VERSION=8.7.0
GATEWAY_API_VERSION=1.6.3
SNAPSHOTTER_MODULE=github.com/kubernetes-csi/external-snapshotter/v8
CLIENT_MODULE=github.com/kubernetes-csi/external-snapshotter/client/v8
GATEWAY_API_MODULE=sigs.k8s.io/gateway-api
PROGRAMS=(snapshot-controller csi-snapshotter)

step() { printf '[snapshotter build] %s\n' "$*" >&2; }
fail() { printf '[snapshotter build] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "find Go" "the 'go' command is not on PATH; install Go >= 1.26"
[ -f "$here/snapshotter/go.mod" ] || fail "find the wrapper module" "$here/snapshotter/go.mod is missing"
go_version=$(go env GOVERSION)
sources_hash=$(cd "$here" && sha256sum build-snapshotter.sh snapshotter/go.mod snapshotter/go.sum \
  | sha256sum | cut -c1-12)
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
out_dir="$cache_root/snapshotter/v$SNAPSHOTTER_VERSION-gateway-api-v$GATEWAY_API_VERSION-$go_version-$sources_hash"

# The directory is complete once its last piece (moved in last, below) is there.
if [ -x "$out_dir/csi-snapshotter" ]; then
  step "cached: $out_dir"
  echo "$out_dir"
  exit 0
fi

# The control plane's and the mock driver's settings (hack/build-mock-driver.sh), so the packages
# they share come from Go's build cache.
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$out_dir"
tmp_out=$(mktemp -d "$out_dir/.partial.XXXXXX")
trap 'rm -rf "$tmp_out"' EXIT

# The `Dir` of `go mod download -json`'s answer: where the module's files are unpacked.
module_dir() { sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }

step "downloading modules for external-snapshotter v$SNAPSHOTTER_VERSION ..."
(cd "$here/snapshotter" && go mod download) \
  || fail "download modules" "go mod download failed (is the Go module proxy reachable?)"

step "collecting the CRDs ..."
mkdir "$tmp_out/crds"
# At the version the wrapper's go.mod requires, checked against its go.sum.
client_dir=$(cd "$here/snapshotter" && go mod download -json "$CLIENT_MODULE" | module_dir)
[ -n "$client_dir" ] || fail "find the CRDs" "go mod download did not name the directory of $CLIENT_MODULE"
for kind in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
  crd="$client_dir/config/crd/snapshot.storage.k8s.io_$kind.yaml"
  [ -f "$crd" ] || fail "find the CRDs" "$crd is missing"
  cp "$crd" "$tmp_out/crds/"
done
# Not a dependency of the programs, so not in the wrapper's go.mod (a tidy would drop it): fetched
# outside any module, checked against the checksum database.
gateway_dir=$(cd "$tmp_out" && go mod download -json "$GATEWAY_API_MODULE@v$GATEWAY_API_VERSION" | module_dir)
crd="$gateway_dir/config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml"
[ -n "$gateway_dir" ] && [ -f "$crd" ] \
  || fail "find the CRDs" "the ReferenceGrant CRD of $GATEWAY_API_MODULE v$GATEWAY_API_VERSION is missing"
# A version's `name:` comes before its `served:` in the CRD's versions list.
awk '/^    name: /{v=$2} /^    served: /{if (v=="v1beta1" && $2=="true") found=1} END{exit !found}' "$crd" \
  || fail "check the ReferenceGrant CRD" "$crd does not serve v1beta1"
cp "$crd" "$tmp_out/crds/"
chmod 644 "$tmp_out"/crds/*.yaml

start=$SECONDS
for program in "${PROGRAMS[@]}"; do
  step "building $program v$SNAPSHOTTER_VERSION (minutes on a cold Go build cache) ..."
  (cd "$here/snapshotter" && go build -trimpath -ldflags="-s -w -X main.version=v$SNAPSHOTTER_VERSION" \
      -o "$tmp_out/$program" "$SNAPSHOTTER_MODULE/cmd/$program") \
    || fail "build $program" "go build $SNAPSHOTTER_MODULE/cmd/$program failed"
  "$tmp_out/$program" --version >/dev/null 2>&1 \
    || fail "check the binary" "$tmp_out/$program --version did not run"
done

# The CRDs and snapshot-controller first, csi-snapshotter (what the cache check looks for) last.
# A crds/ already there (an interrupted or concurrent run of this same key) holds the same files;
# `mv -T` refuses to replace it, and it stays.
mv -T "$tmp_out/crds" "$out_dir/crds" 2>/dev/null || [ -d "$out_dir/crds" ] \
  || fail "store the CRDs" "cannot move them to $out_dir/crds"
mv "$tmp_out/snapshot-controller" "$out_dir/snapshot-controller"
mv "$tmp_out/csi-snapshotter" "$out_dir/csi-snapshotter"
step "built snapshot-controller and csi-snapshotter v$SNAPSHOTTER_VERSION in $((SECONDS - start))s"
echo "$out_dir"
