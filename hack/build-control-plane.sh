#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, etcd) from the Go module proxy, using the wrapper modules next to this script.
# Binaries are cached outside the work tree, keyed by Kubernetes, etcd and Go versions, so a
# second run builds nothing. Prints the directory holding the binaries on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_VERSION=1.36.3
ETCD_VERSION=3.6.16

step() { printf '[control-plane build] %s\n' "$*" >&2; }
fail() { printf '[control-plane build] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "find Go" "the 'go' command is not on PATH; install Go >= 1.26"
go_version=$(go env GOVERSION)
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
bin_dir="$cache_root/control-plane/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION-$go_version"
wanted=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)

missing=()
for b in "${wanted[@]}"; do [ -x "$bin_dir/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  step "cached: $bin_dir"
  echo "$bin_dir"
  exit 0
fi

export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$bin_dir"
tmp_out=$(mktemp -d "$bin_dir/.partial.XXXXXX")
trap 'rm -rf "$tmp_out"' EXIT

build() { # build <label> <wrapper dir> <output name> <package> [ldflags...]
  local label=$1 dir=$2 out=$3 pkg=$4; shift 4
  local start=$SECONDS
  step "building $label (this can take many minutes on a cold cache) ..."
  (cd "$dir" && go build -trimpath -tags=selinux,notest,grpcnotrace \
      -ldflags="-s -w $*" -o "$tmp_out/$out" "$pkg") \
    || fail "build $label" "go build $pkg failed (is the Go module proxy reachable?)"
  mv "$tmp_out/$out" "$bin_dir/$out"
  step "built $label in $((SECONDS - start))s"
}

minor=${K8S_VERSION#1.}; minor=${minor%%.*}
version_flags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_flags+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  version_flags+=" -X $p.gitTreeState=clean -X $p.buildDate=2000-01-01T00:00:00Z"
done

step "downloading modules for Kubernetes v$K8S_VERSION ..."
(cd "$here/k8s-bins" && go mod download) || fail "download Kubernetes modules" "go mod download failed (is the Go module proxy reachable?)"
for b in "${missing[@]}"; do
  case $b in
    etcd) build "etcd v$ETCD_VERSION" "$here/etcd-bin" etcd go.etcd.io/etcd/server/v3 ;;
    *) build "$b v$K8S_VERSION" "$here/k8s-bins" "$b" "k8s.io/kubernetes/cmd/$b" $version_flags ;;
  esac
done
step "all binaries ready in $bin_dir"
echo "$bin_dir"
