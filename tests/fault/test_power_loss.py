"""A power-loss campaign on a real file system that drops unsynced writes
(lossy_fs.py, FUSE): the persistent level of a 2-rank MPI job lives on it; the
job is SIGKILLed at a random moment and the file system then loses what a
power loss may lose (unsynced file data, unsynced directory entries, with a
random subset of them written back). The node-local level is wiped too (the
node is gone). The restart must restore, bit for bit, a version at least as new
as the newest one a rank was told is at the persistent level
(cairn_wait(PERSISTENT) returned 0) before the kill; in the trials that do not
wait (several flushes in flight), whatever it restores must be bit-identical.

CAIRN_TEST_POWER_LOSS_TRIALS sets the number of trials (default 30); the seed
is printed (CAIRN_TEST_SEED repeats a campaign).
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import harness
from harness import assert_same_state

NRANKS, STEPS, EVERY, NBYTES = 2, 40, 2, 65536
LOSSY = Path(__file__).with_name("lossy_fs.py")


def fuse_usable() -> str:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found (Debian package fuse3)"
    try:
        import mfusepy  # noqa: F401
    except Exception as e:  # an ImportError, or libfuse missing (OSError)
        return f"mfusepy unusable: {e}"
    return ""


class Mount:
    """lossy_fs over `backing` at `mountpoint`, until unmount()."""

    def __init__(self, backing: Path, mountpoint: Path, crash: bool, seed: int):
        mountpoint.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, str(LOSSY), str(backing), str(mountpoint)]
        if crash:
            args += ["--crash-on-exit", "--seed", str(seed)]
        self.mountpoint = mountpoint
        self.log = mountpoint.with_suffix(".log")
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        deadline = time.monotonic() + 20
        while not os.path.ismount(mountpoint):
            assert self.p.poll() is None, "lossy_fs did not start: " + self.log.read_text()
            assert time.monotonic() < deadline, "lossy_fs did not mount in 20 s"
            time.sleep(0.02)

    def unmount(self) -> str:
        for _ in range(100):
            if subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)  # a killed job's last file may still be open
        self.p.wait(timeout=60)
        return self.log.read_text()


@pytest.fixture(scope="module")
def campaign_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("power-loss-ref")
    return harness.run_reference(root, NRANKS, STEPS, EVERY, NBYTES)


def test_power_loss_campaign(campaign_reference, tmp_path):
    why = fuse_usable()
    if why:
        pytest.fail(f"the power-loss campaign needs FUSE: {why} (scripts/install-deps.sh installs it)")
    ref = campaign_reference
    trials = int(os.environ.get("CAIRN_TEST_POWER_LOSS_TRIALS", "30"))
    seed = int(os.environ.get("CAIRN_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"power-loss campaign: {trials} trials, seed {seed}")
    found = []
    for t in range(trials):
        what = f"seed {seed}, trial {t}"
        root = tmp_path / f"t{t}"
        backing, mnt = root / "backing", root / "mnt"
        backing.mkdir(parents=True)
        job = harness.Job(root, NRANKS, run="lossy", store=mnt / "store", scratch=root / "scratch")
        # Some trials give the job time to reach steady state, some kill it early.
        delay = rng.choice([rng.uniform(0.2, 1.0), rng.uniform(1.0, 3.0)])
        m = Mount(backing, mnt, crash=True, seed=rng.randrange(1 << 30))
        try:
            # Half the trials wait for every version (a floor to check), half
            # leave several flushes in flight when the power goes.
            wait = ["--wait-persistent"] if rng.random() < 0.5 else []
            p = job.start(*ref.app_args(), "--steps", STEPS, "--sleep-ms", 50, *wait)
            time.sleep(delay)
            killed = harness.kill_job(p)
        finally:
            log = m.unmount()
        reported = [v for (_, v), (rc, _) in killed.waits().items() if rc == 0]
        floor = max(reported, default=None)
        shutil.rmtree(root / "scratch", ignore_errors=True)  # the node is gone
        # Restart on the file system as the power loss left it.
        m = Mount(backing, mnt, crash=False, seed=0)
        try:
            prefix = job.dumps / "restored"
            res = job.run(*ref.app_args(), "--steps", 0, "--dump-restored", prefix)
        finally:
            m.unmount()
        assert res.rc == 0, f"{what}: the restart failed\n{res.describe()}\n{log}"
        got = res.restarted_from
        assert floor is None or (got is not None and got >= floor), \
            f"{what}: version {floor} was reported durable, the restart found {got}\n{res.describe()}\n{log}"
        if got is not None:
            assert_same_state(ref.dump(got), job.read_dump(prefix), f"{what}: state restored from version {got}")
        found.append((t, round(delay, 2), floor, got))
        shutil.rmtree(root, ignore_errors=True)
    print("trial, kill after s, newest reported durable, restored:")
    for row in found:
        print("  ", *row)
    restored = sum(1 for *_, got in found if got is not None)
    print(f"power-loss campaign: {trials} trials, {restored} restored a version, "
          f"{sum(1 for *_, f, _ in found if f is not None)} had a version reported durable before the kill")
    assert restored > 0, "no trial got as far as a committed version: the campaign tested nothing"
