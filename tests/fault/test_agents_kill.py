"""Kill campaigns through remote checkpoint agents (issue 9): processes killed
at random moments while checkpoints of a few MB per rank are in flight every
few milliseconds, not only between checkpoints.

Every rerun must restart from the newest version the agents hold completely
(every rank's copy, from one execution), not from scratch and not from an
older level, and its restored state must equal an uninterrupted run's state at
that version bit for bit, within seconds of the crash.
"""
from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

import harness
from agents_deploy import AGENT, Deployment, agent_logs, agents_cfg, committed, wait_until

pytestmark = pytest.mark.skipif(not AGENT or not harness.cli_path() or not harness.mpi_enabled(),
                                reason="needs cairn-agent (CAIRN_ENABLE_FABRIC), the cairn CLI and MPI")

NRANKS = 2
NBYTES = 2 << 20  # per rank
STEPS = 400       # one checkpoint per step; the run lasts a few seconds
TRIALS = 10
# The agents keep 4 versions per rank: more than the versions a rank can have
# in flight (2 staging slots), so a version every rank holds is always among them.
KEEP = 4


@pytest.fixture
def deployment(tmp_path):
    d = Deployment(tmp_path / "deploy")
    yield d
    d.stop_all()


def held_versions(d: Deployment, run: str) -> dict:
    """{rank: set of versions} the agents logged as held for `run`."""
    out = {}
    for m in re.finditer(rf"held {re.escape(run)}/ckpt v(\d+) rank (\d+)/", agent_logs(d)):
        out.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    return out


def newest_complete(held: dict, nranks: int):
    """The newest version every rank's agent holds (among its KEEP newest)."""
    if len(held) < nranks:
        return None
    recent = [set(sorted(vs)[-KEEP:]) for vs in held.values()]
    common = set.intersection(*recent)
    return max(common) if common else None


def reference_dump(make_job, version: int) -> list:
    """The uninterrupted run's state at `version` (no agents, no restart)."""
    ref = make_job(NRANKS, run="reference")
    prefix = ref.dumps / f"ref.v{version}"
    ref.run("--steps", version, "--every", version, "--bytes", NBYTES, "--dump-at", version, prefix).ok()
    return ref.read_dump(prefix)


def rerun_and_check(job, cfg, make_job, final, floor, context, since=None):
    """Reruns job to the end: it must restart from at least version `floor`
    (when there is one), restore exactly the uninterrupted run's state at the
    version it restored, and end with the uninterrupted run's hash. Returns
    the seconds from `since` (time.monotonic()) to the rerun's end."""
    again = job.run("--steps", STEPS, "--every", 1, "--bytes", NBYTES, "--dump-restored",
                    job.dumps / "restored", **cfg).ok()
    elapsed = time.monotonic() - since if since is not None else None
    got = again.restarted_from
    context += "\n" + again.describe()
    if floor is not None:
        assert got is not None and got >= floor, context
    if got is not None:
        harness.assert_same_state(reference_dump(make_job, got), job.read_dump(job.dumps / "restored"),
                                  f"{job.run_id}: state restored from version {got}")
    assert again.final_hash == final.final_hash, context
    return elapsed


def test_ranks_killed_mid_transfer_restart_from_agent_memory(deployment, make_job):
    """TRIALS runs with memory-only agents (agents_persist = false, no local
    level: agent memory is the only copy). Each is SIGKILLed on a random rank
    at a random moment; the rerun restores the newest version the agents hold
    completely, bit for bit, and finishes with the uninterrupted run's hash.
    Every fifth trial also restarts the controller before the rerun."""
    d = deployment
    d.add_manager("node-a", memory_only=True, agent_args=["--keep", KEEP])
    d.add_manager("node-b", memory_only=True, agent_args=["--keep", KEEP])
    final = make_job(NRANKS, run="uninterrupted").run("--steps", STEPS, "--every", STEPS, "--bytes", NBYTES).ok()
    rng = random.Random(int(os.environ.get("CAIRN_TEST_SEED", "9")))
    latencies = []
    for trial in range(TRIALS):
        cfg = agents_cfg(d, agents_persist="false", agents_timeout=5, agents_restart_wait=10)
        pause = rng.uniform(0.0, 1.0)
        for attempt in range(3):
            run = f"kill{trial}" + (f"-again{attempt}" if attempt else "")
            job = make_job(NRANKS, run=run)
            p = job.start("--steps", STEPS, "--every", 1, "--bytes", NBYTES, "--sleep-ms", 1, **cfg)
            wait_until(f"{run}: a version held", lambda: held_versions(d, run), timeout=30)
            time.sleep(pause)
            ranks = harness.rank_pids(p.pid)
            if len(ranks) == NRANKS:
                break
            # The run ended before the kill (its agents took their first
            # version late, and the pause was long): it must have finished
            # intact; a new run is killed after a shorter pause.
            done = harness.finish_process(p)
            assert done.rc == 0 and done.final_hash == final.final_hash, \
                f"{run}: ended before the kill, but not intact\n" + done.describe()
            pause /= 4
        else:
            pytest.fail(f"kill{trial}: three runs ended before the kill")
        victim = rng.randrange(NRANKS)
        os.kill(ranks[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        first = harness.finish_process(p)
        assert first.rc != 0, f"{run}: the run ended before the kill\n" + first.describe()
        held = held_versions(d, run)
        expect = newest_complete(held, NRANKS)
        # Memory-only agents write nothing. A rank whose version no agent took
        # (its transfer cancelled when the agent saw the victim's job go)
        # writes that shard itself (the fallback): never one an agent holds.
        for shard in job.store.rglob("shard.*"):
            v, r = int(shard.parent.name[1:]), int(shard.name.split(".")[1])
            assert v not in held.get(r, set()), f"{run}: {shard} written although an agent holds it"
        if trial % 5 == 4:
            # The controller restarts (on its journal) between the crash and
            # the rerun: the run is still known, its agents still hold it.
            d.kill("controller")
            d.start_controller()
            wait_until(f"{run}: controller back", lambda: d.app(run) and all(
                g["state"] == "running" and g.get("endpoint") for g in d.app(run)["agents"]))

        # Never from scratch, never older than what the agents hold (a pull
        # that completed after the snapshot may make it newer).
        latencies.append(rerun_and_check(job, cfg, make_job, final, expect,
                                         f"{run}: rank {victim} killed; agents held {expect} completely", killed_at))
    # Generous: the point is seconds, not the 30 s transfer timeout per dead peer.
    assert max(latencies) < 25, latencies


def test_agent_killed_mid_pull_restart_from_the_other_copies(deployment, make_job):
    """Agents that write the store: one agent process is SIGKILLed while the
    application checkpoints (its memory is lost; its rank writes its shards
    itself from then on), then the application is killed. The rerun restores
    at least the newest committed version, bit for bit; in the second trial
    with restart_verify = while (the surviving agent's copy read straight
    into the regions)."""
    d = deployment
    d.add_manager("node-a", agent_args=["--keep", KEEP])
    d.add_manager("node-b", agent_args=["--keep", KEEP])
    final = make_job(NRANKS, run="uninterrupted").run("--steps", STEPS, "--every", STEPS, "--bytes", NBYTES).ok()
    rng = random.Random(int(os.environ.get("CAIRN_TEST_SEED", "9")) + 1)
    for trial in range(2):
        run = f"agentkill{trial}"
        job = make_job(NRANKS, run=run)
        cfg = agents_cfg(d, agents_timeout=5, restart_verify="while" if trial else "before")
        p = job.start("--steps", STEPS, "--every", 1, "--bytes", NBYTES, "--sleep-ms", 1, **cfg)
        wait_until(f"{run}: a version held", lambda: held_versions(d, run), timeout=30)
        time.sleep(rng.uniform(0.0, 0.5))
        agents = d.app(run)["agents"]
        os.kill(rng.choice(agents)["pid"], signal.SIGKILL)
        time.sleep(rng.uniform(0.2, 0.8))
        first = harness.kill_job(p)  # every rank gone (each has a process group of its own)
        assert first.rc != 0, f"{run}: the run ended before the kill\n" + first.describe()
        wait_until(f"{run}: agents running again",
                   lambda: all(g["pid"] > 0 and g.get("endpoint") for g in d.app(run)["agents"]))
        newest = max((v for v in range(STEPS + 1) if committed(job, v)), default=None)
        rerun_and_check(job, cfg, make_job, final, newest, f"{run}: newest committed {newest}")
