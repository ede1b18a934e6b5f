"""A Python application checkpointed with cairn.Checkpointer, for
test_checkpointer.py: a deterministic iteration over a float64 grid held in
two arrays that swap every step (double buffering: the current one is
protected again before each checkpoint), and an int64 step counter.

usage: app.py --steps N --every K [--sleep-ms M] [--mpi] --out DIR
Prints "restarted from version V" or "starting from scratch", "checkpoint
version V" after each checkpoint, "done" at the end (on rank 0); each rank writes its
final grid to DIR/grid.RANK.bin.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

import cairn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, required=True)
    ap.add_argument("--sleep-ms", type=int, default=0)
    ap.add_argument("--mpi", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    comm = None
    if a.mpi:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    with cairn.Checkpointer(comm=comm) as ck:
        rank = ck.rank
        grids = [np.zeros((64, 48)), np.zeros((64, 48))]
        grids[0][:] = np.arange(64 * 48).reshape(64, 48) * 1e-3 + rank
        step = np.zeros(1, dtype=np.int64)
        ck.protect("grid", grids[0])
        ck.protect("step", step)
        v = ck.latest("app")
        if v is not None:
            ck.restart("app", v)
            if rank == 0:
                print(f"restarted from version {v}", flush=True)
        elif rank == 0:
            print("starting from scratch", flush=True)
        cur = 0
        for i in range(int(step[0]) + 1, a.steps + 1):
            u, w = grids[cur], grids[1 - cur]
            w[1:-1, 1:-1] = 0.25 * ((u[:-2, 1:-1] + u[2:, 1:-1]) + (u[1:-1, :-2] + u[1:-1, 2:])) + np.sin(u[1:-1, 1:-1] * i)
            w[0, :], w[-1, :], w[:, 0], w[:, -1] = u[0, :], u[-1, :], u[:, 0], u[:, -1]
            cur = 1 - cur
            if comm is not None:
                comm.Barrier()
            if a.sleep_ms:
                time.sleep(a.sleep_ms / 1000)
            if i % a.every == 0:
                step[0] = i
                ck.protect("grid", grids[cur])  # the current grid moved
                ck.checkpoint("app", i)
                if rank == 0:
                    print(f"checkpoint version {i}", flush=True)
        Path(a.out, f"grid.{rank}.bin").write_bytes(grids[cur].tobytes())
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
