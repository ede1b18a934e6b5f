#!/bin/bash
# cairn's VELOC drop-in (compat/veloc) against real VELOC, through the same
# heatdis_mem-style program (bench/veloc_heatdis_bench.c, VELOC's public C API
# only), 2 ranks. Real VELOC is built outside this tree (docs/benchmarks/
# compat.md, "VELOC drop-in against real VELOC").
#
#   bench/run_veloc_heatdis.sh VELOC_PREFIX CAIRN_PREFIX BYTES CKPTS REPS [sync|async]
#
# VELOC_PREFIX / CAIRN_PREFIX: install prefixes holding include/veloc.h and
# lib/libveloc-client.so (real VELOC; cairn's drop-in). BYTES per rank (e.g.
# 64M), CKPTS checkpoints per run, REPS repetitions; mode sync (default) or
# async (real VELOC: its veloc-backend, which the client starts from
# VELOC_PREFIX/bin; the drop-in: its background thread).
# DROPIN_ENV (optional): cairn configuration overrides for the drop-in's
# side only, e.g. DROPIN_ENV="CAIRN_RESTART_VERIFY=while".
# Each repetition, for each side (which side goes first alternates): a fresh
# scratch (/dev/shm), persistent and meta directory (/var/tmp) and VELOC
# configuration file; one mpirun writes CKPTS checkpoints; a new mpirun
# restarts from scratch; scratch is wiped and a third mpirun restarts from
# persistent. A memcpy, write(+fsync) and read of BYTES on /dev/shm and
# /var/tmp is measured in the same repetitions. After every mpirun, an untimed
# `sync -f` of /var/tmp. Prints every run's lines, then the medians over
# repetitions and the ratios cairn/VELOC.
set -euo pipefail
veloc=${1:?real VELOC install prefix}; cairn=${2:?cairn install prefix}
bytes=${3:?bytes per rank, e.g. 64M}; ckpts=${4:?checkpoints per run}; reps=${5:?repetitions}
mode=${6:-sync}
case $mode in sync|async) ;; *) echo "run_veloc_heatdis: mode must be sync or async" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/veloc-heatdis.XXXXXX)
shm=/dev/shm/veloc-heatdis-$$ disk=/var/tmp/veloc-heatdis-$$
uid=$(id -u) host=$(hostname)
# Files real VELOC leaves in /dev/shm (fixed names per host and user): removed
# on exit unless they were there before this script started.
veloc_shm=(/dev/shm/veloc-socket-$host-$uid /dev/shm/veloc-backend-$host-$uid.log
           /dev/shm/veloc-backend-ready-$uid /dev/shm/veloc-client-$host-$uid.log)
ours=()
for f in "${veloc_shm[@]}"; do [ -e "$f" ] || ours+=("$f"); done

# The veloc-backend started for CFG (async mode): its PID is in VELOC's ready
# file; stop it by that PID only if its command line names our CFG.
stop_backend() {
  local ready=/dev/shm/veloc-backend-ready-$uid pid
  [ -s "$ready" ] || return 0
  pid=$(od -An -t d4 -N4 "$ready" | tr -d ' ')
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$work/"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
  fi
}
cleanup() {
  stop_backend
  rm -rf "$work" "$shm" "$disk"
  for f in "${ours[@]}"; do rm -f "$f"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$mode" = async ] && [ -s /dev/shm/veloc-backend-ready-$uid ]; then
  pid=$(od -An -t d4 -N4 /dev/shm/veloc-backend-ready-$uid | tr -d ' ')
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "run_veloc_heatdis: a veloc-backend (PID $pid) is already running for this user; it would serve" \
         "this run with its own configuration" >&2
    exit 1
  fi
fi

for side in veloc cairn; do
  prefix=$veloc; [ "$side" = cairn ] && prefix=$cairn
  mpicc -O2 -I "$prefix/include" "$here/veloc_heatdis_bench.c" -o "$work/bench_$side" -L "$prefix/lib" \
    -Wl,--disable-new-dtags,-rpath,"$prefix/lib" -lveloc-client
done

# Only the configuration file below (and DROPIN_ENV): real VELOC reads
# VELOC_<KEY> variables as overrides of its keys, cairn reads CAIRN_*; neither
# comes from the caller's environment.
read -r -a dropin_env <<< "${DROPIN_ENV:-}"
for kv in "${dropin_env[@]}"; do
  case $kv in CAIRN_*=*) ;; *) echo "run_veloc_heatdis: DROPIN_ENV: '$kv' is not CAIRN_<KEY>=value" >&2; exit 2 ;; esac
done
for v in $(env | sed -n 's/^\(\(VELOC\|CAIRN\)_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export TMPDIR=$work # the drop-in writes its translated configuration there
if [ "$uid" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun -np 2 --bind-to none)

# run SIDE REP PHASE ARGS...: one mpirun of the side's program.
run() {
  local side=$1 rep=$2 phase=$3; shift 3
  local out=$work/$side.$rep.$phase status=0
  if [ "$side" = veloc ] && [ "$mode" = async ]; then
    VELOC_BIN=$veloc/bin timeout 900 "${mpi[@]}" "$work/bench_$side" "$@" > "$out" 2> "$out.err" || status=$?
    stop_backend
  elif [ "$side" = cairn ]; then
    env "${dropin_env[@]}" timeout 900 "${mpi[@]}" "$work/bench_$side" "$@" > "$out" 2> "$out.err" || status=$?
  else
    timeout 900 "${mpi[@]}" "$work/bench_$side" "$@" > "$out" 2> "$out.err" || status=$?
  fi
  if [ "$status" != 0 ]; then
    echo "run_veloc_heatdis: $side rep $rep $phase failed (status $status):" >&2
    grep -v '^\[\(INFO\|BENCHMARK\)' "$out" "$out.err" | tail -40 >&2
    exit 1
  fi
  grep '^heatdis ' "$out" | sed "s/^heatdis [a-z]* /$side rep=$rep $phase /"
  # Untimed: write back what the run left dirty in /var/tmp's page cache (real
  # VELOC does not fsync), so that it does not load the next measured run.
  sync -f "$disk"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$reps"); do
  if [ $((rep % 2)) = 1 ]; then order="veloc cairn"; else order="cairn veloc"; fi
  for side in $order; do
    s=$shm/$side d=$disk/$side
    rm -rf "$s" "$d"
    mkdir -p "$s/scratch" "$d/persistent" "$d/meta"
    cat > "$work/$side.cfg" <<CFG
mode = $mode
scratch = $s/scratch
persistent = $d/persistent
meta = $d/meta
ec_interval = -1
persistent_interval = 0
CFG
    run "$side" "$rep" ckpt "$work/$side.cfg" "$bytes" ckpt "$ckpts"
    run "$side" "$rep" restart_scratch "$work/$side.cfg" "$bytes" restart "$ckpts"
    rm -rf "$s"
    mkdir -p "$s/scratch"
    run "$side" "$rep" restart_persistent "$work/$side.cfg" "$bytes" restart "$ckpts"
    rm -rf "$s" "$d"
  done
  mkdir -p "$shm/ref" "$disk/ref"
  run veloc "$rep" ref - "$bytes" ref "$shm/ref" "$disk/ref"
  rm -rf "$shm/ref" "$disk/ref"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$work" "$reps" "$bytes" "$ckpts" "$mode" <<'EOF'
import statistics, sys
work, reps, nbytes, ckpts, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]

def measures(path):
    got = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3 or fields[0] != "heatdis":
                continue
            key, _, value = fields[-1].partition("=")
            if len(fields) == 4:  # "heatdis ckpt i=2 blocked=..."
                key = fields[2] + " " + key
            try:
                got[key] = float(value)
            except ValueError:
                pass
    return got

def med(side, phase, f):
    return statistics.median(f(measures(f"{work}/{side}.{r}.{phase}")) for r in range(1, reps + 1))

rows = [("ckpt: VELOC_Init", "ckpt", lambda m: m["init"])]
for i in range(1, ckpts + 1):
    rows.append((f"ckpt: VELOC_Checkpoint {i} (blocked)", "ckpt", lambda m, i=i: m[f"i={i} blocked"]))
rows += [
    ("ckpt: VELOC_Checkpoint, mean of the run's", "ckpt",
     lambda m: statistics.mean(m[f"i={i} blocked"] for i in range(1, ckpts + 1))),
    ("ckpt: VELOC_Checkpoint_wait after the last", "ckpt", lambda m: m["wait"]),
    (f"ckpt: all {ckpts} checkpoints + wait", "ckpt", lambda m: m["total"]),
    ("ckpt: VELOC_Finalize(1) after the wait", "ckpt", lambda m: m["finalize"]),
]
for phase, where in (("restart_scratch", "scratch"), ("restart_persistent", "persistent")):
    rows += [
        (f"restart from {where}: VELOC_Init", phase, lambda m: m["init"]),
        (f"restart from {where}: VELOC_Restart_test", phase, lambda m: m["test"]),
        (f"restart from {where}: VELOC_Restart", phase, lambda m: m["restart"]),
        (f"restart from {where}: Restart_test + Restart", phase, lambda m: m["total"]),
        (f"restart from {where}: Init + Restart_test + Restart", phase, lambda m: m["init_total"]),
    ]
print()
print(f"medians over {reps} repetitions, mode = {mode}, 2 ranks x {nbytes} per checkpoint, {ckpts} checkpoints per run")
print()
print("| measure | real VELOC | cairn drop-in | cairn/VELOC |")
print("|---|---|---|---|")
for label, phase, f in rows:
    a = med("veloc", phase, f)
    b = med("cairn", phase, f)
    ratio = f"{b / a:.2f}" if a > 0 else "-"
    print(f"| {label} | {a:.4f} s | {b:.4f} s | {ratio} |")
print()
print("| physical reference (no VELOC, same bytes per rank, 2 ranks) | seconds |")
print("|---|---|")
for key, label in (("memcpy", "memcpy"), ("write_fsync_shm", "write+fsync+close, /dev/shm"),
                   ("write_nofsync_disk", "write+close (no fsync), /var/tmp"),
                   ("write_fsync_disk", "write+fsync+close, /var/tmp"), ("read_shm", "read, /dev/shm"),
                   ("read_disk_cached", "read, /var/tmp (page cache warm)"),
                   ("verify", "verify every byte (the program's check)")):
    print(f"| {label} | {med('veloc', 'ref', lambda m: m[key]):.4f} s |")
EOF
