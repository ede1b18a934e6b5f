#!/usr/bin/env python3
"""The first save of an execution against a later one (issue 26): in a
fresh process per sample, a training state (parameters and Adam's two
moments) is saved with cairn.pytorch.StateSaver right after the optimizer
made it, with no prepare(), then again a few steps later. The first save
of an execution has no staging slot yet: with `capture = copy` it copies the
state into fresh memory, which the host backs page by page inside the
save; with `capture = copy_or_cow` it
write-protects the state and copies it in the background, so the next
training step waits where it writes a block not copied yet. Reported per
variant, medians over the samples (interleaved: one process of each variant
per round):
- first save: blocked time of the execution's first save;
- step after: the training step right after it (its cost beside a plain
  step is what the background copy took from the training);
- later save, step after: the same at the second save (a slot is ready);
- plain step: a step with no save before it.
References measured in every process: a copy of the state into fresh
memory (what the first copying save pays) and into memory already touched
(what a later save pays), and torch.save of the state to /dev/shm.

usage: bench/run_torch_first_save.py [--mib 320] [--rounds 5] [--threads 2]
                                     [--variants copy,copy_or_cow] [--build build]
A variant is a capture method, with @BUILD to take libcairn from another
build tree (copy@/tmp/before/build: the same method, an older library).
Results: docs/benchmarks/python.md ("The first save of an execution").
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(a):
    sys.path.insert(0, str(ROOT / "bindings" / "python"))
    import torch

    import cairn
    import cairn.pytorch

    torch.set_num_threads(a.threads)
    from run_torch_loop import make_training
    model, opt, x = make_training(torch, a.mib)

    def step():
        t = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()
        return time.perf_counter() - t

    step()  # Adam's state exists from here on
    out = {}
    plain = [step() for _ in range(3)]
    with cairn.Checkpointer(config={"run": "first", "capture": a.variant}) as ck:
        saver = cairn.pytorch.StateSaver(ck, "train")
        t = time.perf_counter()
        saver.save(cairn.pytorch.training_state(model, opt), 1)
        out["first_save"] = time.perf_counter() - t
        out["step_after_first"] = step()
        plain += [step() for _ in range(3)]
        saver.wait(1, cairn.LEVEL_LOCAL)
        t = time.perf_counter()
        saver.save(cairn.pytorch.training_state(model, opt), 2)
        out["later_save"] = time.perf_counter() - t
        out["step_after_later"] = step()
        saver.wait(2)
    out["plain_step"] = statistics.median(plain)
    # References: the state copied into fresh memory and into touched memory.
    tensors = [t for t in model.state_dict().values()]
    tensors += [v for s in opt.state_dict()["state"].values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.numel() > 1]
    out["bytes"] = sum(t.numel() * t.element_size() for t in tensors)
    t = time.perf_counter()
    copies = [u.clone() for u in tensors]
    out["copy_fresh"] = time.perf_counter() - t
    t = time.perf_counter()
    for c, u in zip(copies, tensors):
        c.copy_(u)
    out["copy_touched"] = time.perf_counter() - t
    path = Path(os.environ["CAIRN_SCRATCH"]) / "state.pt"
    t = time.perf_counter()
    torch.save(cairn.pytorch.training_state(model, opt), path)
    out["torch_save"] = time.perf_counter() - t
    print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=320, help="training state: parameters, exp_avg, exp_avg_sq")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    ap.add_argument("--variants", default="copy,copy_or_cow", help="capture methods, a process each per round")
    ap.add_argument("--build", default="build")
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # in the child
    a = ap.parse_args()
    if a.variant:
        return child(a)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    variants = a.variants.split(",")
    got = {v: [] for v in variants}
    for r in range(a.rounds):
        for v in variants:
            scratch = tempfile.mkdtemp(prefix="cairn-first-", dir="/dev/shm")
            work = tempfile.mkdtemp(prefix="cairn-first-", dir="/var/tmp")
            try:
                method, _, build = v.partition("@")
                e = dict(env, CAIRN_SCRATCH=scratch, CAIRN_PERSISTENT=str(Path(work) / "store"),
                         PYCAIRN_LIBRARY=str(Path(build or a.build).resolve() / "src" / "libcairn.so"))
                p = subprocess.run([sys.executable, __file__, "--variant", method, "--mib", str(a.mib),
                                    "--threads", str(a.threads)], env=e, capture_output=True, text=True,
                                   timeout=600)
                lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
                if p.returncode != 0 or not lines:
                    sys.exit(f"variant {v} failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
                res = json.loads(lines[-1][7:])
                got[v].append(res)
                print(f"round {r + 1} {v}: first save {res['first_save'] * 1e3:.1f} ms, step after "
                      f"{res['step_after_first'] * 1e3:.1f} ms; later save {res['later_save'] * 1e3:.1f} ms, "
                      f"step after {res['step_after_later'] * 1e3:.1f} ms; plain step {res['plain_step'] * 1e3:.1f} "
                      f"ms; copy into fresh memory {res['copy_fresh'] * 1e3:.1f} ms", flush=True)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
                shutil.rmtree(work, ignore_errors=True)

    def med(v, k):
        return statistics.median(x[k] for x in got[v]) * 1e3

    mib = got[variants[0]][0]["bytes"] / 2**20
    print(f"\n{mib:.0f} MiB of state, medians of {a.rounds} processes per variant (ms):")
    print("| variant | first save | step after | later save | step after | plain step | first save's cost "
          "(save + extra step) | x later save's cost |")
    print("|---|---|---|---|---|---|---|---|")
    for v in variants:
        first = med(v, "first_save") + med(v, "step_after_first") - med(v, "plain_step")
        later = med(v, "later_save") + med(v, "step_after_later") - med(v, "plain_step")
        print(f"| {v} | {med(v, 'first_save'):.1f} | {med(v, 'step_after_first'):.1f} | {med(v, 'later_save'):.1f} | "
              f"{med(v, 'step_after_later'):.1f} | {med(v, 'plain_step'):.1f} | {first:.1f} | {first / later:.2f} |")
    allv = [x for v in variants for x in got[v]]
    for k, what in (("copy_fresh", "copy of the state into fresh memory"),
                    ("copy_touched", "copy into memory already touched"), ("torch_save", "torch.save to /dev/shm")):
        print(f"reference, {what}: {statistics.median(x[k] for x in allv) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
