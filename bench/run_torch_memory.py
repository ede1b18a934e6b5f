#!/usr/bin/env python3
"""Memory that cairn.pytorch takes during a training run, in units of the
state's size S: the process's resident memory beyond the training's own (the
staging slots) plus what the node-local directory holds (node-local versions
and recycled files, in /dev/shm), sampled after every save and at the end;
with the Python binding's defaults (one staging slot, one node-local version)
and with the core's (two and two).

usage: bench/run_torch_memory.py [--mib 320] [--saves 6] [--build build]
Results: docs/benchmarks.md ("memory").
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
import torch, cairn, cairn.pytorch
mib, saves, scratch = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(2)
layers = max(1, mib * 2**20 // 3 // (4 * 1024 * 1024))
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)])
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
def step():
    opt.zero_grad(set_to_none=False); model(torch.randn(8, 1024)).square().mean().backward(); opt.step()
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
def shm():
    return sum(p.stat().st_size for p in __import__("pathlib").Path(scratch).rglob("*") if p.is_file())
step()
state = cairn.pytorch.training_state(model, opt)
S = sum(t.numel() * t.element_size() for t in model.state_dict().values())
S += sum(v.numel() * v.element_size() for s in opt.state_dict()["state"].values() for v in s.values()
         if isinstance(v, torch.Tensor))
base = rss()
peak = (0, 0)
with cairn.Checkpointer() as ck:
    saver = cairn.pytorch.StateSaver(ck, "m")
    for v in range(1, saves + 1):
        step()
        saver.save(state, v)
        saver.wait(v)
        a, b = rss() - base, shm()
        if a + b > sum(peak):
            peak = (a, b)
print(f"S={S} staging={peak[0]} node_local={peak[1]} after_finalize={shm()}")
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=320)
    ap.add_argument("--saves", type=int, default=6)
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    lib = str(Path(a.build).resolve() / "src" / "libcairn.so")
    configs = [("defaults (Python: one slot, keep_local 1)", {}),
               ("the core's: two slots, keep_local 2", {"CAIRN_KEEP_LOCAL": "2", "CAIRN_STAGING_SLOTS": "2"})]
    print(f"state of about {a.mib} MiB, {a.saves} saves, each waited for; peak of (resident beyond the training) + "
          "(node-local directory), in units of S")
    for name, extra in configs:
        scratch = Path(tempfile.mkdtemp(prefix="cairn-mem-", dir="/dev/shm"))
        store = Path(tempfile.mkdtemp(prefix="cairn-mem-", dir=a.dir))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        env.update(PYCAIRN_LIBRARY=lib, CAIRN_SCRATCH=str(scratch), CAIRN_PERSISTENT=str(store), CAIRN_RUN="mem",
                   CAIRN_KEEP_PERSISTENT="1")
        env.update(extra)
        try:
            out = subprocess.run([sys.executable, "-c", CHILD, str(root / "bindings" / "python"), str(a.mib),
                                  str(a.saves), str(scratch)], env=env, capture_output=True, text=True, check=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
        f = dict(kv.split("=") for kv in out.stdout.split())
        s = int(f["S"])
        st, nl, fin = int(f["staging"]) / s, int(f["node_local"]) / s, int(f["after_finalize"]) / s
        print(f"  {name:42s} staging {st:4.2f} S + node-local {nl:4.2f} S = {st + nl:4.2f} S; "
              f"after finalize {fin:4.2f} S")


if __name__ == "__main__":
    main()
