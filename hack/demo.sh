#!/usr/bin/env bash
# The demo: one command. Builds what is missing, starts a real local control plane, the
# reference CSI driver and the sidecar; provisions a few claims; then deletes a claim while its
# CreateVolume is still running, SIGKILLs the sidecar, restarts it, and shows the journal
# cleaning up the orphaned volume. Everything is torn down at the end (also on Ctrl-C).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

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

say "building the sidecar, the reference driver and the testbed (cargo build)"
cargo build --bin csi-provisioner --bin csi-reference-driver -p csi-provisioner-rs
cargo build -p csi-testbed --bin testbed
bin_dir=$(bash hack/build-control-plane.sh | tail -n 1)
kubectl="$bin_dir/kubectl"
export CSI_TESTBED_BIN_DIR="$bin_dir"

say "starting the local control plane (etcd + kube-apiserver + kube-controller-manager)"
target/debug/testbed up >"$work/testbed.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  grep -q '^export KUBECONFIG=' "$work/testbed.log" && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/testbed.log"; exit 1; }
  sleep 0.5
done
eval "$(grep '^export KUBECONFIG=' "$work/testbed.log")"
k() { "$kubectl" "$@"; }
echo "KUBECONFIG=$KUBECONFIG"

say "installing the journal CRD (deploy/crd.yaml)"
k apply -f deploy/crd.yaml
k wait --for=condition=Established crd/provisioningjournals.provisioner.csi-rs.dev --timeout=60s

say "starting the reference driver and the sidecar"
target/debug/csi-reference-driver --endpoint "$work/csi.sock" --state-dir "$work/driver" >"$work/driver.log" 2>&1 &
pids+=($!)
start_sidecar() {
  target/debug/csi-provisioner --csi-address "$work/csi.sock" --kubeconfig "$KUBECONFIG" -v=1 >>"$work/sidecar.log" 2>&1 &
  sidecar=$!
  pids+=("$sidecar")
}
start_sidecar
driver_volumes() {
  python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["volumes"]))' "$work/driver/state.json" 2>/dev/null || echo 0
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

say "the driver now takes 8 s per CreateVolume; a new claim starts provisioning"
echo 'delay CreateVolume=8s' >"$work/driver/faults.txt"
k apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: doomed, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: demo
  resources: {requests: {storage: 1Gi}}
YAML
for _ in $(seq 1 60); do
  k get events --field-selector involvedObject.name=doomed,reason=Provisioning -o name | grep -q . && break
  sleep 0.5
done
echo "CreateVolume is in flight; the journal records it:"
k get provisioningjournals -A

say "SIGKILL the sidecar and delete the claim while the driver is still creating its volume"
kill -9 "$sidecar"
k delete pvc doomed --wait=true
sleep 9
echo "the driver finished creating the volume of a claim that no longer exists: $(driver_volumes) volumes, 3 PVs"
k get provisioningjournals -A

say "restarting the sidecar: it reads the journal, replays CreateVolume and deletes the orphan"
: >"$work/driver/faults.txt"
start_sidecar
for _ in $(seq 1 120); do
  [ "$(driver_volumes)" = 3 ] && break
  sleep 0.5
done
k get provisioningjournals -A
k get events -A --field-selector reason=OrphanedVolumeDeleted
echo "driver volumes: $(driver_volumes) (one per PV)"
k get pv
