"""The /metrics endpoints of the agents controller and managers
(docs/design/metrics.md, "Agents"): a real controller and two managers that
launch real cairn-agent processes, each serving GET /metrics; ckpt_app under
mpirun with 2 ranks checkpoints through the agents. Scraped during the run with
a real HTTP client, every exposition parses with prometheus_client's strict
OpenMetrics parser, and the counters match what the agents did (their logs)
and what the controller says (`cairn agents status --json`)."""
from __future__ import annotations

import http.client
import re
import urllib.request
from urllib.parse import urlparse

import pytest

import harness
from agents_deploy import AGENT, EVERY, NBYTES, STEPS, Deployment, agents_cfg, committed, protected, release, \
    wait_until

try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
except ImportError as e:  # a missing dependency is a failure, not a skip
    raise RuntimeError("prometheus_client is missing from .venv: run scripts/install-deps.sh") from e

pytestmark = pytest.mark.skipif(not AGENT or not harness.cli_path() or not harness.mpi_enabled(),
                                reason="needs cairn-agent (CAIRN_ENABLE_FABRIC), the cairn CLI and MPI")

RUN = "agents-metered"


@pytest.fixture
def deployment(tmp_path):
    d = Deployment(tmp_path / "deploy", metrics=True)
    yield d
    d.stop_all()


def scrape(url: str) -> dict:
    """{(sample name, frozenset(labels)): value} of the endpoint's exposition,
    which must be strictly valid OpenMetrics served as such."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0"), r.headers
        text = r.read().decode()
    assert text.endswith("# EOF\n")
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


def total(samples: dict, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, l), v in samples.items() if n == name and want <= l)


def pulled(d: Deployment, node: str) -> list[int]:
    """Bytes of every pull the node's agents logged as held: 'pulling R/N vV rank K: B bytes' then 'held R/N vV rank K/..'."""
    out = []
    for log in (d.root / f"run-{node}").glob("agent-*.log"):
        text = log.read_text(errors="replace")
        sizes = {m.group(1): int(m.group(2)) for m in re.finditer(r"pulling (\S+ v\d+ rank \d+): (\d+) bytes", text)}
        for m in re.finditer(r"held (\S+ v\d+ rank \d+)/\d+ \(", text):
            out.append(sizes[m.group(1)])
    return out


def test_controller_and_managers_serve_metrics_that_match_what_the_agents_did(deployment, make_job):
    d = deployment
    d.add_manager("node-a")
    d.add_manager("node-b")
    urls = {name: d.metrics_url(name) for name in ("controller", "manager-node-a", "manager-node-b")}
    # Before any application: valid, and zero.
    c0 = scrape(urls["controller"])
    assert value(c0, "cairn_controller_nodes", state="up") == 2
    assert value(c0, "cairn_controller_agent_placements_total", action="placed") == 0
    assert value(c0, "cairn_controller_applications") == 0

    job = make_job(2, run=RUN)
    flags = {v: job.root / f"pause{v}" for v in (4, 8)}
    args = ["--steps", STEPS, "--every", EVERY, "--bytes", NBYTES, "--wait-protected", "--probe"]
    for v, f in flags.items():
        args += ["--pause-after", v, f]
    p = job.start(*args, **agents_cfg(d))
    job.wait_paused(p, flags[4])
    wait_until("v4 committed by the agents", lambda: committed(job, 4))
    app = d.app(RUN)
    assert len(app["agents"]) == 1, app  # 2 ranks on one node each: one agent (capacity 2, nodes_per_agent 1)
    # One agent more, forced: an applied resize request and a second placement.
    d.admin("resize", "--app", app["app"], "--agents", 2, "--force")
    wait_until("2 agents running", lambda: len(d.app(RUN)["agents"]) == 2 and all(
        g.get("endpoint") for g in d.app(RUN)["agents"]))
    release(flags[4])
    job.wait_paused(p, flags[8])
    wait_until("v8 committed by the agents", lambda: committed(job, 8))

    # ---- during the run (paused after v8): every endpoint, checked against the agents' own logs
    status = d.status()
    app = d.app(RUN)
    logged = {node: pulled(d, node) for node in ("node-a", "node-b")}
    # 2 ranks x 4 versions, each held once by an agent (no fallback: --wait-protected saw them all protected).
    assert sum(len(v) for v in logged.values()) == 8, logged

    def managers_match():
        for node in ("node-a", "node-b"):
            m = scrape(urls[f"manager-{node}"])
            assert value(m, "cairn_manager_connected", node=node) == 1
            assert total(m, "cairn_agent_transfers_total", app=RUN, mode="pull") == len(logged[node]), (node, m)
            assert total(m, "cairn_agent_transfer_bytes_total", app=RUN, mode="pull") == sum(logged[node]), node
            assert total(m, "cairn_agent_transfer_failures_total", app=RUN) == 0
            assert total(m, "cairn_agent_transfers_total", app=RUN, mode="push") == 0
            if logged[node]:
                assert total(m, "cairn_agent_transfer_seconds_total", app=RUN, mode="pull") > 0
            mine = [g for g in app["agents"] if g["node"] == node]
            assert value(m, "cairn_manager_memory_reserved_bytes", node=node) == sum(g["memory_reserved"] for g in mine)
            held = total(m, "cairn_agent_memory_held_bytes", app=RUN)
            assert value(m, "cairn_manager_memory_held_bytes", node=node) == held
            assert value(m, "cairn_manager_memory_total_bytes", node=node) > 0
            assert value(m, "cairn_manager_agents", node=node, state="running") == len(mine)
        return True

    wait_until("the managers' counters to match the agents' logs", managers_match)

    c = scrape(urls["controller"])
    assert value(c, "cairn_controller_app_agents", app=RUN) == 2
    assert value(c, "cairn_controller_app_target_agents", app=RUN) == 2
    assert value(c, "cairn_controller_agent_placements_total", action="placed") == 2
    assert value(c, "cairn_controller_agent_placements_total", action="moved") == 0
    assert value(c, "cairn_controller_resize_requests_total", outcome="applied") == 1
    assert value(c, "cairn_controller_resize_requests_total", outcome="refused") == 0
    assert value(c, "cairn_controller_agents", state="running") == 2
    for n in status["nodes"]:
        node = n["node"]
        assert value(c, "cairn_controller_node_capacity_agents", node=node) == n["capacity"] == 2
        assert value(c, "cairn_controller_node_agents", node=node) == n["agents"]
        assert value(c, "cairn_controller_node_memory_reserved_bytes", node=node) == n["memory_reserved"]
        assert value(c, "cairn_controller_node_memory_total_bytes", node=node) == n["metrics"]["mem_total"] > 0

    # The controller's view of held memory follows the managers' heartbeats.
    def held_agrees():
        c = scrape(urls["controller"])
        for node in ("node-a", "node-b"):
            m = scrape(urls[f"manager-{node}"])
            assert value(c, "cairn_controller_node_memory_held_bytes", node=node) == \
                value(m, "cairn_manager_memory_held_bytes", node=node)
        return True

    wait_until("the controller's held memory to match the managers'", held_agrees)

    release(flags[8])
    r = harness.finish_process(p).ok()
    prot = protected(r)
    assert prot and all(rc == 0 for rc in prot.values()), r.describe()

    # ---- what is not /metrics
    for name, url in urls.items():
        u = urlparse(url)
        for method, path, code in (("GET", "/", 404), ("POST", "/metrics", 405), ("HEAD", "/metrics", 200)):
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            conn.request(method, path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == code, (name, method, path, resp.status, body)
            if method == "HEAD":
                assert body == b"" and int(resp.headers["Content-Length"]) > 0
            conn.close()


def test_a_bad_metrics_address_is_a_clear_error(tmp_path):
    d = Deployment(tmp_path / "deploy")
    try:
        r = d.cli("manager", "--node-id", "n1", "--controller", d.address, "--secret-file", d.secret,
                  "--service-secret-file", d.service_secret, "--metrics-listen", "nohost", check=False)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "--metrics-listen" in r.stderr and "nohost" in r.stderr, r.stderr
    finally:
        d.stop_all()
