"""A Python application that protects a block of a global array with
cairn.Checkpointer.protect_block, for test_checkpointer.py.

usage: block_app.py write|restart [--mpi]
The 13 x 10 float64 global array is split by rows over the ranks; each rank's
buffer has one halo row above and below its block. write: fills the block
with its global indices (i * 100 + j), checkpoints version 1 of "blk" and
waits for the persistent level. restart: zeroes the buffer, restores the
newest version and prints "rank R ok" when every element of the block holds
its global index and the halo rows are untouched (still -1)."""
import sys

import numpy as np

import cairn

ROWS, COLS = 13, 10


def main():
    comm = None
    if "--mpi" in sys.argv:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    with cairn.Checkpointer(comm=comm) as ck:
        n, r = ck.size, ck.rank
        base, extra = divmod(ROWS, n)
        bx = base + (r < extra)
        x0 = r * base + min(r, extra)
        buf = np.full((bx + 2, COLS), -1.0)
        ck.protect_block("u", buf, (ROWS, COLS), (x0, 0), count=(bx, COLS), mem_start=(1, 0))
        want = (np.arange(x0, x0 + bx)[:, None] * 100 + np.arange(COLS)[None, :]).astype(np.float64)
        if sys.argv[1] == "write":
            buf[1:-1] = want
            ck.checkpoint("blk", 1)
            ck.wait("blk", 1)
        else:
            buf[1:-1] = 0
            v = ck.restart("blk")
            if v == 1 and np.array_equal(buf[1:-1], want) and (buf[0] == -1).all() and (buf[-1] == -1).all():
                print(f"rank {r} ok", flush=True)


if __name__ == "__main__":
    main()
