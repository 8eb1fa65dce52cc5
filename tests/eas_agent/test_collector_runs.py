"""Every collector behind one interface: the score body says, per IU, whether each collector's run worked
and how long it took; a failing collector shows its error while the others (and the other IUs) publish."""

from __future__ import annotations

import json
import math
from collections import Counter, namedtuple

import pytest

from eas_agent.agent import Agent, IUPipeline
from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import parse_config
from eas_wire.fetch import FetchError
from eas_wire.scorebody import MAX_COLLECTOR_ERROR, BodyError, CollectorRun, IUScore, ScoreBody
from sim.memstore import MemoryStore
from tests.eas_agent.test_hardening_agent import GOOD, strict_json

NicCounters = namedtuple("NicCounters", "bytes_sent bytes_recv")


class Gpus:
    """A GPU backend whose reads of ``broken`` GPUs raise (a driver bug), the others read fine."""

    def __init__(self, broken=()):
        self.broken = set(broken)

    def read(self, indices):
        if self.broken & set(indices):
            raise RuntimeError("NVML call crashed " + "x" * 500)
        return [GpuReading(index=i, memory_used_mib=70000, memory_total_mib=81559, utilization_pct=50) for i in indices]

    def close(self):
        pass


def agent_of(fetchers, gpus, netdevs=()):
    cfg = parse_config({"node": "n1", "rack": "r1", "listen": "127.0.0.1:0", "ius": [
        {"id": f"n1-iu{i}", "gpus": [i], "metrics_url": f"http://127.0.0.1:1/m{i}", "netdevs": list(netdevs)}
        for i in range(len(fetchers))]})
    pipelines = [IUPipeline(cfg, i, VllmCollector(fetch)) for i, fetch in enumerate(fetchers)]
    store = MemoryStore()
    agent = Agent(cfg, store=store, gpu_backend=gpus, pipelines=pipelines, serve_http=True,
                  pernic=lambda: {"eth0": NicCounters(1000, 1000)})
    return agent, store


def run_cycles(agent, n=3):
    for t in range(n):
        results = agent.cycle(1000.0 + t)
        agent.publisher.step(1000.0 + t, results)
    return results


def test_the_body_carries_each_collectors_outcome_and_duration():
    agent, store = agent_of([lambda: GOOD, lambda: GOOD], Gpus(), netdevs=("eth0",))
    try:
        run_cycles(agent)
        for body in (strict_json(store.kv["clusterctl/eas/dc1/n1"][1]), strict_json(agent.http.scores_json.decode())):
            for iu in ("n1-iu0", "n1-iu1"):
                runs = body["ius"][iu]["collectors"]
                assert set(runs) == {"vllm", "gpu", "network"}
                for run in runs.values():
                    assert run["ok"] is True and run["error"] is None
                    assert math.isfinite(run["duration_s"]) and 0 <= run["duration_s"] < 1.0
        typed, problems = ScoreBody.from_json(strict_json(agent.http.scores_json.decode()))
        assert not problems and typed.ius["n1-iu0"].collectors["vllm"].ok
    finally:
        agent.http.server.server_close()


def test_a_failing_collector_shows_its_error_and_the_others_still_publish():
    def refused():
        raise FetchError("GET 127.0.0.1:1/m0: connection refused")

    agent, store = agent_of([refused, lambda: GOOD], Gpus(broken=[1]))
    try:
        results = run_cycles(agent)
        body = strict_json(store.kv["clusterctl/eas/dc1/n1"][1])
        iu0, iu1 = body["ius"]["n1-iu0"]["collectors"], body["ius"]["n1-iu1"]["collectors"]
        assert iu0["vllm"]["ok"] is False and "connection refused" in iu0["vllm"]["error"]
        assert iu0["gpu"] == {"ok": True, "duration_s": iu0["gpu"]["duration_s"], "error": None}
        assert iu1["vllm"]["ok"] is True and iu1["gpu"]["ok"] is False
        assert iu1["gpu"]["error"].startswith("GPU 1: agent error: RuntimeError: NVML call crashed")
        assert len(iu1["gpu"]["error"]) == MAX_COLLECTOR_ERROR  # an excerpt
        assert "network" not in iu0  # no NICs configured: no network collector
        # the IU whose vLLM answers is still scored (its GPU is unreadable: warning, as for any such GPU)
        assert results["n1-iu1"].score is not None and results["n1-iu1"].status == "warning"
        assert body["ius"]["n1-iu1"]["score"] == results["n1-iu1"].score
        assert agent.metrics.collector_errors.labels("gpu", "n1-iu1")._value.get() == 3
        assert agent.metrics.collector_errors.labels("vllm", "n1-iu0")._value.get() == 3
    finally:
        agent.http.server.server_close()


def test_unreadable_nic_counters_are_the_network_collectors_error():
    agent, _ = agent_of([lambda: GOOD], Gpus(), netdevs=("eth0",))

    def broken():
        raise OSError("/proc/net/dev: no such file")

    agent.nics.read = broken
    try:
        results = run_cycles(agent, 1)
        run = results["n1-iu0"].collectors["network"]
        assert not run.ok and "/proc/net/dev" in run.error and results["n1-iu0"].collectors["vllm"].ok
    finally:
        agent.http.server.server_close()


def entry(**extra):
    return {"score": 0.5, "status": "passing", "reason": "", "components": {}, **extra}


def test_a_body_without_collectors_is_an_older_agents_and_reads_as_none():
    body, problems = ScoreBody.from_json({"node": "n1", "ts": 100.0, "ius": {"n1-iu0": entry()}})
    assert not problems and body.ius["n1-iu0"].collectors == {}
    assert "collectors" not in body.ius["n1-iu0"].to_json()  # and is written back the same way


def test_collectors_round_trip():
    runs = {"vllm": CollectorRun(True, 0.0021), "gpu": CollectorRun(False, 0.0004, "GPU 0: NVML: lost")}
    body = ScoreBody(node="n1", ts=100.0, ius={"n1-iu0": IUScore(0.5, "passing", collectors=runs)})
    assert ScoreBody.from_json(json.loads(body.dumps()))[0] == body


HOSTILE = [
    [], "x", 5, {"vllm": 5}, {"vllm": None}, {"vllm": {"ok": "yes", "duration_s": 0.1}},
    {"vllm": {"ok": 1, "duration_s": 0.1}}, {"vllm": {"ok": True}},
    {"vllm": {"ok": True, "duration_s": -0.1}}, {"vllm": {"ok": True, "duration_s": 1e9}},
    {"vllm": {"ok": True, "duration_s": 10**400}}, {"vllm": {"ok": True, "duration_s": "0.1"}},
    {"vllm": {"ok": True, "duration_s": True}}, {"vllm": {"ok": False, "duration_s": 0.1, "error": 5}},
    {"vllm": {"ok": False, "duration_s": 0.1, "error": ["x"]}}, {"Vllm Collector": {"ok": True, "duration_s": 0.1}},
    {"": {"ok": True, "duration_s": 0.1}}, {f"c{i}": {"ok": True, "duration_s": 0.1} for i in range(17)},
]


@pytest.mark.parametrize("collectors", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_collectors_drop_that_iu_entry_only(collectors):
    counts: Counter = Counter()
    raw = json.loads(json.dumps({"node": "n1", "ts": 100.0, "ius": {
        "n1-iu0": entry(collectors=collectors), "n1-iu1": entry()}}, allow_nan=True))
    body, problems = ScoreBody.from_json(raw, counts=counts)
    assert set(body.ius) == {"n1-iu1"} and counts == Counter(collectors_invalid=1)
    assert "n1-iu0" in problems[0] and "collectors" in problems[0]
    with pytest.raises(BodyError, match="collectors"):
        IUScore.from_json(raw["ius"]["n1-iu0"])


def test_a_long_collector_error_is_cut():
    run = CollectorRun.from_json("vllm", {"ok": False, "duration_s": 0.1, "error": "e" * 5000})
    assert run.error == "e" * MAX_COLLECTOR_ERROR


def test_score_and_status_gauges_follow_each_cycle():
    """The gauges are looked up once per IU (cheaper cycles); they still show every cycle's values."""
    from eas_agent.http import AgentMetrics
    from eas_agent.score import ScoreResult

    metrics = AgentMetrics()

    def shown(iu):
        return ({s: metrics.status.labels(iu, s)._value.get() for s in ("passing", "warning", "critical")},
                metrics.score.labels(iu, "drain")._value.get())

    metrics.observe_scores("drain", {"a": ScoreResult(0.5, "passing", ""), "b": ScoreResult(None, "warning", "x")})
    assert shown("a") == ({"passing": 1, "warning": 0, "critical": 0}, 0.5)
    assert shown("b")[0] == {"passing": 0, "warning": 1, "critical": 0} and math.isnan(shown("b")[1])
    metrics.observe_scores("drain", {"a": ScoreResult(0.7, "critical", "GPU lost"), "b": ScoreResult(0.1, "passing", "")})
    assert shown("a") == ({"passing": 0, "warning": 0, "critical": 1}, 0.7)
    assert shown("b") == ({"passing": 1, "warning": 0, "critical": 0}, 0.1)


def test_a_scrape_read_with_warnings_is_scored_and_its_warning_logged(caplog):
    from pathlib import Path

    swapped_nan = (Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "v0_swapped_nan.txt").read_text()
    agent, _ = agent_of([lambda: swapped_nan], Gpus())
    try:
        with caplog.at_level("WARNING", logger="eas_agent"):
            results = run_cycles(agent, n=1)
        (result,) = results.values() if isinstance(results, dict) else results
        assert result.score is not None
        assert any("n1-iu0: vLLM scrape read with warnings: vllm:num_requests_swapped{" in r.getMessage()
                   for r in caplog.records)
    finally:
        agent.http.server.server_close()
