#!/usr/bin/env bash
# The history demonstration: runs compared version by version with `cairn diff`
# and reported with the Python package (python -m cairn.report):
#   1. heat2d twice on 2 ranks: deterministic, zero mismatches;
#   2. heat2d on 1 rank against 2 ranks: its grid is a block of the global array
#      (cairn_protect_block), so the runs compare element by element: zero mismatches;
#   3. nbody (MPI + OpenMP) twice with OMP_NUM_THREADS=2: forces summed with
#      atomics in an order that depends on thread timing, so the runs diverge in
#      the last bits at the first checkpoint and the difference grows;
# then prints where the report plots (PNG) and summaries are.
# usage: scripts/demo-history.sh [BUILD_DIR]     (reports in $DEMO_OUT, default BUILD_DIR/demo-history)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
heat2d=$build/examples/heat2d
nbody=$build/examples/nbody
cli=$build/tools/cairn/cairn
python=${PYTHON:-$root/.venv/bin/python}
for f in "$heat2d" "$nbody" "$cli"; do
  [ -x "$f" ] || { echo "demo-history: $f not built (run 'make demo-history'; nbody needs OpenMP)" >&2; exit 1; }
done
[ -x "$python" ] || python=python3
"$python" -c "import numpy, matplotlib" 2>/dev/null ||
  { echo "demo-history: $python lacks numpy/matplotlib (run scripts/install-deps.sh)" >&2; exit 1; }
# The package from this checkout; the CLI it runs for diffs (not a CAIRN_*
# variable: those are the runtime's configuration keys).
export PYTHONPATH=$root/bindings/python${PYTHONPATH:+:$PYTHONPATH} PYCAIRN_CLI=$cli
# The library the package reads stores with (cairn.open).
export PYCAIRN_LIBRARY=${PYCAIRN_LIBRARY:-$build/src/libcairn.so}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${DEMO_OUT:-$build/demo-history}
rm -rf "$out" && mkdir -p "$out"
work=$(mktemp -d /tmp/cairn-history.XXXXXX)
trap 'rm -rf "$work"' EXIT
store=$work/store
# History runs keep every version (the default keeps the newest 3).
export CAIRN_PERSISTENT=$store CAIRN_KEEP_PERSISTENT=0

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# run RUN NP PROGRAM ARGS...: one run of the store, its own scratch directory.
run() {
  local id=$1 np=$2
  shift 2
  CAIRN_RUN=$id CAIRN_SCRATCH=$work/scratch-$id mpirun --oversubscribe -np "$np" "$@" > "$work/$id.log"
  echo "$id: $(grep -E '^[a-z0-9]+: (grid|[0-9]+ particles)' "$work/$id.log" | head -1 | cut -d' ' -f2-)"
  echo "$id: $(sed -n 's/^[a-z0-9]*: final checksum/final checksum/p' "$work/$id.log")"
}
# compare A B [diff options]: cairn diff (exit 0 = identical or within tolerance).
compare() {
  local a=$1 b=$2 rc=0
  shift 2
  "$cli" diff "$store" "$a" "$b" "$@" > "$work/diff-$a-$b.txt" || rc=$?
  grep -E "^(first divergence|runs are|nothing compared)" "$work/diff-$a-$b.txt" || true
  return $rc
}
report() {
  local a=$1 b=$2 dir=$3
  shift 3
  "$python" -m cairn.report "$store" "$a" "$b" --out "$out/$dir" --quiet "$@" > /dev/null
  sed -n '/^error by region:/,/^$/p' "$out/$dir/summary.txt" | sed '/^$/d'
}
failed=0

heat_args=(--nx 256 --ny 256 --iters 200 --every 20)
say "1. heat2d twice on 2 ranks (${heat_args[*]}): deterministic"
run heat-a 2 "$heat2d" "${heat_args[@]}"
run heat-b 2 "$heat2d" "${heat_args[@]}"
if compare heat-a heat-b; then echo "=> zero mismatches"; else echo "=> UNEXPECTED: the runs differ" >&2; failed=1; fi
report heat-a heat-b heat2d-twice

say "2. heat2d on 1 rank against 2 ranks: the grid is a global array, compared element by element"
run heat-1 1 "$heat2d" "${heat_args[@]}"
# "iter" is a per-rank region: comparable only between equal rank counts, so
# this comparison selects the grid.
if compare heat-1 heat-a --region grid; then echo "=> zero mismatches"; else
  echo "=> UNEXPECTED: the runs differ" >&2; failed=1; fi
report heat-1 heat-a heat2d-1-vs-2-ranks --region grid

nbody_args=(--particles 512 --steps 2000 --every 100)
say "3. nbody twice on 2 ranks x 2 OpenMP threads (${nbody_args[*]}): atomics, timing-dependent sums"
export OMP_NUM_THREADS=2
run nbody-a 2 "$nbody" "${nbody_args[@]}"
run nbody-b 2 "$nbody" "${nbody_args[@]}"
if compare nbody-a nbody-b; then
  echo "=> UNEXPECTED: the two runs are bit-identical (no divergence to show)" >&2
  failed=1
else
  echo "=> the runs diverge; the error by version:"
fi
report nbody-a nbody-b nbody
"$python" - "$out/nbody/diff.json" <<'PY'
import json, sys
import cairn
rows = [r for r in cairn.diff_rows(json.load(open(sys.argv[1]))) if r.region == "pos"]
step = max(1, len(rows) // 10)
for r in rows[::step] + ([rows[-1]] if (len(rows) - 1) % step else []):
    print(f"   version {r.version:>5}: pos  max |a-b| {r.max_abs:9.2e}   {r.mismatch:>5} of {r.elements} elements differ")
PY

say "reports (PNG plots and summaries)"
for d in heat2d-twice heat2d-1-vs-2-ranks nbody; do
  for f in counts.png max_abs_error.png summary.txt; do echo "$out/$d/$f"; done
done
if [ "$failed" -eq 0 ]; then
  echo "DEMO PASSED: deterministic runs agree bit for bit (also across rank counts); the OpenMP run's divergence is located and its growth measured"
else
  echo "DEMO FAILED" >&2
  exit 1
fi
