#!/usr/bin/env bash
# The sanitized build (docs/design/security.md "Fuzzing and sanitizers"):
# builds the core, the unit tests (cairnd with them), the libFuzzer targets and
# what a part of the integration suites runs (ckpt_app under mpirun, the CLI,
# cairnd) with clang under ASan+UBSan (any report fails; clang's -Wthread-safety
# is an error in every clang build), runs the unit tests, then each fuzz target
# for FUZZ_SECONDS (8), two at a time, over its seed corpus (cairn_fuzz_seeds) and its regression
# corpus (tests/fuzz/regress/<target>, replayed whole), then the integration suites of
# restart, the rebuild from redundancy, the data planes, the node daemon, durability
# (kills mid-commit, lost unsynced data), run identity (leases) and aggregation leaders.
#   scripts/sanitize.sh [build dir]        default build-san
#   scripts/sanitize.sh --build-only DIR   configure and build only (make test does this
#                                          beside the main suite, then runs the rest)
#   SANITIZE=thread scripts/sanitize.sh    under TSan instead, the unit tests of the code that
#                                          runs threads (engine, client, daemon, fabric and agents,
#                                          redundancy, aggregation, storage envs, batch signals),
#                                          then the integration suites of restart and the node
#                                          daemon (ranks under mpirun with the engine's threads,
#                                          cairnd's), and cairn-agent for the thread-safety analysis;
#                                          the single-threaded decoders' tests run under ASan only.
#                                          No fuzzing; suppressions: tests/tsan.supp
#   FUZZ_SECONDS=600 scripts/sanitize.sh   a longer campaign (the corpus grows under the build dir)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
dir=${1:-build-san}
sanitize=${SANITIZE:-address,undefined}
seconds=${FUZZ_SECONDS:-8}
jobs=${JOBS:-$(nproc)}
fuzz=ON
[ "$sanitize" = thread ] && fuzz=OFF
start=$(date +%s)
# -O1 with line tables for the reports (-O0 compiles in half the time, but
# its unit tests took 3x as long and its fuzzers ran a tenth as many inputs).
python=()
[ -x .venv/bin/python ] && python=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python")
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${python[@]}" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCAIRN_SANITIZE="$sanitize" -DCAIRN_BUILD_FUZZ=$fuzz -DCAIRN_ENABLE_MPI=ON -DCAIRN_ENABLE_FORTRAN=OFF \
  -DCAIRN_BUILD_EXAMPLES=OFF -DCAIRN_BUILD_BENCH=OFF >/dev/null
known=$(ninja -C "$dir" -t targets all 2>/dev/null | cut -d: -f1)
has_target() { grep -qx "$1" <<<"$known"; }
targets=(cairn_unit_tests)
# The integration suites run under ASan (pytest drives the sanitized programs; the
# test environment of this build directory points at them).
# integration_agents runs in the main suite only: CI's 35 minutes (its agents'
# data plane is under ASan in agents_fabric_test and integration_data_planes).
integration=(integration_restart fault_redundancy integration_data_planes fault_daemon fault_durability integration_run_identity
             integration_aggregate)
integration_targets=(ckpt_app ckpt_app_serial cpp_app cairn_cli cairnd cairn_mpi_plugin cairn_plane_stranger)
for t in "${integration_targets[@]}"; do
  has_target "$t" || integration=()
done
[ ${#integration[@]} -gt 0 ] && targets+=("${integration_targets[@]}")
tests=()
if [ "$sanitize" = thread ]; then
  targets=()
  for t in engine_test cow_test client_test daemon_test agents_fabric_test agents_client_test agents_control_test \
           redundancy_test aggregate_test storage_test batch_test util_test; do
    has_target "$t" && targets+=("$t")
  done
  tests=(-R "^($(IFS='|'; echo "${targets[*]}"))\$")
  # cairn-agent has no unit test of its own: built for clang's thread-safety
  # analysis, here, where clang compiles at about half ASan's cost.
  has_target cairn_agent && targets+=(cairn_agent)
  # Two suites, for CI's time: TSan found a race there that the unit tests
  # could not show (the manifest entry read while cairnd's node-local stage
  # still wrote it). Without the CLI (its one `cairn ls` check skips): it
  # runs no threads of cairn's.
  if [ ${#integration[@]} -gt 0 ]; then
    integration=(integration_restart fault_daemon)
    for t in "${integration_targets[@]}"; do [ "$t" = cairn_cli ] || targets+=("$t"); done
  fi
fi
[ $fuzz = ON ] && targets+=(cairn_fuzzers)
if ! cmake --build "$dir" -j "$jobs" --target "${targets[@]}" >"$dir/build.log" 2>&1; then
  tail -40 "$dir/build.log"
  echo "sanitize: the sanitized build failed (whole log: $dir/build.log)"
  exit 1
fi
echo "sanitize: built in $(( $(date +%s) - start )) s"
[ $build_only = 1 ] && exit 0
[ -x /usr/bin/llvm-symbolizer ] && export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"
ctest --test-dir "$dir" -L unit "${tests[@]}" --output-on-failure -j "$jobs"
if [ $fuzz = ON ]; then
  seeds="$dir/fuzz-seeds"
  rm -rf "$seeds"
  "$dir/tests/fuzz/cairn_fuzz_seeds" "$seeds"
  # One target: its corpus, the seeds and the regression inputs.
  fuzz_one() {
    local bin=$1 t
    t=$(basename "$bin")
    t=${t#fuzz_}
    local corpus="$dir/fuzz-corpus/$t" regress="tests/fuzz/regress/$t"
    mkdir -p "$corpus" "$seeds/$t"
    local dirs=("$corpus" "$seeds/$t")
    [ -d "$regress" ] && dirs+=("$regress")
    # -timeout: an input that takes 2 s is a bug (a decoder must not spin).
    if ! "$bin" -max_total_time="$seconds" -timeout=2 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$dir/fuzz-crash-$t-" "${dirs[@]}" 2>"$dir/fuzz-$t.log"; then
      tail -60 "$dir/fuzz-$t.log"
      echo "sanitize: fuzz target $t failed: its input is $dir/fuzz-crash-$t-*; copy it into $regress/ with the fix"
      return 1
    fi
    local execs cov
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/fuzz-$t.log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$dir/fuzz-$t.log" | tail -1 || true)
    echo "sanitize: fuzz $t: $execs executions in ${seconds} s, ${cov:-cov: ?}"
  }
  # Two targets at a time (one core each).
  bins=("$dir"/tests/fuzz/fuzz_*)
  failed=0
  for ((i = 0; i < ${#bins[@]}; i += 2)); do
    pids=()
    for b in "${bins[@]:i:2}"; do
      fuzz_one "$b" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
  done
  [ $failed = 0 ] || exit 1
fi
if [ ${#integration[@]} -gt 0 ]; then
  # Leak checking off here: Open MPI's components leak at exit from libraries it
  # has already unloaded, which LSan cannot name (the unit tests check for leaks).
  # Two suites at a time: they wait on killed jobs and daemons more than they
  # compute.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1 \
    ctest --test-dir "$dir" -R "^($(IFS='|'; echo "${integration[*]}"))\$" --output-on-failure -j "$jobs"
fi
echo "sanitize: done in $(( $(date +%s) - start )) s"
