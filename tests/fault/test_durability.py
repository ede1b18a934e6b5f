"""Nothing committed is lost, whatever kills the job (docs/format/store.md,
"Commit"), under real mpirun with emulated nodes (harness.NodeJob).

- A version is committed by the last rank whose part becomes durable, on its
  engine thread: an application that checkpoints, then computes for seconds
  without calling cairn and is killed, restarts from that version even with
  every node-local directory wiped. In thread and sync mode, with
  redundancy, and aggregated (aligned, posix_shared, leaders; mpiio's
  collective write needs the application thread, so it is not here).
- cairnd drains on SIGTERM (a batch system's time limit or scancel): the
  version handed to it before the signal is committed.
- Names that would break the store or its JSON (invalid UTF-8, control
  characters, the run file's name) are refused with CAIRN_EINVAL, and the
  application goes on.
"""
import os
import signal
import time

import pytest

import harness
from harness import assert_same_state

NODES, RPN = 2, 2
STEPS, EVERY, NBYTES = 12, 2, 65536
SILENCE_MS = 5000


@pytest.fixture
def node_job(make_node_job):
    return lambda run="durable": make_node_job(NODES, RPN, run)


def restore_and_compare(job, ref, version, **cfg):
    prefix = job.dumps / "restored"
    res = job.run(*ref.app_args(), "--steps", STEPS, "--dump-restored", prefix, **cfg).ok()
    assert res.restarted_from == version, res.describe()
    assert_same_state(ref.dump(version), job.read_dump(prefix), f"state restored from version {version}")
    assert res.final_hash == ref.final_hash, "final state differs from the uninterrupted run"


@pytest.mark.parametrize("cfg", [
    {},
    {"mode": "sync"},
    {"redundancy": "xor", "redundancy_set": NODES},
    {"persistent_layout": "aggregated", "aggregate_strategy": "aligned"},
    {"persistent_layout": "aggregated", "aggregate_strategy": "posix_shared"},
    {"persistent_layout": "aggregated", "aggregate_strategy": "leaders"},
    {"engine_host": "daemon"},
    {"engine_host": "daemon", "redundancy": "xor", "redundancy_set": NODES},
    {"capture": "cow"},
], ids=["thread", "sync", "redundancy", "aligned", "posix_shared", "leaders", "daemon", "daemon-redundancy", "cow"])
def test_version_committed_while_the_application_computes(cfg, node_job, reference):
    """Checkpoint 6 returns; the ranks compute for 5 s without any cairn
    call, then all die (SIGKILL). Version 6 was committed meanwhile, by an
    engine thread: with every node-local directory wiped, the rerun restores
    it bit for bit. (Before the commit left the application thread, version 6
    stayed uncommitted until the next cairn call, which never came.) With
    capture = cow the copy itself ends in the background."""
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = node_job()
    v = 6
    res = job.run(*ref.app_args(), "--steps", STEPS, "--die-after", v, "--silence-ms", SILENCE_MS, **cfg)
    assert res.rc != 0 and "final hash" not in res.stdout, "the application was not killed\n" + res.describe()
    assert v in job.committed(), f"committed {job.committed()}\n" + res.describe()
    # The commit records are gone once the version is committed.
    assert not list(job.version_dir("persistent", v).glob("parts.*")), list(job.version_dir("persistent", v).iterdir())
    if "redundancy" in cfg:  # the MANIFEST records the scheme and the job's sets, whoever committed it
        manifest = (job.version_dir("persistent", v) / "MANIFEST").read_text()
        assert '"redundancy"' in manifest and '"sets"' in manifest and '"xor"' in manifest, manifest
    for node in range(NODES):
        job.lose_node(node)
    restore_and_compare(job, ref, v, **cfg)


def test_daemon_drains_on_sigterm(node_job, reference):
    """engine_host = daemon, the persistent write slowed down (io_rate_limit):
    the ranks SIGKILL themselves right after checkpoint 6 returned and the
    daemons get SIGTERM at once, as a batch system's time limit sends it to
    every process of the step. The daemons finish the flush, commit version 6
    and exit; the rerun restores it with the node-local directories wiped."""
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = node_job()
    v = 6
    cfg = {"engine_host": "daemon", "io_rate_limit": 65536, "daemon_drain_s": 30}
    p = job.start(*ref.app_args(), "--steps", STEPS, "--die-after", v, **cfg)
    res = harness.finish_process(p)
    assert res.rc != 0 and "final hash" not in res.stdout, res.describe()
    pids = harness.daemons(job.store)
    assert pids, "no daemon left to drain: the flush ended before the signal (slow it down further)\n" + res.describe()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while harness.daemons(job.store):
        assert time.monotonic() < deadline, "the daemons did not exit after SIGTERM"
        time.sleep(0.05)
    assert v in job.committed(), f"committed {job.committed()}\n" + res.describe()
    for node in range(NODES):
        job.lose_node(node)
    restore_and_compare(job, ref, v, engine_host="daemon")


def test_names_that_would_break_the_store_are_refused(make_job):
    """A run id that is not UTF-8 is refused at init with CAIRN_EINVAL and a
    message naming the rule; the process lives (no exception from an engine
    thread)."""
    job = make_job(harness.SERIAL, run="ok")
    res = job.run("--steps", 2, "--every", 1, "--bytes", 4096, run="bad\udcff")
    assert res.rc != 0
    assert "not valid UTF-8" in res.stderr, res.describe()
    res = job.run("--steps", 2, "--every", 1, "--bytes", 4096, run="tab\there")
    assert res.rc != 0 and "control character" in res.stderr, res.describe()


def test_a_restored_uncommitted_version_is_committed(node_job, reference):
    """persistent_interval = 2: version 6 goes to the node-local level only,
    and the job dies right after it. The relaunch restores 6 from the
    node-local level, commits it (its ranks write the image they restored to
    the persistent level; the last commits), checkpoints on to the end, and
    leaves no version at the persistent level without its MANIFEST (its own
    2nd checkpoint, 10, went there too). A second relaunch with every
    node-local directory wiped restores 10, bit for bit."""
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = node_job()
    cfg = {"persistent_interval": 2}
    # The silence lets version 4 reach the persistent level before the kill.
    res = job.run(*ref.app_args(), "--steps", STEPS, "--die-after", 6, "--silence-ms", 2000, **cfg)
    assert res.rc != 0 and "final hash" not in res.stdout, res.describe()
    assert job.committed() == [4], res.describe()
    restore_and_compare(job, ref, 6, **cfg)
    deadline = time.monotonic() + 30
    while 6 not in job.committed():  # the relaunch's engine commits it in the background, before it ends
        assert time.monotonic() < deadline, f"version 6 was not committed: {job.committed()}"
        time.sleep(0.05)
    assert job.committed() == [4, 6, 10], job.committed()
    assert job.versions("persistent") == job.committed(), "a version at the persistent level without its MANIFEST"
    for node in range(NODES):
        job.lose_node(node)
    restore_and_compare(job, ref, 10, **cfg)


def test_retention_keeps_pace_with_back_to_back_checkpoints(make_job):
    """keep_persistent = 2, 200 checkpoints back to back (no computation
    between them, no wait): the persistent level, sampled while the job runs,
    never holds more than a few versions beyond the 2 kept (retention runs
    before later stage work instead of waiting for an idle moment, which never
    comes), and the job ends with exactly the newest 2."""
    job = make_job(2)
    p = job.start("--steps", 200, "--every", 1, "--bytes", 1 << 18, keep_persistent=2, keep_local=2)
    most = 0
    while p.poll() is None:
        most = max(most, len(job.versions("persistent")))
        time.sleep(0.01)
    harness.finish_process(p).ok()
    print(f"retention: at most {most} versions at the persistent level during the run (keep_persistent = 2)")
    # The 2 kept, the versions in flight (being written, committed but not yet
    # agreed in a progress round): a bound that does not grow with the run's
    # length (starved by stage work, retention let it grow with the run).
    assert most <= 2 + 14, f"retention fell behind: {most} versions at once"
    assert job.versions("persistent") == [199, 200]


def test_a_failed_level_never_costs_the_next_checkpoint(make_job, reference):
    """Node-local ENOSPC on rank 1 at version 6, nobody waiting: the failure
    comes back once, on every rank, from the first checkpoint after it was
    latched (which takes its version and returns CAIRN_EEARLIER naming
    version 6 and its cause), or from finalize when it was latched after the
    last one; every version is committed and the restart of the newest is
    bit-identical."""
    ref = reference(2)
    job = make_job(2)
    res = job.run("--steps", 10, "--keep-going",
                  fault_inject="level=local,action=error,errno=28,kind=write,version=6,rank=1").ok()
    failed, final = res.failed_checkpoints(), res.finalize_errors()
    if final:
        assert failed == {} and final == {0: harness.CAIRN_ENOSPC, 1: harness.CAIRN_ENOSPC}, res.describe()
    else:
        assert {r for r, _ in failed} == {0, 1} and len(failed) == 2, res.describe()
        assert len({v for _, v in failed}) == 1, "ranks disagree\n" + res.describe()
        for (r, v), (rc, msg) in failed.items():
            assert v > 6 and rc == harness.CAIRN_EEARLIER, res.describe()
            assert f"version {v} was taken; an earlier version failed (no_space)" in msg, msg
            assert "version 6" in msg, msg
    assert job.committed() == [2, 4, 6, 8, 10]
    assert res.final_hash == ref.final_hash
    res = job.run("--steps", 10, "--dump-restored", job.dumps / "restored").ok()
    assert res.restarted_from == 10, res.describe()
    assert_same_state(ref.dump(10), job.read_dump(job.dumps / "restored"), "state restored from version 10")
