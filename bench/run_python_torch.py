#!/usr/bin/env python3
"""Blocked time of saving a PyTorch training state (model state_dict and Adam
optimizer state) with cairn.pytorch.StateSaver (thread mode) against a memory
copy of the same bytes (every tensor copied into a pre-allocated one) and
against torch.save of the same state into the persistent directory (with and
without fsync: cairn's persistent level is durable, torch.save alone is not).

usage: bench/run_python_torch.py [--mib 256] [--versions 5] [--build build]
--mib: the state's total size (parameters, exp_avg, exp_avg_sq: a third each).
Medians over --versions saves; each is waited for at the persistent level
before the next. The local level goes under /dev/shm, the persistent level and
torch.save's files under --dir (/var/tmp); both are deleted at the end.
Results: docs/benchmarks.md ("Python writer").
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


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
    import torch

    import cairn
    import cairn.pytorch

    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="cairn-pyt-", dir="/dev/shm"))
    store = Path(tempfile.mkdtemp(prefix="cairn-pyt-", dir=a.dir))
    for k in [k for k in os.environ if k.startswith("CAIRN_")]:
        del os.environ[k]
    os.environ.update(CAIRN_SCRATCH=str(scratch), CAIRN_PERSISTENT=str(store / "store"), CAIRN_RUN="bench",
                      CAIRN_KEEP_PERSISTENT="1", CAIRN_KEEP_LOCAL="1", CAIRN_HASH_TREES="false", CAIRN_MODE="thread")
    width = 1024
    layers = max(1, a.mib * 1024 * 1024 // 3 // (4 * width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    state = cairn.pytorch.training_state(model, opt, step=1)
    tensors = [t for t in model.state_dict().values()]
    for s in opt.state_dict()["state"].values():
        tensors += [v for v in s.values() if isinstance(v, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    dst = [torch.full_like(t, 1) for t in tensors]  # pre-faulted, as cairn's staging slots are
    try:
        copies, saves, saves_sync, blocked = [], [], [], []
        for _ in range(a.versions):
            t = time.perf_counter()
            for d, s in zip(dst, tensors):
                d.copy_(s)
            copies.append(time.perf_counter() - t)
        for i in range(a.versions):
            p = store / f"save{i}.pt"
            t = time.perf_counter()
            torch.save(state, p)
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            with open(p, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            saves_sync.append(time.perf_counter() - t)
            p.unlink()
        with cairn.Checkpointer() as ck:
            saver = cairn.pytorch.StateSaver(ck, "bench")
            for v in range(1, a.versions + 1):
                with torch.no_grad():
                    next(model.parameters()).add_(1.0)
                t = time.perf_counter()
                saver.save(state, v)
                blocked.append(time.perf_counter() - t)
                saver.wait(v)
        c, s, ss, b = (statistics.median(x) * 1e3 for x in (copies, saves, saves_sync, blocked))
        print(f"state: {nbytes / 2**20:.1f} MiB in {len(tensors)} tensors ({layers} Linear({width}, {width}) + Adam), "
              f"medians of {a.versions}, load average {os.getloadavg()[0]:.1f}")
        print(f"  memory copy of the same bytes     {c:9.1f} ms")
        print(f"  torch.save                        {s:9.1f} ms")
        print(f"  torch.save + fsync                {ss:9.1f} ms")
        print(f"  cairn.pytorch.StateSaver.save     {b:9.1f} ms  = {b / c:.2f} x the copy, "
              f"{s / b:.1f} x less than torch.save ({ss / b:.1f} x with fsync)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
