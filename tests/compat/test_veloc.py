"""The VELOC drop-in (compat/veloc): a heat solver written against veloc.h
(tests/compat/veloc_heat.c), built with nothing but -I and -l pointing at the
drop-in, checkpoints under mpirun, is SIGKILLed at a random moment, restarts,
and prints exactly what an uninterrupted run prints. Memory mode and file
mode, sync and async configurations; bad configuration files."""
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

import harness

NRANKS = 2
ARGS = ["60", "5", "64", "16"]  # iterations, checkpoint every, columns, rows per rank
SLEEP_US = "20000"             # per iteration in the killed run: about 1.2 s of work


def _env():
    env = harness.base_env()
    return env


def build(tmp_path_factory, name: str) -> Path:
    """A test program compiled as a VELOC application would be: mpicc, -I, -L, -lveloc-client."""
    inc = os.environ.get("CAIRN_TEST_VELOC_INCLUDE")
    lib = os.environ.get("CAIRN_TEST_VELOC_LIBDIR")
    if not inc or not lib:
        pytest.fail("CAIRN_TEST_VELOC_INCLUDE / CAIRN_TEST_VELOC_LIBDIR not set (ctest sets them)")
    out = tmp_path_factory.mktemp("bin") / name
    src = Path(__file__).resolve().parent / f"{name}.c"
    cmd = ["mpicc", "-O2", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(out), f"-L{lib}",
           f"-Wl,-rpath,{lib}", "-lveloc-client", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out


@pytest.fixture(scope="module")
def heat(tmp_path_factory) -> Path:
    return build(tmp_path_factory, "veloc_heat")


def write_config(root: Path, mode: str, **extra) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = [f"scratch = {root / 'scratch'}", f"persistent = {root / 'persistent'}", f"mode = {mode}",
             "max_versions = 3", "scratch_versions = 2"]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    cfg = root / "veloc.cfg"
    cfg.write_text("# VELOC configuration\n" + "\n".join(lines) + "\n")
    return cfg


def command(heat: Path, io: str, cfg: Path, sleep_us: str = "0", nranks: int = NRANKS) -> list:
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(nranks), str(heat), io, str(cfg),
            *ARGS, sleep_us]


def run(cmd, cwd: Path) -> harness.Result:
    return harness.run_process(cmd, _env(), cwd)


def lines(out: str, prefix: str) -> list:
    return [l for l in out.splitlines() if l.startswith(prefix)]


def committed(store: Path) -> list:
    return sorted(store.glob("runs/*/heat/v*/MANIFEST"))


@pytest.mark.parametrize("io", ["mem", "file"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_run_restarts_to_the_uninterrupted_result(heat, tmp_path, io, mode):
    ref_root, job_root = tmp_path / "ref", tmp_path / "job"
    ref_cfg, job_cfg = write_config(ref_root, mode), write_config(job_root, mode)
    ref = run(command(heat, io, ref_cfg), ref_root)
    assert ref.rc == 0, ref.describe()
    assert lines(ref.stdout, "fresh start") and len(lines(ref.stdout, "result ")) == 1, ref.describe()

    p = harness.start_process(command(heat, io, job_cfg, SLEEP_US), _env(), job_root)
    deadline = time.monotonic() + harness.TIMEOUT_S
    while not committed(job_root / "persistent") and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert committed(job_root / "persistent"), "no version was committed before the kill"
    time.sleep(random.uniform(0.0, 0.8))  # a random moment of the run
    killed = harness.kill_job(p)  # every rank, by SIGKILL

    again = run(command(heat, io, job_cfg), job_root)
    assert again.rc == 0, again.describe()
    restarted = lines(again.stdout, "restart from ")
    assert len(restarted) == 1, f"no restart:\n{killed.describe()}\n{again.describe()}"
    v = int(restarted[0].split()[-1])
    assert v > 0 and v % 5 == 0
    # Every line printed after the restart is the uninterrupted run's.
    assert lines(again.stdout, "result ") == lines(ref.stdout, "result ")
    ref_steps = {int(l.split()[1]): l for l in lines(ref.stdout, "step ")}
    for l in lines(again.stdout, "step "):
        assert int(l.split()[1]) > v
        assert l == ref_steps[int(l.split()[1])]


@pytest.mark.parametrize("content,what", [
    ("scratch = {s}\npersistent = {p}\n", "required key 'mode'"),
    ("persistent = {p}\nmode = sync\n", "required key 'scratch'"),
    ("scratch = {s}\nmode = sync\n", "required key 'persistent'"),
    ("scratch = {s}\npersistent = {p}\nmode = fast\n", "mode = 'fast' is invalid"),
    ("scratch = {s}\npersistent = {p}\nmode = sync\nmax_versions = two\n", "max_versions = 'two'"),
    ("scratch = {s}\npersistent = {p}\nmode = sync\npersistent_interval = soon\n", "persistent_interval = 'soon'"),
])
def test_bad_config_is_an_error_return_with_a_message(heat, tmp_path, content, what):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text(content.format(s=tmp_path / "scratch", p=tmp_path / "persistent"))
    r = run(command(heat, "mem", cfg, nranks=1), tmp_path)
    # The application itself reports the failed VELOC_Init and exits with its
    # own code: VELOC_Init returned instead of exiting.
    assert r.rc == 2, r.describe()
    assert lines(r.stdout, "rank ") == ["rank 0: VELOC_Init failed"], r.describe()
    assert f"VELOC_Init: {cfg}" in r.stderr and what in r.stderr, r.describe()
    assert not (tmp_path / "persistent").exists() and not (tmp_path / "scratch").exists()


def test_unknown_keys_are_warned_about_not_fatal(heat, tmp_path):
    """As VELOC does: a key it does not know (or one cairn ignores) is a
    warning, and the application runs."""
    cfg = write_config(tmp_path, "sync", flush_rate=3, max_parallelism=4)
    r = run(command(heat, "mem", cfg), tmp_path)
    assert r.rc == 0 and lines(r.stdout, "result "), r.describe()
    assert "unknown key 'flush_rate' ignored" in r.stderr, r.describe()
    assert "max_parallelism: cairn's engine chooses its own threads" in r.stderr, r.describe()


def test_persistent_interval_in_seconds_and_minus_one(heat, tmp_path):
    """VELOC's persistent_interval: seconds between flushes (cairn flushes
    every checkpoint, and says so once), or -1: checkpoints stay in scratch,
    and a rerun restarts from there."""
    cfg = write_config(tmp_path / "s", "sync", persistent_interval=30)
    r = run(command(heat, "mem", cfg), tmp_path)
    assert r.rc == 0 and lines(r.stdout, "result "), r.describe()
    assert r.stderr.count("persistent_interval = 30 s: the cairn drop-in flushes every checkpoint") == 1, r.describe()
    assert committed(tmp_path / "s" / "persistent"), "nothing flushed"
    cfg = write_config(tmp_path / "m", "sync", persistent_interval=-1)
    r = run(command(heat, "mem", cfg), tmp_path)
    assert r.rc == 0 and lines(r.stdout, "result "), r.describe()
    assert not committed(tmp_path / "m" / "persistent"), "persistent_interval = -1 flushed a checkpoint"
    again = run(command(heat, "mem", cfg), tmp_path)
    assert again.rc == 0 and lines(again.stdout, "restart "), again.describe()


def test_missing_config_file_is_an_error_return(heat, tmp_path):
    r = run(command(heat, "mem", tmp_path / "nope.cfg"), tmp_path)
    assert r.rc == 2 and "cannot open configuration file" in r.stderr, r.describe()
    # Every rank got the error return (none is left waiting in a collective).
    assert sorted(lines(r.stdout, "rank ")) == [f"rank {i}: VELOC_Init failed" for i in range(NRANKS)], r.describe()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_api_edge_cases(tmp_path_factory, tmp_path, mode):
    """Failed checkpoints are not versions, bounded restart_test, Recover_size,
    selective recovery into a larger buffer, committed versions never replaced."""
    prog = build(tmp_path_factory, "veloc_api")
    cfg = write_config(tmp_path, mode)
    r = run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", str(prog), str(cfg)], tmp_path)
    assert r.rc == 0 and "FAIL" not in r.stdout, r.describe()
    assert len(lines(r.stdout, "ok ")) == 28, r.describe()
    # No version at or below a bound is "none", said by the return value alone.
    assert "cannot restore" not in r.stderr, r.describe()
    # The refusals said why on stderr.
    assert "the application reported failure" in r.stderr or "another rank reported failure" in r.stderr
    assert "EEXIST" in r.stderr or "already committed" in r.stderr or "never replaced" in r.stderr, r.describe()


@pytest.mark.parametrize("io", ["mem", "file"])
def test_two_jobs_of_one_user_on_one_node_do_not_mix(heat, tmp_path, io):
    """Two VELOC applications of one user run side by side on one node with
    one configuration (the same scratch and persistent directories), from
    two directories, on different problems; both are killed, and each rerun
    restarts from its own checkpoints to its own uninterrupted result."""
    sizes = {"a": "64", "b": "48"}  # columns: different states
    cfg = write_config(tmp_path / "shared", "async")

    def cmd(which, c, sleep_us="0"):
        args = list(ARGS)
        args[2] = sizes[which]
        return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(NRANKS), str(heat), io, str(c), *args,
                sleep_us]

    refs = {}
    for which in sizes:
        root = tmp_path / f"ref-{which}"
        r = run(cmd(which, write_config(root, "async")), root)
        assert r.rc == 0, r.describe()
        refs[which] = lines(r.stdout, "result ")
    assert refs["a"] != refs["b"]
    dirs = {w: tmp_path / w for w in sizes}
    for d in dirs.values():
        d.mkdir()
    procs = {w: harness.start_process(cmd(w, cfg, SLEEP_US), _env(), dirs[w]) for w in sizes}
    deadline = time.monotonic() + harness.TIMEOUT_S
    while len(committed(tmp_path / "shared" / "persistent")) < 2 * 2 and time.monotonic() < deadline and \
            all(p.poll() is None for p in procs.values()):
        time.sleep(0.02)
    for p in procs.values():
        harness.kill_job(p)
    runs = {m.parts[-4] for m in committed(tmp_path / "shared" / "persistent")}
    assert len(runs) == 2, f"the two applications share a run: {runs}"
    for which in sizes:
        again = run(cmd(which, cfg), dirs[which])
        assert again.rc == 0, again.describe()
        assert len(lines(again.stdout, "restart from ")) == 1, again.describe()
        assert lines(again.stdout, "result ") == refs[which], f"{which}: {again.describe()}"


@pytest.fixture(scope="module")
def cpp(tmp_path_factory) -> Path:
    """tests/compat/veloc_cpp.cpp, compiled as a VELOC C++ application would be:
    mpicxx, -I, -L, -lveloc-client."""
    inc, lib = os.environ["CAIRN_TEST_VELOC_INCLUDE"], os.environ["CAIRN_TEST_VELOC_LIBDIR"]
    out = tmp_path_factory.mktemp("cppbin") / "veloc_cpp"
    src = Path(__file__).resolve().parent / "veloc_cpp.cpp"
    cmd = ["mpicxx", "-std=c++17", "-O2", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(out), f"-L{lib}",
           f"-Wl,-rpath,{lib}", "-lveloc-client"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_cpp_api_restores_raw_and_serialized_regions_of_every_group(cpp, tmp_path, mode):
    """veloc.hpp: raw and serialized regions in named groups and the default
    group, an observer, checkpoint_wait; restored in the same process, and by
    the next process with the node-local level wiped."""
    cfg = write_config(tmp_path, mode)
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(NRANKS), str(cpp), str(cfg)]
    r = run(mpirun + ["first"], tmp_path)
    assert r.rc == 0 and "C++ test passed" in r.stdout and "FAIL" not in r.stdout, r.describe()
    assert "another rank's checkpoint (target_rank) is not provided" in r.stderr, r.describe()
    subprocess.run(["rm", "-rf", str(tmp_path / "scratch")], check=True)
    again = run(mpirun + ["again"], tmp_path)
    assert again.rc == 0 and "C++ test passed" in again.stdout and "FAIL" not in again.stdout, again.describe()


def test_ec_interval_protects_every_checkpoint_across_nodes_and_a_lost_node_is_rebuilt(heat, tmp_path):
    """VELOC's erasure coding (ec_interval = 0, its default) as cairn's XOR
    sets across failure domains: 4 ranks on 2 emulated nodes (each its own
    node id and scratch), nothing flushed (persistent_interval = -1); node 1's
    scratch is wiped as a lost node, and the rerun rebuilds its ranks'
    checkpoints from the parity on node 0 and ends with the uninterrupted
    result. On one node the same configuration runs without, said once."""
    ref_root, job_root = tmp_path / "ref", tmp_path / "job"
    ref = run(command(heat, "mem", write_config(ref_root, "async"), nranks=4), ref_root)
    assert ref.rc == 0, ref.describe()
    cfg = write_config(job_root, "async", ec_interval=0, persistent_interval=-1)

    def nodes():
        block = lambda n: ["-n", "2", "env", f"CAIRN_NODE_ID=node{n}", f"CAIRN_SCRATCH={job_root / f'scratch{n}'}",
                           str(heat), "mem", str(cfg), *ARGS, "0"]
        return ["mpirun", "--oversubscribe", "--bind-to", "none", *block(0), ":", *block(1)]

    first = run(nodes(), job_root)
    assert first.rc == 0 and lines(first.stdout, "fresh start"), first.describe()
    assert "is off for this job" not in first.stderr, first.describe()
    assert sorted(p.name for p in (job_root / "scratch1").rglob("redundancy.*")), "no parity on node 1"
    subprocess.run(["rm", "-rf", str(job_root / "scratch1")], check=True)
    again = run(nodes(), job_root)
    assert again.rc == 0 and lines(again.stdout, "restart from ") == ["restart from 60"], again.describe()
    for r in (2, 3):
        assert f"rank {r}: rebuilt the node-local shard of 'heat' version 60 from redundancy xor" in again.stderr, \
            again.describe()
    assert lines(again.stdout, "result ") == lines(ref.stdout, "result ")
    one = run(command(heat, "mem", write_config(tmp_path / "one", "async", ec_interval=0)), tmp_path)
    assert one.rc == 0 and one.stderr.count("redundancy = xor is off for this job") == 1, one.describe()
    off = run(command(heat, "mem", write_config(tmp_path / "off", "async", ec_interval=-1)), tmp_path)
    assert off.rc == 0 and "redundancy" not in off.stderr, off.describe()
