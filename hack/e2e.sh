#!/usr/bin/env bash
# Kubernetes' own storage conformance for the sidecar: the External Storage suite of e2e.test
# (k8s.io/kubernetes v1.36.3, test/e2e/storage/external) against the reference driver deployed
# from deploy/ (with hack/e2e/deploy/'s csi-snapshotter) on the testbed's real node, once with our
# sidecar and once with upstream external-provisioner v6.3.0's in its place, on the same cluster;
# then the two results side by side (hack/e2e-report.py) and the verdict.
#
#   hack/e2e.sh            the subset CI runs (the provisioning, volumes, volumeMode,
#                          snapshottable and multiVolume suites, without [Serial] and
#                          [Disruptive] specs) with our sidecar, compared with upstream's
#                          outcomes of the same subset kept in hack/e2e/upstream-baseline.json
#   --with-upstream        upstream's sidecar runs too, after ours, on the same cluster
#   --full                 every suite the test-driver file enables (without [Disruptive]:
#                          those restart the kubelet over SSH), both sidecars
#   --only ours|upstream   one sidecar only (no comparison)
#   --write-baseline       with --only upstream: keep its outcomes as the baseline (run it
#                          when the upstream or Kubernetes version moves, and commit the file)
#
# Fails when a spec fails with our sidecar, or when no spec ran. The reports (JUnit XML, the
# table) go to $E2E_REPORT_DIR (default target/e2e). Needs root (a real node: containerd and a
# kubelet); hack/build-e2e.sh builds e2e.test, ginkgo and the images (cached).
# Environment: E2E_PROCS (parallel specs, default 4), E2E_REPORT_DIR, CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

full=false
sides=(ours)
compare_baseline=true
write_baseline=false
baseline=hack/e2e/upstream-baseline.json
usage="usage: hack/e2e.sh [--full | --with-upstream] [--only ours|upstream [--write-baseline]]"
while [ $# -gt 0 ]; do
  case "$1" in
    --full) full=true; sides=(ours upstream); compare_baseline=false ;;
    --with-upstream) sides=(ours upstream); compare_baseline=false ;;
    --only)
      case "${2:-}" in ours | upstream) sides=("$2") ;; *) echo "--only takes ours or upstream" >&2; exit 2 ;; esac
      compare_baseline=false
      shift
      ;;
    --write-baseline) write_baseline=true ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done
if $write_baseline && { $full || [ "${sides[*]}" != upstream ]; }; then
  echo "--write-baseline goes with --only upstream, on the CI subset (no --full)" >&2
  exit 2
fi

driver=reference.csi.example.com
procs=${E2E_PROCS:-4}
report_dir=${E2E_REPORT_DIR:-${CARGO_TARGET_DIR:-$repo/target}/e2e}
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { printf '[e2e] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "the suite needs a real node (containerd and a kubelet): run as root"

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-provisioner-e2e.XXXXXX")
testbed_pid=
cleanup() {
  if [ -n "$testbed_pid" ]; then
    kill "$testbed_pid" 2>/dev/null || true
    wait "$testbed_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

rm -f "$report_dir/report.md"  # hack/test.sh reads it: never the previous run's

say "building the testbed, the control plane, the node, e2e.test and the images (cached)"
cargo build -p csi-testbed --bin testbed
testbed=${CARGO_TARGET_DIR:-target}/debug/testbed
bin_dir=$(bash hack/build-control-plane.sh | tail -n 1)
export CSI_TESTBED_BIN_DIR="$bin_dir"
e2e_dir=$(bash hack/build-e2e.sh | tail -n 1)
[ -x "$e2e_dir/e2e.test" ] || die "hack/build-e2e.sh printed no directory with e2e.test"
k() { "$bin_dir/kubectl" "$@"; }

# The suite ignores unknown fields of the test-driver file: a misspelt capability would silently
# turn specs off. Every capability named there must be one of the suite's.
k8s_module=$(cd hack/e2e-bins && GOWORK=off GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' k8s.io/kubernetes)
known=$(grep -oE 'Capability = "[A-Za-z]+"' "$k8s_module/test/e2e/storage/framework/testdriver.go" | cut -d'"' -f2)
for cap in $(sed -n '/^  Capabilities:/,/^[^ ]/s/^    \([A-Za-z]*\):.*/\1/p' hack/e2e/testdriver.yaml); do
  grep -qx "$cap" <<<"$known" || die "hack/e2e/testdriver.yaml: $cap is not a capability of the suite (test/e2e/storage/framework/testdriver.go)"
done

say "starting the control plane with a real node and volume snapshots (testbed up --node --snapshots)"
"$testbed" up --node --snapshots --images "$e2e_dir" >"$work/testbed.log" 2>&1 &
testbed_pid=$!
for _ in $(seq 1 3600); do
  grep -q '^export KUBECONFIG=' "$work/testbed.log" && break
  kill -0 "$testbed_pid" 2>/dev/null || { cat "$work/testbed.log" >&2; die "testbed up exited"; }
  sleep 0.5
done
grep -q '^export KUBECONFIG=' "$work/testbed.log" || die "testbed up did not start within 30 minutes"
eval "$(grep '^export KUBECONFIG=' "$work/testbed.log")"

# Where the suite runs one spec per ginkgo process: each spec makes its own namespace, claims and
# pods; the driver and the sidecars are shared, as in a user's cluster.
if $full; then
  focus="External.Storage \\[Driver: ${driver//./\\.}\\]"
  skip='\[Disruptive\]'
else
  focus="External.Storage \\[Driver: ${driver//./\\.}\\] .*\\] (provisioning|volumes|volumeMode|snapshottable|multiVolume) "
  skip='\[Disruptive\]|\[Serial\]'
fi

# Deploys hack/e2e/deploy/ with sidecar image $1 and waits until the driver is registered.
deploy() {
  local image=$1 dir=$work/deploy
  mkdir -p "$dir"
  cat >"$dir/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$dir" hack/e2e/deploy)
images:
  - name: csi-provisioner-rs
    newName: ${image%:*}
    newTag: ${image##*:}
  - name: csi-reference-driver-rs
    newName: localhost/csi-reference-driver-rs
    newTag: dev
  - name: csi-registrar
    newName: localhost/csi-registrar
    newTag: dev
  - name: csi-snapshotter
    newName: localhost/csi-snapshotter
    newTag: v8.7.0
YAML
  k apply -k "$dir" >/dev/null
  k -n csi-provisioner rollout status deployment/csi-provisioner --timeout=300s
  k -n csi-provisioner rollout status daemonset/csi-reference-node --timeout=300s
  for _ in $(seq 1 240); do
    [ -n "$(k get csinode csi-testbed-node -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null)" ] && return 0
    sleep 0.5
  done
  die "the kubelet did not register $driver"
}

# Waits until no PersistentVolume is left (the previous run's namespaces are gone and their
# volumes deleted), so each sidecar starts from the same empty cluster.
wait_no_volumes() {
  for _ in $(seq 1 600); do
    local pvs namespaces
    if pvs=$(k get pv -o name) && namespaces=$(k get ns -o name) &&
      [ -z "$pvs" ] &&
      [ -z "$(grep -v -E '/(default|kube-system|kube-public|kube-node-lease|csi-provisioner)$' <<<"$namespaces")" ]; then
      return 0
    fi
    sleep 1
  done
  k get pv,ns >&2
  die "volumes or test namespaces were left after the run (above)"
}

run_suite() {
  local side=$1 image=$2 out=$report_dir/$1 started=$SECONDS status=0
  say "$side: the sidecar image $image"
  deploy "$image"
  k -n csi-provisioner get pods -o wide
  rm -rf "$out"
  mkdir -p "$out"
  say "$side: e2e.test, focus /$focus/, skip /$skip/, $procs in parallel"
  # Every event the run's specs get (each emission, also a repeat that bumps a count), to compare
  # what the two sidecars report (hack/e2e-report.py: the provisioner's events by reason).
  # (kubectl itself, not the function k: the background job's pid must be kubectl's to stop it)
  "$bin_dir/kubectl" get events -A --watch-only \
    -o jsonpath='{.metadata.namespace}{"\t"}{.type}{"\t"}{.reason}{"\t"}{.involvedObject.kind}{"\t"}{.source.component}{"\t"}{.message}{"\n"}' \
    >"$out/events.tsv" 2>"$out/events.err" &
  local events_pid=$!
  # --provider=local: a cluster without a cloud; --e2e-verify-service-account: the testbed's
  # controller manager creates each namespace's default ServiceAccount.
  "$e2e_dir/ginkgo" --procs="$procs" --timeout=4h --no-color \
    --focus="$focus" --skip="$skip" "$e2e_dir/e2e.test" -- \
    --kubeconfig="$KUBECONFIG" --provider=local --report-dir="$out" \
    --storage.testdriver="$repo/hack/e2e/testdriver.yaml" \
    --disable-log-dump --dump-logs-on-failure=false \
    >"$out/ginkgo.log" 2>&1 || status=$?
  grep -E '^(Ran |PASS|FAIL|SUCCESS!|FAIL!|Ginkgo ran)|\[FAIL\]' "$out/ginkgo.log" | sort -u | tail -n 40 || true
  echo "$status" >"$out/ginkgo.status"
  echo "$side: ginkgo exited $status after $((SECONDS - started)) s (log: $out/ginkgo.log)"
  kill "$events_pid" 2>/dev/null || true
  wait "$events_pid" 2>/dev/null || true
  # Both replicas' logs (the leader's and the standby's), each line prefixed with its pod.
  k -n csi-provisioner logs -l app.kubernetes.io/name=csi-provisioner -c csi-provisioner \
    --prefix --tail=-1 >"$out/sidecar.log" 2>&1 || true
  wait_no_volumes
}

for side in "${sides[@]}"; do
  case "$side" in
    ours) run_suite ours localhost/csi-provisioner-rs:dev ;;
    upstream)
      # Upstream's sidecar with the RBAC upstream ships (deploy/kubernetes/rbac.yaml of v6.3.0,
      # its namespace set as its comments ask), on top of deploy/'s, which is ours and grants less
      # (upstream updates claims where we patch them). Ours ran without it.
      say "upstream: its own RBAC example (external-provisioner v6.3.0 deploy/kubernetes/rbac.yaml)"
      upstream_src=$(bash hack/upstream-source.sh | tail -n 1)
      sed 's/namespace: default/namespace: csi-provisioner/' "$upstream_src/deploy/kubernetes/rbac.yaml" |
        k apply -f -
      run_suite upstream localhost/external-provisioner:v6.3.0
      ;;
  esac
done

if $write_baseline; then
  say "keeping upstream's outcomes as the baseline: $baseline"
  python3 hack/e2e-report.py --write-baseline "$baseline" "$report_dir/upstream"
fi
say "results (pass / skip / fail per suite)"
if $compare_baseline; then
  python3 hack/e2e-report.py "$report_dir" ours upstream --baseline "$baseline" | tee "$report_dir/report.md"
else
  python3 hack/e2e-report.py "$report_dir" "${sides[@]}" | tee "$report_dir/report.md"
fi
