#!/usr/bin/env bash
# Builds, without any registry, the container images a real one-node Kubernetes cluster needs to
# run the sidecar and the reference driver as pods, and writes each as a named docker-archive
# (`ctr images import FILE` / `docker load -i FILE` keep its name):
#
#   localhost/csi-provisioner-rs:dev                    the sidecar (the Dockerfile's default target)
#   localhost/csi-reference-driver-rs:dev               the reference driver (target reference-driver)
#   registry.k8s.io/pause:3.10.2                        the pod sandbox: our hack/pause/pause.c
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-1    Debian's static busybox (busybox-static)
#   localhost/csi-registrar:dev                         hack/registrar: the node plugin's kubelet
#                                                       registration (node-driver-registrar's part)
#
# The sidecar and driver images are built by `buildah bud` from the Dockerfile users build, with
# BINARIES=prebuilt (the binaries of hack/build-static.sh, the script the Dockerfile's build stage
# runs) and BASE_IMAGE=localhost/distroless-static:nonroot, a distroless/static equivalent built
# here from files of the host (its archive is kept next to the base images' cache, see below).
# Every image is built from scratch: nothing is pulled.
#
# Usage: hack/build-images.sh
# Output (the last line of stdout; progress goes to stderr):
#   $CACHE/images/<hash>/   with sidecar.tar driver.tar pause.tar busybox.tar registrar.tar,
#                           images.txt ("FILE NAME" per line, FILE relative to the directory),
#                           sizes.txt ("NAME ARCHIVE_BYTES HUMAN" per line),
#                           csi-provisioner.cdx.json (the sidecar's SBOM, as in its image)
# where CACHE is $CSI_PROVISIONER_CACHE (default ~/.cache/csi-provisioner-rs, as hack/test.sh)
# and <hash> covers every input: this script, the Dockerfile, hack/pause/, the binaries' bytes
# and every host file copied into an image. A run with the same inputs rebuilds nothing but
# cargo's (incremental) check of the binaries and prints the same directory.
# The base, pause and busybox images do not depend on the Rust binaries: they are kept in
# $CACHE/images/base-<hash>/ and in buildah's storage, and reused when only the binaries change.
#
# Needs: root (buildah mounts its containers; unprivileged, try `buildah unshare
# hack/build-images.sh`), buildah (installed with apt-get if missing), apt-get/dpkg-deb for
# busybox-static, and what hack/build-static.sh needs (Rust with the musl target; musl-tools,
# which it installs). buildah's storage is private: $CACHE/images/buildah/{root,runroot}, driver
# vfs (the images are a few MB; vfs needs no kernel overlay support inside a container).
# Environment: CARGO_TARGET_DIR (passed to hack/build-static.sh), CSI_PROVISIONER_CACHE,
# CSI_PROVISIONER_IMAGES_KEEP (how many output directories to keep, default 5).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
images_root=$cache_root/images
keep=${CSI_PROVISIONER_IMAGES_KEEP:-5}

base_image=localhost/distroless-static:nonroot
pause_image=registry.k8s.io/pause:3.10.2
busybox_image=registry.k8s.io/e2e-test-images/busybox:1.37.0-1
sidecar_image=localhost/csi-provisioner-rs:dev
driver_image=localhost/csi-reference-driver-rs:dev
registrar_image=localhost/csi-registrar:dev
# Label on the images built from a staged tree: the hash of their inputs, to know when the copy
# in buildah's storage is current.
inputs_label=io.github.csi-provisioner-rs.inputs

step() { printf '[build-images] %s\n' "$*" >&2; }
die() {
  printf '[build-images] error: %s\n' "$*" >&2
  exit 1
}
sha() { sha256sum | cut -d' ' -f1; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }'; }

# --- tools -------------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] ||
  die "run as root (buildah mounts container file systems), or under \`buildah unshare $0\`"
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "$1 is not installed and there is no apt-get: install $2"
  step "installing $2 (apt-get install $2)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2"; } >&2 ||
    die "could not install $2: run apt-get install $2"
}
command -v buildah >/dev/null 2>&1 || apt_install buildah buildah
command -v buildah >/dev/null 2>&1 || die "buildah is not installed: apt-get install buildah"
for tool in sha256sum tar dpkg-deb readelf; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (coreutils, tar, dpkg, binutils)"
done
mkdir -p "$images_root"
buildah_cmd=(buildah --root "$images_root/buildah/root" --runroot "$images_root/buildah/runroot"
  --storage-driver vfs)
bah() { "${buildah_cmd[@]}" "$@"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-provisioner-images.XXXXXX")
chmod 755 "$work" # apt-get download runs as the user _apt
containers=()
tmp_out=
cleanup() {
  local c
  for c in "${containers[@]}"; do [ -z "$c" ] || bah rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
  [ -z "$tmp_out" ] || rm -rf "$tmp_out"
}
trap cleanup EXIT

# --- the static binaries (what the Dockerfile's build stage runs) --------------------------------
step "hack/build-static.sh (CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target})"
bash hack/build-static.sh "$work/binaries" >&2
for binary in csi-provisioner csi-reference-driver; do
  [ -x "$work/binaries/$binary" ] || die "hack/build-static.sh did not produce $binary"
done
[ -s "$work/binaries/csi-provisioner.cdx.json" ] || die "hack/build-static.sh did not produce csi-provisioner.cdx.json"
command -v musl-gcc >/dev/null 2>&1 || die "musl-gcc is missing: apt-get install musl-tools"

# One build at a time per cache (buildah's storage has its own locks; the output directories not).
exec 9>"$images_root/.lock"
flock 9

# --- staged root file systems of the three images built from scratch ----------------------------
is_static() { ! readelf -lW "$1" | grep -q 'program interpreter' && ! readelf -dW "$1" | grep -q '(NEEDED)'; }

# Debian's static busybox: the installed package if there is one, else its .deb, downloaded once
# with `apt-get download` and unpacked into the cache (busybox-static conflicts with the package
# busybox, so installing it could replace the host's busybox).
busybox_binary() {
  if [ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ]; then
    echo /bin/busybox
    return
  fi
  local dir=$images_root/busybox-static
  if [ ! -x "$dir/bin/busybox" ]; then
    command -v apt-get >/dev/null 2>&1 || die "busybox-static is needed: apt-get install busybox-static"
    step "downloading Debian's busybox-static (apt-get download busybox-static)"
    local dl=$work/busybox-deb
    mkdir -p "$dl"
    chmod 755 "$dl" # apt downloads as the user _apt
    if ! (cd "$dl" && apt-get download -qq busybox-static >&2); then
      apt-get update -qq >&2 || true
      (cd "$dl" && apt-get download -qq busybox-static >&2) ||
        die "could not download busybox-static: apt-get install busybox-static"
    fi
    dpkg-deb -x "$dl"/busybox-static_*.deb "$dl/root"
    mkdir -p "$dir/bin"
    cp "$dl/root/bin/busybox" "$dir/bin/busybox.tmp"
    mv "$dir/bin/busybox.tmp" "$dir/bin/busybox"
  fi
  echo "$dir/bin/busybox"
}

stage=$work/stage
step "staging the root file systems of $base_image, $pause_image and $busybox_image"

# distroless/static "nonroot" equivalent: users root, nobody and nonroot (65532), /tmp, homes,
# CA certificates, time zones, /etc/services and /etc/protocols, nsswitch.conf.
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca_bundle" ] || die "$ca_bundle is missing: apt-get install ca-certificates"
r=$stage/base
mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/root" "$r/home/nonroot" "$r/var" "$r/usr/share" "$r/usr/local/bin"
cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$r/etc/group" <<'EOF'
root:x:0:
tty:x:5:
staff:x:50:
nobody:x:65534:
nonroot:x:65532:
EOF
printf 'hosts: files dns\n' >"$r/etc/nsswitch.conf"
cat >"$r/etc/os-release" <<'EOF'
PRETTY_NAME="distroless-static equivalent (csi-provisioner-rs hack/build-images.sh)"
NAME="distroless-static-local"
ID=distroless
EOF
cp "$ca_bundle" "$r/etc/ssl/certs/ca-certificates.crt"
for f in /etc/services /etc/protocols; do
  if [ -f "$f" ]; then cp "$f" "$r$f"; fi
done
if [ -d /usr/share/zoneinfo ]; then cp -a /usr/share/zoneinfo "$r/usr/share/"; fi
chmod 1777 "$r/tmp"
chmod 700 "$r/root" "$r/home/nonroot"
chown 65532:65532 "$r/home/nonroot"

# pause: our hack/pause/pause.c, static against musl.
r=$stage/pause
mkdir -p "$r"
musl-gcc -static -Os -s -Wall -Wextra -Werror -o "$r/pause" hack/pause/pause.c
is_static "$r/pause" || die "hack/pause/pause.c did not link statically"

# busybox: the static binary and a link per applet (`busybox --list-full`: bin/sh, usr/bin/env…).
busybox=$(busybox_binary)
is_static "$busybox" || die "$busybox is not statically linked (expected Debian's busybox-static)"
r=$stage/busybox
mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/root" "$r/home" "$r/var" "$r/usr/bin" "$r/usr/sbin" "$r/sbin"
cp "$busybox" "$r/bin/busybox"
"$busybox" --list-full | while read -r applet; do
  case "$applet" in "" | bin/busybox) continue ;; esac
  mkdir -p "$r/$(dirname "$applet")"
  ln -sfn /bin/busybox "$r/$applet"
done
[ -L "$r/bin/sh" ] || die "$busybox has no sh applet"
cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/home:/bin/false
EOF
cat >"$r/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
chmod 1777 "$r/tmp"
chmod 700 "$r/root"

# csi-registrar (hack/registrar/): the kubelet registration of the reference driver's node
# plugin, in Go (see its main.go for why), on the distroless-equivalent tree; root, since it
# creates its socket in the kubelet's root-owned plugins_registry.
command -v go >/dev/null 2>&1 || die "Go is needed to build hack/registrar (go 1.26+)"
r=$stage/registrar
cp -a "$stage/base" "$r"
(cd hack/registrar && GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 \
  go build -trimpath -ldflags "-s -w" -o "$r/usr/local/bin/csi-registrar" .) >&2 ||
  die "go build of hack/registrar failed (is the Go module proxy reachable?)"

# The hash of a staged tree: contents, modes, owners and link targets (not the times), with this
# script (which holds the images' configuration) and buildah's version.
tree_hash() {
  {
    tar -C "$1" --sort=name --mtime=@0 --numeric-owner -cf - . | sha256sum
    sha256sum "$repo/hack/build-images.sh"
    buildah --version
  } | sha
}
base_hash=$({ for t in base pause busybox registrar; do echo "$t $(tree_hash "$stage/$t")"; done; } | sha)
base_dir=$images_root/base-$base_hash

# Builds image $1 from the staged tree $2 unless buildah's storage already holds it with the
# inputs $3; the remaining arguments are `buildah config` options.
image_from_tree() {
  local name=$1 tree=$2 inputs=$3 current c mnt started=$EPOCHREALTIME
  shift 3
  current=$(bah inspect --type image --format "{{index .ImageAnnotations \"$inputs_label\"}}" "$name" 2>/dev/null || true)
  if [ "$current" = "$inputs" ]; then
    step "$name: current in buildah's storage"
    return
  fi
  step "building $name from scratch"
  c=$(bah from --pull=never scratch)
  containers+=("$c")
  mnt=$(bah mount "$c")
  cp -a "$tree/." "$mnt/"
  bah unmount "$c" >/dev/null
  bah config --os linux --arch amd64 --annotation "$inputs_label=$inputs" "$@" "$c"
  bah commit --quiet --rm --timestamp 0 "$c" "$name" >/dev/null
  containers=("${containers[@]/$c/}")
  step "$name: built in $(since "$started")"
}

# Writes image $1 as the named docker-archive $2 and checks the archive names it.
archive() {
  local name=$1 file=$2 tags
  rm -f "$file"
  bah push --quiet "$name" "docker-archive:$file:$name" >&2
  tags=$(tar -xOf "$file" manifest.json) || die "$file has no manifest.json"
  case "$tags" in
    *"\"RepoTags\":[\"$name\"]"*) ;;
    *) die "$file: manifest.json does not name $name: $tags" ;;
  esac
}

image_from_tree "$base_image" "$stage/base" "$base_hash" \
  --user 65532 --workingdir /home/nonroot \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
image_from_tree "$pause_image" "$stage/pause" "$base_hash" \
  --user 65535:65535 --entrypoint '["/pause"]'
image_from_tree "$busybox_image" "$stage/busybox" "$base_hash" \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd '["sh"]'
image_from_tree "$registrar_image" "$stage/registrar" "$base_hash" \
  --user 0:0 --entrypoint '["/usr/local/bin/csi-registrar"]'

if [ ! -f "$base_dir/done" ]; then
  step "writing the archives of the base images into $base_dir"
  rm -rf "$base_dir"
  mkdir -p "$base_dir"
  archive "$base_image" "$base_dir/distroless-static.tar"
  archive "$pause_image" "$base_dir/pause.tar"
  archive "$busybox_image" "$base_dir/busybox.tar"
  archive "$registrar_image" "$base_dir/registrar.tar"
  touch "$base_dir/done"
fi

# --- the sidecar and the driver: the Dockerfile, with the prebuilt binaries ---------------------
out_hash=$({
  echo "base $base_hash"
  sha256sum "$repo/Dockerfile"
  (cd "$work/binaries" && sha256sum csi-provisioner csi-reference-driver csi-provisioner.cdx.json)
  echo "$sidecar_image $driver_image $registrar_image"
} | sha)
out_dir=$images_root/$out_hash
if [ -f "$out_dir/images.txt" ]; then
  step "images current (inputs unchanged): $out_dir"
  echo "$out_dir"
  exit 0
fi

# The build context is the directory of the binaries only (BINARIES=prebuilt copies them from
# there); --skip-unused-stages (buildah's default) skips the stage "build" and its Rust image.
bud() {
  local name=$1 target=$2 started=$EPOCHREALTIME
  step "buildah bud --target $target -t $name (BINARIES=prebuilt, BASE_IMAGE=$base_image)"
  bah bud --quiet --pull=never --skip-unused-stages=true --isolation chroot --layers=false \
    --timestamp 0 --build-arg BINARIES=prebuilt --build-arg "BASE_IMAGE=$base_image" \
    --target "$target" -t "$name" -f "$repo/Dockerfile" "$work/binaries" >/dev/null
  step "$name: built in $(since "$started")"
}
bud "$sidecar_image" csi-provisioner
bud "$driver_image" reference-driver
# buildah 1.28 leaves a working container behind for the stage that is only
# `FROM ${BINARIES} AS binaries` (each a full vfs copy of the binaries); this storage is ours and
# locked (flock above), so remove every container, then the dangling images: the "prebuilt"
# stages and the images this build replaced.
bah rm --all >/dev/null 2>&1 || true
bah rmi --prune >/dev/null 2>&1 || true

tmp_out=$images_root/.tmp-$out_hash-$$
rm -rf "$tmp_out"
mkdir -p "$tmp_out"
step "writing the archives into $out_dir"
archive "$sidecar_image" "$tmp_out/sidecar.tar"
archive "$driver_image" "$tmp_out/driver.tar"
for f in pause busybox registrar; do
  ln "$base_dir/$f.tar" "$tmp_out/$f.tar" 2>/dev/null || cp "$base_dir/$f.tar" "$tmp_out/$f.tar"
done
cp "$work/binaries/csi-provisioner.cdx.json" "$tmp_out/"
{
  echo "sidecar.tar $sidecar_image"
  echo "driver.tar $driver_image"
  echo "pause.tar $pause_image"
  echo "busybox.tar $busybox_image"
  echo "registrar.tar $registrar_image"
} >"$tmp_out/images.txt"
while read -r file name; do
  bytes=$(stat -c %s "$tmp_out/$file")
  echo "$name $bytes $(numfmt --to=iec-i --suffix=B "$bytes")"
done <"$tmp_out/images.txt" >"$tmp_out/sizes.txt"
rm -rf "$out_dir"
mv "$tmp_out" "$out_dir"
sed 's/^/[build-images]   /' "$out_dir/sizes.txt" >&2

# Keep the newest $keep output directories (and base directories).
for pattern in '[0-9a-f]*' 'base-*'; do
  # shellcheck disable=SC2012 # names are hex hashes
  ls -1dt "$images_root"/$pattern 2>/dev/null | grep -E '/(base-)?[0-9a-f]{64}$' |
    tail -n +"$((keep + 1))" | while read -r old; do
      [ "$old" = "$out_dir" ] || [ "$old" = "$base_dir" ] || rm -rf "$old"
    done || true
done
echo "$out_dir"
