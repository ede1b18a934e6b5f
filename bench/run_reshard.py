#!/usr/bin/env python3
"""Restart on another rank count against restart on the same count
(docs/design/reshard.md): bench/reshard_bench writes a ROWS x COLS float64
array as one version from WRITERS ranks (file per process or aggregated),
the node-local level is removed (as on new nodes: every restart reads the
persistent level), then each restart is timed ROUNDS times, alternating
the rank counts: on WRITERS ranks (same count) and on each of --to.
Prints per case the median of the slowest rank's restart time, the ratio to
the same-count restart, and bytes read per rank (from /proc/self/io rchar)
against the bytes of the rank's block.

Usage: bench/run_reshard.py [--build DIR] [--dir DIR] [--writers N] [--to 2,3]
                            [--rows R] [--cols C] [--rounds K] [--hash-chunk B]
Only the standard library is used.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def launch(args, nranks, mode, work, layout):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.update({"CAIRN_RUN": "bench", "CAIRN_PERSISTENT": os.path.join(work, "store"),
                "CAIRN_SCRATCH": os.path.join(work, "scratch"), "CAIRN_PERSISTENT_LAYOUT": layout,
                "CAIRN_HASH_CHUNK": str(args.hash_chunk)})
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(nranks),
           os.path.join(args.build, "bench", "reshard_bench"), mode, str(args.rows), str(args.cols)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def parse(out):
    ranks, tmax = [], None
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "rank":
            ranks.append((int(f[1]), float(f[3]), int(f[5]), int(f[7])))
        elif f and f[0] == "max_seconds":
            tmax = float(f[1])
    return tmax, ranks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--to", default="2,3")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hash-chunk", type=int, default=65536)
    ap.add_argument("--layouts", default="file_per_process,aggregated")
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="cairn-reshard-bench.")
    targets = [int(x) for x in args.to.split(",") if x]
    print(f"array {args.rows} x {args.cols} float64 ({args.rows * args.cols * 8 / 2**20:.0f} MiB), written by "
          f"{args.writers} ranks, hash_chunk {args.hash_chunk}, {args.rounds} rounds")
    for layout in args.layouts.split(","):
        # One store written by WRITERS ranks, and one per target count M
        # written by M ranks: restart on M from the first (another count) is
        # compared with restart on M from the second (the same count, the
        # same bytes per rank).
        stores = {}
        for n in [args.writers] + targets:
            work = os.path.join(base, layout, f"w{n}")
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            launch(args, n, "write", work, layout)
            shutil.rmtree(os.path.join(work, "scratch"), ignore_errors=True)
            stores[n] = work
        times = {(m, w): [] for m in targets for w in (args.writers, m)}
        last = {}
        for rnd in range(args.rounds):
            cases = list(times)
            for m, w in (cases if rnd % 2 == 0 else reversed(cases)):
                tmax, ranks = parse(launch(args, m, "restart", stores[w], layout))
                times[(m, w)].append(tmax)
                last[(m, w)] = ranks
                shutil.rmtree(os.path.join(stores[w], "scratch"), ignore_errors=True)
        print(f"\n{layout}")
        print(f"{'restart on':>10}  {'written by':>10}  {'median s':>9}  {'ratio':>6}  {'read/rank MiB (min-max)':>24}  "
              f"{'needed/rank MiB':>15}  {'read/needed':>11}")
        for m in targets:
            same = statistics.median(times[(m, m)])
            for w in (m, args.writers):
                med = statistics.median(times[(m, w)])
                rd = [r[2] for r in last[(m, w)]]
                nd = [r[3] for r in last[(m, w)]]
                print(f"{m:>10}  {w:>10}  {med:>9.4f}  {med / same:>6.2f}  "
                      f"{min(rd) / 2**20:>10.2f} - {max(rd) / 2**20:<10.2f}  {statistics.mean(nd) / 2**20:>15.2f}  "
                      f"{sum(rd) / sum(nd):>11.2f}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
