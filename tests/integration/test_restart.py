"""Integration tests: checkpoint and restart under mpirun with 1, 2 and 4 ranks
and single-process, compared bit for bit with uninterrupted runs.

Every test runs tests/integration/ckpt_app.c (see its header for the state and
the output) with its own scratch and persistent directories; the uninterrupted
runs come from the session fixture `reference` (tests/conftest.py).
"""
import pytest

import harness
from harness import SERIAL, SERIAL_FLAG, assert_same_state

MODES = [SERIAL, SERIAL_FLAG, 1, 2, 4]


@pytest.mark.parametrize("mode", MODES)
def test_stop_and_restart_matches_uninterrupted_run(mode, reference, make_job):
    """Stopped after 7 steps (versions 2, 4, 6) and rerun to 10: the second run
    restarts from version 6, its restored state equals the uninterrupted run's
    state at version 6 byte for byte, and both runs end with the same hash."""
    ref = reference(mode)
    job = make_job(mode)
    first = job.run("--steps", 7).ok()
    assert first.restarted_from is None
    assert job.committed() == [2, 4, 6]
    # keep_local = 2: the local level keeps the two newest versions.
    assert job.local_complete() == [4, 6]

    second = job.run("--steps", 10, "--dump-restored", job.dumps / "restored").ok()
    assert second.restarted_from == 6
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "state restored from version 6")
    assert second.final_hash == ref.final_hash
    assert job.committed() == [2, 4, 6, 8, 10]


@pytest.mark.parametrize("mode", [SERIAL, 2])
def test_restart_of_a_finished_run_restores_its_last_version(mode, reference, make_job):
    """A rerun of a run that reached its last step restores the last version
    and takes no further step: same state, same final hash."""
    ref = reference(mode)
    job = make_job(mode)
    job.run("--steps", 10).ok()
    again = job.run("--steps", 10, "--dump-restored", job.dumps / "restored").ok()
    assert again.restarted_from == 10
    assert_same_state(ref.dump(10), job.read_dump(job.dumps / "restored"), "state restored from version 10")
    assert again.final_hash == ref.final_hash


@pytest.mark.parametrize("config", [
    pytest.param({"mode": "sync"}, id="sync"),
    pytest.param({"io_threads": 2, "direct_io": "false"}, id="2-io-threads-buffered"),
    pytest.param({"local_enabled": "false"}, id="persistent-only"),
    pytest.param({"persistent_interval": 2, "keep_local": 0}, id="persistent-every-2nd"),
])
def test_restart_under_other_configurations(config, reference, make_job):
    """The same stop-and-restart cycle, 2 ranks, under other engine settings."""
    ref = reference(2)
    job = make_job(2)
    job.run("--steps", 7, **config).ok()
    if config.get("local_enabled") == "false":
        assert job.versions("local") == []
    if config.get("persistent_interval") == 2:
        # The 2nd checkpoint (version 4) is flushed; versions 2 and 6 stay local.
        assert job.committed() == [4]
        assert job.local_complete() == [2, 4, 6]
    else:
        assert job.committed() == [2, 4, 6]
    second = job.run("--steps", 10, "--dump-restored", job.dumps / "restored", **config).ok()
    assert second.restarted_from == 6
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "state restored from version 6")
    assert second.final_hash == ref.final_hash


@pytest.mark.parametrize("mode", [SERIAL, 1, 2])
def test_file_mode_round_trip(mode, reference, make_job):
    """File mode (checkpoint_begin / route_file / checkpoint_end, then
    restart_begin / route_file / restart_end): the routed files come back with
    the same bytes; the app also checks a second file and that an unknown file
    gives CAIRN_ENOTFOUND."""
    ref = reference(mode)
    job = make_job(mode)
    job.run("--file-mode", "--steps", 5).ok()
    assert job.committed() == [2, 4]
    second = job.run("--file-mode", "--steps", 10, "--dump-restored", job.dumps / "restored").ok()
    assert second.restarted_from == 4
    assert_same_state(ref.dump(4), job.read_dump(job.dumps / "restored"), "state restored from file-mode version 4")
    assert second.final_hash == ref.final_hash
    # The routed working directories are cleaned up after capture and restore.
    files_dir = job.scratch / "files" / job.run_id
    assert not files_dir.exists() or list(files_dir.iterdir()) == []


@pytest.mark.parametrize("bad", ["size", "type", "extra"])
def test_restart_with_a_mismatched_region_is_rejected_untouched(bad, reference, make_job):
    """cairn_restart with a region of the wrong size, of the wrong type, or
    missing from the checkpoint gives CAIRN_EINVAL on every rank, names the
    region, and writes into no buffer at all; once the regions are protected
    correctly, the same version restores exactly."""
    ref = reference(2)
    job = make_job(2)
    job.run("--steps", 4).ok()
    res = job.run("--bad-restart", bad, "--steps", 10, "--dump-restored", job.dumps / "restored").ok()
    lines = [ln for ln in res.stdout.splitlines() if " bad restart " in ln]
    assert len(lines) == 2, res.describe()
    region = "extra" if bad == "extra" else "ints"
    for rank in range(2):
        line = next(ln for ln in lines if ln.startswith(f"rank {rank} "))
        assert f"rc={harness.CAIRN_EINVAL} " in line, line
        assert "untouched=1" in line, line
        assert f"'{region}'" in line, line
    assert res.restarted_from == 4
    assert_same_state(ref.dump(4), job.read_dump(job.dumps / "restored"), "state restored after the rejected restart")
    assert res.final_hash == ref.final_hash


def test_restart_needs_the_same_number_of_ranks(make_job):
    """A checkpoint of 2 ranks is not restored by 1 rank: the restart fails
    with a message that says so, instead of restoring a wrong state."""
    job = make_job(2)
    job.run("--steps", 4).ok()
    one = harness.Job(job.root, 1, run=job.run_id, scratch=job.scratch, store=job.store)
    res = one.run("--steps", 6)
    assert res.rc != 0, res.describe()
    assert "cairn_restart_test failed" in res.stderr and "same number of ranks" in res.stderr, res.describe()


def test_runs_are_kept_apart(make_job):
    """Two run ids in one store do not see each other's checkpoints."""
    job = make_job(2)
    job.run("--steps", 4).ok()
    other = harness.Job(job.root, 2, run="other-run", scratch=job.scratch, store=job.store)
    assert other.run("--steps", 2).ok().restarted_from is None
    assert job.run("--steps", 4).ok().restarted_from == 4


def test_cpp_api_round_trip(tmp_path):
    """The C++ client (cairn/cairn.hpp), single process: checkpoint 3 versions,
    then a second process restarts, gets invalid_argument for a wrong count
    without any buffer written, and restores exactly the state of version 3."""
    env = harness.base_env()
    env.update(CAIRN_SCRATCH=str(tmp_path / "scratch"), CAIRN_PERSISTENT=str(tmp_path / "store"), CAIRN_RUN="cpp")
    app = harness.bin_dir() / "cpp_app"
    w = harness.run_process([app, "write"], env, tmp_path)
    assert w.rc == 0 and "cpp wrote 3" in w.stdout, w.describe()
    r = harness.run_process([app, "read"], env, tmp_path)
    assert r.rc == 0 and "cpp restored 3 ok" in r.stdout, r.describe()
