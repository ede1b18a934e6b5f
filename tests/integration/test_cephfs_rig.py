"""The single-host CephFS of tests/support_py/cephfs.py, which the aggregation
tests and benchmarks run on (docs/design/cephfs_rig.md).

One rig per module (monitor, manager, 3 memstore OSDs, MDS, two ceph-fuse
clients standing for two nodes). A rig that cannot start FAILS the test with
the reason: CI must not pass by skipping the file system it was meant to
test on. The last tests stop it and check that nothing is left, then check
that a failed start and a teardown after the servers died leave nothing
either.
"""
import hashlib
import json
import os
import signal
import stat
import subprocess

import pytest

import cephfs
import harness

OSDS = 3
MiB = 1 << 20


def start_rig(root, **kw) -> cephfs.CephFSRig:
    rig = cephfs.CephFSRig(root, die_with_parent=True, **kw)
    try:
        return rig.start()
    except cephfs.CephFSError as e:
        pytest.fail(f"the CephFS rig could not be started in {root}:\n{e}", pytrace=False)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = start_rig(tmp_path_factory.mktemp("cephfs"), clients=2, osds=OSDS)
    print(f"rig up in {r.timings['start_s']:.1f} s, {sum(r.memory_rss_mib().values()):.0f} MiB resident")
    yield r
    r.stop()


def digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def leftovers(rig, pids) -> list:
    """What a stopped rig left behind: live processes, FUSE mounts."""
    out = [f"process {p} ({' '.join(cephfs._pid_cmdline(p) or [])})" for p in cephfs.processes_using(rig.conf)]
    out += [f"pid {p} still alive" for p in pids if rig._alive(p)]
    out += [f"mount {m}" for m in cephfs.mounts_under(rig.root)]
    out += [f"mount {m}" for m in map(str, rig.mount_points) if m in cephfs.fuse_mounts()]
    return out


def test_two_separate_clients(rig):
    a, b = rig.mounts
    assert len({str(a), str(b)}) == 2
    fuse = cephfs.fuse_mounts()
    assert fuse.get(str(a)) == fuse.get(str(b)) == "fuse.ceph-fuse"
    # One MDS session per mount: writers on the two "nodes" hold their own caps.
    ids = {os.getxattr(m, "ceph.client_id") for m in (a, b)}
    assert len(ids) == 2, ids
    assert os.getxattr(a, "ceph.cluster_fsid").decode() == rig.fsid
    # Healthy but for what a loaded 2-core CI machine may cause.
    checks = set(rig.health()["checks"])
    assert checks <= {"SLOW_OPS", "MDS_SLOW_REQUEST", "MDS_SLOW_METADATA_IO"}, checks


def test_written_through_a_read_through_b(rig):
    a, b = rig.mounts
    (a / "xfer").mkdir()
    data = os.urandom(9 * MiB + 12345)  # several objects and a partial one
    with open(a / "xfer" / "blob", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    assert (b / "xfer" / "blob").stat().st_size == len(data)
    assert digest(b / "xfer" / "blob") == hashlib.sha256(data).hexdigest()
    # And back: B overwrites the middle, A sees it without reopening the mount.
    patch = os.urandom(3 * MiB)
    with open(b / "xfer" / "blob", "r+b") as f:
        f.seek(4 * MiB)
        f.write(patch)
        os.fsync(f.fileno())
    expected = data[:4 * MiB] + patch + data[7 * MiB:]
    assert digest(a / "xfer" / "blob") == hashlib.sha256(expected).hexdigest()


def test_directory_layout_applies_to_new_files(rig):
    a, b = rig.mounts
    d = a / "striped"
    d.mkdir()
    (d / "before").write_bytes(b"x")
    default = cephfs.effective_layout(d)
    assert cephfs.get_layout(d) is None  # inherited until set
    want = dict(stripe_unit=1 * MiB, stripe_count=OSDS, object_size=4 * MiB)
    assert want["stripe_unit"] != default["stripe_unit"]
    # The three xattrs, one at a time, in this order (valid at each step).
    os.setxattr(d, "ceph.dir.layout.stripe_unit", str(want["stripe_unit"]).encode())
    os.setxattr(d, "ceph.dir.layout.stripe_count", str(want["stripe_count"]).encode())
    os.setxattr(d, "ceph.dir.layout.object_size", str(want["object_size"]).encode())
    got = cephfs.get_layout(d)
    assert {k: got[k] for k in want} == want
    assert got["pool"] == cephfs.DATA_POOL
    assert int(os.getxattr(d, "ceph.dir.layout.stripe_count")) == OSDS

    # A file created by the other client gets the layout; both clients see it.
    with open(b / "striped" / "new", "wb") as f:
        f.write(os.urandom(5 * MiB))
    for m in (a, b):
        f = m / "striped" / "new"
        layout = cephfs.get_layout(f)
        assert {k: layout[k] for k in want} == want, (m, layout)
        assert int(os.getxattr(f, "ceph.file.layout.stripe_unit")) == want["stripe_unit"]
        assert os.stat(f).st_blksize == want["stripe_unit"], m
    # The file that existed before keeps the layout it was created with.
    old = cephfs.get_layout(d / "before")
    assert old["stripe_unit"] == default["stripe_unit"]
    assert os.stat(d / "before").st_blksize == default["stripe_unit"]


def test_layout_helpers(rig):
    a, b = rig.mounts
    d = a / "helper"
    d.mkdir()
    # From 1 MiB / 4 MiB to 2 MiB / 2 MiB: setting object_size or stripe_unit
    # first would each be refused on its own; the helper gets there.
    cephfs.set_layout(d, stripe_unit=1 * MiB, object_size=4 * MiB)
    got = cephfs.set_layout(d, stripe_unit=2 * MiB, object_size=2 * MiB, stripe_count=2)
    assert (got["stripe_unit"], got["object_size"], got["stripe_count"]) == (2 * MiB, 2 * MiB, 2)
    # A file layout can be set while the file is empty, and not after.
    f = b / "helper" / "empty"
    f.touch()
    got = cephfs.set_layout(f, stripe_unit=64 * 1024, object_size=1 * MiB, stripe_count=4)
    assert (got["stripe_unit"], got["object_size"], got["stripe_count"]) == (64 * 1024, MiB, 4)
    assert os.stat(a / "helper" / "empty").st_blksize == 64 * 1024
    f.write_bytes(b"data")
    with pytest.raises(OSError):
        cephfs.set_layout(f, stripe_count=1)
    # Ceph refuses an object size that is not a multiple of the stripe unit.
    with pytest.raises(OSError):
        os.setxattr(d, "ceph.dir.layout.object_size", str(3 * MiB).encode())
    with pytest.raises(ValueError):
        cephfs.set_layout(d, stripe_unit=3 * MiB, object_size=4 * MiB)


def geometry(*args):
    """`cairn geometry ARGS --json`: (exit status, parsed JSON or stderr)."""
    r = subprocess.run([str(harness.cli_path()), "geometry", *map(str, args), "--json"], capture_output=True,
                       text=True, timeout=60, env=harness.base_env())
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)


@pytest.mark.skipif(not harness.cli_path(), reason="needs the cairn CLI")
def test_cairn_detects_and_sets_the_layout(rig):
    """cairn's own geometry detection (src/storage/geometry, what aggregation
    aligns to) through ceph-fuse: the inherited layout of a new directory,
    then a layout it sets, which files created by the other client get."""
    a, b = rig.mounts
    d = a / "geometry"
    d.mkdir()
    rc, g = geometry(d)
    assert rc == 0, g
    default = cephfs.effective_layout(d)
    assert (g["fs"], g["stripe_unit"], g["stripe_count"]) == ("cephfs", default["stripe_unit"],
                                                               default["stripe_count"]), g
    assert "inherited" in g["source"] or "st_blksize" in g["source"], g
    rc, g = geometry(d, "--stripe-unit", MiB, "--stripe-count", OSDS, "--object-size", 4 * MiB)
    assert rc == 0, g
    assert (g["stripe_unit"], g["stripe_count"], g["object_size"]) == (MiB, OSDS, 4 * MiB), g
    assert g["source"] == f"ceph.dir.layout of {d}", g
    with open(b / "geometry" / "new", "wb") as f:
        f.write(b"x" * 4096)
    layout = cephfs.get_layout(b / "geometry" / "new")
    assert (layout["stripe_unit"], layout["stripe_count"], layout["object_size"]) == (MiB, OSDS, 4 * MiB)
    # A layout CephFS cannot take is refused with the rule, and nothing changes.
    rc, err = geometry(d, "--stripe-unit", 1000)
    assert rc != 0 and "multiple of 65536" in err, err
    assert cephfs.get_layout(d)["stripe_unit"] == MiB


def test_reports_storage_targets(rig):
    # What aggregate_files = auto takes as the number of shared files.
    assert rig.osd_count() == OSDS
    assert rig.osd_count(up_and_in=False) == OSDS
    assert len(rig.ceph("osd", "ls", as_json=True)) == OSDS
    size = rig.ceph("osd", "pool", "get", cephfs.DATA_POOL, "size", as_json=True)
    assert size["size"] == 1


def test_every_daemon_recorded(rig):
    kinds = sorted(d["kind"] for d in rig.daemons)
    assert kinds == sorted(["mon", "mgr", "mds"] + ["osd"] * OSDS)
    recorded = {d["pid"] for d in rig.daemons + rig.clients}
    assert set(cephfs.processes_using(rig.conf)) <= recorded
    for e in rig.daemons + rig.clients:
        assert rig._alive(e["pid"]), e
        assert os.path.getsize(e["log"]) > 0, e["log"]


def test_teardown_leaves_nothing(rig):
    pids = [e["pid"] for e in rig.daemons + rig.clients]
    mounts = list(map(str, rig.mounts))
    rig.stop()
    assert leftovers(rig, pids) == []
    for m in mounts:
        assert stat.S_ISDIR(os.stat(m).st_mode) and os.listdir(m) == []  # the bare mount point
    assert not (rig.root / cephfs.STATE_FILE).exists()
    print(f"rig stopped in {rig.timings['stop_s']:.1f} s")
    rig.stop()  # again: nothing to do, no error


# ---- failures: these run after the module's rig is stopped -------------------

def test_failed_start_reports_the_daemon_and_leaves_nothing(tmp_path):
    # An MDS told to bind an address this host does not have (TEST-NET-1)
    # exits at start: the error names it and quotes its log, and the monitor,
    # manager and OSDs already running are stopped.
    rig = cephfs.CephFSRig(tmp_path / "rig", clients=1, osds=1, die_with_parent=True, timeout=60,
                           conf_extra={"mds": {"public_addr": "192.0.2.1", "ms_bind_retry_count": 0}})
    with pytest.raises(cephfs.CephFSError) as err:
        rig.start()
    msg = str(err.value)
    assert "mds.a" in msg and "mds.a.log (tail)" in msg and "unable to bind" in msg, msg
    assert len(rig.daemons) >= 4  # it got as far as the MDS
    assert leftovers(rig, [e["pid"] for e in rig.daemons]) == []


def test_teardown_after_the_servers_died(tmp_path):
    # A ceph-fuse whose cluster is gone hangs in its unmount: stop() must still
    # leave no client and no mount behind.
    rig = start_rig(tmp_path / "rig", clients=1, osds=1)
    (rig.mounts[0] / "f").write_bytes(b"y" * 100000)
    for d in rig.daemons:
        os.kill(d["pid"], signal.SIGKILL)
    pids = [e["pid"] for e in rig.daemons + rig.clients]
    rig.stop()
    assert leftovers(rig, pids) == []
