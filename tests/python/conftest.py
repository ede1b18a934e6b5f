"""Fixtures of the Python package tests (ctest: python_package).

Environment (set by tests/CMakeLists.txt):
  CAIRN_TEST_PY_WRITER     tests/python/region_writer.c, built
  CAIRN_TEST_EXAMPLES_DIR  the build's examples/ (heat2d, nbody)
  CAIRN_TEST_MPI           1 when built with MPI
  PYCAIRN_CLI              the cairn CLI (for cairn.diff)
The package is imported from this checkout (bindings/python), installed or not.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BINDINGS = REPO / "bindings" / "python"
sys.path.insert(0, str(BINDINGS))

import cairn  # noqa: E402


def _exe(path):
    return Path(path) if path and Path(path).is_file() and os.access(path, os.X_OK) else None


def writer_path():
    return _exe(os.environ.get("CAIRN_TEST_PY_WRITER"))


def example(name):
    d = os.environ.get("CAIRN_TEST_EXAMPLES_DIR")
    return _exe(str(Path(d) / name)) if d else None


def mpi_enabled():
    return os.environ.get("CAIRN_TEST_MPI", "1") not in ("0", "", "OFF", "FALSE", "false")


def cairn_env(store, scratch, run, **extra):
    # The runtime reads every CAIRN_* variable as a configuration key and refuses
    # unknown ones (CAIRN_TEST_*): pass only the ones meant for it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update({"CAIRN_PERSISTENT": str(store), "CAIRN_SCRATCH": str(scratch), "CAIRN_RUN": run,
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1",
                # whole histories (the default keeps the newest 3 versions)
                "CAIRN_KEEP_PERSISTENT": "0"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_mpi(exe, nranks, args, env, timeout=300):
    cmd = ["mpirun", "--oversubscribe", "-np", str(nranks), str(exe)] + [str(a) for a in args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def final_checksum(out, prog):
    for line in out.splitlines():
        if line.startswith(f"{prog}: final checksum "):
            return line.split()[-1]
    raise AssertionError(f"no final checksum in:\n{out}")


@pytest.fixture(scope="session")
def writer_store(tmp_path_factory):
    """A store written by region_writer: run 'w1', checkpoint 'w', versions 1 and 3."""
    exe = writer_path()
    if exe is None:
        pytest.skip("CAIRN_TEST_PY_WRITER (tests/python/region_writer.c, built) is not set")
    root = tmp_path_factory.mktemp("writer")
    env = cairn_env(root / "store", root / "scratch", "w1", CAIRN_MODE="sync")
    p = subprocess.run([str(exe), "1", "3"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return root / "store"


@pytest.fixture
def writer_copy(writer_store, tmp_path):
    """A private copy of the writer's store, to damage."""
    dst = tmp_path / "store"
    shutil.copytree(writer_store, dst)
    return dst


@pytest.fixture(scope="session")
def heat2d_store(tmp_path_factory):
    """heat2d (48 x 40, 60 iterations, checkpoint every 20) as runs 'one' (1 rank),
    'two' (2 ranks) and 'two-again' (2 ranks) of one store; returns (store, checksums)."""
    exe = example("heat2d")
    if exe is None or not mpi_enabled():
        pytest.skip("examples/heat2d is not built (CAIRN_BUILD_EXAMPLES=OFF or no MPI)")
    root = tmp_path_factory.mktemp("heat2d")
    sums = {}
    for run, n in (("one", 1), ("two", 2), ("two-again", 2)):
        out = run_mpi(exe, n, ["--nx", 48, "--ny", 40, "--iters", 60, "--every", 20],
                      cairn_env(root / "store", root / f"scratch-{run}", run))
        sums[run] = final_checksum(out, "heat2d")
    return root / "store", sums


def require_diff():
    if not cairn.has_diff():
        pytest.skip("the cairn CLI with a 'diff' command was not found (set PYCAIRN_CLI); diff tests skipped")
