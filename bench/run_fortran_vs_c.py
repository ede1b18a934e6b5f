#!/usr/bin/env python3
"""Blocked time of cairn_checkpoint called from Fortran (the cairn module,
ckpt_loop_f) against the C API (ckpt_loop) on the same data: one array of
--mib MiB of doubles, thread mode, --versions checkpoints per run, each waited
for at the persistent level before the next; --runs runs of each program,
interleaved (C, Fortran, C, ...) so that the machine's load falls on both.
Prints the median blocked time of each and their ratio (target: within 2 %).

usage: bench/run_fortran_vs_c.py [--build build] [--mib 128] [--versions 5] [--runs 4]
The local level goes under /dev/shm, the persistent level under --dir
(/var/tmp); both are deleted at the end. Results: docs/benchmarks.md.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(exe, a, scratch, store):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(CAIRN_SCRATCH=str(scratch), CAIRN_PERSISTENT=str(store), CAIRN_RUN="bench", CAIRN_MODE="thread",
               CAIRN_KEEP_PERSISTENT="1", CAIRN_KEEP_LOCAL="1", CAIRN_HASH_TREES="false")
    p = subprocess.run([str(exe), str(a.mib), str(a.versions)], env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{exe} failed:\n{p.stdout}\n{p.stderr}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("blocked_ms")][0]
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return [float(x) for x in line.split()[1:]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    b = Path(a.build).resolve() / "bench"
    exes = {"C": b / "ckpt_loop", "Fortran": b / "ckpt_loop_f"}
    for k, e in exes.items():
        if not e.is_file():
            sys.exit(f"{e} is not built ({k}; ckpt_loop_f needs CAIRN_ENABLE_FORTRAN)")
    base = Path(tempfile.mkdtemp(prefix="cairn-fvc-", dir=a.dir))
    shm = Path(tempfile.mkdtemp(prefix="cairn-fvc-", dir="/dev/shm"))
    got = {k: [] for k in exes}
    try:
        for i in range(a.runs):
            for k, e in exes.items():
                got[k] += run(e, a, shm / f"{k}{i}", base / f"{k}{i}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    load = os.getloadavg()[0]
    print(f"{a.mib} MiB, {a.runs} runs x {a.versions} versions each, load average {load:.1f}")
    for k, v in got.items():
        print(f"  {k:8s} blocked median {med[k]:8.2f} ms  (min {min(v):.2f}, max {max(v):.2f})")
    print(f"  Fortran / C = {med['Fortran'] / med['C']:.3f} (target within 2 %)")


if __name__ == "__main__":
    main()
