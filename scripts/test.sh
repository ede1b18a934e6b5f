#!/usr/bin/env bash
# make test: every test of the main build (ctest), then the sanitized build's
# unit tests and fuzz targets (scripts/sanitize.sh). The sanitized tree is
# compiled on one core at the lowest priority while the main suite runs, which spends
# most of its time waiting on daemons, Slurm, CephFS and killed jobs; the
# sanitized tests themselves run afterwards, on a quiet machine.
#   scripts/test.sh <main build dir>
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
san="${build%/}-san"
mkdir -p "$san"
JOBS=1 nice -n 19 scripts/sanitize.sh --build-only "$san" >"$san/sanitize-build.log" 2>&1 &
builder=$!
ctest --test-dir "$build" --output-on-failure -j 1
main=$?
wait "$builder"
built=$?
cat "$san/sanitize-build.log"
san_rc=1
[ "$built" = 0 ] && { scripts/sanitize.sh "$san"; san_rc=$?; }
[ "$main" = 0 ] || echo "test: the main suite failed"
[ "$san_rc" = 0 ] || echo "test: the sanitized build failed"
[ "$main" = 0 ] && [ "$san_rc" = 0 ]
