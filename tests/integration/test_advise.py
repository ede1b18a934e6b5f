"""cairn advise (docs/design/advise.md) on a real MPI job: the engine's measured
per-stage costs land in the catalog, `cairn advise --run` puts the model's
prediction beside them (text and --json), cairn_advice gives the running
application Young's and Daly's intervals from its own costs, and bad input
(no such run, a missing or non-positive MTBF) is refused with a clear error."""
import json
import math
import re
import sqlite3
import subprocess

import pytest

import harness

NRANKS = 2
STEPS, EVERY, NBYTES = 8, 2, 4 << 20
MTBF = 3600.0


def cli(*args, expect=0):
    path = harness.cli_path()
    assert path, "CAIRN_TEST_CLI is not set (ctest sets it)"
    # No CAIRN_TEST_* variables: without --run, advise reads the configuration
    # from CAIRN_* as the library does, and unknown keys are errors.
    r = subprocess.run([str(path), *map(str, args)], capture_output=True, text=True, timeout=120,
                       env=harness.base_env())
    assert r.returncode == expect, f"cairn {' '.join(map(str, args))}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def daly(c, m):
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


@pytest.fixture(scope="module")
def advised_run(tmp_path_factory):
    if not harness.mpi_enabled():
        pytest.fail("this suite needs the MPI build")
    job = harness.Job(tmp_path_factory.mktemp("advise"), NRANKS, run="advised")
    res = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-persistent", "--advice",
                  mtbf=MTBF).ok()
    return job, res


def test_cairn_advice_in_the_application(advised_run):
    _, res = advised_run
    lines = {(int(m.group(1)), m.group(2)): m for m in re.finditer(
        r"^rank (\d+) advice (before|after) rc=(-?\d+) interval=(\S+) young=(\S+) cost=(\S+) mtbf=(\S+) "
        r"checkpoints=(\d+) msg=(.*)$", res.stdout, re.M)}
    assert len(lines) == 2 * NRANKS, res.describe()
    for r in range(NRANKS):
        before = lines[(r, "before")]
        assert int(before.group(3)) == -6, before.group(0)  # CAIRN_EAGAIN: nothing measured yet
        assert "no checkpoint of this execution has finished" in before.group(9)
        after = lines[(r, "after")]
        assert int(after.group(3)) == 0, after.group(0)
        interval, young, cost, mtbf = (float(after.group(i)) for i in range(4, 8))
        assert int(after.group(8)) == STEPS // EVERY
        assert mtbf == MTBF
        assert cost > 0
        assert young == pytest.approx(math.sqrt(2 * cost * MTBF), rel=1e-6)
        assert interval == pytest.approx(daly(cost, MTBF), rel=1e-6)


def test_cairn_advice_without_mtbf_is_a_clear_error(tmp_path, make_job):
    job = make_job(1, run="nomtbf")
    res = job.run("--steps", 2, "--every", 1, "--bytes", 4096, "--wait-persistent", "--advice").ok()
    m = re.search(r"^rank 0 advice after rc=(-?\d+) .* msg=(.*)$", res.stdout, re.M)
    assert m, res.describe()
    assert int(m.group(1)) == harness.CAIRN_EINVAL
    assert "configuration key mtbf" in m.group(2) and "CAIRN_MTBF" in m.group(2), m.group(2)


def test_stage_costs_are_in_the_catalog(advised_run):
    job, _ = advised_run
    db = sqlite3.connect(job.store / "catalog.sqlite")
    rows = db.execute("SELECT version, rank, size, capture_s, checksum_s, hash_s, local_s, persistent_s"
                      " FROM shards WHERE run = 'advised' ORDER BY version, rank").fetchall()
    db.close()
    assert [(v, r) for v, r, *_ in rows] == [(v, r) for v in range(EVERY, STEPS + 1, EVERY) for r in range(NRANKS)]
    for v, r, size, capture, checksum, hashs, local, persistent in rows:
        assert size >= NBYTES
        # Every stage ran (hash trees and the local level are on by default) and took time.
        assert capture > 0 and checksum > 0 and hashs > 0 and local > 0 and persistent > 0, (v, r)


def test_advise_run_json_and_text(advised_run):
    job, _ = advised_run
    # Bandwidths given for the memory and local level, the persistent level measured (small and quick).
    args = ["advise", job.store, "--run", "advised", "--mtbf", MTBF, "--reps", 1,
            "--memory-bandwidth", "4G", "--local-bandwidth", "2G"]
    r = cli(*args, "--json")
    j = json.loads(r.stdout)
    assert "measuring persistent level" in r.stderr  # progress on stderr, JSON alone on stdout
    assert j["configuration"]["mode"] == "thread" and j["configuration"]["source"] == "run advised"
    assert j["configuration"]["hash_trees"] is True and j["configuration"]["local_enabled"] is True
    assert j["workload"]["ranks_per_node"] == NRANKS  # one node: both ranks on it
    assert j["workload"]["bytes_per_rank"] >= NBYTES
    assert j["bandwidths"]["memory"] == 4 << 30 and j["bandwidths"]["source"]["memory"] == "given"
    assert j["bandwidths"]["source"]["persistent"] == "measured" and j["bandwidths"]["persistent_io"] > 0
    m = j["model"]
    assert m["m"] == 6 and m["m_cpu"] == 5  # checksum and hash trees are one pass
    s_node = j["workload"]["bytes_per_node"]
    # The local level is tmpfs here (the harness's scratch is under the test's
    # temporary directory: tmpfs or not), and its write is counted accordingly.
    local = s_node / (2 << 30) if j["bandwidths"]["local_in_memory"] else 2 * s_node / (4 << 30)
    assert m["async_s"] == pytest.approx(3 * s_node / (4 << 30) + local, rel=1e-9)
    assert [s["stage"] for s in m["stages"]] == ["capture", "checksum", "local", "persistent", "commit"]
    assert j["bandwidths"]["commit_s"] > 0
    run = j["run"]
    assert run["run"] == "advised" and run["versions"] == STEPS // EVERY and run["shards"] == NRANKS * STEPS // EVERY
    assert run["nranks"] == NRANKS
    for st in run["stages"]:
        assert st["measured_s"] > 0, st
        assert st["ratio"] == pytest.approx(st["predicted_s"] / st["measured_s"], rel=1e-9)
    measured = {st["stage"]: st["measured_s"] for st in run["stages"]}
    thread_cost = measured["capture"] + measured["checksum"] + measured["local"]
    assert run["measured_cost_s"] == pytest.approx(thread_cost, rel=1e-9)
    a = j["advice"]
    assert a["mtbf_s"] == MTBF and a["cost_source"] == "measured (run advised)"
    assert a["cost_s"] == pytest.approx(thread_cost, rel=1e-9)
    assert a["young_s"] == pytest.approx(math.sqrt(2 * thread_cost * MTBF), rel=1e-9)
    assert a["daly_s"] == pytest.approx(daly(thread_cost, MTBF), rel=1e-9)
    assert a["persistent_interval"] >= 1
    text = cli(*args).stdout
    assert "checkpoint every" in text and "Daly" in text and "persistent_interval =" in text
    assert re.search(r"^checksum\s+memory\s+\S+ ms\s+\S+ ms\s+\d+\.\d\d$", text, re.M), text


def test_advise_measures_without_a_run(tmp_path):
    scratch, store = tmp_path / "scratch", tmp_path / "store"
    scratch.mkdir()
    store.mkdir()
    j = json.loads(cli("advise", store, "--scratch", scratch, "--bytes", "2M", "--ranks-per-node", 2,
                       "--node-mtbf", 86400, "--nodes", 24, "--reps", 1, "--json").stdout)
    assert j["advice"]["mtbf_s"] == pytest.approx(3600.0)
    assert all(j["bandwidths"][k] > 0 for k in ("memory", "memory_cpu", "local_io", "persistent_io"))
    assert all(v == "measured" for v in j["bandwidths"]["source"].values())
    assert "run" not in j
    assert j["advice"]["cost_source"] == "predicted"
    assert j["advice"]["cost_s"] == pytest.approx(j["model"]["async_s"], rel=1e-9)
    assert sorted(p.name for p in scratch.iterdir()) == [] and sorted(p.name for p in store.iterdir()) == []


@pytest.mark.parametrize("extra, message", [
    (["--run", "nosuchrun", "--mtbf", 10], "run 'nosuchrun' not found"),
    (["--run", "advised"], "no failure rate: give --mtbf"),
    (["--run", "advised", "--mtbf", 0], "--mtbf must be a positive number of seconds"),
    (["--run", "advised", "--mtbf=-5"], "--mtbf must be a positive number of seconds"),
    (["--run", "advised", "--node-mtbf", 100], "--node-mtbf needs --nodes"),
    (["--run", "advised", "--mtbf-from-run"], "never restarted"),
    (["--run", "advised", "--mtbf", 10, "--mtbf-from-run"], "give only one of"),
])
def test_bad_input_is_refused_clearly(advised_run, extra, message):
    job, _ = advised_run
    r = cli("advise", job.store, *extra, "--memory-bandwidth", "1G", "--local-bandwidth", "1G",
            "--persistent-bandwidth", "1G", expect=2)
    assert message in r.stderr, r.stderr
    assert r.stdout == ""


def test_checksum_bandwidth_alone_is_refused(advised_run):
    job, _ = advised_run
    r = cli("advise", job.store, "--run", "advised", "--mtbf", 10, "--checksum-bandwidth", "1G",
            "--local-bandwidth", "1G", "--persistent-bandwidth", "1G", expect=2)
    assert "--checksum-bandwidth needs --memory-bandwidth" in r.stderr, r.stderr
    assert r.stdout == ""
