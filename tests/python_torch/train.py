"""A PyTorch training loop checkpointed with cairn.pytorch, for
test_pytorch.py: a small MLP fitted with Adam to fixed data (one thread,
deterministic), its model and optimizer state and step saved every K steps.

usage: train.py --steps N --every K [--sleep-ms M] [--mpi] --out DIR
Prints "restarted from version V" or "starting from scratch", "checkpoint
version V" after each save, "done" at the end (rank 0); each rank writes its
final parameters and optimizer moments to DIR/params.RANK.bin.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

import cairn
import cairn.pytorch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, required=True)
    ap.add_argument("--sleep-ms", type=int, default=0)
    ap.add_argument("--mpi", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    comm = None
    if a.mpi:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    with cairn.Checkpointer(comm=comm) as ck:
        rank = ck.rank
        g = torch.Generator().manual_seed(100 + rank)
        x = torch.randn(64, 8, generator=g)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        torch.manual_seed(7 + rank)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        saver = cairn.pytorch.StateSaver(ck, "train")
        start = 0
        state = saver.load()
        if state is not None:
            start = cairn.pytorch.restore_training(state, model, opt)["step"]
            if rank == 0:
                print(f"restarted from version {start}", flush=True)
        elif rank == 0:
            print("starting from scratch", flush=True)
        for step in range(start + 1, a.steps + 1):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if comm is not None:
                comm.Barrier()
            if a.sleep_ms:
                time.sleep(a.sleep_ms / 1000)
            if step % a.every == 0:
                saver.save(cairn.pytorch.training_state(model, opt, step=step, loss=float(loss)), step)
                if rank == 0:
                    print(f"checkpoint version {step}", flush=True)
        parts = [p.detach().numpy().tobytes() for p in model.parameters()]
        for s in opt.state_dict()["state"].values():
            parts += [s["exp_avg"].numpy().tobytes(), s["exp_avg_sq"].numpy().tobytes(), s["step"].numpy().tobytes()]
        Path(a.out, f"params.{rank}.bin").write_bytes(b"".join(parts))
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
