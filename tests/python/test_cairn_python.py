"""The Python analysis package (bindings/python, `import cairn`): reading what C
clients wrote, checksums, global assembly across rank counts, diff and report."""
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cairn
from conftest import (BINDINGS, cairn_env, example, final_checksum, mpi_enabled, require_diff,
                      run_mpi)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- checksums ---------------------------------------------------------------------

def test_xxh3_known_values():
    # XXH3_64bits reference values (seed 0).
    assert cairn.xxh3_64(b"") == 0x2D06800538D394C2
    assert cairn.xxh3_64(b"a" * 1000) == cairn.xxh3_64(bytearray(b"a" * 1000))


def test_xxh3_library_fallback_agrees():
    from cairn import _hash
    fallback = _hash._from_library()
    if fallback is None:
        pytest.skip("libxxhash not loadable through ctypes")
    rng = np.random.default_rng(1)
    for n in (0, 1, 17, 240, 4096, 100003):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert fallback(data) == cairn.xxh3_64(data)


# ---- listing -----------------------------------------------------------------------

def test_runs_checkpoints_versions(writer_store):
    s = cairn.open(writer_store)
    assert s.runs() == ["w1"]
    assert s.checkpoints("w1") == ["w"]
    assert s.versions("w1", "w") == [1, 3]
    m = s.manifest("w1", "w", 3)
    assert m["nranks"] == 1 and m["version"] == 3
    assert s.nranks("w1", "w", 1) == 1
    names = [r.name for r in s.regions("w1", "w", 1)]
    assert set(names) == {"u8", "bytes", "i16", "u16", "i32", "u32", "i64", "u64", "f32", "f64", "fortran",
                          "block", "fblock"}


def test_open_errors(tmp_path):
    with pytest.raises(cairn.NotFoundError):
        cairn.open(tmp_path / "missing")
    with pytest.raises(cairn.NotFoundError, match="not a cairn store"):
        cairn.open(tmp_path)


def test_uncommitted_and_unknown_versions_are_not_listed(writer_copy):
    vdir = writer_copy / "runs" / "w1" / "w"
    # A version being written (no MANIFEST) and one whose MANIFEST is torn.
    (vdir / "v000000000007").mkdir()
    (vdir / "v000000000007" / "shard.000000.tmp").write_bytes(b"x")
    torn = vdir / "v000000000003" / "MANIFEST"
    torn.write_bytes(torn.read_bytes()[:-10])
    s = cairn.open(writer_copy)
    assert s.versions("w1", "w") == [1]
    with pytest.raises(cairn.CorruptionError, match="MANIFEST"):
        s.region("w1", "w", 3, "u8")
    with pytest.raises(cairn.NotFoundError):
        s.region("w1", "w", 7, "u8")
    with pytest.raises(cairn.NotFoundError, match="no region 'nope'"):
        s.region("w1", "w", 1, "nope")
    with pytest.raises(cairn.NotFoundError, match="no rank 1"):
        s.region("w1", "w", 1, "u8", rank=1)


# ---- types, shapes, storage order -------------------------------------------------

@pytest.mark.parametrize("version", [1, 3])
def test_region_values_types_and_shapes(writer_store, version):
    s = cairn.open(writer_store)
    v = version
    k = np.arange
    expect = {
        "u8": (k(10) + v).astype(np.uint8),
        "bytes": (255 - k(16)).astype(np.uint8),
        "i16": (-(k(6) + v)).astype(np.int16).reshape(2, 3),
        "u16": (65535 - k(5)).astype(np.uint16),
        "i32": (1000 * k(20) - 7 + v).astype(np.int32).reshape(4, 5),
        "u32": (4000000000 + k(4, dtype=np.uint64)).astype(np.uint32),
        "i64": (k(3, dtype=np.int64) - 1) * 10**15 + v,
        "u64": np.array([2**63, 2**63 + 1], dtype=np.uint64),
        "f32": (np.float32(0.5) * k(24, dtype=np.float32) + np.float32(v)).reshape(2, 3, 4),
        "f64": (k(42) / 7.0 + v).reshape(6, 7),
    }
    for name, want in expect.items():
        got = s.region("w1", "w", v, name)
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert np.array_equal(got, want), name
        assert got.flags.writeable
    info = {r.name: r for r in s.regions("w1", "w", v)}
    assert info["bytes"].type == "byte" and info["u8"].type == "uint8"
    assert info["f64"].type == "float64" and not info["f64"].column_major


def test_column_major_region(writer_store):
    s = cairn.open(writer_store)
    got = s.region("w1", "w", 1, "fortran")
    want = (np.arange(15, dtype=np.float64) + 1).reshape((3, 5), order="F")  # (i, j) at k = i + 3 j
    assert got.shape == (3, 5) and got.flags.f_contiguous
    assert np.array_equal(got, want)
    assert got[2, 1] == 2 + 3 * 1 + 1
    info = {r.name: r for r in s.regions("w1", "w", 1)}["fortran"]
    assert info.column_major and info.order == "F" and info.global_shape is None


def test_block_with_memory_selection(writer_store):
    s = cairn.open(writer_store)
    mem = 1000 + 1 + np.arange(30, dtype=np.float64).reshape(5, 6)
    block = s.region("w1", "w", 1, "block", rank=0)
    assert block.shape == (3, 4)
    assert np.array_equal(block, mem[1:4, 1:5])  # only the block, no halo
    info = {r.name: r for r in s.regions("w1", "w", 1)}["block"]
    assert info.global_shape == (8, 6) and info.start == (2, 1) and info.has_layout
    # rank=None assembles the global array; this block alone does not cover it.
    with pytest.raises(cairn.CairnError, match="uncovered"):
        s.region("w1", "w", 1, "block")
    g = s.region("w1", "w", 1, "block", fill=np.nan)
    assert g.shape == (8, 6)
    assert np.array_equal(g[2:5, 1:5], block)
    assert np.isnan(g).sum() == 48 - 12


def test_column_major_block(writer_store):
    s = cairn.open(writer_store)
    mem = (2000 + 1 + np.arange(15, dtype=np.float64)).reshape((5, 3), order="F")
    block = s.region("w1", "w", 1, "fblock", rank=0)
    assert block.shape == (3, 2) and block.flags.f_contiguous
    assert np.array_equal(block, mem[1:4, 1:3])
    g = s.region("w1", "w", 1, "fblock", fill=-1.0)
    assert g.shape == (6, 4) and g.flags.f_contiguous
    assert np.array_equal(g[1:4, 0:2], block)
    assert (g == -1).sum() == 24 - 6


# ---- corruption -------------------------------------------------------------------

def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_damaged_region_data_raise(writer_copy):
    s = cairn.open(writer_copy)
    info = {r.name: r for r in s.regions("w1", "w", 1)}
    shard = s.shard_path("w1", "w", 1, 0)
    _flip(shard, info["f64"].offset + 8 * 10)
    s = cairn.open(writer_copy)
    with pytest.raises(cairn.CorruptionError, match="checksum mismatch in region 'f64'"):
        s.region("w1", "w", 1, "f64")
    # The other regions of the shard are intact and still readable.
    assert s.region("w1", "w", 1, "u8")[0] == 1
    # Version 3 is untouched.
    assert s.region("w1", "w", 3, "f64").shape == (6, 7)


def test_damaged_header_and_truncated_shard_raise(writer_copy):
    s = cairn.open(writer_copy)
    shard1 = s.shard_path("w1", "w", 1, 0)
    _flip(shard1, 70)  # inside the names / region table
    with pytest.raises(cairn.CorruptionError, match="header checksum"):
        cairn.open(writer_copy).region("w1", "w", 1, "u8")
    shard3 = s.shard_path("w1", "w", 3, 0)
    size = os.path.getsize(shard3)
    with open(shard3, "r+b") as f:
        f.truncate(size - 4096)
    with pytest.raises(cairn.CorruptionError, match="truncated|bytes"):
        cairn.open(writer_copy).region("w1", "w", 3, "u8")


def test_shard_not_matching_manifest_raises(writer_copy):
    s = cairn.open(writer_copy)
    # Replace version 1's shard by version 3's: valid on its own, not the committed one.
    src = s.shard_path("w1", "w", 3, 0)
    dst = s.shard_path("w1", "w", 1, 0)
    Path(dst).write_bytes(Path(src).read_bytes())
    with pytest.raises(cairn.CorruptionError, match="manifest|v3"):
        cairn.open(writer_copy).region("w1", "w", 1, "u8")


def test_newer_shard_format_is_refused(writer_copy):
    s = cairn.open(writer_copy)
    shard = s.shard_path("w1", "w", 1, 0)
    with open(shard, "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<I", 99))
    with pytest.raises(cairn.NotSupportedError, match="format version 99"):
        cairn.open(writer_copy).region("w1", "w", 1, "u8")


# ---- compressed shards (format 3) ------------------------------------------------

def _compress(*shards):
    exe = os.environ.get("CAIRN_TEST_PY_COMPRESS")
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip("CAIRN_TEST_PY_COMPRESS (tests/support/compress_shard.cpp, built) is not set")
    p = subprocess.run([exe] + [str(s) for s in shards], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_compressed_shard_reads_as_numpy(writer_copy):
    s = cairn.open(writer_copy)
    shard = s.shard_path("w1", "w", 1, 0)
    plain = {r.name: s.region("w1", "w", 1, r.name, rank=0) for r in s.regions("w1", "w", 1)}
    glob = s.region("w1", "w", 1, "block", fill=np.nan)
    size = os.path.getsize(shard)
    _compress(shard)
    s = cairn.open(writer_copy)
    from cairn._format import read_shard_header
    h = read_shard_header(shard)
    assert h.format_version == 3 and h.compressed
    assert h.file_size == size and h.stored_size == os.path.getsize(shard)
    # Every region, compressed or stored as is, reads back bit for bit with
    # the same dtype, shape and order.
    for name, want in plain.items():
        got = s.region("w1", "w", 1, name, rank=0)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.flags.f_contiguous == want.flags.f_contiguous, name
        assert np.array_equal(got, want), name
        assert got.flags.writeable
    # Global assembly of blocks goes through the same reader.
    assert np.array_equal(s.region("w1", "w", 1, "block", fill=np.nan), glob, equal_nan=True)


def test_compressed_region_is_decompressed(tmp_path):
    # region_writer --big: a 512 KiB float64 field that zstd stores as a frame.
    exe = os.environ.get("CAIRN_TEST_PY_WRITER")
    if not exe:
        pytest.skip("CAIRN_TEST_PY_WRITER is not set")
    env = cairn_env(tmp_path / "store", tmp_path / "scratch", "big", CAIRN_MODE="sync")
    p = subprocess.run([exe, "--big", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    s = cairn.open(tmp_path / "store")
    want = s.region("big", "w", 1, "big")
    shard = s.shard_path("big", "w", 1, 0)
    _compress(shard)
    from cairn._format import read_shard_header, COMPRESS_ZSTD
    h = read_shard_header(shard)
    info = h.region("big")
    assert info.compression == COMPRESS_ZSTD and info.stored_length < info.length // 4
    got = cairn.open(tmp_path / "store").region("big", "w", 1, "big")
    assert got.dtype == np.float64 and got.shape == (256, 256) and np.array_equal(got, want)
    assert np.isclose(got[0, 40], np.sin(1.0) + 1) and got[200, 7] == 0.0
    # A damaged frame, a frame cut short: corruption, never wrong numbers.
    data = bytearray(Path(shard).read_bytes())
    data[info.stored_offset + info.stored_length // 2] ^= 0x5A
    Path(shard).write_bytes(bytes(data))
    with pytest.raises(cairn.CorruptionError, match="region 'big'"):
        cairn.open(tmp_path / "store").region("big", "w", 1, "big")


# ---- RUN file (optional) ---------------------------------------------------------

def _seal(obj):
    body = (json.dumps(obj, indent=1) + "\n").encode()
    return body + b"xxh3 %016x\n" % cairn.xxh3_64(body)


def test_run_info(writer_copy):
    s = cairn.open(writer_copy)
    run_file = writer_copy / "runs" / "w1" / "RUN"
    if run_file.exists():  # written by the runtime (docs/format/run.md)
        info = s.run_info("w1")
        assert info["run"] == "w1" and info["format"] == "cairn-run"
        assert info.get("executions")
    run_file.write_bytes(_seal({"format": "cairn-run", "format_version": 1, "run": "w1", "application": "app",
                                "code_version": "abc", "tags": {"k": "v"}, "executions": []}))
    info = cairn.open(writer_copy).run_info("w1")
    assert info["application"] == "app" and info["tags"] == {"k": "v"}
    run_file.write_bytes(run_file.read_bytes().replace(b"app", b"apq"))
    with pytest.raises(cairn.CorruptionError, match="checksum"):
        cairn.open(writer_copy).run_info("w1")
    run_file.unlink()
    assert cairn.open(writer_copy).run_info("w1") is None
    with pytest.raises(cairn.NotFoundError):
        cairn.open(writer_copy).run_info("nope")


# ---- heat2d: global layout across rank counts -----------------------------------

def test_heat2d_global_assembly_1_vs_2_ranks(heat2d_store):
    store, sums = heat2d_store
    assert sums["one"] == sums["two"] == sums["two-again"]  # the application's own check
    s = cairn.open(store)
    assert s.runs() == ["one", "two", "two-again"]
    assert s.versions("one", "heat2d") == s.versions("two", "heat2d") == [20, 40, 60]
    for v in (20, 40, 60):
        a = s.region("one", "heat2d", v, "grid")
        b = s.region("two", "heat2d", v, "grid")
        assert a.shape == b.shape == (48, 40) and a.dtype == np.float64
        assert np.array_equal(a, b)
        # The blocks of the 2-rank run are the halves of the global grid.
        top, bottom = s.region("two", "heat2d", v, "grid", rank=0), s.region("two", "heat2d", v, "grid", rank=1)
        assert top.shape == (24, 40) and bottom.shape == (24, 40)
        assert np.array_equal(np.vstack([top, bottom]), a)
    info = [r for r in s.regions("two", "heat2d", 20, rank=1) if r.name == "grid"][0]
    assert info.global_shape == (48, 40) and info.start == (24, 0)
    # Physics: the hot boundary is above row 0, so the first row is the warmest.
    g = s.region("one", "heat2d", 60, "grid")
    assert 0 < g.min() and g.max() < 1 and g[0].mean() > g[-1].mean()
    # "iter" is per rank: [iterations, NX, NY] on each.
    assert list(s.region("one", "heat2d", 40, "iter")) == [40, 48, 40]
    assert list(s.region("two", "heat2d", 40, "iter", rank=1)) == [40, 48, 40]
    with pytest.raises(cairn.CairnError, match="give rank"):
        s.region("two", "heat2d", 40, "iter")


def test_heat2d_diff_identical(heat2d_store):
    require_diff()
    store, _ = heat2d_store
    d = cairn.diff(store, "two", "two-again")
    assert cairn.outcome(d) == "identical"
    assert cairn.first_divergence(d) is None
    rows = cairn.diff_rows(d)
    assert {r.version for r in rows} == {20, 40, 60}
    assert all(r.mismatch == 0 and r.approximate == 0 and r.state == "compared" for r in rows)
    # 1 vs 2 ranks: the global grid compares element by element; the per-rank
    # "iter" region is not comparable across rank counts (never a mismatch).
    d = cairn.diff(store, "one", "two", regions=["grid"])
    assert cairn.outcome(d) == "identical"
    assert sum(r.exact for r in cairn.diff_rows(d)) == 3 * 48 * 40
    d = cairn.diff(store, "one", "two")
    assert sum(r.mismatch for r in cairn.diff_rows(d)) == 0
    assert {r.state for r in cairn.diff_rows(d) if r.region == "iter"} == {"not_comparable"}
    with pytest.raises(cairn.NotFoundError):
        cairn.diff(store, "one", "no-such-run")


# ---- nbody: real divergence -----------------------------------------------------

@pytest.fixture(scope="module")
def nbody_store(tmp_path_factory):
    exe = example("nbody")
    if exe is None or not mpi_enabled():
        pytest.skip("examples/nbody is not built (no OpenMP, no MPI or CAIRN_BUILD_EXAMPLES=OFF)")
    root = tmp_path_factory.mktemp("nbody")
    args = ["--particles", 128, "--steps", 300, "--every", 50]
    sums = {}

    def run(name, threads):
        for d in (root / "store" / "runs" / name, root / f"scratch-{name}"):
            shutil.rmtree(d, ignore_errors=True)
        out = run_mpi(exe, 2, args, cairn_env(root / "store", root / f"scratch-{name}", name,
                                              OMP_NUM_THREADS=threads))
        sums[name] = final_checksum(out, "nbody")

    for name, threads in (("t1-a", 1), ("t1-b", 1), ("t2-a", 2), ("t2-b", 2)):
        run(name, threads)
    # Thread timing decides the summation order with 2 threads: on the rare
    # occasion that two runs agree bit for bit, run the second again.
    for _ in range(2):
        if sums["t2-a"] != sums["t2-b"]:
            break
        run("t2-b", 2)
    return root / "store", sums


def test_nbody_regions_and_determinism(nbody_store):
    store, sums = nbody_store
    s = cairn.open(store)
    assert s.versions("t1-a", "nbody") == [50, 100, 150, 200, 250, 300]
    pos = s.region("t1-a", "nbody", 300, "pos")
    vel = s.region("t1-a", "nbody", 300, "vel")
    assert pos.shape == vel.shape == (128, 3) and pos.dtype == np.float64
    assert np.isfinite(pos).all() and np.abs(pos).max() < 10
    assert list(s.region("t1-a", "nbody", 300, "step", rank=1)) == [300, 128, 1]
    # One thread: fixed summation order, bit-identical runs.
    assert sums["t1-a"] == sums["t1-b"]
    for v in s.versions("t1-a", "nbody"):
        assert np.array_equal(s.region("t1-a", "nbody", v, "pos"), s.region("t1-b", "nbody", v, "pos"))


def test_nbody_two_threads_diverge(nbody_store):
    store, sums = nbody_store
    if sums["t2-a"] == sums["t2-b"]:
        pytest.fail("three runs of nbody with OMP_NUM_THREADS=2 ended bit-identical: the atomic "
                    "accumulation did not make the summation order timing-dependent")
    s = cairn.open(store)
    # The final checksums cover the state at step 300, the last checkpoint:
    # it differs in pos or, when the summation order first differed in the
    # last step's forces, in vel only.
    pairs = [(s.region("t2-a", "nbody", 300, r), s.region("t2-b", "nbody", 300, r)) for r in ("pos", "vel")]
    assert not all(np.array_equal(a, b) for a, b in pairs)
    assert all(np.allclose(a, b, atol=1e-3) for a, b in pairs)  # tiny differences, growing


def test_nbody_diff_and_report(nbody_store, tmp_path):
    require_diff()
    store, sums = nbody_store
    if sums["t2-a"] == sums["t2-b"]:
        pytest.skip("no divergent pair (see test_nbody_two_threads_diverge)")
    d = cairn.diff(store, "t2-a", "t2-b", name="nbody")
    assert cairn.outcome(d) == "diverged"
    fd = cairn.first_divergence(d)
    assert fd["region"] in ("pos", "vel") and fd["kind"] == "mismatch"
    last = [r for r in cairn.diff_rows(d) if r.region in ("pos", "vel") and r.version == 300]
    assert any(r.mismatch > 0 and r.max_abs > 0 for r in last), last
    out = tmp_path / "report"
    env = dict(os.environ, PYTHONPATH=str(BINDINGS))
    p = subprocess.run([sys.executable, "-m", "cairn.report", str(store), "t2-a", "t2-b", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "first divergence: checkpoint nbody, version" in p.stdout
    _check_report(out)
    summary = (out / "summary.txt").read_text()
    assert "outcome: diverged" in summary
    assert "pos: first difference at version" in summary


# ---- report (from a saved diff document: no CLI needed) --------------------------

def _doc(versions, diverge_from=None):
    regions = lambda v: [  # noqa: E731
        {"region": "pos", "layout": "global", "rank": None, "state": "compared", "elements": 100,
         "exact": 100 if diverge_from is None or v < diverge_from else 60, "approximate": 0,
         "within": 100 if diverge_from is None or v < diverge_from else 60,
         "mismatch": 0 if diverge_from is None or v < diverge_from else 40,
         "max_abs": 0 if diverge_from is None or v < diverge_from else 1e-16 * 10 ** (v - diverge_from),
         "max_rel": 0, "first_mismatch": None},
        {"region": "step", "layout": "per_rank", "rank": 0, "state": "compared", "elements": 3, "exact": 3,
         "approximate": 0, "within": 3, "mismatch": 0, "max_abs": 0, "max_rel": 0, "first_mismatch": None}]
    fd = None
    if diverge_from is not None:
        fd = {"name": "sim", "version": diverge_from, "rank": 0, "region": "pos", "kind": "mismatch",
              "message": "", "at": {"index": 7, "coords": [2, 1], "rank_a": 0, "rank_b": 0, "a": 1.0,
                                    "b": 1.0000000000000002, "a_text": "1", "b_text": "1.0000000000000002"}}
    return {"store": "S", "run_a": "a", "run_b": "b", "mode": "full", "tolerance": {"abs": 0, "rel": 0, "ulps": 0},
            "checkpoints": [{"name": "sim", "in_a": True, "in_b": True, "versions_only_a": [],
                             "versions_only_b": [], "uncommitted_a": [], "uncommitted_b": [],
                             "versions": [{"version": v, "nranks_a": 1, "nranks_b": 1, "problems": [],
                                           "notes": [], "regions": regions(v)} for v in versions]}],
            "first_divergence": fd,
            "summary": {"outcome": "identical" if diverge_from is None else "diverged"}}


def _check_report(out):
    for png in ("counts.png", "max_abs_error.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG_MAGIC, png
        assert len(data) > 1000, png
    assert (out / "summary.txt").stat().st_size > 0


def test_report_from_saved_diff(tmp_path):
    pytest.importorskip("matplotlib")
    from cairn import report
    doc = _doc(range(1, 9), diverge_from=3)
    (tmp_path / "d.json").write_text(json.dumps(doc))
    rc = report.main(["S", "a", "b", "--out", str(tmp_path / "r"), "--diff-json", str(tmp_path / "d.json")])
    assert rc == 0
    _check_report(tmp_path / "r")
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert "outcome: diverged" in summary
    assert "first divergence: checkpoint sim, version 3, region pos, rank 0: element 7 at [2, 1]" in summary
    assert "pos: first difference at version 3" in summary and "growth x1e+05" in summary
    assert "step[rank 0]: no difference in 8 version(s)" in summary

    paths = report.write_report(_doc([10, 20]), str(tmp_path / "same"))
    _check_report(tmp_path / "same")
    text = Path(paths["summary"]).read_text()
    assert "outcome: identical" in text and "first divergence: none" in text


def test_report_command_installed():
    exe = Path(sys.executable).parent / "cairn-report"
    if not exe.exists():
        pytest.skip(f"cairn-report is not installed beside {sys.executable} (scripts/install-deps.sh installs it)")
    p = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--out" in p.stdout


# ---- restart of the examples (continuing a finished shorter run) -----------------

def _continue_equals_straight(tmp_path, exe, prog, nranks, short, full, extra_env=None):
    env = extra_env or {}
    a = run_mpi(exe, nranks, short, cairn_env(tmp_path / "s1", tmp_path / "c1", "r", **env))
    b = run_mpi(exe, nranks, full, cairn_env(tmp_path / "s1", tmp_path / "c1", "r", **env))
    assert "restarted from version" in b, b
    straight = run_mpi(exe, nranks, full, cairn_env(tmp_path / "s2", tmp_path / "c2", "r", **env))
    assert "starting from scratch" in straight and "starting from scratch" in a
    assert final_checksum(b, prog) == final_checksum(straight, prog)
    info = cairn.open(tmp_path / "s1").run_info("r")
    if info is not None:  # the runtime writes RUN files (docs/format/run.md)
        assert info["run"] == "r" and len(info["executions"]) == 2
        assert info["executions"][0]["nranks"] == nranks


@pytest.mark.parametrize("nranks", [1, 2])
def test_heat2d_restart_is_bit_identical(tmp_path, nranks):
    exe = example("heat2d")
    if exe is None or not mpi_enabled():
        pytest.skip("examples/heat2d is not built")
    base = ["--nx", 40, "--ny", 32, "--every", 7]
    # The last checkpoint of the short run is iteration 35: odd, so the run had
    # its current grid in the second buffer; the restart restores into the first
    # and must still continue bit for bit (boundaries set, halos exchanged).
    _continue_equals_straight(tmp_path, exe, "heat2d", nranks, base + ["--iters", 36], base + ["--iters", 70])


def test_nbody_restart_is_bit_identical_with_one_thread(tmp_path):
    exe = example("nbody")
    if exe is None or not mpi_enabled():
        pytest.skip("examples/nbody is not built")
    base = ["--particles", 64, "--every", 25]
    _continue_equals_straight(tmp_path, exe, "nbody", 2, base + ["--steps", 60], base + ["--steps", 120],
                              {"OMP_NUM_THREADS": 1})


# ---- aggregated versions (docs/format/container.md) ------------------------------

AGGREGATED_ENV = {"CAIRN_PERSISTENT_LAYOUT": "aggregated", "CAIRN_AGGREGATE_STRATEGY": "aligned",
                  "CAIRN_AGGREGATE_FILES": "2", "CAIRN_STRIPE_SIZE": "64K"}


@pytest.fixture(scope="module")
def heat2d_aggregated(tmp_path_factory):
    """heat2d (48 x 40, 60 iterations, checkpoint every 20) on 2 ranks as run
    'agg' (aggregated: 2 data files) and run 'fpp' (a shard file per rank)."""
    exe = example("heat2d")
    if exe is None or not mpi_enabled():
        pytest.skip("examples/heat2d is not built (CAIRN_BUILD_EXAMPLES=OFF or no MPI)")
    root = tmp_path_factory.mktemp("heat2d-aggregated")
    args = ["--nx", 48, "--ny", 40, "--iters", 60, "--every", 20]
    sums = {run: final_checksum(run_mpi(exe, 2, args, cairn_env(root / "store", root / f"scratch-{run}", run,
                                                                 **extra)), "heat2d")
            for run, extra in (("agg", AGGREGATED_ENV), ("fpp", {}))}
    assert sums["agg"] == sums["fpp"]
    return root / "store"


def _data_offset(m, rank, image_offset):
    """(data file name, offset in it) of byte `image_offset` of rank's image."""
    for src, length, f, offset, _ in m["shards"][rank]["extents"]:
        if src <= image_offset < src + length:
            return m["container"]["files"][f]["name"], offset + image_offset - src
    raise AssertionError(f"no extent of rank {rank} holds image offset {image_offset}")


def test_aggregated_version_reads_like_file_per_process(heat2d_aggregated):
    s = cairn.open(heat2d_aggregated)
    assert s.versions("agg", "heat2d") == s.versions("fpp", "heat2d") == [20, 40, 60]
    assert s.layout("agg", "heat2d", 20) == "aggregated" and s.layout("fpp", "heat2d", 20) == "file_per_process"
    m = s.manifest("agg", "heat2d", 60)
    assert m["format_version"] == 2 and [f["name"] for f in m["container"]["files"]] == ["data.000000", "data.000001"]
    vdir = Path(s.version_dir("agg", "heat2d", 60))
    assert sorted(p.name for p in vdir.iterdir()) == ["MANIFEST", "data.000000", "data.000001"]
    for v in (20, 40, 60):
        a, b = s.region("agg", "heat2d", v, "grid"), s.region("fpp", "heat2d", v, "grid")
        assert a.shape == (48, 40) and a.dtype == np.float64 and np.array_equal(a, b)
        for r in (0, 1):
            assert np.array_equal(s.region("agg", "heat2d", v, "grid", rank=r),
                                  s.region("fpp", "heat2d", v, "grid", rank=r))
            assert list(s.region("agg", "heat2d", v, "iter", rank=r)) == [v, 48, 40]
    h = s.shard_header("agg", "heat2d", 40, 1)
    assert h.path == str(vdir.parent / "v000000000040" / "data.* (rank 1)")
    assert h.file_size == m["shards"][1]["size"] and (h.rank, h.nranks) == (1, 2)
    assert [r.name for r in s.regions("agg", "heat2d", 40, rank=1)] == \
        [r.name for r in s.regions("fpp", "heat2d", 40, rank=1)]


def test_aggregated_damage_raises(heat2d_aggregated, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(heat2d_aggregated, store)
    s = cairn.open(store)
    m = s.manifest("agg", "heat2d", 60)
    grid = [r for r in s.regions("agg", "heat2d", 60, rank=1) if r.name == "grid"][0]
    name, at = _data_offset(m, 1, grid.offset + grid.length // 2)
    vdir = Path(s.version_dir("agg", "heat2d", 60))
    _flip(vdir / name, at)
    s = cairn.open(store)
    with pytest.raises(cairn.CorruptionError, match=r"data\.\* \(rank 1\): checksum mismatch in region 'grid'"):
        s.region("agg", "heat2d", 60, "grid", rank=1)
    with pytest.raises(cairn.CorruptionError, match="checksum mismatch in region 'grid'"):
        s.region("agg", "heat2d", 60, "grid")
    assert s.region("agg", "heat2d", 60, "grid", rank=0).shape == (24, 40)  # rank 0's extents are intact
    # A data file shorter than the MANIFEST says, and a missing one.
    d40 = Path(s.version_dir("agg", "heat2d", 40))
    with open(d40 / "data.000001", "r+b") as f:
        f.truncate(4096)
    (Path(s.version_dir("agg", "heat2d", 20)) / "data.000000").unlink()
    s = cairn.open(store)
    with pytest.raises(cairn.CorruptionError,
                       match=r"data\.000001: has 4096 bytes, the manifest says \d+ \(truncated\)"):
        s.region("agg", "heat2d", 40, "grid")
    with pytest.raises(cairn.CorruptionError, match=r"data\.000000: data file listed in the manifest is missing"):
        s.region("agg", "heat2d", 20, "grid")


def test_aggregated_manifest_checks(heat2d_aggregated, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(heat2d_aggregated, store)
    path = Path(cairn.open(store).version_dir("agg", "heat2d", 60)) / "MANIFEST"
    text = path.read_bytes()
    m = json.loads(text[:text.rindex(b"xxh3 ")])
    newer = json.loads(json.dumps(m))
    newer["container"]["format_version"] = 2
    path.write_bytes(_seal(newer))
    with pytest.raises(cairn.NotSupportedError, match="container format version 2"):
        cairn.open(store).manifest("agg", "heat2d", 60)
    gap = json.loads(json.dumps(m))
    gap["shards"][1]["extents"][0][0] = 4096  # no longer starts at image offset 0
    path.write_bytes(_seal(gap))
    with pytest.raises(cairn.CorruptionError, match="rank 1: extents do not tile the image"):
        cairn.open(store).manifest("agg", "heat2d", 60)
    assert cairn.open(store).versions("agg", "heat2d") == [20, 40]  # the damaged version is not listed


def test_the_python_package_builds_libcairn_alone():
    """pyproject.toml (pip install . / pip wheel .) is valid TOML and builds
    the library only: no tools, compat, Fortran, tests, examples or
    benchmarks (the Python-only set-up path)."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    with open(root / "pyproject.toml", "rb") as f:
        sk = tomllib.load(f)["tool"]["scikit-build"]
    assert sk["build"]["targets"] == ["cairn"]
    off = {k for k, v in sk["cmake"]["define"].items() if v == "OFF"}
    assert off >= {"CAIRN_BUILD_TESTS", "CAIRN_BUILD_EXAMPLES", "CAIRN_BUILD_BENCH", "CAIRN_BUILD_TOOLS",
                   "CAIRN_BUILD_COMPAT", "CAIRN_ENABLE_FORTRAN"}, sk["cmake"]["define"]
