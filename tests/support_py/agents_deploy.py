"""A deployment of remote checkpoint agents for the tests: a real controller
and managers that launch real cairn-agent processes on 127.0.0.1
(tcp;ofi_rxm), each in its own process group, killed at the end."""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

import harness

AGENT = os.environ.get("CAIRN_TEST_AGENT")

HEARTBEAT = 0.2
TIMEOUT = 1.5
STEPS, EVERY, NBYTES = 12, 2, 256 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except (AssertionError, KeyError, json.JSONDecodeError, subprocess.TimeoutExpired) as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Deployment:
    """Controller + managers (each its own process group), killed at the end."""

    metrics = False  # (subclasses that do not call __init__ get no endpoints)

    def __init__(self, root: Path, metrics: bool = False):
        """metrics: the controller and every manager serve GET /metrics on a
        port of their choice (metrics_url gives it)."""
        self.root = root
        self.metrics = metrics
        root.mkdir(parents=True, exist_ok=True)
        self.write_secrets()
        self.address = f"127.0.0.1:{free_port()}"
        self.procs = {}
        self.start_controller()
        wait_until("the controller", lambda: self.status())

    def write_secrets(self):
        """The deployment secret (applications and tools) and the service
        secret, which controller and managers alone hold: an application
        cannot pose as a manager."""
        self.secret = self.root / "secret"
        self.service_secret = self.root / "service-secret"
        for f in (self.secret, self.service_secret):
            f.write_text(secrets.token_hex(32) + "\n")
            f.chmod(0o600)

    def start_controller(self):
        """(Re)starts the controller on its journal."""
        self.start("controller", ["controller", "--listen", self.address, "--secret-file", self.secret,
                                  "--service-secret-file", self.service_secret,
                                  "--journal", self.root / "journal", "--heartbeat-interval", HEARTBEAT,
                                  "--heartbeat-timeout", TIMEOUT, "--capacity", 2] + self.metrics_args())

    def metrics_args(self):
        return ["--metrics-listen", "127.0.0.1:0"] if self.metrics else []

    def metrics_url(self, name: str) -> str:
        """The /metrics URL of service `name` ("controller", "manager-NODE"), from its log."""
        m = wait_until(f"the metrics endpoint of {name}",
                       lambda: re.findall(r"metrics at (http://\S+/metrics)", self.log(name)))
        return m[-1]

    def start(self, name, args):
        log = open(self.root / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([str(harness.cli_path())] + [str(a) for a in args], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env=harness.base_env())

    def add_manager(self, node: str, memory_only: bool = False, agent_args=()):
        """A manager of node `node`; its agents write the application's store
        unless memory_only; agent_args are added to every agent's command."""
        args = ["manager", "--controller", self.address, "--secret-file", self.secret,
                "--service-secret-file", self.service_secret, "--node-id", node,
                "--capacity", 2, "--agent-program", AGENT, "--run-dir", self.root / f"run-{node}",
                "--stop-grace", 10] + self.metrics_args()
        template = ["--agent-id", "{agent}", "--app", "{app_name}", "--stats-file", "{stats_file}"]
        if not memory_only:
            template += ["--persistent", "{store}"]
        if memory_only or agent_args:
            for a in template + [str(a) for a in agent_args]:
                args += ["--agent-arg=" + a]
        self.start("manager-" + node, args)
        wait_until(f"node {node}", lambda: any(n["node"] == node for n in self.status()["nodes"]))

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs.pop(name)
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        p.wait(timeout=20)

    def stop_all(self):
        for name in list(self.procs):
            self.kill(name)

    def cli(self, *args, check=True):
        r = subprocess.run([str(harness.cli_path()), *map(str, args)], capture_output=True, text=True, timeout=30,
                           env=harness.base_env())
        if check:
            assert r.returncode == 0, f"cairn {' '.join(map(str, args))}: {r.returncode}\n{r.stdout}{r.stderr}"
        return r

    def status(self):
        r = self.cli("agents", "status", "--controller", self.address, "--secret-file", self.secret, "--json",
                     "--timeout", "5")
        return json.loads(r.stdout)

    def app(self, name):
        for a in self.status()["applications"]:
            if a["name"] == name:
                return a
        return None

    def admin(self, *args):
        return self.cli("agents", *args, "--controller", self.address, "--service-secret-file", self.service_secret)

    def log(self, name):
        return (self.root / f"{name}.log").read_text(errors="replace")




def agents_cfg(d: Deployment, **extra):
    cfg = dict(agents=d.address, agents_secret_file=d.secret, agents_timeout=5, agents_wait=15,
               local_enabled="false")
    cfg.update(extra)
    return cfg


def release(flag: Path):
    flag.write_text("")


def committed(job, version) -> bool:
    return (job.store / "runs" / job.run_id / "ckpt" / f"v{version:012d}" / "MANIFEST").exists()


def protected(result):
    """{(rank, version): rc} of ckpt_app's --wait-protected lines."""
    return {(int(m.group(1)), int(m.group(2))): int(m.group(3))
            for m in re.finditer(r"^rank (\d+) protected (\d+) rc=(-?\d+)$", result.stdout, re.M)}


def agent_logs(d: Deployment) -> str:
    return "".join(f.read_text(errors="replace") for f in d.root.glob("run-*/agent-*.log"))
