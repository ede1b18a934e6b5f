#!/usr/bin/env python3
"""History benchmark of cairn: comparing checkpoint histories, and what keeping
them costs the application. One invocation measures, in the same run:

  raw read    reading the same checkpoint files with read(2) (cold when the page
              cache can be dropped, else warm: stated in the output)
  diff        `cairn diff --json` of two identical histories, of two diverged
              ones (every element differs beyond, or within, the tolerance) and
              of two that differ by about one ulp (full counts, and the
              mismatch-only question that tolerant tree leaves answer):
              throughput = checkpoint bytes of both runs / elapsed, bytes read
  no trees    the identical pair written with hash_trees = false: every byte is read
  hashing     the hash stage's time per GiB (from the manifests), and the time
              the application is blocked in cairn_checkpoint with trees on vs off

Usage: bench/run_history.py [--quick] [--json FILE] [--build DIR] [--dir DIR]
Only the standard library is used; files go to a fresh directory under --dir.
"""

import argparse
import glob
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


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(extra)
    return env


def write_history(build, store, scratch, run, size, versions, perturb=0.0, trees=True):
    env = clean_env(CAIRN_PERSISTENT=store, CAIRN_SCRATCH=scratch, CAIRN_RUN=run, CAIRN_KEEP_LOCAL="1",
                    CAIRN_KEEP_PERSISTENT="0",  # histories are compared: keep every version
                    CAIRN_HASH_TREES="true" if trees else "false", CAIRN_HASH_ABS="1e-9")
    out = subprocess.run([os.path.join(build, "bench", "history_writer"), "--bytes", str(size), "--versions",
                          str(versions), "--perturb", str(perturb)], env=env, check=True, capture_output=True,
                         text=True, timeout=600)
    return json.loads(out.stdout)


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def raw_read(files, cold):
    if cold:
        drop_caches()
    buf = bytearray(8 << 20)
    total = 0
    t0 = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
    return total, time.perf_counter() - t0


def diff(cli, store, a, b, cold, *opts):
    if cold:
        drop_caches()
    t0 = time.perf_counter()
    res = subprocess.run([cli, "diff", store, a, b, "--json", *opts], capture_output=True, text=True, timeout=600,
                         env=clean_env())
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):
        sys.exit(f"cairn diff failed ({res.returncode}): {res.stderr}")
    j = json.loads(res.stdout)
    return j, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--size", default=str(128 << 20), help="bytes per version (default 128 MiB)")
    ap.add_argument("--versions", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="8 MiB x 2 versions, a smoke run")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()
    size = (8 << 20) if args.quick else int(args.size)
    versions = 2 if args.quick else args.versions
    cli = os.path.join(args.build, "tools", "cairn", "cairn")
    work = tempfile.mkdtemp(prefix="cairn-history-bench.", dir=args.dir)
    scratch = tempfile.mkdtemp(prefix="cairn-history-bench.", dir="/dev/shm")
    try:
        store = os.path.join(work, "store")
        print(f"history benchmark: {versions} versions x {size >> 20} MiB per run, store {store}", flush=True)
        w = {}
        # c: every element off by 1e-6 relative (a real divergence); d: off by about
        # one ulp (the noise of a reordered sum), mostly inside the tree quantum 1e-9.
        for run, perturb, trees in (("a", 0.0, True), ("b", 0.0, True), ("c", 1e-6, True), ("d", 4e-16, True),
                                    ("a0", 0.0, False), ("b0", 0.0, False)):
            w[run] = write_history(args.build, store, scratch, run, size, versions, perturb, trees)
        cold = drop_caches()
        shards_a = sorted(glob.glob(os.path.join(store, "runs", "a", "history", "v*", "shard.*")))
        shards_b = sorted(glob.glob(os.path.join(store, "runs", "b", "history", "v*", "shard.*")))
        read_bytes, read_s = raw_read(shards_a + shards_b, cold)
        raw_bw = read_bytes / read_s

        results = {"size_per_version": size, "versions": versions, "cold_cache": cold,
                   "raw_read": {"bytes": read_bytes, "seconds": read_s, "bandwidth": raw_bw}}
        cases = [("identical, trees", "a", "b", ()),
                 ("identical, no trees", "a0", "b0", ()),
                 ("diverged within --abs 1e-3", "a", "c", ("--abs", "1e-3")),
                 ("diverged, mismatching", "a", "c", ()),
                 ("ulp noise, full counts --abs 2e-9", "a", "d", ("--abs", "2e-9", "--rel", "1e-15")),
                 ("ulp noise, --mismatches-only --abs 2e-9", "a", "d",
                  ("--mismatches-only", "--abs", "2e-9", "--rel", "1e-15"))]
        rows = []
        for label, a, b, opts in cases:
            j, wall = diff(cli, store, a, b, cold, *opts)
            io = j["io"]
            ckpt = io["checkpoint_bytes"]
            read = io["tree_bytes"] + io["data_bytes"] + io.get("metadata_bytes", 0)
            rows.append({"case": label, "seconds": wall, "checkpoint_bytes": ckpt, "tree_bytes": io["tree_bytes"],
                         "data_bytes": io["data_bytes"], "read_fraction": read / ckpt if ckpt else 0,
                         "throughput": ckpt / wall, "vs_raw_read": (ckpt / wall) / raw_bw,
                         "mismatches": j["summary"].get("mismatch", None)})
        results["diff"] = rows

        hash_s = []
        for m in glob.glob(os.path.join(store, "runs", "a", "history", "v*", "MANIFEST")):
            text = open(m).read()
            body = json.loads(text[: text.rfind("xxh3 ")])
            hash_s += [s["hash_s"] for s in body["shards"]]
        hash_per_gib = statistics.mean(hash_s) / (size / (1 << 30))
        blocked_on = statistics.median(w["a"]["blocked_s"][1:] or w["a"]["blocked_s"])
        blocked_off = statistics.median(w["a0"]["blocked_s"][1:] or w["a0"]["blocked_s"])
        results["hashing"] = {"hash_s_per_gib": hash_per_gib, "blocked_median_trees_s": blocked_on,
                              "blocked_median_no_trees_s": blocked_off}

        print(f"\nraw read of both runs' shards ({'cold' if cold else 'warm'} cache): "
              f"{read_bytes / 2**20:.0f} MiB in {read_s:.3f} s = {raw_bw / 1e9:.2f} GB/s")
        print(f"\n{'case':46} {'time s':>8} {'GB/s':>7} {'x raw':>7} {'read %':>8} {'tree B':>10} {'data B':>12}")
        for r in rows:
            print(f"{r['case']:46} {r['seconds']:8.3f} {r['throughput'] / 1e9:7.2f} {r['vs_raw_read']:7.2f} "
                  f"{100 * r['read_fraction']:7.3f}% {r['tree_bytes']:10d} {r['data_bytes']:12d}")
        print(f"\nhash stage: {hash_per_gib:.3f} s per GiB (background); blocked in cairn_checkpoint "
              f"(median): {blocked_on * 1e3:.2f} ms with trees, {blocked_off * 1e3:.2f} ms without "
              f"(ratio {blocked_on / blocked_off:.2f})")
        ident = rows[0]
        print(f"target: identical histories read <= 5% of the checkpoint bytes: "
              f"{100 * ident['read_fraction']:.3f}% -> {'met' if ident['read_fraction'] <= 0.05 else 'NOT met'}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
