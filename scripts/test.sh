#!/usr/bin/env bash
# make test: every test of the main build (ctest, two at a time), then the sanitized builds:
# the ASan+UBSan build's unit tests, fuzz targets and seven of the integration
# suites, and the TSan build's unit tests and two integration suites
# (scripts/sanitize.sh). The sanitized trees are compiled one after the other,
# at the lowest priority (on whatever the main suite leaves idle: it spends much
# of its time waiting on daemons, Slurm, CephFS and killed jobs), while the main
# suite runs; the ASan+UBSan tests run once the main suite is done and their
# tree is built, beside the TSan tree's compilation, then the TSan tests.
# Where the time goes (a 40-minute run on a slow 2-core host, docs/performance.md):
# most of the CPU is compiling (the ASan tree 1,179 s beside the main suite), the
# main suite about 800 s of CPU, two thirds of it sys (994 s two at a time).
#   scripts/test.sh <main build dir>
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
san="${build%/}-san"
tsan="${build%/}-tsan"
mkdir -p "$san" "$tsan"
rm -f "$san/built" "$tsan/built"
(
  JOBS=2 nice -n 19 scripts/sanitize.sh --build-only "$san" >"$san/sanitize-build.log" 2>&1
  echo $? >"$san/built"
  SANITIZE=thread JOBS=2 nice -n 19 scripts/sanitize.sh --build-only "$tsan" >"$tsan/sanitize-build.log" 2>&1
  echo $? >"$tsan/built"
) &
builder=$!
# Two tests at a time: most of the suite waits on daemons, Slurm, CephFS and
# killed jobs (alone, one at a time: 1,462 s; two at a time: 881 s, all
# passing, docs/performance.md).
ctest --test-dir "$build" --output-on-failure -j 2
main=$?
# The ASan+UBSan tests as soon as their tree is built, while the TSan tree
# still compiles beside them (its integration suites mostly wait on killed
# jobs and daemons).
while [ ! -s "$san/built" ] && kill -0 "$builder" 2>/dev/null; do sleep 5; done
san_rc=1
cat "$san/sanitize-build.log"
[ "$(cat "$san/built" 2>/dev/null)" = 0 ] && { scripts/sanitize.sh "$san"; san_rc=$?; }
wait "$builder"
tsan_rc=1
cat "$tsan/sanitize-build.log"
[ "$(cat "$tsan/built" 2>/dev/null)" = 0 ] && { SANITIZE=thread scripts/sanitize.sh "$tsan"; tsan_rc=$?; }
[ "$main" = 0 ] || echo "test: the main suite failed"
[ "$san_rc" = 0 ] || echo "test: the ASan+UBSan build failed"
[ "$tsan_rc" = 0 ] || echo "test: the TSan build failed"
[ "$main" = 0 ] && [ "$san_rc" = 0 ] && [ "$tsan_rc" = 0 ]
