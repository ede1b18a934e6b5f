#!/usr/bin/env python3
"""Remote checkpoint agents benchmark: blocked time, pull bandwidth, placement.

One invocation starts its own agents deployment on 127.0.0.1 (a `cairn
controller`, `cairn manager`s launching `cairn-agent`, all in a temporary
directory), runs bench/cairn_bench (--ranks ranks, --size bytes per rank)
against it and against the plain persistent level, and prints, with the
physical references measured in the same run:

  references  memcpy of the same bytes into a pre-faulted buffer (cairn_bench);
              `dd oflag=direct` of the same bytes into the store directory, one
              per rank at once, and the O_DIRECT write + fdatasync as cairn
              issues it (cairn_bench); a raw libfabric fi_read of one image
              and the agent's pull_image path on the same provider
              (bench/agents_rma_bench)
  baseline    the application writing synchronously to the persistent level:
              mode = sync, local_enabled = false, no agents (paper 002's
              MPI-IO baseline); also mode = thread with the same levels
  agents      time blocked in cairn_checkpoint with 1, 2, 4 agents
              (--agents), non-blocking and blocking (agents_blocking), and the
              time until the agents hold the version (cairn_wait(PROTECTED))
              and until they committed it to the store; the agents' own pull
              rate (their log prints MB/s per pull)
  placement   paper 002's placement experiment in small: application A (one
              agent) checkpoints while --interferers other applications
              checkpoint continuously; their agents either stacked on A's
              agent node (moved there with `cairn agents migrate`) or spread
              by the controller's `activity` strategy over 3 managers. What a
              "node" is on one machine (--placement-variants): netns, a
              network namespace whose link from the applications is limited
              to --node-link-rate (its agents share that link as they would
              share a NIC; needs root, ip and tc); pinned, a CPU of its own
              for the node's manager and agents; loopback, nothing, where the
              placement can change nothing (the control experiment).

Every timing is the median over --checkpoints checkpoints after one warm-up
(which allocates the staging slots and, at the agent, the first buffers),
maximum over ranks. Progress lines go to stderr, the table to stdout, and
--json FILE gets every number. Everything this driver starts is stopped at
the end (SIGTERM, then SIGKILL of its process group); the temporary
directories are deleted unless --keep.

Usage:  bench/run_agents.py [--size 32M] [--ranks 4] [--json FILE] [--build DIR] [--quick] ...
Only the standard library is used (and bench/run_core.py's helpers).
"""

import argparse
import glob
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import run_core  # noqa: E402  (helpers: machine and source info, dd, idle wait, noise)

from run_core import fmt_size, log, med, parse_size  # noqa: E402

HEARTBEAT_S = 0.2
HEARTBEAT_TIMEOUT_S = 3.0
# agents held-line: "cairn-agent: held RUN/NAME vV rank R/N (X MB/s)"
HELD_RE = re.compile(r"held (\S+)/(\S+) v(\d+) rank (\d+)/(\d+) \(([\d.]+) MB/s\)")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_ip(*args, ns=None, check=True):
    cmd = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit status %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r


def netns_usable():
    """Whether this process may make network namespaces with rate-limited
    links (root, iproute2's ip and tc)."""
    return os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("tc"))


class Netns:
    """Agent nodes as network namespaces: each has a veth pair whose root end
    is a port of one bridge (which holds the root namespace's address), and
    that root end gets a token-bucket qdisc of `rate`: everything the node's
    agents pull from the applications crosses it, so agents on one node share
    its link as they share a NIC. Names carry the pid; close() removes what
    was made, also after a failure."""

    def __init__(self, letters, rate):
        pid = os.getpid()
        self.rate = rate
        self.bridge = "cab%dbr" % pid  # interface names: at most 15 characters
        self.namespaces, self.veths, self.made_bridge = [], [], False
        used = run_ip("-4", "-o", "addr").stdout + run_ip("-4", "route").stdout
        net = None
        for i in range(254):
            n = (pid + i) % 254 + 1
            if "10.232.%d." % n not in used:
                net = "10.232.%d" % n
                break
        if net is None:
            raise RuntimeError("no free 10.232.N.0/24 subnet")
        self.host = net + ".1"
        self.nodes = {"node-" + c: ("cairn-b%d-%s" % (pid, c), "%s.%d" % (net, i + 2), "cab%d%s" % (pid, c))
                      for i, c in enumerate(letters)}

    def open(self):
        run_ip("link", "add", self.bridge, "type", "bridge")
        self.made_bridge = True
        run_ip("addr", "add", self.host + "/24", "dev", self.bridge)
        run_ip("link", "set", self.bridge, "up")
        for ns, addr, veth in self.nodes.values():
            run_ip("netns", "add", ns)
            self.namespaces.append(ns)
            run_ip("link", "add", veth, "type", "veth", "peer", "name", veth + "n")
            self.veths.append(veth)
            run_ip("link", "set", veth + "n", "netns", ns)
            run_ip("link", "set", veth, "master", self.bridge)
            run_ip("link", "set", veth, "up")
            run_ip("link", "set", "lo", "up", ns=ns)
            run_ip("addr", "add", addr + "/24", "dev", veth + "n", ns=ns)
            run_ip("link", "set", veth + "n", "up", ns=ns)
            if self.rate:
                # Bridge -> node: the direction of the agents' pulls.
                r = subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", self.rate, "burst",
                                    "4mb", "latency", "100ms"], capture_output=True, text=True, timeout=20)
                if r.returncode != 0:
                    raise RuntimeError("tc qdisc add dev %s: %s" % (veth, r.stderr.strip()))
        return self

    def close(self):
        for ns in self.namespaces:
            # Only this driver's managers and agents live in these namespaces.
            for pid in run_ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in self.namespaces:
            run_ip("netns", "del", ns, check=False)
        for veth in self.veths:
            if run_ip("link", "show", veth, check=False).returncode == 0:
                run_ip("link", "del", veth, check=False)
        if self.made_bridge:
            run_ip("link", "del", self.bridge, check=False)
        self.namespaces, self.veths, self.made_bridge = [], [], False


def kill_group(p, timeout=15.0):
    """SIGTERM to the process group of p (a process this driver started in a
    new session), SIGKILL after timeout; reaps p."""
    if p.poll() is not None:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of the group (agents)
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


class Deployment:
    """A controller and its managers on 127.0.0.1 (or on `host`, the bridge of
    a Netns), each in its own process group (a manager's agents are in its
    group)."""

    def __init__(self, args, root, env, strategy=None, distribution=None, capacity=4, host="127.0.0.1"):
        self.args = args
        self.root = root
        self.env = env
        os.makedirs(root, exist_ok=True)
        self.secret = os.path.join(root, "secret")
        with open(self.secret, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.chmod(self.secret, 0o600)
        self.service_secret = os.path.join(root, "service-secret")
        with open(self.service_secret, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.chmod(self.service_secret, 0o600)
        self.address = "%s:%d" % (host, free_port(host))
        self.procs = {}
        self.nodes = {}
        cmd = ["controller", "--listen", self.address, "--secret-file", self.secret,
               "--service-secret-file", self.service_secret, "--journal",
               os.path.join(root, "journal"), "--heartbeat-interval", str(HEARTBEAT_S), "--heartbeat-timeout",
               str(HEARTBEAT_TIMEOUT_S), "--capacity", str(capacity)]
        if strategy:
            cmd += ["--strategy", strategy]
        if distribution:
            cmd += ["--distribution", distribution]
        self.start("controller", [args.cli] + cmd)
        self.wait_until("the controller", lambda: self.status(check=False))

    def start(self, name, cmd, ns=None):
        if ns:
            cmd = ["ip", "netns", "exec", ns] + cmd  # ip execs the command: same pid
        logf = open(os.path.join(self.root, name + ".log"), "ab")
        if self.args.verbose:
            log("+ " + " ".join(shlex.quote(str(c)) for c in cmd))
        self.procs[name] = subprocess.Popen([str(c) for c in cmd], stdout=logf, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, env=self.env)
        logf.close()

    def add_manager(self, node, capacity=4, store=None, threads=None, cpu=None, ns=None, addr=None, provider=None):
        """A manager whose agents keep versions in memory and, with `store`,
        write them to it (the agent arguments are given explicitly because
        applications registered by hand carry no store); on CPU `cpu`, or in
        network namespace `ns` serving on `addr`; their libfabric provider
        `provider` (default: cairn-agent's)."""
        run_dir = os.path.join(self.root, "run-" + node)
        agent_args = ["--agent-id", "{agent}", "--app-id", "{app}", "--app", "{app_name}", "--node", "{node}",
                      "--controller", "{controller}", "--stats-file", "{stats_file}"]
        if store:
            agent_args += ["--persistent", store]
        if threads:
            agent_args += ["--threads", str(threads)]
        if addr:
            agent_args += ["--bind", addr]
        if provider:
            agent_args += ["--provider", provider]
        cmd = [self.args.cli, "manager", "--controller", self.address, "--secret-file", self.secret,
               "--service-secret-file", self.service_secret, "--node-id",
               node, "--capacity", str(capacity), "--agent-program", self.args.agent, "--run-dir", run_dir,
               "--stop-grace", "10"] + ["--agent-arg=" + a for a in agent_args]
        if addr:
            cmd += ["--listen", addr + ":0"]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu)] + cmd
        self.start("manager-" + node, cmd, ns=ns)
        self.nodes[node] = {"cpu": cpu, "run_dir": run_dir}
        self.wait_until("node " + node, lambda: any(n["node"] == node for n in self.status()["nodes"]))

    def cli(self, *args, check=True):
        cmd = [self.args.cli] + [str(a) for a in args]
        if self.args.verbose:
            log("+ " + " ".join(shlex.quote(c) for c in cmd))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError("cairn %s failed (%d):\n%s%s" % (" ".join(map(str, args)), r.returncode, r.stdout,
                                                                r.stderr))
        return r

    def admin(self, *args, check=True):
        return self.cli("agents", *args, "--controller", self.address, "--service-secret-file", self.service_secret,
                        check=check)

    def status(self, check=True):
        r = self.admin("status", "--json", "--timeout", "5", check=check)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def app(self, name):
        for a in self.status()["applications"]:
            if a["name"] == name:
                return a
        return None

    def wait_until(self, what, pred, timeout=30.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = pred()
                if last:
                    return last
            except (KeyError, ValueError, RuntimeError, subprocess.TimeoutExpired) as e:
                last = e
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError("%s exited (%d) while waiting for %s; see %s" % (
                        name, p.returncode, what, os.path.join(self.root, name + ".log")))
            time.sleep(0.1)
        raise RuntimeError("timed out waiting for %s (last: %r)" % (what, last))

    def register(self, name, ranks, store, agents=1, interval=None, checkpoint_bytes=None):
        """Registers `name` by hand (the application re-registers under the
        same name at init and keeps these agents, proving it with the key
        this registration keeps in its run directory of `store`, the
        application's persistent level), sets its agent count and waits until
        every agent runs and has an endpoint."""
        cmd = ["register", "--name", name, "--ranks", ranks, "--nodes", 1, "--store", store, "--json"]
        if interval:
            cmd += ["--interval", interval]
        if checkpoint_bytes:
            cmd += ["--checkpoint-bytes", checkpoint_bytes]
        self.admin(*cmd)
        app = self.wait_until("application " + name, lambda: self.app(name))
        if len(app["agents"]) != agents:
            self.admin("resize", "--app", app["app"], "--agents", agents, "--force")
        return self.wait_ready(name, agents)

    def wait_ready(self, name, agents):
        def ready():
            a = self.app(name)
            if a and len(a["agents"]) == agents and all(g.get("endpoint") and g.get("pid", 0) > 0
                                                        for g in a["agents"]):
                return a
            return None
        return self.wait_until("%d running agent(s) of %s" % (agents, name), ready)

    def held_lines(self, run=None):
        """Pulls the agents logged: (run, name, version, rank, MB/s, agent log)."""
        out = []
        for path in sorted(glob.glob(os.path.join(self.root, "run-*", "agent-*.log"))):
            with open(path, errors="replace") as f:
                for m in HELD_RE.finditer(f.read()):
                    if run is None or m.group(1) == run:
                        out.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), float(m.group(6)),
                                    os.path.basename(path)))
        return out

    def stop(self):
        # Managers first: each leaves and stops its agents (SIGTERM, grace).
        for name in [n for n in self.procs if n.startswith("manager-")] + ["controller"]:
            p = self.procs.pop(name, None)
            if p is not None:
                kill_group(p)


class Bench:
    def __init__(self, args):
        self.args = args
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        if os.geteuid() == 0:
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        self.env = env
        self.children = []  # background MPI jobs (interferers), killed at the end

    def mpirun(self, ranks, extra_env):
        cmd = [self.args.mpirun] + shlex.split(self.args.mpirun_args) + ["-np", str(ranks)]
        for k in sorted(extra_env):
            cmd += ["-x", k]
        return cmd

    def bench_cmd(self, ranks, store, scratch, extra_env, opts, restart=False):
        os.makedirs(store, exist_ok=True)
        os.makedirs(scratch, exist_ok=True)
        return self.mpirun(ranks, extra_env) + [
            self.args.cairn_bench, "--store", store, "--scratch", scratch, "--bytes", str(self.args.size_bytes),
            "--json"] + ([] if restart else ["--no-restart"]) + [str(o) for o in opts]

    def run_json(self, cmd, extra_env, timeout=600):
        env = dict(self.env)
        env.update(extra_env)
        if self.args.verbose:
            log("+ " + " ".join("%s=%s" % kv for kv in sorted(extra_env.items())) + " "
                + " ".join(shlex.quote(c) for c in cmd))
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                           start_new_session=True)
        if p.returncode != 0:
            raise RuntimeError("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
        return parse_json_line(p.stdout, cmd)

    def start_background(self, cmd, extra_env, out_path):
        env = dict(self.env)
        env.update(extra_env)
        if self.args.verbose:
            log("+ (background) " + " ".join(shlex.quote(c) for c in cmd))
        f = open(out_path, "w")
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        f.close()
        self.children.append(p)
        return p

    def stop_children(self):
        for p in self.children:
            kill_group(p, timeout=5)
        self.children = []


def parse_json_line(out, cmd):
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON in the output of %s:\n%s" % (" ".join(cmd), out))


def agents_env(dep, blocking=False, persist=True, lend=False):
    return {"CAIRN_AGENTS": dep.address, "CAIRN_AGENTS_SECRET_FILE": dep.secret,
            "CAIRN_AGENTS_BLOCKING": "true" if blocking else "false",
            "CAIRN_AGENTS_PERSIST": "true" if persist else "false",
            "CAIRN_AGENTS_LEND": "true" if lend else "false",
            "CAIRN_AGENTS_WAIT": "30", "CAIRN_LOCAL_ENABLED": "false"}


# The variants of each agent count: (label, agents_blocking, agents_lend).
VARIANTS = (("nonblocking", False, False), ("blocking", True, False), ("lend", False, True))


def stats(xs):
    return {"median": med(xs), "min": min(xs) if xs else 0.0, "max": max(xs) if xs else 0.0, "n": len(xs)}


# ---- the measurements ----------------------------------------------------------------------------


def measure_references(b, pdir):
    """dd oflag=direct of the same bytes, one per rank at once (run_core's)."""
    a = b.args
    ddir = os.path.join(pdir, "dd")
    os.makedirs(ddir, exist_ok=True)
    plain = [run_core.dd_reference(a, ddir, a.size_bytes, []) for _ in range(a.reps)]
    shutil.rmtree(ddir, ignore_errors=True)
    return {"dd_direct_s": med(plain), "dd_direct_all_s": plain}


def measure_baseline(b, pdir, sdir):
    """No agents, local level off: sync (the paper's baseline) and thread."""
    a = b.args
    env = {"CAIRN_LOCAL_ENABLED": "false"}
    store, scratch = os.path.join(pdir, "baseline"), os.path.join(sdir, "baseline")
    os.makedirs(store, exist_ok=True)
    os.makedirs(scratch, exist_ok=True)
    try:
        return b.run_json(b.bench_cmd(a.ranks, store, scratch, env, [
            "--modes", "sync,thread", "--checkpoints", a.checkpoints, "--reps", a.reps, "--settle-ms",
            a.settle_ms]), env)
    finally:
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def measure_rma(b):
    """agents_rma_bench on one image of the size cairn_bench checkpoints (the
    region plus a 4 KiB shard header)."""
    a = b.args
    image = a.size_bytes + 4096
    cmd = [a.rma_bench, "--sizes", str(image), "--threads", "1,%d" % a.agent_threads, "--reps", str(a.rma_reps)]
    if a.verbose:
        log("+ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=b.env)
    if p.returncode != 0:
        raise RuntimeError("agents_rma_bench failed (%d):\n%s%s" % (p.returncode, p.stdout, p.stderr))
    out = {"image_bytes": image, "output": p.stdout}
    for line in p.stdout.splitlines():
        m = re.match(r"\s*\d+ MiB\s+(raw fi_read|transfer x\d+|agent x\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            out[m.group(1).replace(" ", "_")] = {"median_gbps": float(m.group(2)), "best_gbps": float(m.group(3)),
                                                  "ratio_to_raw": float(m.group(4))}
        elif line.startswith("provider "):
            out["provider_line"] = line.strip()
    return out


def measure_agent_counts(b, pdir, sdir):
    """1, 2, 4 agents x non-blocking / blocking, agents writing the store."""
    a = b.args
    root = os.path.join(pdir, "deploy-counts")
    store_parent = os.path.join(pdir, "agents")
    store = os.path.join(store_parent, "store")  # cairn_bench's CAIRN_PERSISTENT
    scratch = os.path.join(sdir, "agents")
    os.makedirs(store, exist_ok=True)
    os.makedirs(scratch, exist_ok=True)
    dep = Deployment(a, root, b.env, capacity=4)
    results = []
    try:
        for node in ("node-a", "node-b"):
            dep.add_manager(node, capacity=4, store=store, threads=a.agent_threads)
        for k in a.agent_counts:
            if k > a.ranks:
                # Each rank talks to one agent; the controller refuses more agents than ranks.
                log("  %d agents: skipped (more than the %d ranks; use --ranks %d)" % (k, a.ranks, k))
                continue
            for variant, blocking, lend in VARIANTS:
                name = "agents-%d-%s" % (k, variant)
                log("  %d agent(s), %s" % (k, variant))
                app = dep.register(name, a.ranks, store, agents=k)
                env = agents_env(dep, blocking=blocking, lend=lend)
                if a.restart_verify:
                    env["CAIRN_RESTART_VERIFY"] = a.restart_verify
                # Restart in a fresh handle after cairn_bench's finalize, for
                # the first count, staging and lend alike. The finalize
                # unregistered the application, so its agents no longer hold
                # the version and it comes from the store: restart from agent
                # memory after a job died is bench/run_agent_restart.py's.
                restart = k == a.agent_counts[0] and not blocking
                r = b.run_json(b.bench_cmd(a.ranks, store_parent, scratch, env, [
                    "--run", name, "--modes", "thread", "--checkpoints", a.checkpoints, "--reps", a.reps,
                    "--settle-ms", a.settle_ms], restart=restart), env)
                t = r["modes"]["thread"]
                pulls = [x for x in dep.held_lines(name) if x[2] >= 1]
                entry = {
                    "agents": k, "blocking": blocking, "lend": lend, "variant": variant, "run": name,
                    "restart_from_agents": r.get("restart_persistent"),
                    "nodes": sorted(g["node"] for g in app["agents"]),
                    "memcpy_s": r["memcpy_s"], "write_direct_s": r["write_direct_s"],
                    "blocked_s": t["blocked_s"], "protected_s": t.get("protected_s", 0.0),
                    "persistent_s": t["persistent_s"], "first_blocked_s": t["first_blocked_s"],
                    "protected_failed": t.get("protected_failed", 0), "background_cpu_s": t["background_cpu_s"],
                    "blocked_all_s": t["blocked_all_s"], "protected_all_s": t.get("protected_all_s", []),
                    "persistent_all_s": t["persistent_all_s"],
                    "agent_pull_mbps": stats([x[4] for x in pulls]),
                    "agent_pull_all_mbps": [x[4] for x in pulls],
                    "agents_pulling": len({x[5] for x in pulls}),
                }
                results.append(entry)
                log("    blocked %.4f s (%.2f x this run's memcpy), held after %.4f s, persistent after %.4f s, agent pull "
                    "%.0f MB/s%s" % (entry["blocked_s"], entry["blocked_s"] / entry["memcpy_s"],
                                     entry["protected_s"], entry["persistent_s"], entry["agent_pull_mbps"]["median"],
                                     (", %d version(s) NOT taken by the agents" % entry["protected_failed"])
                                     if entry["protected_failed"] else ""))
                shutil.rmtree(os.path.join(store, "runs", name), ignore_errors=True)
        # What the agents' writers stored against what they held (zstd); an
        # agent logs it when it stops.
        dep.stop()
        wrote = []
        for path in glob.glob(os.path.join(root, "run-*", "agent-*.log")):
            with open(path, errors="replace") as f:
                wrote += re.findall(r"wrote (\d+) bytes of shard files for (\d+) bytes of images \(([^,]*)", f.read())
        stored = sum(int(w[0]) for w in wrote)
        images = sum(int(w[1]) for w in wrote)
        return {"runs": results, "store_bytes": stored, "image_bytes": images,
                "store_ratio": (images / stored) if stored else None,
                "store_format": sorted({w[2] for w in wrote})}
    finally:
        dep.stop()
        if not a.keep:
            shutil.rmtree(store_parent, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)


def placement_variants(a):
    """What an agent node is in the placement experiment: "netns" a network
    namespace whose link from the applications is limited to
    --node-link-rate (agents on one node share it, as they share a NIC);
    "pinned" a CPU of its own for the node's manager and agents; "loopback"
    nothing (every process anywhere, all traffic over lo: on one machine the
    placement can then change nothing, the control experiment)."""
    if a.placement_variants != "auto":
        out = [v for v in a.placement_variants.split(",") if v]
        bad = [v for v in out if v not in ("netns", "pinned", "loopback")]
        if bad:
            sys.exit("run_agents.py: unknown placement variant(s) %s (netns, pinned, loopback)" % ", ".join(bad))
        if "netns" in out and not netns_usable():
            sys.exit("run_agents.py: the netns variant needs root, ip and tc")
        return out
    if netns_usable():
        return ["netns", "loopback"]
    return ["pinned", "loopback"] if (os.cpu_count() or 1) >= 2 else ["loopback"]


def node_cpus(pinned):
    """CPU of each agent node when pinned: node-a alone on CPU 0, the others
    share the remaining CPUs."""
    ncpu = os.cpu_count() or 1
    if not pinned:
        return {n: None for n in ("node-a", "node-b", "node-c")}
    return {"node-a": 0, "node-b": 1 % ncpu, "node-c": (2 % ncpu) if ncpu > 2 else (1 % ncpu)}


def measure_placement(b, pdir, sdir, case, variant, tag):
    """Application A (a.ranks ranks, one agent) measured while a.interferers
    one-rank applications checkpoint back to back; their agents stacked on
    A's node or spread by the activity strategy. Memory-only agents."""
    a = b.args
    root = os.path.join(pdir, "deploy-" + tag)
    store_parent = os.path.join(pdir, "placement-" + tag)
    scratch = os.path.join(sdir, "placement-" + tag)
    os.makedirs(os.path.join(store_parent, "store"), exist_ok=True)
    os.makedirs(scratch, exist_ok=True)
    stop_file = os.path.join(root, "stop")
    cpus = node_cpus(variant == "pinned")
    noise = run_core.ForeignLoad()
    net = Netns("abc", a.node_link_rate).open() if variant == "netns" else None
    dep = None
    try:
        dep = Deployment(a, root, b.env, strategy="activity", capacity=4, host=net.host if net else "127.0.0.1")
        for node in ("node-a", "node-b", "node-c"):
            ns, addr = (net.nodes[node][0], net.nodes[node][1]) if net else (None, None)
            dep.add_manager(node, capacity=4, threads=a.agent_threads, cpu=cpus[node], ns=ns, addr=addr)
        interval = (a.settle_ms + 100) / 1000.0
        app_store = os.path.join(store_parent, "store")  # cairn_bench's CAIRN_PERSISTENT
        app_a = dep.register("placement-A", a.ranks, app_store, agents=1, interval=interval)
        others = ["placement-I%d" % (i + 1) for i in range(a.interferers)]
        for name in others:
            dep.register(name, 1, app_store, agents=1, interval=(a.interferer_settle_ms + 100) / 1000.0)
        a_node = app_a["agents"][0]["node"]
        if case == "stacked":
            for name in others:
                g = dep.app(name)["agents"][0]
                if g["node"] != a_node:
                    dep.admin("migrate", "--agent", g["agent"], "--to", a_node)
            dep.wait_until("interferers' agents on %s" % a_node, lambda: all(
                dep.app(n)["agents"][0]["node"] == a_node for n in others))
            for name in others:
                dep.wait_ready(name, 1)
        placement = {n: dep.app(n)["agents"][0]["node"] for n in ["placement-A"] + others}
        log("  agents on %s" % (", ".join("%s@%s%s" % (n.split("-", 1)[1], node,
                                                                    "" if cpus[node] is None else
                                                                    " (cpu %d)" % cpus[node])
                                                       for n, node in placement.items())))
        # Interferers: back-to-back checkpoints until the stop file appears.
        procs = []
        for name in others:
            env = agents_env(dep, persist=False)
            cmd = b.bench_cmd(1, store_parent, os.path.join(scratch, name), env, [
                "--run", name, "--modes", "thread", "--checkpoints", 100000, "--reps", 1, "--settle-ms",
                a.interferer_settle_ms, "--no-wait-persistent", "--until-file", stop_file])
            procs.append((name, b.start_background(cmd, env, os.path.join(root, name + ".out"))))
        dep.wait_until("interferers checkpointing", lambda: all(
            any(x[2] >= 2 for x in dep.held_lines(n)) for n in others), timeout=120)
        before = {n: len(dep.held_lines(n)) for n in others}
        env = agents_env(dep, persist=False)
        r = b.run_json(b.bench_cmd(a.ranks, store_parent, os.path.join(scratch, "A"), env, [
            "--run", "placement-A", "--modes", "thread", "--checkpoints", a.checkpoints, "--reps", 1,
            "--settle-ms", a.settle_ms, "--no-wait-persistent"]), env)
        during = {n: len(dep.held_lines(n)) - before[n] for n in others}
        with open(stop_file, "w"):
            pass
        inter = {}
        for name, p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                log("  warning: interferer %s did not stop; killing it" % name)
            kill_group(p, timeout=5)
            try:
                with open(os.path.join(root, name + ".out")) as f:
                    out = parse_json_line(f.read(), [name])
                t = out["modes"]["thread"]
                inter[name] = {"checkpoints": t["checkpoints"], "blocked_s": t["blocked_s"],
                               "protected_s": t.get("protected_s", 0.0), "pulls_during_A": during[name]}
            except (OSError, RuntimeError, KeyError, ValueError) as e:
                inter[name] = {"error": str(e), "pulls_during_A": during[name]}
        t = r["modes"]["thread"]
        pulls = [x[4] for x in dep.held_lines("placement-A") if x[2] >= 1]
        res = {
            "case": case, "variant": variant, "placement": placement,
            "node_link_rate": a.node_link_rate if net else None,
            "node_cpus": {n: cpus[n] for n in sorted(set(placement.values()))},
            "memcpy_s": r["memcpy_s"], "blocked_s": t["blocked_s"], "protected_s": t.get("protected_s", 0.0),
            "protected_failed": t.get("protected_failed", 0), "blocked_all_s": t["blocked_all_s"],
            "protected_all_s": t.get("protected_all_s", []), "agent_pull_mbps": stats(pulls),
            "agent_pull_all_mbps": pulls, "interferers": inter,
        }
        log("    A: blocked %.4f s, held after %.4f s (min %.4f, max %.4f), pull %.0f MB/s; interferer pulls meanwhile "
            "%s" % (res["blocked_s"], res["protected_s"], min(res["protected_all_s"] or [0]),
                    max(res["protected_all_s"] or [0]), res["agent_pull_mbps"]["median"],
                    ", ".join(str(v) for v in during.values())))
    finally:
        b.stop_children()
        if dep is not None:
            dep.stop()
        if net is not None:
            net.close()
        if not a.keep:
            shutil.rmtree(store_parent, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
    # Only now are this case's processes reaped, their CPU time counted as
    # this driver's children's and not as other processes' load.
    res["noise"] = noise.stop()
    return res


def measure_placements(b, pdir, sdir):
    """Every variant (placement_variants) x case (spread, stacked),
    --placement-rounds times, the cases alternating so that slow drifts of
    the machine hit both; per variant and case the medians over every timed
    checkpoint of A."""
    a = b.args
    out = {}
    for mode in placement_variants(a):
        rounds = {"spread": [], "stacked": []}
        for rnd in range(a.placement_rounds):
            for case in (("spread", "stacked") if rnd % 2 == 0 else ("stacked", "spread")):
                log("run_agents: placement, %s, %s, round %d" % (mode, case, rnd + 1))
                rounds[case].append(measure_placement(b, pdir, sdir, case, mode, "%s-%s-%d" % (mode, case, rnd)))
        out[mode] = {}
        for case, runs in rounds.items():
            blocked = [x for r in runs for x in r["blocked_all_s"]]
            held = [x for r in runs for x in r["protected_all_s"]]
            pulls = [x for r in runs for x in r["agent_pull_all_mbps"]]
            out[mode][case] = {
                "placement": runs[0]["placement"], "node_cpus": runs[0]["node_cpus"],
                "memcpy_s": med([r["memcpy_s"] for r in runs]),
                "blocked_s": med(blocked), "protected_s": med(held), "agent_pull_mbps": stats(pulls),
                "blocked_all_s": blocked, "protected_all_s": held, "agent_pull_all_mbps": pulls,
                "protected_failed": sum(r["protected_failed"] for r in runs),
                "interferer_pulls_during_A": [sum(v["pulls_during_A"] for v in r["interferers"].values())
                                              for r in runs],
                "foreign_cpus": [(r.get("noise") or {}).get("foreign_cpus") for r in runs],
                "rounds": runs,
            }
    return out


# ---- report ----------------------------------------------------------------------------------------


def memcpy_reference(res):
    """Median of the memcpy references of every cairn_bench run (each run
    measures it, 3 times, at its start): the reference for all ratios."""
    xs = [res["baseline"]["memcpy_s"]] + [e["memcpy_s"] for e in res.get("agent_counts", {}).get("runs", [])]
    xs += [c["memcpy_s"] for m in res.get("placement", {}).values() for c in m.values()]
    return med(xs), xs


def ratios(doc):
    res = doc["results"]
    base = res["baseline"]
    memcpy = memcpy_reference(res)[0]
    sync = base["modes"]["sync"]["blocked_s"]
    out = {"sync_blocked_vs_memcpy": sync / memcpy,
           "sync_blocked_vs_dd": sync / res["references"]["dd_direct_s"],
           "thread_blocked_vs_memcpy": base["modes"]["thread"]["blocked_s"] / memcpy}
    raw = res.get("rma", {}).get("raw_fi_read", {}).get("median_gbps")
    agent_path = res.get("rma", {}).get("agent_x%d" % doc["settings"]["agent_threads"], {}).get("median_gbps")
    for e in res.get("agent_counts", {}).get("runs", []):
        key = "%d_%s" % (e["agents"], e.get("variant", "blocking" if e["blocking"] else "nonblocking"))
        rs = e.get("restart_from_agents")
        if rs:
            out["restart_from_agents_vs_memcpy_" + key] = rs["total_s"] / e["memcpy_s"]
        out["blocked_vs_memcpy_" + key] = e["blocked_s"] / memcpy
        out["sync_vs_agents_blocked_" + key] = sync / e["blocked_s"]
        out["held_vs_memcpy_" + key] = e["protected_s"] / memcpy
        out["sync_vs_agents_held_" + key] = sync / e["protected_s"] if e["protected_s"] else None
        pull = e["agent_pull_mbps"]["median"] / 1000.0
        if raw:
            out["agent_pull_vs_raw_read_" + key] = pull / raw
        if agent_path:
            out["agent_pull_vs_rma_bench_agent_path_" + key] = pull / agent_path
    for mode, pl in res.get("placement", {}).items():
        if "stacked" in pl and "spread" in pl:
            out["placement_%s_held_stacked_vs_spread" % mode] = pl["stacked"]["protected_s"] / pl["spread"]["protected_s"]
            out["placement_%s_blocked_stacked_vs_spread" % mode] = pl["stacked"]["blocked_s"] / pl["spread"]["blocked_s"]
            s, p = pl["stacked"]["agent_pull_mbps"]["median"], pl["spread"]["agent_pull_mbps"]["median"]
            out["placement_%s_pull_spread_vs_stacked" % mode] = p / s if s else None
    return out


def print_report(doc):
    res, rt = doc["results"], doc["ratios"]
    a = doc["settings"]
    ref, base = res["references"], res["baseline"]
    memcpy, memcpys = memcpy_reference(res)
    print()
    print("agents benchmark: %d ranks x %s, median of %d checkpoints (max over ranks); loopback %s"
          % (a["ranks"], fmt_size(a["size_bytes"]), a["checkpoints"], res.get("rma", {}).get("provider_line", "")))
    print()
    print("references                                          time [s]    GB/s")
    gb = a["ranks"] * a["size_bytes"] / 1e9

    def rrow(label, t):
        print("  %-48s %9.4f %7.2f" % (label, t, gb / t if t else 0))

    rrow("memcpy into a pre-faulted buffer (all ranks)", memcpy)
    print("  %-48s %s" % ("  (median of the runs' references; range", "%.4f-%.4f s)" % (min(memcpys), max(memcpys))))
    rrow("dd oflag=direct into the store dir (all ranks)", ref["dd_direct_s"])
    rrow("O_DIRECT write + fdatasync as cairn issues it", base["write_direct_s"])
    th = base["modes"]["thread"]
    print("  %-48s %9.4f" % ("checksum + hash tree stages, per rank (engine)", th["stage_checksum_s"]
                             + th["stage_hash_s"]))
    print("  %-48s %9.4f" % ("allocate + fault in one image buffer, per rank", base["prefault_s"]))
    rma = res.get("rma", {})
    for key, label in (("raw_fi_read", "raw fi_read of one image (1 rank, GB/s)"),
                       ("agent_x1", "agent path pull_image, 1 lane (GB/s)"),
                       ("agent_x%d" % a["agent_threads"], "agent path pull_image, %d lanes (GB/s)"
                        % a["agent_threads"])):
        if key in rma:
            print("  %-48s %9s %7.2f" % (label, "", rma[key]["median_gbps"]))
    print()
    print("blocked in cairn_checkpoint and until the agents hold it [s]")
    print("  %-33s %9s %7s %9s %7s %10s %7s %9s" % ("configuration", "blocked", "/memcpy", "held", "/memcpy",
                                                   "persistent", "sync/bl", "pull MB/s"))
    sync = base["modes"]["sync"]
    print("  %-33s %9.4f %7.2f %9s %7s %10.4f %7s %9s" % ("sync, no agents (baseline)", sync["blocked_s"],
                                                          sync["blocked_s"] / memcpy, "-", "-",
                                                          sync["persistent_s"], "1", "-"))
    print("  %-33s %9.4f %7.2f %9s %7s %10.4f %7.1f %9s" % ("thread, no agents", th["blocked_s"],
                                                            th["blocked_s"] / memcpy, "-", "-", th["persistent_s"],
                                                            sync["blocked_s"] / th["blocked_s"], "-"))
    for e in res.get("agent_counts", {}).get("runs", []):
        label = "%d agent%s%s, %s" % (e["agents"], "" if e["agents"] == 1 else "s",
                                      "" if e["agents_pulling"] in (0, e["agents"]) else
                                      " (%d pulled)" % e["agents_pulling"],
                                      {"nonblocking": "non-blocking", "blocking": "blocking",
                                       "lend": "lend (zero copy)"}[e.get("variant", "blocking" if e["blocking"]
                                                                           else "nonblocking")])
        print("  %-33s %9.4f %7.2f %9.4f %7.2f %10.4f %7.1f %9.0f%s" % (
            label, e["blocked_s"], e["blocked_s"] / memcpy, e["protected_s"], e["protected_s"] / memcpy,
            e["persistent_s"], sync["blocked_s"] / e["blocked_s"], e["agent_pull_mbps"]["median"],
            "  (%d not taken)" % e["protected_failed"] if e["protected_failed"] else ""))
    for e in res.get("agent_counts", {}).get("runs", []):
        rs = e.get("restart_from_agents")
        if rs:
            print("  restart after finalize, %d agent(s), %-11s %7.4f s (test %.4f + restart %.4f) = %.2f x memcpy"
                  % (e["agents"], e["variant"] + ":", rs["total_s"], rs["test_s"], rs["restart_s"],
                     rs["total_s"] / e["memcpy_s"]))
    ac = res.get("agent_counts", {})
    if ac.get("store_bytes"):
        print("  agents' store writes, all runs: %s of shard files for %s of images (%s)" % (
            fmt_size_any(ac["store_bytes"]), fmt_size_any(ac["image_bytes"]), ", ".join(ac["store_format"])))
    pl = res.get("placement", {})
    if pl:
        print()
        print("placement: A (%d ranks, 1 agent) while %d one-rank applications checkpoint back to back; medians "
              "over %d rounds x %d checkpoints [s]" % (a["ranks"], a["interferers"], a["placement_rounds"],
                                                      a["checkpoints"]))
        if "netns" in pl:
            print("  netns: each agent node a network namespace, its link from the applications limited to %s "
                  "(tc tbf)" % a["node_link_rate"])
        print("  I pulls: the interferers' pulls while A ran, per round")
        print("  %-18s %-26s %8s %8s %8s %8s %17s %7s" % ("case", "agent nodes (A first)", "blocked", "held",
                                                        "held min", "held max", "pull MB/s (range)", "I pulls"))
        for mode, cases in pl.items():
            for case in ("spread", "stacked"):
                if case not in cases:
                    continue
                p = cases[case]
                nodes = ", ".join("%s%s" % (n[5:], "" if p["node_cpus"].get(n) is None else ":cpu%d" % p["node_cpus"][n])
                                  for n in p["placement"].values())
                pull = p["agent_pull_mbps"]
                print("  %-18s %-26s %8.4f %8.4f %8.4f %8.4f %17s %7s" % (
                    "%s, %s" % (case, mode), nodes, p["blocked_s"], p["protected_s"], min(p["protected_all_s"] or [0]),
                    max(p["protected_all_s"] or [0]), "%.0f (%.0f-%.0f)" % (pull["median"], pull["min"], pull["max"]),
                    "+".join(str(x) for x in p["interferer_pulls_during_A"])))
    print()
    print("ratios (all of them in --json)")

    def show(label, keys):
        vals = ["%s %.2f" % (k[0], rt[k[1]]) for k in keys if rt.get(k[1]) is not None]
        if vals:
            print("  %-44s %s" % (label, ", ".join(vals)))

    show("sync blocked / dd oflag=direct, / memcpy", [("dd", "sync_blocked_vs_dd"), ("memcpy", "sync_blocked_vs_memcpy")])
    runs = res.get("agent_counts", {}).get("runs", [])
    keys = ["%d_%s" % (e["agents"], e.get("variant", "blocking" if e["blocking"] else "nonblocking")) for e in runs]
    short = lambda k: k.replace("_nonblocking", "nb").replace("_blocking", "b").replace("_lend", "L")  # noqa: E731
    show("agents blocked / memcpy", [(short(k), "blocked_vs_memcpy_" + k) for k in keys])
    show("sync blocked / agents blocked", [(short(k), "sync_vs_agents_blocked_" + k) for k in keys])
    show("sync blocked / agents held", [(short(k), "sync_vs_agents_held_" + k) for k in keys])
    show("agent pull rate / raw fi_read", [(short(k), "agent_pull_vs_raw_read_" + k) for k in keys])
    for mode in res.get("placement", {}):
        show("placement (%s): stacked / spread" % mode,
             [("held", "placement_%s_held_stacked_vs_spread" % mode),
              ("blocked", "placement_%s_blocked_stacked_vs_spread" % mode)])
        show("placement (%s): A's pull rate spread / stacked" % mode,
             [("", "placement_%s_pull_spread_vs_stacked" % mode)])
    m = doc["machine"]
    print()
    print("machine: %s cpus (%s), %s GiB; store %s (%s on %s); load average at start %s, end %s; %.0f s; "
          "other processes used %.2f CPUs on average meanwhile" % (
              m.get("cpus"), m.get("cpu_model", "?"), m.get("mem_gib", "?"), m["persistent"]["dir"],
              m["persistent"]["fstype"], m["persistent"]["device"], m.get("loadavg_start"), m.get("loadavg_end"),
              doc["elapsed_s"], (doc.get("noise") or {}).get("foreign_cpus", float("nan"))))


def fmt_size_any(b):
    return "%.1f MiB" % (b / (1 << 20))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="32M", help="checkpoint bytes per rank (default 32M)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks (default 4: one per agent at most)")
    ap.add_argument("--agents", default="1,2,4", help="agent counts to measure (default 1,2,4)")
    ap.add_argument("--checkpoints", type=int, default=7, help="timed checkpoints per configuration (default 7)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the memcpy, O_DIRECT and dd references")
    ap.add_argument("--rma-reps", type=int, default=5, help="repetitions in agents_rma_bench (default 5)")
    ap.add_argument("--settle-ms", type=int, default=200,
                    help="pause before each timed checkpoint, the application's compute (default 200)")
    ap.add_argument("--agent-threads", type=int, default=2, help="transfer lanes per agent (cairn-agent's default 2)")
    ap.add_argument("--interferers", type=int, default=2, help="other applications in the placement experiment")
    ap.add_argument("--interferer-settle-ms", type=int, default=50,
                    help="pause between the interferers' checkpoints (default 50)")
    ap.add_argument("--placement-variants", default="auto",
                    help="what an agent node is in the placement experiment, comma-separated: netns (network "
                         "namespace with a rate-limited link), pinned (a CPU of its own), loopback (nothing); "
                         "auto: netns,loopback as root with ip and tc, else pinned,loopback")
    ap.add_argument("--node-link-rate", default="2gbit",
                    help="tc rate of each agent node's link in the netns variant (default 2gbit)")
    ap.add_argument("--placement-rounds", type=int, default=2,
                    help="repetitions of each placement case, alternating (default 2)")
    ap.add_argument("--restart-verify", choices=["before", "while"],
                    help="restart_verify of the restarts from agent memory (default: cairn's, before)")
    ap.add_argument("--no-placement", action="store_true", help="skip the placement experiment")
    ap.add_argument("--no-counts", action="store_true", help="skip the 1/2/4-agent measurements")
    ap.add_argument("--no-rma", action="store_true", help="skip agents_rma_bench")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 MiB, 3 checkpoints, 1 and 2 agents")
    ap.add_argument("--json", metavar="FILE", help="write all results as JSON to FILE")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (default ROOT/build)")
    ap.add_argument("--dir", default="/var/tmp", help="parent of the temporary store directory (default /var/tmp)")
    ap.add_argument("--scratch-parent", default="/dev/shm", help="parent of the (unused) local-level directory")
    ap.add_argument("--wait-idle", type=int, default=0, metavar="S",
                    help="first wait up to S seconds for idle CPUs (default 0: don't)")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none", help="extra mpirun arguments")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the commands")
    args = ap.parse_args()
    if args.quick:
        args.size = "4M" if args.size == "32M" else args.size
        args.checkpoints = min(args.checkpoints, 3)
        args.reps = 1
        args.rma_reps = 3
        args.agents = "1,2" if args.agents == "1,2,4" else args.agents
        args.settle_ms = min(args.settle_ms, 50)
        args.placement_rounds = 1
    args.size_bytes = parse_size(args.size)
    args.agent_counts = [int(x) for x in args.agents.split(",") if x]
    args.cairn_bench = os.path.join(args.build, "bench", "cairn_bench")
    args.rma_bench = os.path.join(args.build, "bench", "agents_rma_bench")
    args.cli = os.path.join(args.build, "tools", "cairn", "cairn")
    args.agent = os.path.join(args.build, "tools", "agent", "cairn-agent")
    needed = [args.cairn_bench, args.cli, args.agent] + ([] if args.no_rma else [args.rma_bench])
    for path in needed:
        if not os.access(path, os.X_OK):
            sys.exit("run_agents.py: %s not found; build first (with libfabric and MPI): cmake -S %s -B %s -G Ninja "
                     "&& ninja -C %s" % (path, ROOT, args.build, args.build))
    if args.size_bytes % 4096:
        sys.exit("run_agents.py: --size must be a multiple of 4 KiB")

    pdir = tempfile.mkdtemp(prefix="cairn-agents-bench.", dir=args.dir)
    sdir = tempfile.mkdtemp(prefix="cairn-agents-bench.", dir=args.scratch_parent)
    b = Bench(args)
    doc = {"benchmark": "cairn agents (bench/run_agents.py)",
           "command": " ".join(shlex.quote(x) for x in sys.argv),
           "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "settings": {k: v for k, v in vars(args).items() if k not in ("json",)},
           "results": {}}
    info = run_core.machine_info(pdir, sdir)
    info["binaries"] = run_core.source_info(args.build)
    doc["machine"] = info

    def on_signal(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_signal)
    t0 = time.time()
    res = doc["results"]
    try:
        if args.wait_idle:
            log("run_agents: waiting up to %d s for idle CPUs" % args.wait_idle)
            if run_core.wait_idle(args.wait_idle) is None:
                log("  warning: the machine did not become idle; measuring anyway")
        info["loadavg_start"] = run_core.loadavg()
        noise = run_core.ForeignLoad()
        log("run_agents: %s per rank, %d ranks; references (dd oflag=direct)" % (fmt_size(args.size_bytes),
                                                                                 args.ranks))
        res["references"] = measure_references(b, pdir)
        log("  dd oflag=direct: %.4f s" % res["references"]["dd_direct_s"])
        log("run_agents: baseline without agents (sync and thread, local level off)")
        res["baseline"] = measure_baseline(b, pdir, sdir)
        bm = res["baseline"]["modes"]
        log("  memcpy %.4f s, sync blocked %.4f s, thread blocked %.4f s" % (
            res["baseline"]["memcpy_s"], bm["sync"]["blocked_s"], bm["thread"]["blocked_s"]))
        if not args.no_rma:
            log("run_agents: raw libfabric read vs the agent's pull path (agents_rma_bench)")
            res["rma"] = measure_rma(b)
            log("  " + ", ".join("%s %.2f GB/s" % (k, v["median_gbps"]) for k, v in res["rma"].items()
                                 if isinstance(v, dict)))
        if not args.no_counts:
            log("run_agents: agents %s, non-blocking and blocking" % args.agents)
            res["agent_counts"] = measure_agent_counts(b, pdir, sdir)
        if not args.no_placement:
            res["placement"] = measure_placements(b, pdir, sdir)
        doc["noise"] = noise.stop()
        info["loadavg_end"] = run_core.loadavg()
    finally:
        b.stop_children()
        if not args.keep:
            shutil.rmtree(pdir, ignore_errors=True)
            shutil.rmtree(sdir, ignore_errors=True)
        else:
            log("run_agents: kept %s and %s" % (pdir, sdir))
    doc["elapsed_s"] = time.time() - t0
    doc["ratios"] = ratios(doc)
    print_report(doc)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
