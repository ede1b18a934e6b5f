"""Comparison of two runs through the cairn CLI (`cairn diff ... --json`).

cairn.diff() returns the CLI's JSON document as parsed (a dict, layout below);
rows() flattens it into one record per (checkpoint name, version, region, rank),
which is what cairn.report plots.
"""
import glob
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence

from .errors import CairnError, DiffUnavailable, NotFoundError


def _repo_root() -> Optional[str]:
    """The cairn source tree this package lives in (editable installs), if any."""
    d = os.path.dirname(os.path.abspath(__file__))
    for _ in range(4):
        d = os.path.dirname(d)
        if os.path.isfile(os.path.join(d, "include", "cairn.h")) and os.path.isdir(os.path.join(d, "tools", "cairn")):
            return d
    return None


# The variable naming the CLI. Not CAIRN_*: the runtime reads every CAIRN_*
# variable as a configuration key and refuses unknown ones, so an exported
# CAIRN_CLI would stop every cairn application started from that shell.
CLI_ENV = "PYCAIRN_CLI"


def find_cli(cli: Optional[str] = None) -> str:
    """The cairn CLI: `cli`, else $PYCAIRN_CLI, else `cairn` on PATH, else the newest
    build*/tools/cairn/cairn of the source tree this package lives in."""
    for cand in (cli, os.environ.get(CLI_ENV)):
        if cand:
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
            raise DiffUnavailable(f"cairn CLI '{cand}' is not an executable file")
    on_path = shutil.which("cairn")
    if on_path:
        return on_path
    root = _repo_root()
    if root:
        found = [p for p in glob.glob(os.path.join(root, "build*", "tools", "cairn", "cairn"))
                 if os.access(p, os.X_OK)]
        if found:
            return max(found, key=os.path.getmtime)
    raise DiffUnavailable(f"the cairn CLI was not found: set {CLI_ENV} to its path, put it on PATH, "
                          "or build the project (it is build/tools/cairn/cairn)")


_has_diff_cache = {}


def has_diff(cli: Optional[str] = None) -> bool:
    """Whether the CLI has a `diff` command (listed by `cairn --help`)."""
    try:
        exe = find_cli(cli)
    except DiffUnavailable:
        return False
    if exe not in _has_diff_cache:
        try:
            p = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
            text = p.stdout + p.stderr
        except (OSError, subprocess.SubprocessError):
            text = ""
        _has_diff_cache[exe] = re.search(r"^\s+diff\b", text, re.M) is not None
    return _has_diff_cache[exe]


def diff(store, run_a: str, run_b: str, name: Optional[str] = None, abs: Optional[float] = None,  # noqa: A002
         rel: Optional[float] = None, ulps: Optional[int] = None, regions: Optional[Sequence[str]] = None,
         mismatches_only: bool = False, cli: Optional[str] = None, extra_args: Iterable[str] = (),
         timeout: Optional[float] = None) -> dict:
    """Runs `cairn diff STORE RUN_A RUN_B ... --json` and returns the parsed result.

    store: a path or a cairn.Store. Options map to the CLI's: name -> --name,
    abs/rel/ulps -> --abs/--rel/--ulps, regions -> --region R (each),
    mismatches_only -> --mismatches-only. Raises DiffUnavailable when the CLI is
    missing or has no diff command, NotFoundError / CairnError with the CLI's
    message when it fails."""
    exe = find_cli(cli)
    args = [exe, "diff", os.fspath(store), run_a, run_b]
    if name is not None:
        args += ["--name", name]
    if abs is not None:
        args += ["--abs", repr(float(abs))]
    if rel is not None:
        args += ["--rel", repr(float(rel))]
    if ulps is not None:
        args += ["--ulps", str(int(ulps))]
    for r in regions or ():
        args += ["--region", r]
    if mismatches_only:
        args.append("--mismatches-only")
    args += list(extra_args)
    args.append("--json")
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    out, err = p.stdout.strip(), p.stderr.strip()
    doc = None
    if out:
        try:
            doc = json.loads(out)
        except ValueError:
            doc = None
    # Exit status 0: identical or within tolerance; 1: the runs differ (the
    # document says how); 2: bad arguments or an unknown store, run, checkpoint
    # or region (message on stderr).
    if isinstance(doc, dict) and "checkpoints" in doc:
        return doc
    msg = err or out or f"exit status {p.returncode}"
    if err.startswith("cairn: error: "):
        msg = err[len("cairn: error: "):]
    if not has_diff(exe):
        raise DiffUnavailable(f"{exe} has no 'diff' command (this cairn predates it): {msg}")
    low = msg.lower()
    if p.returncode == 2 and any(w in low for w in ("not found", "no such", "does not exist", "unknown", "no run")):
        raise NotFoundError(f"cairn diff: {msg}")
    raise CairnError(f"cairn diff failed (exit status {p.returncode}): {msg[:2000]}")


# ---- flattening ------------------------------------------------------------------
# The document of `cairn diff --json` (tools/cairn/cmd_diff.cpp):
#   store, run_a, run_b, mode ("full" | "mismatches_only"), tolerance {abs, rel, ulps},
#   checkpoints: [{name, in_a, in_b, versions_only_a, versions_only_b, uncommitted_a,
#                  uncommitted_b, versions: [{version, nranks_a, nranks_b, problems, notes,
#                                             regions: [region entry]}]}]
#   region entry: {region, layout ("global" | "per_rank"), rank (null for global), state,
#                  type_a, type_b, shape_a, shape_b, problems, elements, exact, approximate
#                  (null in mismatches_only), within, mismatch, nonfinite_mismatch, max_abs,
#                  max_rel (null in mismatches_only), mismatch_max_abs, mismatch_max_rel,
#                  unmatched_a, unmatched_b, chunks {skipped, read}, first_mismatch}
#   location: {index, coords, rank_a, rank_b, a, b, a_text, b_text}
#   first_divergence: null or {name, version, rank, region, kind, message, at}
#   summary {outcome, versions_compared, ...}, io {...}, elapsed_s
# Non-finite numbers are the strings "nan", "inf", "-inf".

@dataclass
class Row:
    """One region entry of one compared version."""
    name: str
    version: int
    region: str
    rank: Optional[int]  # None for regions assembled by global index
    state: str           # "compared", "structural", "not_comparable", "unreadable"
    exact: int           # 0 in mismatches-only mode (not told apart from approximate)
    approximate: int
    mismatch: int
    within: int          # exact + approximate (all the mismatches-only mode can tell)
    max_abs: float       # max |a - b| (mismatches-only mode: over mismatching pairs)
    max_rel: float
    first: Optional[dict]  # first mismatch location, or None
    problems: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.region if self.rank is None else f"{self.region}[rank {self.rank}]"

    @property
    def elements(self) -> int:
        return self.within + self.mismatch


def _num(x, default=0.0):
    if x is None:
        return default
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, (int, float)):
        return x
    if isinstance(x, str):  # "nan", "inf", "-inf"
        try:
            return float(x)
        except ValueError:
            return default
    return default


def _first_not_none(d: dict, *keys, default=None):
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return default


def mismatches_only(doc: dict) -> bool:
    return doc.get("mode") == "mismatches_only" or bool(doc.get("mismatches_only"))


def rows(doc: dict) -> List[Row]:
    """One Row per (checkpoint name, version, region, rank) of a diff result, sorted."""
    out = []
    for cp in doc.get("checkpoints") or []:
        cname = cp.get("name", "")
        for v in cp.get("versions") or []:
            version = int(v.get("version", 0))
            for r in v.get("regions") or []:
                exact = int(_num(r.get("exact"), 0))
                approx = int(_num(r.get("approximate"), 0))
                mism = int(_num(r.get("mismatch"), 0))
                within = r.get("within")
                within = exact + approx if within is None else int(_num(within))
                rank = r.get("rank")
                if r.get("layout") == "global" or (rank is not None and int(rank) < 0):
                    rank = None
                max_abs = _num(_first_not_none(r, "max_abs", "mismatch_max_abs", default=0.0))
                max_rel = _num(_first_not_none(r, "max_rel", "mismatch_max_rel", default=0.0))
                out.append(Row(name=cname, version=version, region=str(r.get("region", "?")),
                               rank=None if rank is None else int(rank), state=str(r.get("state", "compared")),
                               exact=exact, approximate=approx, mismatch=mism, within=within,
                               max_abs=float(max_abs), max_rel=float(max_rel),
                               first=r.get("first_mismatch"), problems=list(r.get("problems") or [])))
    out.sort(key=lambda r: (r.name, r.version, r.region, -1 if r.rank is None else r.rank))
    return out


def first_divergence(doc: dict) -> Optional[dict]:
    """The first divergence of a diff result (lowest version, rank, name, region
    with a mismatch or a region that could not be compared), or None."""
    fd = doc.get("first_divergence")
    if isinstance(fd, dict) and fd:
        return fd
    if "first_divergence" in doc:
        return None
    for r in rows(doc):  # documents without the field
        if r.mismatch > 0 or r.state != "compared":
            d = {"name": r.name, "version": r.version, "region": r.region,
                 "rank": -1 if r.rank is None else r.rank, "kind": "mismatch" if r.mismatch else r.state,
                 "at": r.first}
            return d
    return None


def outcome(doc: dict) -> str:
    """"identical", "within_tolerance", "diverged" or "nothing_compared"."""
    o = (doc.get("summary") or {}).get("outcome", doc.get("outcome"))
    if isinstance(o, str):
        return o
    rs = rows(doc)
    if not rs:
        return "nothing_compared"
    if any(r.mismatch or r.state != "compared" for r in rs):
        return "diverged"
    if any(r.approximate for r in rs):
        return "within_tolerance"
    return "identical"


def is_finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
