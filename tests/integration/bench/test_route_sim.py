"""bench/route_sim.py: the simulation's building blocks, and a --quick run (every policy row, deterministic)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[3] / "bench"
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


def test_a_slow_machine_does_not_change_what_the_simulated_agent_scores():
    """The agent waits for its scrape threads on the wall clock; a simulated scrape must never be late."""
    import time

    from routesim.agents import SimNodeAgent

    from sim.memstore import MemoryStore

    loop = EventLoop()
    units = [InferenceUnit(k, f"sim000-iu{k}", IUModel(), loop.schedule, lambda seq, now: None) for k in (0, 1)]
    agent = SimNodeAgent("sim000", "r00", units, profile="drain", interval_s=0.2, heartbeat_s=2.0,
                         store=MemoryStore(), loop=loop, direct=False)
    for pipeline in agent.agent.pipelines:  # a scrape thread that gets the CPU only after 0.3 s
        fetch = pipeline.vllm.fetch
        pipeline.vllm.fetch = lambda fetch=fetch: (time.sleep(0.3), fetch())[1]
    agent.cycle(0.2)
    results = agent.agent.cycle(0.4)
    assert all(r.score is not None and "not finished" not in r.reason for r in results.values()), results


def test_trace_is_the_same_whatever_the_edge_count():
    trace = poisson_trace(50.0, 20.0, seed=9)
    assert trace == poisson_trace(50.0, 20.0, seed=9)
    assert {r.edge(1) for r in trace} == {0}
    assert {r.edge(16) for r in trace} == set(range(16))
    shares = {k: sum(r.klass == k for r in trace) / len(trace) for k in "ABC"}
    assert shares["A"] == pytest.approx(0.65, abs=0.05) and shares["C"] == pytest.approx(0.05, abs=0.03)


def _quick_run(tmp_path: Path, name: str, seeds: str = "3", workloads: str = "mix",
               requests: int = 200) -> subprocess.Popen:
    args = [sys.executable, str(BENCH / "route_sim.py"), "--quick", "--seeds", seeds, "--requests", str(requests),
            "--warmup", "10", "--loads", "0.8", "--edge-counts", "1,4", "--staleness-ms", "1000", "--plot", "",
            "--no-before", "--workloads", workloads, "--json", str(tmp_path / name)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_quick_run_has_every_policy_row_and_is_deterministic(tmp_path):
    # two processes (hash seeds differ): seeds 3,4 and seed 4 alone; seed 4's rows are the same in both
    runs = [_quick_run(tmp_path, "a.json", "3,4"), _quick_run(tmp_path, "b.json", "4")]
    outputs = [run.communicate(timeout=480) for run in runs]
    for run, (_stdout, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, stderr
    stdout = outputs[0][0]
    for scenario in main_scenarios(4):
        assert scenario.label in stdout
    assert "oracle" in stdout and "edges (80% load, mean of 2 seeds)" in stdout
    assert "staleness (80% load, mean of 2 seeds)" in stdout
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert a["per_seed"][1] == b["per_seed"][0] and b["main"] == b["per_seed"][0]["main"]
    rows = {row["label"]: row for row in a["main"]}
    assert set(rows) == {s.label for s in main_scenarios(4)}
    assert all(row["requests"] > 100 for row in rows.values())
    # the oracle sees true state: nothing routes with less queueing
    assert rows["oracle"]["wait_p99_ms"] == min(row["wait_p99_ms"] for row in rows.values())
    assert rows["ours (Consul only)"]["consul_writes_per_s"] > 0 and rows["round-robin"]["consul_writes_per_s"] is None
    # the tables are the means of the two seeds' own rows
    per_seed = [{row["label"]: row for row in seed["main"]} for seed in a["per_seed"]]
    assert [seed["seed"] for seed in a["per_seed"]] == [3, 4] and per_seed[0] != per_seed[1]
    for label, row in rows.items():
        assert row["ttft_p99_ms"] == pytest.approx((per_seed[0][label]["ttft_p99_ms"]
                                                    + per_seed[1][label]["ttft_p99_ms"]) / 2, abs=1e-3)
    # verdicts on the mean of the per-seed ratios, with both values and their spread printed
    target = next(t for t in a["targets"] if t["name"] == "80% ours (push + Consul) p99 TTFT / oracle")
    ratios = [per_seed[i]["ours (push + Consul)"]["ttft_p99_ms"] / per_seed[i]["oracle"]["ttft_p99_ms"]
              for i in (0, 1)]
    assert target["values"] == pytest.approx(ratios, abs=1e-3)
    assert target["mean"] == pytest.approx(sum(ratios) / 2, abs=1e-3) and target["met"] is (target["mean"] <= 1.2)
    stdout_lines = stdout.splitlines()
    assert any(line.startswith("target: 80% ours (push + Consul) p99 TTFT / oracle = ") and "mean of seeds 3,4"
               in line and "95% CI" in line and line.endswith("met") for line in stdout_lines)
    assert "P99 TTFT per seed" in stdout
    # the shipped rows' verdicts are printed; references print none
    assert not any(line.startswith("reference:") and line.endswith("met") for line in stdout_lines)
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
            row("ours (push + Consul)", 0.8, 1710, 0.9), row("ours (Consul only)", 0.8, 1900, 0.78),
            row("least-conn", 0.95, 3000), row("oracle", 0.95, 2500),
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
    # a thousand GPUs: the per-node rate x 128 nodes against 100 writes/s
    assert checks["80% ours (push + Consul) Consul writes per s at 128 nodes (budget 100/s)"].value == pytest.approx(115.2)
    assert checks["80% ours (push + Consul) Consul writes per s at 128 nodes (budget 100/s)"].met is False
    assert checks["80% ours (Consul only) Consul writes per s at 128 nodes (budget 100/s)"].met is True  # 99.84
    # the Consul-only fallback: 0.95x least-conn misses the default path's 0.85 but is no worse
    assert checks["80% ours (Consul only) p99 TTFT / least-conn"].met is False
    assert checks["80% ours (Consul only) p99 TTFT / least-conn (fallback: no worse)"].met is True
    assert not any("fallback" in name for name in checks if "Consul only" not in name or name.startswith("95%"))
    assert checks["80% before (push + Consul) p99 TTFT / oracle"].met is None
    assert checks["80% round-robin p99 TTFT / oracle"].met is None
    assert checks["ours (push + Consul), 16 edges p99 / 1 edge"].met is False  # 1.15 > 1.1


def test_seed_checks_decide_on_the_mean_and_print_the_spread():
    from routesim.report import SeedCheck

    check = SeedCheck("80% x p99 TTFT / oracle", (1, 2, 3), (1.10, 1.30, 1.17), 1.2)
    assert check.mean == pytest.approx(1.19) and check.met is True  # one seed above the limit: the mean decides
    assert check.sd == pytest.approx(0.1015, abs=1e-4)
    low, high = check.ci95  # t(0.975, 2 df) = 4.303: three seeds say little
    assert low == pytest.approx(1.19 - 4.303 * 0.1015 / 3 ** 0.5, abs=1e-3) and high > 1.2
    assert check.sure is None and check.line().endswith("CI straddles the limit): met")
    assert "1.100 / 1.300 / 1.170" in check.line()
    beyond = SeedCheck("y", (1, 2, 3), (1.30, 1.31, 1.32), 1.2)
    assert beyond.met is False and beyond.sure is False and beyond.line().endswith("NOT met")
    within = SeedCheck("z", (1, 2), (0.70, 0.71), 0.85)
    assert within.sure is True and within.line().endswith("CI within the limit): met")
    single = SeedCheck("w", (7,), (0.9,), 0.85)
    assert single.met is False and "seed 7 only" in single.line() and single.as_json()["ci95"] is None
    assert "= 1.0003 mean" in SeedCheck("v", (1, 2), (0.9, 1.1006), 1.0).line()  # rounds to the limit: more digits
    reference = SeedCheck("r", (1, 2), (2.0, 2.2), None)
    assert reference.met is None and reference.line().startswith("reference:") and "met" not in reference.line()


def test_mean_rows_average_each_row_over_seeds_and_refuse_mismatched_rows():
    from dataclasses import fields

    from routesim.report import SeedRows, Summary, mean_rows, mean_summary

    def row(label, p99, writes=None, preempt=0):
        values = {f.name: 1.0 for f in fields(Summary)}
        values.update(label=label, load=0.8, ttft_p99_ms=p99, requests=100, preemptions=preempt, misled=None,
                      consul_writes_per_s=writes, consul_writes_per_node_s=writes)
        return Summary(**values)

    a = SeedRows(1, [row("oracle", 1000.0), row("ours (Consul only)", 1500.0, 0.8, 3)], [], [], [])
    b = SeedRows(2, [row("oracle", 1200.0), row("ours (Consul only)", 1700.0, 0.9, 4)], [], [], [])
    means = mean_rows([a, b]).main
    assert [m.label for m in means] == ["oracle", "ours (Consul only)"]
    assert means[0].ttft_p99_ms == 1100.0 and means[1].consul_writes_per_node_s == pytest.approx(0.85)
    assert means[0].consul_writes_per_s is None and isinstance(means[1].preemptions, int)
    with pytest.raises(ValueError, match="different scenarios"):
        mean_summary([row("oracle", 1.0), row("least-conn", 1.0)])


def test_the_before_rows_score_without_the_admitted_prefill_term():
    from routesim.agents import BeforeScorer

    from tests.unit.eas_agent.test_score import PARAMS, scored

    scorer = BeforeScorer("drain", PARAMS)
    scored(scorer, 0.0, 0.0, 0.0, running=0.0)
    result = scored(scorer, 12_000.0, 0.0, 1.0)
    assert result.components["admitted_prefill_tokens"] == 0 and result.components["prefill_s"] == 0.0


def test_the_prefix_workloads_print_their_tables_and_every_target(tmp_path):
    """The multi-turn and shared-prefix workloads (one seed, short traces): each has its table, each target
    and reference line is printed with a verdict only on targets, and the mix's comparison rides along."""
    run = _quick_run(tmp_path, "prefix.json", seeds="4",
                     workloads="multi-turn,shared-prefix", requests=60)
    stdout, stderr = run.communicate(timeout=480)
    assert run.returncode == 0, stderr
    lines = stdout.splitlines()
    for workload in ("multi-turn", "shared-prefix"):
        assert any(f"{workload}: means over seeds 4" in line for line in lines), stdout
        assert any(line.startswith(f"target: {workload}: p99 TTFT") for line in lines), stdout
        assert any(line.startswith(f"reference: {workload}: p99 TTFT") and "oracle" in line for line in lines)
    assert any(line.startswith("target: mix: p99 TTFT") for line in lines), stdout
    assert any("16 edges / 1 edge" in line for line in lines), stdout
    assert not any(line.startswith("reference:") and line.rstrip().endswith("met") for line in lines)
