#!/usr/bin/env bash
# Prints, on its last line, the directory of upstream kubernetes-csi/external-provisioner's
# source at the version hack/build-upstream-provisioner.sh builds (the wrapper module in
# hack/upstream/ pins it), downloading it from the Go module proxy if the module cache lacks it.
# tests/upgrade.rs reads upstream's own RBAC example (deploy/kubernetes/rbac.yaml) from there:
# the RBAC of a driver deployed with upstream, as upstream ships it, never a copy of ours.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UPSTREAM_VERSION=v6.3.0
MODULE=github.com/kubernetes-csi/external-provisioner/v6

fail() { printf '[upstream source] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "find Go" "the 'go' command is not on PATH; install Go >= 1.26"
export GOWORK=off GOFLAGS=-mod=mod
cd "$here/upstream"
go mod download "$MODULE" \
  || fail "download $MODULE" "go mod download failed (is the Go module proxy reachable?)"
read -r version dir < <(go list -m -f '{{.Version}} {{.Dir}}' "$MODULE")
[ "$version" = "$UPSTREAM_VERSION" ] \
  || fail "check the version" "hack/upstream/go.mod pins $MODULE $version, not $UPSTREAM_VERSION"
[ -f "$dir/deploy/kubernetes/rbac.yaml" ] \
  || fail "find upstream's RBAC example" "$dir/deploy/kubernetes/rbac.yaml is missing"
echo "$dir"
