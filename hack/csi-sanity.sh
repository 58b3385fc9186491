#!/usr/bin/env bash
# Runs csi-sanity against the reference driver (crate reference-driver/) three times: plain,
# with a 50ms delay injected into every call, and with topology (two segments, the first too
# small for a second volume, the node in the second), so csi-sanity's topology paths run too.
# Each run gets a fresh state dir and fresh mount/staging dirs. Prints one summary line per run;
# exits non-zero if any run fails.
#
# Usage: hack/csi-sanity.sh [extra csi-sanity flags, e.g. --ginkgo.focus=CreateVolume]
# Env:   CSI_PROVISIONER_CACHE  tool cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs)
#        CSI_SANITY_KEEP=1      keep the per-run temp dirs (logs, state) for inspection
set -euo pipefail

SANITY_VERSION=v5.6.0
SANITY_MODULE=github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
tool_dir=$cache/tools/csi-sanity-$SANITY_VERSION
sanity=$tool_dir/csi-sanity

log() { printf 'csi-sanity.sh: %s\n' "$*" >&2; }

if [[ ! -x $sanity ]]; then
  command -v go >/dev/null || { log "go is required to install csi-sanity $SANITY_VERSION"; exit 1; }
  log "installing csi-sanity $SANITY_VERSION into $tool_dir"
  mkdir -p "$tool_dir"
  GOBIN=$tool_dir go install "$SANITY_MODULE@$SANITY_VERSION"
fi

log "building csi-reference-driver"
(cd "$repo" && cargo build --quiet --bin csi-reference-driver)
driver=${CARGO_TARGET_DIR:-$repo/target}/debug/csi-reference-driver
[[ -x $driver ]] || { log "driver binary not found at $driver"; exit 1; }

work_dirs=()
driver_pid=

stop_driver() {
  if [[ -n $driver_pid ]]; then
    kill -TERM "$driver_pid" 2>/dev/null || true
    wait "$driver_pid" 2>/dev/null || true
    driver_pid=
  fi
}

cleanup() {
  stop_driver
  if [[ ${CSI_SANITY_KEEP:-0} == 1 ]]; then
    log "kept: ${work_dirs[*]}"
  else
    for dir in "${work_dirs[@]}"; do rm -rf "$dir"; done
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# run_sanity NAME [driver flags...]: one csi-sanity run; sets $summary, returns its status.
run_sanity() {
  local name=$1
  shift
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/csi-sanity.XXXXXX")
  work_dirs+=("$work")
  local socket=$work/csi.sock

  "$driver" --endpoint "unix://$socket" --state-dir "$work/state" --node-id sanity-node "$@" \
    >"$work/driver.log" 2>&1 &
  driver_pid=$!
  local waited=0
  until [[ -S $socket ]]; do
    if ! kill -0 "$driver_pid" 2>/dev/null; then
      log "[$name] driver exited before creating its socket:"
      cat "$work/driver.log" >&2
      driver_pid=
      summary="[$name] driver failed to start"
      return 1
    fi
    ((waited++ < 100)) || { summary="[$name] driver socket did not appear"; return 1; }
    sleep 0.1
  done

  local status=0
  "$sanity" \
    --csi.endpoint "unix://$socket" \
    --csi.mountdir "$work/mount" \
    --csi.stagingdir "$work/staging" \
    --ginkgo.no-color \
    "${extra_args[@]}" >"$work/sanity.log" 2>&1 || status=$?
  stop_driver

  local ran counts
  ran=$(grep -Eo 'Ran [0-9]+ of [0-9]+ Specs' "$work/sanity.log" | tail -n1 || true)
  counts=$(grep -Eo '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$work/sanity.log" | tail -n1 || true)
  if ((status != 0)); then
    log "[$name] csi-sanity failed (exit $status); end of its log:"
    tail -n 60 "$work/sanity.log" >&2
    log "[$name] driver log: $work/driver.log (set CSI_SANITY_KEEP=1 to keep it)"
    summary="[$name] FAIL: ${ran:-no specs ran}${counts:+: $counts}"
    return 1
  fi
  summary="[$name] ok: $ran: $counts"
}

extra_args=("$@")
summaries=()
failed=0
for run in plain delay-50ms topology; do
  case $run in
    plain) flags=() ;;
    delay-50ms) flags=(--delay '*=50ms') ;;
    # csi-sanity's volumes are 10Gi: the first fills zone a, later ones spill over to zone b.
    topology) flags=(--segment 'zone=a,rack=1:12Gi' --segment 'zone=b,rack=2' --topology 'zone=b,rack=2') ;;
  esac
  log "run $run"
  summary=
  run_sanity "$run" "${flags[@]}" || failed=1
  summaries+=("$summary")
done

for line in "${summaries[@]}"; do echo "csi-sanity $SANITY_VERSION $line"; done
exit "$failed"
