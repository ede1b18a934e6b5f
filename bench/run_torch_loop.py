#!/usr/bin/env python3
"""What a checkpoint costs a training loop: wall time of the same training
loop (forward, backward, Adam step) without checkpoints, with
cairn.pytorch.StateSaver (thread mode, the engine's threads at the priority
given), with torch.save, and with torch.distributed.checkpoint.async_save,
interleaved round by round. The cost of one save is the loop's extra wall
time divided by the saves it made: it counts the blocked time and whatever
the background work takes from the training (CPU, memory bandwidth), which
the blocked time alone does not.

usage: bench/run_torch_loop.py [--mib 320] [--steps 40] [--every 10]
                               [--rounds 3] [--threads 2] [--priority batch]
                               [--capture copy,cow] [--build build] [--dir /var/tmp]
--capture: one cairn variant per capture method (a Checkpointer each, runs
loop-copy and loop-cow): `cow` write-protects the state and copies it while
the next step's forward and backward passes read it.
Every variant ends with its last save complete, compared like for like:
- survives the process: torch.save returned (in the page cache, not
  fsynced) against cairn's last save at its node-local level;
- durable (survives a power loss): torch.save followed by fsync, and DCP's
  async_save (its writer fsyncs), against cairn's last save at the
  persistent level. cairn's durable time is the same loop's, waited for
  further.
The local level goes under /dev/shm, the stores under --dir; all are deleted
at the end.
Results: docs/benchmarks.md ("Training loop").
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def make_training(torch, mib):
    """The bench's training state, about `mib` MiB in all: Linear(1024, 1024)
    layers with Adam (parameters, exp_avg and exp_avg_sq), seeded; returns
    (model, optimizer, input batch)."""
    width = 1024
    layers = max(1, mib * 1024 * 1024 // 3 // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    return model, opt, torch.randn(32, width)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=320, help="training state: parameters, exp_avg, exp_avg_sq")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10, help="a save every N steps")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (the training's cores)")
    ap.add_argument("--priority", default="batch",
                    help="engine_priority of cairn's threads: normal, batch (cairn's default) or idle")
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--skip-dcp", action="store_true")
    ap.add_argument("--capture", default="copy", help="comma-separated capture methods, a cairn variant each")
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bindings" / "python"))
    os.environ.setdefault("PYCAIRN_LIBRARY", str(Path(a.build).resolve() / "src" / "libcairn.so"))
    import torch

    import cairn
    import cairn.pytorch

    torch.set_num_threads(a.threads)
    scratch = Path(tempfile.mkdtemp(prefix="cairn-loop-", dir="/dev/shm"))
    work = Path(tempfile.mkdtemp(prefix="cairn-loop-", dir=a.dir))
    for k in [k for k in os.environ if k.startswith("CAIRN_")]:
        del os.environ[k]
    os.environ.update(CAIRN_SCRATCH=str(scratch), CAIRN_PERSISTENT=str(work / "store"),
                      CAIRN_KEEP_PERSISTENT="1", CAIRN_KEEP_LOCAL="1", CAIRN_MODE="thread",
                      CAIRN_ENGINE_PRIORITY=a.priority)
    model, opt, x = make_training(torch, a.mib)
    layers = len(model)

    def step():
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()

    step()  # Adam's state exists from here on
    state = cairn.pytorch.training_state(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.state_dict()["state"].values()
                  for v in s.values() if isinstance(v, torch.Tensor))
    nsaves = a.steps // a.every
    dcp = None
    if not a.skip_dcp:
        try:
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp
            if not dist.is_initialized():
                dist.init_process_group("gloo", init_method=f"file://{work / 'pg'}", rank=0, world_size=1)
        except Exception as e:  # noqa: BLE001 - a torch without DCP: say so and go on
            print(f"(DCP left out: {type(e).__name__}: {e})")
            dcp = None

    version = [0]

    def loop(save, finish=None):
        t = time.perf_counter()
        for i in range(1, a.steps + 1):
            step()
            if i % a.every == 0:
                save(i)
        if finish:
            finish()
        return time.perf_counter() - t

    def none_loop():
        return loop(lambda i: None)

    def torch_loop():
        def save(i):
            torch.save(state, work / "state.pt")
        return loop(save)

    def torch_fsync_loop():
        def save(i):
            with open(work / "state.pt", "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        return loop(save)

    captures = a.capture.split(",")
    savers = {}
    for how in captures:
        ck = cairn.Checkpointer(config={"run": f"loop-{how}", "capture": how})
        savers[how] = (ck, cairn.pytorch.StateSaver(ck, "loop"))

    blocked = {how: [] for how in captures}  # each cairn save's blocked time, the first one first

    durable = {how: [] for how in captures}  # the same loops, until the last save was persistent

    def cairn_loop(how):
        saver = savers[how][1]

        def save(i):
            version[0] += 1
            t = time.perf_counter()
            saver.save(state, version[0])
            blocked[how].append(time.perf_counter() - t)

        def run():
            t = loop(save, lambda: saver.wait(version[0], cairn.LEVEL_LOCAL))
            t0 = time.perf_counter()
            saver.wait(version[0])
            durable[how].append(t + time.perf_counter() - t0)
            return t
        return run

    def dcp_loop():
        fut = [None]

        def save(i):
            if fut[0] is not None:
                fut[0].result()  # one save in flight, as DCP's examples do
            fut[0] = dcp.async_save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                                    checkpoint_id=str(work / f"dcp{i}"))

        def finish():
            if fut[0] is not None:
                fut[0].result()
        return loop(save, finish)

    name_of = {how: "cairn" if len(captures) == 1 else f"cairn ({how})" for how in captures}
    variants = [("none", none_loop)] + [(name_of[how], cairn_loop(how)) for how in captures] + \
        [("torch.save", torch_loop), ("torch.save+fsync", torch_fsync_loop)]
    if dcp is not None:
        variants.append(("dcp.async_save", dcp_loop))
    times = {name: [] for name, _ in variants}
    try:
        for how in captures:
            savers[how][1].prepare(state)  # staging made in the background while the training goes on
        none_loop()
        for how in captures:
            cairn_loop(how)()  # warm-up: the first save of the execution is in it
            durable[how].clear()
        for r in range(a.rounds):
            for name, fn in variants:
                times[name].append(fn())
                shutil.rmtree(work / "store" / "runs" / "loop" / "dcp", ignore_errors=True)
                for d in work.glob("dcp*"):
                    shutil.rmtree(d, ignore_errors=True)
        for ck, _ in savers.values():
            ck.finalize()
        base = statistics.median(times["none"])
        step_ms = base / a.steps * 1e3
        print(f"state: {nbytes / 2**20:.1f} MiB ({layers} Linear(1024, 1024) + Adam); {a.steps} steps of "
              f"{step_ms:.0f} ms, a save every {a.every} ({nsaves} saves); torch threads {a.threads}, "
              f"cairn engine_priority {a.priority}; medians of {a.rounds} interleaved rounds, load average "
              f"{os.getloadavg()[0]:.1f}")
        for how in captures:
            times[name_of[how] + " durable"] = durable[how]
        per = {}
        for name, t_all in times.items():
            t = statistics.median(t_all)
            per[name] = (t - base) / nsaves
            extra = "" if name == "none" else f"   {per[name] * 1e3:8.1f} ms of loop time per save"
            print(f"  {name:22s} loop {t:7.2f} s{extra}")

        def ratios(name, against):
            if per[name] <= 0:
                return "no measurable loop time per save (within the noise of the loop)"
            return ", ".join(f"{per[o] / per[name]:.1f} x less than {o}" for o in against if o in per)

        for how in captures:
            name, b = name_of[how], blocked[how]
            print(f"  {name} blocked: first save of the execution {b[0] * 1e3:.1f} ms, later saves median "
                  f"{statistics.median(b[1:]) * 1e3:.1f} ms")
            print(f"  survives the process: {name} (node-local) {ratios(name, ['torch.save'])}")
            print(f"  durable: {name} (persistent) "
                  f"{ratios(name + ' durable', ['torch.save+fsync', 'dcp.async_save'])}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
