#!/usr/bin/env python3
"""Restart from agent memory after the application died (issue 27, target 3).

A controller and one manager on 127.0.0.1 (bench/run_agents.py's
Deployment); its agent keeps versions in memory and writes them to the
store. A writer process checkpoints --size bytes (one rank, the Python
binding), waits until the agents committed the version, and exits without
cairn_finalize, as a killed job does: the agent still holds it. Then, per
round and variant, a new process restarts from it:
cairn_restart_test + cairn_restart into a numpy array it touched before
(the application's own memory), timed, the bytes compared with what was
written, and exits the same way. The reference, measured in each restart
process: a memcpy of the same bytes between two touched arrays. (A round
trip to the agent costs well under a millisecond here: restart_test with
`while` asks what the agent holds and for its loan, and reads the header,
in about 1 ms.)

Variants (restart_verify): before (restart_test pulls the whole image into a
fresh buffer and verifies it, cairn_restart copies it into the regions) and
while (restart_test reads the header only, cairn_restart reads the regions
from the agent's memory straight into the array, verifying each piece as
it arrives).

usage: bench/run_agent_restart.py [--size 256M] [--rounds 5] [--variants before,while]
                                  [--provider P] [--build build] [--dir /var/tmp]
Results: docs/benchmarks/agents.md ("Restart from agent memory, in place").
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import run_agents  # noqa: E402  (Deployment)

CHILD = r"""
import hashlib, json, os, sys, time
import numpy as np
import cairn
role, size, verify = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = {"local_enabled": "false", "restart_verify": verify, "agents_wait": 30}
ck = cairn.Checkpointer(config=cfg)
a = np.empty(size, dtype=np.uint8)
out = {}
if role == "write":
    a[:] = np.frombuffer(np.random.default_rng(7).bytes(size), dtype=np.uint8)
    ck.protect("data", a)
    ck.checkpoint("c", 1)
    ck.wait("c", 1)  # committed by the agents
    out["sha"] = hashlib.sha256(a).hexdigest()
else:
    a.fill(0)  # the application's memory, touched
    b = np.ones(size, dtype=np.uint8)
    t = time.perf_counter(); np.copyto(b, a); out["memcpy_s"] = time.perf_counter() - t
    ck.protect("data", a)
    t0 = time.perf_counter()
    v = ck.restart_test("c")
    t1 = time.perf_counter()
    ck.restart("c", v)
    t2 = time.perf_counter()
    out.update(version=v, test_s=t1 - t0, restart_s=t2 - t1, total_s=t2 - t0, sha=hashlib.sha256(a).hexdigest())
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)  # no cairn_finalize: the agents keep what they hold, as after a kill
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="256M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="before,while")
    ap.add_argument("--provider", help="libfabric provider of the agent and the client (default: cairn's)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--python", default=next((p for p in [os.path.join(ROOT, ".venv", "bin", "python")]
                                              if os.path.exists(p)), sys.executable),
                    help="the Python with numpy that runs the application processes")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    size = int(a.size[:-1]) << {"K": 10, "M": 20, "G": 30}[a.size[-1]] if a.size[-1] in "KMG" else int(a.size)
    build = os.path.abspath(a.build)
    dargs = types.SimpleNamespace(cli=os.path.join(build, "tools", "cairn", "cairn"),
                                  agent=os.path.join(build, "tools", "agent", "cairn-agent"), verbose=a.verbose)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(PYCAIRN_LIBRARY=os.path.join(build, "src", "libcairn.so"),
               PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    work = tempfile.mkdtemp(prefix="cairn-agent-restart-", dir=a.dir)
    store = os.path.join(work, "store")
    os.makedirs(store)
    dep = run_agents.Deployment(dargs, os.path.join(work, "deploy"), env)
    variants = a.variants.split(",")
    got = {v: [] for v in variants}
    try:
        dep.add_manager("node-a", capacity=4, store=store, threads=2, provider=a.provider)
        apps = {}
        for v in variants:
            run = "restart-" + v
            dep.register(run, 1, store, agents=1)
            e = dict(env, CAIRN_AGENTS=dep.address, CAIRN_AGENTS_SECRET_FILE=dep.secret, CAIRN_PERSISTENT=store,
                     CAIRN_SCRATCH=os.path.join(work, "scratch"), CAIRN_RUN=run)
            if a.provider:
                e["CAIRN_AGENTS_PROVIDER"] = a.provider
            w = child(a.python, e, "write", size, v)
            apps[v] = (e, w["sha"])
        for r in range(a.rounds):
            for v in variants:
                e, sha = apps[v]
                res = child(a.python, e, "restart", size, v)
                if res["sha"] != sha or res["version"] != 1:
                    raise SystemExit("variant %s: restored bytes differ from the checkpoint" % v)
                got[v].append(res)
                print("round %d %-6s: test %.1f ms + restart %.1f ms = %.1f ms; memcpy %.1f ms"
                      % (r + 1, v, res["test_s"] * 1e3, res["restart_s"] * 1e3, res["total_s"] * 1e3,
                         res["memcpy_s"] * 1e3), flush=True)
    finally:
        dep.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(v, k):
        return statistics.median(x[k] for x in got[v])

    print("\n%d MiB, 1 rank, 1 agent, medians of %d restarts (ms):" % (size >> 20, a.rounds))
    print("| restart_verify | restart_test | cairn_restart | total | memcpy | total / memcpy |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        print("| %s | %.1f | %.1f | %.1f | %.1f | %.2f |" % (
            v, med(v, "test_s") * 1e3, med(v, "restart_s") * 1e3, med(v, "total_s") * 1e3, med(v, "memcpy_s") * 1e3,
            med(v, "total_s") / med(v, "memcpy_s")))


def child(python, env, role, size, verify):
    p = subprocess.run([python, "-c", CHILD, role, str(size), verify], env=env, capture_output=True,
                       text=True, timeout=300)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise SystemExit("%s process failed (%d):\n%s\n%s" % (role, p.returncode, p.stdout, p.stderr))
    return json.loads(lines[-1][7:])


if __name__ == "__main__":
    main()
