"""Metrics (docs/design/metrics.md): each rank's OpenMetrics textfile in
metrics_dir, read during a run and after it, parses with prometheus_client's
strict OpenMetrics parser, and its counters match what `cairn stats` derives
from the catalog."""
import json
import subprocess
import time
from pathlib import Path

import pytest

import harness

try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError as e:  # a missing dependency is a failure, not a skip
    raise RuntimeError("prometheus_client is missing from .venv: run scripts/install-deps.sh") from e

NRANKS = 2
STEPS, EVERY, NBYTES = 10, 2, 200000


def parse(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} of a strictly valid OpenMetrics exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("cairn_"), fam.name
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    key = (name, frozenset({k: str(v) for k, v in labels.items()}.items()))
    assert key in samples, f"{name}{labels} missing from {sorted(samples)}"
    return samples[key]


def cli(*args) -> str:
    path = harness.cli_path()
    assert path, "CAIRN_TEST_CLI is not set (ctest sets it)"
    r = subprocess.run([str(path), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"cairn {' '.join(map(str, args))}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_textfiles_parse_and_match_the_catalog(make_job, tmp_path):
    job = make_job(NRANKS, run="metered")
    mdir = tmp_path / "metrics"
    flag = tmp_path / "go"
    p = job.start("--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-persistent",
                  "--pause-after", 4, flag, metrics_dir=mdir)
    job.wait_paused(p, flag)
    # Scraped during the run: valid, and what it says so far. The engine
    # writes the file in the background after the progress round that
    # counted the level: it may land just after the ranks paused.
    files = {r: mdir / f"cairn_metered_{r}.prom" for r in range(NRANKS)}
    for r, f in files.items():
        deadline = time.monotonic() + 10
        while True:
            s = parse(f.read_text()) if f.is_file() else {}
            if s and value(s, "cairn_level_versions_total", run="metered", rank=r, level="persistent") == 2:
                break
            assert time.monotonic() < deadline, \
                f"rank {r}: textfile {f.read_text() if f.is_file() else 'missing'} after 10 s"
            time.sleep(0.05)
        assert value(s, "cairn_checkpoints_total", run="metered", rank=r) == 2
    flag.touch()
    harness.finish_process(p).ok()
    assert sorted(f.name for f in mdir.iterdir()) == sorted(f.name for f in files.values())  # no temporaries left

    stats_text = cli("stats", job.store, "metered")
    stats = parse(stats_text)
    stats_json = json.loads(cli("stats", job.store, "metered", "--json"))
    assert [j["rank"] for j in stats_json] == list(range(NRANKS))
    nversions = STEPS // EVERY
    for r in range(NRANKS):
        live = parse(files[r].read_text())
        lab = dict(run="metered", rank=r)
        assert value(live, "cairn_checkpoints_total", **lab) == nversions
        assert value(live, "cairn_level_errors_total", **lab, level="persistent") == 0
        for level in ("local", "persistent"):
            for name in ("cairn_level_versions_total", "cairn_level_bytes_total", "cairn_level_errors_total"):
                a = value(live, name, **lab, level=level)
                b = value(stats, name, **lab, level=level)
                assert a == b, f"rank {r} {name}{{level={level}}}: textfile {a}, catalog {b}"
            assert value(stats, "cairn_level_versions_total", **lab, level=level) == nversions
        shard_bytes = value(stats, "cairn_level_bytes_total", **lab, level="persistent")
        assert shard_bytes == stats_json[r]["levels"]["persistent"]["bytes"] and shard_bytes > nversions * NBYTES
        for stage in ("capture", "checksum", "local", "persistent"):
            a = value(live, "cairn_stage_seconds_total", **lab, stage=stage)
            b = value(stats, "cairn_stage_seconds_total", **lab, stage=stage)
            assert a == pytest.approx(b, rel=1e-9, abs=1e-9), f"rank {r} stage {stage}: textfile {a}, catalog {b}"
            assert b > 0, f"rank {r} stage {stage} took no time?"
        # Rank 0 measured it; the others got it through the progress round (microseconds).
        a = value(live, "cairn_time_to_durable_seconds", **lab)
        b = value(stats, "cairn_time_to_durable_seconds", **lab)
        assert a == pytest.approx(b, abs=2e-6) and b > 0, f"rank {r} time to durable: textfile {a}, catalog {b}"
        assert value(live, "cairn_warning_signals_total", **lab) == 0
        assert value(live, "cairn_staging_bytes", **lab) >= NBYTES
    assert stats_text.endswith("# EOF\n")


def test_a_broken_exposition_is_rejected_by_the_parser():
    """The parser the test relies on is strict: a missing # EOF or a bad sample fails it."""
    good = "# TYPE cairn_x counter\ncairn_x_total{run=\"a\"} 1\n# EOF\n"
    parse(good)
    for bad in (good.replace("# EOF\n", ""), good.replace(" 1\n", " one\n"), good.replace("_total", "")):
        with pytest.raises(ValueError):
            parse(bad)
