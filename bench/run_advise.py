#!/usr/bin/env python3
"""Validates `cairn advise` (paper 001's overhead model, docs/design/advise.md)
against what cairn_bench measures on the same machine.

Per size (default 64M and 512M per rank, 2 ranks), interleaved:
  1. `cairn advise --json` with CAIRN_MODE=thread measures B_M (wall and CPU)
     and each level's B_IO with --ranks writers and predicts; the same
     bandwidths given to `cairn advise` with CAIRN_MODE=sync give the sync
     prediction (nothing measured twice).
  2. cairn_bench (mpirun, thread and sync mode, no restart) measures the
     checkpoints: blocked time, background CPU, per-stage times from the
     manifests.
Compared, CPU-accounted (the machine is shared: wall time includes waiting
for a core; the CPU parts are counted in CPU seconds, the I/O waits in wall
seconds), and wall-clock beside it:
  sync    predicted t_O,s (every stage in a row, and the commit)  vs
          blocked_cpu_s + the persistent stage + the commit latency
          (wall-clock: blocked_s)
  thread  predicted t_O,a = m_cpu S_node / B_M(cpu) (tmpfs local write at
          its CPU-accounted bandwidth)  vs  blocked_cpu_s + background_cpu_s:
          what the checkpoint takes from the cores the application computes
          on (busiest rank; wall-clock: blocked_s + background_cpu_s)
and per stage the model against the manifests' stage medians. The foreign
load (CPU used by other processes meanwhile) is reported with each result.

Usage: bench/run_advise.py [--build build] [--sizes 64M,512M] [--json FILE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_core import ForeignLoad, log  # noqa: E402


def run(cmd, env, timeout=1800):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(map(str, cmd)), p.stdout,
                                                              p.stderr))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--sizes", default="64M,512M")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="rounds of each bandwidth measurement (best of)")
    ap.add_argument("--settle-ms", type=int, default=200)
    ap.add_argument("--dir", default="/var/tmp", help="parent of the persistent temp dir")
    ap.add_argument("--scratch-parent", default="/dev/shm")
    ap.add_argument("--mtbf", type=float, default=86400.0)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    cli = os.path.join(args.build, "tools", "cairn", "cairn")
    bench = os.path.join(args.build, "bench", "cairn_bench")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    pdir = tempfile.mkdtemp(prefix="cairn-advise-", dir=args.dir)
    sdir = tempfile.mkdtemp(prefix="cairn-advise-", dir=args.scratch_parent)
    results = []
    try:
        for size in args.sizes.split(","):
            store, scratch = os.path.join(pdir, "store"), os.path.join(sdir, "local")
            os.makedirs(store, exist_ok=True)
            os.makedirs(scratch, exist_ok=True)
            log("%s per rank, %d ranks" % (size, args.ranks))
            # 1. model: measure once (thread), then the same bandwidths for sync.
            fl = ForeignLoad()
            common = [cli, "advise", store, "--scratch", scratch, "--bytes", size, "--ranks-per-node",
                      str(args.ranks), "--mtbf", str(args.mtbf), "--json"]
            thread = run(common + ["--reps", str(args.reps)], dict(env, CAIRN_MODE="thread"))
            bw = thread["bandwidths"]
            # The bandwidths the thread prediction used: CPU-accounted memory and
            # (tmpfs) local level, wall-clock persistent level and commit.
            local = bw["local_io_cpu"] if bw["local_in_memory"] else bw["local_io"]
            given = ["--memory-bandwidth", "%d" % bw["memory_cpu"], "--checksum-bandwidth", "%d" % bw["checksum_cpu"],
                     "--local-bandwidth", "%d" % local,
                     "--persistent-bandwidth", "%d" % bw["persistent_io"], "--commit-seconds",
                     "%.6f" % bw["commit_s"]]
            sync = run(common + given, dict(env, CAIRN_MODE="sync"))
            model_noise = fl.stop()
            log("  B_M %.2f GB/s (CPU-accounted %.2f), B_IO local %.2f GB/s, persistent %.2f GB/s" % (
                bw["memory"] / 1e9, bw["memory_cpu"] / 1e9, bw["local_io"] / 1e9, bw["persistent_io"] / 1e9))
            # 2. measurement.
            bstore, bscr = os.path.join(pdir, "bench"), os.path.join(sdir, "bench")
            os.makedirs(bstore, exist_ok=True)
            os.makedirs(bscr, exist_ok=True)
            fl = ForeignLoad()
            meas = run(["mpirun", "--oversubscribe", "-np", str(args.ranks), bench, "--store", bstore, "--scratch",
                        bscr, "--bytes", size, "--checkpoints", str(args.checkpoints), "--reps", "1",
                        "--settle-ms", str(args.settle_ms), "--modes", "thread,sync", "--no-restart", "--json"], env)
            bench_noise = fl.stop()
            shutil.rmtree(bstore, ignore_errors=True)
            shutil.rmtree(bscr, ignore_errors=True)
            row = {"size": size, "bytes_per_rank": thread["workload"]["bytes_per_rank"], "ranks": args.ranks,
                   "bandwidths": bw, "model_noise": model_noise, "bench_noise": bench_noise,
                   "memcpy_s": meas["memcpy_s"], "write_direct_s": meas["write_direct_s"], "modes": {}}
            for mode, model in (("thread", thread), ("sync", sync)):
                mm = meas["modes"][mode]
                # CPU-accounted: the CPU parts in CPU seconds (other load on the
                # cores does not count), the I/O waits in wall seconds.
                if mode == "sync":
                    predicted = model["model"]["sync_s"]
                    measured = mm["blocked_cpu_s"] + mm["stage_persistent_s"] + mm["commit_latency_s"]
                    what = "blocked CPU + persistent stage + commit (wall)"
                    wall = mm["blocked_s"]
                else:
                    predicted = model["model"]["async_s"]
                    measured = mm["blocked_cpu_s"] + mm["background_cpu_s"]
                    what = "blocked CPU + background CPU"
                    wall = mm["blocked_s"] + mm["background_cpu_s"]
                stages = {}
                for st in model["model"]["stages"]:
                    key = "commit_latency_s" if st["stage"] == "commit" else "stage_%s_s" % st["stage"]
                    got = mm.get(key, 0.0)
                    stages[st["stage"]] = {"predicted_s": st["seconds"], "measured_s": got,
                                           "ratio": st["seconds"] / got if got > 0 else None}
                row["modes"][mode] = {"predicted_s": predicted, "measured_s": measured, "measured_as": what,
                                      "ratio": predicted / measured if measured > 0 else None,
                                      "measured_wall_s": wall, "blocked_cpu_s": mm["blocked_cpu_s"],
                                      "blocked_s": mm["blocked_s"], "background_cpu_s": mm["background_cpu_s"],
                                      "async_paper_s": model["model"]["async_paper_s"],
                                      "sync_io_only_s": model["model"]["sync_io_only_s"],
                                      "advice": model["advice"], "stages": stages}
                log("  %-6s predicted %.4f s, measured %.4f s (%s): %.2fx; wall-clock %.4f s: %.2fx" % (
                    mode, predicted, measured, what, predicted / measured if measured else float("nan"), wall,
                    predicted / wall if wall else float("nan")))
                for name, s in stages.items():
                    log("         %-10s predicted %.4f s, manifest median %.4f s%s" % (
                        name, s["predicted_s"], s["measured_s"], "" if s["ratio"] is None else
                        " (%.2fx)" % s["ratio"]))
            log("  foreign load: model %.2f CPUs, bench %.2f CPUs" % (
                (model_noise or {}).get("foreign_cpus", 0), (bench_noise or {}).get("foreign_cpus", 0)))
            results.append(row)
    finally:
        shutil.rmtree(pdir, ignore_errors=True)
        shutil.rmtree(sdir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    within = all(r["modes"][m]["ratio"] is not None and abs(r["modes"][m]["ratio"] - 1) <= 0.25
                 for r in results for m in r["modes"])
    log("all predictions within 25 %%: %s" % ("yes" if within else "no"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
