"""pytest fixtures of the integration and fault tests; helpers are in support_py/harness.py."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support_py"))

import harness  # noqa: E402


def needs_mpi(mode):
    """Fails without the test applications; skips a test of an MPI launch
    mode in a build without MPI."""
    apps = harness.bin_dir()
    if not (apps / "ckpt_app_serial").is_file():
        pytest.fail(f"{apps}/ckpt_app_serial not found: build the project and set CAIRN_TEST_BIN_DIR "
                    "(ctest sets it)")
    if mode != harness.SERIAL and not harness.mpi_enabled():
        pytest.skip("built with CAIRN_ENABLE_MPI=OFF")


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """reference(mode, steps=10, every=2, nbytes=65536) -> harness.Reference.

    Uninterrupted runs are shared by every test of the session that uses the
    same launch mode and sizes (the state does not depend on cairn's settings)."""
    cache = {}

    def get(mode, steps=10, every=2, nbytes=65536):
        key = (mode, steps, every, nbytes)
        if key not in cache:
            needs_mpi(mode)
            root = tmp_path_factory.mktemp(f"ref-{mode}-{steps}-{every}-{nbytes}")
            cache[key] = harness.run_reference(root, mode, steps, every, nbytes)
        return cache[key]

    return get


@pytest.fixture
def make_job(tmp_path):
    """make_job(mode, **kw) -> harness.Job in this test's temporary directory."""
    count = [0]

    def make(mode, **kw):
        needs_mpi(mode)
        count[0] += 1
        return harness.Job(tmp_path / f"job{count[0]}", mode, **kw)

    return make


@pytest.fixture
def make_node_job(tmp_path):
    """make_node_job(nodes, rpn, run) -> harness.NodeJob in this test's temporary directory."""
    count = [0]

    def make(nodes, rpn, run):
        needs_mpi(nodes * rpn)
        count[0] += 1
        return harness.NodeJob(tmp_path / f"job{count[0]}", nodes, rpn, run=run)

    return make
