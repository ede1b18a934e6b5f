#!/usr/bin/env python3
"""A single-host CephFS for the tests and benchmarks (docs/design/cephfs_rig.md).

CephFSRig starts, under one directory, a Ceph cluster from the Debian packages:
one monitor, one manager, N OSDs on memstore (objects kept in the OSD's memory),
one MDS, all on 127.0.0.1 with keyless auth, and the file system on a metadata
and a data pool of size 1. It then mounts the file system with one `ceph-fuse`
per emulated node: separate clients, so that writers on different "nodes" hold
and contend for capabilities as on a real cluster.

Everything the rig writes stays under its directory: ceph.conf, the daemons'
data, their logs (log/), admin sockets (run/, or a short directory in /tmp when
the rig's path is too long for a socket name), the mount points (mnt/node<i>)
and rig.json, the state file that records every daemon's PID as soon as it is
started. Teardown goes by those PIDs, in order: unmount and stop the clients,
then the MDS, the OSDs, the manager and the monitor. A ceph-fuse whose cluster
is gone hangs on unmount, hence clients first; a client that still does not
exit is killed and its mount detached lazily. A PID is signalled only while
/proc/<pid>/cmdline still names this rig's ceph.conf, so a recycled PID is
never touched.

    with CephFSRig(tmp / "rig", clients=2) as rig:     # start() ... stop()
        a, b = rig.mounts
        rig.set_layout(a / "dir", stripe_unit=1 << 20, stripe_count=3, object_size=4 << 20)

A rig that fails to start raises CephFSError with the tail of the log of the
daemon at fault, after stopping whatever it had started. stop() raises
CephFSError when something could not be stopped or unmounted, after trying
everything else.

Command line (for people and benchmarks; the daemons outlive the command):
    python3 tests/support_py/cephfs.py start DIR [--clients 2] [--osds 3]
    python3 tests/support_py/cephfs.py status DIR
    python3 tests/support_py/cephfs.py stop DIR
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

FS_NAME = "cephfs"
METADATA_POOL = "cephfs_metadata"
DATA_POOL = "cephfs_data"
STATE_FILE = "rig.json"
LAYOUT_FIELDS = ("stripe_unit", "stripe_count", "object_size", "pool")
REQUIRED_PROGRAMS = ("ceph-mon", "ceph-osd", "ceph-mds", "ceph-mgr", "ceph-fuse", "ceph", "monmaptool")
# What scripts/install-deps.sh installs for these programs.
PACKAGES = "ceph-mon ceph-osd ceph-mds ceph-mgr ceph-fuse attr fuse3"

# The order of teardown; clients are handled before all of these.
SERVER_STOP_ORDER = ("mds", "osd", "mgr", "mon")
# sockaddr_un.sun_path holds 108 bytes with the terminating NUL.
SOCKET_PATH_MAX = 107


class CephFSError(RuntimeError):
    """The rig could not be started or stopped; the message says why."""


# ---------------------------------------------------------------- helpers

def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        return f"({path}: {e.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def _unescape_mountinfo(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def fuse_mounts() -> dict:
    """{mount point: file system type} of every FUSE mount of this mount namespace."""
    mounts = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype = right.split()[0] if right else ""
        if len(fields) >= 5 and fstype.startswith("fuse"):
            mounts[_unescape_mountinfo(fields[4])] = fstype
    return mounts


def mounts_under(root: Path) -> list:
    """FUSE mount points at or below root."""
    root_s = str(Path(root).resolve())
    return sorted(m for m in fuse_mounts() if m == root_s or m.startswith(root_s + "/"))


def _pid_cmdline(pid: int) -> Optional[list]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _pid_state(pid: int) -> Optional[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def processes_using(conf: Path) -> list:
    """PIDs of live processes whose command line names conf (this rig's daemons)."""
    conf_s = str(conf)
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            cmd = _pid_cmdline(int(d.name))
            if cmd and conf_s in cmd and _pid_state(int(d.name)) not in (None, "Z"):
                pids.append(int(d.name))
    return sorted(pids)


_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # Runs in the child before exec: SIGKILL when the process that started the
    # rig dies without stopping it (a test run killed by its timeout).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def parse_layout(value) -> dict:
    """'stripe_unit=4194304 stripe_count=1 object_size=4194304 pool=cephfs_data'
    -> {'stripe_unit': 4194304, 'stripe_count': 1, 'object_size': 4194304, 'pool': 'cephfs_data'}"""
    if isinstance(value, bytes):
        value = value.decode()
    out = {}
    for item in value.split():
        k, _, v = item.partition("=")
        out[k] = int(v) if v.isdigit() else v
    return out


def _layout_kind(path: Path) -> str:
    return "dir" if Path(path).is_dir() else "file"


def get_layout(path, kind: Optional[str] = None) -> Optional[dict]:
    """The CephFS layout of a file or directory (ceph.file.layout / ceph.dir.layout),
    as a dict of stripe_unit, stripe_count, object_size, pool. None for a
    directory without a layout of its own (its files take the nearest
    ancestor's, see effective_layout)."""
    kind = kind or _layout_kind(path)
    try:
        return parse_layout(os.getxattr(path, f"ceph.{kind}.layout"))
    except OSError as e:
        if e.errno == errno.ENODATA and kind == "dir":
            return None
        raise


def effective_layout(path) -> dict:
    """The layout new files created in directory path get."""
    p = Path(path)
    while True:
        layout = get_layout(p, "dir")
        if layout is not None:
            return layout
        if p.parent == p or not _on_same_fs(p.parent, p):
            raise CephFSError(f"no CephFS layout found at or above {path}")
        p = p.parent


def _on_other_fs(mount) -> bool:
    """mount is the root of a file system other than its parent's."""
    return not _on_same_fs(Path(mount), Path(mount).parent)


def _on_same_fs(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def set_layout(path, kind: Optional[str] = None, **fields) -> dict:
    """Sets layout fields (stripe_unit, stripe_count, object_size in bytes, pool)
    of a directory (applies to files created in it afterwards) or of an empty
    file, through the ceph.<kind>.layout.<field> xattrs; returns the layout read
    back. Ceph checks every single change (object_size must be a multiple of
    stripe_unit, itself a multiple of 64 KiB), so when stripe_unit and
    object_size both change, stripe_unit goes to 64 KiB first, which divides
    every valid object_size: no order of the target values is ever refused
    half-way."""
    kind = kind or _layout_kind(path)
    unknown = set(fields) - set(LAYOUT_FIELDS)
    if unknown:
        raise ValueError(f"unknown layout fields {sorted(unknown)}; known: {LAYOUT_FIELDS}")
    su, osz = fields.get("stripe_unit"), fields.get("object_size")
    if su is not None and osz is not None and (su <= 0 or osz % su or su % 65536):
        raise ValueError(f"invalid layout: object_size {osz} must be a multiple of stripe_unit {su}, "
                         "itself a multiple of 65536")
    steps = []
    if su is not None and osz is not None:
        steps += [("stripe_unit", 65536), ("object_size", osz), ("stripe_unit", su)]
    elif su is not None:
        steps.append(("stripe_unit", su))
    elif osz is not None:
        steps.append(("object_size", osz))
    for k in ("stripe_count", "pool"):
        if k in fields:
            steps.append((k, fields[k]))
    for k, v in steps:
        name = f"ceph.{kind}.layout.{k}"
        try:
            os.setxattr(path, name, str(v).encode())
        except OSError as e:
            raise OSError(e.errno, f"setxattr {name}={v} on {path}: {e.strerror}") from None
    return get_layout(path, kind)


# ---------------------------------------------------------------- the rig

class CephFSRig:
    """A single-host CephFS under root (created if missing): see the module doc.

    clients: number of ceph-fuse mounts (emulated nodes); osds: number of OSDs;
    memstore_mib: capacity each OSD reports (its objects live in its memory, so
    this also bounds the memory the data takes); mounts: mount points (default
    root/mnt/node<i>); die_with_parent: the daemons are killed if the process
    that started them dies (for test fixtures; not for the command line);
    timeout: seconds for each start-up step; conf_extra: {section: {option:
    value}} added to the generated ceph.conf (e.g. {"client": {"client_oc":
    "false"}}), where later values override the rig's.

    Not thread-safe. start() and stop() may be called again; stop() of a rig
    that was never started (or attach()ed) stops what its state file lists."""

    def __init__(self, root, clients: int = 2, osds: int = 3, memstore_mib: int = 512,
                 mounts: Optional[list] = None, die_with_parent: bool = False, timeout: float = 90.0,
                 data_pgs: int = 32, metadata_pgs: int = 8, conf_extra: Optional[dict] = None):
        self.root = Path(root).resolve()
        self.nclients = clients
        self.nosds = osds
        self.memstore_mib = memstore_mib
        self.mount_points = [Path(m).resolve() for m in mounts] if mounts else \
            [self.root / "mnt" / f"node{i}" for i in range(clients)]
        if len(self.mount_points) != clients:
            raise ValueError(f"{clients} clients but {len(self.mount_points)} mount points")
        self.die_with_parent = die_with_parent
        self.timeout = timeout
        self.data_pgs = data_pgs
        self.metadata_pgs = metadata_pgs
        self.conf_extra = conf_extra or {}
        self.conf = self.root / "ceph.conf"
        self.log_dir = self.root / "log"
        self.fsid = None
        self.mon_port = None
        self.asok_dir = None
        self.daemons = []      # [{"name", "kind", "pid", "log", "out"}] in start order
        self.clients = []      # [{"name", "pid", "mount", "log", "out"}]
        self.timings = {}      # seconds of each phase of the last start() / stop()
        self._popen = {}       # pid -> Popen of the processes this object started

    # ------------------------------------------------------------ state
    @property
    def mounts(self) -> list:
        return [Path(c["mount"]) for c in self.clients]

    def _state(self) -> dict:
        return {"root": str(self.root), "conf": str(self.conf), "fsid": self.fsid,
                "mon_port": self.mon_port, "asok_dir": self.asok_dir, "osds": self.nosds,
                "memstore_mib": self.memstore_mib, "daemons": self.daemons, "clients": self.clients,
                "timings": self.timings}

    def _save(self):
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self._state(), indent=1) + "\n")
        os.replace(tmp, self.root / STATE_FILE)

    @classmethod
    def attach(cls, root) -> "CephFSRig":
        """The rig whose state file is root/rig.json (started by another process)."""
        root = Path(root).resolve()
        try:
            st = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError) as e:
            raise CephFSError(f"no rig state in {root}: {e}") from None
        clients = st.get("clients", [])
        rig = cls(root, clients=len(clients), osds=st.get("osds", 0), memstore_mib=st.get("memstore_mib", 0),
                  mounts=[c["mount"] for c in clients] or None)
        rig.fsid, rig.mon_port, rig.asok_dir = st.get("fsid"), st.get("mon_port"), st.get("asok_dir")
        rig.daemons, rig.clients = st.get("daemons", []), clients
        rig.timings = st.get("timings", {})
        return rig

    # ------------------------------------------------------------ start
    def __enter__(self) -> "CephFSRig":
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> "CephFSRig":
        """Starts the cluster and mounts the clients; returns self. On failure
        everything started is stopped and CephFSError says why."""
        missing = [p for p in REQUIRED_PROGRAMS if not shutil.which(p)]
        if missing:
            raise CephFSError(f"{', '.join(missing)} not found on PATH: install the Debian packages "
                              f"{PACKAGES} (scripts/install-deps.sh)")
        if not os.path.exists("/dev/fuse"):
            raise CephFSError("/dev/fuse does not exist: ceph-fuse cannot mount")
        if not (shutil.which("fusermount3") or shutil.which("fusermount")):
            raise CephFSError("fusermount3 not found: install fuse3")
        self.root.mkdir(parents=True, exist_ok=True)
        if (self.root / STATE_FILE).exists():
            # A rig left behind in this directory (crashed test, CLI start
            # without stop): stop it before reusing the directory.
            stale = CephFSRig.attach(self.root)
            stale.stop()
        try:
            t0 = time.monotonic()
            self._configure()
            self._start_mon()
            self.timings["mon_s"] = time.monotonic() - t0
            t = time.monotonic()
            self._start_mgr()
            self._start_osds()
            self._create_fs()
            self._start_mds()
            self._wait_fs_ready()
            self.timings["servers_s"] = time.monotonic() - t
            t = time.monotonic()
            self._mount_clients()
            self.timings["mount_s"] = time.monotonic() - t
            self.timings["start_s"] = time.monotonic() - t0
            self._save()
        except BaseException as e:
            try:
                self.stop()
            except CephFSError as stop_error:
                if isinstance(e, CephFSError):
                    raise CephFSError(f"{e}\n(and stopping what had started: {stop_error})") from None
            raise
        return self

    def _configure(self):
        for d in ("log", "run", "crash", "mnt"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for f in list(self.log_dir.iterdir()):
            f.unlink()
        # Old daemon data (a previous rig in this directory) would make mkfs fail.
        for d in self.root.iterdir():
            if d.is_dir() and d.name.split(".")[0] in ("mon", "osd", "mds", "mgr"):
                shutil.rmtree(d)
        self.fsid = str(uuid.uuid4())
        self.mon_port = free_port()
        self.daemons, self.clients = [], []
        run = self.root / "run"
        if len(str(run)) + len("/client.node99.4194304.asok") > SOCKET_PATH_MAX:
            run = Path(tempfile.mkdtemp(prefix="cephrig-"))
            self.asok_dir = str(run)
        else:
            self.asok_dir = None
        r = self.root
        # One port chosen here (the monitor's; msgr2 only); the other daemons
        # bind the first free port of 6800-7300 on 127.0.0.1 themselves, so two
        # rigs never collide. The warnings that do not apply to a throw-away
        # single-host cluster are off, so that HEALTH_OK means healthy.
        conf = f"""# generated by tests/support_py/cephfs.py: a single-host CephFS for tests
[global]
fsid = {self.fsid}
mon_host = v2:127.0.0.1:{self.mon_port}
public_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
auth_allow_insecure_global_id_reclaim = false
keyring = {r}/keyring
run_dir = {run}
crash_dir = {r}/crash
admin_socket = {run}/$name.asok
pid_file =
log_file = {r}/log/$name.log
log_to_stderr = false
err_to_stderr = true
# a daemon that exits at start-up leaves its last words in its log
log_flush_on_exit = true
mon_cluster_log_file = {r}/log/cluster.log
mon_data = {r}/$name
osd_data = {r}/$name
mds_data = {r}/$name
mgr_data = {r}/$name
osd_objectstore = memstore
memstore_device_bytes = {self.memstore_mib << 20}
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
mon_data_avail_warn = 1
mon_data_avail_crit = 0
# two cores shared with the writers: few threads per daemon
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 1
ms_async_op_threads = 2
mds_cache_memory_limit = 134217728
# PG states reach the manager every second (default 5): start-up waits on them
mgr_stats_period = 1

[mgr]
mgr_initial_modules =

[client]
# one process per client (the command-line tool runs many at once)
admin_socket = {run}/$name.$pid.asok

[client.admin]
admin_socket =
log_file = {r}/log/ceph-cli.log
"""
        for section, options in self.conf_extra.items():
            conf += f"\n[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in options.items())
        self.conf.write_text(conf)
        self._save()

    def ceph(self, *args, timeout: float = 30.0, check: bool = True, as_json: bool = False):
        """Runs the ceph command-line tool against this rig; returns its stdout
        (parsed when as_json). A failure raises CephFSError unless check=False."""
        cmd = ["ceph", "-c", str(self.conf), "--connect-timeout", str(int(timeout))]
        cmd += [str(a) for a in args] + (["--format", "json"] if as_json else [])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 5, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            if check:
                raise CephFSError(f"{' '.join(cmd)}: no answer in {timeout + 5:.0f} s") from None
            return None
        if r.returncode != 0:
            if check:
                raise CephFSError(f"{' '.join(cmd)}: exit status {r.returncode}\n{r.stderr.strip()}")
            return None
        return json.loads(r.stdout) if as_json else r.stdout

    def _run_tool(self, cmd: list, what: str, log: Optional[Path] = None):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=self.timeout,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            extra = f"\n--- {log} ---\n{tail(log)}" if log else ""
            raise CephFSError(f"{what} failed: {' '.join(map(str, cmd))}: exit status {r.returncode}\n"
                              f"{r.stdout.strip()}\n{r.stderr.strip()}{extra}")

    def _spawn(self, kind: str, name: str, args: list, is_client: bool = False, mount: Optional[Path] = None):
        log = self.log_dir / f"{name}.log"
        out = self.log_dir / f"{name}.out"
        cmd = [str(a) for a in args]
        with open(out, "ab") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, close_fds=True,
                                 preexec_fn=_die_with_parent if self.die_with_parent else None)
        self._popen[p.pid] = p
        entry = {"name": name, "kind": kind, "pid": p.pid, "log": str(log), "out": str(out)}
        if is_client:
            entry["mount"] = str(mount)
            self.clients.append(entry)
        else:
            self.daemons.append(entry)
        self._save()
        return entry

    def _daemon_failure(self, entry: dict, what: str) -> CephFSError:
        alive = self._alive(entry["pid"])
        state = "is running" if alive else f"exited ({self._exit_status(entry['pid'])})"
        return CephFSError(f"{what}: {entry['name']} (pid {entry['pid']}) {state}\n"
                           f"--- {entry['log']} (tail) ---\n{tail(entry['log'])}\n"
                           f"--- {entry['out']} (tail) ---\n{tail(entry['out'], 10)}")

    def _exit_status(self, pid: int) -> str:
        p = self._popen.get(pid)
        if p is None or p.poll() is None:
            return "status unknown"
        rc = p.returncode
        return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"

    def _wait(self, what: str, pred, watch: list, timeout: Optional[float] = None):
        """Polls pred() until it returns a true value; fails early when one of
        the daemons in watch exits, and at the timeout with the tail of the
        log of watch's last entry (the daemon the step waits for)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        last = None
        while True:
            for e in watch:
                if not self._alive(e["pid"]):
                    raise self._daemon_failure(e, f"waiting for {what}")
            try:
                last = pred()
                if last:
                    return last
            except CephFSError as err:
                last = err
            if time.monotonic() > deadline:
                failure = self._daemon_failure(watch[-1], f"timed out after {timeout or self.timeout:.0f} s "
                                                          f"waiting for {what} (last: {last})") \
                    if watch else CephFSError(f"timed out waiting for {what} (last: {last})")
                raise failure
            time.sleep(0.2)

    def _start_mon(self):
        monmap = self.root / "monmap"
        self._run_tool(["monmaptool", "--create", "--clobber", "--fsid", self.fsid, "--addv", "a",
                        f"[v2:127.0.0.1:{self.mon_port}]", monmap], "monmaptool")
        (self.root / "mon.a").mkdir()
        self._run_tool(["ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "-c", self.conf],
                       "ceph-mon --mkfs", self.log_dir / "mon.a.log")
        mon = self._spawn("mon", "mon.a", ["ceph-mon", "-f", "-i", "a", "-c", self.conf])
        self._wait("the monitor to form a quorum",
                   lambda: self.ceph("quorum_status", timeout=5, check=False, as_json=True), [mon])

    def _start_mgr(self):
        (self.root / "mgr.x").mkdir()
        self._spawn("mgr", "mgr.x", ["ceph-mgr", "-f", "-i", "x", "-c", self.conf])

    def _start_osds(self):
        ids = []
        for _ in range(self.nosds):
            osd_uuid = str(uuid.uuid4())
            osd_id = int(self.ceph("osd", "new", osd_uuid).strip())
            (self.root / f"osd.{osd_id}").mkdir()
            ids.append((osd_id, osd_uuid))
        for osd_id, osd_uuid in ids:
            self._run_tool(["ceph-osd", "--mkfs", "-i", osd_id, "--osd-uuid", osd_uuid, "-c", self.conf],
                           f"ceph-osd --mkfs of osd.{osd_id}", self.log_dir / f"osd.{osd_id}.log")
        for osd_id, _ in ids:
            self._spawn("osd", f"osd.{osd_id}", ["ceph-osd", "-f", "-i", osd_id, "-c", self.conf])

    def _create_fs(self):
        self.ceph("osd", "pool", "create", METADATA_POOL, self.metadata_pgs)
        self.ceph("osd", "pool", "create", DATA_POOL, self.data_pgs)
        self.ceph("fs", "new", FS_NAME, METADATA_POOL, DATA_POOL)

    def _start_mds(self):
        (self.root / "mds.a").mkdir()
        self._spawn("mds", "mds.a", ["ceph-mds", "-f", "-i", "a", "-c", self.conf])

    def _wait_fs_ready(self):
        osds = [d for d in self.daemons if d["kind"] == "osd"]
        mon = self._daemon("mon")
        t0 = time.monotonic()
        self._wait(f"{self.nosds} OSDs up and in",
                   lambda: self.osd_count(up_and_in=True) == self.nosds, [mon] + osds)
        self.timings["osds_up_s"] = time.monotonic() - t0
        self._wait("the MDS to become active", self._mds_active, [mon] + osds + [self._daemon("mds")])
        self.timings["mds_active_s"] = time.monotonic() - t0
        self._wait("the manager to become active", self._mgr_active, [mon, self._daemon("mgr")])
        self.timings["mgr_active_s"] = time.monotonic() - t0
        self._wait("every placement group active", self._pgs_active, [mon, self._daemon("mgr")] + osds)
        self.timings["pgs_active_s"] = time.monotonic() - t0

    def _daemon(self, kind: str) -> dict:
        return next(d for d in self.daemons if d["kind"] == kind)

    def _mds_active(self) -> bool:
        dump = self.ceph("fs", "dump", timeout=5, check=False, as_json=True)
        if not dump:
            return False
        return any(info.get("state") == "up:active"
                   for fs in dump.get("filesystems", [])
                   for info in fs.get("mdsmap", {}).get("info", {}).values())

    def _mgr_active(self) -> bool:
        st = self.ceph("mgr", "stat", timeout=5, check=False, as_json=True)
        return bool(st and st.get("available"))

    def _pgs_active(self) -> bool:
        st = self.ceph("pg", "stat", timeout=5, check=False, as_json=True)
        if not st:
            return False
        summary = st.get("pg_summary", st)
        total = summary.get("num_pgs", 0)
        active = sum(s["num"] for s in summary.get("num_pg_by_state", []) if "active" in s["name"].split("+"))
        return total > 0 and active == total

    def _mount_clients(self):
        entries = []
        for i, mp in enumerate(self.mount_points):
            mp.mkdir(parents=True, exist_ok=True)
            if str(mp) in fuse_mounts():
                raise CephFSError(f"{mp} is already a mount point")
            entries.append(self._spawn("client", f"client.node{i}",
                                       ["ceph-fuse", "-f", "-c", self.conf, "--name", f"client.node{i}",
                                        "--client_mountpoint", "/", mp],
                                       is_client=True, mount=mp))
        mon = self._daemon("mon")
        for e in entries:
            self._wait(f"{e['name']} to mount {e['mount']}",
                       lambda e=e: e["mount"] in fuse_mounts() and _on_other_fs(e["mount"]),
                       [mon, e])

    # ------------------------------------------------------------ queries
    def osd_count(self, up_and_in: bool = True) -> int:
        """Number of OSDs (up and in, or all): the storage targets a file is
        striped over, which `aggregate_files = auto` takes as the number of
        shared files."""
        st = self.ceph("osd", "stat", timeout=10, as_json=True)
        st = st.get("osdmap", st)  # older releases nest it
        return min(st["num_up_osds"], st["num_in_osds"]) if up_and_in else st["num_osds"]

    def health(self) -> dict:
        return self.ceph("health", timeout=10, as_json=True)

    def memory_rss_mib(self) -> dict:
        """{name: resident memory in MiB} of every live process of the rig."""
        out = {}
        for e in self.daemons + self.clients:
            try:
                for line in Path(f"/proc/{e['pid']}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        out[e["name"]] = int(line.split()[1]) / 1024
            except OSError:
                pass
        return out

    def asok(self, who) -> Optional[Path]:
        """The admin socket of a client (its index) or a daemon ("mds.a"),
        for `ceph --admin-daemon PATH ...`; None if it has none."""
        run = Path(self.asok_dir) if self.asok_dir else self.root / "run"
        if isinstance(who, int):
            c = self.clients[who]
            p = run / f"{c['name']}.{c['pid']}.asok"
        else:
            p = run / f"{who}.asok"
        return p if p.exists() else None

    def perf_dump(self, who, section: Optional[str] = None) -> dict:
        """The perf counters of a client (its index: objecter ops, object
        cacher...) or a daemon ("mds.a": purge_queue, mds_cache...)."""
        asok = self.asok(who)
        if asok is None:
            raise CephFSError(f"no admin socket for {who}")
        cmd = ["ceph", "--admin-daemon", str(asok), "perf", "dump"] + ([section] if section else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise CephFSError(f"perf dump of {asok}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def purged_count(self) -> int:
        """Inodes the MDS has purged so far (pass it to wait_purged)."""
        return self.perf_dump("mds.a", "purge_queue")["purge_queue"]["pq_executed"]

    def wait_purged(self, since: int, count: int, timeout: float = 30.0) -> bool:
        """Waits until the MDS has purged count more inodes than since (a
        purged_count() taken before they were deleted): deletes are
        asynchronous in CephFS, and memstore OSDs hold the data in memory until
        the purge. Returns False at the timeout (e.g. a client still holds the
        caps of a deleted file, which keeps it as a stray)."""
        deadline = time.monotonic() + timeout
        while True:
            pq = self.perf_dump("mds.a", "purge_queue")["purge_queue"]
            if pq["pq_executed"] >= since + count and pq["pq_executing"] == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    get_layout = staticmethod(get_layout)
    set_layout = staticmethod(set_layout)
    effective_layout = staticmethod(effective_layout)

    # ------------------------------------------------------------ stop
    def _alive(self, pid: int) -> bool:
        """pid is a live process of this rig (its command line names our ceph.conf)."""
        p = self._popen.get(pid)
        if p is not None:
            # Our child: its PID cannot be reused before we reap it (and its
            # cmdline reads empty for a moment after exec).
            return p.poll() is None
        for _ in range(20):
            cmd = _pid_cmdline(pid)
            state = _pid_state(pid)
            if cmd or state in (None, "Z"):
                return bool(cmd) and str(self.conf) in cmd and state != "Z"
            # Empty cmdline of a live process: it is in exec (an MDS respawns
            # itself so); look again.
            time.sleep(0.01)
        return False

    def _signal(self, pid: int, sig) -> None:
        if self._alive(pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _wait_gone(self, pids: list, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in pids if self._alive(p)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def _terminate(self, entries: list, grace: float) -> list:
        """SIGTERM, then SIGKILL after grace seconds; returns problems."""
        pids = [e["pid"] for e in entries]
        for pid in pids:
            self._signal(pid, signal.SIGTERM)
        left = self._wait_gone(pids, grace)
        for pid in left:
            self._signal(pid, signal.SIGKILL)
        left = self._wait_gone(left, 10)
        names = {e["pid"]: e["name"] for e in entries}
        return [f"{names[p]} (pid {p}) survived SIGKILL" for p in left]

    def _unmount(self, mount: str) -> Optional[str]:
        """Unmounts mount; returns an error text or None."""
        if mount not in fuse_mounts():
            return None
        errors = []
        fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
        for cmd in ([fusermount, "-u", mount], ["umount", mount], ["umount", "-l", mount],
                    [fusermount, "-u", "-z", mount]):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
                if r.returncode != 0:
                    errors.append(f"{' '.join(cmd)}: {r.stderr.strip()}")
            except subprocess.TimeoutExpired:
                errors.append(f"{' '.join(cmd)}: no answer in 15 s")
            if mount not in fuse_mounts():
                return None
        return "; ".join(errors) or f"{mount} is still mounted"

    def stop(self) -> None:
        """Unmounts and stops the clients, then stops MDS, OSDs, manager and
        monitor, each by PID (SIGTERM, SIGKILL after a grace period). Raises
        CephFSError listing what could not be stopped or unmounted."""
        t0 = time.monotonic()
        problems = []
        # 1. Clients: unmount (a ceph-fuse exits by itself once unmounted),
        #    then stop those that did not exit. A client that hangs is killed,
        #    which aborts its FUSE connection, and the mount point is detached.
        for c in self.clients:
            err = self._unmount(c["mount"])
            if err:
                problems.append(f"unmounting {c['mount']}: {err}")
        left = self._wait_gone([c["pid"] for c in self.clients], 5)
        problems += self._terminate([c for c in self.clients if c["pid"] in left], grace=3)
        for c in self.clients:
            if c["mount"] in fuse_mounts():
                err = self._unmount(c["mount"])
                problems.append(f"{c['mount']}: {err}" if err else
                                f"{c['mount']} needed a second unmount after {c['name']} stopped")
        self.timings["stop_clients_s"] = time.monotonic() - t0
        # 2. Servers in order. An MDS's clean shutdown takes 8 s (it waits for
        #    the monitor to acknowledge its last beacon), for nothing once the
        #    clients are gone and the file system is thrown away: it gets 3 s.
        for kind in SERVER_STOP_ORDER:
            entries = [d for d in self.daemons if d["kind"] == kind]
            if entries:
                t = time.monotonic()
                problems += self._terminate(entries, grace=3 if kind == "mds" else 10)
                self.timings[f"stop_{kind}_s"] = time.monotonic() - t
        for p in list(self._popen.values()):
            if p.poll() is None:
                try:
                    p.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        self._popen = {pid: p for pid, p in self._popen.items() if p.poll() is None}
        stray = processes_using(self.conf)
        for pid in stray:  # e.g. a daemon started by a process that died before recording it
            problems.append(f"stray process {pid} ({' '.join(_pid_cmdline(pid) or [])}) killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.asok_dir:
            shutil.rmtree(self.asok_dir, ignore_errors=True)
        self.timings["stop_s"] = time.monotonic() - t0
        if self.root.exists():
            # Kept when something could not be stopped, so that a later stop retries.
            if problems:
                self._save()
            else:
                (self.root / STATE_FILE).unlink(missing_ok=True)
        if problems:
            raise CephFSError("stopping the CephFS rig in " + str(self.root) + ":\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="A single-host CephFS (monitor, manager, memstore OSDs, MDS, "
                                             "ceph-fuse clients) under a directory.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the cluster and mount the clients (DIR/mnt/node<i>)")
    s.add_argument("dir", type=Path)
    s.add_argument("--clients", type=int, default=2)
    s.add_argument("--osds", type=int, default=3)
    s.add_argument("--memstore-mib", type=int, default=512, help="capacity of each OSD (MiB of memory)")
    s.add_argument("--json", action="store_true", help="print the state (PIDs, mounts, timings) as JSON")
    for name, doc in (("stop", "unmount the clients and stop the daemons, by PID"),
                      ("status", "the daemons, mounts and health")):
        p = sub.add_parser(name, help=doc)
        p.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "start":
            rig = CephFSRig(args.dir, clients=args.clients, osds=args.osds, memstore_mib=args.memstore_mib)
            rig.start()
            if args.json:
                print(json.dumps(rig._state(), indent=1))
            else:
                print(f"CephFS up in {rig.timings['start_s']:.1f} s: {rig.nosds} OSDs, conf {rig.conf}")
                for c in rig.clients:
                    print(f"  {c['name']} (pid {c['pid']}) mounted at {c['mount']}")
                print(f"stop with: {sys.argv[0]} stop {rig.root}")
        elif args.cmd == "stop":
            rig = CephFSRig.attach(args.dir)
            rig.stop()
            print(f"stopped in {rig.timings['stop_s']:.1f} s")
        else:
            rig = CephFSRig.attach(args.dir)
            for e in rig.daemons + rig.clients:
                state = "running" if rig._alive(e["pid"]) else "gone"
                print(f"{e['name']:16} pid {e['pid']:<8} {state}" + (f"  {e['mount']}" if "mount" in e else ""))
            rss = rig.memory_rss_mib()
            print(f"resident memory: {sum(rss.values()):.0f} MiB")
            print(json.dumps(rig.health()))
    except CephFSError as e:
        print(f"cephfs: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
