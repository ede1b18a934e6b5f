#!/usr/bin/env python3
"""Blocked time of a numpy checkpoint (cairn.Checkpointer, thread mode) against
a memory copy of the same bytes into a pre-allocated array, and against np.save
of the same array into the persistent directory (the Python way of writing it
yourself; fsync included, as cairn's persistent level is durable).

usage: bench/run_python_writer.py [--mib 256] [--versions 5] [--build build]
Medians over --versions checkpoints; each is waited for at the persistent level
before the next, so that the capture never waits for a free staging slot. The
local level goes under /dev/shm, the persistent level under --dir (/var/tmp);
both are deleted at the end. Results: docs/benchmarks.md ("Python writer").
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bindings" / "python"))
    os.environ.setdefault("PYCAIRN_LIBRARY", str(Path(a.build).resolve() / "src" / "libcairn.so"))
    import cairn

    scratch = Path(tempfile.mkdtemp(prefix="cairn-pyw-", dir="/dev/shm"))
    store = Path(tempfile.mkdtemp(prefix="cairn-pyw-", dir=a.dir))
    for k in [k for k in os.environ if k.startswith("CAIRN_")]:
        del os.environ[k]
    os.environ.update(CAIRN_SCRATCH=str(scratch), CAIRN_PERSISTENT=str(store / "store"), CAIRN_RUN="bench",
                      CAIRN_KEEP_PERSISTENT="1", CAIRN_KEEP_LOCAL="1", CAIRN_HASH_TREES="false")
    n = a.mib * 1024 * 1024 // 8
    x = np.random.default_rng(0).standard_normal(n)
    dst = np.empty_like(x)
    dst[:] = 1.0  # pre-faulted, as cairn's staging slots are
    try:
        copies, saves, blocked = [], [], []
        for _ in range(a.versions):
            t = time.perf_counter()
            np.copyto(dst, x)
            copies.append(time.perf_counter() - t)
        for i in range(a.versions):
            p = store / f"save{i}.npy"
            t = time.perf_counter()
            with open(p, "wb") as f:
                np.save(f, x)
                f.flush()
                os.fsync(f.fileno())
            saves.append(time.perf_counter() - t)
            p.unlink()
        with cairn.Checkpointer() as ck:
            ck.protect("x", x)
            ck.checkpoint("bench", 0)  # warm-up: staging slots allocated and faulted
            ck.wait("bench", 0)
            for v in range(1, a.versions + 1):
                t = time.perf_counter()
                ck.checkpoint("bench", v)
                blocked.append(time.perf_counter() - t)
                ck.wait("bench", v)
        c, s, b = statistics.median(copies), statistics.median(saves), statistics.median(blocked)
        print(f"{a.mib} MiB float64, medians of {a.versions}")
        print(f"  memory copy (np.copyto)        {c * 1e3:9.1f} ms")
        print(f"  np.save + fsync to {a.dir:<11} {s * 1e3:9.1f} ms")
        print(f"  cairn checkpoint, blocked      {b * 1e3:9.1f} ms   {b / c:5.2f} x copy   "
              f"{s / b:6.1f} x less than np.save")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
