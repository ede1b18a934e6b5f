#!/usr/bin/env python3
"""Commit latency: from the last rank's shard durable to the version committed.

A version is committed by the last rank whose shard becomes durable, on its
engine thread (docs/format/store.md, "Commit"). Before, rank 0 committed it in
the application's next cairn call: an application that computes between its
checkpoints left each version uncommitted for its whole compute phase.

One run of tests' ckpt_app on --ranks ranks (mpirun; 1: no MPI), a checkpoint
every step, --compute-ms of computation between checkpoints, every version
kept. Every figure comes from the MANIFESTs of that one run:

  durable     max over ranks of the shard's persistent_at (the physical
              reference: the moment the last shard is on disk)
  commit lag  committed_at - durable                      (now)
  next call   the next version's earliest captured_at - durable
              (when rank 0's agreed commit would run: what it was before)
  to commit   committed_at - earliest captured_at (time to persistent)

Prints the median and p99 of each, and their ratio; --json FILE writes them.
Usage:  bench/run_commit.py [--build DIR] [--ranks N] [--versions N]
        [--bytes B] [--compute-ms MS] [--dir DIR] [--json FILE]
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


def body(path: Path) -> dict:
    text = path.read_text()
    return json.loads(text[:text.rindex("xxh3 ")])


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--versions", type=int, default=40)
    ap.add_argument("--bytes", type=int, default=16 << 20, help="bytes per rank (default 16 MiB)")
    ap.add_argument("--compute-ms", type=int, default=500)
    ap.add_argument("--dir", default="/var/tmp", help="parent of the persistent level (a real disk)")
    ap.add_argument("--json")
    a = ap.parse_args()
    app = Path(a.build) / "tests" / "apps" / "ckpt_app"
    if not app.exists():
        sys.exit(f"{app} not found: build first (make build)")
    root = Path(tempfile.mkdtemp(prefix="cairn-commit-", dir=a.dir))
    scratch = Path(tempfile.mkdtemp(prefix="cairn-commit-", dir="/dev/shm"))
    try:
        env = dict(os.environ, CAIRN_PERSISTENT=str(root / "store"), CAIRN_SCRATCH=str(scratch), CAIRN_RUN="commit",
                   CAIRN_KEEP_PERSISTENT="0", CAIRN_KEEP_LOCAL="1",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        args = [str(app), "--steps", str(a.versions), "--every", "1", "--bytes", str(a.bytes),
                "--sleep-ms", str(a.compute_ms)]
        cmd = (["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(a.ranks)] + args) if a.ranks > 1 \
            else args + ["--serial"]
        print(f"running {a.versions} versions of {a.bytes >> 20} MiB/rank on {a.ranks} rank(s), "
              f"{a.compute_ms} ms of compute between them ...", file=sys.stderr)
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        vdir = root / "store" / "runs" / "commit" / "ckpt"
        ms = {int(d.name[1:]): body(d / "MANIFEST") for d in vdir.iterdir() if (d / "MANIFEST").is_file()}
        vs = sorted(ms)
        lag, nxt, total = [], [], []
        for i, v in enumerate(vs):
            m = ms[v]
            durable = max(s["persistent_at"] for s in m["shards"])
            first = min(s["captured_at"] for s in m["shards"])
            lag.append(m["committed_at"] - durable)
            total.append(m["committed_at"] - first)
            if i + 1 < len(vs):
                nxt.append(min(s["captured_at"] for s in ms[vs[i + 1]]["shards"]) - durable)
        out = {
            "versions": len(vs), "ranks": a.ranks, "bytes_per_rank": a.bytes, "compute_ms": a.compute_ms,
            "commit_lag_ms": {"median": 1e3 * statistics.median(lag), "p99": 1e3 * pct(lag, 99)},
            "next_call_ms": {"median": 1e3 * statistics.median(nxt), "p99": 1e3 * pct(nxt, 99)},
            "time_to_commit_ms": {"median": 1e3 * statistics.median(total), "p99": 1e3 * pct(total, 99)},
        }
        out["lag_ratio_vs_next_call"] = out["commit_lag_ms"]["median"] / out["next_call_ms"]["median"]
        print(f"{'':22} {'median':>10} {'p99':>10}")
        for k in ("commit_lag_ms", "next_call_ms", "time_to_commit_ms"):
            print(f"{k:22} {out[k]['median']:10.2f} {out[k]['p99']:10.2f}")
        print(f"commit lag / lag until the next call (median): {out['lag_ratio_vs_next_call']:.4f}")
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
