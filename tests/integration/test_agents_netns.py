"""Remote checkpoint agents across network namespaces (docs/design/agents.md).

test_agents.py runs everything on 127.0.0.1. Here each agent node is a network
namespace of its own, with its own address on a bridge of the root namespace:

    root namespace   10.231.N.1 (bridge)   controller, ckpt_app (2 ranks, mpirun)
    cairn-t<pid>-a   10.231.N.2 (veth)     cairn manager of node ns-a and its agents
    cairn-t<pid>-b   10.231.N.3 (veth)     cairn manager of node ns-b and its agents

so the managers register, and the agents serve the data plane (tcp;ofi_rxm),
on addresses other than loopback, and nothing works unless every address is
the one the configuration names. Needs root and `ip netns`; skipped otherwise.
The namespaces, veths and bridge are removed at the end, also on failure.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

import harness
from agents_deploy import AGENT, EVERY, NBYTES, STEPS, Deployment, agents_cfg, wait_until

pytestmark = pytest.mark.skipif(not AGENT or not harness.cli_path() or not harness.mpi_enabled(),
                                reason="needs cairn-agent (CAIRN_ENABLE_FABRIC), the cairn CLI and MPI")

APP = "agents-netns"  # run id, and the application's name at the controller


def _ip(*args, check=True, ns=None):
    cmd = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit status {r.returncode}: {r.stderr.strip()}")
    return r


class Netns:
    """Two network namespaces, each with a veth pair whose root end is a port
    of one bridge; the bridge holds the root namespace's address. Names carry
    the pid, so concurrent runs do not meet. close() removes what was made."""

    def __init__(self, letters=("a", "b")):
        pid = os.getpid()
        self.bridge = f"ct{pid}br"  # interface names: at most 15 characters
        self.namespaces = []        # made so far: what close() removes
        self.veths = []
        self.made_bridge = False
        net = self._free_subnet(pid)
        self.host = f"{net}.1"
        self.nodes = [(f"cairn-t{pid}-{c}", f"{net}.{i + 2}", f"ct{pid}{c}") for i, c in enumerate(letters)]

    @staticmethod
    def _free_subnet(pid) -> str:
        # A 10.231.N.0/24 no address or route of the root namespace is in.
        used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
        for i in range(254):
            n = (pid + i) % 254 + 1
            if f"10.231.{n}." not in used:
                return f"10.231.{n}"
        raise RuntimeError("no free 10.231.N.0/24 subnet")

    def open(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made_bridge = True
        _ip("addr", "add", f"{self.host}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, addr, veth in self.nodes:
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", veth + "n")
            self.veths.append(veth)
            _ip("link", "set", veth + "n", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("addr", "add", f"{addr}/24", "dev", veth + "n", ns=ns)
            _ip("link", "set", veth + "n", "up", ns=ns)

    def pids(self, ns) -> list:
        r = _ip("netns", "pids", ns, check=False)
        return [int(p) for p in r.stdout.split()]

    def close(self):
        # Processes still inside would keep a namespace alive after `ip netns
        # del`; they are this test's managers and agents.
        for ns in self.namespaces:
            for pid in self.pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        errors = []
        for ns in self.namespaces:  # takes the veth end inside, and so its peer
            r = _ip("netns", "del", ns, check=False)
            if r.returncode != 0:
                errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
        for veth in self.veths:
            if _ip("link", "show", veth, check=False).returncode == 0:
                _ip("link", "del", veth, check=False)
        if self.made_bridge:
            r = _ip("link", "del", self.bridge, check=False)
            if r.returncode != 0:
                errors.append(f"ip link del {self.bridge}: {r.stderr.strip()}")
        self.namespaces, self.veths, self.made_bridge = [], [], False
        assert not errors, "; ".join(errors)


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces with `ip netns`")
    if not shutil.which("ip"):
        pytest.skip("needs the `ip` command (iproute2) for network namespaces")
    n = Netns()
    try:
        try:
            n.open()
        except RuntimeError as e:
            pytest.skip(f"cannot create network namespaces, veths and a bridge here: {e}")
        yield n
    finally:
        n.close()


class NetnsDeployment(Deployment):
    """Deployment with the controller on `host` (reachable from the
    namespaces) instead of loopback, and each manager in a namespace."""

    def __init__(self, root: Path, host: str):  # not super().__init__: that one binds 127.0.0.1
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.write_secrets()
        with socket.socket() as s:
            s.bind((host, 0))
            self.address = f"{host}:{s.getsockname()[1]}"
        self.procs = {}
        self.start_controller()
        wait_until("the controller", lambda: self.status())

    def start(self, name, args, ns=None):
        log = open(self.root / f"{name}.log", "ab")
        prefix = ["ip", "netns", "exec", ns] if ns else []  # ip execs the command: same pid
        self.procs[name] = subprocess.Popen(prefix + [str(harness.cli_path())] + [str(a) for a in args],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env=harness.base_env())

    def add_netns_manager(self, node: str, ns: str, addr: str):
        """A manager in namespace ns serving on addr, its agents memory-only
        (no --persistent) with their data-plane endpoint bound to addr."""
        args = ["manager", "--controller", self.address, "--listen", f"{addr}:0", "--secret-file", self.secret,
                "--service-secret-file", self.service_secret,
                "--node-id", node, "--capacity", 1, "--agent-program", AGENT, "--run-dir", self.root / f"run-{node}",
                "--stop-grace", 10]
        for a in ["--agent-id", "{agent}", "--app-id", "{app}", "--app", "{app_name}", "--node", "{node}",
                  "--controller", "{controller}", "--stats-file", "{stats_file}", "--bind", addr]:
            args += ["--agent-arg=" + a]
        self.start("manager-" + node, args, ns=ns)
        wait_until(f"node {node}", lambda: any(n["node"] == node for n in self.status()["nodes"]))


@pytest.fixture
def deployment(tmp_path, netns):
    d = NetnsDeployment(tmp_path / "deploy", netns.host)
    yield d
    d.stop_all()


def test_agents_in_other_namespaces_hold_and_restore_a_run(netns, deployment, reference, make_job):
    """Two agent nodes in two namespaces, one agent each; rank r of ckpt_app
    (root namespace) checkpoints into agent r's memory over the bridge. The
    application is killed and restarted from those agents' memory (nothing is
    written to the store) to the state of an uninterrupted run."""
    d = deployment
    nodes = {}  # node id -> its namespace address
    for ns, addr, _ in netns.nodes:
        node = "ns-" + ns[-1]
        d.add_netns_manager(node, ns, addr)
        nodes[node] = addr
    # One agent per node from the start: registered ahead with 2 nodes as hint
    # (an application on one host would get 1); the run registers under the
    # same name and keeps them, proving it with the key kept in its run directory.
    job = make_job(2, run=APP)
    d.admin("register", "--name", APP, "--ranks", 2, "--nodes", 2, "--distribution", "round_robin",
            "--key-file", job.store / "runs" / APP / "agents.key")
    wait_until("an agent with an endpoint on each node", lambda: sorted(
        g["node"] for g in d.app(APP)["agents"] if g.get("endpoint")) == sorted(nodes))

    st = d.status()
    managers = {n["node"]: n["address"] for n in st["nodes"]}
    assert set(managers) == set(nodes), st
    for node, addr in nodes.items():
        assert re.fullmatch(re.escape(addr) + r":[1-9]\d*", managers[node]), (node, managers[node])
    for g in d.app(APP)["agents"]:
        # The data-plane name (tcp;ofi_rxm: a sockaddr) carries the bound address.
        assert socket.inet_aton(nodes[g["node"]]).hex() in g["endpoint"], g

    ref = reference(2, steps=STEPS, every=EVERY, nbytes=NBYTES)
    flag = job.root / "pause8"
    # Memory-only agents never commit: finalize must not wait for that. The
    # ranks' endpoints bind to the bridge address, which the agents reach:
    # agents_bind = auto (the default) finds it as the route to the controller.
    cfg = agents_cfg(d, agents_persist="false")
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected",
                  "--pause-after", 8, flag, **cfg)
    job.wait_paused(p, flag)
    agents = d.app(APP)["agents"]
    assert sorted(g["node"] for g in agents) == sorted(nodes), agents
    first = harness.kill_job(p)  # every rank gone (each has a process group of its own)
    prot = {(int(m.group(1)), int(m.group(2))): int(m.group(3))
            for m in re.finditer(r"^rank (\d+) protected (\d+) rc=(-?\d+)$", first.stdout, re.M)}
    assert {(r, v) for r in range(2) for v in (2, 4, 6, 8)} <= set(prot), first.describe()
    assert all(rc == 0 for rc in prot.values()), first.describe()
    assert not list(job.store.rglob("shard.*")), sorted(job.store.rglob("*"))

    r = job.run("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, **cfg).ok()
    assert r.restarted_from == 8, r.describe()
    assert r.final_hash == ref.final_hash
    # Rank r was held and restored by agent r (agent_for_rank), each on its own node.
    for rank, g in enumerate(agents):
        log = "".join(f.read_text(errors="replace") for f in (d.root / f"run-{g['node']}").glob("agent-*.log"))
        assert re.search(rf"restored {APP}/\S+ v8 rank {rank}/2", log), (rank, g, log)
