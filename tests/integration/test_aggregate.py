"""Aggregated persistent level (persistent_layout = aggregated, issue 10) on the
test machine's file system, under mpirun: every strategy writes M data files
and one MANIFEST per version (no shard file), restart reads every rank's image
straight from the data files and restores it bit for bit, damage and kills at
any moment never make a partial version restorable, and configurations that
cannot work are refused at init with the reason. The same on CephFS, with
separate clients per emulated node, is tests/integration/test_aggregate_ceph.py.
"""
import json
import os
import random
import signal
import time

import pytest

import harness
from harness import assert_same_state

STRATEGIES = ["posix_shared", "aligned", "leaders", "mpiio"]


def aggregated(strategy, files=1, **extra):
    cfg = {"persistent_layout": "aggregated", "aggregate_strategy": strategy, "aggregate_files": files,
           "ranks_per_node": 2, "stripe_size": "64K"}
    cfg.update(extra)
    return cfg


def manifest(job, version):
    text = job.manifest(version).read_text()
    return json.loads(text[:text.rindex("xxh3 ")])


def check_container(job, version, strategy, files):
    """The version is M data files and a MANIFEST, whose index tiles every
    rank's image inside the data files."""
    d = job.version_dir("persistent", version)
    names = sorted(p.name for p in d.iterdir())
    assert names == sorted([f"data.{k:06d}" for k in range(files)] + ["MANIFEST"]), names
    m = manifest(job, version)
    assert m["format_version"] == 2 and m["layout"] == "aggregated"
    c = m["container"]
    assert c["strategy"] == strategy and len(c["files"]) == files
    for f in c["files"]:
        assert (d / f["name"]).stat().st_size >= f["size"]
    for s in m["shards"]:
        at = 0
        for src, length, f, offset, checksum in s["extents"]:
            assert src == at and length > 0 and offset + length <= c["files"][f]["size"]
            if strategy == "aligned":
                assert offset % (64 << 10) == 0, f"rank {s['rank']}: extent at {offset} is not stripe aligned"
            at += length
        assert at == s["size"]
    return m


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("mode,files", [(2, 1), (4, 2)])
def test_aggregated_stop_and_restart(strategy, mode, files, reference, make_job):
    """Stopped after 7 steps (versions 2, 4, 6 aggregated) and rerun to 10
    with the local level removed: the restart reads version 6 from the data
    files and its state equals the uninterrupted run's, bit for bit."""
    if strategy == "mpiio" and files > 1:
        pytest.skip("mpiio writes one shared file")
    ref = reference(mode)
    job = make_job(mode)
    cfg = aggregated(strategy, files)
    job.run("--steps", 7, **cfg).ok()
    assert job.committed() == [2, 4, 6]
    for v in (2, 4, 6):
        m = check_container(job, v, strategy, files)
    leaders = m["container"]["leaders"]
    assert m["nranks"] == mode
    if strategy == "leaders":
        # M leaders, one writer per data file, spread over the emulated nodes (2 ranks each).
        assert len(leaders) == files and len({r // 2 for r in leaders}) == files, leaders
        assert [f["writers"] for f in m["container"]["files"]] == [[r] for r in leaders]
        assert m["container"]["bytes_between_nodes"] + m["container"]["bytes_within_nodes"] > 0
    else:
        assert sorted(leaders) == list(range(mode))
    harness.remove_tree(job.scratch)
    second = job.run("--steps", 10, "--dump-restored", job.dumps / "restored", **cfg).ok()
    assert second.restarted_from == 6
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "state restored from the data files")
    assert second.final_hash == ref.final_hash
    assert job.committed() == [2, 4, 6, 8, 10]


def test_damaged_data_file_falls_back_to_older_version(reference, make_job):
    """One byte flipped in the middle of rank 1's extent of version 6 (its
    data; persistent level only): the restart refuses 6 (checksum) and
    restores 4 bit for bit."""
    ref = reference(2)
    job = make_job(2)
    cfg = aggregated("aligned", 1, local_enabled="false")
    job.run("--steps", 7, **cfg).ok()
    m = manifest(job, 6)
    src, length, f, offset, _ = m["shards"][1]["extents"][-1]
    path = job.version_dir("persistent", 6) / m["container"]["files"][f]["name"]
    with open(path, "r+b") as fh:
        fh.seek(offset + length // 2)
        b = fh.read(1)
        fh.seek(offset + length // 2)
        fh.write(bytes([b[0] ^ 0x40]))
    again = job.run("--steps", 10, "--dump-restored", job.dumps / "restored", **cfg).ok()
    assert again.restarted_from == 4, again.describe()
    assert_same_state(ref.dump(4), job.read_dump(job.dumps / "restored"), "state restored from version 4")
    assert again.final_hash == ref.final_hash


@pytest.mark.parametrize("rank", [0, 1])
def test_kill_mid_write_commits_nothing(rank, reference, make_job):
    """A rank killed halfway through writing its extent of version 6: 6 is
    not committed (the data file exists, the MANIFEST does not), versions 2
    and 4 restore bit for bit, and the rerun commits 6 and every later one."""
    ref = reference(2)
    job = make_job(2)
    cfg = aggregated("posix_shared", 1, local_enabled="false")
    killed = job.run("--steps", 10, "--wait-persistent",
                     fault_inject=f"level=persistent,action=kill,kind=write,version=6,rank={rank}", **cfg)
    assert killed.rc != 0 and not killed.timed_out, killed.describe()
    assert job.committed() == [2, 4]
    assert (job.version_dir("persistent", 6) / "data.000000").exists()
    again = job.run("--steps", 10, "--dump-restored", job.dumps / "restored", **cfg).ok()
    assert again.restarted_from == 4, again.describe()
    assert_same_state(ref.dump(4), job.read_dump(job.dumps / "restored"), "state restored from version 4")
    assert again.final_hash == ref.final_hash
    assert job.committed() == [2, 4, 6, 8, 10]
    check_container(job, 6, "posix_shared", 1)


@pytest.mark.parametrize("phase,spec", [
    ("local write", "level=local,action=kill,kind=write,version=6,rank=1"),
    ("transfer, sender", "level=transfer,action=kill,version=6,role=sender"),
    ("transfer, leader", "level=transfer,action=kill,version=6,role=leader"),
    ("leader writing", "level=persistent,action=kill,kind=write,version=6"),
    ("before the manifest", "level=persistent,action=kill,kind=rename,version=6,rank=0"),
])
def test_leaders_killed_at_each_phase(phase, spec, reference, make_job):
    """leaders, 4 ranks on 2 emulated nodes, 2 data files: a leader or a
    sender SIGKILLed at each phase of version 6's flush. 6 is not committed,
    the newest version every rank has at some level restores bit for bit,
    and the rerun commits 6, 8 and 10."""
    ref = reference(4)
    job = make_job(4)
    cfg = aggregated("leaders", 2, local_enabled="true" if phase == "local write" else "false")
    killed = job.run("--steps", 10, "--wait-persistent", fault_inject=spec, **cfg)
    assert killed.rc != 0 and not killed.timed_out, killed.describe()
    assert job.committed() == [2, 4], phase
    expected = job.restorable()
    again = job.run("--steps", 10, "--dump-restored", job.dumps / "restored", **cfg).ok()
    assert again.restarted_from == expected, f"{phase}\n" + again.describe()
    assert_same_state(ref.dump(expected), job.read_dump(job.dumps / "restored"), f"{phase}: restored {expected}")
    assert again.final_hash == ref.final_hash
    assert job.committed() == [2, 4, 6, 8, 10]
    check_container(job, 6, "leaders", 2)


@pytest.mark.parametrize("strategy,files", [("aligned", 2), ("leaders", 2), ("mpiio", 1)])
def test_kill_at_random_moments(strategy, files, reference, make_job):
    """Three runs of 4 ranks (a checkpoint every step) in which
    one random rank is SIGKILLed at a random moment, mid-capture, mid-write
    or between versions: whatever is committed restores bit for bit, nothing
    uncommitted is restored, and the rerun commits every later version."""
    ref = reference(4, every=1)
    rng = random.Random(int(os.environ.get("CAIRN_TEST_SEED", "10")))
    kills = []
    for trial in range(3):
        job = make_job(4)
        cfg = aggregated(strategy, files, local_enabled="false")
        p = job.start("--steps", 10, "--every", 1, "--sleep-ms", 50, **cfg)
        harness.wait_rank_pids(p.pid, 4)  # the random moment counts from the ranks' start
        time.sleep(rng.uniform(0.1, 0.5))
        ranks = harness.rank_pids(p.pid)
        assert ranks, f"trial {trial}: no rank process to kill\n" + harness.finish_process(p).describe()
        victim = rng.choice(sorted(ranks))
        os.kill(ranks[victim], signal.SIGKILL)
        killed = harness.finish_process(p)
        committed = job.committed()
        if killed.rc == 0:
            continue  # the run ended before the kill
        kills.append(committed)
        again = job.run("--steps", 10, "--every", 1, "--dump-restored", job.dumps / "restored", **cfg).ok()
        expected = max(committed, default=None)
        assert again.restarted_from == expected, f"trial {trial}, rank {victim} killed\n" + again.describe()
        if expected is not None:
            assert_same_state(ref.dump(expected), job.read_dump(job.dumps / "restored"), f"trial {trial}")
        assert again.final_hash == ref.final_hash
        assert job.committed() == list(range(1, 11))
    assert len(kills) >= 2, f"only {len(kills)} of 3 runs were killed before their end"


def test_leader_out_of_space_fails_the_version_on_every_rank(reference, make_job):
    """ENOSPC on the first leader's write of version 6 (leaders, 4 ranks, 2
    files; the run goes on): every rank gets CAIRN_ENOSPC (at most twice:
    once more when the second leader's failure is agreed later), from a later
    cairn_checkpoint or at finalize; 6 is not committed, every other version
    is (the checkpoint that returned the error still took its own version)."""
    ref = reference(4)
    job = make_job(4)
    cfg = aggregated("leaders", 2, local_enabled="false")
    res = job.run("--steps", 10, "--keep-going",
                  fault_inject="level=persistent,action=error,errno=28,kind=write,version=6", **cfg).ok()
    reports = {}
    for (r, v), (rc, msg) in res.failed_checkpoints().items():
        # The checkpoint took its version and names the earlier failure's code.
        assert rc == harness.CAIRN_EEARLIER and "(no_space)" in msg, res.describe()
        reports.setdefault(r, []).append(harness.CAIRN_ENOSPC)
    for r, rc in res.finalize_errors().items():
        reports.setdefault(r, []).append(rc)
    assert sorted(reports) == [0, 1, 2, 3], "the error was dropped on some rank\n" + res.describe()
    # Each leader's write fails; when the second leader's failure comes after
    # the first was agreed, it is reported again (once more).
    assert all(1 <= len(v) <= 2 and set(v) == {harness.CAIRN_ENOSPC} for v in reports.values()), res.describe()
    # The checkpoint that returned the error took its version: every version but 6 is committed.
    assert job.committed() == [2, 4, 8, 10], job.committed()
    assert res.final_hash == ref.final_hash


@pytest.mark.parametrize("cfg,words", [
    ({"aggregate_files": 3}, ["aggregate_files = 3", "2 ranks"]),
    ({"aggregate_strategy": "mpiio", "aggregate_files": 2}, ["mpiio", "aggregate_files = 1"]),
    ({"stripe_size": "5000"}, ["stripe_size", "4 KiB"]),
    ({"agents": "127.0.0.1:1"}, ["aggregated", "agents"]),
])
def test_configuration_that_cannot_work_is_refused_at_init(cfg, words, make_job):
    """Refused by cairn_init on every rank with the reason; nothing written."""
    job = make_job(2)
    full = aggregated("aligned", 1)
    full.update(cfg)
    res = job.run("--steps", 3, **full)
    assert res.rc != 0, res.describe()
    for w in words:
        assert w in res.stderr, f"'{w}' missing from the error\n" + res.describe()
    assert job.committed() == []


def test_ranks_configured_differently_get_an_error_not_a_deadlock(make_job):
    """persistent_layout = aggregated given to rank 0 only (an MPMD launch
    whose -x reached one app context): cairn_init fails on both ranks with
    the reason, within the harness's timeout; nothing is written."""
    job = make_job(2)
    app = str(harness.bin_dir() / "ckpt_app")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none",
           "-n", "1", "-x", "CAIRN_PERSISTENT_LAYOUT=aggregated", app, "--steps", "3", ":",
           "-n", "1", app, "--steps", "3"]
    res = harness.run_process(cmd, job.env(), job.root)
    assert res.rc != 0 and not res.timed_out, res.describe()
    assert "ranks disagree on the persistent level's layout" in res.stderr, res.describe()
    assert job.committed() == []

