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
cargo build
built=${CARGO_TARGET_DIR:-target}/debug  # where cargo build put them
bin_dir=$(bash hack/build-control-plane.sh | tail -n 1)
kubectl="$bin_dir/kubectl"
export CSI_TESTBED_BIN_DIR="$bin_dir"

say "starting the local control plane (etcd + kube-apiserver + kube-controller-manager)"
"$built/testbed" up >"$work/testbed.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  grep -q '^export KUBECONFIG=' "$work/testbed.log" && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/testbed.log"; exit 1; }
  sleep 0.5
done
eval "$(grep '^export KUBECONFIG=' "$work/testbed.log")"
k() { "$kubectl" "$@"; }
echo "KUBECONFIG=$KUBECONFIG"

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

wait_until() { # description, command: polls for up to 60 s
  for _ in $(seq 1 120); do eval "$2" && return 0; sleep 0.5; done
  echo "timed out waiting for $1" >&2
  exit 1
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
