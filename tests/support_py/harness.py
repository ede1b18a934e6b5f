"""Helpers of the integration and fault tests (tests/integration, tests/fault).

They run tests/integration/ckpt_app.c under mpirun (or its serial build), read
the state dumps it writes, and look at the store and scratch directories.
The binaries are found through the environment that tests/CMakeLists.txt sets:
  CAIRN_TEST_BIN_DIR  directory of ckpt_app, ckpt_app_serial and cpp_app
  CAIRN_TEST_MPI      1 when the library was built with MPI
  CAIRN_TEST_CLI      the cairn command-line tool, when it is built
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import Optional

TIMEOUT_S = 60  # per process: a hang fails the test instead of blocking CI
CKPT = "ckpt"   # the checkpoint name ckpt_app uses

# CAIRN_* codes (include/cairn.h).
CAIRN_EINVAL = -1
CAIRN_ENOTFOUND = -2
CAIRN_EIO = -4
CAIRN_ENOSPC = -5
CAIRN_EUNUSABLE = -11
CAIRN_EEXIST = -12
CAIRN_EEARLIER = -13
CAIRN_EBUSY = -14

SERIAL = "serial"            # ckpt_app_serial: built without MPI
SERIAL_FLAG = "serial-flag"  # ckpt_app --serial: MPI build that never calls MPI


def _default_bin_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "build" / "tests" / "apps"


def bin_dir() -> Path:
    return Path(os.environ.get("CAIRN_TEST_BIN_DIR") or _default_bin_dir())


def mpi_enabled() -> bool:
    return os.environ.get("CAIRN_TEST_MPI", "1").lower() not in ("0", "off", "false", "")


def cli_path() -> Optional[Path]:
    p = os.environ.get("CAIRN_TEST_CLI")
    if p and Path(p).is_file():
        return Path(p)
    return None


def nshards(mode) -> int:
    """Number of ranks (shards per version) of a launch mode: an int or SERIAL*."""
    return 1 if mode in (SERIAL, SERIAL_FLAG) else int(mode)


def base_env() -> dict:
    # Every CAIRN_<KEY> variable is a configuration key to the library (unknown
    # ones are errors), so none of the caller's, not even CAIRN_TEST_*, is passed on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    if os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    # Two cores run four ranks: never bind, never spin hard.
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return env


@dataclasses.dataclass
class Result:
    cmd: list
    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def describe(self) -> str:
        return (f"command: {' '.join(map(str, self.cmd))}\nexit status: {self.rc}"
                f"{' (timed out)' if self.timed_out else ''}\n--- stdout ---\n{self.stdout}"
                f"--- stderr ---\n{self.stderr}")

    def ok(self) -> "Result":
        assert not self.timed_out and self.rc == 0, "ckpt_app failed\n" + self.describe()
        return self

    @property
    def restarted_from(self) -> Optional[int]:
        m = re.search(r"^restarted from version (\d+)$", self.stdout, re.M)
        if m:
            return int(m.group(1))
        assert re.search(r"^starting from scratch$", self.stdout, re.M), \
            "neither 'restarted from' nor 'starting from scratch'\n" + self.describe()
        return None

    @property
    def final_hash(self) -> str:
        m = re.search(r"^final hash ([0-9a-f]{16})$", self.stdout, re.M)
        assert m, "no final hash\n" + self.describe()
        return m.group(1)

    def waits(self) -> dict:
        """{(rank, version): (rc, message)} of the --wait-persistent lines."""
        out = {}
        for m in re.finditer(r"^rank (\d+) wait (\d+) rc=(-?\d+)(?: msg=(.*))?$", self.stdout, re.M):
            out[(int(m.group(1)), int(m.group(2)))] = (int(m.group(3)), m.group(4) or "")
        return out

    def failed_checkpoints(self) -> dict:
        """{(rank, version): (rc, message)} of the --keep-going checkpoint lines."""
        out = {}
        for m in re.finditer(r"^rank (\d+) checkpoint (\d+) rc=(-?\d+) msg=(.*)$", self.stdout, re.M):
            out[(int(m.group(1)), int(m.group(2)))] = (int(m.group(3)), m.group(4))
        return out

    def restart_errors(self) -> dict:
        """{rank: (rc, message)} of the --fresh-on-error restart_test lines."""
        return {int(m.group(1)): (int(m.group(2)), m.group(3))
                for m in re.finditer(r"^rank (\d+) restart_test rc=(-?\d+) msg=(.*)$", self.stdout, re.M)}

    def finalize_errors(self) -> dict:
        return {int(m.group(1)): int(m.group(2))
                for m in re.finditer(r"^rank (\d+) finalize rc=(-?\d+)", self.stdout, re.M)}


def start_process(cmd: list, env: dict, cwd: Path) -> subprocess.Popen:
    """Starts cmd in its own process group (see finish_process)."""
    p = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    p.cmd = cmd
    return p


def finish_process(p: subprocess.Popen, timeout: float = TIMEOUT_S) -> Result:
    """Waits for a started process; on timeout its whole group is killed."""
    try:
        out, err = p.communicate(timeout=timeout)
        return Result(p.cmd, p.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Result(p.cmd, p.returncode, out, err, timed_out=True)


def run_process(cmd: list, env: dict, cwd: Path, timeout: float = TIMEOUT_S) -> Result:
    """Runs cmd in its own process group; on timeout the whole group is killed."""
    return finish_process(start_process(cmd, env, cwd), timeout)


class Job:
    """One run id of ckpt_app with its own scratch and persistent directories.

    mode is the number of MPI ranks, SERIAL or SERIAL_FLAG. Configuration keys
    given to run() become CAIRN_<KEY> variables; the fault hook is the key
    fault_inject (CAIRN_FAULT_INJECT)."""

    def __init__(self, root: Path, mode, run: str = "testrun", scratch: Optional[Path] = None,
                 store: Optional[Path] = None):
        self.root = Path(root)
        self.mode = mode
        self.nranks = nshards(mode)
        self.run_id = run
        self.scratch = Path(scratch) if scratch else self.root / "scratch"
        self.store = Path(store) if store else self.root / "store"
        self.dumps = self.root / "dumps"
        self.dumps.mkdir(parents=True, exist_ok=True)

    def env(self, **cfg) -> dict:
        env = base_env()
        env["CAIRN_SCRATCH"] = str(self.scratch)
        env["CAIRN_PERSISTENT"] = str(self.store)
        env["CAIRN_RUN"] = self.run_id
        # Every version is kept (the default keeps the newest 3): the tests
        # look at whole histories. A test of retention passes keep_persistent.
        env["CAIRN_KEEP_PERSISTENT"] = "0"
        # The node-local versions stay after a normal end (the default removes
        # them): the tests restart from them after complete runs. A test of
        # the removal passes keep_local_after_finalize.
        env["CAIRN_KEEP_LOCAL_AFTER_FINALIZE"] = "true"
        for k, v in cfg.items():
            env["CAIRN_" + k.upper()] = str(v)
        return env

    def command(self, args) -> list:
        if self.mode == SERIAL:
            return [bin_dir() / "ckpt_app_serial", *args]
        if self.mode == SERIAL_FLAG:
            return [bin_dir() / "ckpt_app", "--serial", *args]
        return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(self.nranks),
                bin_dir() / "ckpt_app", *args]

    def run(self, *args, timeout: float = TIMEOUT_S, **cfg) -> Result:
        return run_process(self.command(list(args)), self.env(**cfg), self.root, timeout)

    def start(self, *args, **cfg) -> subprocess.Popen:
        """As run, in the background; finish with harness.finish_process."""
        return start_process(self.command(list(args)), self.env(**cfg), self.root)

    def wait_paused(self, p: subprocess.Popen, flag: Path, timeout: float = TIMEOUT_S) -> None:
        """Waits until every rank of a run started with --pause-after V flag is paused."""
        deadline = time.monotonic() + timeout
        while not all(Path(f"{flag}.ready.{r}").exists() for r in range(self.nranks)):
            if p.poll() is not None:
                raise AssertionError("ckpt_app ended before pausing\n" + finish_process(p).describe())
            if time.monotonic() > deadline:
                os.killpg(p.pid, signal.SIGKILL)
                raise AssertionError("ckpt_app did not pause\n" + finish_process(p).describe())
            time.sleep(0.02)

    # ---- the levels -------------------------------------------------------
    def version_dir(self, level: str, version: int) -> Path:
        root = self.scratch if level == "local" else self.store
        return root / "runs" / self.run_id / CKPT / f"v{version:012d}"

    def shard(self, level: str, version: int, rank: int) -> Path:
        return self.version_dir(level, version) / f"shard.{rank:06d}"

    def manifest(self, version: int) -> Path:
        return self.version_dir("persistent", version) / "MANIFEST"

    def versions(self, level: str) -> list:
        d = self.version_dir(level, 0).parent
        if not d.is_dir():
            return []
        return sorted(int(p.name[1:]) for p in d.iterdir() if re.fullmatch(r"v\d{12}", p.name))

    def committed(self) -> list:
        """Versions committed at the persistent level (MANIFEST present)."""
        return [v for v in self.versions("persistent") if self.manifest(v).is_file()]

    def local_complete(self) -> list:
        """Versions of which every rank has a committed local shard."""
        return [v for v in self.versions("local")
                if all(self.shard("local", v, r).is_file() for r in range(self.nranks))]

    def restorable(self) -> Optional[int]:
        """The newest version committed at some level on every rank."""
        vs = set(self.committed()) | set(self.local_complete())
        return max(vs) if vs else None

    def snapshot(self) -> dict:
        """{path relative to its level: bytes} of every file this run's
        checkpoints have at the local and persistent levels."""
        out = {}
        for level, root in (("local", self.scratch), ("persistent", self.store)):
            d = root / "runs" / self.run_id / CKPT
            if d.is_dir():
                for f in sorted(d.rglob("*")):
                    if f.is_file():
                        out[f"{level}/{f.relative_to(d)}"] = f.read_bytes()
        return out

    # ---- dumps ------------------------------------------------------------
    def read_dump(self, prefix: Path) -> list:
        return [(Path(f"{prefix}.{r}")).read_bytes() for r in range(self.nranks)]


class NodeJob(Job):
    """NODES emulated nodes of RPN ranks each: every node is an MPMD block of
    consecutive ranks with its own node id (CAIRN_NODE_ID) and its own
    node-local directory, so wiping a directory loses exactly what that node
    held."""

    def __init__(self, root, nodes, rpn, run="nodes"):
        super().__init__(root, nodes * rpn, run=run)
        self.nodes, self.rpn = nodes, rpn

    def node_dir(self, i) -> Path:
        return self.scratch / f"node{i}"

    def command(self, args):
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp"]
        for i in range(self.nodes):
            cmd += ([":"] if i else []) + ["-n", str(self.rpn), "-x", f"CAIRN_SCRATCH={self.node_dir(i)}",
                                           "-x", f"CAIRN_NODE_ID=node{i}", bin_dir() / "ckpt_app", *args]
        return cmd

    def local_dir(self, rank, version) -> Path:
        return self.node_dir(rank // self.rpn) / "runs" / self.run_id / CKPT / f"v{version:012d}"

    def lose_node(self, i):
        shutil.rmtree(self.node_dir(i), ignore_errors=True)


class Reference:
    """An uninterrupted run: the state after each checkpoint, and the final hash."""

    def __init__(self, job: Job, result: Result, every: int, nbytes: int, versions: list):
        self.job = job
        self.every = every
        self.nbytes = nbytes
        self.result = result
        self.final_hash = result.final_hash
        self.versions = versions
        self._dumps = {}

    def app_args(self) -> list:
        """The options that give a run the state of this reference."""
        return ["--every", self.every, "--bytes", self.nbytes]

    def dump(self, version: int) -> list:
        assert version in self.versions, f"the reference run has no version {version}"
        if version not in self._dumps:
            self._dumps[version] = self.job.read_dump(self.job.dumps / f"ref.v{version}")
        return self._dumps[version]


def run_reference(root: Path, mode, steps: int, every: int, nbytes: int) -> Reference:
    job = Job(root, mode, run="reference")
    res = job.run("--steps", steps, "--every", every, "--bytes", nbytes, "--dump-every", job.dumps / "ref").ok()
    assert res.restarted_from is None
    return Reference(job, res, every, nbytes, list(range(every, steps + 1, every)))


def assert_same_state(expected: list, actual: list, what: str) -> None:
    """Bit-for-bit comparison of per-rank dumps, naming the first difference."""
    assert len(expected) == len(actual), f"{what}: {len(actual)} rank dumps, expected {len(expected)}"
    for rank, (e, a) in enumerate(zip(expected, actual)):
        if e == a:
            continue
        if len(e) != len(a):
            raise AssertionError(f"{what}: rank {rank} restored {len(a)} bytes, expected {len(e)}")
        first = next(i for i in range(len(e)) if e[i] != a[i])
        raise AssertionError(f"{what}: rank {rank} differs from the uninterrupted run first at byte {first} "
                             f"(expected {e[first]:#04x}, got {a[first]:#04x})")


# ---- shard files (docs/format/shard.md: 64-byte header, names, region table) ----

def region_table(path: Path) -> dict:
    """{region name: (offset, length)} of a shard file, plus '<header>': (0, header bytes)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"CAIRNSHD", f"{path} is not a shard"
    _fmt, _flags, hb, nreg = struct.unpack_from("<IIII", data, 8)
    pos = 64
    run_len, name_len, _ = struct.unpack_from("<HHI", data, pos)
    pos += 8 + run_len + name_len
    out = {"<header>": (0, hb)}
    for _ in range(nreg):
        nl, _type, flags, _comp, ndims, _res = struct.unpack_from("<HBBBBH", data, pos)
        pos += 8
        _count, offset, length, _ck = struct.unpack_from("<QQQQ", data, pos)
        # dims, then (format 2, flag bit 1: global layout) global shape and start.
        pos += 32 + 8 * ndims * (3 if flags & 2 else 1)
        name = data[pos:pos + nl].decode()
        pos += nl
        out[name] = (offset, length)
    return out


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        assert len(b) == 1, f"{path} has no byte {offset}"
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def flip_in_region(path: Path, region: str) -> int:
    """Flips the middle byte of `region` ('<header>' for the region table) and returns its offset."""
    offset, length = region_table(path)[region]
    at = offset + length // 2
    flip_byte(path, at)
    return at


def remove_tree(path: Path) -> None:
    if Path(path).exists():
        shutil.rmtree(path)


def run_cli(*args, timeout: float = TIMEOUT_S) -> Result:
    cli = cli_path()
    assert cli is not None
    return run_process([cli, *args], base_env(), Path("/"), timeout)


def wait_rank_pids(mpirun_pid: int, n: int, timeout: float = 60) -> dict:
    """rank_pids once all n ranks exist (mpirun starts them late on a loaded
    machine), or what exists when mpirun ended or the timeout passed."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = rank_pids(mpirun_pid)
        if len(ranks) >= n or time.monotonic() > deadline or not Path(f"/proc/{mpirun_pid}").exists():
            return ranks
        time.sleep(0.02)


def rank_pids(mpirun_pid: int) -> dict:
    """{rank: pid} of the ckpt_app processes mpirun started."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != mpirun_pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(kv.split(b"=", 1)[1])] = int(entry.name)
    return out


def kill_job(p: subprocess.Popen, timeout: float = 10.0) -> Result:
    """SIGKILLs every rank of an mpirun started by start_process, then mpirun.
    Open MPI puts each rank in a process group of its own, so killing
    mpirun's group alone leaves the ranks running; this returns only once
    none of them exists any more."""
    ranks = list(rank_pids(p.pid).values())
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    result = finish_process(p)
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid) for pid in ranks):
        assert time.monotonic() < deadline, f"ranks {ranks} still run after SIGKILL"
        time.sleep(0.01)
    return result


def daemons(store: Path) -> list:
    """PIDs of the cairnd processes serving a job whose persistent level is `store`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not argv or not argv[0].endswith(b"cairnd"):
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            state = _proc_state(int(entry.name))
        except (OSError, ValueError):
            continue
        if f"CAIRN_PERSISTENT={store}".encode() in env and "Z" not in state:
            out.append(int(entry.name))
    return out


def _proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[0]
    except (OSError, ValueError):
        return "X"
