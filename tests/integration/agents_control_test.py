#!/usr/bin/env python3
"""The agents control plane end to end on loopback (docs/design/agents.md).

    agents_control_test.py CAIRN_CLI WORK_DIR

Starts a controller and three managers (with a placeholder agent program) on
127.0.0.1, registers two applications, then checks: `cairn agents status
--json`; a SIGKILLed manager's node disappears after the heartbeat timeout and
its agents are reassigned; a crashed controller restarted on its journal
recovers its state while the agents keep running untouched; garbage,
unauthenticated, oversized, wrong-version, truncated and replayed frames sent
with raw sockets are rejected and logged while the controller keeps serving;
a manager stopped with SIGTERM leaves gracefully. Every wait is bounded; every
process started here is killed at the end (each in its own process group).
"""
import ctypes
import ctypes.util
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

CLI = os.path.abspath(sys.argv[1])
WORK = os.path.abspath(sys.argv[2])
HEARTBEAT = 0.2
TIMEOUT = 1.5

PLACEHOLDER_AGENT = r"""#!/usr/bin/env bash
# Placeholder agent: reports 1 MiB held, exits on SIGTERM or when its manager dies.
trap 'exit 0' TERM INT
parent=$PPID
stats=""
while [ $# -gt 0 ]; do case "$1" in --stats-file) stats="$2"; shift 2;; *) shift;; esac; done
if [ -n "$stats" ]; then
  printf '{"bytes_in": 0, "bytes_out": 0, "checkpoints": 0, "memory_held": 1048576, "endpoint": "placeholder"}' > "$stats.tmp"
  mv "$stats.tmp" "$stats"
fi
while kill -0 "$parent" 2>/dev/null; do sleep 0.2 & wait $!; done
"""

procs = {}
passed = []
failed = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, args):
    log = open(os.path.join(WORK, name + ".log"), "ab")
    p = subprocess.Popen([CLI] + args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, cwd=WORK)
    procs[name] = p
    return p


def stop_all():
    for p in procs.values():
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def log_of(name):
    with open(os.path.join(WORK, name + ".log"), "r", errors="replace") as f:
        return f.read()


def cli(*args, check=True):
    r = subprocess.run([CLI] + list(args), capture_output=True, text=True, timeout=20, cwd=WORK)
    if check and r.returncode != 0:
        raise AssertionError("cairn %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
    return r


def status():
    r = cli("agents", "status", "--controller", CONTROLLER, "--secret-file", SECRET_FILE, "--json", "--timeout", "5")
    return json.loads(r.stdout)


def wait_until(what, pred, timeout=15.0):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (AssertionError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
            last = e
        time.sleep(0.1)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


def agents_by_id(st):
    return {g["agent"]: dict(g, app=a["app"]) for a in st["applications"] for g in a["agents"]}


def check(name, fn):
    try:
        fn()
        passed.append(name)
        print("PASS", name, flush=True)
    except Exception as e:  # noqa: BLE001 - report every failure, continue
        failed.append(name)
        print("FAIL %s: %s" % (name, e), flush=True)


# ---- raw frames (docs/format/control.md) ----

def tag(key, data):
    return hmac.new(key, data, hashlib.sha512).digest()[:32]


def header(msg_type, seq, length, version=2, flags=0):
    return b"CRNC" + struct.pack("<HHQII", version, msg_type, seq, length, flags)


def frame(key, msg_type, seq, payload):
    h = header(msg_type, seq, len(payload))
    return h + payload + tag(key, h + payload)


def connect():
    host, port = CONTROLLER.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.settimeout(5)
    return s


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def recv_frame(s):
    h = recv_exact(s, 24)
    assert h[:4] == b"CRNC", h
    _, msg_type, seq, length, _ = struct.unpack("<HHQII", h[4:])
    payload = recv_exact(s, length)
    t = recv_exact(s, 32)
    return msg_type, seq, payload, h + payload, t


def closed_by_server(s):
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, socket.timeout):
        return False


# The key exchange and the cipher (libsodium's crypto_kx and ChaCha20-IETF),
# which the standard library lacks; libsodium is a dependency of cairn.
SODIUM = ctypes.CDLL(ctypes.util.find_library("sodium") or "libsodium.so.23")
assert SODIUM.sodium_init() >= 0


def kx_keypair():
    pk, sk = ctypes.create_string_buffer(32), ctypes.create_string_buffer(32)
    assert SODIUM.crypto_kx_keypair(pk, sk) == 0
    return pk.raw, sk.raw


def cipher(key, seq, data):
    out = ctypes.create_string_buffer(len(data))
    nonce = struct.pack("<Q", seq) + b"\0" * 4
    SODIUM.crypto_stream_chacha20_ietf_xor(out, data, ctypes.c_ulonglong(len(data)), nonce, key)
    return out.raw


def handshake(s, secret):
    """The client's half of the handshake: (tag key, cipher key) to send with,
    then to receive with."""
    nc = secrets.token_bytes(16)
    pk, sk = kx_keypair()
    s.sendall(frame(secret, 1, 0, json.dumps({"role": "admin", "id": "py", "nonce": nc.hex(),
                                              "kx": pk.hex()}).encode()))
    msg_type, seq, payload, signed, t = recv_frame(s)
    assert msg_type == 2 and seq == 0, (msg_type, seq)
    assert hmac.compare_digest(t, tag(secret, signed)), "hello_ack tag"
    ack = json.loads(payload)
    assert ack["nonce"] == nc.hex()
    ns = bytes.fromhex(ack["server_nonce"])
    rx, tx = ctypes.create_string_buffer(32), ctypes.create_string_buffer(32)
    assert SODIUM.crypto_kx_client_session_keys(rx, tx, pk, sk, bytes.fromhex(ack["kx"])) == 0
    return ((tag(secret, b"cairn-agents c2s v1" + nc + ns), tx.raw),
            (tag(secret, b"cairn-agents s2c v1" + nc + ns), rx.raw))


def main():
    global CONTROLLER, SECRET_FILE
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    SECRET_FILE = os.path.join(WORK, "secret")
    with open(SECRET_FILE, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(SECRET_FILE, 0o600)
    with open(SECRET_FILE, "rb") as f:
        secret = f.read().rstrip(b" \t\r\n")
    agent = os.path.join(WORK, "agent.sh")
    with open(agent, "w") as f:
        f.write(PLACEHOLDER_AGENT)
    os.chmod(agent, 0o755)
    CONTROLLER = "127.0.0.1:%d" % free_port()
    journal = os.path.join(WORK, "journal")
    # One secret for all (this test speaks the protocol as an admin and
    # unregisters with the deployment secret); test_agents.py runs with a
    # service secret.
    ctl_args = ["controller", "--listen", CONTROLLER, "--secret-file", SECRET_FILE, "--shared-secret",
                "--journal", journal,
                "--heartbeat-interval", str(HEARTBEAT), "--heartbeat-timeout", str(TIMEOUT),
                "--strategy", "bandwidth", "--distribution", "round_robin"]

    def start_manager(node):
        return start("manager-" + node, ["manager", "--controller", CONTROLLER, "--listen", "127.0.0.1:0",
                                         "--secret-file", SECRET_FILE, "--shared-secret", "--node-id", node, "--capacity", "4",
                                         "--agent-program", agent, "--run-dir", os.path.join(WORK, node),
                                         "--stop-grace", "1"])

    # No secret: refused.
    r = cli("controller", "--journal", journal, "--listen", CONTROLLER, check=False)
    check("controller refuses to start without a secret",
          lambda: (r.returncode == 2 and "secret" in r.stderr) or (_ for _ in ()).throw(AssertionError(r.stderr)))
    # A deployment secret alone: refused, naming the choice.
    r = cli("controller", "--journal", journal, "--listen", CONTROLLER, "--secret-file", SECRET_FILE, check=False)
    check("controller refuses to start without a service secret unless --shared-secret",
          lambda: (r.returncode == 2 and "no service secret" in r.stderr and "--shared-secret" in r.stderr)
          or (_ for _ in ()).throw(AssertionError(r.stderr)))

    start("controller", ctl_args)
    for node in ("n1", "n2", "n3"):
        start_manager(node)
    wait_until("3 nodes up", lambda: len([n for n in status()["nodes"] if n["state"] == "up"]) == 3)

    apps = {}
    for name, nodes in (("heat", 3), ("lulesh", 2)):
        out = json.loads(cli("agents", "register", "--controller", CONTROLLER, "--secret-file", SECRET_FILE,
                             "--name", name, "--nodes", str(nodes), "--ranks", "16", "--json").stdout)
        apps[name] = out["app"]

    def all_running(expected):
        st = status()
        ags = agents_by_id(st)
        return st if len(ags) == expected and all(g["state"] == "running" and g["memory_held"] == 1 << 20
                                                  for g in ags.values()) else None

    st = wait_until("5 agents running", lambda: all_running(5))

    def t_status():
        assert st["policy"]["strategy"] == "bandwidth" and st["policy"]["distribution"] == "round_robin"
        assert sorted(n["node"] for n in st["nodes"]) == ["n1", "n2", "n3"]
        by_name = {a["name"]: a for a in st["applications"]}
        assert len(by_name["heat"]["agents"]) == 3 and by_name["heat"]["target"] == 3
        assert len(by_name["lulesh"]["agents"]) == 2
        # round robin over 3 nodes: heat gets one agent on each
        assert sorted(g["node"] for g in by_name["heat"]["agents"]) == ["n1", "n2", "n3"]
        assert st["totals"]["memory_held"] == 5 << 20
        for n in st["nodes"]:
            m = n["metrics"]
            assert m["mem_total"] > 0 and m["mem_free"] > 0, m
            assert isinstance(m["power_estimated"], bool) and m["power_source"], m
            assert n["capacity"] == 4 and n["connected"]
        for g in agents_by_id(st).values():
            os.kill(g["pid"], 0)  # the placeholder process exists
        text = cli("agents", "status", "--controller", CONTROLLER, "--secret-file", SECRET_FILE).stdout
        assert "NODE" in text and "heat" in text and "bandwidth/round_robin" in text, text
    check("status lists nodes, agents per application, memory held, metrics, strategy", t_status)

    # ---- manager lost ----
    before = agents_by_id(st)
    on_n2 = [a for a, g in before.items() if g["node"] == "n2"]
    procs["manager-n2"].kill()
    t0 = time.time()
    st = wait_until("n2 to disappear", lambda: (lambda s: s if "n2" not in [n["node"] for n in s["nodes"]] else None)(status()))
    gone_after = time.time() - t0

    def t_lost():
        # Not at the disconnect: only once the heartbeat timeout has passed (slack for a busy machine).
        assert gone_after >= 0.5 * TIMEOUT, "n2 removed after %.2fs, before its heartbeat timeout" % gone_after
        after = agents_by_id(st)
        assert sorted(after) == sorted(before), (sorted(before), sorted(after))
        for a in on_n2:
            assert after[a]["node"] in ("n1", "n3"), after[a]
        assert "node lost: n2" in log_of("controller")
        wait_until("reassigned agents running", lambda: all_running(5))
    check("a killed manager's node disappears after the timeout and its agents are reassigned", t_lost)

    # ---- controller crash and restart ----
    st = status()
    placement = {a: g["node"] for a, g in agents_by_id(st).items()}
    pids = {a: g["pid"] for a, g in agents_by_id(st).items()}
    procs["controller"].kill()
    procs["controller"].wait(timeout=5)
    time.sleep(3 * HEARTBEAT)
    start("controller", ctl_args)
    st = wait_until("managers back", lambda: (lambda s: s if len(s["nodes"]) == 2 and all(
        n["connected"] and n["state"] == "up" for n in s["nodes"]) else None)(status()))

    def t_restart():
        assert "recovered from journal" in log_of("controller")
        now = wait_until("agents reported again", lambda: all_running(5))
        assert {a: g["node"] for a, g in agents_by_id(now).items()} == placement
        assert {a: g["pid"] for a, g in agents_by_id(now).items()} == pids, "agents were restarted"
        assert sorted(a["name"] for a in now["applications"]) == ["heat", "lulesh"]
        # New registrations continue after the old ids.
        out = json.loads(cli("agents", "register", "--controller", CONTROLLER, "--secret-file", SECRET_FILE,
                             "--name", "late", "--json").stdout)
        assert out["app"] > max(apps.values())
        cli("agents", "unregister", "--controller", CONTROLLER, "--secret-file", SECRET_FILE, "--app", str(out["app"]))
    check("a restarted controller recovers its state from the journal without disturbing agents", t_restart)

    # ---- bad input ----
    def rejected(send, code):
        s = connect()
        try:
            send(s)
            assert closed_by_server(s), "connection not closed"
        finally:
            s.close()
        wait_until("log of " + code, lambda: ("rejected message" in log_of("controller")
                                               and (": %s:" % code) in log_of("controller")), 5)
        assert status()["nodes"], "controller no longer answers"

    good = frame(secret, 30, 0, b"{}")
    check("garbage is rejected (bad_magic)", lambda: rejected(lambda s: s.sendall(b"hello world\n" * 4), "bad_magic"))
    check("an unauthenticated frame is rejected (bad_tag)",
          lambda: rejected(lambda s: s.sendall(frame(b"x" * 32, 1, 0, b'{"role":"admin","nonce":"00"}')), "bad_tag"))
    check("an oversized frame is rejected before its payload (oversized)",
          lambda: rejected(lambda s: s.sendall(header(1, 0, 2 << 20)), "oversized"))
    check("a frame of another protocol version is rejected (bad_version)",
          lambda: rejected(lambda s: s.sendall(header(1, 0, 2, version=9) + b"{}" + b"\0" * 32), "bad_version"))

    def truncated(s):
        s.sendall(good[:30])
        s.shutdown(socket.SHUT_WR)
    check("a truncated frame is rejected (truncated)", lambda: rejected(truncated, "truncated"))

    def replay(s):
        (c2s, c2s_cipher), (s2c, s2c_cipher) = handshake(s, secret)
        req = frame(c2s, 30, 1, cipher(c2s_cipher, 1, b"{}"))
        s.sendall(req)
        msg_type, seq, payload, signed, t = recv_frame(s)
        assert msg_type == 4 and seq == 1 and hmac.compare_digest(t, tag(s2c, signed)), (msg_type, seq)
        assert b"nodes" not in payload, "the reply travels in the clear"
        assert "nodes" in json.loads(cipher(s2c_cipher, 1, payload))
        s.sendall(req)  # the same frame again
    check("a valid handshake and an encrypted request from Python work, and a replayed frame is rejected (replayed)",
          lambda: rejected(replay, "replayed"))

    # ---- graceful leave ----
    def t_leave():
        procs["manager-n3"].send_signal(signal.SIGTERM)
        rc = procs["manager-n3"].wait(timeout=10)
        assert rc == 0, rc
        s = status()
        assert [n["node"] for n in s["nodes"]] == ["n1"], s["nodes"]
        # n1 has room for 4 of the 5 agents: n3's move there, one is dropped
        # (its application is short of its target until room appears).
        ags = agents_by_id(s)
        assert len(ags) == 4 and all(g["node"] == "n1" for g in ags.values()), ags
        m = re.search(r"node left: n3, (\d+) agents moved", log_of("controller"))
        assert m and int(m.group(1)) >= 1, m
        assert sum(a["target"] for a in s["applications"]) == 5
    check("a manager stopped with SIGTERM leaves at once, its agents moved where there is room", t_leave)

    check("the controller never crashed", lambda: procs["controller"].poll() is None or (_ for _ in ()).throw(
        AssertionError("controller exited %s" % procs["controller"].poll())))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        failed.append("setup")
        print("FAIL setup: %s" % e, flush=True)
    finally:
        stop_all()
        if failed:
            for name in procs:
                print("---- %s.log (tail) ----" % name)
                print(log_of(name)[-3000:])
    print("%d passed, %d failed" % (len(passed), len(failed)))
    sys.exit(1 if failed else 0)
