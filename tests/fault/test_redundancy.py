"""Node-loss redundancy (issue 12, docs/design/redundancy.md) under real
mpirun with emulated nodes: every node is an MPMD block of ranks with its own
node id (CAIRN_NODE_ID) and its own node-local directory, so wiping a
directory loses exactly what that node held. The persistent level is off
(persistent_interval far beyond the run) unless a test says otherwise, so only
the node-local level and its redundancy can serve a restart. Every restart is
compared bit for bit with an uninterrupted run.
"""
import random
from pathlib import Path

import pytest

import harness
from harness import assert_same_state

NBYTES = 65536
OFF = {"persistent_interval": 1000000}  # L3 never written: only L1 and L2 can serve


class NodeJob(harness.NodeJob):
    """harness.NodeJob with the parity files of redundancy."""

    def __init__(self, root, nodes, rpn, run="redundancy"):
        super().__init__(root, nodes, rpn, run=run)

    def parity(self, rank, version) -> Path:
        return self.local_dir(rank, version) / f"redundancy.{rank:06d}"


def cfg(scheme, **extra):
    c = {"redundancy": scheme, "redundancy_set": 4, "rs_parity": 2, **OFF}
    c.update(extra)
    return c


def first_run(job, scheme, steps=7, **extra):
    res = job.run("--steps", steps, "--every", 2, "--bytes", NBYTES, "--wait-protected", **cfg(scheme, **extra)).ok()
    versions = list(range(2, steps + 1, 2))
    for v in versions:
        for r in range(job.nranks):
            assert f"rank {r} protected {v} rc=0" in res.stdout, res.describe()
    for v in versions[-2:]:  # keep_local = 2: older versions were removed with their parity
        for r in range(job.nranks):
            assert job.parity(r, v).is_file(), f"no parity file of rank {r} version {v}"
    assert not job.local_dir(0, versions[0]).exists()
    if "persistent_interval" not in extra:
        assert job.committed() == []
    return res


def restart(job, scheme, ref, **extra):
    res = job.run("--steps", 10, "--every", 2, "--bytes", NBYTES, "--dump-restored", job.dumps / "restored",
                  **cfg(scheme, **extra)).ok()
    return res


# (scheme, nodes, ranks per node): partner with two ranks on each of two
# nodes (sets {0,2}, {1,3}: formed across nodes, not of consecutive ranks).
LAYOUTS = [("partner", 2, 2), ("xor", 4, 1), ("rs", 4, 1)]


@pytest.mark.parametrize("scheme,nodes,rpn", LAYOUTS)
def test_lose_one_node(scheme, nodes, rpn, reference, tmp_path):
    """Versions 2, 4, 6 protected; node 1's node-local directory wiped; the
    rerun rebuilds its ranks' shards of version 6 from their sets and restores
    bit for bit, without a persistent level."""
    job = NodeJob(tmp_path / "job", nodes, rpn)
    ref = reference(job.nranks, 10, 2, NBYTES)
    first_run(job, scheme)
    lost = [r for r in range(job.nranks) if r // rpn == 1]
    before = {r: job.local_dir(r, 6).joinpath(f"shard.{r:06d}").read_bytes() for r in lost}
    job.lose_node(1)
    res = restart(job, scheme, ref)
    assert res.restarted_from == 6, res.describe()
    for r in lost:
        assert f"rank {r}: rebuilt the node-local shard of 'ckpt' version 6 from redundancy {scheme}" in res.stderr, \
            res.describe()
        # Restored from memory, then stored at the node-local level again:
        # the file its node lost, byte for byte.
        rebuilt = job.local_dir(r, 6).joinpath(f"shard.{r:06d}")
        assert rebuilt.is_file() and rebuilt.read_bytes() == before[r], f"rank {r}: rebuilt shard file differs"
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), f"{scheme}: rebuilt after losing node 1")
    assert res.final_hash == ref.final_hash


def parity_blocks(path: Path) -> bytes:
    """A parity file's blocks: what follows its header (prefix and JSON, padded to 4 KiB)."""
    data = path.read_bytes()
    json_len = int.from_bytes(data[12:16], "little")
    return data[(24 + json_len + 4095) // 4096 * 4096:]


# The nodes lost second: each set then needs the parity its first lost node got back.
SECOND_LOSS = {"partner": [0], "xor": [2], "rs": [2, 3]}


@pytest.mark.parametrize("scheme,nodes,rpn", LAYOUTS)
def test_rebuilt_node_gets_its_parity_back(scheme, nodes, rpn, reference, tmp_path):
    """Node 1 lost: the restart rebuilds its ranks' shards of version 6 and
    encodes their parity again from the survivors, block for block the parity
    the node lost. Then other nodes are lost (as many as the scheme tolerates
    per set, counting node 1 as back): version 6 is rebuilt again from
    redundancy, with the parity node 1 got back, bit for bit."""
    job = NodeJob(tmp_path / "job", nodes, rpn)
    ref = reference(job.nranks, 10, 2, NBYTES)
    keep = {"keep_local_after_finalize": "true"}
    first_run(job, scheme, **keep)
    lost = [r for r in range(job.nranks) if r // rpn == 1]
    before = {r: parity_blocks(job.parity(r, 6)) for r in lost}
    job.lose_node(1)
    # Restored and nothing more (the run ends at step 6): version 6 stays the newest.
    res = job.run("--steps", 6, "--every", 2, "--bytes", NBYTES, **cfg(scheme, **keep)).ok()
    assert res.restarted_from == 6, res.describe()
    for r in lost:
        assert f"rank {r}: rebuilt the node-local shard of 'ckpt' version 6" in res.stderr, res.describe()
        assert job.parity(r, 6).is_file(), f"rank {r}: no parity file of version 6 after the rebuild"
        assert parity_blocks(job.parity(r, 6)) == before[r], f"rank {r}: the parity encoded again differs"
    second = [r for r in range(job.nranks) if r // rpn in SECOND_LOSS[scheme]]
    for n in SECOND_LOSS[scheme]:
        job.lose_node(n)
    res = restart(job, scheme, ref, **keep)
    assert res.restarted_from == 6, res.describe()
    for r in second:
        assert f"rank {r}: rebuilt the node-local shard of 'ckpt' version 6 from redundancy {scheme}" in res.stderr, \
            res.describe()
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), f"{scheme}: second loss after the rebuild")
    assert res.final_hash == ref.final_hash


def test_rs_two_rebuilt_nodes_get_their_parity_back(reference, tmp_path):
    """rs(k=4, m=2), nodes 1 and 2 lost: each rebuilt rank's parity needs the
    other's data, exposed from its rebuilt image in a second exchange; both
    parity files come back block for block. Then nodes 0 and 3 are lost:
    version 6 is rebuilt from the parity of ranks 1 and 2 alone, bit for bit."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    keep = {"keep_local_after_finalize": "true"}
    first_run(job, "rs", **keep)
    before = {r: parity_blocks(job.parity(r, 6)) for r in (1, 2)}
    job.lose_node(1)
    job.lose_node(2)
    res = job.run("--steps", 6, "--every", 2, "--bytes", NBYTES, **cfg("rs", **keep)).ok()
    assert res.restarted_from == 6, res.describe()
    assert "is not restored" not in res.stderr, res.describe()
    for r in (1, 2):
        assert parity_blocks(job.parity(r, 6)) == before[r], f"rank {r}: the parity encoded again differs"
    job.lose_node(0)
    job.lose_node(3)
    res = restart(job, "rs", ref, **keep)
    assert res.restarted_from == 6, res.describe()
    for r in (0, 3):
        assert f"rank {r}: rebuilt the node-local shard of 'ckpt' version 6 from redundancy rs(k=4, m=2)" in res.stderr
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "rs: the other two nodes lost after")


def test_rs_survives_two_nodes_of_one_set(reference, tmp_path):
    """rs with m = 2: two of the set's four nodes lost, both rebuilt."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    first_run(job, "rs")
    job.lose_node(1)
    job.lose_node(2)
    res = restart(job, "rs", ref)
    assert res.restarted_from == 6, res.describe()
    for r in (1, 2):
        assert f"rank {r}: rebuilt the node-local shard of 'ckpt' version 6 from redundancy rs(k=4, m=2)" in res.stderr
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "rs: two nodes lost")


def test_xor_two_nodes_of_one_set_falls_back(reference, tmp_path):
    """xor tolerates one lost node per set: with two lost, the rebuild says
    which nodes were lost and why, and the restart falls back to the
    persistent level (version 4, the newest committed there)."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    first_run(job, "xor", persistent_interval=2)
    assert job.committed() == [4]
    job.lose_node(1)
    job.lose_node(3)
    res = restart(job, "xor", ref, persistent_interval=2)
    assert res.restarted_from == 4, res.describe()
    assert "cannot rebuild the node-local shard of 'ckpt' version 6 from redundancy" in res.stderr, res.describe()
    assert "node 'node1' (rank 1)" in res.stderr and "node 'node3' (rank 3)" in res.stderr, res.describe()
    assert "xor(k=4, m=1) tolerates 1 lost node(s) per set" in res.stderr, res.describe()
    assert_same_state(ref.dump(4), job.read_dump(job.dumps / "restored"), "xor: fell back to the persistent level")


def corrupt_blocks(path: Path):
    """Flips a byte in every parity block of a parity file (after its 4 KiB header)."""
    data = bytearray(path.read_bytes())
    for at in range(4096, len(data), 4096):
        data[at + 17] ^= 0x5A
    path.write_bytes(bytes(data))


def test_corrupt_parity_detected_and_not_used(reference, tmp_path):
    """rs(k=4, m=2): node 1 lost and node 2's parity blocks of version 6
    damaged. The damage is reported and the blocks are not used: the rebuild
    takes the other parity and restores version 6 bit for bit."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    first_run(job, "rs")
    job.lose_node(1)
    corrupt_blocks(job.parity(2, 6))
    res = restart(job, "rs", ref)
    assert res.restarted_from == 6, res.describe()
    assert "rank 2: parity block of stripe" in res.stderr and "is corrupt (checksum mismatch); not used" in res.stderr
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "rs: rebuilt around corrupt parity")


def test_xor_corrupt_parity_needed_falls_back(reference, tmp_path):
    """xor: node 1 lost and the parity it needs damaged on node 2: not used;
    the rebuild names the corrupt parity, and version 4 is rebuilt instead."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    first_run(job, "xor")
    job.lose_node(1)
    corrupt_blocks(job.parity(2, 6))
    res = restart(job, "xor", ref)
    assert "corrupt parity on rank 2" in res.stderr, res.describe()
    assert res.restarted_from == 4, res.describe()
    assert_same_state(ref.dump(4), job.read_dump(job.dumps / "restored"), "xor: rebuilt the older version")


@pytest.mark.parametrize("trial", range(2))
def test_killed_during_encoding_keeps_previous_protected(trial, reference, tmp_path):
    """A random rank killed at a random point of encoding version 6 (after 0
    or 1 encoded windows): version 4 stays protected (every parity file
    there), and after losing a random node the restart gets 4 or 6, bit for bit."""
    rng = random.Random()
    victim, after, lost = rng.randrange(4), rng.randrange(2), rng.randrange(4)
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    killed = job.run("--steps", 7, "--every", 2, "--bytes", NBYTES, "--wait-protected",
                     fault_inject=f"level=redundancy,action=kill,version=6,after={after},rank={victim}",
                     **cfg("xor"))
    assert killed.rc != 0 and not killed.timed_out, killed.describe()
    for r in range(4):
        assert job.parity(r, 4).is_file(), f"victim {victim}: version 4 lost rank {r}'s parity"
    assert not job.parity(victim, 6).exists()
    job.lose_node(lost)
    res = restart(job, "xor", ref)
    assert res.restarted_from in (4, 6), f"victim {victim} after {after} lost {lost}\n" + res.describe()
    v = res.restarted_from
    assert_same_state(ref.dump(v), job.read_dump(job.dumps / "restored"),
                      f"victim {victim}, after {after}, lost node {lost}: restored {v}")
    assert res.final_hash == ref.final_hash


def test_restart_verifying_while_reading_with_redundancy(reference, tmp_path):
    """restart_verify = while with xor and a persistent level (committed
    versions): with every shard intact, each rank reads its node-local shard
    into place; with node 1 lost, the survivors verify their shards whole
    before they expose them, and rank 1 is rebuilt. Both bit for bit."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    extra = {"persistent_interval": 1, "restart_verify": "while", "keep_local_after_finalize": "true"}
    first_run(job, "xor", **extra)
    assert job.committed() == [2, 4, 6]
    res = job.run("--steps", 6, "--every", 2, "--bytes", NBYTES, "--dump-restored", job.dumps / "intact",
                  **cfg("xor", **extra)).ok()
    assert res.restarted_from == 6, res.describe()
    assert "rebuilt" not in res.stderr and "unusable" not in res.stderr, res.describe()
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "intact"), "xor, while: every shard intact")
    job.lose_node(1)
    res = restart(job, "xor", ref, **extra)
    assert res.restarted_from == 6, res.describe()
    assert "rank 1: rebuilt the node-local shard of 'ckpt' version 6 from redundancy xor" in res.stderr, res.describe()
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), "xor, while: node 1 lost")
    assert res.final_hash == ref.final_hash


# Who dies during the rebuild of version 6 after node 1 (rank 1) was lost: a
# survivor while rank 1 pulls from it, rank 1 mid-pull, or rank 1 while it
# stores the rebuilt shard (or its parity) at the node-local level again.
REBUILD_KILLS = {"survivor": "level=redundancy,action=kill,version=6,role=rebuild,rank=2",
                 "lost": "level=redundancy,action=kill,version=6,role=rebuild,rank=1",
                 "storing": "level=local,action=kill,kind=write,version=6,rank=1"}


@pytest.mark.parametrize("how", sorted(REBUILD_KILLS))
def test_killed_during_a_rebuild_rebuilds_again(how, reference, tmp_path):
    """Node 1 lost, and the restart that rebuilds its shard of version 6 is
    killed part-way: nothing it left half-done is used. The next restart
    restores version 6 bit for bit (rebuilt again, or from the shard the
    killed one stored whole) and runs on to the uninterrupted final state."""
    job = NodeJob(tmp_path / "job", 4, 1)
    ref = reference(4, 10, 2, NBYTES)
    first_run(job, "xor")
    job.lose_node(1)
    killed = job.run("--steps", 10, "--every", 2, "--bytes", NBYTES, fault_inject=REBUILD_KILLS[how], **cfg("xor"))
    assert killed.rc != 0 and not killed.timed_out, killed.describe()
    assert "final hash" not in killed.stdout, killed.describe()
    shard = job.local_dir(1, 6) / "shard.000001"
    if how != "storing":
        assert not shard.exists(), killed.describe()
    res = restart(job, "xor", ref)
    assert res.restarted_from == 6, res.describe()
    assert_same_state(ref.dump(6), job.read_dump(job.dumps / "restored"), f"killed during the rebuild ({how})")
    assert res.final_hash == ref.final_hash


@pytest.mark.parametrize("scheme,extra,expect", [
    ("xor", {}, "needs sets of at least 2 ranks on distinct nodes, but this job's 2 ranks are on 1 node(s)"),
    ("rs", {"rs_parity": 2}, "needs sets of at least 3 ranks on distinct nodes"),
])
def test_set_cannot_be_formed(scheme, extra, expect, make_job):
    """Two ranks on one node: no set spans two nodes; a clear error at init."""
    job = make_job(2)
    res = job.run("--steps", 2, **cfg(scheme, **extra))
    assert res.rc != 0, res.describe()
    assert expect in res.stdout + res.stderr, res.describe()


# ---- what the store records, and `cairn verify` of the parity ----------------

def cli(*args):
    if harness.cli_path() is None:
        pytest.skip("the cairn CLI (target cairn_cli) is not built or CAIRN_TEST_CLI is unset")
    return harness.run_cli(*map(str, args))


def catalog_rows(store: Path, sql: str):
    import sqlite3
    db = sqlite3.connect(str(store / "catalog.sqlite"))
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("scheme,description,m", [("xor", "xor(k=4, m=1)", 1), ("rs", "rs(k=4, m=2)", 2)])
def test_manifest_and_catalog_record_the_scheme(scheme, description, m, tmp_path):
    """Version 4 is committed (persistent_interval = 2) and protected: its
    MANIFEST names the scheme, k, m and the set; `cairn show`/`ls --json`
    print it; the catalog has it, and `cairn reindex` restores it from the
    MANIFEST alone."""
    import json
    job = NodeJob(tmp_path / "job", 4, 1)
    first_run(job, scheme, persistent_interval=2)
    assert job.committed() == [4]
    text = job.manifest(4).read_text()
    body = json.loads(text[:text.rindex("xxh3 ")])
    red = body["redundancy"]
    assert (red["scheme"], red["description"], red["k"], red["m"]) == (scheme, description, 4, m), red
    assert red["sets"] == [[0, 1, 2, 3]], red  # one set, round robin over the 4 nodes
    # The ordered pipeline: a rank's persistent stage runs after its redundancy
    # stage, which ends when its whole set is complete, so the time is known.
    captured = min(s["captured_at"] for s in body["shards"])
    assert red["protected_at"] is not None and captured <= red["protected_at"] <= body["committed_at"], red

    show = cli("show", job.store, "ckpt", 4).ok()
    assert f"redundancy:  {description}, sets complete " in show.stdout, show.describe()
    shown = json.loads(cli("show", job.store, "ckpt", 4, "--json").ok().stdout)
    assert shown["redundancy"]["description"] == description
    listed = json.loads(cli("ls", job.store, "--json").ok().stdout)
    v4 = [v for v in listed["versions"] if v["version"] == 4]
    assert v4 and (v4[0]["redundancy"]["scheme"], v4[0]["redundancy"]["k"], v4[0]["redundancy"]["m"]) == \
        (scheme, 4, m), v4

    query = "SELECT redundancy, redundancy_scheme, redundancy_k, redundancy_m FROM checkpoints WHERE version = 4"
    expect = [(description, scheme, 4, m)]
    assert catalog_rows(job.store, query) == expect  # indexed by the job itself
    for f in job.store.glob("catalog.sqlite*"):
        f.unlink()
    cli("reindex", job.store).ok()
    assert catalog_rows(job.store, query) == expect
    assert catalog_rows(job.store, "SELECT version, source FROM events WHERE level = 4 AND rank IS NULL") == \
        [(4, "manifest")]


def scratch_args(job):
    return [a for i in range(job.nodes) for a in ("--scratch", job.node_dir(i))]


@pytest.mark.parametrize("scheme,blocks", [("xor", 1), ("rs", 2)])
def test_verify_reencodes_parity_and_names_a_damaged_block(scheme, blocks, tmp_path):
    """`cairn verify --scratch` over the 4 nodes' directories: the parity files
    of versions 4 and 6 (keep_local = 2) re-encoded from the shards, no
    problem; one byte flipped in a parity block of rank 2, version 6: exit 1,
    naming that file and block, in text and JSON."""
    import json
    job = NodeJob(tmp_path / "job", 4, 1)
    first_run(job, scheme)
    args = ["verify", job.store, *scratch_args(job)]
    res = cli(*args)
    assert res.rc == 0, res.describe()
    assert f"8 parity files ({8 * blocks} blocks, {8 * blocks} re-encoded)" in res.stdout, res.describe()
    assert res.stdout.rstrip().endswith(": no problems"), res.describe()

    damaged = job.parity(2, 6)
    data = bytearray(damaged.read_bytes())
    data[4096 + 17] ^= 0x5A  # the first block, right after the 4 KiB header
    damaged.write_bytes(bytes(data))
    res = cli(*args)
    assert res.rc == 1, res.describe()
    assert f"{damaged}: parity block of stripe " in res.stdout, res.describe()
    assert "checksum mismatch, and it differs from the parity re-encoded from the shards of ranks" in res.stdout
    assert res.stdout.rstrip().endswith(": 1 problem"), res.describe()
    j = json.loads(cli(*args, "--json").stdout)
    assert j["ok"] is False and len(j["problems"]) == 1, j
    p = j["problems"][0]
    assert (p["file"], p["level"], p["version"]) == (str(damaged), "protected", 6), p
    assert p["parity_block"]["offset"] == 4096, p  # the first block of the file
    assert j["parity"]["files"] == 8 and j["parity"]["reencoded"] == 8 * blocks, j


def test_verify_parity_without_a_lost_nodes_shards(tmp_path):
    """rs(k=4, m=2), node 1 wiped: its shards and parity are gone (normal at
    the local level: no problem). Of the 2 blocks in each of the 3 remaining
    files of a version, those of stripes 2 and 3 need rank 1's data and are
    checked against their checksums only; stripes 0 (node 0) and 1 (node 2)
    are re-encoded: 2 of 6 per version."""
    import json
    job = NodeJob(tmp_path / "job", 4, 1)
    first_run(job, "rs")
    job.lose_node(1)
    args = scratch_args(job)
    res = cli("verify", job.store, *args[:2], *args[4:], "--json")
    assert res.rc == 0, res.describe()
    j = json.loads(res.stdout)
    assert j["ok"] is True, j
    assert (j["parity"]["files"], j["parity"]["blocks"], j["parity"]["reencoded"]) == (6, 12, 4), j
