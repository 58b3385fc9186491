#!/usr/bin/env bash
# Builds what a real node of the testbed runs (`testbed up --node`, docs/control-plane.md "A real
# node"): kubelet v1.36.3 (from the same wrapper module as the control plane, hack/k8s-bins) and
# containerd v2.4.2 with its runc shim and ctr (hack/containerd-bin), all from the Go module proxy;
# and installs from Debian what the node uses as is: runc and the CNI plugins. Kubelet 1.36 needs
# containerd 2.x, which Debian bookworm does not ship.
# Binaries are cached outside the work tree, keyed by the versions, Go and this script's inputs;
# a second run builds nothing. Prints the directory holding the binaries on its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_VERSION=1.36.3
CONTAINERD_VERSION=2.4.2

step() { printf '[node build] %s\n' "$*" >&2; }
fail() { printf '[node build] FAILED at step "%s": %s\n' "$1" "$2" >&2; exit 1; }

command -v go >/dev/null 2>&1 || fail "find Go" "the 'go' command is not on PATH; install Go >= 1.26"

# The runtime's pieces Debian ships: runc (1.1.5 runs kubelet 1.36's pods here) and the CNI
# plugins the testbed's bridge network uses (bridge, host-local, loopback).
need_apt=()
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
if [ ${#need_apt[@]} -gt 0 ]; then
  step "installing ${need_apt[*]} (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2; } ||
    fail "install ${need_apt[*]}" "apt-get install failed"
fi

go_version=$(go env GOVERSION)
inputs_hash=$(cat "${BASH_SOURCE[0]}" "$here/containerd-bin/go.mod" "$here/containerd-bin/go.sum" \
  "$here/k8s-bins/go.mod" "$here/k8s-bins/go.sum" | sha256sum | cut -c1-12)
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
bin_dir="$cache_root/node/k8s-v$K8S_VERSION-containerd-v$CONTAINERD_VERSION-$go_version-$inputs_hash"
wanted=(kubelet containerd containerd-shim-runc-v2 ctr)

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

build() { # build <label> <wrapper dir> <output name> <package> <tags> [ldflags...]
  local label=$1 dir=$2 out=$3 pkg=$4 tags=$5; shift 5
  local start=$SECONDS
  step "building $label (minutes on a cold Go build cache) ..."
  (cd "$dir" && go build -trimpath -tags="$tags" -ldflags="-s -w $*" -o "$tmp_out/$out" "$pkg") \
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
# No btrfs, devmapper or zfs snapshotters: they need cgo and the node uses overlayfs.
containerd_tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
containerd_flags="-X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION"

for b in "${missing[@]}"; do
  case $b in
    kubelet) build "kubelet v$K8S_VERSION" "$here/k8s-bins" kubelet k8s.io/kubernetes/cmd/kubelet \
      "selinux,notest,grpcnotrace" $version_flags ;;
    *) build "$b v$CONTAINERD_VERSION" "$here/containerd-bin" "$b" \
      "github.com/containerd/containerd/v2/cmd/$b" "$containerd_tags" "$containerd_flags" ;;
  esac
done
step "all node binaries ready in $bin_dir"
echo "$bin_dir"
