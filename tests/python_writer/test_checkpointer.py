"""cairn.Checkpointer (bindings/python/cairn/checkpointer.py) over libcairn:
numpy arrays protected without copy and restored bit for bit, refusals with
the C library's messages, the context manager, and an application SIGKILLed at
a random moment and restarted, without MPI and under mpirun with mpi4py."""
import os
import re
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cairn

APP = Path(__file__).resolve().parent / "app.py"
TIMEOUT_S = 120


def test_every_dtype_and_order_restored_bit_for_bit_and_recorded(store_env):
    arrays = {f"a_{np.dtype(t).name}": (np.arange(24, dtype=t).reshape(2, 3, 4) * 3 + 1).astype(t)
              for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                        np.float32, np.float64)}
    arrays["fortran"] = np.asfortranarray(np.random.default_rng(1).standard_normal((5, 7)))
    arrays["scalar"] = np.array(2.5)
    saved = {k: v.copy() for k, v in arrays.items()}
    with cairn.Checkpointer() as ck:
        assert (ck.rank, ck.size) == (0, 1)
        for k, v in arrays.items():
            ck.protect(k, v)
        ck.checkpoint("round", 3)
        ck.wait("round", 3)
        assert ck.test("round", 3) & cairn.LEVEL_PERSISTENT
        for v in arrays.values():
            v[...] = 0
        assert ck.restart("round") == 3
    for k, v in arrays.items():
        assert v.tobytes() == saved[k].tobytes(), k
    # The reader sees the dtypes and shapes as written (Fortran order included).
    s = cairn.open(store_env / "store")
    got = s.region("py", "round", 3, "fortran")
    assert got.shape == (5, 7) and np.array_equal(got, saved["fortran"])
    for k in arrays:
        if k.startswith("a_"):
            got = s.region("py", "round", 3, k)
            assert got.dtype == saved[k].dtype and got.shape == (2, 3, 4) and np.array_equal(got, saved[k]), k


def test_bad_arrays_are_refused_with_a_clear_message(store_env):
    a = np.zeros(10)
    with cairn.Checkpointer() as ck:
        with pytest.raises(cairn.InvalidArgumentError, match=r"region 'strided': the array is not contiguous"):
            ck.protect("strided", a[::2])
        with pytest.raises(cairn.InvalidArgumentError, match="not contiguous"):
            ck.protect("column", np.zeros((4, 4))[:, 1])
        ro = np.zeros(3)
        ro.flags.writeable = False
        with pytest.raises(cairn.InvalidArgumentError, match="read-only"):
            ck.protect("ro", ro)
        with pytest.raises(cairn.InvalidArgumentError, match="dtype complex128 is not supported"):
            ck.protect("cplx", np.zeros(3, dtype=complex))
        with pytest.raises(cairn.InvalidArgumentError, match="a numpy array is needed"):
            ck.protect("list", [1.0, 2.0])
        # Nothing of that was registered: a checkpoint has nothing to capture.
        with pytest.raises(cairn.InvalidArgumentError) as e:
            ck.checkpoint("bad", 1)
        assert e.value.code == -1 and "cairn_checkpoint" in str(e.value)


def test_a_protected_array_cannot_be_resized_or_freed(store_env):
    a = np.arange(100, dtype=np.float64)
    with cairn.Checkpointer() as ck:
        ck.protect("a", a)
        with pytest.raises(ValueError):
            a.resize(1000)  # numpy refuses: the Checkpointer holds a reference
        del a  # the Checkpointer keeps it alive: the checkpoint reads valid memory
        ck.checkpoint("kept", 1)
        ck.wait("kept", 1)
    got = cairn.open(store_env / "store").region("py", "kept", 1, "a")
    assert np.array_equal(got, np.arange(100, dtype=np.float64))


def test_batch_system_calls(store_env, monkeypatch):
    """should_checkpoint and time_left, as cairn_should_checkpoint and
    cairn_time_left: a warning signal asks for a checkpoint once."""
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    with cairn.Checkpointer(config={"mode": "sync", "warning_signals": "USR1"}) as ck:
        assert ck.time_left() is None
        assert ck.should_checkpoint() is False
        x = np.arange(4.0)
        ck.protect("x", x)
        os.kill(os.getpid(), signal.SIGUSR1)  # counted by cairn's handler, the process goes on
        assert ck.should_checkpoint() is True
        ck.checkpoint("c", 1)
        assert ck.should_checkpoint() is False
    with cairn.Checkpointer(config={"mode": "sync", "deadline": "+100"}) as ck:
        left = ck.time_left()
        assert left is not None and 90 < left <= 100


def test_python_defaults_fit_a_training_job_and_yield_to_the_users_keys(store_env, monkeypatch):
    """Checkpointer.PYTHON_DEFAULTS (one staging slot, keep_local 1: about 3 S
    of memory beside a state of S) apply to a dict configuration or none; a
    key the user sets, in the dict or the environment, wins."""
    assert cairn.Checkpointer.PYTHON_DEFAULTS == {"staging_slots": 1, "keep_local": 1}
    monkeypatch.setenv("CAIRN_KEEP_LOCAL_AFTER_FINALIZE", "true")  # left to be counted
    x = np.arange(1 << 16, dtype=np.float64)

    def local_versions(run):
        d = store_env / "scratch" / "runs" / run / "c"
        return sorted(p.name for p in d.iterdir() if p.name.startswith("v")) if d.is_dir() else []

    for run, config, env, kept in [("defaults", None, None, 1), ("dict", {"keep_local": 2}, None, 2),
                                   ("environment", {}, "3", 3)]:
        monkeypatch.setenv("CAIRN_RUN", run)
        if env:
            monkeypatch.setenv("CAIRN_KEEP_LOCAL", env)
        with cairn.Checkpointer(config=config) as ck:
            assert ck.config_value("keep_local") == str(kept)  # as cairn_init resolved it
            assert ck.config_value("capture") == "copy"
            ck.protect("x", x)
            for v in range(1, 5):
                x += 1
                ck.checkpoint("c", v)
                ck.wait("c", v)
        assert len(local_versions(run)) == kept, (run, local_versions(run))
    # A TOML file keeps the core's defaults for the keys it does not set.
    toml = store_env / "cairn.toml"
    toml.write_text('capture = "cow"\n')
    monkeypatch.setenv("CAIRN_RUN", "file")
    with cairn.Checkpointer(config=str(toml)) as ck:
        assert (ck.config_value("capture"), ck.config_value("keep_local")) == ("cow", "3")
        assert ck.config_value("staging_slots") == "2"
        with pytest.raises(cairn.NotFoundError, match="no configuration key 'no_such_key'"):
            ck.config_value("no_such_key")


def test_exceptions_carry_the_c_message(store_env):
    with cairn.Checkpointer(config={"mode": "sync"}) as ck:
        with pytest.raises(cairn.NotFoundError) as e:
            ck.restart_test("nothing")
        assert e.value.code == -2 and "cairn_restart_test" in str(e.value) and "nothing" in str(e.value)
        assert ck.latest("nothing") is None
        x = np.zeros(4)
        ck.protect("x", x)
        ck.checkpoint("c", 5)
        with pytest.raises(cairn.InvalidArgumentError) as e:
            ck.checkpoint("c", 4)  # versions grow
        assert "version" in str(e.value)
    with pytest.raises(cairn.InvalidArgumentError, match="finalized"):
        ck.checkpoint("c", 6)
    with pytest.raises(cairn.InvalidArgumentError, match="no_such_key"):
        cairn.Checkpointer(config={"no_such_key": 1})


def test_an_earlier_failure_is_a_warning_and_the_version_is_taken(store_env, monkeypatch):
    """ENOSPC injected into version 2's persistent write (sync mode): that
    checkpoint raises NoSpaceError; the next one takes its version and warns
    (EarlierFailureWarning) once; the failed version keeps its error."""
    monkeypatch.setenv("CAIRN_FAULT_INJECT", "level=persistent,action=error,kind=write,errno=28,version=2")
    with cairn.Checkpointer(config={"mode": "thread", "local_enabled": False}) as ck:
        x = np.arange(8.0)
        ck.protect("x", x)
        ck.checkpoint("c", 1)
        ck.checkpoint("c", 2)
        with pytest.raises(cairn.NoSpaceError):
            ck.wait("c", 2)
        with pytest.warns(cairn.EarlierFailureWarning, match=r"version 3 was taken; an earlier version failed"):
            ck.checkpoint("c", 3)
        ck.wait("c", 3)
        assert ck.test("c", 3) & cairn.LEVEL_PERSISTENT
        with pytest.raises(cairn.NoSpaceError):
            ck.test("c", 2)
    assert cairn.open(os.environ["CAIRN_PERSISTENT"]).versions(os.environ["CAIRN_RUN"], "c") == [1, 3]


SCRIPT = """
import sys, numpy as np, cairn
with cairn.Checkpointer() as ck:
    x = np.zeros(4)
    ck.protect("x", x)
    v = ck.latest("state")
    if v is not None:
        ck.restart("state", v)
    print("restored", v, x[0] if v is not None else None)
    x[:] = float(sys.argv[1])
    ck.checkpoint("state", (v or 0) + 1)
"""


def test_two_scripts_with_one_checkpoint_name_never_restore_each_other(tmp_path):
    """The default run names the script and its directory: train.py in a/
    and in b/ (one store, one node-local directory, one checkpoint name) are
    two runs; python and python3 running a/train.py are one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(CAIRN_PERSISTENT=str(tmp_path / "store"), CAIRN_SCRATCH=str(tmp_path / "scratch"),
               PYTHONPATH=os.pathsep.join(sys.path))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for alias in ("python", "python3"):
        (bindir / alias).symlink_to(sys.executable)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "train.py").write_text(SCRIPT)

    def run(d, alias, value):
        r = subprocess.run([str(bindir / alias), "train.py", str(value)], cwd=tmp_path / d, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.split()[1:], r.stderr

    got, err = run("a", "python", 7)
    assert got == ["None", "None"]
    assert re.search(r"cairn: run 'train-[0-9a-f]{8}' \(the default", err), err
    got, _ = run("b", "python3", 9)
    assert got == ["None", "None"], "b/train.py restored a/train.py's state"
    got, _ = run("a", "python3", 8)
    assert got == ["1", "7.0"], "a/train.py run as python3 did not find its own checkpoint"
    assert len(list((tmp_path / "store" / "runs").iterdir())) == 2


def _kill_and_restart(tmp_path, cmd, env, nranks, seed):
    """Runs cmd, SIGKILLs it at a random moment after its first checkpoint,
    reruns it; returns (version restarted from, final grids)."""
    rng = random.Random(seed)
    out = tmp_path / "first.out"
    with open(out, "w") as f:
        p = subprocess.Popen(cmd + ["--sleep-ms", "20"], env=env, cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while "checkpoint version" not in out.read_text():
            assert p.poll() is None, f"seed {seed}: ended early\n{out.read_text()}"
            assert time.monotonic() < deadline, f"seed {seed}: no checkpoint\n{out.read_text()}"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.8))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=TIMEOUT_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert "done" not in out.read_text(), f"seed {seed}: the run ended before the kill"
    second = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert second.returncode == 0, f"seed {seed}\n{second.stdout}\n{second.stderr}"
    lines = [ln for ln in second.stdout.splitlines() if ln.startswith("restarted from version ")]
    assert len(lines) == 1, f"seed {seed}: not restarted\n{second.stdout}"
    return int(lines[0].rsplit(" ", 1)[1]), [(tmp_path / "out" / f"grid.{r}.bin").read_bytes() for r in range(nranks)]


# A single-process script's checkpoint and restart, bit for bit.
_ROUND_TRIP = ("import cairn, numpy as np\n"
               "a = np.arange(1000.0)\n"
               "with cairn.Checkpointer() as ck:\n"
               "    ck.protect('a', a)\n"
               "    ck.checkpoint('c', 1)\n"
               "    ck.wait('c', 1)\n"
               "    a[:] = 0\n"
               "    assert ck.restart('c') == 1 and a[999] == 999.0\n")


def test_a_script_without_data_planes_never_loads_libfabric(tmp_path):
    """libcairn loads libfabric when a data plane first needs it (agents,
    aggregated flush, redundancy; src/fabric/libfabric.hpp), not at load
    time: a script that checkpoints and restarts without them maps neither
    libfabric nor its providers, whose signal handlers (libpsm2) would turn
    an abort into exit status 1 and write backtrace files into its working
    directory."""
    code = (_ROUND_TRIP +
            "maps = open('/proc/self/maps').read()\n"
            "print('mapped:', sorted({l.split()[-1] for l in maps.splitlines()\n"
            "                         if 'libfabric' in l or 'psm' in l or 'libcairn' in l}))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("mapped:"))
    assert "libcairn" in line, line  # the check looks at the right process
    assert "libfabric" not in line and "psm" not in line, line


def test_a_script_runs_where_no_mpi_library_can_be_loaded(tmp_path):
    """libcairn does not link libmpi (cairn_init_mpi loads libcairn-mpi.so,
    which does: docs/design/mpi-plugin.md), so the same library, and the
    wheel that bundles it, works on a machine without MPI. Checked for real:
    in a mount namespace where every libmpi file is /dev/null, a script
    checkpoints and restarts, and cairn_init_mpi says what it cannot load."""
    lib = os.environ.get("PYCAIRN_LIBRARY") or cairn._clib.library_path()
    needed = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
    assert not re.search(r"NEEDED.*\[lib(mpi|open-pal|open-rte)", needed), needed
    if os.environ.get("CAIRN_TEST_MPI", "1") in ("0", "OFF", "FALSE", "false", ""):
        pytest.skip("built without MPI: no plugin to hide MPI from")
    plugin = Path(lib).resolve().parent / "libcairn-mpi.so"
    assert plugin.exists(), f"{plugin}: the MPI plugin is built beside libcairn"
    ldd = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    libmpi = sorted({os.path.realpath(m) for m in re.findall(r"=> (\S*libmpi\.so\S*)", ldd)})
    assert libmpi, ldd  # the plugin is what links MPI
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "true"]).returncode != 0:
        pytest.skip("needs root and mount namespaces to hide the MPI library")
    code = (_ROUND_TRIP +
            "import cffi\n"
            "ffi = cffi.FFI()\n"
            "ffi.cdef('int cairn_init_mpi(void *comm, const char *cfg, void **out); const char *cairn_last_error(void);')\n"
            f"lib = ffi.dlopen({str(lib)!r})\n"
            "out = ffi.new('void **')\n"
            "print('init_mpi:', lib.cairn_init_mpi(ffi.NULL, ffi.NULL, out), ffi.string(lib.cairn_last_error()).decode())\n")
    hide = "".join(f"mount --bind /dev/null {m} && " for m in libmpi)
    r = subprocess.run(["unshare", "--mount", "sh", "-c", f"{hide}exec {sys.executable} -c \"$0\"", code],
                       env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("init_mpi:"))
    assert line.startswith("init_mpi: -8 ") and "libcairn-mpi.so" in line and "CAIRN_MPI_PLUGIN" in line, line


def _env(root):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(CAIRN_PERSISTENT=str(root / "store"), CAIRN_SCRATCH=str(root / "scratch"), CAIRN_RUN="app",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1")
    env["PYTHONPATH"] = str(Path(cairn.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _reference(root, launcher, nranks):
    (root / "out").mkdir(parents=True)
    mpi = ["--mpi"] if launcher else []
    r = subprocess.run(launcher + [sys.executable, APP, *mpi, "--steps", "60", "--every", "1000", "--out", root / "out"],
                       env=_env(root), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0 and "starting from scratch" in r.stdout, r.stdout + r.stderr
    return [(root / "out" / f"grid.{k}.bin").read_bytes() for k in range(nranks)]


@pytest.mark.parametrize("trial", [0, 1])
def test_killed_python_app_restarts_bit_identical(trial, tmp_path):
    seed = int(os.environ.get("CAIRN_TEST_SEED", "13")) * 10 + trial
    want = _reference(tmp_path / "ref", [], 1)
    (tmp_path / "out").mkdir()
    cmd = [sys.executable, str(APP), "--steps", "60", "--every", "5", "--out", str(tmp_path / "out")]
    v, got = _kill_and_restart(tmp_path, cmd, _env(tmp_path), 1, seed)
    assert v >= 5 and v % 5 == 0
    assert got == want, f"seed {seed}: restarted from {v}, final grid differs from the uninterrupted run"


def test_killed_mpi4py_app_restarts_bit_identical(tmp_path):
    if os.environ.get("CAIRN_TEST_MPI", "1") in ("0", "OFF", "FALSE", "false", ""):
        pytest.skip("built without MPI")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/install-deps.sh installs it)")
    seed = int(os.environ.get("CAIRN_TEST_SEED", "13")) * 10 + 7
    launcher = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2"]
    want = _reference(tmp_path / "ref", launcher, 2)
    (tmp_path / "out").mkdir()
    cmd = launcher + [sys.executable, str(APP), "--mpi", "--steps", "60", "--every", "5", "--out",
                      str(tmp_path / "out")]
    v, got = _kill_and_restart(tmp_path, cmd, _env(tmp_path), 2, seed)
    assert v >= 5 and v % 5 == 0
    assert got == want, f"seed {seed}: restarted from {v}, final grids differ from the uninterrupted run"


BLOCK_APP = Path(__file__).resolve().parent / "block_app.py"


@pytest.mark.parametrize("old,new", [(1, 1), (2, 3)])
def test_protect_block_restores_on_another_rank_count(tmp_path, old, new):
    """Checkpointer.protect_block (a block with halo rows): written by `old`
    processes, restored by `new` (under mpirun with mpi4py when either is
    more than one); every block holds its global indices, halos untouched."""
    def launch(n, mode):
        if n == 1 and old == 1:
            cmd = [sys.executable, str(BLOCK_APP), mode]
        else:
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(n), sys.executable, str(BLOCK_APP),
                   mode, "--mpi"]
        return subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S)
    if old != new:
        if os.environ.get("CAIRN_TEST_MPI", "1") in ("0", "OFF", "FALSE", "false", ""):
            pytest.skip("built without MPI")
        pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/install-deps.sh installs it)")
    w = launch(old, "write")
    assert w.returncode == 0, w.stdout + w.stderr
    r = launch(new, "restart")
    assert r.returncode == 0, r.stdout + r.stderr
    # mpirun forwards the ranks' lines as they come: two may share a line.
    assert sorted(int(k) for k in re.findall(r"rank (\d+) ok", r.stdout)) == list(range(new)), r.stdout + r.stderr
