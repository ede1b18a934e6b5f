#!/usr/bin/env python3
"""Node-loss redundancy (issue 12): one run of each measurement, printed as a
table and optionally saved as JSON. Results and their reading:
docs/benchmarks.md, "Redundancy".

1. Encoding: build/bench/redundancy_codec_bench (one process): per image size
   S and scheme, the seconds one rank of a set of --k spends encoding what it
   holds (ISA-L) against memcpy of S bytes, and the capacity each scheme costs
   (parity bytes a rank keeps / S).
2. End to end: build/bench/redundancy_bench under mpirun MPMD, --nodes
   emulated nodes of --rpn ranks (own CAIRN_NODE_ID and node-local directory
   each, Open MPI btl self,tcp): per scheme, median over --checkpoints of the
   time from cairn_checkpoint until cairn_wait(PROTECTED) and until
   cairn_wait(PERSISTENT) (maximum over ranks).
3. Restart: the same job restarted from intact node-local shards, then again
   after wiping node 1's directory (its ranks' shards rebuilt from their sets);
   restart_test + restart, maximum over ranks.

Usage: bench/run_redundancy.py [--build build] [--dir /dev/shm/...] [--mib 64]
           [--nodes 4] [--rpn 1] [--k 4] [--m 2] [--checkpoints 3]
           [--schemes partner,xor,rs] [--provider P] [--json FILE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def run(cmd, env=None, timeout=900):
    p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def mpirun(bench, nodes, rpn, scratch, args):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp"]
    for i in range(nodes):
        cmd += ([":"] if i else []) + ["-n", rpn, "-x", f"CAIRN_SCRATCH={scratch}/node{i}",
                                       "-x", f"CAIRN_NODE_ID=node{i}", bench, *args]
    return cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--mib", default="64")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rpn", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--m", type=int, default=2)
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--schemes", default="partner,xor,rs")
    ap.add_argument("--provider", help="the data plane's libfabric provider (agents_provider; default tcp;ofi_rxm)")
    ap.add_argument("--json")
    a = ap.parse_args()
    build = Path(a.build)
    out = {"codec": [], "e2e": []}

    codec = run([build / "bench" / "redundancy_codec_bench", "--mib", a.mib, "--k", 8, "--m", 2])
    print(f"{'S':>8} {'scheme':>16} {'s/version':>10} {'GB/s':>7} {'x memcpy':>9} {'capacity':>9}")
    for line in codec.splitlines():
        r = json.loads(line)
        out["codec"].append(r)
        print(f"{r['bytes'] >> 20:>6}Mi {r['scheme']:>16} {r['s']:>10.4f} {r['gbps']:>7.2f} {r['vs_memcpy']:>9.2f} "
              f"{r.get('capacity', 0):>9.2f}")

    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    bench = build / "bench" / "redundancy_bench"
    n = a.nodes * a.rpn
    print(f"\n{n} ranks on {a.nodes} emulated nodes")
    print(f"{'S':>8} {'scheme':>8} {'blocked':>8} {'PROTECTED':>10} {'PERSISTENT':>11} {'restart L1':>11} "
          f"{'rebuild':>8} {'ratio':>6}")
    for mib in [int(x) for x in a.mib.split(",")]:
        for scheme in a.schemes.split(","):
            root = Path(tempfile.mkdtemp(prefix="cairn-red-", dir=a.dir))
            try:
                e = dict(env, CAIRN_PERSISTENT=str(root / "store"), CAIRN_RUN="bench", CAIRN_REDUNDANCY=scheme,
                         CAIRN_REDUNDANCY_SET=str(a.k), CAIRN_RS_PARITY=str(a.m), CAIRN_KEEP_LOCAL="1",
                         # The restarts read the node-local level the first job leaves (a
                         # normal end would give it back: keep_local_after_finalize).
                         CAIRN_KEEP_LOCAL_AFTER_FINALIZE="true")
                if a.provider:
                    e["CAIRN_AGENTS_PROVIDER"] = a.provider
                args = ["--bytes", mib << 20, "--checkpoints", a.checkpoints]
                r = json.loads(run(mpirun(bench, a.nodes, a.rpn, root / "scratch", args), e).splitlines()[-1])
                intact = json.loads(run(mpirun(bench, a.nodes, a.rpn, root / "scratch",
                                               args + ["--restart"]), e).splitlines()[-1])
                # The persistent level must not serve the rebuild: its versions
                # are moved aside. (Another store would not do: the node-local
                # shards name the executions of this store's run, and a restart
                # takes none of another store's.)
                shutil.move(root / "store" / "runs" / "bench" / "bench", root / "hidden")
                shutil.rmtree(root / "scratch" / "node1")
                rebuilt = json.loads(run(mpirun(bench, a.nodes, a.rpn, root / "scratch",
                                                args + ["--restart"]), e).splitlines()[-1])
                row = dict(mib=mib, scheme=scheme, ranks=n, nodes=a.nodes, **r, restart_l1_s=intact["restart_s"],
                           rebuild_s=rebuilt["restart_s"], rebuild_version=rebuilt["version"])
                out["e2e"].append(row)
                print(f"{mib:>6}Mi {scheme:>8} {r['blocked_s']:>8.3f} {r['protected_s']:>10.3f} "
                      f"{r['persistent_s']:>11.3f} {intact['restart_s']:>11.3f} {rebuilt['restart_s']:>8.3f} "
                      f"{rebuilt['restart_s'] / intact['restart_s']:>6.2f}")
            finally:
                shutil.rmtree(root, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
