"""Online comparison with a reference run, end to end under mpirun.

heat2d is deterministic: a run compared with an earlier run never diverges.
nbody with two OpenMP threads sums forces in a timing-dependent order: a second
run diverges from the first, and with on_divergence = stop every rank leaves at
the same checkpoint, cleanly, long before the end.
"""
import os
import re
import subprocess

import pytest

EXAMPLES = os.environ.get("CAIRN_TEST_EXAMPLES_DIR", "")


def run(args, env_extra, tmp_path, timeout=120):
    # cairn refuses unknown CAIRN_* variables: keep the test's own out of the job.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_TEST_")}
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "CAIRN_PERSISTENT": str(tmp_path / "store"), "CAIRN_SCRATCH": str(tmp_path / "scratch"),
                "CAIRN_KEEP_PERSISTENT": "0"})  # history runs keep every version
    env.update(env_extra)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"] + args
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def binary(name):
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not built ({path})")
    return path


def test_deterministic_run_never_diverges_from_its_reference(tmp_path):
    heat2d = binary("heat2d")
    args = [heat2d, "--nx", "128", "--ny", "128", "--iters", "200", "--every", "20"]
    a = run(args, {"CAIRN_RUN": "a"}, tmp_path)
    b = run(args, {"CAIRN_RUN": "b", "CAIRN_REFERENCE_RUN": "a", "CAIRN_ON_DIVERGENCE": "stop"}, tmp_path)
    assert "diverged" not in b.stderr + b.stdout
    checksum = re.compile(r"final checksum (\w+)")
    assert checksum.search(a.stdout).group(1) == checksum.search(b.stdout).group(1)


def test_timing_dependent_run_stops_at_its_first_divergence(tmp_path):
    nbody = binary("nbody")
    args = [nbody, "--particles", "192", "--steps", "600", "--every", "50"]
    threads = {"OMP_NUM_THREADS": "2"}
    run(args, {"CAIRN_RUN": "a", **threads}, tmp_path)
    b = run(args, {"CAIRN_RUN": "b", "CAIRN_REFERENCE_RUN": "a", "CAIRN_ON_DIVERGENCE": "stop", **threads}, tmp_path)
    m = re.search(r"diverged from the reference at version (\d+) \(rank (\d+), region '(\w+)'", b.stdout)
    assert m, b.stdout + b.stderr
    first = int(m.group(1))
    assert m.group(3) in ("pos", "vel")
    stopped = int(re.search(r"stopping at step (\d+)", b.stdout).group(1))
    # Detected in the background; the stop comes at a later checkpoint, well before the end.
    assert first < stopped < 600, b.stdout
    assert f"cairn: run 'b' diverged from 'a' at 'nbody' version {first}" in b.stderr


def test_single_thread_nbody_is_reproducible_online(tmp_path):
    nbody = binary("nbody")
    args = [nbody, "--particles", "128", "--steps", "300", "--every", "50"]
    one = {"OMP_NUM_THREADS": "1"}
    run(args, {"CAIRN_RUN": "a", **one}, tmp_path)
    b = run(args, {"CAIRN_RUN": "b", "CAIRN_REFERENCE_RUN": "a", "CAIRN_ON_DIVERGENCE": "stop", **one}, tmp_path)
    assert "diverged" not in b.stdout + b.stderr
    assert "nbody: steps 300" in b.stdout
