#!/usr/bin/env python3
"""Overhead of the VELOC drop-in (compat/veloc) against cairn's C API on the
same data: bench/veloc_bench run alternately (the first of a round swapped each round) through VELOC_Checkpoint and
cairn_checkpoint with the same settings (sync and async/thread modes), each
in a fresh store, ROUNDS times; prints the medians and their ratio.

Usage: bench/run_compat.py [--build DIR] [--dir DIR] [--ranks N] [--mib M]
                           [--checkpoints K] [--rounds R]
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


def run_once(args, api, mode, work):
    store, scratch = os.path.join(work, "store"), os.path.join(work, "scratch")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if api == "veloc":
        cfg = os.path.join(work, "veloc.cfg")
        with open(cfg, "w") as f:
            f.write(f"scratch = {scratch}\npersistent = {store}\nmode = {'sync' if mode == 'sync' else 'async'}\n"
                    "max_versions = 2\nscratch_versions = 2\n")
    else:
        cfg = os.path.join(work, "cairn.toml")
        with open(cfg, "w") as f:
            f.write(f'scratch = "{scratch}"\npersistent = "{store}"\nmode = "{mode}"\n'
                    "keep_persistent = 2\nkeep_local = 2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["CAIRN_RUN"] = "bench"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks),
           os.path.join(args.build, "bench", "veloc_bench"), api, cfg, str(args.mib), str(args.checkpoints)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=600).stdout.split()
    return float(out[out.index("blocked_s") + 1]), float(out[out.index("total_s") + 1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--checkpoints", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="cairn-compat-bench-", dir=args.dir)
    print(f"{args.ranks} ranks x {args.mib} MiB, {args.checkpoints} checkpoints, {args.rounds} rounds (alternating)")
    try:
        for mode in ("sync", "thread"):
            res = {"cairn": [], "veloc": []}
            for r in range(args.rounds):
                # Each goes first in every other round: what a previous run
                # leaves to the file system (freed extents, journal) falls on both.
                for api in (("cairn", "veloc") if r % 2 == 0 else ("veloc", "cairn")):
                    res[api].append(run_once(args, api, mode, os.path.join(work, api)))
            med = {api: (statistics.median(b for b, _ in r), statistics.median(t for _, t in r))
                   for api, r in res.items()}
            for what, i in (("blocked", 0), ("total", 1)):
                c, v = med["cairn"][i], med["veloc"][i]
                print(f"mode {mode:6s} {what:7s}  cairn {c:8.4f} s  veloc {v:8.4f} s  overhead {100 * (v / c - 1):+6.2f} %")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
