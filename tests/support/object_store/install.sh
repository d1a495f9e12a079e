#!/bin/sh
# Installs the S3 server that ferry's remote-shard tests run (s3_server.js; @20minutes/s3rver pinned
# by package-lock.json) into BUILD_DIR/object_store/node_modules, with `npm ci`, so the source tree
# never holds node_modules.
#
#   tests/support/object_store/install.sh BUILD_DIR
#
# Exit 0: installed (or already installed from the same package.json and package-lock.json; then
# it does nothing, so every test may call it). Exit 77, ctest's and the tests' skip code, with one
# line on stderr saying why: node or npm missing or too old, or the install failed (no network?).
# Exit 2: called wrongly.
#
# Node 18 is the oldest that runs s3rver 4.0.4 (checked with 18.19.0, Debian 12's nodejs), though
# its package.json asks for 20: npm ci only warns about that (EBADENGINE).

set -eu

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 BUILD_DIR (installs into BUILD_DIR/object_store)" >&2
  exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
dest=$(cd "$1" && pwd)/object_store
hint="Debian: apt-get install nodejs npm"

skip() {
  echo "object store tests skipped: $*" >&2
  exit 77
}

command -v node >/dev/null 2>&1 || skip "node not found on PATH ($hint)"
node_version=$(node -p 'process.versions.node' 2>/dev/null) || skip "node does not run ($hint)"
node_major=${node_version%%.*}
[ "$node_major" -ge 18 ] 2>/dev/null || skip "node $node_version is older than 18 ($hint, or Node 18+)"

# Both files decide what npm ci installs (it refuses a lock file that disagrees with package.json).
want=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)
stamp="$dest/.installed"
installed() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
    [ -f "$dest/node_modules/@20minutes/s3rver/package.json" ]
}
installed && exit 0

command -v npm >/dev/null 2>&1 || skip "npm not found on PATH ($hint)"
npm_version=$(npm --version 2>/dev/null) || skip "npm does not run ($hint)"
npm_major=${npm_version%%.*}
# lockfileVersion 3 needs npm 7.
[ "$npm_major" -ge 7 ] 2>/dev/null || skip "npm $npm_version is older than 7 ($hint, or npm 7+)"

# Tests run in parallel (ctest -j) and each may call this: one installs, the others wait for it
# and then find the stamp.
mkdir -p "$dest"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$dest.lock"
  flock 9
  installed && exit 0
fi

# Offline, every test would try npm again and wait for its timeouts: a failure is remembered for
# 10 minutes, for the same package files.
failed="$dest/.failed"
if [ -f "$failed" ] && [ "$(head -n 1 "$failed")" = "$want" ] &&
    [ -n "$(find "$failed" -mmin -10 2>/dev/null)" ]; then
  skip "$(tail -n 1 "$failed") (from the last 10 min; delete $failed to try again now)"
fi

rm -f "$stamp" "$failed"
cp "$here/package.json" "$here/package-lock.json" "$dest/"
log="$dest/npm-ci.log"
# Short network timeouts: offline, a test should skip within a minute or two, not wait npm's
# default of 5 minutes per fetch. No install scripts: every package here is plain JavaScript.
if ! (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error \
        --fetch-timeout=60000 --fetch-retries=1 --fetch-retry-maxtimeout=10000) >"$log" 2>&1; then
  # The line that names the failure ("FetchError: request to ... failed"), else npm's first.
  reason=$( (grep -m 1 -E 'Error: ' "$log" || grep -m 1 -E '^npm (error|ERR!)' "$log" || true) |
    sed -E 's/^npm (error|ERR!) *//')
  why="npm ci failed in $dest (offline? see $log): $reason"
  printf '%s\n%s\n' "$want" "$why" >"$failed"
  skip "$why"
fi
echo "$want" >"$stamp"
