"""Fixtures of the PyTorch helper tests (ctest: python_torch).

Environment (tests/CMakeLists.txt): PYCAIRN_LIBRARY (libcairn.so of the build),
CAIRN_TEST_MPI (1 when built with MPI). The package is imported from this
checkout (bindings/python)."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bindings" / "python"))


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    """CAIRN_PERSISTENT/SCRATCH/RUN of this test, in this process's environment
    (libcairn reads them at init); every other CAIRN_* variable removed."""
    for k in list(os.environ):
        if k.startswith("CAIRN_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CAIRN_PERSISTENT", str(tmp_path / "store"))
    monkeypatch.setenv("CAIRN_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("CAIRN_RUN", "py")
    monkeypatch.setenv("CAIRN_KEEP_PERSISTENT", "0")
    return tmp_path
