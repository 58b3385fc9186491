#!/usr/bin/env bash
# Runs the deterministic simulation of the sidecar (src/controller/testing/sim, issue #31): the real
# reconcilers, reaper and journal against an in-memory API server and CSI driver, on one seeded
# scheduler with faults, the invariants checked after every step. Lib tests only.
#
#   hack/simulate.sh --seeds N [--profile P] [--tally]   N seeds per profile; fails with the trace
#                                                        of the first failing seed (--tally: runs
#                                                        them all and counts the findings by hole)
#   hack/simulate.sh --seed S [--profile P]              one seed, its numbered trace printed
#   hack/simulate.sh --holes K                           asserts each known hole of issue #31 is
#                                                        found within K seeds of its profile
#
# Profiles: calm, failover, node-moves, final-errors, in-tree, restores, races
# (src/controller/testing/sim/profiles.rs). Reports and the seeds of the known holes: see the module docs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

test_name=controller::testing::sim::tests::seeds
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) export SIM_SEEDS="$2"; shift 2 ;;
    --seed) export SIM_SEED="$2"; test_name=controller::testing::sim::tests::replay; shift 2 ;;
    --profile) export SIM_PROFILE="$2"; shift 2 ;;
    --tally) export SIM_TALLY=1; shift ;;
    --holes) export SIM_EXPECT_HOLES=1 SIM_HOLE_SEEDS="$2"; test_name=controller::testing::sim::tests::expected_holes; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "simulate.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

exec cargo test -p csi-provisioner-rs --lib "$test_name" -- --exact --nocapture
