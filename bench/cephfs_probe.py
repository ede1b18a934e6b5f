#!/usr/bin/env python3
"""CephFS probe: what a real distributed file system charges for the layouts
aggregated flushing can choose (docs/benchmarks.md, "CephFS rig").

One invocation starts the single-host CephFS of tests/support_py/cephfs.py in
a temporary directory (or uses one started with `cephfs.py start DIR`, --rig
DIR) with two ceph-fuse clients standing for two nodes, and measures:

  write   2 clients each writing --size bytes at once, with --blocks writes,
          then fsync and close:
            shared    into disjoint halves of ONE file (client 0 the first
                      half, client 1 the second): N -> 1 aggregation;
            separate  each into its own file: file per process;
            single    reference: 1 client writing both halves (2 x --size)
                      into one file alone, what one client gets.
          Blocks of 64 KiB and stripe-aligned 1 MiB by default, in a directory
          whose layout is stripe_unit 1 MiB, stripe_count = number of OSDs,
          object_size 4 MiB. The files are created (and seen by both clients)
          before the clock starts; both writers are released at the same
          instant; time = first open to last close; MB/s = bytes / time.
          Afterwards every byte is read back through the client that did not
          write it and compared. Each client's perf counters (objecter write
          ops and bytes, bytes through its object cacher) tell buffered from
          synchronous writes.
  create  --files small files per client (create, write 4 KiB, fsync,
          close), files per second: one client; two clients at once into
          one directory (file per process into one version directory); two
          clients into a directory each; and the same loop on the local file
          system of the temporary directory (the reference).
  lazyio  (--lazyio, on by default) shared and separate writes again on a
          second rig whose clients run with client_force_lazyio = true:
          CephFS's relaxed coherence for shared-file writers (ceph-fuse of
          Ceph 16 has no per-file switch, so it is a whole rig).

Every case is repeated --reps times, the cases interleaved within each
repetition; deleted files are purged (MDS purge queue) before the next case,
so that memstore memory does not grow. Median, min and max are printed with
the ratios; --json FILE gets every sample. The writers are separate
processes (this script's `_write`/`_create` subcommands), one per client.

Usage:  bench/cephfs_probe.py [--size 64M] [--blocks 64K,1M] [--reps 3] [--files 300]
                              [--no-lazyio] [--rig DIR] [--keep] [--json FILE] [--wait-idle S] [--quick]
Only the standard library is used (and bench/run_core.py's helpers).
"""

import argparse
import json
import os
import random
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
import cephfs  # noqa: E402
import run_core  # noqa: E402
from run_core import fmt_size, log, parse_size  # noqa: E402

MiB = 1 << 20
SMALL_FILE = 4096
START_DELAY_S = 0.5  # writers are released together this long after they are started
WRITE_CASES = ("shared", "separate", "single")
CREATE_CASES = ("one_client", "two_clients_one_dir", "two_clients_two_dirs", "local")
LAZYIO_CONF = {"client": {"client_force_lazyio": "true"}}


# ---------------------------------------------------------------- worker processes

def block_data(seed, block):
    """The block a writer writes everywhere in its region (seed = region offset)."""
    return random.Random(seed).randbytes(block)


def wait_until(t):
    while True:
        d = t - time.monotonic()
        if d <= 0:
            return
        time.sleep(min(d, 0.01))


def worker_write(path, offset, size, block, start_at):
    """Writes size bytes at offset of path (existing) in blocks, fsync, close;
    prints the monotonic times (CLOCK_MONOTONIC is one clock for the machine)."""
    buf = block_data(offset, block)
    wait_until(start_at)
    t_open = time.monotonic()
    fd = os.open(path, os.O_WRONLY)
    pos, end = offset, offset + size
    while pos < end:
        written = os.pwrite(fd, buf, pos)
        if written != block:
            raise OSError(f"short write ({written} of {block}) at {pos} of {path}")
        pos += written
    t_written = time.monotonic()
    os.fsync(fd)
    t_synced = time.monotonic()
    os.close(fd)
    print(json.dumps({"open": t_open, "written": t_written, "synced": t_synced, "closed": time.monotonic()}))


def worker_create(directory, prefix, count, start_at):
    """Creates count files of SMALL_FILE bytes in directory: create, write,
    fsync, close each."""
    buf = os.urandom(SMALL_FILE)
    wait_until(start_at)
    t0 = time.monotonic()
    for i in range(count):
        fd = os.open(os.path.join(directory, f"{prefix}{i:06d}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, buf)
        os.fsync(fd)
        os.close(fd)
    print(json.dumps({"open": t0, "closed": time.monotonic()}))


# ---------------------------------------------------------------- driver

def run_workers(argvs, timeout=600):
    """Starts one worker per argv (the start time appended), releases them
    together; returns their reports."""
    start_at = time.monotonic() + START_DELAY_S + 0.05 * len(argvs)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__)] + [str(a) for a in argv] + [repr(start_at)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"worker {p.args} failed ({p.returncode}):\n{err}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    late = min(r["open"] for r in reports) - start_at
    if late > 0.05:
        log(f"  warning: workers started {late:.2f} s late")
    return reports


def perf(rig, i):
    """The counters of client i that tell buffered from synchronous writes."""
    try:
        p = rig.perf_dump(i)
    except cephfs.CephFSError:
        return None
    return {"op_w": p["objecter"]["op_w"], "op_send_bytes": p["objecter"]["op_send_bytes"],
            "cached_bytes": p["objectcacher-libcephfs"]["data_written"],
            "flushed_bytes": p["objectcacher-libcephfs"]["data_flushed"]}


def perf_delta(before, after):
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in before}


def wait_visible(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not visible after {timeout} s")
        time.sleep(0.05)


def verify(path, offset, size, block):
    """Reads [offset, offset + size) of path and compares it with what the
    writer of that region wrote."""
    want = block_data(offset, block)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        for pos in range(offset, offset + size, block):
            got = f.read(block)
            if got != want:
                raise RuntimeError(f"{path}: wrong data in [{pos}, {pos + block}) read back")


def write_case(rig, work, case, size, block, rep):
    """One timed run of a write case; returns its sample."""
    m = [rig.mounts[0] / work, rig.mounts[1] / work]
    name = f"{case}-{block}-{rep}"
    # (client, file name, offset, bytes) of each writer
    if case == "shared":
        writers = [(0, name, 0, size), (1, name, size, size)]
    elif case == "separate":
        writers = [(0, name + ".0", 0, size), (1, name + ".1", 0, size)]
    else:
        writers = [(0, name, 0, 2 * size)]
    files = sorted({w[1] for w in writers})
    for f in files:
        (m[0] / f).touch()
    for client, f, _, _ in writers:
        wait_visible(m[client] / f)
    before = [perf(rig, i) for i in range(2)]
    reports = run_workers([["_write", m[c] / f, off, n, block] for c, f, off, n in writers])
    after = [perf(rig, i) for i in range(2)]
    t0 = min(r["open"] for r in reports)
    seconds = max(r["closed"] for r in reports) - t0
    t = time.monotonic()
    for client, f, off, n in writers:  # through the other client
        verify(m[1 - client] / f, off, n, block)
    verify_s = time.monotonic() - t
    t = time.monotonic()
    purged = rig.purged_count()
    for f in files:
        os.unlink(m[0] / f)
    if not rig.wait_purged(purged, len(files)):
        log(f"  warning: {name}: deleted files not purged after 30 s")
    return {"case": case, "block": block, "rep": rep, "bytes": 2 * size, "seconds": seconds,
            "mb_s": 2 * size / seconds / 1e6,
            "write_s": max(r["written"] for r in reports) - t0,
            "fsync_s": max(r["synced"] - r["written"] for r in reports),
            "verify_s": verify_s, "purge_s": time.monotonic() - t,
            "clients": [perf_delta(x, y) for x, y in zip(before, after)]}


def create_case(rig, local_dir, work, case, files, rep):
    a, b = rig.mounts[0] / work, rig.mounts[1] / work
    d = f"c-{case}-{rep}"
    if case == "local":
        dirs = [os.path.join(local_dir, d)]
        os.mkdir(dirs[0])
        argvs = [["_create", dirs[0], "f", files]]
    elif case == "one_client":
        (a / d).mkdir()
        dirs = [a / d]
        argvs = [["_create", a / d, "f", files]]
    elif case == "two_clients_one_dir":
        (a / d).mkdir()
        wait_visible(b / d)
        dirs = [a / d]
        argvs = [["_create", a / d, "a", files], ["_create", b / d, "b", files]]
    else:  # two_clients_two_dirs
        (a / (d + ".0")).mkdir()
        (b / (d + ".1")).mkdir()
        dirs = [a / (d + ".0"), a / (d + ".1")]
        argvs = [["_create", a / (d + ".0"), "a", files], ["_create", b / (d + ".1"), "b", files]]
    reports = run_workers(argvs)
    seconds = max(r["closed"] for r in reports) - min(r["open"] for r in reports)
    n = files * len(argvs)
    listed = sum(len(os.listdir(x)) for x in dirs)
    if listed != n:
        raise RuntimeError(f"{case}: {listed} files listed, {n} created")
    for x in dirs:
        for f in os.listdir(x):
            os.unlink(os.path.join(x, f))
        os.rmdir(x)
    return {"case": case, "rep": rep, "files": n, "seconds": seconds, "files_s": n / seconds}


def summarize(samples, key):
    xs = [s[key] for s in samples]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def measure(rig, label, args, size, blocks, tmp, write_cases, with_creates):
    """Every repetition of the cases on one rig; returns its results."""
    out = {"label": label, "write": [], "create": []}
    work = f"probe-{os.getpid()}"
    wdir = rig.mounts[0] / work
    wdir.mkdir()
    nosds = rig.osd_count()
    layout = cephfs.set_layout(wdir, stripe_unit=MiB, stripe_count=nosds, object_size=4 * MiB)
    out.update(osds=nosds, layout=layout, rig_start=dict(rig.timings), rss_mib_start=rig.memory_rss_mib())
    local = os.path.join(tmp, f"local-{label}")
    os.mkdir(local)
    noise = run_core.ForeignLoad()
    for rep in range(args.reps):
        if args.wait_idle and run_core.wait_idle(args.wait_idle) is None:
            log("  warning: the machine did not become idle; measuring anyway")
        for blk in blocks:
            for case in write_cases:
                s = write_case(rig, work, case, size, blk, rep)
                out["write"].append(s)
                log(f"  {label} rep {rep} write {case:8} {fmt_size(blk):>7}: {s['mb_s']:7.1f} MB/s "
                    f"({s['seconds']:.2f} s, fsync {s['fsync_s']:.2f} s; verify {s['verify_s']:.1f} s, "
                    f"purge {s['purge_s']:.1f} s)")
        if with_creates:
            for case in CREATE_CASES:
                s = create_case(rig, local, work, case, args.files, rep)
                out["create"].append(s)
                log(f"  {label} rep {rep} create {case:20}: {s['files_s']:7.0f} files/s")
    out["noise"] = noise.stop()
    out["rss_mib_end"] = rig.memory_rss_mib()
    os.rmdir(wdir)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="64M", help="bytes each client writes (default 64M)")
    ap.add_argument("--blocks", default="64K,1M", help="write sizes, comma separated (default 64K,1M)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files", type=int, default=300, help="small files created per client (default 300)")
    ap.add_argument("--lazyio", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure shared/separate writes on a rig with client_force_lazyio (default on)")
    ap.add_argument("--rig", help="use the rig started in this directory (cephfs.py start DIR --clients 2) "
                                  "instead of starting one (implies --no-lazyio)")
    ap.add_argument("--memstore-mib", type=int, default=1024, help="capacity (memory) of each OSD (default 1024)")
    ap.add_argument("--conf", action="append", default=[], metavar="SECTION.OPTION=VALUE",
                    help="extra ceph.conf option for the rigs this script starts, e.g. client.client_oc=false")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    ap.add_argument("--json", help="write every sample and the summary here")
    ap.add_argument("--wait-idle", type=int, default=0, metavar="S",
                    help="before each repetition wait up to S seconds for idle CPUs")
    ap.add_argument("--quick", action="store_true", help="smoke run: 8 MiB, 1 repetition, 50 files")
    args = ap.parse_args()
    if args.quick:
        args.size, args.reps, args.files = "8M", 1, 50
    size = parse_size(args.size)
    blocks = [parse_size(b) for b in args.blocks.split(",")]
    for blk in blocks:
        if size % blk:
            ap.error(f"--size must be a multiple of every block ({fmt_size(blk)})")
    extra = {}
    for c in args.conf:
        key, _, value = c.partition("=")
        section, _, option = key.partition(".")
        extra.setdefault(section, {})[option] = value

    t_all = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="cephfs-probe-", dir=os.environ.get("TMPDIR", "/tmp"))
    results = {"args": vars(args), "machine": run_core.machine_info(tmp, tmp), "loadavg_start": run_core.loadavg(),
               "ceph": subprocess.run(["ceph", "--version"], capture_output=True, text=True).stdout.strip(),
               "configs": []}
    try:
        if args.rig:
            rig = cephfs.CephFSRig.attach(args.rig)
            if len(rig.clients) < 2:
                sys.exit(f"cephfs_probe: the rig in {args.rig} has {len(rig.clients)} clients, 2 are needed")
            results["configs"].append(measure(rig, "given", args, size, blocks, tmp, WRITE_CASES, True))
        else:
            configs = [("default", extra, WRITE_CASES, True)]
            if args.lazyio:
                lazy = {k: dict(v) for k, v in extra.items()}
                lazy.setdefault("client", {}).update(LAZYIO_CONF["client"])
                configs.append(("lazyio", lazy, ("shared", "separate"), False))
            for label, conf, cases, creates in configs:
                log(f"starting the CephFS rig ({label}) in {tmp}/rig-{label}")
                rig = cephfs.CephFSRig(os.path.join(tmp, f"rig-{label}"), clients=2, osds=3,
                                       memstore_mib=args.memstore_mib, die_with_parent=True, conf_extra=conf)
                rig.start()
                log(f"  up in {rig.timings['start_s']:.1f} s")
                try:
                    r = measure(rig, label, args, size, blocks, tmp, cases, creates)
                    r["conf_extra"] = conf
                finally:
                    t = time.monotonic()
                    rig.stop()
                r["rig_stop_s"] = time.monotonic() - t
                results["configs"].append(r)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    results["loadavg_end"] = run_core.loadavg()
    results["elapsed_s"] = time.monotonic() - t_all
    report(results, size, blocks)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def report(res, size, blocks):
    first = res["configs"][0]
    print(f"{res['ceph']}; {first['osds']} memstore OSDs, 2 ceph-fuse clients; directory layout {first['layout']}")
    print(f"write: each client {fmt_size(size)} (single: one client {fmt_size(2 * size)}), write + fsync + close, "
          f"MB/s of both together; median [min-max] of {res['args']['reps']}")
    print(f"{'config':>8} {'block':>7} {'shared file':>20} {'separate files':>20} {'one client alone':>20}"
          f"   shared/separate")
    for cfg in res["configs"]:
        w = cfg["write"]
        summary = cfg.setdefault("summary", {})
        for blk in blocks:
            row = {c: summarize([s for s in w if s["block"] == blk and s["case"] == c], "mb_s")
                   for c in WRITE_CASES if any(s["case"] == c for s in w)}
            row["shared_over_separate"] = row["shared"]["median"] / row["separate"]["median"]
            summary[f"write_{blk}"] = row
            cells = [f"{row[c]['median']:6.1f} [{row[c]['min']:.0f}-{row[c]['max']:.0f}]" if c in row else "-"
                     for c in WRITE_CASES]
            print(f"{cfg['label']:>8} {fmt_size(blk):>7} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20}"
                  f"   {row['shared_over_separate']:.2f}")
    print("per client and run, medians: OSD write ops, MiB sent to OSDs, MiB through the object cacher")
    for cfg in res["configs"]:
        w = cfg["write"]
        for blk in blocks:
            for case in WRITE_CASES:
                nclients = 1 if case == "single" else 2
                per = [c for s in w if s["block"] == blk and s["case"] == case for c in s["clients"][:nclients] if c]
                if not per:
                    continue
                ops = statistics.median(c["op_w"] for c in per)
                sent = statistics.median(c["op_send_bytes"] for c in per) / MiB
                cached = statistics.median(c["cached_bytes"] for c in per) / MiB
                cfg["summary"].setdefault("client_ops", {})[f"{case}_{blk}"] = {
                    "op_w": ops, "sent_mib": sent, "cached_mib": cached}
                print(f"  {cfg['label']:>8} {fmt_size(blk):>7} {case:8}: {ops:6.0f} ops {sent:7.1f} MiB sent "
                      f"{cached:7.1f} MiB cached")
    for cfg in res["configs"]:
        c = cfg["create"]
        if not c:
            continue
        print(f"create + write 4 KiB + fsync + close ({cfg['label']}), files/s; median [min-max]")
        rows = {}
        for case in CREATE_CASES:
            samples = [s for s in c if s["case"] == case]
            rows[case] = summarize(samples, "files_s")
            print(f"  {case:22} {rows[case]['median']:8.0f} [{rows[case]['min']:.0f}-{rows[case]['max']:.0f}]"
                  f"  ({samples[0]['files']} files)")
        rows["one_client_over_local"] = rows["one_client"]["median"] / rows["local"]["median"]
        print(f"  CephFS one client / local: {rows['one_client_over_local']:.3f}; "
              f"{1e3 / rows['one_client']['median']:.2f} ms per file on CephFS, "
              f"{1e3 / rows['local']['median']:.2f} ms locally")
        cfg["summary"]["create"] = rows
    for cfg in res["configs"]:
        print(f"rig {cfg['label']}: start {cfg['rig_start'].get('start_s', float('nan')):.1f} s, "
              f"stop {cfg.get('rig_stop_s', float('nan')):.1f} s, resident "
              f"{sum(cfg['rss_mib_start'].values()):.0f} MiB after start, {sum(cfg['rss_mib_end'].values()):.0f} MiB "
              f"at the end; load by others {cfg['noise']}")
    print(f"load average {res['loadavg_start']} -> {res['loadavg_end']}; {res['elapsed_s']:.0f} s in all")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_write":
        worker_write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    elif len(sys.argv) > 1 and sys.argv[1] == "_create":
        worker_create(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
