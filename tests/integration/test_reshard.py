"""Restart on another rank count (docs/design/reshard.md): a 2-D array with
halos, block-decomposed, written by N ranks and restored on M, must give the
global array an uninterrupted run on M ranks computes, bit for bit. Drives
tests/integration/reshard_app.c under real mpirun."""
import functools
import json
import os
import pathlib
import shutil
import subprocess

import pytest

import harness

if not harness.mpi_enabled():
    pytest.skip("MPI build needed", allow_module_level=True)

APP = harness.bin_dir() / "reshard_app"
STEPS = 10


def launch(nranks, root, args, **cfg):
    env = harness.base_env()
    env.update({"CAIRN_PERSISTENT": str(root / "store"), "CAIRN_SCRATCH": str(root / "scratch"),
                "CAIRN_RUN": "reshard", "CAIRN_KEEP_PERSISTENT": "0"})
    for k, v in cfg.items():
        env["CAIRN_" + k.upper()] = str(v)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(nranks), str(APP), *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=120)


def restartable(root, nranks):
    """`cairn restartable` of the test's store for `nranks` ranks (None without the CLI)."""
    cli = os.environ.get("CAIRN_TEST_CLI")
    if not cli:
        return None
    return subprocess.run([cli, "restartable", str(root / "store"), "grid", "--ranks", str(nranks), "--json"],
                          capture_output=True, text=True, timeout=60)


def describe(r):
    return f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


@functools.lru_cache(maxsize=None)
def _reference(mode, nranks, root):
    root = pathlib.Path(root)
    root.mkdir(parents=True)
    out = root / "out.bin"
    r = launch(nranks, root, [mode, STEPS, 0, out])
    assert r.returncode == 0 and "fresh" in r.stdout and "done" in r.stdout, describe(r)
    return out.read_bytes()


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("reference")
    return lambda mode, nranks: _reference(mode, nranks, str(base / f"{mode}-{nranks}"))


def committed(root):
    d = root / "store" / "runs" / "reshard" / "grid"
    return sorted(int(p.name[1:]) for p in d.iterdir() if (p / "MANIFEST").exists())


@pytest.mark.parametrize("layout", ["file_per_process", "aggregated"])
@pytest.mark.parametrize("old,new", [(4, 2), (2, 3), (3, 4)])
def test_restart_on_another_rank_count_matches_uninterrupted_run(old, new, layout, reference, tmp_path):
    """Stopped on `old` ranks after the checkpoint of step 6, restarted on `new`
    ranks from version 6 (the node-local copies are gone, as on new nodes, for
    the aggregated layout; kept and read where visible for file-per-process,
    with 512-byte hash-tree chunks so that partial reads are verified chunk by
    chunk): the final global array equals the uninterrupted run on `new` ranks."""
    cfg = {"persistent_layout": layout}
    if layout == "file_per_process":
        cfg["hash_chunk"] = 512
    r = launch(old, tmp_path, ["block", STEPS, 6, tmp_path / "x"], **cfg)
    assert r.returncode == 0 and "stopped 6" in r.stdout, describe(r)
    assert committed(tmp_path) == [2, 4, 6]
    if layout == "aggregated":
        assert list((tmp_path / "store/runs/reshard/grid/v000000000006").glob("data.*"))
        shutil.rmtree(tmp_path / "scratch")
    out = tmp_path / "out.bin"
    cli = restartable(tmp_path, new)
    if cli is not None:
        assert cli.returncode == 0, describe(cli)
        got = {v["version"]: (v["written_by"], v["restartable"], v["redistributed"])
               for v in json.loads(cli.stdout)["versions"]}
        assert got == {v: (old, True, True) for v in (2, 4, 6)}
    r = launch(new, tmp_path, ["block", STEPS, 0, out], **cfg)
    assert r.returncode == 0 and "restarted 6" in r.stdout, describe(r)
    assert f"written by {old} ranks, on {new} ranks" in r.stderr, describe(r)
    assert out.read_bytes() == reference("block", new)
    # The restarted run went on with versions 8 and 10 on its own rank count.
    assert committed(tmp_path) == [2, 4, 6, 8, 10]


def test_same_rank_count_still_restores_its_own_shards(reference, tmp_path):
    r = launch(2, tmp_path, ["block", STEPS, 6, tmp_path / "x"])
    assert r.returncode == 0, describe(r)
    out = tmp_path / "out.bin"
    r = launch(2, tmp_path, ["block", STEPS, 0, out])
    assert r.returncode == 0 and "restarted 6" in r.stdout and "redistributed" not in r.stderr, describe(r)
    assert out.read_bytes() == reference("block", 2)


def test_damaged_block_falls_back_to_an_older_version(reference, tmp_path):
    """A flipped byte in one old rank's block at the persistent level (no local
    copies): the chunk checksum catches it, version 6 is skipped, version 4 is
    restored on 3 ranks, and the result is still the uninterrupted run's."""
    r = launch(2, tmp_path, ["block", STEPS, 6, tmp_path / "x"], persistent_layout="file_per_process")
    assert r.returncode == 0, describe(r)
    shutil.rmtree(tmp_path / "scratch")
    shard = tmp_path / "store/runs/reshard/grid/v000000000006/shard.000001"
    data = bytearray(shard.read_bytes())
    data[8192 + 100] ^= 0x40  # in region "u" (regions in name order: "step" at 4096, "u" at 8192)
    shard.write_bytes(bytes(data))
    out = tmp_path / "out.bin"
    r = launch(3, tmp_path, ["block", STEPS, 0, out])
    assert r.returncode == 0 and "restarted 4" in r.stdout, describe(r)
    assert "checksum mismatch" in r.stderr or "restarted 4" in r.stdout
    assert out.read_bytes() == reference("block", 3)


def test_region_without_global_layout_is_a_clear_error_and_nothing_is_lost(reference, tmp_path):
    """'u' protected with cairn_protect (no layout) by 2 ranks: restart_test on
    3 ranks says checkpoints exist that this job cannot use (not "none"),
    names the region and what to do; the store is unchanged, and a restart on
    2 ranks still restores version 6 and ends like the uninterrupted run."""
    r = launch(2, tmp_path, ["nolayout", STEPS, 6, tmp_path / "x"])
    assert r.returncode == 0 and "stopped 6" in r.stdout, describe(r)
    ckpt = tmp_path / "store/runs/reshard/grid"
    before = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    r = launch(3, tmp_path, ["nolayout", STEPS, 0, tmp_path / "y"])
    assert r.returncode == 3, describe(r)
    assert "restart_test: -11 " in r.stdout, describe(r)  # CAIRN_EUNUSABLE, not CAIRN_ENOTFOUND
    assert "region 'u' has no global layout" in r.stdout and "cairn_protect_block" in r.stdout, describe(r)
    assert "written by 2 ranks; this job has 3" in r.stdout, describe(r)
    after = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    assert after == before
    cli = restartable(tmp_path, 3)
    if cli is not None:  # the CLI says the same, and exits 1: nothing usable on 3 ranks
        assert cli.returncode == 1, describe(cli)
        vs = json.loads(cli.stdout)["versions"]
        assert [v["version"] for v in vs] == [6, 4, 2] and not any(v["restartable"] for v in vs)
        assert all("region 'u' has no global layout" in v["why_not"] for v in vs)
        cli = restartable(tmp_path, 2)
        assert cli.returncode == 0 and all(v["restartable"] and not v["redistributed"]
                                           for v in json.loads(cli.stdout)["versions"]), describe(cli)
    out = tmp_path / "out.bin"
    r = launch(2, tmp_path, ["nolayout", STEPS, 0, out])
    assert r.returncode == 0 and "restarted 6" in r.stdout, describe(r)
    assert out.read_bytes() == reference("nolayout", 2)
