"""Remote checkpoint agents end to end (docs/design/agents.md, "Client").

A real controller and two managers that launch real cairn-agent processes on
127.0.0.1 (tcp;ofi_rxm), and ckpt_app under mpirun with 2 ranks configured with
agents = <controller>. Every restored state is compared bit for bit with an
uninterrupted run without agents (the final hash covers every byte of every
rank's state), and with the per-version state dumps.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sqlite3
import subprocess
import time

import pytest

import harness
from agents_deploy import (AGENT, EVERY, NBYTES, STEPS, Deployment, agent_logs, agents_cfg, committed, protected,
                           release, wait_until)

pytestmark = pytest.mark.skipif(not AGENT or not harness.cli_path() or not harness.mpi_enabled(),
                                reason="needs cairn-agent (CAIRN_ENABLE_FABRIC), the cairn CLI and MPI")


def _killed_once_v6_is_committed(job, cfg, nbytes=NBYTES):
    """Runs job with cfg until the agents committed v6, then kills every rank
    (each has a process group of its own)."""
    flag = job.root / "pause6"
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", nbytes, "--pause-after", 6, flag, **cfg)
    job.wait_paused(p, flag)
    wait_until("v6 committed by the agents", lambda: committed(job, 6))
    harness.kill_job(p)


@pytest.fixture
def deployment(tmp_path):
    d = Deployment(tmp_path / "deploy")
    yield d
    d.stop_all()


def test_checkpoint_through_agents_and_restart_from_agent_memory(deployment, reference, make_job):
    """Memory-only agents: nothing reaches the store, so a restart after the
    application is killed can only come from the agents' memory. A second
    application is served by the same agent nodes at the same time."""
    d = deployment
    d.add_manager("node-a", memory_only=True)
    d.add_manager("node-b", memory_only=True)
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-mem")
    other = make_job(2, run="agents-other")
    flag = job.root / "pause8"
    # Memory-only agents never commit: finalize must not wait for that.
    cfg = agents_cfg(d, agents_persist="false")
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected",
                  "--pause-after", 8, flag, **cfg)
    job.wait_paused(p, flag)
    # A second application while the first one is paused: both served at once.
    r2 = other.run("--steps", 6, "--every", 2, "--bytes", NBYTES, "--wait-protected", **cfg).ok()
    assert protected(r2) and all(rc == 0 for rc in protected(r2).values()), r2.describe()
    app = d.app("agents-mem")
    assert app and app["agents"], d.status()
    first = harness.kill_job(p)  # every rank gone (each has a process group of its own)
    prot = protected(first)
    assert {(r, v) for r in range(2) for v in (2, 4, 6, 8)} <= set(prot), first.describe()
    assert all(rc == 0 for rc in prot.values()), first.describe()
    # Memory only: the store holds no shard at all.
    assert not list(job.store.rglob("shard.*")), sorted(job.store.rglob("*"))
    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, **cfg).ok()
    assert r.restarted_from == 8, r.describe()
    assert r.final_hash == ref.final_hash
    assert re.search(r"restored .* v8 rank 0", d.log("manager-node-a") + agent_logs(d)), agent_logs(d)


def test_restart_does_not_forget_agents_that_do_not_answer(deployment, reference, make_job):
    """Memory-only agents hold v2..v8 when the application is killed; its
    agents are then stopped (SIGSTOP: alive, silent). The rerun must not take
    the silence for "no checkpoint" and start from zero: restart_test waits
    agents_restart_wait and returns CAIRN_EUNUSABLE on every rank naming the
    agents, and nothing is written. Once they answer again (SIGCONT), the
    next rerun restores v8 from their memory bit for bit."""
    d = deployment
    d.add_manager("node-a", memory_only=True)
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-silent")
    flag = job.root / "pause8"
    cfg = agents_cfg(d, agents_persist="false", agents_timeout=1, agents_restart_wait=2)
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected",
                  "--pause-after", 8, flag, **cfg)
    job.wait_paused(p, flag)
    harness.kill_job(p)  # every rank gone (each has a process group of its own)
    agents = d.app("agents-silent")["agents"]
    pids = [g["pid"] for g in agents]
    assert pids and all(pid > 0 for pid in pids), agents
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, **cfg)
        waited = time.monotonic() - t0
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert r.rc != 0, r.describe()
    assert "cairn_restart_test failed" in r.stderr and f"({harness.CAIRN_EUNUSABLE})" in r.stderr, r.describe()
    assert f"agent {agents[0]['agent']} on {agents[0]['node']}" in r.stderr, r.describe()
    assert "agents_allow_missing" in r.stderr, r.describe()
    assert waited >= 2, "restart_test gave up before agents_restart_wait"
    assert not list(job.store.rglob("shard.*")), sorted(job.store.rglob("*"))
    again = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--dump-restored",
                    job.dumps / "restored", **cfg).ok()
    assert again.restarted_from == 8, again.describe()
    harness.assert_same_state(ref.dump(8), job.read_dump(job.dumps / "restored"), "state restored from agent memory")
    assert again.final_hash == ref.final_hash


def test_restart_right_after_the_agents_node_died_is_not_refused(deployment, reference, make_job):
    """The agent node dies with the application (its manager and agents
    killed); the rerun starts at once, before the controller noticed. Its
    silent agent is then one the controller soon no longer lists where the
    job knew it: its memory is lost with its node, so the restart goes on from
    the other levels (here: nothing, memory-only agents) with a warning
    instead of refusing with CAIRN_EUNUSABLE, and the run ends with the
    uninterrupted result."""
    d = deployment
    d.add_manager("node-a", memory_only=True)
    d.add_manager("node-b", memory_only=True)
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-node-died")
    flag = job.root / "pause8"
    cfg = agents_cfg(d, agents_persist="false", agents_timeout=1, agents_restart_wait=4, agents_wait=3)
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected",
                  "--pause-after", 8, flag, **cfg)
    job.wait_paused(p, flag)
    node = d.app("agents-node-died")["agents"][0]["node"]
    harness.kill_job(p)  # every rank gone (each has a process group of its own)
    d.kill("manager-" + node)  # the node is gone, with its agents and what they held
    t0 = time.monotonic()
    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, **cfg).ok()
    print(f"rerun took {time.monotonic() - t0:.1f} s")
    assert r.restarted_from is None, r.describe()
    # Started before the controller moved the agent, the rerun found it
    # silent and then gone; started after, it never saw it. Never refused.
    assert "cannot restore" not in r.stderr and "did not answer within" not in r.stderr, r.describe()
    assert r.final_hash == ref.final_hash


def test_agents_write_the_store_and_restart_after_agents_are_killed(deployment, reference, make_job):
    """Agents with a store write every version compressed-or-not in cairn's
    format; after the application and then every agent process are killed,
    restart comes from those persistent copies."""
    d = deployment
    d.add_manager("node-a")
    d.add_manager("node-b")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-store")
    _killed_once_v6_is_committed(job, agents_cfg(d))
    # Kill the agent processes: their managers restart them, empty.
    pids = [g["pid"] for g in d.app("agents-store")["agents"]]
    assert pids and all(pid > 0 for pid in pids)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until("agents restarted", lambda: all(g["pid"] not in pids and g["pid"] > 0 and g.get("endpoint")
                                                for g in d.app("agents-store")["agents"]))
    v = d.cli("verify", job.store, "--run", job.run_id, "--json", check=False)
    assert v.returncode == 0, v.stdout + v.stderr
    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, **agents_cfg(d)).ok()
    assert r.restarted_from == 6, r.describe()
    assert r.final_hash == ref.final_hash
    # Finalize keeps the checkpoints (agents_persist): the last one is committed.
    assert committed(job, STEPS)
    # ... and indexed in the catalog by the application's rank 0.
    with sqlite3.connect(job.store / "catalog.sqlite") as db:
        rows = db.execute("SELECT version, mode FROM checkpoints WHERE run = ? ORDER BY version",
                          (job.run_id,)).fetchall()
    assert (STEPS, "agent") in rows, rows
    ls = json.loads(d.cli("ls", job.store, "--json").stdout)
    assert job.run_id in json.dumps(ls)


# Large enough that the rank reads the agent's memory in its 4 MiB pieces,
# through its buffer (malloc'd regions start 16 bytes past a page), and ends
# in a partial piece.
WHILE_NBYTES = (5 << 20) + 8


def _two_nodes_restarting_while_from_v6(d, reference, make_job, run):
    """Two agent nodes, a 2-rank job of `run` with restart_verify = while
    killed once the agents committed v6; returns (reference run, job, cfg)."""
    d.add_manager("node-a")
    d.add_manager("node-b")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=WHILE_NBYTES)
    job = make_job(2, run=run)
    cfg = agents_cfg(d, restart_verify="while")
    _killed_once_v6_is_committed(job, cfg, nbytes=WHILE_NBYTES)
    return ref, job, cfg


def test_restart_verifying_while_it_reads_agent_memory_into_the_regions(deployment, reference, make_job):
    """restart_verify = while, a version the agents hold and committed:
    cairn_restart_test reads only the header of the agent's copy, and
    cairn_restart reads the regions from the agent's memory straight into
    the application's and verifies them as they arrive. The restored run
    ends bit for bit as one never interrupted; the agent lent the image and
    was told the rank read it without error."""
    d = deployment
    ref, job, cfg = _two_nodes_restarting_while_from_v6(d, reference, make_job, "agents-while")
    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", WHILE_NBYTES, **cfg).ok()
    assert r.restarted_from == 6, r.describe()
    assert r.final_hash == ref.final_hash
    assert "damaged" not in r.stderr, r.describe()
    logs = agent_logs(d)
    for rank in (0, 1):
        assert re.search(rf"restored \S+ v6 rank {rank}/2 \(read by the rank\)", logs), logs


def test_agents_killed_while_the_restart_reads_their_memory_restores_from_the_store(deployment, reference,
                                                                                     make_job):
    """restart_verify = while: cairn_restart_test took the agents' copies of
    v6 (header only), then every agent process is SIGKILLed before
    cairn_restart reads the regions. The reads fail, and cairn_restart
    restores v6 from the store instead, bit for bit, before it returns."""
    d = deployment
    ref, job, cfg = _two_nodes_restarting_while_from_v6(d, reference, make_job, "agents-while-killed")
    before = job.root / "before-restart"
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", WHILE_NBYTES, "--pause-before-restart", before,
                  **cfg)
    job.wait_paused(p, before)
    pids = [g["pid"] for g in d.app("agents-while-killed")["agents"]]
    assert pids and all(pid > 0 for pid in pids)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    release(before)
    r = harness.finish_process(p).ok()
    assert r.restarted_from == 6, r.describe()
    assert r.final_hash == ref.final_hash
    assert "agent copy of 'ckpt' version 6 damaged" in r.stderr, r.describe()


def test_finalize_without_waiting_does_not_wait_for_abandoned_versions(deployment, reference, make_job):
    """cairn_finalize(c, 0) right after a checkpoint abandons what the agents
    did not hold yet: finalize returns at once (it waited up to 120 s for a
    commit that could never come, then failed), commits what they held, and
    the next execution restarts bit for bit from what was committed. Larger
    images and several runs make both sides of the race likely."""
    d = deployment
    d.add_manager("node-a")
    d.add_manager("node-b")
    nbytes = 8 << 20
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=nbytes)
    for trial in range(3):
        job = make_job(2, run=f"agents-nowait-{trial}")
        r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", nbytes, "--finalize-nowait",
                    **agents_cfg(d)).ok()
        took = float(re.search(r"finalize took ([0-9.]+) s", r.stdout).group(1))
        assert took < 20, r.describe()
        r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", nbytes, **agents_cfg(d)).ok()
        assert r.restarted_from is not None and r.restarted_from > 0, r.describe()
        assert r.final_hash == ref.final_hash, r.describe()


def test_agent_lost_mid_run_version_falls_back_and_nothing_is_lost(deployment, reference, make_job):
    """An agent killed while the application runs: the next version is not
    reported as held by agents (PROTECTED fails) but the ranks write it
    themselves and it is committed; cairn_probe picks up the restarted agent
    and later versions are held again."""
    d = deployment
    d.add_manager("node-a")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-lost")
    flag = job.root / "pause4"
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--probe",
                  "--pause-after", 4, flag, **agents_cfg(d))
    job.wait_paused(p, flag)
    wait_until("v4 committed by the agent", lambda: committed(job, 4))
    pids = [g["pid"] for g in d.app("agents-lost")["agents"]]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # The manager restarts the agent; the application learns of it at a probe.
    wait_until("agent restarted", lambda: all(g["pid"] not in pids and g["pid"] > 0 and g.get("endpoint")
                                              for g in d.app("agents-lost")["agents"]))
    release(flag)
    r = harness.finish_process(p).ok()
    prot = protected(r)
    assert r.final_hash == ref.final_hash
    # v4 was held before the kill; the probe after v4 saw the new agent
    # address (change 3 = migrated), so v6... are held by the new agent.
    assert all(prot[(rank, 4)] == 0 for rank in range(2)), r.describe()
    assert re.search(r"^probe 4 change=3$", r.stdout, re.M), r.describe()
    assert all(prot[(rank, v)] == 0 for rank in range(2) for v in (6, 8, 10, 12)), r.describe()
    for v in (2, 4, 6, 8, 10, 12):
        assert committed(job, v), v


@pytest.mark.parametrize("lend", [False, True], ids=["staging", "lend"])
def test_agent_unreachable_falls_back_to_the_ranks_own_writes(lend, deployment, reference, make_job):
    """Agents killed and their manager gone: versions are written and
    committed by the ranks, PROTECTED is reported failed, nothing is lost.
    With agents_lend the lent regions are copied first (CAPTURED is then
    reached without the agents)."""
    d = deployment
    d.add_manager("node-a")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-gone")
    flag = job.root / "pause4"
    extra = {"agents_lend": "true"} if lend else {}
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--wait-captured",
                  "--pause-after", 4, flag, **agents_cfg(d, **extra))
    job.wait_paused(p, flag)
    wait_until("v4 committed by the agent", lambda: committed(job, 4))
    d.kill("manager-node-a")  # its process group: the manager and its agents
    release(flag)
    r = harness.finish_process(p).ok()
    prot = protected(r)
    assert r.final_hash == ref.final_hash
    assert all(prot[(rank, 6)] != 0 for rank in range(2)), r.describe()
    for v in (2, 4, 6, 8, 10, 12):
        assert committed(job, v), v
    restarted = job.run("--steps", STEPS + 2, "--every", EVERY, "--bytes", NBYTES).ok()
    assert restarted.restarted_from == STEPS


def test_expand_reduce_migrate_during_a_run(deployment, reference, make_job):
    """The controller changes the application's agents while it runs; each
    cairn_probe reports the change, and every version stays restorable bit for
    bit (checked against the reference's per-version dumps)."""
    d = deployment
    d.add_manager("node-a")
    d.add_manager("node-b")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-resize")
    flags = {v: job.root / f"pause{v}" for v in (2, 4, 6)}
    args = ["--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--probe"]
    for v, f in flags.items():
        args += ["--pause-after", v, f]
    p = job.start(*args, **agents_cfg(d))
    job.wait_paused(p, flags[2])
    app = d.app("agents-resize")
    assert len(app["agents"]) == 1, app
    d.admin("resize", "--app", app["app"], "--agents", 2, "--force")
    wait_until("2 agents running", lambda: len(d.app("agents-resize")["agents"]) == 2 and all(
        g.get("endpoint") for g in d.app("agents-resize")["agents"]))
    release(flags[2])
    job.wait_paused(p, flags[4])
    d.admin("resize", "--app", app["app"], "--agents", 1)
    wait_until("1 agent", lambda: len(d.app("agents-resize")["agents"]) == 1)
    release(flags[4])
    job.wait_paused(p, flags[6])
    agent = d.app("agents-resize")["agents"][0]
    d.admin("migrate", "--agent", agent["agent"])
    wait_until("agent migrated", lambda: d.app("agents-resize")["agents"][0]["node"] != agent["node"] and
               d.app("agents-resize")["agents"][0].get("endpoint"))
    release(flags[6])
    r = harness.finish_process(p).ok()
    assert r.final_hash == ref.final_hash
    changes = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^probe (\d+) change=(\d+)$", r.stdout, re.M)}
    assert changes[2] == 1 and changes[4] == 2 and changes[6] == 3, r.describe()
    prot = protected(r)
    assert all(rc == 0 for rc in prot.values()), r.describe()
    # Restart from a version the new agent holds.
    again = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, **agents_cfg(d)).ok()
    assert again.restarted_from == STEPS
    assert again.final_hash == ref.final_hash


def test_lend_agents_pull_from_the_regions_and_restart_from_memory(deployment, reference, make_job):
    """agents_lend = true: no staging copy; the agents read the protected
    regions themselves (the application waits for CAPTURED before it changes
    them). Every version is held, and after a kill the rerun restores v8 from
    agent memory bit for bit."""
    d = deployment
    d.add_manager("node-a", memory_only=True)
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-lend")
    flag = job.root / "pause8"
    cfg = agents_cfg(d, agents_persist="false", agents_lend="true")
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-captured", "--wait-protected",
                  "--pause-after", 8, flag, **cfg)
    job.wait_paused(p, flag)
    first = harness.kill_job(p)  # every rank gone (each has a process group of its own)
    prot = protected(first)
    assert {(r, v) for r in range(2) for v in (2, 4, 6, 8)} <= set(prot), first.describe()
    assert all(rc == 0 for rc in prot.values()), first.describe()
    assert "writing checkpoints to the persistent level" not in first.stderr, first.describe()
    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-captured", "--dump-restored",
                job.dumps / "restored", **cfg).ok()
    assert r.restarted_from == 8, r.describe()
    harness.assert_same_state(ref.dump(8), job.read_dump(job.dumps / "restored"), "state restored from lent pulls")
    assert r.final_hash == ref.final_hash


def test_bad_agents_configuration_is_a_clear_error(tmp_path, make_job):
    job = make_job(2, run="agents-bad")
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32))
    r = job.run("--steps", 2, agents="127.0.0.1:1", agents_secret_file=secret, agents_timeout=2)
    assert r.rc != 0
    assert "controller 127.0.0.1:1" in r.stderr, r.describe()
    r = job.run("--steps", 2, agents="127.0.0.1:1", agents_secret_file=tmp_path / "missing")
    assert r.rc != 0 and "agents_secret_file" in r.stderr, r.describe()
    r = job.run("--steps", 2, agents="127.0.0.1:1", agents_secret_file=secret, agents_lend="true")
    assert r.rc != 0 and "'agents_lend'" in r.stderr and "local_enabled = false" in r.stderr, r.describe()


def test_controller_restart_does_not_disturb_the_application(deployment, reference, make_job):
    """The controller killed mid-run and restarted on its journal: probes in
    between warn and keep the agents; the application finishes with the
    right state and is still registered with the same agents."""
    d = deployment
    d.add_manager("node-a")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-ctl")
    flags = {v: job.root / f"pause{v}" for v in (4, 6)}
    args = ["--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--probe"]
    for v, f in flags.items():
        args += ["--pause-after", v, f]
    p = job.start(*args, **agents_cfg(d))
    job.wait_paused(p, flags[4])
    before = d.app("agents-ctl")["agents"]
    d.kill("controller")
    release(flags[4])
    job.wait_paused(p, flags[6])  # v6 checkpointed and probed without a controller
    d.start_controller()
    wait_until("the node back", lambda: d.app("agents-ctl") and all(
        g["state"] == "running" for g in d.app("agents-ctl")["agents"]))
    # Recovered from the journal: the same agent, not a new one.
    assert [g["agent"] for g in d.app("agents-ctl")["agents"]] == [g["agent"] for g in before]
    release(flags[6])
    r = harness.finish_process(p).ok()
    assert r.final_hash == ref.final_hash
    assert "keeping the current agents" in r.stderr, r.describe()
    assert all(rc == 0 for rc in protected(r).values()), r.describe()
    assert not re.search(r"^probe \d+ change=[123]$", r.stdout, re.M), r.describe()


def test_manager_lost_agents_reassigned(deployment, reference, make_job):
    """The manager of the application's agent node dies with its agents: the
    controller moves the agent to the other node after the heartbeat timeout,
    the next probe reports it (migrated), and later versions are held again."""
    d = deployment
    d.add_manager("node-a")
    d.add_manager("node-b")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-mgr")
    flag = job.root / "pause4"
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--probe",
                  "--pause-after", 4, flag, **agents_cfg(d))
    job.wait_paused(p, flag)
    node = d.app("agents-mgr")["agents"][0]["node"]
    other = "node-b" if node == "node-a" else "node-a"
    wait_until("v4 committed", lambda: committed(job, 4))
    d.kill("manager-" + node)
    wait_until("agent moved", lambda: [(g["node"], bool(g.get("endpoint")))
                                       for g in d.app("agents-mgr")["agents"]] == [(other, True)])
    release(flag)
    r = harness.finish_process(p).ok()
    assert r.final_hash == ref.final_hash
    assert re.search(r"^probe 4 change=3$", r.stdout, re.M), r.describe()
    prot = protected(r)
    assert all(prot[(rank, v)] == 0 for rank in range(2) for v in (6, 8, 10, 12)), r.describe()
    for v in (2, 4, 6, 8, 10, 12):
        assert committed(job, v), v


def test_node_joining_gives_an_application_without_agents_its_agent(deployment, reference, make_job):
    """No agent node at first: the application starts anyway, its ranks write
    their own shards; an agent node joins mid-run, the controller fills the
    shortfall, the probe reports the expansion and later versions are held.
    Then that node leaves gracefully (SIGTERM) for another: migrated."""
    d = deployment
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-join")
    flags = {v: job.root / f"pause{v}" for v in (4, 8)}
    args = ["--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--probe"]
    for v, f in flags.items():
        args += ["--pause-after", v, f]
    p = job.start(*args, **agents_cfg(d, agents_wait=1))
    job.wait_paused(p, flags[4])
    d.add_manager("node-a")
    wait_until("an agent for the application", lambda: [g["node"] for g in d.app("agents-join")["agents"]
                                                         if g.get("endpoint")] == ["node-a"])
    release(flags[4])
    job.wait_paused(p, flags[8])
    d.add_manager("node-b")
    d.kill("manager-node-a", signal.SIGTERM)  # graceful leave: its agent moves to node-b
    wait_until("agent moved to node-b", lambda: [(g["node"], bool(g.get("endpoint")))
                                                 for g in d.app("agents-join")["agents"]] == [("node-b", True)])
    release(flags[8])
    r = harness.finish_process(p).ok()
    assert r.final_hash == ref.final_hash
    prot = protected(r)
    changes = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"^probe (\d+) change=(\d+)$", r.stdout, re.M)}
    assert changes[4] == 1 and changes[8] == 3, r.describe()
    assert all(prot[(rank, v)] != 0 for rank in range(2) for v in (2, 4)), r.describe()
    assert all(prot[(rank, v)] == 0 for rank in range(2) for v in (6, 8, 10, 12)), r.describe()
    for v in (2, 4, 6, 8, 10, 12):
        assert committed(job, v), v


def test_keep_persistent_applies_to_what_the_agents_committed(deployment, reference, make_job):
    """keep_persistent = 2 in agent mode: at each checkpoint, committed versions
    older than the two newest go (with --wait-persistent every earlier version
    is committed by then, so the outcome is exact)."""
    d = deployment
    d.add_manager("node-a")
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="agents-keep")
    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-persistent",
                **agents_cfg(d, keep_persistent=2)).ok()
    assert r.final_hash == ref.final_hash
    vdir = job.store / "runs" / job.run_id / "ckpt"
    assert sorted(p.name for p in vdir.iterdir()) == [f"v{v:012d}" for v in (8, 10, 12)], sorted(vdir.iterdir())
    assert all(committed(job, v) for v in (8, 10, 12))


def test_an_agent_serves_only_its_application(deployment, reference, make_job, tmp_path):
    """The application's key (docs/design/security.md, "Agents"): memory-only
    agents hold the only copy of a killed job's versions. A stranger on the
    fabric (tests/integration/plane_stranger.cpp) sends the agent RELEASE,
    QUERY and RESTORE for the run, unsealed or under a wrong key: the agent
    drops and counts them, answers none, and still holds every version. A job
    of the same run without the key (another store, so no agents.key) is
    refused at init with a message that says why, and the run's own next job,
    which holds the key, restores from the agents' memory bit for bit."""
    d = deployment
    d.add_manager("node-a", memory_only=True)
    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = make_job(2, run="sealed")
    flag = job.root / "pause8"
    cfg = agents_cfg(d, agents_persist="false")
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected",
                  "--pause-after", 8, flag, **cfg)
    job.wait_paused(p, flag)
    first = harness.kill_job(p)  # every rank gone (each has a process group of its own)
    assert all(protected(first).get((r, 8)) == 0 for r in range(2)), first.describe()
    key = job.store / "runs" / "sealed" / "agents.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) == 64

    agents = [g["endpoint"] for g in d.app("sealed")["agents"]]
    out = subprocess.run([harness.bin_dir() / "cairn_plane_stranger", "--agent", "sealed", "1", *agents],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "answered" not in out.stdout, out.stdout + out.stderr
    stats = [json.loads(f.read_text()) for f in (d.root / "run-node-a").glob("agent-*.stats")]
    assert sum(s.get("refused", 0) for s in stats) > 0, stats
    assert "dropped a message without the application's seal" in agent_logs(d)

    # The same run from another store: no key to prove.
    thief = make_job(2, run="sealed")
    r = thief.run("--steps", 2, "--every", 2, "--bytes", NBYTES, **cfg)
    assert r.rc != 0 and "does not hold its key" in r.stderr, r.describe()

    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--dump-restored", job.dumps / "restored",
                **cfg).ok()
    assert r.restarted_from == 8, r.describe()
    harness.assert_same_state(ref.dump(8), job.read_dump(job.dumps / "restored"), "restored from agent memory")
    assert r.final_hash == ref.final_hash
