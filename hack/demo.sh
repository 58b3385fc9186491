#!/usr/bin/env bash
# The demo: one command. Builds what is missing, starts a real local control plane, the
# reference CSI driver and the sidecar; provisions a few claims; then deletes a claim while its
# CreateVolume is still running, SIGKILLs the sidecar, restarts it, and shows the journal
# cleaning up the orphaned volume. Everything is torn down at the end (also on Ctrl-C).
#
# hack/demo.sh --node: the product as users run it, on a real node (containerd and a kubelet, as
# root): the images built from the Dockerfile, `kubectl apply -k` of deploy/, a claim provisioned
# by the sidecar in its pod, a pod writing to the volume and a second pod reading it back. It
# installs what a node needs (hack/build-node.sh: runc and the CNI plugins; hack/build-images.sh:
# buildah) and fails, saying what is missing, where the machine still cannot run a node (not
# root, no cgroups): `hack/demo.sh` without --node needs none of that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
node_demo=false
case "${1:-}" in
  --node) node_demo=true ;;
  "") ;;
  *) echo "usage: hack/demo.sh [--node]" >&2; exit 2 ;;
esac

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/csi-provisioner-demo.XXXXXX")
pids=()
cleanup() {
  say "tearing everything down"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# With CSI_DEMO_BUILD_LIKE_TESTS=1 (hack/test.sh sets it) the build has the features of the
# test build (`--workspace --all-targets` unifies the dev-dependencies' features, as `cargo
# test` does), so the binaries the test build made are used as they are, not compiled again.
build=(build)
[ "${CSI_DEMO_BUILD_LIKE_TESTS:-}" != 1 ] || build+=(--workspace --all-targets)
say "building the sidecar, the reference driver and the testbed (cargo ${build[*]})"
cargo "${build[@]}"
built=${CARGO_TARGET_DIR:-target}/debug  # where cargo build put them
bin_dir=$(bash hack/build-control-plane.sh | tail -n 1)
kubectl="$bin_dir/kubectl"
export CSI_TESTBED_BIN_DIR="$bin_dir"

k() { "$kubectl" "$@"; }
wait_until() { # description, command: polls for up to 60 s
  for _ in $(seq 1 120); do eval "$2" && return 0; sleep 0.5; done
  echo "timed out waiting for $1" >&2
  exit 1
}
# Starts `testbed up ARGS...` and sets KUBECONFIG; returns 1 (its log in $work/testbed.log) if
# it exits first. A cold node build takes minutes, hence the long bound.
start_testbed() {
  "$built/testbed" up "$@" >"$work/testbed.log" 2>&1 &
  testbed=$!
  pids+=("$testbed")
  for _ in $(seq 1 1800); do
    grep -q '^export KUBECONFIG=' "$work/testbed.log" && break
    kill -0 "$testbed" 2>/dev/null || { wait "$testbed" || true; return 1; }
    sleep 0.5
  done
  grep -q '^export KUBECONFIG=' "$work/testbed.log" || { echo "testbed up did not start" >&2; exit 1; }
  eval "$(grep '^export KUBECONFIG=' "$work/testbed.log")"
  echo "KUBECONFIG=$KUBECONFIG"
}

if $node_demo; then
  say "starting the local control plane with a real node (containerd + kubelet; builds the node and the images if missing)"
  if start_testbed --node; then
    say "deploying with kubectl apply -k: deploy/, only the image names set (localhost/...:dev, built from the Dockerfile)"
    mkdir -p "$work/deploy"
    cat >"$work/deploy/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$work/deploy" deploy)
images:
  - name: csi-provisioner-rs
    newName: localhost/csi-provisioner-rs
    newTag: dev
  - name: csi-reference-driver-rs
    newName: localhost/csi-reference-driver-rs
    newTag: dev
  - name: csi-registrar
    newName: localhost/csi-registrar
    newTag: dev
YAML
    k apply -k "$work/deploy"
    k -n csi-provisioner rollout status deployment/csi-provisioner --timeout=180s
    k -n csi-provisioner rollout status daemonset/csi-reference-node --timeout=180s
    k -n csi-provisioner get pods -o wide
    wait_until "the kubelet to register the driver" \
      '[ -n "$(k get csinode csi-testbed-node -o jsonpath="{.spec.drivers[*].name}" 2>/dev/null)" ]'

    say "a claim, and a pod that writes to its volume"
    k create namespace demo
    pod() { # name, script
      k -n demo apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: registry.k8s.io/e2e-test-images/busybox:1.37.0-1
      command: ["sh", "-c", "$2"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
YAML
      k -n demo wait --for=jsonpath='{.status.phase}'=Succeeded "pod/$1" --timeout=180s
    }
    k -n demo apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: csi-reference
  resources: {requests: {storage: 1Gi}}
YAML
    pod writer 'echo hello from the first pod > /data/hello && sync'
    k -n demo get pvc,pods
    k -n demo delete pod writer

    say "a second pod reads the file back"
    pod reader 'cat /data/hello'
    k -n demo logs reader
    [ "$(k -n demo logs reader)" = "hello from the first pod" ] || { echo "the reader did not read the file back" >&2; exit 1; }
    k -n demo delete pod reader

    say "deleting the claim: the PV and the backend volume go"
    pv=$(k -n demo get pvc data -o jsonpath='{.spec.volumeName}')
    k -n demo delete pvc data --wait=true
    wait_until "PV $pv to be deleted" '! k get pv "$pv" >/dev/null 2>&1'
    k get pv
    k delete -k "$work/deploy" --wait=true --timeout=180s >/dev/null
    exit 0
  fi
  tail -n 20 "$work/testbed.log"
  say "no node could start on this machine (above); hack/demo.sh without --node runs the demo without one"
  exit 1
fi

say "starting the local control plane (etcd + kube-apiserver + kube-controller-manager)"
start_testbed || { cat "$work/testbed.log"; exit 1; }

say "installing the journal CRD (deploy/base/crd.yaml)"
k apply -f deploy/base/crd.yaml
k wait --for=condition=Established crd/provisioningjournals.provisioner.csi-rs.dev --timeout=60s

say "starting the reference driver and the sidecar"
"$built/csi-reference-driver" --endpoint "$work/csi.sock" --state-dir "$work/driver" >"$work/driver.log" 2>&1 &
pids+=($!)
start_sidecar() {
  "$built/csi-provisioner" --csi-address "$work/csi.sock" --kubeconfig "$KUBECONFIG" -v=1 >>"$work/sidecar.log" 2>&1 &
  sidecar=$!
  pids+=("$sidecar")
}
start_sidecar
driver_volumes() {
  python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["volumes"]))' "$work/driver/state.json" 2>/dev/null || echo 0
}

journal_in_flight() {
  k get provisioningjournals -A -o jsonpath='{range .items[*]}{.spec.summary.inFlight}{"\n"}{end}' |
    awk '{ total += $1 } END { print total + 0 }'
}

say "a StorageClass and three claims"
k apply -f - <<'YAML'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: demo}
provisioner: reference.csi.example.com
reclaimPolicy: Delete
YAML
for n in 1 2 3; do
  k apply -f - <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: claim-$n, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: demo
  resources: {requests: {storage: ${n}Gi}}
YAML
done
k wait --for=jsonpath='{.status.phase}'=Bound pvc/claim-1 pvc/claim-2 pvc/claim-3 --timeout=120s
k get pvc,pv
# A bound claim's journal record is removed in the next batched write (within 5 s).
wait_until "the journal to drop the finished operations" '[ "$(journal_in_flight)" = 0 ]'

say "the driver now creates volumes but never answers (a lost reply); a new claim starts provisioning"
echo 'fault CreateVolume=after:hang' >"$work/driver/faults.txt"
k apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: doomed, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: demo
  resources: {requests: {storage: 1Gi}}
YAML
wait_until "the backend volume of claim doomed" '[ "$(driver_volumes)" = 4 ]'
echo "the backend created the volume, the sidecar is still waiting for the reply."
echo "The journal recorded the operation before calling the driver:"
k get provisioningjournals -A

say "SIGKILL the sidecar, then delete the claim"
{ kill -9 "$sidecar" && wait "$sidecar"; } 2>/dev/null || true
k delete pvc doomed --wait=true
echo "the backend holds $(driver_volumes) volumes for 3 PVs: the volume of the deleted claim is an orphan."
echo "A sidecar that keeps this state in memory (upstream, issue #486) has just leaked it."

say "restarting the sidecar: it reads the journal, replays CreateVolume and deletes the orphan"
: >"$work/driver/faults.txt"
start_sidecar
wait_until "the orphan to be deleted" '[ "$(driver_volumes)" = 3 ]'
k get events -A --field-selector reason=OrphanedVolumeDeleted
grep -i 'orphan' "$work/sidecar.log" | tail -n 3 || true
echo "driver volumes: $(driver_volumes) (one per PV)"
k get pv

say "deleting claim-1: its Released PV and its backend volume are deleted"
k delete pvc claim-1 --wait=true
wait_until "the volume of claim-1 to be deleted" '[ "$(driver_volumes)" = 2 ]'
k get pv
echo "driver volumes: $(driver_volumes)"
