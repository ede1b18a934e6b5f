"""One identity and one owner per run (docs/design/run-identity.md).

- The default run names the program and its working directory: the same
  program in two directories, with the same checkpoint name and the same
  node-local directory, never restores the other's state; a relaunch in the
  same directory finds its own.
- A second execution of a run that another execution is writing is refused
  at init (CAIRN_EBUSY, naming the holder) and changes nothing: the first
  goes on and restarts bit-identical.
- A killed execution's lease is taken over at once by the next one on the
  same host (its pid is gone), without waiting for lease_timeout.
- File-mode routed files live in a directory per execution.
- A node-local shard that no execution of the run in this store wrote (a
  run of the same name in another store, sharing the node-local directory)
  is never restored: the store's RUN lists its executions' attempt tags.
- `cairn gc STORE --scratch DIR` removes what a killed run of STORE left in
  the node-local directory (committed versions, recycled files), keeps its
  uncommitted versions (the only copy: the relaunch restores one bit for
  bit) unless --uncommitted, and leaves alone a run that is being written
  and a run STORE does not know.
"""
import json
import re
import shutil
import time

import harness
from harness import assert_same_state

STEPS, EVERY, NBYTES = 10, 2, 65536


def default_run_job(root, **kw):
    """A Job whose run is cairn's default (no CAIRN_RUN): the job's own
    working directory is root."""
    job = harness.Job(root, 2, **kw)
    orig = job.env

    def env(**cfg):
        e = orig(**cfg)
        del e["CAIRN_RUN"]
        return e

    job.env = env
    return job


def start_paused(job, ref, version):
    """The job started in the background, paused on every rank after checkpoint `version`."""
    flag = job.root / "go"
    p = job.start(*ref.app_args(), "--steps", STEPS, "--pause-after", version, flag)
    job.wait_paused(p, flag)
    return p, flag


def restored_as_reference(job, ref, version, **cfg):
    """A rerun restores `version` bit for bit and ends as the uninterrupted run."""
    res = job.run(*ref.app_args(), "--steps", STEPS, "--dump-restored", job.dumps / "r", **cfg).ok()
    assert res.restarted_from == version, res.describe()
    assert_same_state(ref.dump(version), job.read_dump(job.dumps / "r"), f"state restored from version {version}")
    assert res.final_hash == ref.final_hash
    return res


def test_the_default_run_is_per_program_and_directory(tmp_path, reference):
    ref = reference(2)
    shared_scratch, shared_store = tmp_path / "scratch", tmp_path / "store"
    a = default_run_job(tmp_path / "a", scratch=shared_scratch, store=shared_store)
    b = default_run_job(tmp_path / "b", scratch=shared_scratch, store=shared_store)
    ra = a.run(*ref.app_args(), "--steps", 6).ok()
    m = re.search(r"cairn: run '([^']+)' \(the default", ra.stderr)
    assert m and re.fullmatch(r"ckpt_app-[0-9a-f]{8}", m.group(1)), ra.describe()
    run_a = m.group(1)
    # Another directory: another run, which starts from scratch (the same
    # checkpoint name in the same store and node-local directory).
    rb = b.run(*ref.app_args(), "--steps", 4, "--variant", 1).ok()
    assert rb.restarted_from is None, "a program in another directory restored another's state\n" + rb.describe()
    run_b = re.search(r"cairn: run '([^']+)'", rb.stderr).group(1)
    assert run_b != run_a
    assert sorted(p.name for p in (shared_store / "runs").iterdir()) == sorted([run_a, run_b])
    # The same directory again: its own run, restarted bit for bit.
    restored_as_reference(a, ref, 6)


def test_another_stores_node_local_shards_are_never_restored(make_job, reference):
    """Two stores, one run name, one node-local directory. persistent_interval
    = 2 and a death right after version 6 leave 6 at the node-local level
    only (uncommitted) in store A. A job of store B finds those shards under
    its run's name, every rank's, of one attempt: it must not restore them
    (it starts from scratch, and says why). Store A's relaunch restores its
    own 6 bit for bit."""
    ref = reference(2)
    a = make_job(2, run="shared")
    cfg = {"persistent_interval": 2}
    res = a.run(*ref.app_args(), "--steps", STEPS, "--die-after", 6, "--silence-ms", 1000, **cfg)
    assert res.rc != 0 and a.committed() == [4], res.describe()
    b = make_job(2, run="shared", scratch=a.scratch)
    rb = b.run(*ref.app_args(), "--steps", 1, **cfg).ok()
    assert rb.restarted_from is None, "restored another store's node-local shards\n" + rb.describe()
    assert "does not list (another store's run of the same name" in rb.stderr, rb.describe()
    restored_as_reference(a, ref, 6, **cfg)


def test_a_second_execution_of_a_run_is_refused_and_changes_nothing(make_job, reference):
    ref = reference(2)
    job = make_job(2)
    first, flag = start_paused(job, ref, 4)
    t0 = time.monotonic()
    second = job.run(*ref.app_args(), "--steps", STEPS, lease_timeout=60)
    took = time.monotonic() - t0
    assert second.rc != 0, second.describe()
    assert "(-14)" in second.stderr and "is being written by another execution" in second.stderr, second.describe()
    assert "ckpt_app" in second.stderr and "pid" in second.stderr, second.describe()
    # The holder renews every lease_timeout / 4: seen well before the timeout.
    assert took < 40, f"refused after {took:.0f} s"
    flag.touch()
    res = harness.finish_process(first).ok()
    assert res.final_hash == ref.final_hash
    assert job.committed() == [2, 4, 6, 8, 10]
    restored_as_reference(job, ref, 10)
    assert not (job.store / "runs" / job.run_id / "RUN.lease").exists(), "finalize left the lease"


def test_a_killed_executions_lease_is_taken_over_at_once(make_job, reference):
    ref = reference(2)
    job = make_job(2)
    p, _ = start_paused(job, ref, 6)
    harness.kill_job(p)
    assert (job.store / "runs" / job.run_id / "RUN.lease").exists()
    t0 = time.monotonic()
    res = restored_as_reference(job, ref, 6, lease_timeout=120)
    assert time.monotonic() - t0 < 60, "the relaunch waited for the lease to time out"
    assert "took over the lease" in res.stderr, res.describe()


def test_file_mode_files_live_in_a_directory_per_execution(make_job, reference):
    ref = reference(2)
    job = make_job(2)
    res = job.run(*ref.app_args(), "--steps", 4, "--file-mode").ok()
    files = job.scratch / "files" / job.run_id
    # Each execution's directory is gone once it ended (its files live in the shards).
    assert not files.exists() or not list(files.iterdir()), list(files.iterdir())
    res = job.run(*ref.app_args(), "--steps", STEPS, "--file-mode").ok()
    assert res.restarted_from == 4 and res.final_hash == ref.final_hash, res.describe()
    shutil.rmtree(job.scratch, ignore_errors=True)


def test_gc_scratch_removes_what_a_killed_run_left(make_job, reference):
    ref = reference(2)
    cfg = {"persistent_interval": 2, "keep_local": 1}
    a = make_job(2, run="shared")
    res = a.run(*ref.app_args(), "--steps", STEPS, "--die-after", 10, "--silence-ms", 1000, **cfg)
    assert res.rc != 0 and a.committed() == [4, 8] and a.local_complete()[-1] == 10, res.describe()
    assert (a.scratch / "recycle" / "shared").is_dir()  # files of versions retention removed
    # Another store's run in the same node-local directory, killed too.
    other = make_job(2, run="other", scratch=a.scratch)
    res = other.run(*ref.app_args(), "--steps", STEPS, "--die-after", 2, "--silence-ms", 1000)
    assert res.rc != 0, res.describe()
    # A run of store A that is being written (its lease is live).
    live = make_job(2, run="live", scratch=a.scratch, store=a.store)
    p, flag = start_paused(live, ref, 2)
    try:
        dry = harness.run_cli("gc", a.store, "--scratch", a.scratch, "--uncommitted", "--dry-run", "--json").ok()
        would = {(e["run"], e.get("version")) for e in json.loads(dry.stdout)["removed"]}
        assert ("shared", 10) in would, dry.stdout
        assert 10 in a.local_complete()  # a dry run
        out = harness.run_cli("gc", a.store, "--scratch", a.scratch, "--json").ok()
        doc = json.loads(out.stdout)
        removed = {(e["run"], e.get("version")) for e in doc["removed"]}
        local = [v for v in a.versions("local")]
        assert local == [10], (local, out.stdout)  # committed ones, and older uncommitted ones
        assert ("shared", 8) in removed, out.stdout
        assert not any(run != "shared" for run, _ in removed), out.stdout
        assert any(e["run"] == "shared" and "recycle" in e["path"] for e in doc["removed"]), out.stdout
        assert [(e["run"], e["version"]) for e in doc["kept_uncommitted"]] == [("shared", 10)], out.stdout
        left = {e["run"]: e["reason"] for e in doc["left_alone"]}
        assert left["live"].startswith("being written by") and "ckpt_app" in left["live"], out.stdout
        assert left["other"].startswith("not a run of"), out.stdout
        assert doc["bytes"] > 0
    finally:
        flag.touch()
        harness.finish_process(p).ok()
    restored_as_reference(a, ref, 10, **cfg)
