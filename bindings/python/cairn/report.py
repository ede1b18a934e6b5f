"""Report of a comparison of two runs: PNG plots and a text summary.

    python -m cairn.report STORE RUN_A RUN_B --out DIR [--name N] [--abs E]
                           [--rel E] [--ulps N] [--region R ...] [--mismatches-only]
    cairn-report ...                     (the same, as an installed command)

Runs `cairn diff ... --json` (cairn.diff; or reads a saved result with
--diff-json FILE) and writes into DIR:
  counts.png          per region, per version: exact / approximate / mismatch
                      element counts (stacked bars)
  max_abs_error.png   per region: the largest |a - b| over versions (log scale)
  summary.txt         outcome, first divergence, growth of the error, per-version table
  diff.json           the diff result it was made from
and prints the summary and the paths. Exit status 0 when the report was written
(whatever the outcome), 2 on bad arguments or a failed diff.
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict
from typing import Dict, List, Optional

from .diff import Row, diff, first_divergence, mismatches_only, outcome, rows
from .errors import CairnError

COLORS = {"exact": "#2e7d32", "approximate": "#f9a825", "within": "#64b5f6", "mismatch": "#c62828"}


def _labels(rs: List[Row]) -> "OrderedDict[str, List[Row]]":
    names = {r.name for r in rs}
    by = OrderedDict()
    for r in sorted(rs, key=lambda r: (r.name, r.region, -1 if r.rank is None else r.rank, r.version)):
        label = r.label if len(names) <= 1 else f"{r.name}/{r.label}"
        by.setdefault(label, []).append(r)
    return by


def _fmt(x: float) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def _describe_first(fd: Optional[dict]) -> str:
    if not fd:
        return "none"
    parts = []
    if fd.get("name"):
        parts.append(f"checkpoint {fd['name']}")
    if "version" in fd:
        parts.append(f"version {fd['version']}")
    if fd.get("region"):
        parts.append(f"region {fd['region']}")
    at = fd.get("at") or {}
    if fd.get("rank") is not None and int(fd.get("rank", -1)) >= 0:
        if isinstance(at, dict) and at.get("rank_b") is not None and at.get("rank_b") != at.get("rank_a"):
            parts.append(f"rank {at.get('rank_a')} of A / rank {at.get('rank_b')} of B")
        else:
            parts.append(f"rank {fd['rank']}")
    s = ", ".join(parts)
    kind = fd.get("kind")
    if kind and kind != "mismatch":
        s += f" ({kind})"
    if isinstance(at, dict) and at:
        loc = []
        if "index" in at:
            loc.append(f"element {at['index']}")
        if at.get("coords"):
            loc.append(f"at {list(at['coords'])}")
        if loc:
            s += ": " + " ".join(loc)
        a, b = at.get("a_text", at.get("a")), at.get("b_text", at.get("b"))
        if a is not None or b is not None:
            s += f", A = {a}, B = {b}"
    if fd.get("message") and not (isinstance(at, dict) and at):
        s += f": {fd['message']}"
    return s


def growth_lines(rs: List[Row]) -> List[str]:
    """Per region: where the error first appears and how it grows."""
    out = []
    for label, lst in _labels(rs).items():
        lst = sorted(lst, key=lambda r: r.version)
        nonzero = [r for r in lst if r.max_abs > 0 or r.mismatch > 0]
        if not nonzero:
            not_compared = [r for r in lst if r.state != "compared"]
            if not_compared:
                out.append(f"  {label}: not compared ({not_compared[0].state}) in {len(not_compared)} version(s)")
            else:
                out.append(f"  {label}: no difference in {len(lst)} version(s)")
            continue
        f, last = nonzero[0], lst[-1]
        peak = max(lst, key=lambda r: r.max_abs if math.isfinite(r.max_abs) else float("inf"))
        line = (f"  {label}: first difference at version {f.version} (max |a-b| {_fmt(f.max_abs)}, "
                f"{f.mismatch} mismatching of {f.elements}); at version {last.version}: max |a-b| "
                f"{_fmt(last.max_abs)}, {last.mismatch} mismatching of {last.elements}")
        if f.max_abs > 0 and last.max_abs > 0 and math.isfinite(last.max_abs) and last.version > f.version:
            factor = last.max_abs / f.max_abs
            line += f"; growth x{factor:.3g} from version {f.version} to {last.version}"
            if factor > 1:
                span = last.version - f.version
                line += f" (doubles every {span * math.log(2) / math.log(factor):.3g} in version number)"
        if peak is not last and peak.max_abs > last.max_abs:
            line += f"; peak {_fmt(peak.max_abs)} at version {peak.version}"
        out.append(line)
    return out


def summary_text(doc: dict, rs: List[Row], store: str, run_a: str, run_b: str) -> str:
    tol = doc.get("tolerance") or {}
    opts = ", ".join(f"{k} {tol[k]}" for k in ("abs", "rel", "ulps") if k in tol) or "none"
    versions = sorted({(r.name, r.version) for r in rs})
    lines = [f"cairn report: {run_a} vs {run_b} in {store}",
             f"tolerance: {opts}" + ("; mismatches only" if mismatches_only(doc) else ""),
             f"versions compared: {len(versions)}"
             + (f" ({', '.join(sorted({n for n, _ in versions}))}: versions {versions[0][1]} to {versions[-1][1]})"
                if versions else ""),
             f"outcome: {outcome(doc)}",
             f"first divergence: {_describe_first(first_divergence(doc))}",
             "error by region:"]
    lines += growth_lines(rs) or ["  (no region compared)"]
    for cp in doc.get("checkpoints", []) or []:
        if not isinstance(cp, dict):
            continue
        for k, what in (("versions_only_a", f"only in {run_a}"), ("versions_only_b", f"only in {run_b}"),
                        ("uncommitted_a", f"uncommitted in {run_a} (skipped)"),
                        ("uncommitted_b", f"uncommitted in {run_b} (skipped)")):
            if cp.get(k):
                lines.append(f"versions of {cp.get('name', '')} {what}: {cp[k]}")
    lines.append("")
    lines.append(f"{'version':>8}  {'region':<24} {'exact':>10} {'approx':>10} {'mismatch':>10} "
                 f"{'max_abs':>10} {'max_rel':>10}  state")
    for r in sorted(rs, key=lambda r: (r.name, r.version, r.region, -1 if r.rank is None else r.rank)):
        lines.append(f"{r.version:>8}  {r.label:<24} {r.exact:>10} {r.approximate:>10} {r.mismatch:>10} "
                     f"{_fmt(r.max_abs):>10} {_fmt(r.max_rel):>10}  {r.state}")
    return "\n".join(lines) + "\n"


def _grid(n):
    cols = min(n, 2)
    return (n + cols - 1) // cols, cols


def plot_counts(rs: List[Row], path: str, title: str, mismatches_only: bool):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _labels(rs) or OrderedDict([("(no region compared)", [])])
    nr, nc = _grid(len(groups))
    fig, axes = plt.subplots(nr, nc, figsize=(6.5 * nc, 3.2 * nr), squeeze=False)
    for ax, (label, lst) in zip(axes.flat, groups.items()):
        lst = sorted(lst, key=lambda r: r.version)
        x = list(range(len(lst)))
        bottom = [0] * len(lst)
        series = ([("within", [r.within for r in lst])] if mismatches_only else
                  [("exact", [r.exact for r in lst]), ("approximate", [r.approximate for r in lst])])
        series.append(("mismatch", [r.mismatch for r in lst]))
        for key, vals in series:
            ax.bar(x, vals, bottom=bottom, color=COLORS[key], label=key, width=0.8)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_title(label)
        ax.set_xlabel("version")
        ax.set_ylabel("elements")
        step = max(1, len(lst) // 12)
        ax.set_xticks(x[::step])
        ax.set_xticklabels([str(r.version) for r in lst][::step], rotation=45, fontsize=8)
        if not lst:
            ax.text(0.5, 0.5, "nothing compared", ha="center", va="center", transform=ax.transAxes)
        elif not any(r.state == "compared" for r in lst):
            ax.text(0.5, 0.5, f"not compared ({lst[0].state})", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    if handles:
        fig.legend(handles, labels, loc="upper right", ncol=len(handles), fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_errors(rs: List[Row], path: str, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    groups = _labels(rs)
    positive = [r.max_abs for r in rs if r.max_abs > 0 and math.isfinite(r.max_abs)]
    # Versions compared without any difference sit on a floor below the smallest error.
    floor = min(positive) / 10 if positive else 1e-16
    zeros_shown = False
    for label, lst in groups.items():
        lst = sorted(lst, key=lambda r: r.version)
        pts = [(r.version, r.max_abs) for r in lst if r.max_abs > 0 and math.isfinite(r.max_abs)]
        line = None
        if pts:
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
        zero = [r.version for r in lst if r.state == "compared" and r.max_abs == 0 and r.mismatch == 0]
        if zero and positive:
            ax.plot(zero, [floor] * len(zero), linestyle="none", marker="v", markersize=5,
                    color=line.get_color() if line is not None else None,
                    label=None if line is not None else label)
            zeros_shown = True
    ax.set_yscale("log")
    ax.set_xlabel("version")
    ax.set_ylabel("max |a - b|")
    ax.set_title(title)
    versions = sorted({r.version for r in rs})
    if versions:
        pad = max(1, (versions[-1] - versions[0]) * 0.03)
        ax.set_xlim(versions[0] - pad, versions[-1] + pad)
    if positive:
        ax.legend(fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        if zeros_shown:
            ax.text(0.01, 0.01, "\u25bc no difference (bitwise equal)", transform=ax.transAxes, fontsize=8,
                    va="bottom")
    else:
        ax.set_ylim(1e-17, 1)
        msg = "no error: every compared element is equal" if rs else "nothing compared"
        ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(doc: dict, out_dir: str, store: str = "", run_a: str = "", run_b: str = "") -> Dict[str, str]:
    """Writes counts.png, max_abs_error.png, summary.txt and diff.json into out_dir;
    returns their paths by kind."""
    os.makedirs(out_dir, exist_ok=True)
    run_a = run_a or doc.get("run_a", "A")
    run_b = run_b or doc.get("run_b", "B")
    store = store or doc.get("store", "")
    rs = rows(doc)
    paths = {"counts": os.path.join(out_dir, "counts.png"),
             "error": os.path.join(out_dir, "max_abs_error.png"),
             "summary": os.path.join(out_dir, "summary.txt"),
             "json": os.path.join(out_dir, "diff.json")}
    plot_counts(rs, paths["counts"], f"{run_a} vs {run_b}: elements per version", mismatches_only(doc))
    plot_errors(rs, paths["error"], f"{run_a} vs {run_b}: max abs error per version")
    with open(paths["summary"], "w") as f:
        f.write(summary_text(doc, rs, store, run_a, run_b))
    with open(paths["json"], "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="cairn-report",
                                 description="Compare two runs of a cairn store (cairn diff) and write PNG plots "
                                             "and a text summary.")
    ap.add_argument("store")
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--out", required=True, help="directory for the plots and summary (created)")
    ap.add_argument("--name", help="checkpoint name (default: every name)")
    ap.add_argument("--abs", type=float, help="absolute tolerance")
    ap.add_argument("--rel", type=float, help="relative tolerance")
    ap.add_argument("--ulps", type=int, help="tolerance in units in the last place")
    ap.add_argument("--region", action="append", default=[], help="compare only this region (repeatable)")
    ap.add_argument("--mismatches-only", action="store_true")
    ap.add_argument("--cli", help="the cairn CLI (default: $PYCAIRN_CLI, PATH, the build directory)")
    ap.add_argument("--diff-json", metavar="FILE", help="report on a saved `cairn diff --json` result "
                                                          "instead of running the CLI")
    ap.add_argument("--quiet", action="store_true", help="print only the paths")
    a = ap.parse_args(argv)
    try:
        if a.diff_json:
            with open(a.diff_json) as f:
                doc = json.load(f)
        else:
            doc = diff(a.store, a.run_a, a.run_b, name=a.name, abs=a.abs, rel=a.rel, ulps=a.ulps,
                       regions=a.region, mismatches_only=a.mismatches_only, cli=a.cli)
        paths = write_report(doc, a.out, a.store, a.run_a, a.run_b)
    except (CairnError, OSError, ValueError) as e:
        print(f"cairn-report: {e}", file=sys.stderr)
        return 2
    if not a.quiet:
        with open(paths["summary"]) as f:
            text = f.read()
        # The per-version table can be long: print the head of the summary only.
        print(text.split("\n\n")[0])
    for kind in ("counts", "error", "summary"):
        print(f"report: {paths[kind]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
