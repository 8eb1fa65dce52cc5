"""bench/route_sim.py: the simulation's building blocks, and a --quick run (every policy row, deterministic)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from routesim.runner import main_scenarios  # noqa: E402
from routesim.scrape import direct_metrics, render_metrics  # noqa: E402
from routesim.workload import draw_request_shape, poisson_trace  # noqa: E402

from eas_agent.vllm_metrics import parse_vllm_metrics  # noqa: E402
from sim.vllm.engine import InferenceUnit, Seq  # noqa: E402
from sim.vllm.eventloop import EventLoop  # noqa: E402
from sim.vllm.roofline import IUModel  # noqa: E402


def test_direct_metrics_equal_what_the_agent_parses_from_the_text():
    rng = random.Random(5)
    requests = []
    for i in range(60):
        _, prompt, output = draw_request_shape(rng)
        requests.append((Seq(i, prompt, output, i * 0.05, 0.0, 0), i * 0.05))
    loop = EventLoop()
    unit = InferenceUnit(0, "t-iu0", IUModel(), loop.schedule, lambda seq, now: None)
    for seq, at in requests:
        loop.schedule(at, lambda s, now: unit.submit(s, now), seq)
    for at in (0.0, 0.7, 1.9, 3.3, 8.0):
        loop.run(until=at)
        assert parse_vllm_metrics(render_metrics(unit, at)) == direct_metrics(unit, at)


def test_trace_is_the_same_whatever_the_edge_count():
    trace = poisson_trace(50.0, 20.0, seed=9)
    assert trace == poisson_trace(50.0, 20.0, seed=9)
    assert {r.edge(1) for r in trace} == {0}
    assert {r.edge(16) for r in trace} == set(range(16))
    shares = {k: sum(r.klass == k for r in trace) / len(trace) for k in "ABC"}
    assert shares["A"] == pytest.approx(0.65, abs=0.05) and shares["C"] == pytest.approx(0.05, abs=0.03)


def _quick_run(tmp_path: Path, name: str) -> subprocess.Popen:
    args = [sys.executable, str(BENCH / "route_sim.py"), "--quick", "--seed", "3", "--requests", "300",
            "--warmup", "10", "--loads", "0.8", "--edge-counts", "1,4", "--staleness-ms", "1000", "--plot", "", "--no-before",
            "--json", str(tmp_path / name)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_quick_run_has_every_policy_row_and_is_deterministic(tmp_path):
    runs = [_quick_run(tmp_path, "a.json"), _quick_run(tmp_path, "b.json")]  # two processes: hash seeds differ
    outputs = [run.communicate(timeout=480) for run in runs]
    for run, (_stdout, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, stderr
    stdout = outputs[0][0]
    for scenario in main_scenarios(4):
        assert scenario.label in stdout
    assert "oracle" in stdout and "edges (80% load)" in stdout and "staleness (80% load)" in stdout
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert a == b
    rows = {row["label"]: row for row in a["main"]}
    assert set(rows) == {s.label for s in main_scenarios(4)}
    assert all(row["requests"] > 150 for row in rows.values())
    # the oracle sees true state: nothing routes with less queueing
    assert rows["oracle"]["wait_p99_ms"] == min(row["wait_p99_ms"] for row in rows.values())
    assert rows["ours (Consul only)"]["consul_writes_per_s"] > 0 and rows["round-robin"]["consul_writes_per_s"] is None
    # the shipped rows' verdicts are printed; references print none
    stdout_lines = stdout.splitlines()
    assert any(line.startswith("target: 80% ours (push + Consul) p99 TTFT / oracle") and line.endswith("met")
               for line in stdout_lines)
    assert not any(line.startswith("reference:") and "met" in line for line in stdout_lines)
    assert all(t["met"] is None for t in a["targets"] if t["name"].startswith(("80% before", "80% round-robin")))


def test_targets_give_verdicts_only_to_shipped_rows_and_references_none():
    from dataclasses import fields

    from routesim.report import Summary, check_targets

    def row(label, load, p99, writes=None):
        values = {f.name: 0.0 for f in fields(Summary)}
        values.update(label=label, load=load, ttft_p99_ms=p99, requests=1, preemptions=0, misled=None,
                      consul_writes_per_s=writes, consul_writes_per_node_s=writes)
        return Summary(**values)

    main = [row("least-conn", 0.8, 2000), row("oracle", 0.8, 1500), row("round-robin", 0.8, 3000),
            row("ours (push + Consul)", 0.8, 1710, 0.9), row("least-conn", 0.95, 3000), row("oracle", 0.95, 2500),
            row("ours (push + Consul)", 0.95, 3100, 1.2)]
    before = [row("before (push + Consul)", 0.8, 9000)]
    edges = [row("ours (push + Consul), 1 edge", 0.8, 1000), row("ours (push + Consul), 16 edges", 0.8, 1150)]
    checks = {c.name: c for c in check_targets(main, edges, before)}
    assert checks["80% ours (push + Consul) p99 TTFT / oracle"].met is True  # 1.14 <= 1.2
    assert checks["80% ours (push + Consul) p99 TTFT / least-conn"].met is False  # 0.855 > 0.85
    assert checks["80% ours (push + Consul) Consul writes per node per s (budget 1/s)"].met is True
    assert checks["95% ours (push + Consul) p99 TTFT / least-conn"].met is False  # worse than least-conn
    assert checks["95% ours (push + Consul) p99 TTFT / oracle"].met is None  # reported, not a target
    assert checks["95% ours (push + Consul) Consul writes per node per s (budget 1/s)"].met is False
    assert checks["80% before (push + Consul) p99 TTFT / oracle"].met is None
    assert checks["80% round-robin p99 TTFT / oracle"].met is None
    assert checks["ours (push + Consul), 16 edges p99 / 1 edge"].met is False  # 1.15 > 1.1


def test_the_before_rows_score_without_the_admitted_prefill_term():
    from routesim.agents import BeforeScorer

    from tests.eas_agent.test_score import PARAMS, scored

    scorer = BeforeScorer("drain", PARAMS)
    scored(scorer, 0.0, 0.0, 0.0, running=0.0)
    result = scored(scorer, 12_000.0, 0.0, 1.0)
    assert result.components["admitted_prefill_tokens"] == 0 and result.components["prefill_s"] == 0.0
