#!/usr/bin/env bash
# The demonstration with remote checkpoint agents (docs/design/agents.md):
#   a controller and two agent nodes (managers launching cairn-agent) on
#   127.0.0.1; heat2d on 4 MPI ranks checkpoints into the agents' memory only
#   (no local level, agents without a store), the controller gives it a second
#   agent mid-run (heat2d's cairn_probe takes it), one rank is killed with
#   SIGKILL, and the rerun restarts from the agents' memory and must end with
#   the checksum of an uninterrupted run.
# usage: scripts/demo-agents.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
heat2d=$build/examples/heat2d
cli=$build/tools/cairn/cairn
agent=$build/tools/agent/cairn-agent
for f in "$heat2d" "$cli" "$agent"; do
  [ -x "$f" ] || { echo "demo-agents: $f not built (run 'make demo'; agents need libfabric-dev)" >&2; exit 1; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/cairn-demo-agents.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
args=(--nx 1024 --ny 1024 --iters 600 --every 25)
mpirun=(mpirun --oversubscribe -np 4)
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
checksum() { sed -n 's/^heat2d: final checksum //p' "$1"; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
controller=127.0.0.1:$port
secret=$work/secret
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret"
chmod 600 "$secret"
# Controller and managers alone hold the service secret (an application,
# which holds the deployment secret, cannot pose as a manager).
service_secret=$work/service-secret
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$service_secret"
chmod 600 "$service_secret"
status() { "$cli" agents status --controller "$controller" --secret-file "$secret" "$@"; }

say "A1. uninterrupted run without agents (reference checksum)"
CAIRN_PERSISTENT=$work/ref-store CAIRN_SCRATCH=$work/ref-scratch \
  "${mpirun[@]}" "$heat2d" "${args[@]}" > "$work/ref.log"
ref=$(checksum "$work/ref.log")
echo "reference checksum: $ref"

say "A2. controller on $controller and two agent nodes (node-a, node-b), agents in memory only"
setsid "$cli" controller --listen "$controller" --secret-file "$secret" --service-secret-file "$service_secret" \
  --journal "$work/journal" \
  --heartbeat-interval 0.5 --capacity 2 > "$work/controller.log" 2>&1 &
pids+=($!)
for node in node-a node-b; do
  setsid "$cli" manager --controller "$controller" --secret-file "$secret" --service-secret-file "$service_secret" \
    --node-id "$node" --capacity 2 \
    --agent-program "$agent" --run-dir "$work/run-$node" --stop-grace 5 \
    --agent-arg=--agent-id --agent-arg={agent} --agent-arg=--app --agent-arg={app_name} \
    --agent-arg=--stats-file --agent-arg={stats_file} > "$work/manager-$node.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 1 100); do
  n=$(status --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))' 2>/dev/null || echo 0)
  [ "$n" -ge 2 ] && break
  sleep 0.1
done
status

say "A3. heat2d checkpointing to the agents; one more agent mid-run; rank 2 killed with SIGKILL"
export CAIRN_AGENTS=$controller CAIRN_AGENTS_SECRET_FILE=$secret CAIRN_LOCAL_ENABLED=false \
  CAIRN_AGENTS_PERSIST=false CAIRN_PERSISTENT=$work/store CAIRN_RUN=heat2d-agents
"${mpirun[@]}" "$heat2d" "${args[@]}" --sleep-ms 8 > "$work/killed.log" 2>&1 &
mpirun_pid=$!
wait_versions() {
  for _ in $(seq 1 600); do
    n=$(grep -c "checkpoint version" "$work/killed.log" || true)
    [ "$n" -ge "$1" ] && return 0
    sleep 0.1
  done
  echo "demo-agents: heat2d did not reach $1 checkpoints" >&2; cat "$work/killed.log" >&2; exit 1
}
wait_versions 3
app=$(status --json | python3 -c 'import json,sys; print([a["app"] for a in json.load(sys.stdin)["applications"] if a["name"]=="heat2d-agents"][0])')
"$cli" agents resize --controller "$controller" --service-secret-file "$service_secret" --app "$app" --agents 2 \
  --force
wait_versions 10
victim=""
for pid in $(pgrep -f "$(basename "$heat2d") ${args[0]}" || true); do
  if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2"; then victim=$pid; fi
done
[ -n "$victim" ] || { echo "demo-agents: could not find rank 2 to kill" >&2; exit 1; }
kill -9 "$victim"
echo "killed rank 2 (pid $victim) after: $(grep "checkpoint version" "$work/killed.log" | tail -1)"
grep "agents " "$work/killed.log" || true
wait "$mpirun_pid" || true
if grep -q "final checksum" "$work/killed.log"; then echo "demo-agents: the run finished before the kill" >&2; exit 1; fi
echo "shard files in the store: $(find "$work/store" -name 'shard.*' | wc -l) (the checkpoints live in the agents' memory)"
status

say "A4. rerun: restart from the agents' memory"
"${mpirun[@]}" "$heat2d" "${args[@]}" > "$work/restart.log"
grep -v "checkpoint version" "$work/restart.log"
got=$(checksum "$work/restart.log")
echo "agents served the restart: $(cat "$work"/run-node-*/agent-*.log | grep -c 'restored heat2d-agents') shard(s) restored from agent memory"

say "result (agents)"
echo "uninterrupted run:  $ref"
echo "killed + restarted: $got ($(grep -o 'restarted from version [0-9]*' "$work/restart.log"))"
if [ -n "$ref" ] && [ "$ref" = "$got" ] && [ "$(find "$work/store" -name 'shard.*' | wc -l)" -eq 0 ]; then
  echo "DEMO PASSED: restarted from agent memory with the same result, bit for bit"
else
  echo "DEMO FAILED" >&2
  exit 1
fi
