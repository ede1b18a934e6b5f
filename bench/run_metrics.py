#!/usr/bin/env python3
"""Benchmarks of issue 15 (docs/benchmarks.md, "Metrics and the end of the job").

1. Overhead of the metrics textfile on blocked time: cairn_bench in thread
   mode on --ranks ranks, with and without CAIRN_METRICS_DIR, runs
   interleaved (off/on, then on/off, ...) --reps times. Per run the median
   time blocked in cairn_checkpoint (max over ranks) over --checkpoints
   checkpoints; reported: the median of those medians per setting, the
   per-pair differences (on - off), and the pooled medians of every
   checkpoint.

2. The end of a job: ckpt_app --on-warning on --ranks ranks checkpoints every
   --every steps (--sleep-ms per step); once a few periodic versions are
   committed the driver sends SIGUSR1 (warning_signals = USR1) to every rank
   at a random moment; the application checkpoints at its next step and waits
   for the persistent level. From the catalog: signal -> MANIFEST commit of
   that version, against capture -> commit (the time to persistent) of the
   periodic versions of the same run. --warning-reps runs.

Usage: bench/run_metrics.py [--build DIR] [--ranks N] [--bytes 16M] [--json FILE] ...
Data under fresh directories in --dir (/var/tmp) and --scratch-parent
(/dev/shm), deleted at the end. Only the standard library is used.
"""

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_size(s):
    s = s.strip().upper().rstrip("IB")
    for suffix, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if s.endswith(suffix):
            return int(float(s[:-1]) * m)
    return int(s)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def mpirun(ranks):
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(ranks)]


def base_env():
    env = dict(os.environ)
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    for k in list(env):
        if k.startswith("CAIRN_"):
            del env[k]
    return env


# ---- 1. metrics overhead on blocked time -------------------------------------

def overhead(args, work, scratch):
    bench = os.path.join(args.build, "bench", "cairn_bench")
    runs = {"off": [], "on": []}
    for rep in range(args.reps):
        for setting in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            tag = f"{rep}-{setting}"
            store, scr = os.path.join(work, f"ov-store{tag}"), os.path.join(scratch, f"ov-scratch{tag}")
            mdir = os.path.join(work, f"ov-metrics{tag}")
            for d in (store, scr, mdir):
                os.makedirs(d)
            env = base_env()
            cmd = mpirun(args.ranks)
            if setting == "on":
                env["CAIRN_METRICS_DIR"] = mdir
                cmd += ["-x", "CAIRN_METRICS_DIR"]
            cmd += [bench, "--store", store, "--scratch", scr, "--bytes", str(args.bytes), "--checkpoints",
                    str(args.checkpoints), "--modes", "thread", "--no-restart", "--reps", "1", "--json"]
            load = loadavg()[0]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"cairn_bench failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
            out = json.loads(r.stdout.strip().splitlines()[-1])
            m = out["modes"]["thread"]
            files = sorted(os.listdir(mdir))
            if setting == "on" and len(files) != args.ranks:
                raise SystemExit(f"metrics on, but {mdir} holds {files}")
            runs[setting].append({"blocked_s": m["blocked_s"], "blocked_all_s": m["blocked_all_s"],
                                  "persistent_s": m["persistent_s"], "load1": load})
            for d in (store, scr):
                shutil.rmtree(d, ignore_errors=True)
            log(f"  rep {rep} metrics {setting:3}: blocked median {m['blocked_s'] * 1e3:.3f} ms, "
                f"persistent {m['persistent_s'] * 1e3:.1f} ms, load {load:.1f}")
    res = {"runs": runs}
    for s in ("off", "on"):
        res[s] = {"median_of_medians_s": statistics.median(r["blocked_s"] for r in runs[s]),
                  "pooled_median_s": statistics.median(x for r in runs[s] for x in r["blocked_all_s"]),
                  "persistent_median_s": statistics.median(r["persistent_s"] for r in runs[s])}
    diffs = [on["blocked_s"] - off["blocked_s"] for on, off in zip(runs["on"], runs["off"])]
    res["pair_diffs_s"] = diffs
    res["pair_diff_median_s"] = statistics.median(diffs)
    off = res["off"]["median_of_medians_s"]
    res["overhead"] = (res["on"]["median_of_medians_s"] - off) / off
    res["overhead_pooled"] = (res["on"]["pooled_median_s"] - res["off"]["pooled_median_s"]) / res["off"][
        "pooled_median_s"]
    return res


# ---- 2. warning signal -> durable ---------------------------------------------

def descendants(pid):
    """PIDs of pid's descendants (from /proc), with their command names."""
    parent = {}
    names = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        parent[int(d)] = ppid
        names[int(d)] = name
    out = []
    for p in parent:
        q = p
        while q in parent and q != pid and q > 1:
            q = parent[q]
        if q == pid and p != pid:
            out.append((p, names[p]))
    return out


def committed(store, run, version):
    return os.path.exists(os.path.join(store, "runs", run, "ckpt", "v%012d" % version, "MANIFEST"))


def in_catalog(store, run, version):
    try:
        with sqlite3.connect(os.path.join(store, "catalog.sqlite"), timeout=5) as db:
            return db.execute("SELECT 1 FROM checkpoints WHERE run = ? AND version = ?", (run, version)).fetchone()
    except sqlite3.Error:
        return None


def warning_once(args, work, scratch, rep, app):
    run = f"warn{rep}"
    # Fresh directories per run: the killed ranks may still be going away.
    store, scr = os.path.join(work, f"w-store{rep}"), os.path.join(scratch, f"w-scratch{rep}")
    for d in (store, scr):
        os.makedirs(d)
    env = base_env()
    env.update(CAIRN_SCRATCH=scr, CAIRN_PERSISTENT=store, CAIRN_RUN=run, CAIRN_KEEP_PERSISTENT="0",
               CAIRN_WARNING_SIGNALS="USR1")
    cmd = mpirun(args.ranks)
    for k in ("CAIRN_SCRATCH", "CAIRN_PERSISTENT", "CAIRN_RUN", "CAIRN_KEEP_PERSISTENT", "CAIRN_WARNING_SIGNALS"):
        cmd += ["-x", k]
    cmd += [app, "--steps", "1000000", "--every", str(args.every), "--bytes", str(args.bytes), "--sleep-ms",
            str(args.sleep_ms), "--on-warning"]
    out_path = os.path.join(work, f"warn{rep}.out")
    with open(out_path, "w") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    try:
        # Some periodic versions first (their time to persistent is the comparison).
        last_periodic = args.every * args.periodic
        deadline = time.monotonic() + 300
        while not committed(store, run, last_periodic):
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("ckpt_app did not commit its periodic versions:\n" + open(out_path).read())
            time.sleep(0.01)
        time.sleep(random.uniform(0, args.every * args.sleep_ms / 1000.0))
        ranks = [pid for pid, name in descendants(p.pid) if name.startswith("ckpt_app")]
        if len(ranks) != args.ranks:
            raise SystemExit(f"found ranks {ranks}, expected {args.ranks}")
        t_signal = time.time()
        for pid in ranks:
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 300
        version = None
        while version is None:
            for line in open(out_path):
                if line.startswith("warning checkpoint "):
                    version = int(line.split()[2])
                    app_s = float(line.split()[5])
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("no warning checkpoint:\n" + open(out_path).read())
            time.sleep(0.01)
        # Rank 0 indexes the version in the catalog after its commit: wait for the row.
        while not in_catalog(store, run, version):
            if time.monotonic() > deadline:
                raise SystemExit(f"version {version} never reached the catalog")
            time.sleep(0.02)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    with sqlite3.connect(os.path.join(store, "catalog.sqlite")) as db:
        rows = db.execute("SELECT c.version, c.committed_at, min(s.captured_at) FROM checkpoints c JOIN shards s "
                          "ON s.run = c.run AND s.name = c.name AND s.version = c.version WHERE c.run = ? "
                          "GROUP BY c.version ORDER BY c.version", (run,)).fetchall()
    by_version = {v: (commit, capture) for v, commit, capture in rows}
    if version not in by_version:
        raise SystemExit(f"version {version} is not in the catalog: {sorted(by_version)}")
    # The first periodic version pays for allocating the staging slots: left out.
    periodic = [c - cap for v, (c, cap) in by_version.items() if v < version and v > args.every]
    return {"version": version, "signal_to_durable_s": by_version[version][0] - t_signal,
            "capture_to_durable_s": by_version[version][0] - by_version[version][1],
            "app_checkpoint_to_durable_s": app_s, "periodic_to_durable_s": periodic, "load1": loadavg()[0]}


def warning(args, work, scratch):
    app = os.path.join(args.build, "tests", "apps", "ckpt_app")
    runs = []
    for rep in range(args.warning_reps):
        r = warning_once(args, work, scratch, rep, app)
        log(f"  rep {rep}: signal -> durable {r['signal_to_durable_s'] * 1e3:.1f} ms (v{r['version']}, capture -> "
            f"durable {r['capture_to_durable_s'] * 1e3:.1f} ms); periodic capture -> durable median "
            f"{statistics.median(r['periodic_to_durable_s']) * 1e3:.1f} ms; load {r['load1']:.1f}")
        runs.append(r)
    return {"runs": runs,
            "signal_to_durable_median_s": statistics.median(r["signal_to_durable_s"] for r in runs),
            "warning_capture_to_durable_median_s": statistics.median(r["capture_to_durable_s"] for r in runs),
            "periodic_to_durable_median_s": statistics.median(x for r in runs for x in r["periodic_to_durable_s"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--bytes", type=parse_size, default=parse_size("16M"), help="bytes per rank")
    ap.add_argument("--checkpoints", type=int, default=15, help="timed checkpoints per cairn_bench run")
    ap.add_argument("--reps", type=int, default=6, help="cairn_bench runs per setting (interleaved)")
    ap.add_argument("--warning-reps", type=int, default=5)
    ap.add_argument("--every", type=int, default=5, help="ckpt_app: steps between periodic checkpoints")
    ap.add_argument("--sleep-ms", type=int, default=100, help="ckpt_app: milliseconds per step")
    ap.add_argument("--periodic", type=int, default=4, help="periodic versions before the signal")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-warning", action="store_true")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--scratch-parent", default="/dev/shm")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)

    work = tempfile.mkdtemp(prefix="cairn-metrics-bench-", dir=args.dir)
    scratch = tempfile.mkdtemp(prefix="cairn-metrics-bench-", dir=args.scratch_parent)
    res = {"ranks": args.ranks, "bytes": args.bytes, "nproc": os.cpu_count(), "load_start": loadavg()}
    try:
        if not args.skip_overhead:
            log(f"metrics overhead: cairn_bench {args.ranks} ranks x {args.bytes} B, {args.checkpoints} checkpoints, "
                f"{args.reps} interleaved reps")
            res["overhead"] = o = overhead(args, work, scratch)
            log(f"  blocked median of medians: off {o['off']['median_of_medians_s'] * 1e3:.3f} ms, on "
                f"{o['on']['median_of_medians_s'] * 1e3:.3f} ms ({o['overhead'] * 100:+.2f} %); pooled "
                f"{o['overhead_pooled'] * 100:+.2f} %; pair differences (ms) "
                f"{[round(d * 1e3, 3) for d in o['pair_diffs_s']]}")
        if not args.skip_warning:
            log(f"warning -> durable: ckpt_app {args.ranks} ranks x {args.bytes} B, every {args.every} steps of "
                f"{args.sleep_ms} ms, {args.warning_reps} reps")
            res["warning"] = w = warning(args, work, scratch)
            log(f"  median signal -> durable {w['signal_to_durable_median_s'] * 1e3:.1f} ms; its capture -> durable "
                f"{w['warning_capture_to_durable_median_s'] * 1e3:.1f} ms; periodic capture -> durable "
                f"{w['periodic_to_durable_median_s'] * 1e3:.1f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    res["load_end"] = loadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items()}, default=str)[:2000])


if __name__ == "__main__":
    main()
