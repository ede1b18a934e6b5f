"""cairn under a real Slurm (tests/support_py/slurm.py: munged, slurmctld and two
`slurmd -N n1/n2` on this host, started once for the module and stopped by PID).

A job of 2 nodes and 4 ranks with a 1-minute limit and --signal=USR1@20 runs
ckpt_app under mpirun inside the allocation; the application asks
cairn_should_checkpoint after every step, checkpoints on the warning, waits for
the persistent level, and is then killed by Slurm at its time limit. The rerun
(a second job) restarts from that version, and its restored state and final
state are bit-identical to an uninterrupted run's. Ranks see node identity
n1/n2 and cairn records it (RUN: nodes, job). A rig that cannot start fails the
tests with the reason; nothing is skipped.

Also: two job steps of one allocation on one run (the second is refused),
and the next job of a VELOC and of an SCR application restarting.

Wall time: Slurm's limits are whole minutes, and slurmctld checks them from its
periodic work: a job killed at its limit takes 60 to 70 s, so the two such jobs
run side by side (nodes of 4 CPUs); the others take a few seconds.
"""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import harness  # tests/support_py, put on the path by tests/conftest.py
import slurm

STEPS = 2000      # at 50 ms a step (100 s), beyond the 1-minute limit
SLEEP_MS = 50
EVERY = 100       # periodic checkpoints before the warning, so that the time to durable is measured
                  # (every 5 s of steps: with 250, a job on a loaded machine reached step 195 by its warning)
NBYTES = 1 << 18
RUN = "slurmrun"


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    if not (harness.bin_dir() / "ckpt_app").is_file():
        pytest.fail(f"{harness.bin_dir()}/ckpt_app not found: build with MPI and set CAIRN_TEST_BIN_DIR (ctest does)")
    root = tmp_path_factory.mktemp("slurm")
    r = slurm.SlurmRig(root / "rig", nodes=2, cpus=4)  # room for two 4-rank jobs at once
    try:
        r.start()
    except slurm.SlurmError as e:
        pytest.fail(f"the Slurm rig did not start: {e}")
    yield r
    r.stop()


def write_script(path: Path, app_args: list) -> Path:
    """A batch script that runs ckpt_app on every task of the allocation with mpirun."""
    args = " ".join(str(a) for a in app_args)
    path.write_text(
        "#!/bin/bash\n"
        "echo \"job $SLURM_JOB_ID on $SLURM_JOB_NODELIST\"\n"
        f"exec mpirun --bind-to none -n $SLURM_NTASKS {harness.bin_dir() / 'ckpt_app'} {args}\n")
    path.chmod(0o755)
    return path


def slurm_base_env() -> dict:
    """The environment of the rig's jobs. The emulated nodes share one host: Open
    MPI's shared-memory transport (vader) would name its segments alike for the
    local rank 0 of n1 and of n2 and crash; TCP over loopback between all ranks."""
    env = harness.base_env()
    env["OMPI_MCA_btl"] = "self,tcp"
    return env


def job_env(root: Path, **cfg) -> dict:
    env = slurm_base_env()
    env["CAIRN_SCRATCH"] = str(root / "scratch")
    env["CAIRN_PERSISTENT"] = str(root / "store")
    for k, v in cfg.items():
        env["CAIRN_" + k.upper()] = str(v)
    return env


def output(root: Path, job: str) -> str:
    return (root / f"out-{job}.txt").read_text(errors="replace")


def run_info(store: Path, run: str) -> dict:
    text = (store / "runs" / run / "RUN").read_text()
    return json.loads(text[:text.rindex("xxh3 ")])


WARNING_CFG = dict(run=RUN, warning_signals="USR1")  # SIGTERM at the limit ends the ranks at once


def submit_warning_job(rig, root: Path) -> str:
    """The job that Slurm warns (USR1 20 s before its limit) and then kills."""
    script = write_script(root / "job.sh", ["--steps", STEPS, "--every", EVERY, "--bytes", NBYTES,
                                            "--sleep-ms", SLEEP_MS, "--on-warning"])
    return rig.sbatch(script, "-N2", "--ntasks-per-node=2", "--time=1", "--signal=USR1@20", f"--output={root}/out-%j.txt",
                      env=job_env(root, **WARNING_CFG))


def check_warning_job(rig, root: Path, first: str) -> None:
    """The warned job checkpointed on the warning and committed before the kill;
    the rerun (another job of the same run) restarts from that version, bit for
    bit the state of an uninterrupted run."""
    state = rig.wait(first, timeout=200)
    out = output(root, first)
    assert state == "TIMEOUT", f"job {first} ended {state}, expected TIMEOUT at its limit\n{out}"
    assert re.findall(r"^node (\S+)$", out, re.M) == ["n1", "n1", "n2", "n2"], out
    warned = [int(v) for v in re.findall(r"^warning checkpoint (\d+) durable in [0-9.]+ s left \S+ s$", out, re.M)]
    assert warned, f"no checkpoint on the warning signal\n{out}"
    v = max(warned)
    # USR1 reaches each rank directly and again through Open MPI's daemon: a
    # second signal after the first capture gives a second warning checkpoint.
    assert v > EVERY, f"warning version {v}: expected after the first periodic checkpoint ({EVERY})\n{out}"
    assert (root / "store" / "runs" / RUN / "ckpt" / f"v{v:012d}" / "MANIFEST").is_file(), \
        f"version {v} not committed before the kill\n{out}"
    assert "steps" not in out, f"the first job ran to its end instead of being killed\n{out}"

    # 2. The rerun (another job of the same run) restarts from that version.
    script2 = write_script(root / "rerun.sh", ["--steps", STEPS, "--every", EVERY, "--bytes", NBYTES,
                                               "--dump-restored", root / "restored"])
    second = rig.sbatch(script2, "-N2", "--ntasks-per-node=2", "--time=1", f"--output={root}/out-%j.txt",
                        env=job_env(root, **WARNING_CFG))
    state = rig.wait(second, timeout=120)
    out2 = output(root, second)
    assert state == "COMPLETED", f"rerun job {second} ended {state}\n{out2}"
    assert re.search(rf"^restarted from version {v}$", out2, re.M), f"expected a restart from {v}\n{out2}"
    rerun_hash = re.search(r"^final hash ([0-9a-f]{16})$", out2, re.M).group(1)

    # 3. The uninterrupted run (same ranks, no batch system): bit for bit the same.
    ref = harness.Job(root / "ref", 4, run="reference")
    res = ref.run("--steps", STEPS, "--every", v, "--bytes", NBYTES, "--dump-at", v, ref.dumps / "at").ok()
    harness.assert_same_state(ref.read_dump(ref.dumps / "at"), ref.read_dump(root / "restored"),
                              f"state restored from version {v}")
    assert rerun_hash == res.final_hash, f"final state differs: rerun {rerun_hash}, uninterrupted {res.final_hash}"

    # 4. cairn recorded the job and the nodes Slurm gave each execution.
    info = run_info(root / "store", RUN)
    assert [e["job"] for e in info["executions"]] == [first, second]
    assert [e["nodes"] for e in info["executions"]] == [["n1", "n2"], ["n1", "n2"]]


def test_the_default_run_is_named_after_the_job(rig, tmp_path):
    script = write_script(tmp_path / "job.sh", ["--steps", 4, "--every", 2])
    job = rig.sbatch(script, "-N2", "--ntasks-per-node=2", "--time=1", f"--output={tmp_path}/out-%j.txt", env=job_env(tmp_path))
    state = rig.wait(job, timeout=120)
    out = output(tmp_path, job)
    assert state == "COMPLETED", f"job {job} ended {state}\n{out}"
    runs = sorted(p.name for p in (tmp_path / "store" / "runs").iterdir())
    # The program, a digest of its path and directory, the job and its step.
    assert len(runs) == 1 and re.fullmatch(rf"ckpt_app-[0-9a-f]{{8}}-{job}(\.\d+)?", runs[0]), runs
    assert f"cairn: run '{runs[0]}' (the default for this program, directory and job" in out, out
    info = run_info(tmp_path / "store", runs[0])
    assert info["executions"][0]["job"] == job
    assert info["executions"][0]["nodes"] == ["n1", "n2"]


def test_example_core_script_stops_before_its_deadline_and_the_next_job_continues(rig, tmp_path):
    """examples/slurm/core.sbatch as a user submits it: the first job stops itself
    (time left below the measured time to durable: a deadline 4 s after start),
    the second continues from the version it left, to the checksum of an
    uninterrupted run."""
    heat2d = Path(os.environ.get("CAIRN_TEST_EXAMPLES_DIR", "")) / "heat2d"
    if not heat2d.is_file():
        pytest.fail(f"{heat2d} not found: build the examples and set CAIRN_TEST_EXAMPLES_DIR (ctest does)")
    script = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "core.sbatch"
    env = slurm_base_env()
    env.update(HEAT2D=str(heat2d), STORE=str(tmp_path / "store"), CAIRN_RUN="heat", NX="256", NY="256",
               ITERS="600", EVERY="50", HEAT2D_ARGS="--sleep-ms 10")
    first_env = dict(env, CAIRN_DEADLINE="+4", CAIRN_DEADLINE_MARGIN="0")
    # The script asks for USR1 120 s before the end: with the 1-minute limit here
    # Slurm would send it at once. 1 s before the end leaves the deadline alone.
    args = ("-N2", "--ntasks-per-node=2", "--time=1", "--signal=USR1@1", f"--output={tmp_path}/out-%j.txt")
    first = rig.sbatch(script, *args, env=first_env)
    assert rig.wait(first, timeout=120) == "COMPLETED", output(tmp_path, first)
    out = output(tmp_path, first)
    m = re.search(r"^heat2d: the job ends: version (\d+) durable, stopping", out, re.M)
    assert m, f"the first job did not stop before its deadline\n{out}"
    v = int(m.group(1))
    assert 0 < v < 600 and "final checksum" not in out, out
    second = rig.sbatch(script, *args, env=env)
    assert rig.wait(second, timeout=120) == "COMPLETED", output(tmp_path, second)
    out2 = output(tmp_path, second)
    assert re.search(rf"^heat2d: restarted from version {v} ", out2, re.M), out2
    got = re.search(r"^heat2d: final checksum ([0-9a-f]{16})$", out2, re.M).group(1)
    ref_env = dict(harness.base_env(), CAIRN_PERSISTENT=str(tmp_path / "ref"), CAIRN_SCRATCH=str(tmp_path / "ref-scratch"))
    ref = harness.run_process(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", heat2d, "--nx", 256,
                               "--ny", 256, "--iters", 600, "--every", 0], ref_env, tmp_path).ok()
    want = re.search(r"^heat2d: final checksum ([0-9a-f]{16})$", ref.stdout, re.M).group(1)
    assert got == want, f"resumed job's checksum {got}, uninterrupted run's {want}"


def test_example_aggregation_script_spreads_leaders_over_the_slurm_nodes(rig, tmp_path):
    """examples/slurm/aggregation.sbatch on n1 and n2 (ranks 0, 1 on n1; 2, 3 on n2):
    the node identity cairn takes from Slurm is the failure domain the leaders
    spread over, one leader per node, each pulling only from its own node."""
    heat2d = Path(os.environ.get("CAIRN_TEST_EXAMPLES_DIR", "")) / "heat2d"
    if not heat2d.is_file():
        pytest.fail(f"{heat2d} not found: build the examples and set CAIRN_TEST_EXAMPLES_DIR (ctest does)")
    script = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "aggregation.sbatch"
    env = slurm_base_env()
    env.update(HEAT2D=str(heat2d), STORE=str(tmp_path / "store"), CAIRN_RUN="agg", NX="256", NY="256",
               ITERS="100", EVERY="50", CAIRN_AGGREGATE_FILES="2")
    job = rig.sbatch(script, "-N2", "--ntasks-per-node=2", "--time=1", "--signal=USR1@1",
                     f"--output={tmp_path}/out-%j.txt", env=env)
    state = rig.wait(job, timeout=120)
    out = output(tmp_path, job)
    assert state == "COMPLETED", f"job {job} ended {state}\n{out}"
    assert re.search(r"^heat2d: final checksum [0-9a-f]{16}$", out, re.M), out
    for v in (50, 100):
        text = (tmp_path / "store" / "runs" / "agg" / "heat2d" / f"v{v:012d}" / "MANIFEST").read_text()
        m = json.loads(text[:text.rindex("xxh3 ")])
        c = m["container"]
        assert c["strategy"] == "leaders", c
        leaders = sorted(c["leaders"])
        assert len(leaders) == 2 and leaders[0] in (0, 1) and leaders[1] in (2, 3), \
            f"version {v}: leaders {leaders}, expected one on n1 (ranks 0, 1) and one on n2 (ranks 2, 3)"
        assert c["bytes_between_nodes"] == 0 and c["bytes_within_nodes"] > 0, c
    assert run_info(tmp_path / "store", "agg")["executions"][0]["nodes"] == ["n1", "n2"]


def test_agents_in_a_job_of_their_own_serve_an_application_job(rig, tmp_path):
    """examples/slurm/agents-service.sbatch (controller and a manager started with
    srun, on one node) and agents-app.sbatch (heat2d on the other node, checkpoints
    in the agents' memory): the application job ends with the checksum of an
    uninterrupted run; the service job is then cancelled."""
    heat2d = Path(os.environ.get("CAIRN_TEST_EXAMPLES_DIR", "")) / "heat2d"
    agent = Path(os.environ.get("CAIRN_TEST_AGENT", ""))
    cli = harness.cli_path()
    if not heat2d.is_file() or not agent.is_file() or cli is None:
        pytest.fail(f"heat2d ({heat2d}), cairn-agent ({agent}) or the CLI not built: build and run under ctest")
    examples = Path(__file__).resolve().parents[2] / "examples" / "slurm"
    shared = tmp_path / "shared"
    env = slurm_base_env()
    env.update(CLI=str(cli), AGENT=str(agent), SHARED=str(shared), PORT=str(slurm.free_port()),
               HEAT2D=str(heat2d), STORE=str(tmp_path / "store"), CAIRN_RUN="heat-agents", NX="256", NY="256",
               ITERS="200", EVERY="50")
    svc = rig.sbatch(examples / "agents-service.sbatch", "-N1", "--time=2", f"--output={tmp_path}/out-%j.txt",
                     env=env)
    try:
        app = rig.sbatch(examples / "agents-app.sbatch", "-N1", "--ntasks-per-node=2", "--time=1",
                         "--signal=USR1@1", f"--output={tmp_path}/out-%j.txt", env=env)
        state = rig.wait(app, timeout=150)
        out = output(tmp_path, app)
        assert state == "COMPLETED", f"application job {app} ended {state}\n{out}\n--- service ---\n" \
                                     f"{output(tmp_path, svc)}"
        assert rig.job_state(svc) == "RUNNING", output(tmp_path, svc)
    finally:
        rig.scancel(svc)
    rig.wait(svc, timeout=60)
    got = re.search(r"^heat2d: final checksum ([0-9a-f]{16})$", out, re.M)
    assert got and "checkpoint version 200" in out, out
    # The agents took every version (no rank fell back to writing its shards itself).
    assert "not running yet" not in out and "writing checkpoints to the persistent level instead" not in out, out
    # ... and wrote them to the store (agents_persist), committed.
    assert (tmp_path / "store" / "runs" / "heat-agents" / "heat2d" / f"v{200:012d}" / "MANIFEST").is_file()
    ref_env = dict(harness.base_env(), CAIRN_PERSISTENT=str(tmp_path / "ref"), CAIRN_SCRATCH=str(tmp_path / "ref-s"))
    ref = harness.run_process(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", heat2d, "--nx", 256,
                               "--ny", 256, "--iters", 200, "--every", 0], ref_env, tmp_path).ok()
    want = re.search(r"^heat2d: final checksum ([0-9a-f]{16})$", ref.stdout, re.M).group(1)
    assert got.group(1) == want


DAEMON_NBYTES = 1 << 20


def daemon_cfg(timed: bool) -> dict:
    return dict(run="ended", engine_host="daemon", io_rate_limit=60000 if timed else 800000, daemon_drain_s=40)


def submit_daemon_job(rig, root: Path, timed: bool) -> str:
    """engine_host = daemon, the persistent write slowed down (io_rate_limit):
    every rank pauses right after cairn_checkpoint(2) returned; returns once
    all have. Timed, checkpoint 2 comes about 50 s into a 1-minute job and its
    flush takes some 30 s more, so it is not committed yet."""
    flag = root / "go"
    script = write_script(root / "job.sh", ["--steps", 40, "--every", 2, "--bytes", DAEMON_NBYTES,
                                            "--sleep-ms", 24000 if timed else 0, "--pause-after", 2, flag])
    job = rig.sbatch(script, "-N2", "--ntasks-per-node=2", "--time=1", f"--output={root}/out-%j.txt",
                     env=job_env(root, **daemon_cfg(timed)))
    deadline = time.monotonic() + 120
    while not all(Path(f"{flag}.ready.{r}").exists() for r in range(4)):
        assert rig.job_state(job) in ("PENDING", "CONFIGURING", "RUNNING"), \
            f"job {job} ended before checkpoint 2 returned on every rank\n{output(root, job)}"
        assert time.monotonic() < deadline, f"job {job} did not reach its pause\n{output(root, job)}"
        time.sleep(0.02)
    if timed:
        assert not daemon_manifest(root).exists(), \
            "version 2 committed before the time limit: the flush is not slow enough"
    return job


def daemon_manifest(root: Path) -> Path:
    return root / "store" / "runs" / "ended" / "ckpt" / f"v{2:012d}" / "MANIFEST"


def check_daemon_job(rig, root: Path, job: str, timed: bool) -> None:
    """The job ended (Slurm sent SIGTERM to every process of the job, SIGKILL
    after KillWait). The daemons, still flushing version 2, neither died of the
    SIGTERM nor waited for the application: the last one to make its shard
    durable committed it. A second job (node-local directories wiped)
    restores version 2 bit for bit."""
    state = rig.wait(job, timeout=120)
    assert state == ("TIMEOUT" if timed else "CANCELLED"), f"job {job} ended {state}\n{output(root, job)}"
    deadline = time.monotonic() + 60
    while not daemon_manifest(root).is_file():
        assert time.monotonic() < deadline, f"version 2 was never committed\n{output(root, job)}"
        time.sleep(0.1)
    shutil.rmtree(root / "scratch", ignore_errors=True)
    script2 = write_script(root / "rerun.sh", ["--steps", 2, "--every", 2, "--bytes", DAEMON_NBYTES,
                                               "--dump-restored", root / "restored"])
    second = rig.sbatch(script2, "-N2", "--ntasks-per-node=2", "--time=1", f"--output={root}/out-%j.txt",
                        env=job_env(root, **daemon_cfg(timed)))
    state = rig.wait(second, timeout=120)
    out2 = output(root, second)
    assert state == "COMPLETED", f"rerun job {second} ended {state}\n{out2}"
    assert re.search(r"^restarted from version 2$", out2, re.M), out2
    ref = harness.Job(root / "ref", 4, run="reference")
    ref.run("--steps", 2, "--every", 2, "--bytes", DAEMON_NBYTES, "--dump-at", 2, ref.dumps / "at").ok()
    harness.assert_same_state(ref.read_dump(ref.dumps / "at"), ref.read_dump(root / "restored"),
                              "state restored from version 2")


def test_a_daemon_mode_job_cancelled_right_after_a_checkpoint_keeps_that_version(rig, tmp_path):
    job = submit_daemon_job(rig, tmp_path, timed=False)
    rig.scancel(job)
    check_daemon_job(rig, tmp_path, job, timed=False)


def test_jobs_killed_at_their_time_limit_keep_their_last_checkpoint(rig, tmp_path):
    """Two 1-minute jobs side by side (Slurm's limits are whole minutes, so each
    costs a minute of wall time; the rig's nodes have room for both): the job
    warned 20 s before its limit checkpoints on the warning, and the
    daemon-mode job is killed while its daemons flush checkpoint 2."""
    for d in ("warning", "daemon"):
        (tmp_path / d).mkdir()
    warned = submit_warning_job(rig, tmp_path / "warning")
    drained = submit_daemon_job(rig, tmp_path / "daemon", timed=True)
    check_warning_job(rig, tmp_path / "warning", warned)
    check_daemon_job(rig, tmp_path / "daemon", drained, timed=True)


def test_two_steps_of_one_allocation_on_one_run_the_second_is_refused(rig, tmp_path):
    """Two job steps of one allocation side by side on one run (CAIRN_RUN the
    same): the second is refused at init, naming the first; the first goes on
    and its versions are intact: the next job restores its newest bit for bit."""
    flag = tmp_path / "go"
    app = harness.bin_dir() / "ckpt_app"
    args = f"--steps 6 --every 2 --bytes {NBYTES}"
    # Each step is an srun (sharing the allocation's CPUs: --overlap) that
    # runs mpirun, which starts the step's two ranks on its node itself (not
    # through Slurm: the emulated node's name is not the host's).
    mpirun = "srun --overlap -N1 -n1 mpirun --mca ras ^slurm --mca plm ^slurm --oversubscribe --bind-to none -n 2"
    script = tmp_path / "steps.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"{mpirun} {app} {args} --pause-after 2 {flag} > {tmp_path}/first.txt 2>&1 &\n"
        "first=$!\n"
        f"while [ ! -e {flag}.ready.0 ] || [ ! -e {flag}.ready.1 ]; do sleep 0.1; done\n"
        f"{mpirun} {app} {args} > {tmp_path}/second.txt 2>&1\n"
        "echo \"second rc=$?\"\n"
        f"touch {flag}\n"
        "wait $first\n"
        "echo \"first rc=$?\"\n")
    script.chmod(0o755)
    env = job_env(tmp_path, run="steps", lease_timeout=60)
    job = rig.sbatch(script, "-N1", "--ntasks-per-node=2", "--time=1", f"--output={tmp_path}/out-%j.txt", env=env)
    state = rig.wait(job, timeout=150)
    out = output(tmp_path, job)
    first, second = (tmp_path / "first.txt").read_text(), (tmp_path / "second.txt").read_text()
    assert state == "COMPLETED", f"job {job} ended {state}\n{out}\n{first}\n{second}"
    assert "second rc=0" not in out and "first rc=0" in out, f"{out}\n{first}\n{second}"
    assert "is being written by another execution" in second and "ckpt_app" in second, second
    ref = harness.Job(tmp_path / "ref", 2, run="reference")
    res = ref.run("--steps", 6, "--every", 2, "--bytes", NBYTES, "--dump-at", 6, ref.dumps / "at").ok()
    assert f"final hash {res.final_hash}" in first, first
    manifests = sorted(p.parent.name for p in (tmp_path / "store" / "runs" / "steps" / "ckpt").glob("v*/MANIFEST"))
    assert manifests == [f"v{v:012d}" for v in (2, 4, 6)], manifests
    shutil.rmtree(tmp_path / "scratch", ignore_errors=True)
    rerun = write_script(tmp_path / "rerun.sh", ["--steps", 6, "--every", 2, "--bytes", NBYTES, "--dump-restored",
                                                 tmp_path / "restored"])
    job2 = rig.sbatch(rerun, "-N1", "--ntasks-per-node=2", "--time=1", f"--output={tmp_path}/out-%j.txt", env=env)
    assert rig.wait(job2, timeout=120) == "COMPLETED", output(tmp_path, job2)
    assert re.search(r"^restarted from version 6$", output(tmp_path, job2), re.M), output(tmp_path, job2)
    harness.assert_same_state(ref.read_dump(ref.dumps / "at"), ref.read_dump(tmp_path / "restored"),
                              "version 6 of the step that held the run")


def build_dropin_program(tmp_path: Path, name: str, lib: str) -> Path:
    """tests/compat/<name>.c built as a VELOC or SCR application is: mpicc, -I, -L, -l."""
    kind = "VELOC" if lib == "veloc-client" else "SCR"
    inc, libdir = os.environ.get(f"CAIRN_TEST_{kind}_INCLUDE"), os.environ.get(f"CAIRN_TEST_{kind}_LIBDIR")
    if not inc or not libdir:
        pytest.fail(f"CAIRN_TEST_{kind}_INCLUDE / CAIRN_TEST_{kind}_LIBDIR not set (ctest sets them)")
    src = Path(__file__).resolve().parents[1] / "compat" / f"{name}.c"
    out = tmp_path / name
    cmd = ["mpicc", "-O2", f"-I{inc}", str(src), "-o", str(out), f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-l{lib}",
           "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return out


def dropin_setup(root: Path, dropin: str, program: Path):
    """Arguments, environment and store of the drop-in's test program with its
    files under root."""
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in slurm_base_env().items() if not k.startswith("CAIRN_")}
    if dropin == "veloc":
        cfg = root / "veloc.cfg"
        cfg.write_text(f"scratch = {root / 'scratch'}\npersistent = {root / 'persistent'}\nmode = sync\n")
        return ["file", str(cfg), "60", "5", "64", "16"], env, root / "persistent"
    env.update(SCR_PREFIX=str(root / "prefix"), SCR_CACHE_BASE=str(root / "cache"), SCR_CHECKPOINT_INTERVAL="5")
    return ["60", "64", "16"], env, root / "prefix" / ".scr" / "cairn"


@pytest.mark.parametrize("dropin", ["veloc", "scr"])
def test_the_next_job_of_a_veloc_or_scr_application_restarts(rig, tmp_path, dropin):
    """A VELOC or SCR application's job is cancelled after it committed a
    checkpoint; the same script submitted again (a new job id) restarts from
    it, as VELOC and SCR users expect, and ends with an uninterrupted run's
    result."""
    program = (build_dropin_program(tmp_path, "veloc_heat", "veloc-client") if dropin == "veloc"
               else build_dropin_program(tmp_path, "scr_heat", "scr"))
    ref_args, ref_env, _ = dropin_setup(tmp_path / "ref", dropin, program)
    ref = harness.run_process(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", str(program), *ref_args,
                               "0"], ref_env, tmp_path / "ref")
    assert ref.rc == 0, ref.describe()
    args, env, store = dropin_setup(tmp_path / "job", dropin, program)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n"
                      f"cd {tmp_path / 'job'}\n"
                      f"exec mpirun --bind-to none -n $SLURM_NTASKS {program} {' '.join(args)} $HEAT_SLEEP_US\n")
    script.chmod(0o755)
    sbatch = ("-N2", "--ntasks-per-node=1", "--time=1", f"--output={tmp_path}/out-%j.txt")
    first = rig.sbatch(script, *sbatch, env=dict(env, HEAT_SLEEP_US="100000"))
    deadline = time.monotonic() + 90
    while not list(store.glob("runs/*/*/v*/MANIFEST")):
        assert rig.job_state(first) in ("PENDING", "CONFIGURING", "RUNNING"), output(tmp_path, first)
        assert time.monotonic() < deadline, f"no checkpoint committed\n{output(tmp_path, first)}"
        time.sleep(0.1)
    rig.scancel(first)
    assert rig.wait(first, timeout=60) == "CANCELLED", output(tmp_path, first)
    second = rig.sbatch(script, *sbatch, env=dict(env, HEAT_SLEEP_US="0"))
    assert rig.wait(second, timeout=120) == "COMPLETED", output(tmp_path, second)
    out = output(tmp_path, second)
    assert re.search(r"^restart from \S+", out, re.M) and "fresh start" not in out, out
    result = [l for l in ref.stdout.splitlines() if l.startswith("result")]
    assert result and result == [l for l in out.splitlines() if l.startswith("result")], out
