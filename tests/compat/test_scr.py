"""The SCR drop-in (compat/scr): a heat solver written against scr.h in the
style of SCR's test_api.c (tests/compat/scr_heat.c), built with nothing but
-I and -l pointing at the drop-in, checkpoints when SCR_Need_checkpoint says
so, is SIGKILLed at a random moment, restarts, and prints exactly what an
uninterrupted run prints."""
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

import harness

NRANKS = 2
ARGS = ["60", "64", "16"]  # iterations, columns, rows per rank


@pytest.fixture(scope="module")
def heat(tmp_path_factory) -> Path:
    inc = os.environ.get("CAIRN_TEST_SCR_INCLUDE")
    lib = os.environ.get("CAIRN_TEST_SCR_LIBDIR")
    if not inc or not lib:
        pytest.fail("CAIRN_TEST_SCR_INCLUDE / CAIRN_TEST_SCR_LIBDIR not set (ctest sets them)")
    out = tmp_path_factory.mktemp("bin") / "scr_heat"
    src = Path(__file__).resolve().parent / "scr_heat.c"
    cmd = ["mpicc", "-O2", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(out), f"-L{lib}",
           f"-Wl,-rpath,{lib}", "-lscr", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out


@pytest.fixture(scope="module")
def scr_api(tmp_path_factory) -> Path:
    """tests/compat/scr_api.c: SCR's test_api.c scenarios (file per rank or --shared-file)."""
    out = tmp_path_factory.mktemp("api") / "scr_api"
    src = Path(__file__).resolve().parent / "scr_api.c"
    inc, lib = os.environ["CAIRN_TEST_SCR_INCLUDE"], os.environ["CAIRN_TEST_SCR_LIBDIR"]
    cmd = ["mpicc", "-O2", "-Wall", "-Werror", f"-I{inc}", str(src), "-o", str(out), f"-L{lib}",
           f"-Wl,-rpath,{lib}", "-lscr"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out


def env(root: Path, **scr) -> dict:
    e = harness.base_env()
    e = {k: v for k, v in e.items() if not k.startswith("SCR_")}
    e.update({"SCR_PREFIX": str(root / "prefix"), "SCR_CACHE_BASE": str(root / "cache")})
    e.update({k: str(v) for k, v in scr.items()})
    return e


def command(heat: Path, sleep_us: str = "0", iterations: str = ARGS[0]) -> list:
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(NRANKS), str(heat), iterations, *ARGS[1:],
            sleep_us]


def lines(out: str, prefix: str) -> list:
    return [l for l in out.splitlines() if l.startswith(prefix)]


def test_need_checkpoint_follows_the_configured_interval(heat, tmp_path):
    r = harness.run_process(command(heat), env(tmp_path, SCR_CHECKPOINT_INTERVAL=7), tmp_path)
    assert r.rc == 0, r.describe()
    assert lines(r.stdout, "checkpoint ") == [f"checkpoint ckpt.{s}" for s in range(7, 61, 7)], r.describe()


def test_a_rerun_that_does_not_restart_numbers_its_datasets_above_the_committed_ones(heat, tmp_path):
    """SCR's test_ckpt: a program run twice without restarting. Its second
    execution's datasets get ids above the first's (as SCR's do: above the
    highest in the prefix's index) instead of "already committed", and a
    third execution restarts from the second's newest."""
    e = env(tmp_path, SCR_CHECKPOINT_INTERVAL=20, SCR_HEAT_NO_RESTART=1)
    for _ in range(2):
        r = harness.run_process(command(heat), e, tmp_path)
        assert r.rc == 0, r.describe()
        assert lines(r.stdout, "checkpoint ") == ["checkpoint ckpt.20", "checkpoint ckpt.40", "checkpoint ckpt.60"], \
            r.describe()
    versions = sorted(p.name for p in (tmp_path / "prefix" / ".scr" / "cairn" / "runs").glob("*/scr/v*"))
    assert versions == [f"v{v:012d}" for v in range(1, 7)], versions
    del e["SCR_HEAT_NO_RESTART"]
    r = harness.run_process(command(heat), e, tmp_path)
    assert r.rc == 0 and "restart from ckpt.60 step 60" in r.stdout, r.describe()


def test_flush_0_keeps_datasets_in_the_cache_and_a_rerun_restarts_from_it(heat, tmp_path):
    """SCR_FLUSH=0 (SCR's TESTING.sh): no dataset is copied to the prefix,
    and the rerun restarts from the cache (SCR_CACHE_BASE)."""
    e = env(tmp_path, SCR_CHECKPOINT_INTERVAL=20, SCR_FLUSH=0)
    r = harness.run_process(command(heat), e, tmp_path)
    assert r.rc == 0, r.describe()
    assert lines(r.stdout, "checkpoint ") == ["checkpoint ckpt.20", "checkpoint ckpt.40", "checkpoint ckpt.60"], \
        r.describe()
    assert not list((tmp_path / "prefix").rglob("MANIFEST")), "SCR_FLUSH=0 copied a dataset to the prefix"
    assert list((tmp_path / "cache").rglob("shard.*")), "the cache holds no dataset"
    r = harness.run_process(command(heat), e, tmp_path)
    assert r.rc == 0 and "restart from ckpt.60 step 60" in r.stdout, r.describe()


def test_scr3_configf_links_and_drop_delete_say_they_are_not_provided(heat, tmp_path):
    """SCR 3's SCR_Configf sets a parameter; SCR_Drop and SCR_Delete link and
    fail with a message that says what to do instead."""
    r = harness.run_process(command(heat), env(tmp_path, SCR_HEAT_INTERVAL=30, SCR_HEAT_DELETE="ckpt.30"), tmp_path)
    assert r.rc == 0, r.describe()
    assert lines(r.stdout, "checkpoint ") == ["checkpoint ckpt.30", "checkpoint ckpt.60"], r.describe()
    assert "delete failed drop failed" in r.stdout, r.describe()
    assert "deleting datasets is not provided by the cairn drop-in" in r.stderr, r.describe()


def test_killed_run_restarts_to_the_uninterrupted_result(heat, tmp_path):
    ref_root, job_root = tmp_path / "ref", tmp_path / "job"
    ref_root.mkdir()
    job_root.mkdir()
    ref = harness.run_process(command(heat), env(ref_root, SCR_CHECKPOINT_INTERVAL=5), ref_root)
    assert ref.rc == 0 and lines(ref.stdout, "fresh start"), ref.describe()

    p = harness.start_process(command(heat, "20000"), env(job_root, SCR_CHECKPOINT_INTERVAL=5), job_root)
    store = job_root / "prefix" / ".scr" / "cairn"
    deadline = time.monotonic() + harness.TIMEOUT_S
    while not list(store.glob("runs/*/scr/v*/MANIFEST")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(store.glob("runs/*/scr/v*/MANIFEST")), "no dataset was committed before the kill"
    time.sleep(random.uniform(0.0, 0.8))
    harness.kill_job(p)  # every rank, by SIGKILL

    again = harness.run_process(command(heat), env(job_root, SCR_CHECKPOINT_INTERVAL=5), job_root)
    assert again.rc == 0, again.describe()
    restarted = lines(again.stdout, "restart from ")
    assert len(restarted) == 1, again.describe()
    name, step = restarted[0].split()[2], int(restarted[0].split()[-1])
    assert name == f"ckpt.{step}" and step > 0
    assert lines(again.stdout, "result ") == lines(ref.stdout, "result ")
    # The interval counts from the restart: the same checkpoints as the
    # uninterrupted run after it.
    assert lines(again.stdout, "checkpoint ") == [l for l in lines(ref.stdout, "checkpoint ")
                                                  if int(l.split(".")[-1]) > step]


def test_should_exit_reports_the_halt_file(heat, tmp_path):
    (tmp_path / "prefix" / ".scr").mkdir(parents=True)
    (tmp_path / "prefix" / ".scr" / "halt").write_text("")
    r = harness.run_process(command(heat), env(tmp_path, SCR_CHECKPOINT_INTERVAL=5), tmp_path)
    assert r.rc == 0 and lines(r.stdout, "asked to exit at step 1"), r.describe()
    assert lines(r.stdout, "result iterations 1 "), r.describe()


def test_failed_restart_falls_back_to_the_previous_dataset(heat, tmp_path):
    """A rank that cannot read the newest dataset: SCR_Complete_restart fails on
    every rank, SCR_Have_restart offers the previous one, and the run goes on
    from it to the uninterrupted result (its new datasets numbered above the
    rejected one, which stays committed)."""
    ref_root, job_root = tmp_path / "ref", tmp_path / "job"
    ref_root.mkdir()
    job_root.mkdir()
    ref = harness.run_process(command(heat, iterations="80"), env(ref_root, SCR_CHECKPOINT_INTERVAL=5), ref_root)
    assert ref.rc == 0, ref.describe()
    first = harness.run_process(command(heat), env(job_root, SCR_CHECKPOINT_INTERVAL=5), job_root)
    assert first.rc == 0 and lines(first.stdout, "checkpoint ckpt.60"), first.describe()
    again = harness.run_process(command(heat, iterations="80"),
                                env(job_root, SCR_CHECKPOINT_INTERVAL=5, SCR_HEAT_REJECT=1), job_root)
    assert again.rc == 0, again.describe()
    assert lines(again.stdout, "rejecting ") == ["rejecting ckpt.60"], again.describe()
    assert lines(again.stdout, "restart from ") == ["restart from ckpt.55 step 55"], again.describe()
    assert lines(again.stdout, "result ") == lines(ref.stdout, "result ")
    assert lines(again.stdout, "checkpoint ") == [l for l in lines(ref.stdout, "checkpoint ")
                                                  if int(l.split(".")[-1]) > 55]


@pytest.fixture(scope="module")
def fortran_ckpt(tmp_path_factory) -> Path:
    """tests/compat/scr_ckpt.f90, built with mpif90 and only -I/-l flags
    pointing at the drop-in (INCLUDE 'scrf.h', -lscrf -lscr)."""
    if os.environ.get("CAIRN_TEST_SCR_FORTRAN") != "1":
        pytest.fail("CAIRN_TEST_SCR_FORTRAN is not 1: the build has no Fortran (ctest sets it when it has)")
    inc, lib = os.environ["CAIRN_TEST_SCR_INCLUDE"], os.environ["CAIRN_TEST_SCR_LIBDIR"]
    out = tmp_path_factory.mktemp("fbin") / "scr_ckpt"
    src = Path(__file__).resolve().parent / "scr_ckpt.f90"
    cmd = ["mpif90", "-O2", "-Wall", f"-I{inc}", str(src), "-o", str(out), f"-L{lib}", f"-Wl,-rpath,{lib}",
           "-lscrf", "-lscr"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out


def test_a_fortran_application_checkpoints_and_restarts_from_the_prefix(fortran_ckpt, tmp_path):
    """SCR's Fortran interface: three datasets, then, with the cache wiped as
    after a lost node, a rerun restarts from the newest in the prefix, reads
    back every value it wrote, and numbers its datasets on from there."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(NRANKS), str(fortran_ckpt), "3"]
    first = harness.run_process(cmd, env(tmp_path), tmp_path)
    assert first.rc == 0 and lines(first.stdout, "no restart"), first.describe()
    assert lines(first.stdout, "checkpoint ") == [f"checkpoint ckpt_{i:05d}" for i in (1, 2, 3)], first.describe()
    assert lines(first.stdout, "errors ") == ["errors 0"], first.describe()
    subprocess.run(["rm", "-rf", str(tmp_path / "cache")], check=True)  # SCR_CACHE_BASE: the node-local level
    again = harness.run_process(cmd, env(tmp_path), tmp_path)
    assert again.rc == 0, again.describe()
    assert lines(again.stdout, "restarted from ") == ["restarted from ckpt_00003"], again.describe()
    assert lines(again.stdout, "errors ") == ["errors 0"], again.describe()
    assert lines(again.stdout, "checkpoint ") == [f"checkpoint ckpt_{i:05d}" for i in (4, 5, 6)], again.describe()


def api(scr_api: Path, nranks: int, times: int, *extra: str, node: Path = None) -> list:
    wrap = [str(node)] if node else []
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(nranks), *wrap, str(scr_api), str(times),
            "300000", *extra]


@pytest.mark.parametrize("nranks,layout", [(2, "--shared-file"), (4, "--shared-file"), (4, "--file-per-process")])
def test_test_api_restarts_from_the_cache_and_with_it_wiped_from_the_prefix(scr_api, tmp_path, nranks, layout):
    """SCR's test_api and test_api_shared_file (one file that every rank
    writes at its offset): three datasets; a rerun restarts from the newest
    in the cache, and, with the cache wiped as after a lost node, the next
    from the newest in the prefix; every byte read back is checked."""
    e = env(tmp_path)
    first = harness.run_process(api(scr_api, nranks, 3, layout), e, tmp_path)
    assert first.rc == 0 and lines(first.stdout, "no restart"), first.describe()
    assert lines(first.stdout, "checkpoint ") == ["checkpoint ckpt.0", "checkpoint ckpt.1", "checkpoint ckpt.2"], \
        first.describe()
    again = harness.run_process(api(scr_api, nranks, 2, layout), e, tmp_path)
    assert again.rc == 0 and lines(again.stdout, "restart from ") == ["restart from ckpt.2 timestep 2"], \
        again.describe()
    subprocess.run(["rm", "-rf", str(tmp_path / "cache")], check=True)
    third = harness.run_process(api(scr_api, nranks, 1, layout), e, tmp_path)
    assert third.rc == 0 and lines(third.stdout, "restart from ") == ["restart from ckpt.4 timestep 4"], \
        third.describe()
    for r in (first, again, third):
        assert lines(r.stdout, "errors ") == ["errors 0"], r.describe()


NODE = """#!/bin/sh
# Emulated nodes of 2 consecutive ranks: each has its own cache; with
# NODE_PRIVATE=1 a private one (a tmpfs in a mount namespace of the rank's
# own, empty at start), which no other node sees.
c=$CACHE_ROOT/node$((OMPI_COMM_WORLD_RANK / 2))
mkdir -p "$c"
if [ "$NODE_PRIVATE" = 1 ]; then
  exec unshare -m --propagation private sh -c 'mount -t tmpfs none "$0" && SCR_CACHE_BASE="$0" exec "$@"' "$c" "$@"
fi
SCR_CACHE_BASE=$c exec "$@"
"""


def test_a_shared_file_across_nodes_needs_the_bypass_and_restarts_where_no_node_sees_another(scr_api, tmp_path):
    """A shared file written by ranks on two nodes: with the node-local cache
    (each node writes its own file) the dataset fails on every rank with a
    message that says to set SCR_CACHE_BYPASS=1; with it, the file is one
    file under the prefix and is kept. A restart on nodes that see nothing of
    each other's storage (private mounts) gets the file from the rank that
    kept it and reads back every byte."""
    node = tmp_path / "node.sh"
    node.write_text(NODE)
    node.chmod(0o755)
    e = env(tmp_path, CACHE_ROOT=tmp_path / "cache")
    cached = harness.run_process(api(scr_api, 4, 1, "--shared-file", node=node), e, tmp_path)
    assert lines(cached.stdout, "checkpoint ") == ["checkpoint ckpt.0 failed"], cached.describe()
    assert "set SCR_CACHE_BYPASS=1" in cached.stderr, cached.describe()
    e["SCR_CACHE_BYPASS"] = "1"
    bypass = harness.run_process(api(scr_api, 4, 2, "--shared-file", node=node), e, tmp_path)
    assert bypass.rc == 0 and lines(bypass.stdout, "checkpoint ") == ["checkpoint ckpt.0", "checkpoint ckpt.1"], \
        bypass.describe()
    assert lines(bypass.stdout, "errors ") == ["errors 0"], bypass.describe()
    assert sorted(p.name for p in (tmp_path / "prefix" / ".scr").iterdir()) == ["cairn"], \
        "the bypass left routed files under the prefix"
    e["NODE_PRIVATE"] = "1"
    again = harness.run_process(api(scr_api, 4, 1, "--shared-file", node=node), e, tmp_path)
    assert again.rc == 0 and lines(again.stdout, "restart from ") == ["restart from ckpt.1 timestep 1"], \
        again.describe()
    assert lines(again.stdout, "errors ") == ["errors 0"], again.describe()


def on_nodes(scr_api: Path, root: Path, times: int) -> list:
    """4 ranks on 2 emulated nodes (MPMD blocks): each node its own node id and cache."""
    block = lambda n: ["-n", "2", "env", f"CAIRN_NODE_ID=node{n}", f"SCR_CACHE_BASE={root / f'cache{n}'}",
                       str(scr_api), str(times), "300000"]
    return ["mpirun", "--oversubscribe", "--bind-to", "none", *block(0), ":", *block(1)]


@pytest.mark.parametrize("how", ["copy_type", "descriptors"])
def test_redundancy_descriptors_rebuild_a_lost_node(scr_api, tmp_path, how):
    """SCR's redundancy as cairn's sets across nodes, nothing flushed to the
    prefix (SCR_FLUSH=0): SCR_COPY_TYPE=XOR protects every dataset; with
    SCR_COPY_TYPE=FILE, descriptors in SCR_CONF_FILE (SINGLE every dataset,
    PARTNER every 2nd) protect the even ones. Node 1's cache is wiped, and the
    rerun rebuilds its ranks' files of the newest protected dataset from the
    other node and reads back every byte."""
    e = env(tmp_path, SCR_FLUSH=0, SCR_CACHE_SIZE=3)
    if how == "copy_type":
        e["SCR_COPY_TYPE"] = "XOR"
        scheme, newest = "xor", "ckpt.2"
    else:
        conf = tmp_path / "scr.conf"
        conf.write_text("# SCR's descriptors\nSCR_COPY_TYPE=FILE\n"
                        "CKPT=0 INTERVAL=1 GROUP=NODE TYPE=SINGLE\nCKPT=1 INTERVAL=2 GROUP=NODE TYPE=PARTNER\n")
        e["SCR_CONF_FILE"] = str(conf)
        scheme, newest = "partner", "ckpt.1"  # dataset ids 1, 2, 3: only 2 (ckpt.1) is protected
    first = harness.run_process(on_nodes(scr_api, tmp_path, 3), e, tmp_path)
    assert first.rc == 0 and lines(first.stdout, "checkpoint ") == ["checkpoint ckpt.0", "checkpoint ckpt.1",
                                                                     "checkpoint ckpt.2"], first.describe()
    assert "is off for this job" not in first.stderr and "warning" not in first.stderr, first.describe()
    subprocess.run(["rm", "-rf", str(tmp_path / "cache1")], check=True)
    again = harness.run_process(on_nodes(scr_api, tmp_path, 1), e, tmp_path)
    assert again.rc == 0, again.describe()
    assert lines(again.stdout, "restart from ") == [f"restart from {newest} timestep {newest[-1]}"], again.describe()
    for r in (2, 3):
        assert f"rank {r}: rebuilt the node-local shard of 'scr' version" in again.stderr, again.describe()
        assert f"from redundancy {scheme}" in again.stderr, again.describe()
    assert lines(again.stdout, "errors ") == ["errors 0"], again.describe()


def test_descriptors_cairn_cannot_express_are_warned_about_and_bad_ones_refused(scr_api, tmp_path):
    """Two redundancy schemes in one job: the most frequent is applied, the
    other named in a warning; a descriptor with an unknown TYPE fails SCR_Init
    with a message naming it."""
    conf = tmp_path / "scr.conf"
    conf.write_text("SCR_COPY_TYPE=FILE\nCKPT=0 INTERVAL=1 TYPE=XOR SET_SIZE=16\nCKPT=1 INTERVAL=4 TYPE=RS\n")
    r = harness.run_process(api(scr_api, 2, 1), env(tmp_path, SCR_CONF_FILE=conf), tmp_path)
    assert r.rc == 0 and lines(r.stdout, "errors ") == ["errors 0"], r.describe()
    assert "CKPT=1 (RS) is not applied: cairn protects a run with one scheme, CKPT=0's XOR" in r.stderr, r.describe()
    assert r.stderr.count("redundancy = xor is off for this job") == 1, r.describe()  # one node
    conf.write_text("SCR_COPY_TYPE=FILE\nCKPT=0 INTERVAL=1 TYPE=MIRROR\n")
    bad = harness.run_process(api(scr_api, 2, 1), env(tmp_path / "b", SCR_CONF_FILE=conf), tmp_path)
    assert bad.rc != 0 and "CKPT=0: TYPE = 'MIRROR' is not SINGLE, PARTNER, XOR or RS" in bad.stderr, bad.describe()


def test_a_job_that_cannot_make_its_data_plane_runs_without_redundancy_and_says_so(scr_api, tmp_path):
    """SCR's default XOR on two nodes whose data plane cannot be made (a
    provider that does not exist): the job runs and keeps its datasets, and
    rank 0 says once why they are not protected."""
    e = env(tmp_path, CAIRN_AGENTS_PROVIDER="no-such-provider")
    r = harness.run_process(on_nodes(scr_api, tmp_path, 2), e, tmp_path)
    assert r.rc == 0 and lines(r.stdout, "errors ") == ["errors 0"], r.describe()
    assert r.stderr.count("redundancy = xor is off for this job") == 1, r.describe()
    assert "no-such-provider" in r.stderr, r.describe()
