#!/usr/bin/env python3
"""Benchmark of the node daemon (issue 12, docs/benchmarks.md, "The node daemon").

cairn_bench in thread mode on --ranks ranks, once with the engine in the
application (engine_host = thread) and once in cairnd (engine_host = daemon),
runs interleaved (thread/daemon, then daemon/thread, ...) --reps times. Per
run: the median time blocked in cairn_checkpoint (max over ranks) against the
memcpy of the same bytes measured in the same run, the time until the version
is committed at the persistent level, and the CPU the whole job took (every
process mpirun started and what they started, daemons included: getrusage of
the reaped children), per timed checkpoint.

Target (issue 12): blocked time with the daemon within 10 % of the in-process
engine.

Usage: bench/run_daemon.py [--build DIR] [--ranks 2] [--bytes 64M] [--reps 3]
         [--checkpoints 8] [--json FILE]
Data in fresh directories under --dir (/var/tmp) and --scratch-parent
(/dev/shm), deleted at the end. Only the standard library is used.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def one_run(args, host):
    store = tempfile.mkdtemp(prefix="cairn-daemon-store-", dir=args.dir)
    scratch = tempfile.mkdtemp(prefix="cairn-daemon-scratch-", dir=args.scratch_parent)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               CAIRN_ENGINE_HOST=host)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks),
           os.path.join(args.build, "bench", "cairn_bench"), "--store", store, "--scratch", scratch,
           "--bytes", args.bytes, "--checkpoints", str(args.checkpoints), "--modes", "thread",
           "--settle-ms", str(args.settle_ms), "--no-restart", "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"cairn_bench failed ({host}):\n{out.stdout}\n{out.stderr}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("{"))
    r = json.loads(line)
    m = r["modes"]["thread"]
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"host": host, "memcpy_s": r["memcpy_s"], "blocked_s": m["blocked_s"],
            "persistent_s": m["persistent_s"], "job_cpu_s": cpu,
            "job_cpu_per_checkpoint_s": cpu / (args.checkpoints + 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--checkpoints", type=int, default=8)
    ap.add_argument("--settle-ms", type=int, default=200)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--scratch-parent", default="/dev/shm")
    ap.add_argument("--json")
    args = ap.parse_args()

    runs = []
    for rep in range(args.reps):
        order = ("thread", "daemon") if rep % 2 == 0 else ("daemon", "thread")
        for host in order:
            r = one_run(args, host)
            r["load"] = loadavg()[0]
            runs.append(r)
            print(f"rep {rep} {host:6s} blocked {r['blocked_s'] * 1e3:8.2f} ms = {r['blocked_s'] / r['memcpy_s']:.2f} x "
                  f"memcpy  persistent {r['persistent_s']:.3f} s  job CPU {r['job_cpu_s']:.2f} s  load {r['load']:.1f}",
                  file=sys.stderr, flush=True)

    def med(host, key):
        return statistics.median(r[key] for r in runs if r["host"] == host)

    summary = {h: {k: med(h, k) for k in ("blocked_s", "memcpy_s", "persistent_s", "job_cpu_s",
                                           "job_cpu_per_checkpoint_s")} for h in ("thread", "daemon")}
    ratio = summary["daemon"]["blocked_s"] / summary["thread"]["blocked_s"]
    print(f"{args.ranks} ranks x {args.bytes}, {args.checkpoints} checkpoints, {args.reps} runs each (medians):")
    for h in ("thread", "daemon"):
        s = summary[h]
        print(f"  engine_host = {h:6s} blocked {s['blocked_s'] * 1e3:8.2f} ms ({s['blocked_s'] / s['memcpy_s']:.2f} x "
              f"memcpy {s['memcpy_s'] * 1e3:.2f} ms)  until persistent {s['persistent_s']:.3f} s  "
              f"job CPU {s['job_cpu_s']:.2f} s")
    print(f"  daemon / thread blocked: {ratio:.3f} (target <= 1.10)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
