#!/usr/bin/env python3
"""The first checkpoint of every execution (issue 27, target 6): blocked time of
an execution's first cairn checkpoint against its later ones, for the three
ways an execution starts: a fresh run (no versions), a run that has versions
and never asks for a restart, and one that restarts (restart_test + restart
from the persistent level, the node-local level empty). Each execution
protects one array, restarts where it should, computes for --compute-s, then
takes --later + 1 checkpoints, each waited for, --pause-s apart; the cold
restart's time is reported beside (the staging slots must not take its memory).
The three kinds run in turn, --rounds times, in one store per round.

With --capture cow or auto the checkpoints are copy-on-write captures
(docs/design/cow-capture.md); --compute-s 0 takes the first one right after
protect, before any staging slot could be made ahead.

usage: bench/run_first_checkpoint.py [--mib 256] [--rounds 3] [--compute-s 3]
         [--later 3] [--capture copy|cow|auto] [--build build] [--json FILE]
Results: docs/benchmarks/core.md ("The first checkpoint of every execution").
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, subprocess, sys, time
import numpy as np, cairn
kind, mib, compute_s, later, base = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
a = np.empty(mib << 17, dtype=np.float64)
a.fill(1.0)
c = cairn.Checkpointer(config={"run": "first"})
c.protect("a", a)
restart_s = None
if kind == "restart":
    subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, stderr=subprocess.DEVNULL)
    t = time.perf_counter()
    v = c.restart_test("ck")
    c.restart("ck", v)
    restart_s = time.perf_counter() - t
time.sleep(compute_s)
blocked = []
for i in range(later + 1):
    a += 1.0
    t = time.perf_counter()
    c.checkpoint("ck", base + i)
    blocked.append(time.perf_counter() - t)
    c.wait("ck", base + i)
    time.sleep(0.3)
c.finalize()
print(json.dumps({"kind": kind, "first_s": blocked[0], "later_s": sorted(blocked[1:])[len(blocked[1:]) // 2],
                  "restart_s": restart_s}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compute-s", type=float, default=3.0)
    ap.add_argument("--later", type=int, default=3)
    ap.add_argument("--capture", default="copy", choices=["copy", "cow", "auto"])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--json")
    args = ap.parse_args()
    lib = next(Path(args.build, "src").glob("libcairn.so*"), None)
    if lib is None:
        print(f"run_first_checkpoint: no libcairn in {args.build}/src (build first)", file=sys.stderr)
        return 2
    env = dict(os.environ, PYCAIRN_LIBRARY=str(lib), PYTHONPATH=str(ROOT / "bindings" / "python"),
               CAIRN_KEEP_LOCAL_AFTER_FINALIZE="false", CAIRN_CAPTURE=args.capture)
    rows = []
    for r in range(args.rounds):
        work = Path(tempfile.mkdtemp(prefix="cairn-first-", dir="/var/tmp"))
        env["CAIRN_PERSISTENT"] = str(work / "store")
        try:
            for k, kind in enumerate(["fresh", "again", "restart"]):
                env["CAIRN_SCRATCH"] = tempfile.mkdtemp(prefix="cairn-first-", dir="/dev/shm")
                out = subprocess.run([sys.executable, "-c", CHILD, kind, str(args.mib), str(args.compute_s),
                                      str(args.later), str(1 + 100 * k)], env=env, capture_output=True, text=True)
                shutil.rmtree(env["CAIRN_SCRATCH"], ignore_errors=True)
                if out.returncode != 0:
                    print(out.stdout + out.stderr, file=sys.stderr)
                    return 1
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["round"] = r
                rows.append(row)
                print(f"round {r} {kind:8s} first {row['first_s'] * 1e3:7.1f} ms  later {row['later_s'] * 1e3:6.1f} ms"
                      + (f"  restart {row['restart_s'] * 1e3:6.1f} ms" if row["restart_s"] else ""), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.mib} MiB, capture = {args.capture}, first checkpoint {args.compute_s:g} s after protect (or the "
          f"restart); medians of {args.rounds} rounds")
    for kind in ["fresh", "again", "restart"]:
        sel = [x for x in rows if x["kind"] == kind]
        f = statistics.median(x["first_s"] for x in sel)
        l = statistics.median(x["later_s"] for x in sel)
        extra = ""
        if kind == "restart":
            extra = f"  (cold restart {statistics.median(x['restart_s'] for x in sel) * 1e3:.1f} ms)"
        print(f"  {kind:8s} first {f * 1e3:7.1f} ms = {f / l:5.2f} x a later one ({l * 1e3:.1f} ms){extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
