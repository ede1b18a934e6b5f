#!/usr/bin/env python3
"""Core capability benchmark of cairn: capture, two-level flush, restart, slowdown.

One invocation measures, per size (bytes per rank) with --ranks ranks, the
physical references and cairn in the same run, and prints the ratios against the
targets of the foundation issue:

  memcpy      memcpy of the same bytes into a pre-faulted buffer    (cairn_bench)
  dd          `dd if=/dev/zero of=DIR/dd.R bs=8M count=.. oflag=direct`, one dd
              per rank, all at the same time, into the persistent directory
              (also with conv=fsync: the same write made durable)
  cairn       blocked in cairn_checkpoint, time to persistent (until
              cairn_wait(PERSISTENT) returns), thread and sync mode, restart from
              the local and the persistent level vs read(2)  (cairn_bench)
  synthetic   examples/synthetic with fixed --compute-passes: wall time without
              cairn, with cairn in thread mode and in sync mode; medians of
              --repeats runs (interleaved), slowdown = wall / wall(no checkpoint) - 1

Targets (benchmarks, not tests): blocked <= 1.3 x memcpy; time to persistent <=
1.15 x dd oflag=direct; synthetic slowdown in thread mode <= 3 %.

Usage:  bench/run_core.py [--quick] [--json FILE] [--build DIR] ...
The local level goes to a fresh directory under --scratch-parent (/dev/shm), the
persistent level and the dd files to a fresh one under --dir (/var/tmp); both
are deleted at the end. Only the standard library is used.
"""

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODEL_M = 7  # memory traffic per checkpointed byte, paper 001's m (see ratios())

TARGETS = {
    "blocked_vs_memcpy": 1.3,
    "persistent_vs_dd": 1.15,
    "slowdown_thread": 0.03,
}


def parse_size(s):
    s = s.strip()
    mult = 1
    for suffix, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if s.upper().rstrip("IB").endswith(suffix):
            s = s.upper().rstrip("IB")[:-1]
            mult = m
            break
    return int(float(s) * mult)


def fmt_size(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d %s" % (b // m, unit)
    return "%d B" % b


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def cpu_busy_s():
    """CPU seconds spent busy by the whole machine since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class ForeignLoad:
    """CPU seconds used on the machine by others (not this driver's children)
    between start() and stop(): the noise indicator reported with the results."""

    def __init__(self):
        self.b0 = cpu_busy_s()
        self.c0 = children_cpu_s()
        self.t0 = time.perf_counter()

    def stop(self):
        b1, c1 = cpu_busy_s(), children_cpu_s()
        wall = time.perf_counter() - self.t0
        if self.b0 is None or b1 is None:
            return None
        foreign = max(0.0, (b1 - self.b0) - (c1 - self.c0))
        return {"foreign_cpu_s": round(foreign, 2), "wall_s": round(wall, 2),
                "foreign_cpus": round(foreign / wall, 2) if wall > 0 else 0.0}


def wait_idle(max_wait_s, threshold=0.1):
    """Waits (at most max_wait_s) until the machine's CPUs are idle, sampled
    over one second; returns the seconds waited, or None if it never was."""
    if max_wait_s <= 0:
        return 0.0
    ncpu = os.cpu_count() or 1
    t0 = time.perf_counter()
    while True:
        b0 = cpu_busy_s()
        time.sleep(1.0)
        b1 = cpu_busy_s()
        if b0 is None or (b1 - b0) / ncpu < threshold:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > max_wait_s:
            return None


def mount_of(path):
    """(device, fstype, mountpoint) of the mount holding path."""
    path = os.path.realpath(path)
    best = ("?", "?", "/")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[2]):
                    best = (dev, fstype, mnt)
    except OSError:
        pass
    return best


def machine_info(persistent_dir, scratch_dir):
    info = {"hostname": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    for key, d in (("persistent", persistent_dir), ("scratch", scratch_dir)):
        dev, fstype, mnt = mount_of(d)
        entry = {"dir": d, "device": dev, "fstype": fstype, "mountpoint": mnt}
        name = os.path.basename(dev)
        rot = "/sys/block/%s/queue/rotational" % name
        if os.path.exists(rot):
            with open(rot) as f:
                entry["rotational"] = f.read().strip() == "1"
        info[key] = entry
    return info


def source_info(build):
    """Where the measured binaries come from: the build's source directory and,
    if it is a git checkout, its commit and modified files; else its
    SOURCE_COMMIT file (written by whoever made a snapshot of the tree)."""
    info = {"build": os.path.abspath(build)}
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    info["source"] = line.split("=", 1)[1].strip()
    except OSError:
        return info
    src = info.get("source")
    if not src:
        return info
    try:
        commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
        if commit.returncode == 0:
            info["commit"] = commit.stdout.strip()
            st = subprocess.run(["git", "-C", src, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True)
            info["modified"] = [line[3:] for line in st.stdout.splitlines()]
            return info
    except OSError:
        pass
    try:
        with open(os.path.join(src, "SOURCE_COMMIT")) as f:
            info["snapshot_of"] = f.read().strip()
    except OSError:
        pass
    return info


def can_drop_caches():
    if os.geteuid() != 0:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


class Runner:
    def __init__(self, args):
        self.args = args
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        if os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        self.env = env
        self.mpirun = [args.mpirun] + shlex.split(args.mpirun_args) + ["-np", str(args.ranks)]

    def run(self, cmd, extra_env=None, timeout=900):
        env = dict(self.env)
        if extra_env:
            env.update(extra_env)
        if self.args.verbose:
            log("+ " + " ".join(shlex.quote(c) for c in cmd))
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout,
                                                                   p.stderr))
        return p.stdout

    def run_json(self, cmd, extra_env=None):
        out = self.run(cmd, extra_env)
        for line in reversed(out.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError("no JSON in the output of %s:\n%s" % (" ".join(cmd), out))


def dd_reference(args, directory, size, extra):
    """Wall time of one dd per rank writing `size` bytes at the same time."""
    bs = min(8 << 20, size)
    count = max(1, size // bs)
    paths = [os.path.join(directory, "dd.%d" % r) for r in range(args.ranks)]
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)
    os.sync()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", "if=/dev/zero", "of=" + p, "bs=%d" % bs, "count=%d" % count,
                               "oflag=direct", "status=none"] + extra) for p in paths]
    rcs = [p.wait() for p in procs]
    t = time.perf_counter() - t0
    if any(rcs):
        raise RuntimeError("dd failed in %s" % directory)
    for p in paths:
        os.unlink(p)
    return t


def med(xs):
    return statistics.median(xs) if xs else 0.0


def bench_size(runner, args, size, pdir, sdir, drop):
    """All measurements of one size; returns a dict."""
    res = {"bytes_per_rank": size, "ranks": args.ranks}
    bench_bin = os.path.join(args.build, "bench", "cairn_bench")
    synth_bin = os.path.join(args.build, "examples", "synthetic")

    noise = {}
    res["noise"] = noise

    def measure(name, fn):
        """Runs fn() once the machine is idle (--wait-idle) and repeats it (up to
        --retries times) while other processes used more than --max-noise CPUs."""
        for attempt in range(args.retries + 1):
            if args.wait_idle and wait_idle(args.wait_idle) is None:
                log("  warning: the machine did not become idle within %d s; measuring anyway" % args.wait_idle)
            fl = ForeignLoad()
            out = fn()
            nz = fl.stop() or {"foreign_cpus": 0.0}
            nz["attempts"] = attempt + 1
            if nz["foreign_cpus"] <= args.max_noise or attempt == args.retries:
                return out, nz
            log("  %s: other processes used %.2f CPUs meanwhile; measuring again" % (name, nz["foreign_cpus"]))
        raise AssertionError("not reached")

    # 1. dd references (interleaved plain / fsync).
    ddir = os.path.join(pdir, "dd")
    os.makedirs(ddir, exist_ok=True)

    def dd_all():
        plain, fsync = [], []
        for _ in range(args.reps):
            plain.append(dd_reference(args, ddir, size, []))
            fsync.append(dd_reference(args, ddir, size, ["conv=fsync"]))
        return plain, fsync

    (dd_plain, dd_fsync), noise["dd"] = measure("dd", dd_all)
    res["dd_direct_s"] = med(dd_plain)
    res["dd_direct_all_s"] = dd_plain
    res["dd_direct_fsync_s"] = med(dd_fsync)
    res["dd_direct_fsync_all_s"] = dd_fsync
    log("  dd oflag=direct: %.4f s, + conv=fsync: %.4f s" % (res["dd_direct_s"], res["dd_direct_fsync_s"]))

    # 2. cairn_bench: memcpy, O_DIRECT write, thread and sync mode, restart.
    bdir, bscr = os.path.join(pdir, "bench"), os.path.join(sdir, "bench")
    def bench_cmd(modes, mpi_extra=()):
        c = runner.mpirun + list(mpi_extra) + [
            bench_bin, "--store", bdir, "--scratch", bscr, "--bytes", str(size), "--checkpoints",
            str(args.checkpoints), "--reps", str(args.reps), "--settle-ms", str(args.settle_ms), "--modes", modes,
            "--json"]
        return c + (["--drop-caches"] if drop else [])

    cmd = bench_cmd("thread,sync")

    def cairn_bench(command=cmd, env=None):
        os.makedirs(bdir, exist_ok=True)
        os.makedirs(bscr, exist_ok=True)
        try:
            return runner.run_json(command, env)
        finally:
            shutil.rmtree(bdir, ignore_errors=True)
            shutil.rmtree(bscr, ignore_errors=True)

    res["cairn_bench"], noise["cairn_bench"] = measure("cairn_bench", cairn_bench)
    b = res["cairn_bench"]
    log("  cairn_bench: memcpy %.4f s, blocked thread %.4f s / sync %.4f s, persistent thread %.4f s / sync "
        "%.4f s" % (b["memcpy_s"], b["modes"]["thread"]["blocked_s"], b["modes"]["sync"]["blocked_s"],
                    b["modes"]["thread"]["persistent_s"], b["modes"]["sync"]["persistent_s"]))

    # 2b. Diagnostic: thread mode with the local level off, i.e. without the
    # local stage ahead of the persistent one (same program, CAIRN_LOCAL_ENABLED).
    if not args.no_diagnostics:
        dcmd = bench_cmd("thread", ["-x", "CAIRN_LOCAL_ENABLED"])
        d, noise["cairn_bench_local_off"] = measure(
            "cairn_bench (local level off)", lambda: cairn_bench(dcmd, {"CAIRN_LOCAL_ENABLED": "false"}))
        res["cairn_bench_local_off"] = d
        log("  cairn_bench, local level off: blocked %.4f s, persistent %.4f s" % (
            d["modes"]["thread"]["blocked_s"], d["modes"]["thread"]["persistent_s"]))

    # 3. synthetic: same fixed work without cairn, with thread mode, with sync mode.
    if args.no_synthetic:
        return res
    interval_ms = args.interval_ms if args.interval_ms else max(
        args.min_interval_ms, int(args.ms_per_mib * size / (1 << 20)))
    calib, noise["calibration"] = measure("calibration", lambda: runner.run_json(
        runner.mpirun + [synth_bin, "--no-checkpoint", "--bytes", "4K", "--checkpoints", "1", "--compute-ms",
                         str(interval_ms), "--json"]))
    passes = calib["compute_passes"]

    # synthetic calibrates on a best-of-three timing at start-up, which here
    # often lands at a slow moment; rescale once from a measured run of the
    # fixed work, so that the interval is close to the one asked for.
    def check_passes():
        out = runner.run_json(runner.mpirun + [synth_bin, "--no-checkpoint", "--bytes", "4K", "--checkpoints", "2",
                                               "--compute-passes", str(passes), "--json"])
        return out["compute_s"] / 2

    per_interval, _ = measure("calibration check", check_passes)
    if per_interval > 0:
        passes = max(1, int(round(passes * interval_ms / 1000.0 / per_interval)))
    common = [synth_bin, "--bytes", str(size), "--checkpoints", str(args.synthetic_checkpoints),
              "--compute-passes", str(passes), "--json"]
    runs = {"none": [], "thread": [], "sync": []}
    order = ["none", "thread", "sync"]
    sp, ss = os.path.join(pdir, "synthetic"), os.path.join(sdir, "synthetic")

    def synthetic(variant):
        try:
            if variant == "none":
                return runner.run_json(runner.mpirun + common + ["--no-checkpoint"])
            env = {"CAIRN_PERSISTENT": sp, "CAIRN_SCRATCH": ss, "CAIRN_RUN": "synthetic",
                   "CAIRN_MODE": variant, "CAIRN_KEEP_PERSISTENT": "2"}
            return runner.run_json(runner.mpirun + common, env)
        finally:
            shutil.rmtree(sp, ignore_errors=True)
            shutil.rmtree(ss, ignore_errors=True)

    for rep in range(args.repeats):
        for variant in (order if rep % 2 == 0 else list(reversed(order))):
            out, out["noise"] = measure("synthetic " + variant, lambda: synthetic(variant))
            runs[variant].append(out)
    syn = {"interval_ms": interval_ms, "compute_passes": passes, "checkpoints": args.synthetic_checkpoints,
           "repeats": args.repeats}
    for variant, outs in runs.items():
        syn[variant] = {
            "wall_s": med([o["wall_s"] for o in outs]),
            "compute_s": med([o["compute_s"] for o in outs]),
            "total_s": med([o["total_s"] for o in outs]),
            "blocked_median_s": med([o["blocked_median_s"] for o in outs]),
            "wall_all_s": [o["wall_s"] for o in outs],
            "compute_all_s": [o["compute_s"] for o in outs],
            "finalize_all_s": [o["finalize_s"] for o in outs],
            "skipped": sum(o.get("skipped", 0) for o in outs),
            "foreign_cpu_s": [o["noise"].get("foreign_cpu_s") for o in outs],
        }
    # The interval actually computed (the calibration may be off on a busy machine).
    syn["measured_interval_s"] = syn["none"]["compute_s"] / args.synthetic_checkpoints
    res["synthetic"] = syn
    base = syn["none"]["wall_s"]
    log("  synthetic (%.2f s x %d): wall none %.3f s, thread %.3f s, sync %.3f s" % (
        syn["measured_interval_s"], args.synthetic_checkpoints, base, syn["thread"]["wall_s"], syn["sync"]["wall_s"]))
    return res


def ratios(r):
    b = r["cairn_bench"]
    t, s = b["modes"]["thread"], b["modes"]["sync"]
    out = {
        "blocked_vs_memcpy": t["blocked_s"] / b["memcpy_s"],
        "persistent_vs_dd": t["persistent_s"] / r["dd_direct_s"],
        "persistent_vs_dd_fsync": t["persistent_s"] / r["dd_direct_fsync_s"],
        "persistent_vs_write_direct": t["persistent_s"] / b["write_direct_s"],
        "sync_blocked_vs_memcpy": s["blocked_s"] / b["memcpy_s"],
        "sync_persistent_vs_dd": s["persistent_s"] / r["dd_direct_s"],
        "thread_blocked_vs_sync_blocked": t["blocked_s"] / s["blocked_s"],
        "restart_local_vs_read": b["restart_local"]["total_s"] / b["restart_local"]["reference_read_s"],
        "restart_persistent_vs_read": (b["restart_persistent"]["total_s"]
                                       / b["restart_persistent"]["reference_read_s"]),
    }
    if "cairn_bench_local_off" in r:
        lo = r["cairn_bench_local_off"]["modes"]["thread"]
        out["local_off_persistent_vs_dd"] = lo["persistent_s"] / r["dd_direct_s"]
        out["local_off_persistent_vs_write_direct"] = lo["persistent_s"] / r["cairn_bench_local_off"]["write_direct_s"]
    # CPU that a checkpoint takes from the application's cores (blocked time on
    # the application thread + CPU of cairn's threads): noise-robust estimate of
    # the slowdown when every core computes, as here (2 ranks on 2 cores).
    out["cpu_per_checkpoint_thread_s"] = t["blocked_s"] + t["background_cpu_s"]
    out["interval_for_target_cpu_s"] = out["cpu_per_checkpoint_thread_s"] / TARGETS["slowdown_thread"]
    if "synthetic" in r:
        syn = r["synthetic"]
        out["slowdown_thread_cpu_estimate"] = out["cpu_per_checkpoint_thread_s"] / syn["measured_interval_s"]
        walls = syn["none"]["wall_all_s"]
        out["noise_floor"] = (max(walls) - min(walls)) / statistics.median(walls)
        base, cbase = syn["none"]["wall_s"], syn["none"]["compute_s"]
        out["slowdown_thread"] = syn["thread"]["wall_s"] / base - 1
        out["slowdown_sync"] = syn["sync"]["wall_s"] / base - 1
        out["compute_slowdown_thread"] = syn["thread"]["compute_s"] / cbase - 1
        out["compute_slowdown_sync"] = syn["sync"]["compute_s"] / cbase - 1
        n = syn["checkpoints"]
        # Cost per checkpoint, independent of the interval, and the interval at
        # which the thread-mode cost would be the 3 % target.
        out["overhead_per_checkpoint_thread_s"] = (syn["thread"]["wall_s"] - base) / n
        out["overhead_per_checkpoint_sync_s"] = (syn["sync"]["wall_s"] - base) / n
        out["interval_for_target_s"] = max(0.0, out["overhead_per_checkpoint_thread_s"]) / TARGETS["slowdown_thread"]
        # Paper 001 (Shahzad et al.): synchronous overhead per checkpoint S/B_IO
        # (B_IO from dd, all ranks writing); asynchronous m * S_node / B_M with
        # B_M the node's memory traffic bandwidth (memcpy of S moves 2 S, all
        # ranks at once) and m = 7 for cairn (capture 2, checksum 1, hash tree 1,
        # tmpfs copy 2, O_DIRECT DMA 1): m * ranks * S / (2 * ranks * S / memcpy_s)
        # = m / 2 * memcpy_s.
        out["model_sync_per_checkpoint_s"] = r["dd_direct_s"]
        out["model_async_per_checkpoint_s"] = MODEL_M / 2 * b["memcpy_s"]
    return out


def print_report(results, info, elapsed):
    sizes = [fmt_size(r["bytes_per_rank"]) for r in results]
    w = 12
    head = "%-52s" % ("%d ranks, bytes per rank" % results[0]["ranks"]) + "".join("%*s" % (w, s) for s in sizes)
    print()
    print(head)
    print("-" * len(head))

    def row(label, values, fmt="%.4f"):
        print("%-52s" % label + "".join("%*s" % (w, (fmt % v) if v is not None else "-") for v in values))

    def get(path, r):
        cur = r
        for p in path:
            if cur is None or p not in cur:
                return None
            cur = cur[p]
        return cur

    print("absolute times [s] (median; max over ranks)")
    row("memcpy into pre-faulted buffer", [get(["cairn_bench", "memcpy_s"], r) for r in results])
    row("dd oflag=direct, ranks concurrently", [r["dd_direct_s"] for r in results])
    row("dd oflag=direct conv=fsync", [r["dd_direct_fsync_s"] for r in results])
    row("O_DIRECT pwrite + fdatasync (in cairn_bench)", [get(["cairn_bench", "write_direct_s"], r) for r in results])
    for mode in ("thread", "sync"):
        row("%s: blocked in cairn_checkpoint" % mode, [get(["cairn_bench", "modes", mode, "blocked_s"], r)
                                                      for r in results])
        row("%s: until LOCAL" % mode, [get(["cairn_bench", "modes", mode, "local_s"], r) for r in results])
        row("%s: until PERSISTENT (time to persistent)" % mode,
            [get(["cairn_bench", "modes", mode, "persistent_s"], r) for r in results])
        row("%s: first checkpoint (allocates staging)" % mode,
            [get(["cairn_bench", "modes", mode, "first_blocked_s"], r) for r in results])
    row("thread: background CPU per checkpoint", [get(["cairn_bench", "modes", "thread", "background_cpu_s"], r)
                                                  for r in results])
    row("thread, local level off: blocked", [get(["cairn_bench_local_off", "modes", "thread", "blocked_s"], r)
                                             for r in results])
    row("thread, local level off: time to persistent",
        [get(["cairn_bench_local_off", "modes", "thread", "persistent_s"], r) for r in results])
    row("thread, local level off: background CPU",
        [get(["cairn_bench_local_off", "modes", "thread", "background_cpu_s"], r) for r in results])
    row("  stages (thread, from MANIFEST): capture", [get(["cairn_bench", "modes", "thread", "stage_capture_s"], r)
                                                      for r in results])
    row("    checksum (xxh3)", [get(["cairn_bench", "modes", "thread", "stage_checksum_s"], r) for r in results])
    row("    hash tree (hash_trees = true)", [get(["cairn_bench", "modes", "thread", "stage_hash_s"], r)
                                         for r in results])
    row("    local (write to scratch)", [get(["cairn_bench", "modes", "thread", "stage_local_s"], r)
                                         for r in results])
    row("    persistent (O_DIRECT, fdatasync, rename)", [get(["cairn_bench", "modes", "thread", "stage_persistent_s"],
                                                            r) for r in results])
    row("    manifest commit latency", [get(["cairn_bench", "modes", "thread", "commit_latency_s"], r)
                                        for r in results])
    row("allocate + fault in one buffer (reference)", [get(["cairn_bench", "prefault_s"], r) for r in results])
    row("restart from local: test + restart", [get(["cairn_bench", "restart_local", "total_s"], r) for r in results])
    row("  read(2) of the same bytes from scratch", [get(["cairn_bench", "restart_local", "reference_read_s"], r)
                                                    for r in results])
    cold = all(get(["cairn_bench", "restart_persistent", "cold"], r) for r in results)
    row("restart from persistent (%s cache)" % ("cold" if cold else "WARM"),
        [get(["cairn_bench", "restart_persistent", "total_s"], r) for r in results])
    row("  read(2) of the same bytes from the store dir", [get(["cairn_bench", "restart_persistent",
                                                                "reference_read_s"], r) for r in results])
    if all("synthetic" in r for r in results):
        row("synthetic compute per interval (measured)", [r["synthetic"]["measured_interval_s"] for r in results], "%.3f")
        row("synthetic checkpoints per run", [r["synthetic"]["checkpoints"] for r in results], "%d")
        row("synthetic wall, no checkpoint", [r["synthetic"]["none"]["wall_s"] for r in results], "%.3f")
        row("synthetic wall, thread mode", [r["synthetic"]["thread"]["wall_s"] for r in results], "%.3f")
        row("synthetic wall, sync mode", [r["synthetic"]["sync"]["wall_s"] for r in results], "%.3f")
    print()
    print("ratios (target)")
    rs = [r["ratios"] for r in results]

    def rrow(label, key, target=None, pct=False, fmt="%.2f"):
        vals = [x.get(key) for x in rs]
        fmt = "%+.1f%%" if pct else fmt
        shown = [v * 100 if (pct and v is not None) else v for v in vals]
        verdict = ""
        if target is not None and all(v is not None for v in vals):
            ok = all(v <= target for v in vals)
            verdict = "   target <= %s: %s" % (("%.0f%%" % (target * 100)) if pct else ("%.2f" % target),
                                                "met" if ok else "NOT met")
        print("%-52s" % label + "".join("%*s" % (w, (fmt % v) if v is not None else "-") for v in shown) + verdict)

    rrow("blocked (thread) / memcpy", "blocked_vs_memcpy", TARGETS["blocked_vs_memcpy"])
    rrow("time to persistent (thread) / dd oflag=direct", "persistent_vs_dd", TARGETS["persistent_vs_dd"])
    rrow("time to persistent (thread) / dd direct+fsync", "persistent_vs_dd_fsync")
    rrow("time to persistent (thread) / O_DIRECT+fdatasync", "persistent_vs_write_direct")
    rrow("synthetic slowdown, thread mode (wall)", "slowdown_thread", TARGETS["slowdown_thread"], pct=True)
    rrow("synthetic slowdown, sync mode (wall)", "slowdown_sync", pct=True)
    rrow("synthetic compute-time slowdown, thread mode", "compute_slowdown_thread", pct=True)
    rrow("  spread of the no-checkpoint runs (max-min)/median", "noise_floor", pct=True)
    rrow("  estimate from CPU accounting (blocked + bg CPU)", "slowdown_thread_cpu_estimate", pct=True)
    rrow("overhead per checkpoint, thread [s]", "overhead_per_checkpoint_thread_s", fmt="%.3f")
    rrow("  paper 001 model m*S_node/B_M (m=%d) [s]" % MODEL_M, "model_async_per_checkpoint_s", fmt="%.3f")
    rrow("overhead per checkpoint, sync [s]", "overhead_per_checkpoint_sync_s", fmt="%.3f")
    rrow("  paper 001 model S/B_IO (dd) [s]", "model_sync_per_checkpoint_s", fmt="%.3f")
    rrow("CPU per checkpoint, thread (blocked + bg CPU) [s]", "cpu_per_checkpoint_thread_s", fmt="%.3f")
    rrow("interval for 3% in thread mode [s], measured", "interval_for_target_s", fmt="%.1f")
    rrow("interval for 3% in thread mode [s], CPU estimate", "interval_for_target_cpu_s", fmt="%.1f")
    rrow("local level off: time to persistent / dd", "local_off_persistent_vs_dd")
    rrow("local level off: time to persistent / O_DIRECT", "local_off_persistent_vs_write_direct")
    rrow("blocked (sync) / memcpy", "sync_blocked_vs_memcpy")
    rrow("time to persistent (sync) / dd oflag=direct", "sync_persistent_vs_dd")
    rrow("blocked thread / blocked sync", "thread_blocked_vs_sync_blocked")
    rrow("restart from local / read", "restart_local_vs_read")
    rrow("restart from persistent / read", "restart_persistent_vs_read")
    def foreign(r):
        items = [v for v in r.get("noise", {}).values() if v]
        f = sum(v["foreign_cpu_s"] for v in items)
        w = sum(v["wall_s"] for v in items)
        syn = r.get("synthetic", {})
        for variant in ("none", "thread", "sync"):
            f += sum(x or 0 for x in syn.get(variant, {}).get("foreign_cpu_s", []))
            w += sum(syn.get(variant, {}).get("wall_all_s", []))  # approximately the runs' length
        return f / w if w else None

    noise = [foreign(r) for r in results]
    print("%-52s" % "CPUs busy with other work while measuring (noise)"
          + "".join("%*s" % (w, "%.2f" % v if v is not None else "-") for v in noise))
    print()
    print("machine: %s cpus (%s), %s GiB; persistent %s (%s on %s), scratch %s (%s); load average at start %s, "
          "end %s; %.0f s" % (info.get("cpus"), info.get("cpu_model", "?"), info.get("mem_gib", "?"),
                               info["persistent"]["dir"], info["persistent"]["fstype"],
                               info["persistent"]["device"], info["scratch"]["dir"], info["scratch"]["fstype"],
                               info.get("loadavg_start"), info.get("loadavg_end"), elapsed))
    if any(v is not None and v > 0.1 for v in noise):
        print("warning: other processes used %.2f CPUs on average while measuring: the results are noisy"
              % max(v for v in noise if v is not None))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (4 MiB per rank, < 30 s)")
    ap.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (default ROOT/build)")
    ap.add_argument("--dir", default="/var/tmp", help="parent of the persistent temp dir (default /var/tmp)")
    ap.add_argument("--scratch-parent", default="/dev/shm", help="parent of the local-level temp dir")
    ap.add_argument("--sizes", help="bytes per rank, comma-separated (default 64M,512M; quick: 4M)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--checkpoints", type=int, help="timed checkpoints per mode in cairn_bench (default 7)")
    ap.add_argument("--reps", type=int, help="repetitions of dd, memcpy, O_DIRECT and restart (default 3)")
    ap.add_argument("--settle-ms", type=int, default=200,
                    help="pause before each timed checkpoint in cairn_bench, standing for the application's "
                         "compute between checkpoints (default 200)")
    ap.add_argument("--repeats", type=int, help="synthetic runs per variant (default 3; quick: 1)")
    ap.add_argument("--synthetic-checkpoints", type=int, help="checkpoints per synthetic run (default 4)")
    ap.add_argument("--interval-ms", type=int, help="synthetic compute per interval (default: ms-per-mib)")
    ap.add_argument("--ms-per-mib", type=float, default=10.0,
                    help="synthetic interval per MiB per rank (default 10, at least --min-interval-ms)")
    ap.add_argument("--min-interval-ms", type=int, default=1000)
    ap.add_argument("--no-synthetic", action="store_true", help="skip the slowdown measurement")
    ap.add_argument("--no-diagnostics", action="store_true",
                    help="skip the diagnostic cairn_bench run with the local level off")
    ap.add_argument("--wait-idle", type=int, default=0, metavar="S",
                    help="before each measurement wait up to S seconds for idle CPUs (default 0: don't)")
    ap.add_argument("--max-noise", type=float, default=0.25, metavar="CPUS",
                    help="repeat a measurement while other processes used more CPUs than this (default 0.25)")
    ap.add_argument("--retries", type=int, default=0,
                    help="how often a noisy measurement is repeated (default 0)")
    ap.add_argument("--no-drop-caches", action="store_true", help="do not drop the page cache before restarts")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe", help="extra mpirun arguments")
    ap.add_argument("--keep", action="store_true", help="keep the temp directories")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the commands")
    args = ap.parse_args()

    if args.quick:
        sizes = args.sizes or "4M"
        args.checkpoints = args.checkpoints or 3
        args.reps = args.reps or 1
        args.repeats = args.repeats or 1
        args.synthetic_checkpoints = args.synthetic_checkpoints or 3
        args.interval_ms = args.interval_ms or 200
        args.settle_ms = min(args.settle_ms, 20)
    else:
        sizes = args.sizes or "64M,512M"
        args.checkpoints = args.checkpoints or 7
        args.reps = args.reps or 3
        args.repeats = args.repeats or 3
        args.synthetic_checkpoints = args.synthetic_checkpoints or 4
    sizes = [parse_size(s) for s in sizes.split(",") if s]

    for b in (os.path.join(args.build, "bench", "cairn_bench"), os.path.join(args.build, "examples", "synthetic")):
        if not os.access(b, os.X_OK):
            sys.exit("run_core.py: %s not found; build first: cmake -S %s -B %s -G Ninja && ninja -C %s"
                     % (b, ROOT, args.build, args.build))

    pdir = tempfile.mkdtemp(prefix="cairn-bench.", dir=args.dir)
    sdir = tempfile.mkdtemp(prefix="cairn-bench.", dir=args.scratch_parent)
    t_start = time.time()
    info = machine_info(pdir, sdir)
    info["loadavg_start"] = loadavg()
    info["binaries"] = source_info(args.build)
    drop = not args.no_drop_caches and can_drop_caches()
    info["drop_caches"] = drop
    runner = Runner(args)
    results = []
    try:
        for size in sizes:
            log("run_core: %s per rank, %d ranks" % (fmt_size(size), args.ranks))
            r = bench_size(runner, args, size, pdir, sdir, drop)
            r["ratios"] = ratios(r)
            results.append(r)
    finally:
        if not args.keep:
            shutil.rmtree(pdir, ignore_errors=True)
            shutil.rmtree(sdir, ignore_errors=True)
    elapsed = time.time() - t_start
    info["loadavg_end"] = loadavg()
    print_report(results, info, elapsed)

    if args.json:
        doc = {
            "benchmark": "cairn core (bench/run_core.py)",
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elapsed_s": elapsed,
            "machine": info,
            "settings": {k: v for k, v in vars(args).items() if k not in ("json",)},
            "targets": TARGETS,
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
