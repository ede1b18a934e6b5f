#!/bin/bash
# VELOC's restart from its node-local level (scratch on /dev/shm) against a
# read(2) of the same bytes, 2 ranks, each repetition a fresh mpirun (a real
# restart: VELOC cannot finalize and init again in one process). The side of
# issue 11's comparison that cairn_bench's "restart from local" is measured
# against; VELOC is built outside this tree (docs/benchmarks.md, "Restart
# from the local level against VELOC").
#
#   bench/run_veloc_restart.sh VELOC_PREFIX BYTES REPS [chksum]
#
# chksum: VELOC's own verification (SHA-256 of the scratch file at restart).
set -euo pipefail
prefix=${1:?VELOC install prefix}; bytes=${2:?bytes per rank, e.g. 512M}; reps=${3:?repetitions}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/veloc-restart.XXXXXX)
scratch=/dev/shm/veloc-restart-$$ meta=/dev/shm/veloc-meta-$$ persistent=/var/tmp/veloc-restart-$$
cleanup() { rm -rf "$work" "$scratch" "$meta" "$persistent" /dev/shm/veloc-socket-"$(hostname)"-"$(id -u)"; }
trap cleanup EXIT
mpicc -O2 -I "$prefix/include" "$here/veloc_restart_bench.c" -o "$work/bench" -L "$prefix/lib" \
  -Wl,--disable-new-dtags,-rpath,"$prefix/lib" -lveloc-client
mkdir -p "$meta"
{
  echo "mode = sync"
  echo "scratch = $scratch"
  echo "persistent = $persistent"
  echo "ec_interval = -1"
  echo "persistent_interval = 0"
  if [ "${4:-}" = chksum ]; then echo "chksum = true"; echo "meta = $meta"; else echo "chksum = false"; fi
} > "$work/veloc.cfg"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 2 "$work/bench" "$work/veloc.cfg" "$bytes" "$reps" ckpt > /dev/null
for i in $(seq 1 "$reps"); do
  mpirun -np 2 "$work/bench" "$work/veloc.cfg" "$bytes" "$reps" restart "$i" "$work/results" | grep 'veloc restart' || true
done
