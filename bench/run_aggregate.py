#!/usr/bin/env python3
"""Aggregated persistent level (issue 10, paper 004) against file per process,
on a real distributed file system (the single-host CephFS of
tests/support_py/cephfs.py, one ceph-fuse client per emulated node) and on the
local file system of --dir (ext4 here). Results and their reading:
docs/benchmarks.md, "Aggregation".

For every file system, rank count N (over --nodes emulated nodes), size S per
rank and strategy (file_per_process, posix_shared, aligned, leaders), one run
of bench/cairn_bench in thread mode (--checkpoints timed checkpoints after a
warm-up) under mpirun MPMD: the ranks of emulated node i run with --store on
node i's mount (their own file system client) and --scratch in their own
node-local directory, CAIRN_RANKS_PER_NODE = N / nodes. Measured in the same
run:
  persistent_s   from the start of cairn_checkpoint until the version is
                 committed (cairn_wait(PERSISTENT)), median; bandwidth =
                 N x S / persistent_s
  reference      cairn_bench's raw O_DIRECT write + fdatasync of the same
                 bytes, a file per rank, all ranks at once through their mounts
                 (the physical reference: what file per process costs with no
                 runtime at all)
  blocked_s      time inside cairn_checkpoint, median
  files          entries of the newest committed version directory
  meta_ops       file system operations per checkpoint, all ranks
                 (cairn_io_counters: creates, opens, fsyncs, renames, directory
                 fsyncs, mkdirs, removes; retention and commit included)
  mds_requests   CephFS only: client requests the MDS handled per checkpoint
                 over the whole run (the run's fixed costs included, the same
                 for every strategy)
  moved          bytes moved between and within nodes (the version's MANIFEST)
  cpu            CPU seconds per checkpoint that the flush takes from the
                 nodes' cores, what a compute kernel running meanwhile loses:
                 cairn's threads (all but the application's, summed over
                 ranks; `cpu max` the busiest rank, which a bulk-synchronous
                 code waits for), and on CephFS the ceph-fuse clients (which
                 run on the compute nodes) and the servers (MDS, OSDs,
                 monitor, manager: on other nodes on a cluster), from
                 /proc/PID/stat over the whole run divided by the checkpoints
                 (warm-up and cairn_bench's one reference write included,
                 alike in every case)
Ratios: bandwidth of each strategy / file_per_process and / the reference,
blocked / file_per_process. Targets (issue 10, CephFS): leaders >= 1.0 x the
bandwidth of file_per_process with M+1 files per version instead of N, blocked
within 5 %.

Usage:  bench/run_aggregate.py [--build build] [--fs cephfs,ext4] [--ranks 2,4,8]
            [--nodes 2] [--sizes 1M,16M,64M] [--strategies ...] [--checkpoints 4]
            [--reps 1] [--leaders-files nodes] [--json FILE] [--quick]
Only the standard library is used (and the rig module).
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "support_py"))

import run_core  # noqa: E402
from run_core import fmt_size, log, parse_size  # noqa: E402

STRATEGIES = ["file_per_process", "posix_shared", "aligned", "leaders"]
MiB = 1 << 20


def mpmd(args, n, nodes, stores, scratches, extra):
    """mpirun MPMD: the ranks of node i get its store (mount) and scratch."""
    per = n // nodes
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none"]
    for i in range(nodes):
        if i:
            cmd.append(":")
        cmd += ["-n", str(per), os.path.join(args.build, "bench", "cairn_bench"), "--store", stores[i],
                "--scratch", scratches[i]] + extra
    return cmd


def proc_cpu_s(pids):
    """utime + stime of the processes (all their threads), in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
        except OSError:
            pass
    return total / tick


def rig_cpu_s(rig):
    """(clients, servers) CPU seconds of the CephFS rig so far."""
    if not rig:
        return 0.0, 0.0
    return proc_cpu_s(c["pid"] for c in rig.clients), proc_cpu_s(d["pid"] for d in rig.daemons)


def one_case(args, fs, mounts, work, n, size, strategy, rep, rig):
    nodes = args.nodes
    run = f"agg-{fs}-{strategy}-{n}-{size}-{rep}-{os.getpid()}"
    stores = [os.path.join(m, work) for m in mounts]
    scratches = [os.path.join(args.scratch_parent, f"cairn-agg-{os.getpid()}", f"node{i}") for i in range(nodes)]
    for s in scratches:
        os.makedirs(s, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               CAIRN_RANKS_PER_NODE=str(n // nodes), CAIRN_KEEP_PERSISTENT="1")
    if strategy == "file_per_process":
        env["CAIRN_PERSISTENT_LAYOUT"] = "file_per_process"  # not the default of the detected file system
    else:
        env.update(CAIRN_PERSISTENT_LAYOUT="aggregated", CAIRN_AGGREGATE_STRATEGY=strategy)
        files = nodes if strategy == "leaders" and args.leaders_files == "nodes" else \
            (int(args.leaders_files) if strategy == "leaders" else 1)
        env["CAIRN_AGGREGATE_FILES"] = str(files)
    extra = ["--bytes", str(size), "--checkpoints", str(args.checkpoints), "--reps", "1", "--modes", "thread",
             "--no-restart", "--run", run, "--json"]
    mds0 = rig.perf_dump("mds.a", "mds_server")["mds_server"]["handle_client_request"] if rig else 0
    cpu0 = rig_cpu_s(rig)
    t0 = time.monotonic()
    r = subprocess.run(mpmd(args, n, nodes, stores, scratches, extra), env=env, capture_output=True, text=True,
                       timeout=1800)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{run} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    mds1 = rig.perf_dump("mds.a", "mds_server")["mds_server"]["handle_client_request"] if rig else 0
    cpu1 = rig_cpu_s(rig)
    t = d["modes"]["thread"]
    versions_run = t["checkpoints"] + 1  # the warm-up too
    # The newest committed version: its files and what moved.
    cdir = os.path.join(stores[0], "store", "runs", run, "bench_thread")
    versions = sorted(v for v in os.listdir(cdir) if os.path.exists(os.path.join(cdir, v, "MANIFEST")))
    vdir = os.path.join(cdir, versions[-1])
    text = open(os.path.join(vdir, "MANIFEST")).read()
    m = json.loads(text[:text.rindex("xxh3 ")])
    c = m.get("container", {})
    io = t["io_per_checkpoint"]
    out = {
        "fs": fs, "ranks": n, "nodes": nodes, "bytes_per_rank": size, "strategy": strategy, "rep": rep,
        "persistent_s": t["persistent_s"], "persistent_all_s": t["persistent_all_s"], "blocked_s": t["blocked_s"],
        "stage_persistent_s": t["stage_persistent_s"], "commit_latency_s": t["commit_latency_s"],
        "reference_s": d["write_direct_s"], "bandwidth_mb_s": n * size / t["persistent_s"] / 1e6,
        "reference_mb_s": n * size / d["write_direct_s"] / 1e6,
        "files": len(os.listdir(vdir)), "data_files": len(c.get("files", [])),
        "meta_ops": sum(io[k] for k in ("creates", "opens", "fsyncs", "renames", "dir_fsyncs", "mkdirs", "removes")),
        "io_per_checkpoint": io,
        "mds_requests": (mds1 - mds0) / versions_run if rig else None,
        "cpu_cairn_s": t["background_cpu_all_s"], "cpu_cairn_max_s": t["background_cpu_s"],
        "cpu_fs_clients_s": (cpu1[0] - cpu0[0]) / versions_run if rig else None,
        "cpu_fs_servers_s": (cpu1[1] - cpu0[1]) / versions_run if rig else None,
        "between_nodes": c.get("bytes_between_nodes", 0), "within_nodes": c.get("bytes_within_nodes", 0),
        "padding": c.get("padding", 0), "leaders": c.get("leaders", []), "wall_s": wall,
    }
    shutil.rmtree(os.path.join(stores[0], "store", "runs", run), ignore_errors=True)
    for s in stores:
        for f in os.listdir(s):
            if f.startswith("ref."):
                os.remove(os.path.join(s, f))
    shutil.rmtree(os.path.dirname(scratches[0]), ignore_errors=True)
    return out


def summarize(rows):
    """Medians over repetitions, ratios against file_per_process of the same case."""
    keys = sorted({(r["fs"], r["ranks"], r["bytes_per_rank"]) for r in rows})
    table = []
    for fs, n, size in keys:
        case = [r for r in rows if (r["fs"], r["ranks"], r["bytes_per_rank"]) == (fs, n, size)]
        med = {}
        for s in STRATEGIES:
            rs = [r for r in case if r["strategy"] == s]
            if rs:
                med[s] = {k: statistics.median(r[k] for r in rs) for k in
                          ("persistent_s", "blocked_s", "bandwidth_mb_s", "reference_mb_s", "files", "meta_ops",
                           "between_nodes", "within_nodes", "padding", "cpu_cairn_s", "cpu_cairn_max_s")}
                for k in ("mds_requests", "cpu_fs_clients_s", "cpu_fs_servers_s"):
                    vals = [r[k] for r in rs if r[k] is not None]
                    med[s][k] = statistics.median(vals) if vals else None
        base = med.get("file_per_process")
        for s, v in med.items():
            v["bw_vs_fpp"] = v["bandwidth_mb_s"] / base["bandwidth_mb_s"] if base else None
            v["bw_vs_reference"] = v["bandwidth_mb_s"] / v["reference_mb_s"]
            v["blocked_vs_fpp"] = v["blocked_s"] / base["blocked_s"] if base and base["blocked_s"] > 0 else None
            table.append(dict(fs=fs, ranks=n, bytes_per_rank=size, strategy=s, **v))
    return table


def print_table(table):
    print(f"{'fs':7} {'N':>3} {'size':>6} {'strategy':17} {'commit s':>9} {'MB/s':>8} {'x fpp':>6} {'x ref':>6} "
          f"{'blocked':>8} {'x fpp':>6} {'files':>5} {'meta':>6} {'mds':>6} {'moved':>8} {'padding':>8} "
          f"{'cpu':>6} {'cpu max':>7} {'fuse':>6} {'servers':>7}")
    for t in table:
        f = lambda v, fmt: (fmt % v) if v is not None else "-"  # noqa: E731
        print(f"{t['fs']:7} {t['ranks']:3d} {fmt_size(t['bytes_per_rank']):>6} {t['strategy']:17} "
              f"{t['persistent_s']:9.3f} {t['bandwidth_mb_s']:8.1f} {f(t['bw_vs_fpp'], '%.2f'):>6} "
              f"{t['bw_vs_reference']:6.2f} {t['blocked_s']:8.4f} {f(t['blocked_vs_fpp'], '%.2f'):>6} "
              f"{t['files']:5.0f} {t['meta_ops']:6.1f} {f(t['mds_requests'], '%.0f'):>6} "
              f"{fmt_size(int(t['between_nodes'] + t['within_nodes'])):>8} {fmt_size(int(t['padding'])):>8} "
              f"{t['cpu_cairn_s']:6.3f} {t['cpu_cairn_max_s']:7.3f} {f(t['cpu_fs_clients_s'], '%.3f'):>6} "
              f"{f(t['cpu_fs_servers_s'], '%.3f'):>7}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--fs", default="cephfs,ext4")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--checkpoints", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--leaders-files", default="nodes", help="M for leaders: 'nodes' (one per node) or a number")
    ap.add_argument("--dir", default="/var/tmp", help="parent of the local file system's store")
    ap.add_argument("--scratch-parent", default="/dev/shm")
    ap.add_argument("--memstore-mib", type=int, default=3072, help="capacity of each of the rig's 3 OSDs")
    ap.add_argument("--json", help="write every sample and the summary here")
    ap.add_argument("--quick", action="store_true", help="2 and 4 ranks, 16M only")
    args = ap.parse_args()
    if args.quick:
        args.ranks, args.sizes = "2,4", "16M"
    ranks = [int(x) for x in args.ranks.split(",")]
    sizes = [parse_size(x) for x in args.sizes.split(",")]
    strategies = args.strategies.split(",")
    for n in ranks:
        if n % args.nodes:
            sys.exit(f"--ranks {n} is not a multiple of --nodes {args.nodes}")
    rows = []
    for fs in args.fs.split(","):
        tmp = tempfile.mkdtemp(prefix="cairn-agg-", dir=args.dir)
        rig = None
        try:
            if fs == "cephfs":
                import cephfs
                log(f"starting the CephFS rig in {tmp}/rig ({args.nodes} clients, 3 memstore OSDs)")
                rig = cephfs.CephFSRig(os.path.join(tmp, "rig"), clients=args.nodes, osds=3,
                                       memstore_mib=args.memstore_mib, die_with_parent=True)
                rig.start()
                log(f"  up in {rig.timings['start_s']:.1f} s")
                work = "bench"
                os.makedirs(os.path.join(rig.mounts[0], work))
                layout = cephfs.set_layout(os.path.join(rig.mounts[0], work), stripe_unit=MiB,
                                           stripe_count=rig.osd_count(), object_size=4 * MiB)
                log(f"  layout of the store: {layout}")
                mounts = [str(m) for m in rig.mounts]
            else:
                work = "bench"
                os.makedirs(os.path.join(tmp, work))
                mounts = [tmp] * args.nodes
            for rep in range(args.reps):
                for size in sizes:
                    for n in ranks:
                        for s in strategies:  # interleaved: the machine's drift hits every strategy alike
                            r = one_case(args, fs, mounts, work, n, size, s, rep, rig)
                            rows.append(r)
                            log(f"  {fs} N={n} {fmt_size(size)} {s:17} commit {r['persistent_s']:.3f} s "
                                f"({r['bandwidth_mb_s']:.0f} MB/s; raw {r['reference_mb_s']:.0f} MB/s), blocked "
                                f"{r['blocked_s']:.4f} s, {r['files']} files, {r['meta_ops']:.0f} fs ops"
                                + (f", {r['mds_requests']:.0f} MDS requests" if rig else "") + " per version")
        finally:
            if rig:
                rig.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    table = summarize(rows)
    print_table(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": rows, "summary": table, "machine": run_core.machine_info(args.dir, args.scratch_parent)},
                      f, indent=1)


if __name__ == "__main__":
    main()
