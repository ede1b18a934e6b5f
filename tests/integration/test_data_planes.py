"""The job's data planes refuse a peer without the job's key (issue 23;
docs/design/security.md, "Data planes").

A job of 4 ranks on 2 emulated nodes checkpoints with both planes between its
ranks in use: the aggregated flush by leaders and partner redundancy. While it
runs, a stranger (tests/integration/plane_stranger.cpp: a process of the same
machine with no key) finds every fabric endpoint the ranks listen on, as an
attacker on the node would (/proc/net/tcp), and floods them with forged READY
and HELD messages for the job's checkpoint name: unsealed, or sealed with a
wrong key. Accepted, a forged HELD fails a version and a forged READY makes a
leader or a set member read from the wrong place. The ranks drop and count
them; every version is protected and committed, and both levels restore bit
for bit: the node-local level rebuilt from redundancy after a node is lost,
and the aggregated persistent level.
"""
import os
import socket
import subprocess
import time
from pathlib import Path

import harness
from harness import assert_same_state

NBYTES = 65536
STEPS, EVERY = 12, 2
CFG = {"redundancy": "partner", "persistent_layout": "aggregated", "aggregate_strategy": "leaders", "aggregate_files": 2,
       "stripe_size": "64K"}


def endpoints(pids) -> list:
    """The "address:port" the given processes listen on at one IPv4 address
    (the fabric endpoints; MPI's own sockets listen on every address)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except OSError:
            continue
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        ip, port = f[1].split(":")
        if f[3] == "0A" and ip != "00000000" and f[9] in inodes:  # LISTEN
            found.append(f"{socket.inet_ntoa(bytes.fromhex(ip)[::-1])}:{int(port, 16)}")
    return sorted(found)


def test_a_stranger_without_the_key_is_refused_and_the_checkpoints_are_intact(reference, tmp_path):
    job = harness.NodeJob(tmp_path / "job", 2, 2, run="planes")
    ref = reference(job.nranks, STEPS, EVERY, NBYTES)
    flag = tmp_path / "go"
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--sleep-ms", 200, "--wait-protected",
                  "--pause-after", EVERY, flag, **CFG)
    pids = list(harness.wait_rank_pids(p.pid, job.nranks).values())
    # Paused after the first version, every rank listens on its two
    # mailboxes and their lanes. The stranger's first round reaches them all
    # before the job goes on; the flood lasts until the job ends.
    job.wait_paused(p, flag)
    found = endpoints(pids)
    assert len(found) >= 2 * job.nranks, f"found the ranks' endpoints {found}\n{harness.finish_process(p).describe()}"
    stranger = subprocess.Popen([harness.bin_dir() / "cairn_plane_stranger", "120", "ckpt", str(STEPS),
                                 str(job.nranks), *found], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = stranger.stdout.readline()
    assert first.startswith("stranger: round 1 sent"), first + stranger.stderr.read()
    flag.touch()
    res = harness.finish_process(p)
    stranger.terminate()
    out, err = stranger.communicate(timeout=60)
    out = first + out
    assert stranger.returncode == 0 and int(out.splitlines()[-1].split()[2]) > 0, out + err
    res.ok()
    assert "dropped a message without this job's key" in res.stderr, out + res.describe()
    versions = list(range(EVERY, STEPS + 1, EVERY))
    for v in versions:
        for r in range(job.nranks):
            assert f"rank {r} protected {v} rc=0" in res.stdout, res.describe()
    assert job.committed() == versions, res.describe()

    # Node 1 lost: its ranks' shards are rebuilt from their partners.
    job.lose_node(1)
    res = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--dump-restored", job.dumps / "local",
                  **CFG).ok()
    assert res.restarted_from == STEPS, res.describe()
    assert_same_state(ref.dump(STEPS), job.read_dump(job.dumps / "local"), "rebuilt from redundancy")
    # Both nodes lost: the aggregated persistent level.
    job.lose_node(0)
    job.lose_node(1)
    res = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--dump-restored", job.dumps / "persistent",
                  **CFG).ok()
    assert res.restarted_from == STEPS, res.describe()
    assert_same_state(ref.dump(STEPS), job.read_dump(job.dumps / "persistent"), "the aggregated persistent level")
