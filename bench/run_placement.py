#!/usr/bin/env python3
"""Paper 001's experiment in small: what a checkpoint costs a compute-bound
application with the engine threads placed per core, per socket, per node
(`placement`) or not at all, in thread and sync mode, beside what
`cairn advise` predicts for the same bytes (docs/design/advise.md).

Per size (default 64M per rank, 2 ranks):
  1. `cairn advise --json` (thread, then sync with the same bandwidths) gives
     t_O,a and t_O,s per checkpoint. The model has no placement term: it
     assumes the engine's threads cost the application memory bandwidth only
     (paper 001's spare hardware threads).
  2. examples/synthetic runs the same fixed compute (--compute-passes,
     calibrated once) with no checkpoint, then for every placement and mode
     with --checkpoints checkpoints, interleaved, --repeats times. The
     measured overhead per checkpoint is (wall_s - wall_s without
     checkpoints) / checkpoints, from the fastest of the repeats of each
     (other load on the machine only ever adds time; medians are in --json).
The foreign load (CPU used by other processes during the runs) is printed:
on a shared machine it is what the figures mean.

Usage: bench/run_placement.py [--build build] [--sizes 64M] [--repeats 3] [--json FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_advise import run  # noqa: E402
from run_core import ForeignLoad, loadavg, log  # noqa: E402

PLACEMENTS = ["none", "core", "socket", "node"]
MODES = ["thread", "sync"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--sizes", default="64M")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--checkpoints", type=int, default=4)
    ap.add_argument("--interval-ms", type=int, default=1000, help="compute between checkpoints")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp", help="parent of the persistent temp dir")
    ap.add_argument("--scratch-parent", default="/dev/shm")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    cli = os.path.join(args.build, "tools", "cairn", "cairn")
    synth = os.path.join(args.build, "examples", "synthetic", "synthetic")
    if not os.path.exists(synth):
        synth = os.path.join(args.build, "examples", "synthetic")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    mpirun = ["mpirun", "--oversubscribe", "-np", str(args.ranks)]
    pdir = tempfile.mkdtemp(prefix="cairn-placement-", dir=args.dir)
    sdir = tempfile.mkdtemp(prefix="cairn-placement-", dir=args.scratch_parent)
    results = []
    try:
        for size in args.sizes.split(","):
            store, scratch = os.path.join(pdir, "store"), os.path.join(sdir, "local")
            os.makedirs(store, exist_ok=True)
            os.makedirs(scratch, exist_ok=True)
            log("%s per rank, %d ranks (load average %s)" % (size, args.ranks, loadavg()))
            # 1. The model, measured once, the same bandwidths for sync.
            common = [cli, "advise", store, "--scratch", scratch, "--bytes", size, "--ranks-per-node",
                      str(args.ranks), "--mtbf", "86400", "--json"]
            thread = run(common + ["--reps", "3"], dict(env, CAIRN_MODE="thread"))
            bw = thread["bandwidths"]
            local = bw["local_io_cpu"] if bw["local_in_memory"] else bw["local_io"]
            given = ["--memory-bandwidth", "%d" % bw["memory_cpu"], "--local-bandwidth", "%d" % local,
                     "--persistent-bandwidth", "%d" % bw["persistent_io"], "--commit-seconds",
                     "%.6f" % bw["commit_s"]]
            sync = run(common + given, dict(env, CAIRN_MODE="sync"))
            predicted = {"thread": thread["model"]["async_s"], "sync": sync["model"]["sync_s"]}
            shutil.rmtree(store, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)

            # 2. The fixed compute, calibrated once.
            calib = run(mpirun + [synth, "--no-checkpoint", "--bytes", "4K", "--checkpoints", "1", "--compute-ms",
                                  str(args.interval_ms), "--json"], env)
            passes = calib["compute_passes"]
            base = [synth, "--bytes", size, "--checkpoints", str(args.checkpoints), "--compute-passes", str(passes),
                    "--json"]
            variants = [("none", None)] + [(m, p) for m in MODES for p in PLACEMENTS]
            walls = {v: [] for v in variants}
            blocked = {v: [] for v in variants}
            fl = ForeignLoad()
            for rep in range(args.repeats):
                for v in (variants if rep % 2 == 0 else list(reversed(variants))):
                    mode, placement = v
                    sp, ss = os.path.join(pdir, "synthetic"), os.path.join(sdir, "synthetic")
                    try:
                        if mode == "none":
                            out = run(mpirun + base + ["--no-checkpoint"], env)
                        else:
                            out = run(mpirun + base, dict(env, CAIRN_PERSISTENT=sp, CAIRN_SCRATCH=ss,
                                                          CAIRN_RUN="synthetic", CAIRN_MODE=mode,
                                                          CAIRN_PLACEMENT=placement, CAIRN_KEEP_PERSISTENT="2"))
                    finally:
                        shutil.rmtree(sp, ignore_errors=True)
                        shutil.rmtree(ss, ignore_errors=True)
                    walls[v].append(out["wall_s"])
                    blocked[v].append(out.get("blocked_median_s", 0.0))
                    log("  %-6s %-6s wall %.3f s" % (mode, placement or "", out["wall_s"]))
            noise = fl.stop()
            none_wall = min(walls[("none", None)])
            none_median = statistics.median(walls[("none", None)])
            row = {"size": size, "ranks": args.ranks, "checkpoints": args.checkpoints, "compute_passes": passes,
                   "wall_none_s": none_wall, "wall_none_median_s": none_median, "noise": noise, "predicted": predicted, "bandwidths": bw,
                   "measured": {}}
            for mode in MODES:
                for placement in PLACEMENTS:
                    w = min(walls[(mode, placement)])
                    per = (w - none_wall) / args.checkpoints
                    per_median = (statistics.median(walls[(mode, placement)]) - none_median) / args.checkpoints
                    row["measured"]["%s/%s" % (mode, placement)] = {
                        "wall_s": w, "walls": walls[(mode, placement)],
                        "overhead_per_checkpoint_s": per, "overhead_median_s": per_median,
                        "blocked_median_s": statistics.median(blocked[(mode, placement)]),
                        "predicted_s": predicted[mode],
                        "predicted_over_measured": predicted[mode] / per if per > 0 else None}
            results.append(row)
    finally:
        shutil.rmtree(pdir, ignore_errors=True)
        shutil.rmtree(sdir, ignore_errors=True)

    for r in results:
        n = r["noise"] or {}
        print("\n%s per rank, %d ranks, %d checkpoints, compute without checkpoints %.3f s (fastest); "
              "foreign load %.2f CPUs" % (r["size"], r["ranks"], r["checkpoints"], r["wall_none_s"],
                                          n.get("foreign_cpus", float("nan"))))
        print("| mode | placement | overhead per checkpoint, measured | blocked (median) | predicted (cairn advise) "
              "| predicted / measured |")
        print("|---|---|---|---|---|---|")
        for mode in MODES:
            for placement in PLACEMENTS:
                m = r["measured"]["%s/%s" % (mode, placement)]
                ratio = m["predicted_over_measured"]
                print("| %s | %s | %.3f s | %.3f s | %.3f s | %s |" % (
                    mode, placement, m["overhead_per_checkpoint_s"], m["blocked_median_s"], m["predicted_s"],
                    "%.2f" % ratio if ratio else "-"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
