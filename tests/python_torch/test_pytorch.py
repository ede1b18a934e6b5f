"""cairn.pytorch (bindings/python/cairn/pytorch.py): a model's and an
optimizer's state dicts saved asynchronously and loaded back bit for bit,
nested and non-tensor values kept, bad input refused with a clear error, and
a training loop SIGKILLed at a random moment and restarted bit-identical,
without MPI and under mpirun with mpi4py.

Needs PyTorch: scripts/install-deps.sh installs it into .venv (CAIRN_SKIP_TORCH=1
leaves it out: the PyPI wheel for Linux brings several GB of CUDA libraries);
skipped, saying so, when `import torch` fails."""
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

try:
    import torch
except Exception as e:  # absent, or a wheel whose CUDA libraries are missing
    pytest.skip(f"PyTorch cannot be imported ({type(e).__name__}: {e}); pip install torch to test cairn.pytorch",
                allow_module_level=True)

import cairn  # noqa: E402
import cairn.pytorch  # noqa: E402

TRAIN = Path(__file__).resolve().parent / "train.py"
TIMEOUT_S = 180


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))


def _train(model, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 6, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def _same(a, b, path="state"):
    """a and b equal bit for bit (tensors: dtype, shape, bytes), with the same types."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        raw = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()  # noqa: E731
        assert raw(a) == raw(b), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), path


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, dict):
        out = type(v)((k, _clone(x)) for k, x in v.items())
        if hasattr(v, "_metadata"):
            out._metadata = v._metadata
        return out
    if isinstance(v, (list, tuple)):
        return type(v)(_clone(x) for x in v)
    return v


def test_state_dict_round_trip_is_bit_identical_and_async(store_env):
    model = _model(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    _train(model, opt, 3)
    extra = {"epoch": 4, "name": "run-α", "none": None, "flag": True, "nan": float("nan"), "tuple": (1, 2.5, "x"),
             "by_int": {0: "zero", 7: [1, 2]}, "nested": {"a": {"b": [torch.arange(5, dtype=torch.int16)]}},
             "bf16": torch.linspace(0, 1, 9, dtype=torch.bfloat16), "f16": torch.ones(2, 2, dtype=torch.float16),
             "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(3.25, dtype=torch.float64),
             "empty": torch.zeros(0, 4), "strided": torch.arange(24.).reshape(4, 6)[:, ::2],
             "rng": torch.get_rng_state()}
    state = cairn.pytorch.training_state(model, opt, **extra)
    want = _clone(state)
    with cairn.Checkpointer(config={"mode": "thread"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "train")
        assert saver.load() is None
        saver.prepare(state)  # staging made ahead: the save below is the first of the execution
        saver.save(state, 3)
        # The save returned after the capture: the training step may change
        # the parameters and the optimizer state at once.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1000.0)
        _train(model, opt, 2)
        saver.wait(3)
        got = saver.load()
        assert ck.latest("train") == 3
    _same(want, got)
    # Into a fresh model and optimizer: the same parameters, and training
    # continues identically.
    m2 = _model(99)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, betas=(0.8, 0.95))
    assert cairn.pytorch.restore_training(got, m2, o2)["epoch"] == 4
    m3 = _model(1)
    o3 = torch.optim.AdamW(m3.parameters(), lr=1e-2, betas=(0.8, 0.95))
    _train(m3, o3, 3)
    _train(m2, o2, 5, seed=5)
    _train(m3, o3, 5, seed=5)
    for a, b in zip(m2.parameters(), m3.parameters()):
        assert torch.equal(a, b)


def test_first_save_without_prepare_is_copied_in_the_background_and_holds_its_state(store_env, tmp_path):
    """With capture = copy_or_cow the first save of an execution, which has
    no staging slot yet, write-protects the state and copies it in the
    background; the training step right after writes every parameter and
    Adam moment, and the version still holds the state of its save. The
    second save finds its slot and copies. Both load bit for bit."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])  # 12 MiB with Adam's moments
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 512)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step()
    want = {}
    metrics = tmp_path / "metrics"
    with cairn.Checkpointer(config={"metrics_dir": str(metrics), "capture": "copy_or_cow"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "train")
        for v in (1, 2):
            state = cairn.pytorch.training_state(model, opt)
            want[v] = _clone(state)
            saver.save(state, v)
            with torch.no_grad():  # rewrites every block at once, as early as it can
                for p in model.parameters():
                    p.mul_(-3.0)
            step()
        saver.wait(2)
        for v in (1, 2):
            _same(want[v], saver.load(v))
    prom = "".join(p.read_text() for p in metrics.glob("*.prom"))
    if "cairn_captures_copy_on_write" in prom:  # absent where userfaultfd is not available
        assert re.search(r"cairn_captures_copy_on_write_total\{[^}]*\} 1\n", prom), prom


def test_pinned_tensors_need_a_capture_that_copies_before_save_returns(store_env, monkeypatch):
    """A GPU writes pinned memory by DMA, which write protection does not
    see: with a capture that may copy after save() returned, a state holding
    a pinned tensor is refused with what to do; with capture = copy it is
    saved. (is_pinned is patched: pinned memory needs CUDA.)"""
    model = _model(4)
    pinned = model[0].weight
    real = torch.Tensor.is_pinned
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: t is pinned or real(t))
    with cairn.Checkpointer(config={"mode": "thread", "capture": "copy_or_cow"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "s")
        with pytest.raises(cairn.InvalidArgumentError,
                           match=r"state\['0.weight'\]: tensor in pinned .*capture = copy_or_cow.*'capture': 'copy'"):
            saver.save(model.state_dict(keep_vars=True), 1)
    with cairn.Checkpointer(config={"mode": "thread"}) as ck:  # the default copies
        saver = cairn.pytorch.StateSaver(ck, "s")
        saver.save(model.state_dict(keep_vars=True), 1)
        saver.wait(1)
        _same(_clone(model.state_dict()), saver.load(1))


def test_numpy_and_python_random_states_and_scalars_keep_their_types(store_env):
    """What training scripts save beside tensors: np.random.get_state(), a
    Generator's state, random.getstate(), numpy arrays and numpy scalars
    (np.float64 comes back as np.float64, not float)."""
    np.random.seed(7)
    gen = np.random.default_rng(11)
    random.seed(3)
    state = {"np_rng": np.random.get_state(), "gen": gen.bit_generator.state, "py_rng": random.getstate(),
             "scalars": [np.float64(0.1), np.float32(2.5), np.int64(-3), np.uint8(200), np.bool_(True),
                         np.complex128(1 - 2j), np.float16(0.333)],
             "arrays": {"f": np.arange(6.0).reshape(2, 3), "fortran": np.asfortranarray(np.ones((3, 2))),
                        "b": np.array([True, False]), "c": np.array([1 + 1j]), "empty": np.zeros((0, 2), np.int32)}}
    want = _clone(state)
    with cairn.Checkpointer(config={"mode": "sync"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "np")
        saver.save(state, 1)
        got = saver.load()
    _same(want, got)
    # The restored generators continue where the saved ones were.
    expect_np, expect_py, expect_gen = np.random.rand(3), random.random(), gen.random(2)
    np.random.set_state(got["np_rng"])
    random.setstate(got["py_rng"])
    g2 = np.random.default_rng()
    g2.bit_generator.state = got["gen"]
    assert np.array_equal(np.random.rand(3), expect_np) and random.random() == expect_py
    assert np.array_equal(g2.random(2), expect_gen)


def test_saving_a_version_twice_skips_with_a_warning_or_raises(store_env):
    """A step checkpoint and an end-of-epoch save of the same step: the second
    is skipped with a warning (the default) and the training goes on; with
    if_saved="error" it raises."""
    with cairn.Checkpointer(config={"mode": "sync"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "twice")
        assert saver.save({"w": torch.ones(3)}, 5) is True
        with pytest.warns(RuntimeWarning, match="version 5 was saved already"):
            assert saver.save({"w": torch.zeros(3)}, 5) is False
        with pytest.raises(cairn.InvalidArgumentError, match="version 5 was saved already"):
            saver.save({"w": torch.zeros(3)}, 4, if_saved="error")
        assert saver.save({"w": torch.full((3,), 2.0)}, 6) is True
        assert saver.latest() == 6
        assert torch.equal(saver.load(5)["w"], torch.ones(3))


def test_unsupported_input_is_refused_and_nothing_is_lost(store_env):
    model = _model(2)
    with cairn.Checkpointer(config={"mode": "sync"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "s")
        saver.save({"model": model.state_dict()}, 1)
        with pytest.raises(cairn.InvalidArgumentError, match=r"state\['w'\]: tensor on device 'meta'.*to the CPU"):
            saver.save({"w": torch.empty(3, device="meta")}, 2)
        with pytest.raises(cairn.InvalidArgumentError, match=r"state\['sp'\]: tensor of layout torch.sparse_coo"):
            saver.save({"sp": torch.eye(3).to_sparse()}, 2)
        with pytest.raises(cairn.InvalidArgumentError, match=r"state\['obj'\]: a value of type set cannot be saved"):
            saver.save({"obj": {1, 2}}, 2)
        with pytest.raises(cairn.InvalidArgumentError, match="key .* of type tuple"):
            saver.save({(1, 2): 3}, 2)
        # Version 1 is intact and still the newest.
        assert saver.latest() == 1
        got = saver.load()
    _same({"model": model.state_dict()}, got)
    assert got["model"]._metadata == model.state_dict()._metadata  # module versions kept


def test_load_of_a_version_not_saved_by_the_helper_says_so(store_env):
    a = np.arange(4.0)
    with cairn.Checkpointer(config={"mode": "sync"}) as ck:
        ck.protect("a", a)
        ck.checkpoint("plain", 1)
        ck.unprotect("a")
        with pytest.raises(cairn.NotFoundError, match="not saved by cairn.pytorch"):
            cairn.pytorch.StateSaver(ck, "plain").load(1)


def test_read_only_load_from_the_store_names_tensors_by_their_keys(store_env):
    """cairn.pytorch.load reads a saved state from the store alone (no
    Checkpointer, no execution recorded in the run), bit for bit; the store
    reader and `cairn show` name each tensor region by its key."""
    model = _model(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, 2)
    state = cairn.pytorch.training_state(model, opt, step=2, rng=np.random.get_state())
    want = _clone(state)
    with cairn.Checkpointer(config={"mode": "sync"}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "train")
        saver.save(state, 2)
        saver.save({"w": torch.zeros(2)}, 3)
    store = cairn.open(store_env / "store")
    executions = len(store.run_info("py")["executions"])
    _same(want, cairn.pytorch.load(store, "py", "train", 2))
    _same({"w": torch.zeros(2)}, cairn.pytorch.load(str(store_env / "store"), "py", "train"))  # the newest
    assert len(store.run_info("py")["executions"]) == executions  # nothing recorded
    keys = store.region_keys("py", "train", 2)
    assert keys["t000000"] == "model.0.weight" and keys["t000003"] == "model.2.bias"
    assert "optimizer.state.0.momentum_buffer" in keys.values()
    with pytest.raises(cairn.NotFoundError, match=r"no committed version 9 of checkpoint 'train' \(versions 2, 3\)"):
        cairn.pytorch.load(store, "py", "train", 9)
    with pytest.raises(cairn.NotFoundError, match=r"checkpoint 'nope' \(checkpoints train\)"):
        cairn.pytorch.load(store, "py", "nope")
    cli = os.environ.get("PYCAIRN_CLI")
    if cli:
        out = subprocess.run([cli, "show", str(store_env / "store"), "py", "train", "2"], check=True,
                             capture_output=True, text=True).stdout
        assert "model.0.weight (t000000)" in out, out
        js = subprocess.run([cli, "show", "--json", str(store_env / "store"), "py", "train", "2"], check=True,
                            capture_output=True, text=True).stdout
        assert '"key":"model.2.bias"' in js.replace(" ", ""), js


# ---- kill and restart -----------------------------------------------------------

def _env(root):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(CAIRN_PERSISTENT=str(root / "store"), CAIRN_SCRATCH=str(root / "scratch"), CAIRN_RUN="train",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1",
               OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(Path(cairn.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _outputs(root, nranks):
    return [(root / "out" / f"params.{r}.bin").read_bytes() for r in range(nranks)]


def _kill_and_restart(root, launcher, nranks, seed):
    mpi = ["--mpi"] if launcher else []
    ref = root / "ref"
    (ref / "out").mkdir(parents=True)
    r = subprocess.run(launcher + [sys.executable, str(TRAIN), *mpi, "--steps", "60", "--every", "1000",
                                   "--out", str(ref / "out")],
                       env=_env(ref), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0 and "starting from scratch" in r.stdout, r.stdout + r.stderr
    want = _outputs(ref, nranks)
    (root / "out").mkdir()
    cmd = launcher + [sys.executable, str(TRAIN), *mpi, "--steps", "60", "--every", "5", "--out", str(root / "out")]
    out = root / "first.out"
    rng = random.Random(seed)
    with open(out, "w") as f:
        p = subprocess.Popen(cmd + ["--sleep-ms", "20"], env=_env(root), cwd=root, stdout=f, stderr=subprocess.STDOUT,
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
    second = subprocess.run(cmd, env=_env(root), cwd=root, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert second.returncode == 0, f"seed {seed}\n{second.stdout}\n{second.stderr}"
    lines = [ln for ln in second.stdout.splitlines() if ln.startswith("restarted from version ")]
    assert len(lines) == 1, f"seed {seed}: not restarted\n{second.stdout}"
    v = int(lines[0].rsplit(" ", 1)[1])
    assert v >= 5 and v % 5 == 0
    assert _outputs(root, nranks) == want, f"seed {seed}: restarted from {v}, parameters differ from the straight run"


def test_killed_training_restarts_bit_identical(tmp_path):
    _kill_and_restart(tmp_path, [], 1, int(os.environ.get("CAIRN_TEST_SEED", "13")) * 10 + 3)


def test_killed_mpi4py_training_restarts_bit_identical(tmp_path):
    if os.environ.get("CAIRN_TEST_MPI", "1") in ("0", "OFF", "FALSE", "false", ""):
        pytest.skip("built without MPI")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/install-deps.sh installs it)")
    launcher = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2"]
    _kill_and_restart(tmp_path, launcher, 2, int(os.environ.get("CAIRN_TEST_SEED", "13")) * 10 + 9)
