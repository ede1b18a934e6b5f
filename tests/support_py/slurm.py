#!/usr/bin/env python3
"""A single-host Slurm for the tests (docs/design/slurm.md).

SlurmRig starts, under one directory, a Slurm cluster from the Debian packages
(slurm-wlm, munge): one munged with its own key and socket, one slurmctld and
one `slurmd -N <node>` per emulated node (n1, n2, ...), all on 127.0.0.1 with
ports chosen free, process tracking by proctrack/linuxproc (no cgroups), no
accounting. Everything stays under the directory: slurm.conf, the key, the
state and spool directories, the logs (log/) and rig.json, which records every
daemon's PID as soon as it is started. Commands (sbatch, squeue, scontrol)
reach the rig through SLURM_CONF (rig.env()).

    with SlurmRig(tmp / "slurm", nodes=2) as rig:   # start() ... stop()
        job = rig.sbatch(script, "-N2", "-n4", "--time=1")
        state = rig.wait(job, timeout=150)          # "COMPLETED", "TIMEOUT", ...

The time limits Slurm can set are whole minutes; the rig makes the rest as short
as Slurm allows: OverTimeLimit=0 (killed at the limit), KillWait=2 (SIGKILL 2 s
after SIGTERM). MinJobAge=300 (Slurm's default: a finished job stays known for 5
minutes; with 10 s, a job that ended while a test still checked another one
side by side was forgotten before its final state was seen, on a loaded
machine). slurmctld checks time limits and
sends --signal warnings from its periodic background work, so a job with a
1-minute limit and --signal=USR1@20 gets the signal about 30 to 40 s after it
starts and is killed about 60 to 70 s after it starts.

Teardown stops the slurmds, slurmctld and munged by their PIDs (SIGTERM, then
SIGKILL after a grace period). A PID is signalled only while /proc/<pid>/cmdline
still names this rig's files, so a recycled PID is never touched. A rig that
cannot start raises SlurmError with the reason and the tail of the daemon's log,
after stopping whatever it had started; it never skips silently.

Must run as root (slurmd runs jobs as their user; the rig's SlurmUser is root).

Command line (for people; the daemons outlive the command):
    python3 tests/support_py/slurm.py start DIR [--nodes 2] [--cpus 2]
    python3 tests/support_py/slurm.py stop DIR
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

STATE_FILE = "rig.json"
REQUIRED_PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")
# What scripts/install-deps.sh installs for these programs.
PACKAGES = "slurm-wlm munge"
SOCKET_PATH_MAX = 107


class SlurmError(RuntimeError):
    """The rig could not be started or stopped, or a job could not be run; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text[-lines:])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purpose.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rfind(")") + 2] != "Z"
    except OSError:
        return False


class SlurmRig:
    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2):
        self.root = Path(root).resolve()
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.conf = self.root / "slurm.conf"
        self.log = self.root / "log"
        self.procs: dict[str, int] = {}  # daemon name -> PID
        self._children: list[subprocess.Popen] = []
        self.final_states: dict[str, str] = {}

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "SlurmRig":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self, extra: Optional[dict] = None, base: Optional[dict] = None) -> dict:
        """The environment of the rig's commands: `base` (default: this process's) with
        SLURM_CONF set, nothing of an enclosing job, then `extra`."""
        e = dict(os.environ if base is None else base)
        e["SLURM_CONF"] = str(self.conf)
        # Nothing of an enclosing job leaks into the rig's commands.
        for k in list(e):
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del e[k]
        if extra:
            e.update(extra)
        return e

    def _check_programs(self) -> None:
        if os.geteuid() != 0:
            raise SlurmError("the Slurm rig must run as root (slurmd starts jobs as their user)")
        missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
        if missing:
            raise SlurmError(f"programs not found: {', '.join(missing)}; install the Debian packages {PACKAGES} "
                             "(scripts/install-deps.sh)")

    def _which(self, prog: str) -> str:
        return shutil.which(prog) or str(Path("/usr/sbin", prog))

    def _save(self) -> None:
        (self.root / STATE_FILE).write_text(json.dumps({"procs": self.procs, "conf": str(self.conf)}))

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.log / f"{name}.out", "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env(), start_new_session=True)
        out.close()
        self._children.append(p)
        self.procs[name] = p.pid
        self._save()

    def _write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        sock = self.root / "run" / "munge.sock"
        if len(str(sock)) > SOCKET_PATH_MAX:
            raise SlurmError(f"the rig's path is too long for a socket name: {sock}")
        ctld_port = free_port()
        lines = [
            f"ClusterName=cairn{os.getpid()}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={sock}",
            "CredType=cred/munge",
            f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool/%n",
            f"SlurmctldPidFile={self.root}/run/slurmctld.pid",
            f"SlurmdPidFile={self.root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log}/slurmctld.log",
            f"SlurmdLogFile={self.log}/slurmd-%n.log",
            f"PlugStackConfig={self.root}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=300",
            "KillWait=2",
            "OverTimeLimit=0",
            "InactiveLimit=0",
            "Waittime=0",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
        ]
        for n in self.nodes:
            lines.append(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} "
                         f"CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "plugstack.conf").write_text("")  # not the host's /etc/slurm/plugstack.conf

    def start(self, timeout: float = 30) -> None:
        self._check_programs()
        if self.root.exists() and (self.root / STATE_FILE).exists():
            raise SlurmError(f"{self.root} holds a rig already (stop it first)")
        for d in ("log", "state", "run", *[f"spool/{n}" for n in self.nodes]):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        try:
            self._write_config()
            key = self.root / "munge.key"
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)
            sock = self.root / "run" / "munge.sock"
            self._spawn("munged", [self._which("munged"), "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                                   f"--pid-file={self.root}/run/munged.pid", f"--log-file={self.log}/munged.log",
                                   f"--seed-file={self.root}/run/munged.seed"])
            self._wait_for(lambda: sock.exists(), timeout, "munged", self.log / "munged.out")
            self._spawn("slurmctld", [self._which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait_for(self._ctld_up, timeout, "slurmctld", self.log / "slurmctld.log")
            for n in self.nodes:
                self._spawn(f"slurmd-{n}", [self._which("slurmd"), "-D", "-N", n, "-f", str(self.conf)])
            self._wait_for(self._nodes_idle, timeout, "slurmd", self.log / f"slurmd-{self.nodes[-1]}.log")
        except BaseException:
            self.stop(check=False)
            raise

    def _wait_for(self, cond, timeout: float, who: str, log: Path) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, pid in self.procs.items():
                if not pid_alive(pid):
                    raise SlurmError(f"{name} (pid {pid}) exited while the rig started; its log ends with:\n"
                                     f"{tail(self.log / (name + '.out'))}\n{tail(log)}")
            if cond():
                return
            time.sleep(0.2)
        raise SlurmError(f"{who} did not come up within {timeout:.0f} s; {log} ends with:\n{tail(log)}")

    def _ctld_up(self) -> bool:
        r = subprocess.run(["scontrol", "ping"], env=self.env(), capture_output=True, text=True)
        return r.returncode == 0 and "UP" in r.stdout

    def _nodes_idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True, text=True)
        if r.returncode != 0:
            return False
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def _ours(self, pid: int) -> bool:
        """The PID still runs one of this rig's daemons (its command line names the rig)."""
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        return str(self.root) in cmd

    def stop(self, check: bool = True, grace: float = 10) -> None:
        order = [f"slurmd-{n}" for n in self.nodes] + ["slurmctld", "munged"]
        left = []
        for name in order:
            pid = self.procs.get(name)
            if pid is None:
                continue
            if pid_alive(pid) and self._ours(pid):
                os.kill(pid, signal.SIGTERM)
                end = time.monotonic() + grace
                while pid_alive(pid) and time.monotonic() < end:
                    time.sleep(0.1)
                if pid_alive(pid) and self._ours(pid):
                    os.kill(pid, signal.SIGKILL)
                    time.sleep(0.2)
            if pid_alive(pid):
                left.append(f"{name} ({pid})")
            for p in self._children:
                if p.pid == pid:
                    p.wait(timeout=5)
            del self.procs[name]
            self._save()
        if self.procs == {} and (self.root / STATE_FILE).exists():
            (self.root / STATE_FILE).unlink()
        if left and check:
            raise SlurmError(f"could not stop {', '.join(left)}")

    # ----------------------------------------------------------------- jobs
    def sbatch(self, script: Path, *args: str, env: Optional[dict] = None) -> str:
        """Submits script; `env` is the job's environment (sbatch exports it), SLURM_CONF added."""
        r = subprocess.run(["sbatch", "--parsable", *args, str(script)], env=self.env(base=env), capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(args)} {script} failed: {r.stderr.strip()}\n"
                             f"slurmctld.log ends with:\n{tail(self.log / 'slurmctld.log')}")
        return r.stdout.strip().split(";")[0]

    def scancel(self, job: str) -> None:
        r = subprocess.run(["scancel", job], env=self.env(), capture_output=True, text=True)
        if r.returncode != 0:
            raise SlurmError(f"scancel {job} failed: {r.stderr.strip()}")

    def job_state(self, job: str) -> Optional[str]:
        """The job's state (PENDING, RUNNING, COMPLETED, TIMEOUT, FAILED, ...), None once slurmctld forgot it."""
        r = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env(), capture_output=True, text=True)
        if r.returncode != 0:
            return None
        for field in r.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return None

    def wait(self, job: str, timeout: float) -> str:
        """Waits until the job has ended; returns its final state."""
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            s = self.job_state(job)
            if s is None:
                if last is None:
                    raise SlurmError(f"job {job} is unknown to slurmctld")
                break  # forgotten (MinJobAge) after it ended: its last state stands
            last = s
            if s not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                break
            time.sleep(0.5)
        else:
            raise SlurmError(f"job {job} still {last} after {timeout:.0f} s; slurmctld.log ends with:\n"
                             f"{tail(self.log / 'slurmctld.log')}")
        if last in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
            raise SlurmError(f"job {job} ended but slurmctld forgot it before its final state was seen "
                             f"(last seen {last}; MinJobAge too small?)")
        self.final_states[job] = last
        return last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus", type=int, default=2)
    a = ap.parse_args()
    rig = SlurmRig(a.dir, a.nodes, a.cpus)
    if a.action == "start":
        rig.start()
        print(f"export SLURM_CONF={rig.conf}")
        return 0
    state = json.loads((a.dir / STATE_FILE).read_text())
    rig.procs = {k: int(v) for k, v in state["procs"].items()}
    rig.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
