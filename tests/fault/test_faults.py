"""Fault tests: processes killed mid-checkpoint, a level lost or damaged, the
persistent level full or unwritable. After each fault the application is run
again, and the state it restores is compared bit for bit with the state of an
uninterrupted run (session fixture `reference`) at the same version.

Faults come from the test hook CAIRN_FAULT_INJECT (config key fault_inject,
storage::parse_fault_plan and make_planned_fault_env in
src/storage/storage_env.hpp), from editing the directories, and, as
root, from mounts: a small tmpfs as the persistent level (really full), a
read-only bind mount over a checkpoint's directory (really unwritable). The
mount tests are skipped where mounting is not permitted.

Unless a test says otherwise: 2 ranks, checkpoints every 2 steps (versions 2,
4, 6, ...), 64 KiB of float data per rank, keep_local = 2.
"""
import json
import os
import re
import subprocess

import pytest

import harness
from harness import CAIRN_EEARLIER, CAIRN_EIO, CAIRN_ENOSPC, assert_same_state, flip_in_region, remove_tree


def restart_and_compare(job, ref, expected, steps=0, label="", **cfg):
    """Runs job to `steps` (0: restore only), with configuration keys `cfg`,
    asserts it restarted from `expected` (None: from scratch) with exactly the
    uninterrupted state, and returns the result."""
    prefix = job.dumps / f"restored{label}"
    res = job.run(*ref.app_args(), "--steps", steps, "--dump-restored", prefix, **cfg).ok()
    assert res.restarted_from == expected, res.describe()
    if expected is not None:
        assert_same_state(ref.dump(expected), job.read_dump(prefix), f"state restored from version {expected}")
    if steps == ref.versions[-1]:
        assert res.final_hash == ref.final_hash, "final state differs from the uninterrupted run"
    return res


def verify(*args):
    """`cairn verify` result, or None when the CLI is not built."""
    if harness.cli_path() is None:
        return None
    return harness.run_cli("verify", *map(str, args))


def skip_if_no_cli(reason):
    if harness.cli_path() is None:
        pytest.skip(f"{reason}; the 'cairn verify' part is not checked: the cairn CLI (target cairn_cli) "
                    "is not built or CAIRN_TEST_CLI is unset")


# ---------------------------------------------------------------------------
class TestKill:
    """SIGKILL of one rank in the middle of capture, of its local (L1) write,
    or of its persistent flush of version 6, each earlier version having been
    waited for at the persistent level."""

    # The hook kills at the first write into the version's directory. These
    # runs turn the hash trees off (hash_trees = false) so that this write is
    # the shard's: the process dies halfway through the shard. Level
    # "manifest": rank 0 killed while writing the MANIFEST of version 6
    # (file=MANIFEST), all shards durable.
    # variant "overlap": write_during_capture = true, the persistent write
    # following the copy (the path taken when engine threads have cores of
    # their own). "cow": capture = cow, the regions write-protected and
    # copied in the background while the application computes on (killed
    # at "capture": right after the protection, the copy under way).
    # "while": the restarts verify the node-local level while they read it
    # (restart_verify = while).
    @pytest.mark.parametrize("nranks,level,rank,variant", [
        (2, "capture", 0, ""), (2, "capture", 1, ""),
        (2, "local", 0, ""), (2, "local", 1, ""),
        (2, "persistent", 0, ""), (2, "persistent", 1, ""),
        (2, "manifest", 0, ""),
        (4, "capture", 2, ""), (4, "local", 3, ""), (4, "persistent", 3, ""),
        (2, "capture", 1, "overlap"), (2, "persistent", 0, "overlap"), (2, "manifest", 0, "overlap"),
        (2, "capture", 1, "cow"), (2, "local", 0, "cow"), (2, "persistent", 1, "cow"), (2, "manifest", 0, "cow"),
        (2, "local", 1, "while"), (2, "persistent", 0, "while"), (2, "manifest", 0, "while"),
    ])
    def test_kill_restores_newest_committed_version(self, nranks, level, rank, variant, reference, make_job):
        ref = reference(nranks)
        job = make_job(nranks)
        if level == "capture":
            spec = f"level=capture,action=kill,version=6,rank={rank}"
        elif level == "manifest":
            # Whichever rank writes the MANIFEST of 6 first (the last to make
            # its shard durable, on its engine thread, or rank 0 once the
            # ranks agreed) dies in the write.
            spec = "level=persistent,action=kill,kind=write,version=6,file=MANIFEST"
        else:
            spec = f"level={level},action=kill,kind=write,version=6,rank={rank}"
        killed = job.run("--steps", 10, "--wait-persistent", fault_inject=spec, hash_trees="false",
                         write_during_capture="true" if variant == "overlap" else "auto",
                         capture="cow" if variant == "cow" else "copy")
        assert killed.rc != 0 and not killed.timed_out, killed.describe()
        assert "final hash" not in killed.stdout, killed.describe()
        waits = killed.waits()
        for r in range(nranks):
            assert waits.get((r, 2), (None,))[0] == 0 and waits.get((r, 4), (None,))[0] == 0, killed.describe()
        # A version some rank was told is durable at the persistent level is
        # committed. The levels run side by side: killed in its local write,
        # a rank may have made its persistent shard durable first, and the
        # last writer commits 6 (the other ranks may see it). Killed in the
        # capture or the persistent write, 6 is never committed; killed in
        # the MANIFEST write, only if another writer committed it first.
        reported = any(v == 6 and rc == 0 for (_, v), (rc, _) in waits.items())
        committed = job.committed()
        assert committed in ([2, 4], [2, 4, 6]), killed.describe()
        if reported:
            assert 6 in committed, killed.describe()
        if level in ("capture", "persistent"):
            assert committed == [2, 4], killed.describe()
        full_size = job.shard("persistent", 4, rank).stat().st_size
        local_tmp = job.shard("local", 6, rank).with_name(f"shard.{rank:06d}.tmp")
        persistent_tmp = job.shard("persistent", 6, rank).with_name(f"shard.{rank:06d}.tmp")
        # Evidence that the process died where the hook says.
        if level == "capture":
            for lvl in ("local", "persistent"):
                assert not job.shard(lvl, 6, rank).exists()
            # The persistent write follows the capture: its temporary may
            # have begun; the local level waits for the whole image.
            assert not local_tmp.exists()
        elif level == "local":
            # The temporary may be a recycled shard (full size, overwritten in
            # place); the persistent write runs beside the local one.
            assert local_tmp.is_file() and local_tmp.stat().st_size > 0
            assert not job.shard("local", 6, rank).exists()
        elif level == "persistent":
            # Killed inside the write: the hook writes half of it, in whole
            # 4 KiB pages (none when the capture had less than 8 KiB ready,
            # as under load with write_during_capture).
            assert persistent_tmp.is_file() and persistent_tmp.stat().st_size < full_size
            assert not job.shard("persistent", 6, rank).exists()
        else:
            for r in range(nranks):
                assert job.shard("persistent", 6, r).stat().st_size == full_size
            assert 6 in committed or any(f.name.startswith("MANIFEST.tmp") for f in job.version_dir("persistent", 6).iterdir())

        # Restart with both levels: the newest version committed at some level
        # on every rank. Killed mid-capture or mid-L1-write, that is 4; killed
        # mid-flush, 6 when every rank's L1 shard of 6 was written (the other
        # ranks may have been killed before they wrote theirs), else 4; killed
        # mid-MANIFEST, 6 (every shard was durable, so every L1 shard written).
        expected = job.restorable()
        if level == "persistent":
            assert expected in (4, 6)
            assert (expected == 6) == (job.local_complete()[-1:] == [6])
        elif level == "manifest":
            assert expected == 6
        else:
            assert expected == (6 if 6 in committed else 4)
        verify_cfg = {"restart_verify": "while"} if variant == "while" else {}
        restart_and_compare(job, ref, expected, label=".a", **verify_cfg)
        # A version restored from the node-local level alone is committed by
        # the execution that restored it.
        assert job.committed() == sorted(set(committed) | {expected}), job.committed()

        # Restart from the persistent level alone: the newest committed
        # version, never a partial one.
        remove_tree(job.scratch)
        restart_and_compare(job, ref, expected, steps=10, label=".b", capture="cow" if variant == "cow" else "copy")
        assert job.committed() == [2, 4, 6, 8, 10]

    @pytest.mark.parametrize("level,rank", [("local", 1), ("persistent", 0)])
    def test_kill_at_first_write_with_default_configuration(self, level, rank, reference, make_job):
        """Default configuration (hash trees on): killed at the first write of
        version 6 at a level, whatever file that is. No file of that rank is
        committed at that level; the restart takes version 4, or 6 from L1
        when every rank's L1 shard of 6 exists; with L1 gone, version 4."""
        ref = reference(2)
        job = make_job(2)
        killed = job.run("--steps", 10, "--wait-persistent",
                         fault_inject=f"level={level},action=kill,kind=write,version=6,rank={rank}")
        assert killed.rc != 0 and not killed.timed_out, killed.describe()
        assert job.committed() == [2, 4]
        d = job.version_dir(level, 6)
        assert not job.shard(level, 6, rank).exists()
        assert list(d.glob(f"*.{rank:06d}.tmp")), f"no temporary file of rank {rank} in {d}"
        expected = job.restorable()
        assert expected == (6 if level == "persistent" and 6 in job.local_complete() else 4)
        restart_and_compare(job, ref, expected, label=".a")
        # 6 restored from L1 alone is committed by the execution that restored it.
        assert job.committed() == sorted({2, 4, expected}), job.committed()
        remove_tree(job.scratch)
        restart_and_compare(job, ref, expected, steps=10, label=".b")

    @pytest.mark.parametrize("level", ["local", "persistent"])
    def test_kill_with_flushes_in_flight(self, level, reference, make_job):
        """Killed mid-write of version 6 without waiting for any flush, so
        several versions may be in flight: the restart takes exactly the newest
        version that every rank has committed at some level (read back from
        the directories), and with L1 gone the newest persistent commit."""
        ref = reference(2)
        job = make_job(2)
        killed = job.run("--steps", 10, fault_inject=f"level={level},action=kill,kind=write,version=6,rank=1")
        assert killed.rc != 0 and not killed.timed_out, killed.describe()
        assert 6 not in job.committed()
        expected = job.restorable()
        if level == "local":
            # Rank 1 died before its L1 shard of 6, so before any later one.
            assert expected is None or expected < 6
        restart_and_compare(job, ref, expected, label=".a")
        remove_tree(job.scratch)
        # The restored version is committed now (from L1 alone, by the
        # execution that restored it); nothing newer is.
        newest = max(job.committed(), default=None)
        assert newest == expected, job.committed()
        restart_and_compare(job, ref, newest, steps=10, label=".b")


# ---------------------------------------------------------------------------
class TestLostOrDamagedLevel:
    """The L1 directory deleted before the restart; one byte flipped in a
    shard or a MANIFEST: detected, never restored, the other level or an older
    version is used, and `cairn verify` names the file."""

    def test_local_level_deleted_restarts_from_persistent(self, reference, make_job):
        ref = reference(2)
        job = make_job(2)
        job.run("--steps", 7).ok()
        remove_tree(job.scratch)
        res = restart_and_compare(job, ref, 6, steps=10)
        assert "unusable" not in res.stderr, res.describe()

    def test_local_level_deleted_falls_back_to_older_persistent_version(self, reference, make_job):
        """persistent_interval = 2: versions 4 and 8 are flushed, 2, 6 and 10
        only written locally. Without L1 the restart takes 8. With L1 it takes
        10, and commits it (a version restored from L1 alone): then without
        L1 the restart takes 10."""
        ref = reference(2)
        cfg = {"persistent_interval": 2}
        for with_l1 in (False, True):
            job = make_job(2)
            job.run("--steps", 10, **cfg).ok()
            assert job.committed() == [4, 8]
            assert job.local_complete() == [8, 10]
            if with_l1:
                restart_and_compare(job, ref, 10, label=".a")
                assert job.committed() == [4, 8, 10]
            remove_tree(job.scratch)
            restart_and_compare(job, ref, 10 if with_l1 else 8, steps=10, label=".b")

    @pytest.mark.parametrize("damage,when", [("field", "before"), ("ints", "before"), ("step", "before"),
                                             ("<header>", "before"), ("truncated", "before"),
                                             ("field", "while"), ("<header>", "while"), ("truncated", "while")])
    def test_flipped_byte_in_local_shard_uses_persistent_copy(self, damage, when, reference, make_job):
        """One byte of rank 1's local shard of version 6 flipped (in a data
        region or in the header's region table), or the shard cut to half its
        size: the restart reports the local copy unusable and restores the
        persistent copy of the same version. With restart_verify = while, a
        damaged data region is found by cairn_restart as it reads it into
        place, and rank 1 restores from the persistent copy before it returns."""
        ref = reference(2)
        job = make_job(2)
        job.run("--steps", 7).ok()
        bad = job.shard("local", 6, 1)
        if damage == "truncated":
            os.truncate(bad, bad.stat().st_size // 2)
        else:
            flip_in_region(bad, damage)
        checked = verify(job.store, "--scratch", job.scratch)
        if checked is not None:
            assert checked.rc == 1 and str(bad) in checked.stdout, checked.describe()
            assert str(job.store) not in checked.stdout.replace(str(bad), ""), checked.describe()
            store_only = verify(job.store)
            assert store_only.rc == 0, store_only.describe()
        res = restart_and_compare(job, ref, 6, steps=10, restart_verify=when)
        found = ("node-local copy of 'ckpt' version 6 damaged" if when == "while" and damage == "field"
                 else "local copy of 'ckpt' version 6 unusable")
        assert re.search(f"rank 1: {found}", res.stderr), res.describe()
        assert "rank 0: local copy" not in res.stderr and "rank 0: node-local copy" not in res.stderr, res.describe()
        assert "persistent copy" not in res.stderr, res.describe()
        if checked is None:
            skip_if_no_cli("restart assertions passed")

    @pytest.mark.parametrize("when", ["before", "while"])
    def test_flipped_byte_in_both_levels_falls_back_to_older_version(self, when, reference, make_job):
        """With restart_verify = before, restart_test skips version 6. With
        while, it offers 6 (its headers are intact), cairn_restart finds the
        damage on both levels and fails with CAIRN_ECORRUPT, and the
        application asks restart_test again, which offers 4. The version is
        recorded as damaged (DAMAGED), the CLI says so, and checkpointing 6
        again removes the record."""
        ref = reference(2)
        job = make_job(2)
        job.run("--steps", 7).ok()
        bad = [job.shard("local", 6, 1), job.shard("persistent", 6, 1)]
        for path in bad:
            flip_in_region(path, "field")
        checked = verify(job.store, "--scratch", job.scratch)
        if checked is not None:
            assert checked.rc == 1, checked.describe()
            for path in bad:
                assert str(path) in checked.stdout, checked.describe()
        res = restart_and_compare(job, ref, 4, restart_verify=when, label=".a")
        lost = "node-local copy" if when == "while" else "local copy"
        assert f"rank 1: {lost} of 'ckpt' version 6 " in res.stderr, res.describe()
        assert "rank 1: persistent copy of 'ckpt' version 6 unusable" in res.stderr, res.describe()
        assert ("restart of version 6 failed" in res.stdout) == (when == "while"), res.describe()
        record = job.manifest(6).parent / "DAMAGED"
        assert record.exists() == (when == "while")
        if checked is not None:
            listed = harness.run_cli("ls", str(job.store), "--json")
            assert listed.rc == 0, listed.describe()
            six = [v for v in json.loads(listed.stdout)["versions"] if v["version"] == 6]
            assert len(six) == 1 and bool(six[0]["damaged"]) == (when == "while"), listed.describe()
            if when == "while":
                store_only = verify(job.store)
                assert store_only.rc == 1 and str(record) in store_only.stdout, store_only.describe()
                usable = harness.run_cli("restartable", str(job.store), "ckpt", "--ranks", "2", "--json")
                assert usable.rc == 0, usable.describe()
                six = [v for v in json.loads(usable.stdout)["versions"] if v["version"] == 6]
                assert not six[0]["restartable"] and "damaged" in six[0]["why_not"], usable.describe()
        # Version 6 written again by the execution that goes on: the record goes.
        restart_and_compare(job, ref, 4, steps=10, restart_verify=when, label=".b")
        assert not record.exists()
        restart_and_compare(job, ref, 10, steps=10, restart_verify=when, label=".c")
        if checked is None:
            skip_if_no_cli("restart assertions passed")

    @pytest.mark.parametrize("what", ["shard", "manifest"])
    def test_damaged_persistent_copy_is_never_restored(self, what, reference, make_job):
        """A byte flipped in rank 0's persistent shard of version 6, or in the
        version's MANIFEST: the intact local copy still restores 6; with L1
        gone the restart falls back to version 4."""
        ref = reference(2)
        job = make_job(2)
        job.run("--steps", 7).ok()
        if what == "shard":
            bad = job.shard("persistent", 6, 0)
            flip_in_region(bad, "field")
        else:
            bad = job.manifest(6)
            harness.flip_byte(bad, bad.stat().st_size // 2)
        checked = verify(job.store)
        if checked is not None:
            assert checked.rc == 1 and str(bad) in checked.stdout, checked.describe()
        res = restart_and_compare(job, ref, 6, label=".a")
        assert "unusable" not in res.stderr, res.describe()
        remove_tree(job.scratch)
        res = restart_and_compare(job, ref, 4, steps=10, label=".b")
        assert "persistent copy of 'ckpt' version 6 unusable" in res.stderr, res.describe()
        if checked is None:
            skip_if_no_cli("restart assertions passed")


    def test_stale_local_shard_of_an_earlier_execution_is_not_restored(self, make_job):
        """Execution A writes version 6. Rank 1's copies of 6 are damaged, so
        execution B restarts from 4 and, with another history (--variant 1),
        writes version 6 again; B's L1 write of 6 fails on rank 0 (injected
        EIO), so rank 0's L1 still holds A's shard while the MANIFEST of 6
        commits B's shards. Restarting, every rank must get B's version 6 (the
        state restored from the persistent level alone), never A's shard on
        rank 0 next to B's on rank 1."""
        job = make_job(2)
        job.run("--steps", 6).ok()
        for lvl in ("local", "persistent"):
            flip_in_region(job.shard(lvl, 6, 1), "field")
        b = job.run("--steps", 6, "--variant", 1, "--keep-going",
                    fault_inject="level=local,action=error,errno=5,kind=write,version=6,rank=0").ok()
        assert b.restarted_from == 4
        assert job.committed() == [2, 4, 6]
        # B's history without faults: 4 steps of history 0, then 2 of history 1.
        ref_b = make_job(2)
        ref_b.run("--steps", 4).ok()
        ref_b.run("--steps", 6, "--variant", 1, "--dump-at", 6, ref_b.dumps / "b6").ok()
        expected = ref_b.read_dump(ref_b.dumps / "b6")

        with_l1 = job.run("--steps", 0, "--dump-restored", job.dumps / "with_l1").ok()
        assert with_l1.restarted_from == 6
        remove_tree(job.scratch)
        without_l1 = job.run("--steps", 0, "--dump-restored", job.dumps / "without_l1").ok()
        assert without_l1.restarted_from == 6
        assert_same_state(expected, job.read_dump(job.dumps / "without_l1"), "committed version 6 (persistent level)")
        # Fails today: rank 0 gets execution A's state of version 6.
        assert_same_state(expected, job.read_dump(job.dumps / "with_l1"), "version 6 restored with L1 present")


# ---------------------------------------------------------------------------
class Mounts:
    """Mounts made by one test (root with CAP_SYS_ADMIN; the test is skipped
    otherwise), undone in reverse order when it ends."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.done = []

    def _mount(self, *args, target):
        res = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            pytest.skip(f"cannot mount ({' '.join(args)}; needs root with CAP_SYS_ADMIN): {res.stderr.strip()}")
        if not self.done or self.done[-1] != target:
            self.done.append(target)

    def tmpfs(self, size):
        """A fresh tmpfs of `size` (e.g. '2m')."""
        point = self.tmp_path / f"tmpfs{len(self.done)}"
        point.mkdir()
        self._mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point), target=point)
        return point

    def read_only(self, directory):
        """Makes `directory` read-only with a read-only bind mount over it
        (files opened elsewhere, like the catalog, are not in the way)."""
        self._mount("--bind", str(directory), str(directory), target=directory)
        self._mount("-o", "remount,bind,ro", str(directory), target=directory)

    def undo(self, directory=None):
        for point in reversed(list(self.done)):
            if directory is None or point == directory:
                subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)
                self.done.remove(point)


@pytest.fixture
def mounts(tmp_path):
    m = Mounts(tmp_path)
    yield m
    m.undo()


def assert_error_on_every_rank(res, nranks, kind, version, code, needle):
    """`kind` (wait or checkpoint) of `version` returned `code` on every rank,
    with a message containing `needle`. A checkpoint took its version and
    reports an earlier version's failure: CAIRN_EEARLIER, naming the code."""
    lines = res.waits() if kind == "wait" else res.failed_checkpoints()
    for r in range(nranks):
        assert (r, version) in lines, f"rank {r} printed no {kind} {version} error\n" + res.describe()
        rc, msg = lines[(r, version)]
        want = code
        if kind == "checkpoint":
            want = CAIRN_EEARLIER
            assert f"version {version} was taken; an earlier version failed ({CODE_NAMES[code]})" in msg, msg
        assert rc == want and needle in msg, f"rank {r} {kind} {version}: rc={rc} msg={msg}\n" + res.describe()


CODE_NAMES = {CAIRN_EIO: "io_error", CAIRN_ENOSPC: "no_space"}


class TestFullOrUnwritable:
    """The persistent level fails: the error reaches cairn_wait for the
    version and the next cairn_checkpoint on every rank (with the failing
    rank's message), later checkpoints work again where the level recovers,
    and the versions committed before stay intact."""

    @pytest.mark.parametrize("spec,code,failing,needle", [
        pytest.param("errno=28,kind=write,rank=1", CAIRN_ENOSPC, 1, "No space left on device", id="enospc-rank1"),
        pytest.param("errno=28,kind=write", CAIRN_ENOSPC, 0, "No space left on device", id="enospc-all-ranks"),
        pytest.param("errno=13,kind=create,rank=0", CAIRN_EIO, 0, "Permission denied", id="eacces-create-rank0"),
        pytest.param("errno=5,kind=sync,rank=1", CAIRN_EIO, 1, "Input/output error", id="eio-sync-rank1"),
        # With hash trees off (below), rank 0's second persistent write of
        # version 6 (after=1) is its MANIFEST.
        pytest.param("errno=28,kind=write,rank=0,after=1", CAIRN_ENOSPC, 0, "No space left on device",
                     id="enospc-manifest"),
    ])
    def test_injected_error_reaches_wait_and_next_checkpoint(self, spec, code, failing, needle, reference, make_job):
        ref = reference(2)
        job = make_job(2)
        cfg = {"hash_trees": "false"} if "after=1" in spec else {}
        res = job.run("--steps", 10, "--wait-persistent", "--keep-going",
                      fault_inject=f"level=persistent,action=error,version=6,{spec}", **cfg).ok()
        waits = res.waits()
        for r in range(2):
            for v in (2, 4, 10):
                assert waits.get((r, v), (None,))[0] == 0, res.describe()
            # The message of a rank other than the failing one names the failing rank.
            if r != failing:
                assert waits[(r, 6)][1].startswith(f"rank {failing}: "), res.describe()
        assert_error_on_every_rank(res, 2, "wait", 6, code, needle)
        assert_error_on_every_rank(res, 2, "checkpoint", 8, code, needle)
        assert set(res.failed_checkpoints()) == {(0, 8), (1, 8)}, res.describe()
        assert res.finalize_errors() == {}, res.describe()  # consumed by checkpoint 8
        # Checkpoint 8 reported 6's failure and still took version 8.
        assert job.committed() == [2, 4, 8, 10]
        # The failed write left no partial file behind.
        assert not list(job.version_dir("persistent", 6).glob("*.tmp"))
        checked = verify(job.store)
        if checked is not None:
            assert checked.rc == 0, checked.describe()

        # Versions 2 and 4 are intact; versions 8 (whose checkpoint reported
        # the error) and 10, written after it, too.
        restart_and_compare(job, ref, 10, label=".a")
        remove_tree(job.scratch)
        remove_tree(job.version_dir("persistent", 10))
        restart_and_compare(job, ref, 8, label=".b")

    def test_background_error_is_never_dropped(self, reference, make_job):
        """ENOSPC injected into rank 1's flush of version 6 with nobody
        waiting: the error comes back exactly once, on every rank, from the
        same later cairn_checkpoint or from cairn_finalize."""
        ref = reference(2)
        job = make_job(2)
        res = job.run("--steps", 10, "--keep-going",
                      fault_inject="level=persistent,action=error,errno=28,kind=write,version=6,rank=1").ok()
        reports = {}
        for (r, v), (rc, msg) in res.failed_checkpoints().items():
            reports.setdefault(r, []).append((f"checkpoint {v}", rc, msg))
        for r, rc in res.finalize_errors().items():
            reports.setdefault(r, []).append(("finalize", rc, ""))
        assert sorted(reports) == [0, 1], "the error was dropped\n" + res.describe()
        assert len(reports[0]) == 1 and len(reports[1]) == 1, res.describe()
        assert reports[0][0][:2] == reports[1][0][:2], "ranks disagree\n" + res.describe()
        where, rc, msg = reports[0][0]
        if where == "finalize":
            assert rc == CAIRN_ENOSPC, res.describe()
        else:
            assert rc == CAIRN_EEARLIER and "(no_space)" in msg and "version 6" in msg, res.describe()
        # The checkpoint that reported 6's failure still took its own version:
        # every version but 6 is committed.
        assert job.committed() == [2, 4, 8, 10]
        assert res.final_hash == ref.final_hash

    def test_persistent_level_full(self, mounts, reference, make_job):
        """A 2 MiB tmpfs as the persistent level, 2 ranks of ~272 KiB shards,
        a checkpoint every step: once it is full, the failing version's wait
        and the next checkpoint return CAIRN_ENOSPC on every rank, and the
        versions committed before it restore bit for bit."""
        steps, nbytes = 8, 256 * 1024
        ref = reference(2, steps=steps, every=1, nbytes=nbytes)
        job = make_job(2, store=mounts.tmpfs("2m"))
        res = job.run("--steps", steps, "--every", 1, "--bytes", nbytes, "--wait-persistent", "--keep-going").ok()
        waits = res.waits()
        failed = sorted(v for (r, v), (rc, _) in waits.items() if rc != 0)
        assert failed, "the tmpfs never filled up\n" + res.describe()
        first = failed[0]
        assert first >= 2, "not even one version fitted\n" + res.describe()
        for v in range(1, first):
            for r in range(2):
                assert waits[(r, v)][0] == 0, res.describe()
        assert_error_on_every_rank(res, 2, "wait", first, CAIRN_ENOSPC, "No space left on device")
        if first + 1 <= steps:
            assert_error_on_every_rank(res, 2, "checkpoint", first + 1, CAIRN_ENOSPC, "No space left on device")
        assert job.committed() == list(range(1, first))
        remove_tree(job.scratch)
        restart_and_compare(job, ref, first - 1)

    def test_persistent_level_made_read_only(self, mounts, reference, make_job):
        """The checkpoint's directory on the persistent level is made
        read-only (a read-only bind mount) while the job is paused after
        version 4: every later flush fails with CAIRN_EIO on every rank
        (cairn_wait of 6; cairn_checkpoint 8, taken, for 6's failure;
        cairn_checkpoint 10 or cairn_finalize for 8's, whichever comes after
        it was latched; cairn_finalize for the last), and versions 2 and 4
        stay intact."""
        ref = reference(2)
        job = make_job(2)
        flag = job.root / "go"
        p = job.start("--steps", 10, "--wait-persistent", "--keep-going", "--pause-after", 4, flag)
        try:
            job.wait_paused(p, flag)
            ckpt_dir = job.version_dir("persistent", 4).parent
            mounts.read_only(ckpt_dir)
        finally:
            flag.touch()  # the job goes on (or ends) whatever happened
            res = harness.finish_process(p)
        res.ok()
        needle = "Read-only file system"
        for r in range(2):
            assert res.waits()[(r, 4)][0] == 0, res.describe()
        assert_error_on_every_rank(res, 2, "wait", 6, CAIRN_EIO, needle)
        assert_error_on_every_rank(res, 2, "checkpoint", 8, CAIRN_EIO, needle)  # 6's failure; 8 taken
        # 8's failure comes back from checkpoint 10 (10 taken) when it was
        # latched by then, else from finalize (and wait 10 reports 10's).
        if (0, 10) in res.failed_checkpoints():
            assert_error_on_every_rank(res, 2, "checkpoint", 10, CAIRN_EIO, needle)
        else:
            assert_error_on_every_rank(res, 2, "wait", 10, CAIRN_EIO, needle)
        assert res.finalize_errors() == {0: CAIRN_EIO, 1: CAIRN_EIO}, res.describe()
        assert res.final_hash == ref.final_hash
        assert job.committed() == [2, 4]
        checked = verify(job.store)
        if checked is not None:
            assert checked.rc == 0, checked.describe()
        # Restart from the persistent level alone, still read-only: version 4.
        remove_tree(job.scratch)
        restart_and_compare(job, ref, 4)
