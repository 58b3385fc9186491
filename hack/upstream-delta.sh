#!/usr/bin/env bash
# Lists the releases of what we build and compare against that are newer than the versions this
# tree pins, as the Go module proxy serves them: upstream's external-provisioner and its lib,
# the CSI spec, Kubernetes (control plane, kubelet, e2e.test), etcd, the snapshotter and
# csi-test (csi-sanity). So the next upstream release is noticed in minutes, not by chance.
#
# Usage: hack/upstream-delta.sh [--check]
#   --check   exit 1 if any pinned version has a newer release (for a scheduled job)
# Output: one line per module: the module, the version pinned and where, then the newer
# releases (oldest first) and, if there is one, the newest pre-release above them.
# Needs: go (it asks the proxy with `go list -m -versions`; GOPROXY as configured).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: hack/upstream-delta.sh [--check]" >&2; exit 2 ;;
esac

# The version `go.mod` requires of `module` (direct or indirect).
required() { awk -v m="$2" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
# A shell variable's value in a script (`NAME=value`).
assigned() { sed -n "s/^$2=//p" "$1" | head -n 1; }
# Whether version $2 is newer than $1 (semantic versions, `sort -V`).
newer() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n 1)" = "$2" ]; }

# module | where the pin is | the pin
pins=(
  "github.com/kubernetes-csi/external-provisioner/v6|hack/upstream/go.mod|$(required hack/upstream/go.mod github.com/kubernetes-csi/external-provisioner/v6)"
  "sigs.k8s.io/sig-storage-lib-external-provisioner/v13|hack/upstream/go.mod|$(required hack/upstream/go.mod sigs.k8s.io/sig-storage-lib-external-provisioner/v13)"
  "github.com/kubernetes-csi/csi-lib-utils|hack/upstream/go.mod|$(required hack/upstream/go.mod github.com/kubernetes-csi/csi-lib-utils)"
  "github.com/container-storage-interface/spec|hack/upstream/go.mod|$(required hack/upstream/go.mod github.com/container-storage-interface/spec)"
  "k8s.io/kubernetes|hack/k8s-bins/go.mod|$(required hack/k8s-bins/go.mod k8s.io/kubernetes)"
  "go.etcd.io/etcd/server/v3|hack/etcd-bin/go.mod|$(required hack/etcd-bin/go.mod go.etcd.io/etcd/server/v3)"
  "github.com/kubernetes-csi/external-snapshotter/v8|hack/snapshotter/go.mod|$(required hack/snapshotter/go.mod github.com/kubernetes-csi/external-snapshotter/v8)"
  "github.com/kubernetes-csi/csi-test/v5|hack/csi-sanity.sh|$(assigned hack/csi-sanity.sh SANITY_VERSION)"
)

behind=0
work=$(mktemp -d "${TMPDIR:-/tmp}/upstream-delta.XXXXXX")
trap 'rm -rf "$work"' EXIT
for pin in "${pins[@]}"; do
  IFS='|' read -r module where pinned <<<"$pin"
  if [ -z "$pinned" ]; then
    echo "$module: no version found in $where" >&2
    exit 1
  fi
  # Outside any module, so that no go.mod of this tree takes part.
  versions=$(cd "$work" && GOFLAGS=-mod=mod go list -m -versions "$module" 2>&1) || {
    echo "$module: the proxy did not answer: $versions" >&2
    exit 1
  }
  releases=() pre=""
  for version in ${versions#"$module"}; do
    newer "$pinned" "$version" || continue
    case "$version" in
      *-*) pre=$version ;;
      *) releases+=("$version") ;;
    esac
  done
  # A pre-release older than the newest release is of no interest.
  if [ -n "$pre" ] && [ ${#releases[@]} -gt 0 ] && ! newer "${releases[-1]}" "${pre%%-*}"; then
    pre=""
  fi
  line="$module $pinned ($where):"
  if [ ${#releases[@]} -eq 0 ]; then
    line+=" current"
  else
    line+=" newer ${releases[*]}"
    behind=$((behind + 1))
  fi
  [ -z "$pre" ] || line+="; pre-release $pre"
  echo "$line"
done
if [ "$behind" -gt 0 ]; then
  echo "$behind of ${#pins[@]} pinned versions have newer releases"
  ! $check || exit 1
else
  echo "every pinned version is the newest release"
fi
