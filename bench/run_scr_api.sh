#!/bin/bash
# cairn's SCR drop-in (compat/scr) against real SCR, through the same program
# (bench/scr_api_bench.c, in the manner of SCR's examples/test_api.c), 2 ranks.
# Real SCR is built outside this tree (docs/benchmarks/compat.md, "SCR drop-in
# against real SCR").
#
#   bench/run_scr_api.sh SCR_PREFIX CAIRN_PREFIX BYTES CKPTS REPS
#
# SCR_PREFIX / CAIRN_PREFIX: install prefixes holding include/scr.h and
# lib/libscr.so (real SCR; cairn's drop-in). BYTES per rank (e.g. 64M), CKPTS
# checkpoints per run, REPS repetitions. Each repetition, for each side (which
# side goes first alternates): a fresh cache (SCR_CACHE_BASE under /dev/shm)
# and prefix (SCR_PREFIX under /var/tmp); one mpirun writes CKPTS checkpoints;
# a new mpirun restarts from the cache; the cache is wiped and a third mpirun
# restarts from the prefix. Both sides get the same SCR parameters. A plain
# write+fsync and read of the same bytes on /dev/shm and /var/tmp is measured
# in the same repetitions. Prints every run's lines, then the medians over
# repetitions and the ratios cairn/SCR.
set -euo pipefail
scr=${1:?real SCR install prefix}; cairn=${2:?cairn install prefix}
bytes=${3:?bytes per rank, e.g. 64M}; ckpts=${4:?checkpoints per run}; reps=${5:?repetitions}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/scr-api.XXXXXX)
shm=/dev/shm/scr-api-$$ disk=/var/tmp/scr-api-$$
cleanup() { rm -rf "$work" "$shm" "$disk"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

for side in scr cairn; do
  prefix=$scr; [ "$side" = cairn ] && prefix=$cairn
  mpicc -O2 -I "$prefix/include" "$here/scr_api_bench.c" -o "$work/bench_$side" -L "$prefix/lib" \
    -Wl,--disable-new-dtags,-rpath,"$prefix/lib" -lscr
done

# Only the parameters below: nothing from the caller's environment (SCR_*,
# CAIRN_*) or a configuration file (SCR_CONF_FILE points at an empty one).
for v in $(env | sed -n 's/^\(\(SCR\|CAIRN\)_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
: > "$work/scr.conf"
export SCR_CONF_FILE=$work/scr.conf
export SCR_CACHE_BYPASS=0 SCR_COPY_TYPE=SINGLE SCR_FLUSH=1 SCR_CACHE_SIZE=2
export USER=${USER:-$(id -un)} # real SCR aborts in SCR_Init without $USER
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun -np 2 --bind-to none)

# run SIDE REP PHASE MODE: one mpirun of the side's program in its prefix.
run() {
  local side=$1 rep=$2 phase=$3 mode=$4
  local out=$work/$side.$rep.$phase
  if ! (cd "$disk/$side" && SCR_PREFIX=$disk/$side SCR_CACHE_BASE=$shm/$side/cache \
          SCR_CNTL_BASE=$shm/$side/cntl "${mpi[@]}" "$work/bench_$side" "$bytes" "$ckpts" "$mode") \
        > "$out" 2> "$out.err"; then
    echo "run_scr_api: $side rep $rep $phase failed:" >&2
    cat "$out" "$out.err" >&2
    exit 1
  fi
  sed "s/^scr_api /$side rep=$rep $phase /" "$out"
}

for rep in $(seq 1 "$reps"); do
  if [ $((rep % 2)) = 1 ]; then order="scr cairn"; else order="cairn scr"; fi
  for side in $order; do
    rm -rf "${shm:?}/$side" "${disk:?}/$side"
    mkdir -p "$shm/$side/cache" "$shm/$side/cntl" "$disk/$side"
    run "$side" "$rep" ckpt ckpt
    run "$side" "$rep" restart_cache restart
    rm -rf "${shm:?}/$side"
    mkdir -p "$shm/$side/cache" "$shm/$side/cntl"
    run "$side" "$rep" restart_prefix restart
    rm -rf "${shm:?}/$side" "${disk:?}/$side"
  done
  for where in shm disk; do
    dir=$shm/plain; [ "$where" = disk ] && dir=$disk/plain
    mkdir -p "$dir"
    "${mpi[@]}" "$work/bench_scr" "$bytes" "$ckpts" plain "$dir" > "$work/plain.$where.$rep"
    sed "s/^scr_api plain /plain rep=$rep $where /" "$work/plain.$where.$rep"
    rm -rf "$dir"
  done
done

python3 - "$work" "$reps" "$bytes" "$ckpts" <<'EOF'
import re, statistics, sys
work, reps, nbytes, ckpts = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def lines(path):
    with open(path) as f:
        return [l.split() for l in f if l.strip()]

def val(fields, key):
    for f in fields:
        if f.startswith(key + "="):
            return f.split("=", 1)[1]
    raise KeyError(key)

def seconds(path, kind):
    return [float(val(l, "seconds")) for l in lines(path) if l[0] == "scr_api" and l[1] == kind]

def median_of(f):
    return statistics.median(f(rep) for rep in range(1, reps + 1))

rows = [  # label, per-repetition value (for one side)
    ("ckpt: one checkpoint (mean of the run's), Start_output..Complete_output",
     lambda s, r: statistics.mean(seconds(f"{work}/{s}.{r}.ckpt", "ckpt"))),
    ("ckpt: SCR_Finalize after the last", lambda s, r: seconds(f"{work}/{s}.{r}.ckpt", "finalize")[0]),
    (f"ckpt: all {ckpts} + SCR_Finalize", lambda s, r: seconds(f"{work}/{s}.{r}.ckpt", "ckpt_total")[0]),
    ("restart from cache: SCR_Init", lambda s, r: seconds(f"{work}/{s}.{r}.restart_cache", "init")[0]),
    ("restart from cache: Have_restart..Complete_restart",
     lambda s, r: seconds(f"{work}/{s}.{r}.restart_cache", "restart")[0]),
    ("restart from cache: SCR_Init + restart",
     lambda s, r: seconds(f"{work}/{s}.{r}.restart_cache", "restart_total")[0]),
    ("restart from prefix: SCR_Init", lambda s, r: seconds(f"{work}/{s}.{r}.restart_prefix", "init")[0]),
    ("restart from prefix: Have_restart..Complete_restart",
     lambda s, r: seconds(f"{work}/{s}.{r}.restart_prefix", "restart")[0]),
    ("restart from prefix: SCR_Init + restart",
     lambda s, r: seconds(f"{work}/{s}.{r}.restart_prefix", "restart_total")[0]),
]
print()
print(f"medians over {reps} repetitions, 2 ranks x {nbytes} per checkpoint, {ckpts} checkpoints per run")
print()
print("| measure | real SCR | cairn drop-in | cairn/SCR |")
print("|---|---|---|---|")
for label, f in rows:
    a = median_of(lambda r: f("scr", r))
    b = median_of(lambda r: f("cairn", r))
    print(f"| {label} | {a:.4f} s | {b:.4f} s | {b / a:.2f} |")

def plain(where, kind):
    def per_rep(r):
        got = [float(val(l, "seconds")) for l in lines(f"{work}/plain.{where}.{r}") if l[2] == kind]
        return statistics.mean(got)
    return median_of(per_rep)

print()
print("| physical reference (no SCR, same bytes, 2 ranks) | seconds |")
print("|---|---|")
print(f"| write+fsync+close, /dev/shm (mean per file) | {plain('shm', 'write'):.4f} s |")
print(f"| write+fsync+close, /var/tmp (mean per file) | {plain('disk', 'write'):.4f} s |")
print(f"| read+verify, /dev/shm | {plain('shm', 'read'):.4f} s |")
print(f"| read+verify, /var/tmp (page cache warm) | {plain('disk', 'read'):.4f} s |")
routes = {s: next(val(l, "file") for l in lines(f"{work}/{s}.1.restart_cache") if l[1] == "restart")
          for s in ("scr", "cairn")}
print()
for s, p in routes.items():
    print(f"{s}: rank 0 read its restart-from-cache file at {p}")
EOF
