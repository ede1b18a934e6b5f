#!/usr/bin/env bash
# The demonstration: heat2d on 4 MPI ranks
#   1. uninterrupted, for the reference checksum;
#   2. again, with one rank killed by SIGKILL mid-run;
#   3. a relaunch on 2 ranks (on a copy of the checkpoints): the 4-rank
#      checkpoint is redistributed by the grid's global layout;
#   4. rerun on 4 ranks: it restarts from the newest complete checkpoint and
#      finishes;
#   5. the persistent level aggregated (leaders, 2 emulated nodes): half the
#      run, then the rest restarted from the data files alone;
#   6. the engine in the node daemon (engine_host = daemon): the whole job
#      SIGKILLed right after a checkpoint; cairnd still commits that version,
#      and the relaunch on wiped node-local directories restarts from it;
# and the final checksums of 1, 3, 4, 5 and 6 must be equal.
# usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
heat2d=$build/examples/heat2d
cli=$build/tools/cairn/cairn
[ -x "$heat2d" ] || { echo "demo: $heat2d not built (run 'make demo')" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/cairn-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
args=(--nx 1024 --ny 1024 --iters 600 --every 25)
mpirun=(mpirun --oversubscribe -np 4)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
checksum() { sed -n 's/^heat2d: final checksum //p' "$1"; }

say "1. uninterrupted run (4 ranks, ${args[*]})"
CAIRN_PERSISTENT=$work/ref-store CAIRN_SCRATCH=$work/ref-scratch \
  "${mpirun[@]}" "$heat2d" "${args[@]}" > "$work/ref.log"
grep -v "checkpoint version" "$work/ref.log"
ref=$(checksum "$work/ref.log")

say "2. same run, checkpointing to $work/store; rank 2 is killed with SIGKILL mid-run"
export CAIRN_PERSISTENT=$work/store CAIRN_SCRATCH=$work/scratch
"${mpirun[@]}" "$heat2d" "${args[@]}" --sleep-ms 8 > "$work/killed.log" 2>&1 &
mpirun_pid=$!
# Wait until a few checkpoints exist, then kill one rank (not mpirun).
for _ in $(seq 1 600); do
  n=$(grep -c "checkpoint version" "$work/killed.log" || true)
  [ "$n" -ge 8 ] && break
  sleep 0.1
done
victim=""
for pid in $(pgrep -f "$(basename "$heat2d") ${args[0]}" || true); do
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2"; then victim=$pid; fi
done
[ -n "$victim" ] || { echo "demo: could not find rank 2 to kill" >&2; kill "$mpirun_pid"; exit 1; }
kill -9 "$victim"
echo "killed rank 2 (pid $victim) after: $(grep "checkpoint version" "$work/killed.log" | tail -1)"
wait "$mpirun_pid" || true
if grep -q "final checksum" "$work/killed.log"; then echo "demo: the run finished before the kill" >&2; exit 1; fi
echo "the job died: $(grep -m1 -o "exited on signal 9 (Killed)" "$work/killed.log" || echo "rank killed")"

if [ -x "$cli" ]; then
  say "what was saved (cairn ls)"
  "$cli" ls "$work/store" --scratch "$work/scratch"
fi

say "3. relaunched on 2 ranks (as after losing nodes), on a copy of the checkpoints"
# The grid is declared as a block of the global array (cairn_protect_block) and
# the rest is the same on every rank, so cairn redistributes the 4-rank
# checkpoint: each of the 2 ranks reads the parts of the old blocks its new
# block covers, checksums verified, and the run finishes as if never stopped.
cp -a "$work/store" "$work/store2"
cp -a "$work/scratch" "$work/scratch2"
CAIRN_PERSISTENT=$work/store2 CAIRN_SCRATCH=$work/scratch2 \
  mpirun --oversubscribe -np 2 "$heat2d" "${args[@]}" > "$work/two.log"
grep -v "checkpoint version" "$work/two.log"
two=$(checksum "$work/two.log")
rm -rf "$work/store2" "$work/scratch2"

say "4. rerun on 4 ranks: restart from the newest complete checkpoint"
"${mpirun[@]}" "$heat2d" "${args[@]}" > "$work/restart.log"
grep -v "checkpoint version" "$work/restart.log"
got=$(checksum "$work/restart.log")

say "5. aggregated persistent level: 2 elected leaders (one per emulated node) write 2 data files per version"
# 4 ranks as 2 emulated nodes of 2; the leaders pull the other ranks' images
# over the libfabric data plane and write the stripes they alone own.
agg=(env CAIRN_PERSISTENT="$work/agg-store" CAIRN_SCRATCH="$work/agg-scratch" CAIRN_PERSISTENT_LAYOUT=aggregated
     CAIRN_AGGREGATE_STRATEGY=leaders CAIRN_AGGREGATE_FILES=2 CAIRN_RANKS_PER_NODE=2 CAIRN_KEEP_PERSISTENT=2)
first=("${args[@]}")
first[5]=300  # --iters: stop half way
"${mpirun[@]}" "${agg[@]}" "$heat2d" "${first[@]}" > "$work/agg1.log"
echo "stopped after $(grep "checkpoint version" "$work/agg1.log" | tail -1)"
newest=$(ls -d "$work"/agg-store/runs/*/*/v0*/MANIFEST | sort | tail -1)
vdir=$(dirname "$newest")
echo "files of $(basename "$vdir"): $(ls "$vdir" | tr '\n' ' ')"
if [ -x "$cli" ]; then
  "$cli" show "$work/agg-store" "$(basename "$(dirname "$vdir")")" "$((10#$(basename "$vdir" | tr -d v)))" | sed -n '1,14p'
fi
rm -rf "$work/agg-scratch"  # the node-local level is gone: the restart reads the data files
"${mpirun[@]}" "${agg[@]}" "$heat2d" "${args[@]}" > "$work/agg2.log"
grep -v "checkpoint version" "$work/agg2.log"
agg_got=$(checksum "$work/agg2.log")

say "6. the engine in cairnd (engine_host = daemon): the whole job is SIGKILLed right after a checkpoint"
dmn=(env CAIRN_PERSISTENT="$work/dmn-store" CAIRN_SCRATCH="$work/dmn-scratch" CAIRN_ENGINE_HOST=daemon)
"${mpirun[@]}" "${dmn[@]}" "$heat2d" "${args[@]}" --sleep-ms 8 > "$work/dmn1.log" 2>&1 &
mpirun_pid=$!
for _ in $(seq 1 6000); do
  n=$(grep -c "checkpoint version" "$work/dmn1.log" || true)
  [ "$n" -ge 6 ] && break
  sleep 0.01
done
ranks=$(pgrep -f "$(basename "$heat2d") ${args[0]}" || true)
kill -9 $ranks "$mpirun_pid" 2>/dev/null || true
last=$(grep "checkpoint version" "$work/dmn1.log" | tail -1 | grep -o '[0-9]*$')
echo "killed every rank and mpirun right after checkpoint version $last returned"
wait "$mpirun_pid" 2>/dev/null || true
for _ in $(seq 1 300); do pgrep -f "cairnd --socket" >/dev/null || break; sleep 0.1; done
committed=$(ls -d "$work"/dmn-store/runs/*/*/v0*/MANIFEST | sort | tail -1 | xargs dirname | xargs basename)
echo "newest version committed at the persistent level: $((10#${committed#v})) (the job was killed before it could commit it: the daemons did)"
rm -rf "$work/dmn-scratch"  # replacement nodes: nothing node-local survives
"${mpirun[@]}" "${dmn[@]}" "$heat2d" "${args[@]}" > "$work/dmn2.log"
grep -v "checkpoint version" "$work/dmn2.log"
dmn_got=$(checksum "$work/dmn2.log")
dmn_from=$(grep -o 'restarted from version [0-9]*' "$work/dmn2.log" | grep -o '[0-9]*$' || echo 0)
if [ "$dmn_from" -lt "$last" ]; then
  echo "DEMO FAILED: restarted from version $dmn_from, before the checkpoint $last the job had returned from" >&2
  exit 1
fi

say "result"
echo "uninterrupted run:  $ref"
echo "killed + restarted: $got ($(grep -o 'restarted from version [0-9]*' "$work/restart.log"))"
echo "restarted on 2 ranks: $two ($(grep -o 'restarted from version [0-9]*' "$work/two.log"))"
echo "aggregated, restarted from the data files: $agg_got ($(grep -o 'restarted from version [0-9]*' "$work/agg2.log"))"
echo "daemon, job killed, node-local wiped: $dmn_got (restarted from version $dmn_from)"
if [ -n "$ref" ] && [ "$ref" = "$got" ] && [ "$ref" = "$two" ] && [ "$ref" = "$agg_got" ] && [ "$ref" = "$dmn_got" ]; then
  echo "DEMO PASSED: the restarted runs end with the same result, bit for bit"
else
  echo "DEMO FAILED: checksums differ" >&2
  exit 1
fi
