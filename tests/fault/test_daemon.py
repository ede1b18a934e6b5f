"""The node daemon (engine_host = daemon, docs/design/daemon.md) under real
mpirun with emulated nodes (harness.NodeJob: each node an MPMD block of ranks
with its own node id and node-local directory, so each node has a cairnd of
its own).

- The whole application SIGKILLed right after cairn_checkpoint returned, at
  random versions: the daemons still take that version to the persistent
  level and commit it, and a relaunch on replacement nodes (every node-local
  directory wiped) restores it bit for bit.
- The daemon SIGKILLed under a running job: the ranks carry on with engine
  threads of their own, with a warning, and nothing is lost.
- The daemons end with their job; a configuration the daemon cannot serve is
  refused at init with a message.
"""
import json
import os
import random
import signal
import time

import pytest

import harness
from harness import assert_same_state

NODES, RPN = 2, 2
STEPS, EVERY, NBYTES = 20, 2, 65536
DAEMON = {"engine_host": "daemon"}


daemons = harness.daemons


def wait_for(what, cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def node_job(make_node_job):
    return lambda run="daemon": make_node_job(NODES, RPN, run)


def restore_and_compare(job, ref, version):
    prefix = job.dumps / "restored"
    res = job.run(*ref.app_args(), "--steps", STEPS, "--dump-restored", prefix, **DAEMON).ok()
    assert res.restarted_from == version, res.describe()
    assert_same_state(ref.dump(version), job.read_dump(prefix), f"state restored from version {version}")
    assert res.final_hash == ref.final_hash, "final state differs from the uninterrupted run"
    return res


def test_application_killed_right_after_checkpoint(node_job, reference):
    """10 times: every rank SIGKILLs itself right after cairn_checkpoint(V)
    returned (V random). Nothing had reached the persistent level through the
    application (it never waited), so the MANIFEST of V can only be the
    daemons'. After the daemons end, the node-local directories are wiped
    (replacement nodes) and the relaunch restores V bit for bit."""
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    seed = int(os.environ.get("CAIRN_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    for attempt in range(10):
        v = rng.randrange(EVERY, STEPS, EVERY)
        job = node_job(run=f"killed{attempt}")
        res = job.run(*ref.app_args(), "--steps", STEPS, "--die-after", v, **DAEMON)
        what = f"seed {seed}, attempt {attempt}, killed after version {v}"
        assert res.rc != 0 and f"final hash" not in res.stdout, f"{what}: the application was not killed\n" + res.describe()
        wait_for(f"{what}: the daemons to end", lambda: not daemons(job.store))
        assert v in job.committed(), f"{what}: committed {job.committed()}\n" + res.describe()
        for node in range(NODES):
            job.lose_node(node)
        restore_and_compare(job, ref, v)
        assert not daemons(job.store), f"{what}: a daemon outlived the relaunch"


def test_daemon_killed_ranks_continue(node_job, reference):
    """The daemons are SIGKILLed while the job is paused after version 6; the
    ranks notice, warn, write every later version themselves, and the run
    ends with the uninterrupted result; a relaunch restores the newest."""
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = node_job()
    flag = job.root / "go"
    p = job.start(*ref.app_args(), "--steps", STEPS, "--wait-persistent", "--pause-after", 6, flag, **DAEMON)
    job.wait_paused(p, flag)
    pids = daemons(job.store)
    assert len(pids) == NODES, f"expected one cairnd per node, found {pids}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    flag.touch()
    res = harness.finish_process(p).ok()
    assert "node daemon cairnd" in res.stderr and "is gone" in res.stderr, res.describe()
    assert res.final_hash == ref.final_hash
    for v in ref.versions:
        for r in range(job.nranks):
            assert res.waits()[(r, v)][0] == 0, res.describe()
    assert job.committed() == ref.versions
    for node in range(NODES):
        job.lose_node(node)
    restore_and_compare(job, ref, STEPS)


def test_daemons_end_with_their_job(node_job, reference):
    """A run that ends normally: every version committed, the same result as
    in-process engines, and no cairnd left once mpirun returned."""
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = node_job()
    p = job.start(*ref.app_args(), "--steps", STEPS, "--wait-persistent", **DAEMON)
    wait_for("the daemons to start", lambda: len(daemons(job.store)) == NODES or p.poll() is not None)
    res = harness.finish_process(p).ok()
    assert res.final_hash == ref.final_hash
    assert job.committed() == ref.versions
    wait_for("the daemons to end", lambda: not daemons(job.store), timeout=15)


@pytest.mark.parametrize("cfg,expected", [
    ({"daemon_program": "/nonexistent/cairnd"}, "starting the node daemon '/nonexistent/cairnd'"),
    ({"mode": "sync"}, "engine_host = daemon': mode = sync"),
    ({"agents": "127.0.0.1:1"}, "engine_host = daemon': checkpoint agents"),
])
def test_unusable_configuration_is_refused(node_job, cfg, expected, reference):
    ref = reference(NODES * RPN, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = node_job()
    res = job.run(*ref.app_args(), "--steps", 4, **DAEMON, **cfg)
    assert res.rc != 0, res.describe()
    assert expected in res.stdout + res.stderr, res.describe()
    assert job.committed() == []
    assert not daemons(job.store)


@pytest.mark.parametrize("scheme", ["xor", "rs"])
def test_redundancy_encoded_by_the_daemons(tmp_path, reference, scheme):
    """Redundancy (L2) through the daemons, the persistent level off: the
    application dies right after cairn_checkpoint(V) returned; the daemons
    still encode V across the nodes. Then one node is lost (rs: two) and the
    relaunch rebuilds its shards from the survivors' parity, bit for bit."""
    nodes = 4
    ref = reference(nodes, steps=STEPS, every=EVERY, nbytes=NBYTES)
    job = harness.NodeJob(tmp_path / "job", nodes, 1, run="l2")
    cfg = {**DAEMON, "redundancy": scheme, "redundancy_set": nodes, "rs_parity": 2,
           "persistent_interval": 1000000}
    v = random.Random().randrange(EVERY * 2, STEPS, EVERY)
    res = job.run(*ref.app_args(), "--steps", STEPS, "--die-after", v, **cfg)
    assert res.rc != 0 and "final hash" not in res.stdout, res.describe()
    wait_for("the daemons to end", lambda: not daemons(job.store))
    for r in range(nodes):
        assert (job.local_dir(r, v) / f"redundancy.{r:06d}").is_file(), f"no parity of version {v} on node {r}"
    assert job.committed() == []
    lost = [1] if scheme == "xor" else [1, 2]
    for node in lost:
        job.lose_node(node)
    prefix = job.dumps / "restored"
    res = job.run(*ref.app_args(), "--steps", STEPS, "--dump-restored", prefix, **cfg).ok()
    assert res.restarted_from == v, res.describe()
    assert_same_state(ref.dump(v), job.read_dump(prefix), f"state rebuilt from version {v}'s parity")
    assert res.final_hash == ref.final_hash


OTHER_USER = "cairn-other"


def other_user() -> str:
    """A second local user (created here once): the isolation tests' stranger."""
    import pwd
    import subprocess
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot create a second user: {r.stderr.strip()}")
    return OTHER_USER


def start_cairnd(tmp_path, ranks=1, timeout=20):
    """cairnd started as a rank starts it: its token on an inherited pipe. Returns (process, socket name, token hex, log path)."""
    import subprocess
    name = f"cairn-test-{os.getpid()}-{time.monotonic_ns()}"
    token = os.urandom(32)
    r, w = os.pipe()
    os.write(w, token)
    os.close(w)
    log_path = tmp_path / "cairnd.log"
    cairnd = harness.bin_dir().parents[1] / "tools" / "cairnd" / "cairnd"
    with open(log_path, "w") as log:
        d = subprocess.Popen([str(cairnd), "--socket", name, "--ranks", str(ranks), "--connect-timeout", str(timeout),
                              "--token-fd", str(r)], stdout=log, stderr=subprocess.STDOUT, pass_fds=(r,))
    os.close(r)
    return d, name, token.hex(), log_path


def stop(d):
    """Kills a cairnd a test left running (by its PID)."""
    if d.poll() is None:
        d.kill()
        d.wait()


def daemon_connect(name):
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(200):
        try:
            s.connect("\0" + name)
            return s
        except OSError:
            time.sleep(0.05)
    raise AssertionError("cairnd does not listen")


def daemon_frame(kind: int, meta: str = "", payload: bytes = b"") -> bytes:
    m = meta.encode()
    return (1 + 4 + len(m) + len(payload)).to_bytes(4, "little") + bytes([kind]) + len(m).to_bytes(4, "little") + m + \
        payload


def daemon_answer(s) -> dict:
    import json
    s.settimeout(10)
    head = b""
    while len(head) < 9:
        head += s.recv(9 - len(head))
    n = int.from_bytes(head[:4], "little") - 5
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return json.loads(body[:int.from_bytes(head[5:9], "little")])


def test_another_user_cannot_talk_to_the_daemon(tmp_path):
    """Another local user connects to a cairnd (its abstract socket name is
    readable in /proc; file permissions do not apply to it) before the job's
    rank does and sends a hello with a store of its own: the daemon refuses
    the connection by its credentials (SO_PEERCRED) at once, logs it, and
    still waits for its rank, whose connection it serves."""
    import subprocess
    user = other_user()
    d, name, token, log_path = start_cairnd(tmp_path)
    try:
        probe = ("import socket, time\n"
                 "for _ in range(200):\n"
                 "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                 "    try:\n"
                 f"        s.connect('\\0{name}')\n"
                 "        break\n"
                 "    except OSError:\n"
                 "        time.sleep(0.05)\n"
                 "s.settimeout(10)\n"
                 "try:\n"
                 "    s.sendall(b'\\x00' * 64 + b'{\"rank\": 0, \"config\": {\"persistent\": \"/tmp/x\"}}')\n"
                 "    print('answer', repr(s.recv(100)))\n"
                 "except (ConnectionResetError, BrokenPipeError):\n"
                 "    print('answer reset')\n")
        r = subprocess.run(["runuser", "-u", user, "--", "python3", "-c", probe], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert "answer b''" in r.stdout or "answer reset" in r.stdout, r.stdout  # closed at once, without a word
        assert d.poll() is None, "cairnd ended"
        # The job's own rank is still served: its hello is welcomed.
        s = daemon_connect(name)
        s.sendall(daemon_frame(1, json.dumps({"rank": 0, "nranks": 1, "token": token,
                                              "config": {"persistent": str(tmp_path / "store")}})))
        assert "error" not in daemon_answer(s)
        s.sendall(daemon_frame(5))  # bye
        s.close()
        d.wait(timeout=30)
    finally:
        stop(d)
    text = log_path.read_text()
    assert "not this job's user" in text, text


def test_the_daemon_admits_only_its_execution_and_survives_malformed_frames(tmp_path):
    """A connection of the job's own user without this execution's token (a
    rank of another job of the user, or anything else that found the socket)
    is refused with a reason and does not take a rank's place; one that says
    nothing is dropped after the handshake's time. The admitted rank's
    malformed frames (wrong JSON types, unknown types, a slot without its
    memory file, a job in a slot never handed over) are each refused and
    logged while its session goes on; a frame longer than the limit ends
    the session (the stream cannot be read on) as a rank's death does, and
    the daemon ends normally."""
    d, name, token, log_path = start_cairnd(tmp_path, timeout=30)
    store = str(tmp_path / "store")
    try:
        stranger = daemon_connect(name)
        stranger.sendall(daemon_frame(1, json.dumps({"rank": 0, "nranks": 1, "token": "00" * 32,
                                                     "config": {"persistent": "/tmp/elsewhere"}})))
        assert "token" in daemon_answer(stranger)["error"]
        silent = daemon_connect(name)  # says nothing: dropped after the handshake's 10 s
        s = daemon_connect(name)
        s.sendall(daemon_frame(1, json.dumps({"rank": 0, "nranks": 1, "token": token, "config": {"persistent": store}})))
        assert "error" not in daemon_answer(s)
        for kind, meta in [(6, '{"redundancy": "xor"}'),          # start: redundancy of the wrong type
                           (4, '{"name": 7, "version": "x"}'),    # committed
                           (3, '{"id": "one", "slot": 1}'),       # job
                           (3, '{"id": 1, "slot": 99, "wanted": 1}'),  # before the engine started
                           (2, '{"id": 1, "size": 4096}'),        # slot without its memory file
                           (7, '{"id": 5}'),                      # release of an unknown slot
                           (99, '{}'),                            # unknown type
                           (6, '[' * 100000)]:                    # nested too deep
            s.sendall(daemon_frame(kind, meta))
        s.sendall(daemon_frame(6, '{"redundancy": null}'))  # a good start after all that
        s.sendall(daemon_frame(3, '{"id": 2, "slot": 99, "wanted": 1}'))  # a slot never handed over
        s.sendall(b"\xff\xff\xff\x7f")  # a frame of 2 GiB: the stream cannot be read on
        time.sleep(0.5)
        assert d.poll() is None, "cairnd ended on a malformed frame"
        s.close()
        d.wait(timeout=30)
        assert d.returncode == 0
        silent.close()
        stranger.close()
    finally:
        stop(d)
    text = log_path.read_text()
    assert "does not carry this execution's token" in text, text
    assert text.count("frame refused") >= 7, text
    for what in ["'redundancy' must be an object", "'name' must be a string", "'id' must be a non-negative integer",
                 "engine did not start", "never handed over", "without its memory file", "unknown staging slot",
                 "unknown type", "nested deeper", "nothing received in time", "a frame of 2147483647 bytes"]:
        assert what in text, (what, text)
