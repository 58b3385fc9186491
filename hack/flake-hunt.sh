#!/usr/bin/env bash
# Runs integration test binaries several times, optionally while the machine is loaded the way CI
# loads it (a release build of the workspace compiling beside the tests), and prints a table:
# binary, runs, runs that failed, and each failing test with how often it failed. Logs stay in
# the printed directory. docs/design.md "Tests" says when to run it.
#
#   hack/flake-hunt.sh [--runs N] [--load] [--threads N] [BINARY...]
#
# BINARY: the [[test]] targets of Cargo.toml (default: all of them, in_cluster last).
# --runs N (default 3): runs of each binary. --load: a parallel `cargo build --release` of the
# workspace in a scratch target directory, restarted whenever it finishes, for the whole hunt.
# --threads N (default 4, as hack/test.sh): libtest's --test-threads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=3 load=false threads=${CSI_PROVISIONER_TEST_THREADS:-4} binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift ;;
    --load) load=true ;;
    --threads) threads=$2; shift ;;
    -*) echo "usage: hack/flake-hunt.sh [--runs N] [--load] [--threads N] [BINARY...]" >&2; exit 2 ;;
    *) binaries+=("$1") ;;
  esac
  shift
done
if [ ${#binaries[@]} -eq 0 ]; then
  mapfile -t binaries < <(awk '/^\[\[test\]\]/ { t = 1; next } t && /^name = / { gsub(/"/, "", $3); print $3; t = 0 }' Cargo.toml |
    sort | awk '$0 == "in_cluster" { last = $0; next } { print } END { if (last) print last }')
fi

cache_root=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache_root/cargo-target}
CSI_TESTBED_BIN_DIR=$(bash hack/build-control-plane.sh | tail -n 1)
export CSI_TESTBED_BIN_DIR
logs=$(mktemp -d "${TMPDIR:-/tmp}/flake-hunt.XXXXXX")
echo "logs: $logs"

load_pid=
stop_load() { [ -z "$load_pid" ] || kill -- -"$load_pid" 2>/dev/null || true; }
trap stop_load EXIT
if $load; then
  load_target=$logs/load-target
  setsid bash -c "while :; do cargo build --release --workspace --target-dir '$load_target' >>'$logs/load.log' 2>&1; rm -rf '$load_target'; done" &
  load_pid=$!
  echo "load: cargo build --release --workspace, in a loop (pid $load_pid)"
fi

cargo test --no-run "${binaries[@]/#/--test=}" >"$logs/build.log" 2>&1 || { tail -n 40 "$logs/build.log"; exit 1; }

printf '| binary | runs | failed runs | failing tests (times) |\n|---|--:|--:|---|\n' >"$logs/table.md"
for binary in "${binaries[@]}"; do
  failed_runs=0
  for run in $(seq 1 "$runs"); do
    log=$logs/$binary.$run.log
    started=$SECONDS
    if cargo test --test "$binary" -- --test-threads="$threads" >"$log" 2>&1; then status=0; else status=$?; fi
    summary=$(grep -E '^test result: ' "$log" | tail -n 1 || true)
    echo "$binary run $run: exit $status in $((SECONDS - started)) s: ${summary:-no summary}"
    [ "$status" -eq 0 ] || failed_runs=$((failed_runs + 1))
    grep -E '^test .* \.\.\. FAILED$' "$log" | awk '{ print $2 }' >>"$logs/$binary.failures" || true
  done
  failing=$( [ -s "$logs/$binary.failures" ] && sort "$logs/$binary.failures" | uniq -c |
    awk '{ printf "%s`%s` (%d)", sep, $2, $1; sep = ", " }' || true)
  printf '| %s | %s | %s | %s |\n' "$binary" "$runs" "$failed_runs" "${failing:-none}" >>"$logs/table.md"
done
echo
cat "$logs/table.md"
