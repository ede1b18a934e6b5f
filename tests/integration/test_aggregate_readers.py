"""The readers of a store with aggregated versions (persistent_layout =
aggregated, docs/format/container.md): cairn show, verify, ls, gc, reindex and
diff, and the online comparison with a reference run, on a store written by
ckpt_app under mpirun (2 ranks, 7 steps: versions 2, 4 and 6).

The store holds run 'agg' (aggregated: the 'aligned' strategy, one data file,
64 KiB stripes) and run 'fpp' (file per process) of the same application,
whose states are the same bit for bit. Tests that damage or delete work on a
copy of it.
"""
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

import harness
from harness import CKPT

AGGREGATED = {"persistent_layout": "aggregated", "aggregate_strategy": "aligned", "aggregate_files": 1,
              "stripe_size": "64K"}
VERSIONS = [2, 4, 6]


def needs_cli():
    if harness.cli_path() is None:
        pytest.fail("the cairn CLI was not found: set CAIRN_TEST_CLI (ctest sets it)")
    if not harness.mpi_enabled():
        pytest.skip("built with CAIRN_ENABLE_MPI=OFF")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(store, {run: Job}): runs 'agg' and 'fpp' of ckpt_app --steps 7, 2 ranks."""
    needs_cli()
    root = tmp_path_factory.mktemp("readers")
    jobs = {
        "agg": harness.Job(root / "agg", 2, run="agg", store=root / "store", scratch=root / "scratch-agg"),
        "fpp": harness.Job(root / "fpp", 2, run="fpp", store=root / "store", scratch=root / "scratch-fpp"),
    }
    jobs["agg"].run("--steps", 7, **AGGREGATED).ok()
    jobs["fpp"].run("--steps", 7).ok()
    for run, job in jobs.items():
        assert job.committed() == VERSIONS, f"run {run}"
    return root / "store", jobs


@pytest.fixture
def copy(store, tmp_path):
    """A private copy of the store, to damage; (store, version_dir(run, version))."""
    dst = tmp_path / "store"
    shutil.copytree(store[0], dst)
    return dst, lambda run, v: dst / "runs" / run / CKPT / f"v{v:012d}"


def manifest(version_dir: Path) -> dict:
    text = (version_dir / "MANIFEST").read_text()
    return json.loads(text[:text.rindex("xxh3 ")])


def cli(*args, rc=0):
    res = harness.run_cli(*[str(a) for a in args])
    assert res.rc == rc, f"expected exit {rc}\n" + res.describe()
    return res


def cli_json(*args, rc=0):
    return json.loads(cli(*args, "--json", rc=rc).stdout)


def vdir(store_path, run, v):
    return Path(store_path) / "runs" / run / CKPT / f"v{v:012d}"


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.name != "MANIFEST")


# ---- show -----------------------------------------------------------------------

def test_show_prints_the_container_and_each_ranks_extents(store):
    path, _ = store
    m = manifest(vdir(path, "agg", 6))
    c = m["container"]
    assert c["strategy"] == "aligned" and len(c["files"]) == 1
    out = cli("show", path, CKPT, 6, "--run", "agg").stdout
    data = c["files"][0]
    for line in ["layout:      aggregated",
                 "strategy:    aligned",
                 "stripe:      65536 (64.0 KiB), count ",
                 "leaders:     0, 1",
                 f"moved:       {c['bytes_between_nodes']} bytes between nodes, {c['bytes_within_nodes']} within nodes",
                 f"padding:     {c['padding']} bytes"]:
        assert line in out, f"'{line}' missing from\n{out}"
    rows = [l.split() for l in out.splitlines()]
    assert ["FILE", "SIZE", "WRITERS"] in rows and ["data.000000", str(data["size"]), "0,", "1"] in rows, out
    assert ["RANK", "EXTENTS", "FILES", "SIZE", "HEADER_CHECKSUM", "HOST"] in rows, out
    for s in m["shards"]:
        row = [str(s["rank"]), str(len(s["extents"])), "data.000000", str(s["size"]), s["header_checksum"]]
        assert any(r[:5] == row for r in rows), f"{row} missing from\n{out}"
    assert "shard.0" not in out
    # Every rank's regions were read through its extents.
    for r in (0, 1):
        for region in ("field", "ints", "bytes", "step"):
            assert any(l.split()[:2] == [str(r), region] for l in out.splitlines()), f"rank {r} {region}\n{out}"


def test_show_json_has_the_container_and_the_extents(store):
    path, _ = store
    m = manifest(vdir(path, "agg", 4))
    j = cli_json("show", path, CKPT, 4, "--run", "agg")
    assert j["state"] == "committed" and j["layout"] == "aggregated" and j["nranks"] == 2
    c = j["container"]
    want = m["container"]
    assert (c["strategy"], c["stripe"], c["leaders"]) == ("aligned", 65536, [0, 1])
    assert [(f["name"], f["size"], f["writers"]) for f in c["files"]] == \
        [(f["name"], f["size"], f["writers"]) for f in want["files"]]
    assert c["files"][0]["size_on_disk"] == (vdir(path, "agg", 4) / "data.000000").stat().st_size
    assert (c["bytes_between_nodes"], c["bytes_within_nodes"], c["padding"]) == \
        (want["bytes_between_nodes"], want["bytes_within_nodes"], want["padding"])
    assert j["bytes"] == dir_bytes(vdir(path, "agg", 4))
    for s, e in zip(j["shards"], m["shards"]):
        assert s["file"] is None
        assert s["extent_count"] == len(e["extents"]) and s["extent_bytes"] == e["size"] == s["size"]
        assert [[x["src"], x["length"], 0, x["offset"], x["checksum"]] for x in s["extents"]] == e["extents"]
        assert [x["file"] for x in s["extents"]] == ["data.000000"] * len(e["extents"])
        assert sorted(r["name"] for r in s["regions"]) == ["bytes", "field", "ints", "step"]


def test_show_of_a_file_per_process_version_is_unchanged(store):
    path, _ = store
    j = cli_json("show", path, CKPT, 4, "--run", "fpp")
    assert j["layout"] == "file_per_process" and "container" not in j
    assert [s["file"] for s in j["shards"]] == ["shard.000000", "shard.000001"]
    out = cli("show", path, CKPT, 4, "--run", "fpp").stdout
    assert "layout:" not in out
    assert ["RANK", "FILE", "SIZE", "HEADER_CHECKSUM", "HOST"] in [l.split() for l in out.splitlines()], out


def test_show_of_an_aggregated_version_without_manifest(copy):
    dst, vd = copy
    shutil.copytree(vd("agg", 6), vd("agg", 8))
    (vd("agg", 8) / "MANIFEST").unlink()
    out = cli("show", dst, CKPT, 8, "--run", "agg").stdout
    assert "state:       incomplete (aggregated: 1 data file, no MANIFEST)" in out
    assert cli_json("show", dst, CKPT, 8, "--run", "agg")["layout"] == "aggregated"


# ---- verify ---------------------------------------------------------------------

def test_verify_checks_every_extent_and_region(store):
    path, _ = store
    extents = sum(len(s["extents"]) for v in VERSIONS for s in manifest(vdir(path, "agg", v))["shards"])
    out = cli("verify", path).stdout
    assert out.startswith("verified 6 versions (6 committed, 0 incomplete, 0 invalid), 12 shards "
                          f"(12 persistent, 0 local), 48 regions, {extents} extents, "), out
    assert out.rstrip().endswith(": no problems"), out
    j = cli_json("verify", path, "--run", "agg")
    assert (j["ok"], j["shards"]["persistent"], j["regions"], j["extents"], j["problems"]) == \
        (True, 6, 24, extents, [])


def _flip_middle_of_rank1(vd: Path) -> dict:
    """Flips the middle byte of rank 1's last extent; returns where."""
    m = manifest(vd)
    src, length, f, offset, _ = m["shards"][1]["extents"][-1]
    at = offset + length // 2
    harness.flip_byte(vd / m["container"]["files"][f]["name"], at)
    return {"src": src, "length": length, "offset": offset, "file": m["container"]["files"][f]["name"],
            "image_offset": src + length // 2}


def test_verify_names_the_damaged_extent_and_region(copy):
    dst, vd = copy
    d = vd("agg", 6)
    hit = _flip_middle_of_rank1(d)
    regions = {r["name"]: r for r in cli_json("show", dst, CKPT, 6, "--run", "agg")["shards"][1]["regions"]}
    region = next(n for n, r in regions.items() if r["offset"] <= hit["image_offset"] < r["offset"] + r["length"])
    data = d / hit["file"]
    res = cli("verify", dst, rc=1)
    lines = res.stdout.splitlines()
    assert lines[0] == (f"{data}: bytes [{hit['offset']}, {hit['offset'] + hit['length']}) of rank 1's image "
                        f"(from image offset {hit['src']}) do not match their checksum"), res.stdout
    r = regions[region]
    at = hit["offset"] + r["offset"] - hit["src"]  # the region's first byte in the data file
    assert lines[1] == (f"{d}/data.* (rank 1): checksum mismatch in region '{region}' (offset {r['offset']}, "
                        f"length {r['length']}; at {hit['file']} offset {at})"), res.stdout
    assert lines[2].endswith(": 2 problems"), res.stdout
    j = cli_json("verify", dst, "--run", "agg", rc=1)
    assert not j["ok"] and len(j["problems"]) == 2
    p = j["problems"][0]
    assert (p["file"], p["level"], p["run"], p["version"]) == (str(data), "persistent", "agg", 6)
    assert p["extent"] == {"rank": 1, "data_file": str(data), "offset": hit["offset"], "length": hit["length"],
                           "image_offset": hit["src"]}
    assert "extent" not in j["problems"][1] and region in j["problems"][1]["message"]
    # The other versions and the other run are intact.
    assert cli_json("verify", dst, "--run", "fpp")["ok"] is True


def test_verify_reports_a_truncated_and_a_missing_data_file(copy):
    dst, vd = copy
    size = manifest(vd("agg", 4))["container"]["files"][0]["size"]
    with open(vd("agg", 4) / "data.000000", "r+b") as f:
        f.truncate(size - 4096)
    (vd("agg", 2) / "data.000000").unlink()
    res = cli("verify", dst, "--run", "agg", rc=1)
    assert f"{vd('agg', 2)}/data.000000: missing (the MANIFEST lists it, with the extents of ranks 0, 1)\n" \
        in res.stdout
    assert (f"{vd('agg', 4)}/data.000000: has {size - 4096} bytes, the MANIFEST says {size} (truncated; it holds "
            "the extents of ranks 0, 1)\n") in res.stdout
    assert res.stdout.rstrip().endswith(": 2 problems"), res.stdout
    assert "2 shards (2 persistent, 0 local)" in res.stdout  # only version 6 was readable
    # show names the missing data file once, though both ranks' extents are in it.
    shown = cli("show", dst, CKPT, 2, "--run", "agg", rc=1)
    assert shown.stderr.count("data.000000 does not exist (the MANIFEST lists it") == 1, shown.describe()


# ---- ls, reindex, gc ------------------------------------------------------------

def test_ls_shows_the_layout(store):
    path, _ = store
    out = cli("ls", path).stdout.splitlines()
    at = next(i for i, l in enumerate(out) if l.startswith("RUN  NAME"))  # after the runs' identities
    assert out[at].split() == ["RUN", "NAME", "VERSION", "STATE", "LAYOUT", "RANKS", "BYTES", "LEVELS", "COMMITTED"]
    rows = {(l.split()[0], int(l.split()[2])): l.split() for l in out[at + 1:]}
    assert len(rows) == 6
    for v in VERSIONS:
        assert rows[("agg", v)][3:6] == ["committed", "aggregated", "2"]
        assert rows[("fpp", v)][3:6] == ["committed", "file-per-process", "2"]
    j = cli_json("ls", path, "--run", "agg")
    assert [(v["version"], v["state"], v["layout"], v["nranks"], v["shards_present"], v["data_files_present"])
            for v in j["versions"]] == [(v, "committed", "aggregated", 2, 0, 1) for v in VERSIONS]
    assert [v["bytes"] for v in j["versions"]] == [dir_bytes(vdir(path, "agg", v)) for v in VERSIONS]


def test_reindex_indexes_aggregated_versions(copy):
    dst, _ = copy
    j = cli_json("reindex", dst)
    assert (j["indexed"], j["uncommitted"], j["invalid"], j["problems"]) == (6, 0, 0, [])
    db = sqlite3.connect(dst / "catalog.sqlite")
    try:
        files = db.execute("SELECT run, file FROM shards WHERE version = 6 ORDER BY run, rank").fetchall()
        regions = db.execute("SELECT count(*) FROM regions WHERE run = 'agg'").fetchone()[0]
    finally:
        db.close()
    assert files == [("agg", ""), ("agg", ""), ("fpp", "shard.000000"), ("fpp", "shard.000001")]
    assert regions == 3 * 2 * 4


def test_gc_removes_whole_aggregated_versions(copy):
    dst, vd = copy
    cli("reindex", dst)
    # Debris: an aggregated version without MANIFEST older than the newest committed one.
    shutil.copytree(vd("agg", 4), vd("agg", 5))
    (vd("agg", 5) / "MANIFEST").unlink()
    sizes = {v: sum(f.stat().st_size for f in vd("agg", v).iterdir()) for v in (2, 4, 5)}
    dry = cli_json("gc", dst, "--keep", 1, "--run", "agg", "--dry-run")
    assert [(d["version"], d["state"]) for d in dry["deleted"]] == [(2, "committed"), (4, "committed"),
                                                                   (5, "incomplete")]
    assert all(vd("agg", v).is_dir() for v in (2, 4, 5))
    j = cli_json("gc", dst, "--keep", 1, "--run", "agg")
    assert [(d["version"], d["bytes"]) for d in j["deleted"]] == [(v, sizes[v]) for v in (2, 4, 5)]
    assert j["catalog_updated"] is True
    assert [v for v in (2, 4, 5, 6) if vd("agg", v).exists()] == [6]
    assert cli_json("verify", dst)["ok"] is True
    assert [v["version"] for v in cli_json("ls", dst, "--run", "agg")["versions"]] == [6]
    db = sqlite3.connect(dst / "catalog.sqlite")
    try:
        left = db.execute("SELECT version FROM checkpoints WHERE run = 'agg'").fetchall()
    finally:
        db.close()
    assert left == [(6,)]


# ---- diff and the online comparison --------------------------------------------

def test_diff_of_an_aggregated_and_a_file_per_process_run_is_identical(store):
    path, _ = store
    out = cli("diff", path, "agg", "fpp").stdout
    assert "runs are identical (3 versions, " in out, out
    j = cli_json("diff", path, "fpp", "agg")
    assert j["summary"]["outcome"] == "identical" and j["summary"]["versions_compared"] == 3
    assert j["summary"]["regions_compared"] > 0 and j["summary"]["mismatch"] == 0
    # No trees for aggregated versions: the data were read.
    assert j["io"]["data_bytes"] > 0 and j["io"]["trees"]["absent"] >= 6


def test_diff_finds_a_divergence_in_aggregated_versions(store, tmp_path):
    path, jobs = store
    other = tmp_path / "store"
    shutil.copytree(path, other)
    job = harness.Job(tmp_path / "var", 2, run="var", store=other, scratch=tmp_path / "scratch-var")
    job.run("--steps", 7, "--variant", 1, **AGGREGATED).ok()
    res = cli("diff", other, "agg", "var", "--json", rc=1)
    j = json.loads(res.stdout)
    fd = j["first_divergence"]
    assert j["summary"]["outcome"] != "identical"
    assert (fd["version"], fd["region"]) == (2, "bytes"), fd


def test_damaged_aggregated_version_is_reported_by_diff(copy):
    """A byte flipped in rank 1's extent of version 6 reaches diff as read
    from the data files (diff compares data; verify checks checksums): the
    first divergence is that element of the region the byte lies in."""
    dst, vd = copy
    hit = _flip_middle_of_rank1(vd("agg", 6))
    regions = {r["name"]: r for r in cli_json("show", dst, CKPT, 6, "--run", "fpp")["shards"][1]["regions"]}
    name, r = next((n, r) for n, r in regions.items()
                   if r["offset"] <= hit["image_offset"] < r["offset"] + r["length"])
    size = {"float64": 8, "int32": 4, "int64": 8, "uint8": 1}[r["type"]]
    j = cli_json("diff", dst, "agg", "fpp", rc=1)
    fd = j["first_divergence"]
    assert (fd["version"], fd["rank"], fd["region"], fd["at"]["index"]) == \
        (6, 1, name, (hit["image_offset"] - r["offset"]) // size), fd
    assert (j["summary"]["outcome"], j["summary"]["mismatch"]) == ("diverged", 1)


def test_online_comparison_with_an_aggregated_reference(tmp_path):
    """The reference run's versions are aggregated and it has no local level:
    the comparison reads them from the data files. The same history never
    diverges; another one (--variant) diverges at the first version."""
    needs_cli()
    ref = harness.Job(tmp_path / "ref", 2, run="ref", store=tmp_path / "store", scratch=tmp_path / "scratch")
    ref.run("--steps", 7, local_enabled="false", **AGGREGATED).ok()
    assert not (tmp_path / "scratch" / "runs" / "ref").exists() or \
        not any((tmp_path / "scratch" / "runs" / "ref").rglob("shard.*"))
    same = harness.Job(tmp_path / "same", 2, run="same", store=tmp_path / "store", scratch=tmp_path / "scratch")
    res = same.run("--steps", 7, reference_run="ref").ok()
    assert "diverged" not in res.stdout + res.stderr, res.describe()
    var = harness.Job(tmp_path / "var", 2, run="var", store=tmp_path / "store", scratch=tmp_path / "scratch")
    res = var.run("--steps", 7, "--variant", 1, reference_run="ref").ok()
    assert "cairn: run 'var' diverged from 'ref' at 'ckpt' version 2" in res.stderr, res.describe()
    assert "region 'bytes'" in res.stderr, res.describe()
