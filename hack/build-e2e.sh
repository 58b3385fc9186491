#!/usr/bin/env bash
# Builds what Kubernetes' External Storage e2e suite needs here (hack/e2e.sh runs it), with no
# registry:
#
#   e2e.test   `go test -c k8s.io/kubernetes/test/e2e` of k8s.io/kubernetes v1.36.3
#   ginkgo     the ginkgo CLI of the same go.mod (runs e2e.test's specs in parallel)
#   the images the suite's pods and the deployment use, as named docker-archives:
#     registry.k8s.io/e2e-test-images/agnhost:2.63.0           agnhost (test/images/agnhost of
#                                                              the same module) on busybox
#     registry.k8s.io/e2e-test-images/nginx:1.15-4             busybox under these names (with
#     registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0  dash and GNU dd in the second): the specs
#                                                              run only sh, ls, cat, dd... in
#                                                              them (docs/e2e.md)
#     localhost/external-provisioner:v6.3.0     upstream's sidecar (hack/build-upstream-provisioner.sh)
#     localhost/csi-snapshotter:v8.7.0          external-snapshotter's sidecar (hack/build-snapshotter.sh)
#   and every image of hack/build-images.sh (ours, pause, busybox, registrar).
#
# The Go programs come from the wrapper module hack/e2e-bins/ (its go.mod replaces the staging
# modules with their v0.36.3 releases, as hack/k8s-bins/ does) and are cached under
# $CACHE/e2e/<versions>-<hash of hack/e2e-bins>; the images reuse hack/build-images.sh's buildah
# storage and base images.
#
# Usage: hack/build-e2e.sh
# Output (last line of stdout; progress on stderr): a directory with e2e.test, ginkgo, the
# archives, images.txt ("FILE NAME" a line: `testbed up --node --images DIR` imports them) and
# sizes.txt. CACHE is $CSI_PROVISIONER_CACHE (default ~/.cache/csi-provisioner-rs).
# Needs: root and buildah (as hack/build-images.sh), Go 1.26+ and the Go module proxy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

K8S_VERSION=1.36.3
AGNHOST_VERSION=2.63.0
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
images_root=$cache_root/images

agnhost_image=registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION
nginx_image=registry.k8s.io/e2e-test-images/nginx:1.15-4
glibc_image=registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0
upstream_image=localhost/external-provisioner:v6.3.0
snapshotter_image=localhost/csi-snapshotter:v8.7.0
busybox_image=registry.k8s.io/e2e-test-images/busybox:1.37.0-1
base_image=localhost/distroless-static:nonroot

step() { printf '[build-e2e] %s\n' "$*" >&2; }
die() {
  printf '[build-e2e] error: %s\n' "$*" >&2
  exit 1
}
sha() { sha256sum | cut -d' ' -f1; }

[ "$(id -u)" -eq 0 ] || die "run as root (buildah mounts container file systems)"
command -v go >/dev/null 2>&1 || die "the 'go' command is not on PATH; install Go >= 1.26"
[ -f hack/e2e-bins/go.mod ] || die "hack/e2e-bins/go.mod is missing"
go_version=$(go env GOVERSION)

# --- the Go programs -----------------------------------------------------------------------------
bins_hash=$(cat hack/e2e-bins/go.mod hack/e2e-bins/go.sum hack/e2e-bins/tools.go | sha | cut -c1-12)
bin_dir=$cache_root/e2e/k8s-v$K8S_VERSION-$go_version-$bins_hash
if [ -x "$bin_dir/e2e.test" ] && [ -x "$bin_dir/ginkgo" ] && [ -x "$bin_dir/agnhost" ]; then
  step "e2e.test, ginkgo and agnhost cached: $bin_dir"
else
  tmp_bin=$bin_dir.tmp-$$
  rm -rf "$tmp_bin"
  mkdir -p "$tmp_bin"
  export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
  step "downloading k8s.io/kubernetes v$K8S_VERSION's modules (Go module proxy) ..."
  (cd hack/e2e-bins && go mod download) >&2 || die "go mod download failed (is the Go module proxy reachable?)"
  started=$SECONDS
  step "building e2e.test (go test -c k8s.io/kubernetes/test/e2e; minutes on 2 cores) ..."
  (cd hack/e2e-bins && go test -c -trimpath -ldflags "-s -w" -o "$tmp_bin/e2e.test" \
    k8s.io/kubernetes/test/e2e) >&2 || die "go test -c k8s.io/kubernetes/test/e2e failed"
  step "building agnhost $AGNHOST_VERSION and ginkgo ..."
  (cd hack/e2e-bins && go build -trimpath -ldflags "-s -w" -o "$tmp_bin/agnhost" \
    k8s.io/kubernetes/test/images/agnhost &&
    go build -trimpath -ldflags "-s -w" -o "$tmp_bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo) >&2 ||
    die "go build of agnhost or ginkgo failed"
  rm -rf "$bin_dir"
  mv "$tmp_bin" "$bin_dir"
  step "built in $((SECONDS - started)) s: $bin_dir"
fi

# --- the images ------------------------------------------------------------------------------------
ours=$(bash hack/build-images.sh | tail -n 1)
[ -f "$ours/images.txt" ] || die "hack/build-images.sh printed no image directory"
upstream=$(bash hack/build-upstream-provisioner.sh | tail -n 1)
snapshotter=$(bash hack/build-snapshotter.sh | tail -n 1)
for program in "$upstream/csi-provisioner" "$snapshotter/csi-snapshotter"; do
  [ -x "$program" ] || die "$program is missing"
done

buildah_cmd=(buildah --root "$images_root/buildah/root" --runroot "$images_root/buildah/runroot"
  --storage-driver vfs)
bah() { "${buildah_cmd[@]}" "$@"; }
exec 9>"$images_root/.lock"
flock 9

out_hash=$({
  cat "$ours/images.txt"
  (cd "$ours" && sha256sum ./*.tar)
  sha256sum "$bin_dir/agnhost" "$upstream/csi-provisioner" "$snapshotter/csi-snapshotter" hack/build-e2e.sh \
    hack/e2e/nsenter "$(command -v dd)" "$(command -v dash)"
  for base in "$busybox_image" "$base_image"; do
    bah inspect --type image --format '{{.FromImageID}}' "$base" || die "$base is not in buildah's storage"
  done
} | sha)
out_dir=$images_root/e2e-$out_hash
if [ -f "$out_dir/images.txt" ]; then
  step "images current: $out_dir"
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/csi-provisioner-e2e.XXXXXX")
  containers=()
  cleanup() {
    local c
    for c in "${containers[@]}"; do [ -z "$c" ] || bah rm "$c" >/dev/null 2>&1 || true; done
    rm -rf "$work"
  }
  trap cleanup EXIT

  # Image $1 from image $2 with files "SRC:DEST" ($3, space-separated), then `buildah config`
  # options; written as the named docker-archive $work/out/<file $4>.
  derived() {
    local name=$1 from=$2 files=$3 file=$4 c pair tags
    shift 4
    step "building $name (from $from)"
    c=$(bah from --pull=never "$from")
    containers+=("$c")
    for pair in $files; do
      bah copy --chmod 0755 "$c" "${pair%%:*}" "${pair#*:}" >/dev/null
    done
    bah config --os linux --arch amd64 "$@" "$c"
    bah commit --quiet --rm --timestamp 0 "$c" "$name" >/dev/null
    containers=("${containers[@]/$c/}")
    bah push --quiet "$name" "docker-archive:$work/out/$file:$name" >&2
    tags=$(tar -xOf "$work/out/$file" manifest.json) || die "$file has no manifest.json"
    case "$tags" in *"\"RepoTags\":[\"$name\"]"*) ;; *) die "$file does not name $name: $tags" ;; esac
  }
  mkdir -p "$work/out"
  # agnhost's image adds to its program a user and a group the suite's security-context specs
  # refer to (test/images/agnhost/Dockerfile); the storage specs use its `pause` and, in their
  # host-exec pods, the busybox shell and nsenter.
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >"$work/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >"$work/group"
  # The suite's host-exec pods run `nsenter --mount=/rootfs/proc/1/ns/mnt` to act in the node's
  # mount namespace. Where PID 1 refuses that to everyone, root included (this VM's PID 1 does),
  # hack/e2e/nsenter, ahead of busybox's in PATH, enters the kubelet's mount namespace instead: the
  # node's. Elsewhere it is busybox's nsenter unchanged.
  derived "$agnhost_image" "$busybox_image" \
    "$bin_dir/agnhost:/agnhost $work/passwd:/etc/passwd $work/group:/etc/group $repo/hack/e2e/nsenter:/usr/local/sbin/nsenter" agnhost.tar \
    --entrypoint '["/agnhost"]' --cmd '["pause"]'
  derived "$nginx_image" "$busybox_image" "" nginx.tar
  # glibc-dns-testing is Debian's userland upstream; the multiVolume specs rely on GNU dd there
  # (`oflag=nocache`, which busybox's dd lacks): the host's GNU dd, and dash as /bin/sh (busybox's
  # sh would run its own dd applet whatever PATH says), with the glibc they link.
  gnu_dd=$(command -v dd)
  dash=$(command -v dash) || die "dash is missing (apt-get install dash)"
  for program in "$gnu_dd" "$dash"; do
    ldd "$program" >/dev/null 2>&1 || die "$program is not dynamically linked against glibc"
  done
  mkdir -p "$work/glibc/usr/local/bin" "$work/glibc/bin"
  cp "$gnu_dd" "$work/glibc/usr/local/bin/dd"
  cp "$dash" "$work/glibc/bin/dash"
  ln -s dash "$work/glibc/bin/sh"
  for lib in $({ ldd "$gnu_dd" && ldd "$dash"; } | grep -oE '/[^ ]+' | sort -u); do
    mkdir -p "$work/glibc$(dirname "$lib")"
    cp -L "$lib" "$work/glibc$lib"
  done
  derived "$glibc_image" "$busybox_image" "$work/glibc/.:/" glibc-dns-testing.tar
  derived "$upstream_image" "$base_image" "$upstream/csi-provisioner:/csi-provisioner" \
    external-provisioner.tar --entrypoint '["/csi-provisioner"]' --cmd '[]'
  derived "$snapshotter_image" "$base_image" "$snapshotter/csi-snapshotter:/csi-snapshotter" \
    csi-snapshotter.tar --entrypoint '["/csi-snapshotter"]' --cmd '[]'
  {
    echo "agnhost.tar $agnhost_image"
    echo "nginx.tar $nginx_image"
    echo "glibc-dns-testing.tar $glibc_image"
    echo "external-provisioner.tar $upstream_image"
    echo "csi-snapshotter.tar $snapshotter_image"
  } >"$work/out/images.txt"
  while read -r file name; do
    ln "$ours/$file" "$work/out/$file" 2>/dev/null || cp "$ours/$file" "$work/out/$file"
    echo "$file $name" >>"$work/out/images.txt"
  done <"$ours/images.txt"
  while read -r file name; do
    bytes=$(stat -c %s "$work/out/$file")
    echo "$name $bytes $(numfmt --to=iec-i --suffix=B "$bytes")"
  done <"$work/out/images.txt" >"$work/out/sizes.txt"
  rm -rf "$out_dir"
  mv "$work/out" "$out_dir"
  # Older e2e image directories: keep the newest three.
  # shellcheck disable=SC2012 # names are hex hashes
  ls -1dt "$images_root"/e2e-* 2>/dev/null | tail -n +4 | while read -r old; do
    [ "$old" = "$out_dir" ] || rm -rf "$old"
  done || true
fi
for program in e2e.test ginkgo; do
  ln -f "$bin_dir/$program" "$out_dir/$program" 2>/dev/null || cp "$bin_dir/$program" "$out_dir/$program"
done
echo "$out_dir"
