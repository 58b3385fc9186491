#!/usr/bin/env bash
# Supply-chain checks of the dependency tree with cargo-deny and deny.toml (docs/supply-chain.md):
# advisories (RustSec), bans (duplicate versions, wildcards), licenses (an allow-list) and sources
# (crates.io only). Each check runs on its own and prints one line:
#   cargo-deny: <check>: passed | failed | not run (<why>)
# then the totals, the line hack/test.sh counts into its summary:
#   cargo-deny: N passed, N failed, N not run
#
# cargo-deny is installed once per machine from crates.io (`cargo install --locked`) into
# $CACHE/tools/cargo-deny-$DENY_VERSION and reused.
#
# The advisory database (a git clone of RustSec's advisory-db) lives in $CACHE/advisory-dbs,
# outside the work tree, so every run on the machine reuses it. Each run first tries to refresh
# it (`cargo deny fetch db`, from github.com, or from CSI_PROVISIONER_ADVISORY_DB_MIRROR when
# that names a git repository holding a copy of advisory-db, e.g. a local mirror); when the
# refresh fails the database already in the cache is used, and its date is printed either way.
# With no database at all the advisories check is "not run": it neither passes (nothing was
# checked) nor fails (the dependency tree is not known to be bad; a machine without a network
# path to the database would otherwise refuse every change), and says so loudly.
#
# Usage: hack/cargo-deny.sh
# Env:   CSI_PROVISIONER_CACHE                the cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs)
#        CSI_PROVISIONER_ADVISORY_DB_MIRROR   a git repository (path or URL) to refresh the database from
# Exit:  1 when a check failed or cargo-deny could not be installed; 0 otherwise (a check that
#        did not run is not a failure, but is counted and printed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DENY_VERSION=0.20.2
# deny.toml names this URL in [advisories] db-urls; cargo-deny keeps its clone in db-path under a
# directory named after the URL's last segment and a hash of it.
ADVISORY_DB_URL=https://github.com/rustsec/advisory-db
# A database older than this (by its newest commit) is used, with a warning: RustSec adds several
# advisories a week, so an old one misses recent ones.
STALE_DAYS=30

cache=${CSI_PROVISIONER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner-rs}
tool_dir=$cache/tools/cargo-deny-$DENY_VERSION
deny=$tool_dir/bin/cargo-deny
db_root=$cache/advisory-dbs

log() { printf 'cargo-deny.sh: %s\n' "$*" >&2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/cargo-deny.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- the tool ----------------------------------------------------------------------------------
if [[ ! -x $deny ]]; then
  log "installing cargo-deny $DENY_VERSION into $tool_dir (cargo install --locked, once per machine)"
  started=$SECONDS
  staging=$tool_dir.tmp.$$
  rm -rf "$staging"
  # Its own temporary target directory (removed by cargo install), not the project's.
  if ! env -u CARGO_TARGET_DIR cargo install --quiet --locked --root "$staging" \
    cargo-deny --version "$DENY_VERSION"; then
    rm -rf "$staging"
    log "cargo install cargo-deny $DENY_VERSION failed"
    echo "cargo-deny: 0 passed, 1 failed, 0 not run"
    exit 1
  fi
  rm -rf "$tool_dir"
  mv "$staging" "$tool_dir"
  log "installed in $((SECONDS - started))s"
fi
"$deny" --version

# deny.toml with db-path pointing into the cache (deny.toml itself leaves cargo-deny's default,
# $CARGO_HOME/advisory-dbs, for a plain `cargo deny check` with the network).
config=$work/deny.toml
sed "/^\[advisories\]$/a db-path = \"$db_root\"" deny.toml >"$config"
grep -q '^db-path = ' "$config" || { log "deny.toml has no [advisories] table"; exit 1; }

# --- the advisory database ---------------------------------------------------------------------
mkdir -p "$db_root"
# A clone with a commit and the advisories (crates/); anything else (an interrupted clone) is
# removed, or every later fetch would fail on it.
valid_db() { [[ -e $1/.git && -d $1/crates ]] && git -C "$1" rev-parse --verify --quiet HEAD >/dev/null 2>&1; }
for dir in "$db_root"/advisory-db-*/; do
  [[ ! -d $dir ]] || valid_db "$dir" || { log "removing the broken advisory database $dir"; rm -rf "$dir"; }
done
fetch_db() {
  local git_env=()
  if [[ -n ${CSI_PROVISIONER_ADVISORY_DB_MIRROR:-} ]]; then
    local mirror=$CSI_PROVISIONER_ADVISORY_DB_MIRROR
    [[ $mirror != /* ]] || mirror=file://$mirror # file:// so that git honours --depth=1
    # cargo-deny runs git; the URL it fetches is rewritten to the mirror.
    git_env=(GIT_CONFIG_COUNT=1 "GIT_CONFIG_KEY_0=url.$mirror.insteadOf" "GIT_CONFIG_VALUE_0=$ADVISORY_DB_URL")
    log "refreshing the advisory database from $CSI_PROVISIONER_ADVISORY_DB_MIRROR"
  else
    log "refreshing the advisory database from $ADVISORY_DB_URL"
  fi
  env "${git_env[@]}" GIT_TERMINAL_PROMPT=0 timeout 120 \
    "$deny" --log-level error --config "$config" fetch db >"$work/fetch.log" 2>&1
}
if fetch_db; then
  log "advisory database refreshed"
else
  log "could not refresh the advisory database:"
  sed 's/^/  /' "$work/fetch.log" | tail -n 5 >&2
fi
db_dir=
for dir in "$db_root"/advisory-db-*/; do
  if [[ -d $dir ]] && valid_db "$dir"; then db_dir=${dir%/}; fi
done

# --- the checks ----------------------------------------------------------------------------------
# The checks run offline (the database as refreshed above, the crates cargo has downloaded):
# download what Cargo.lock names first, in case this is the first cargo command on the machine.
cargo fetch --locked --quiet
passed=0 failed=0 not_run=0
# run_check CHECK LOG_LEVEL [check options...]
run_check() {
  local check=$1 level=$2
  shift 2
  if "$deny" --locked --offline --log-level "$level" --config "$config" check "$@" "$check"; then
    echo "cargo-deny: $check: passed"
    passed=$((passed + 1))
  else
    echo "cargo-deny: $check: failed"
    failed=$((failed + 1))
  fi
}

if [[ -n $db_dir ]]; then
  commit_date=$(git -C "$db_dir" show -s --format=%cI HEAD)
  age_days=$((($(date +%s) - $(date -d "$commit_date" +%s)) / 86400))
  echo "cargo-deny: advisory database $db_dir: commit $(git -C "$db_dir" rev-parse --short HEAD) of $commit_date ($age_days days old)"
  if ((age_days > STALE_DAYS)); then
    echo "cargo-deny: WARNING: the advisory database is $age_days days old (over $STALE_DAYS): advisories published since $commit_date are not checked; refresh it (docs/supply-chain.md)"
  fi
  # cargo-deny judges staleness by the clone's file times, not by the commits (a fresh clone of
  # an old copy looks new); the date above is the one that matters, so its own limit is lifted.
  sed -i "/^\[advisories\]$/a maximum-db-staleness = \"P3650D\"" "$config"
  run_check advisories warn
else
  cat <<EOF
cargo-deny: advisories: not run (no advisory database in $db_root)
cargo-deny: ************************************************************************************
cargo-deny: NO ADVISORY DATABASE: the dependency tree was NOT checked against RustSec advisories.
cargo-deny: Give this machine a copy (docs/supply-chain.md): with the network, any run of this
cargo-deny: script fetches one; without, CSI_PROVISIONER_ADVISORY_DB_MIRROR=<a git copy of
cargo-deny: advisory-db> hack/cargo-deny.sh
cargo-deny: ************************************************************************************
EOF
  not_run=$((not_run + 1))
fi
# At "info", the duplicate versions that deny.toml skips are printed too (notes), with their
# reasons; a skip entry that matches no duplicate any more is an error, so the list stays true.
run_check bans info --deny unnecessary-skip --deny unmatched-skip
run_check licenses warn
run_check sources warn

echo "cargo-deny: $passed passed, $failed failed, $not_run not run"
[[ $failed -eq 0 ]]
