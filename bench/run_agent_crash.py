#!/usr/bin/env python3
"""How fast a checkpoint agent is ready for the next incarnation after the
application crashes mid-transfer (issue 9).

One cairn-agent on 127.0.0.1 (tcp;ofi_rxm), its pulls capped at --rate so that
a --size image takes about a second; per repetition a stand-in rank
(cairn_agent_test_client, built with the tests) checkpoints an image, and is
SIGKILLed at a random moment of the pull. Measured from the kill:

  cancelled   until the agent logs the version not held (the transfer ended:
              failed or cancelled)
  query       until a new rank's QUERY is answered (what a restarting job
              asks first), started right after the kill
  checkpoint  until a new rank's 1 MiB checkpoint is held

Before issue 9 the agent served one request at a time and gave up on a dead
rank after its 30 s transfer timeout, then spent 30 s more per queued pull.

Usage: bench/run_agent_crash.py [--reps 5] [--size 256M] [--rate 256M] [--build DIR] [--json FILE]
"""

import argparse
import datetime
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    if not m:
        raise SystemExit("bad size " + s)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def wait_for(path, text, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path, errors="replace") as f:
                if text in f.read():
                    return time.monotonic()
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    return None


def logged_at(path, text, timeout):
    """Wall-clock time (from the agent's own timestamp) of the first log line
    containing `text`, waiting up to `timeout` seconds for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            for line in f:
                if text in line:
                    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z", line)
                    if m:
                        return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
                            tzinfo=datetime.timezone.utc).timestamp()
        time.sleep(0.01)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--size", default="256M", help="image of the crashing rank")
    ap.add_argument("--rate", default="256M", help="the agent's cap on one transfer, bytes/s")
    ap.add_argument("--liveness", type=float, default=5.0, help="cairn-agent --liveness-timeout")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    agent = os.path.join(a.build, "tools", "agent", "cairn-agent")
    client = os.path.join(a.build, "tests", "cairn_agent_test_client")
    for p in (agent, client):
        if not os.access(p, os.X_OK):
            raise SystemExit(p + " is not built (cmake --build " + a.build + ")")
    size = parse_size(a.size)
    work = tempfile.mkdtemp(prefix="cairn-agent-crash.")
    name, log = os.path.join(work, "agent.name"), os.path.join(work, "agent.log")
    ag = subprocess.Popen([agent, "--bind", "127.0.0.1", "--name-file", name, "--max-bandwidth", a.rate,
                           "--liveness-timeout", str(a.liveness), "--timeout", "30"],
                          stderr=open(log, "w"), start_new_session=True)
    rows = []
    try:
        if wait_for(log, "ready, endpoint", 30) is None:
            raise SystemExit("the agent did not start:\n" + open(log).read())
        base = [client]
        opts = ["--agent", name, "--provider", "tcp;ofi_rxm"]
        rng = random.Random(3)
        for rep in range(a.reps):
            run = "crash%d" % rep
            victim = subprocess.Popen(base + ["checkpoint"] + opts + ["--run", run, "--version", "1", "--bytes",
                                                                    str(size), "--timeout", "60"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            if wait_for(log, "pulling %s/state v1" % run, 30) is None:
                raise SystemExit("no pull started:\n" + open(log).read()[-2000:])
            time.sleep(rng.uniform(0.05, 0.7))
            os.killpg(victim.pid, signal.SIGKILL)
            killed, killed_wall = time.monotonic(), time.time()
            victim.wait()
            q = subprocess.run(base + ["query"] + opts + ["--run", run, "--timeout", "60"], capture_output=True,
                               text=True)
            t_query = time.monotonic() - killed
            c = subprocess.run(base + ["checkpoint"] + opts + ["--run", run + "-next", "--version", "1", "--bytes",
                                                                str(1 << 20)], capture_output=True, text=True)
            t_ckpt = time.monotonic() - killed
            done = logged_at(log, "%s/state v1 rank 0 not held" % run, 60)
            row = {"rep": rep, "cancelled_s": (done - killed_wall) if done else None, "query_s": t_query,
                   "checkpoint_s": t_ckpt, "query_ok": q.returncode == 0, "checkpoint_ok": c.returncode == 0}
            rows.append(row)
            print("  rep %d: transfer ended %.2f s after the kill, QUERY answered after %.2f s, next checkpoint "
                  "held after %.2f s" % (rep, row["cancelled_s"] or -1, t_query, t_ckpt), file=sys.stderr)
    finally:
        os.killpg(ag.pid, signal.SIGTERM)
        ag.wait(timeout=30)

    def med(k):
        xs = [r[k] for r in rows if r[k] is not None]
        return statistics.median(xs) if xs else None

    doc = {"size_bytes": size, "rate": a.rate, "liveness_timeout_s": a.liveness, "reps": rows,
           "median": {k: med(k) for k in ("cancelled_s", "query_s", "checkpoint_s")},
           "all_ok": all(r["query_ok"] and r["checkpoint_ok"] and r["cancelled_s"] is not None for r in rows)}
    print("agent after a crash mid-pull (%s image, pulls capped at %s/s, liveness %g s), median of %d:"
          % (a.size, a.rate, a.liveness, len(rows)))
    print("  the dead rank's transfer ended      %6.2f s after the kill" % (doc["median"]["cancelled_s"] or -1))
    print("  a new rank's QUERY answered         %6.2f s after the kill (process start included)"
          % doc["median"]["query_s"])
    print("  a new rank's checkpoint held        %6.2f s after the kill" % doc["median"]["checkpoint_s"])
    print("  every request served: %s" % ("yes" if doc["all_ok"] else "NO"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
