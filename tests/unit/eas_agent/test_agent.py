"""Every collector behind one interface: the score body says, per IU, whether each collector's run worked
and how long it took; a failing collector shows its error while the others (and the other IUs) publish."""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter, namedtuple

import pytest

from eas_agent.agent import Agent, IUPipeline
from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import parse_config
from eas_wire.fetch import FetchError, HttpFetcher
from eas_wire.scorebody import MAX_COLLECTOR_ERROR, BodyError, CollectorRun, IUScore, ScoreBody
from sim.memstore import MemoryStore
from tests.helpers.hostile import GOOD, DripServer, hostile_scrape, replace_sample, strict_json

pytestmark = pytest.mark.unit

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
    cfg = parse_config({"node": "n1", "rack": "r1", "listen": "127.0.0.1:0", "kernel_log": False, "ius": [
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


class NoGpus:
    def read(self, indices):
        return []

    def close(self):
        pass


def config(n_ius: int = 2, scrape_timeout_s: float = 0.15):
    return parse_config(
        {
            "node": "n1",
            "rack": "r1",
            "listen": "127.0.0.1:0",
            "kernel_log": False,  # the host's own /dev/kmsg is no input of these tests
            "scrape_timeout_s": scrape_timeout_s,
            "ius": [
                {"id": f"n1-iu{i}", "gpus": [i], "metrics_url": f"http://127.0.0.1:1/m{i}"}
                for i in range(n_ius)
            ],
        }
    )


def agent_with(fetchers, cfg=None, serve_http=True):
    cfg = cfg or config(len(fetchers))
    pipelines = [IUPipeline(cfg, i, VllmCollector(fetch)) for i, fetch in enumerate(fetchers)]
    store = MemoryStore()
    agent = Agent(cfg, store=store, gpu_backend=NoGpus(), pipelines=pipelines, serve_http=serve_http)
    return agent, store


@pytest.mark.parametrize(
    "sample, value",
    [
        ("vllm:num_requests_running", "NaN"),
        ("vllm:num_requests_running", "+Inf"),
        ("vllm:num_requests_waiting", "NaN"),
        ("vllm:num_requests_waiting", "-1e6"),
        ("vllm:kv_cache_usage_perc", "+Inf"),
        ("vllm:prompt_tokens_total", "NaN"),
        ("vllm:prompt_tokens_total", "-Inf"),
    ],
)
def test_bad_sample_makes_that_iu_unknown_and_the_rest_publish(sample, value):
    bad = replace_sample(GOOD, sample, value)
    agent, store = agent_with([lambda: GOOD, lambda: bad])
    try:
        for t in range(3):
            results = agent.cycle(1000.0 + t)  # guards against: ValueError out of cycle (the agent stopped)
            agent.publisher.step(1000.0 + t, results)
        good, broken = results["n1-iu0"], results["n1-iu1"]
        assert good.status == "passing" and good.score is not None and good.score >= 0
        assert broken.score is None and broken.status == "warning"
        assert "non-finite or negative" in broken.reason and sample in broken.reason
        body = strict_json(store.kv["clusterctl/eas/dc1/n1"][1])
        assert body["ius"]["n1-iu1"]["score"] is None and body["ius"]["n1-iu0"]["score"] == good.score
        served = strict_json(agent.http.scores_json.decode())  # what /scores serves
        assert served["ius"]["n1-iu1"]["status"] == "warning"
        errors = agent.metrics.collector_errors.labels("vllm", "n1-iu1")._value.get()
        assert errors == 3
    finally:
        agent.http.server.server_close()


def test_failing_iu_logs_at_most_once_a_minute(caplog):
    bad = replace_sample(GOOD, "vllm:num_requests_running", "NaN")
    agent, _ = agent_with([lambda: GOOD, lambda: bad], serve_http=False)
    with caplog.at_level(logging.WARNING, logger="eas_agent"):
        for t in range(50):
            agent.cycle(1000.0 + t * 0.2)
    lines = [r for r in caplog.records if "n1-iu1" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


def test_a_bug_in_one_iu_never_stops_the_cycle():
    def explode():
        raise KeyError("collector bug")

    agent, _ = agent_with([lambda: GOOD, explode], serve_http=False)
    results = agent.cycle(1000.0)
    assert results["n1-iu0"].status == "passing"
    assert results["n1-iu1"].score is None and "KeyError" in results["n1-iu1"].reason


@pytest.mark.parametrize("slow_index", [1, 0])
def test_one_dripping_endpoint_does_not_stall_the_node(slow_index):
    """Headers dripped too: on a worker thread only the agent's abort at the deadline can stop that read; the
    first IU is scraped on the cycle's own thread, where its fetcher's deadline stops it."""
    server = DripServer(header_drip=True)
    try:
        cfg = config(3)
        slow = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=cfg.scrape_timeout_s)
        fetchers = [lambda: GOOD, lambda: GOOD, lambda: GOOD]
        fetchers[slow_index] = slow
        agent, store = agent_with(fetchers, cfg=cfg, serve_http=False)
        started = time.monotonic()
        for t in range(5):
            results = agent.cycle(1000.0 + t * 0.2)
            agent.publisher.step(1000.0 + t * 0.2, results)
        elapsed = time.monotonic() - started
        assert elapsed < 5 * (cfg.scrape_timeout_s + 0.2), elapsed  # guards against: one cycle took seconds
        fine = [f"n1-iu{i}" for i in range(3) if i != slow_index]
        assert results[fine[0]].status == results[fine[1]].status == "passing"
        assert results[f"n1-iu{slow_index}"].score is None and results[f"n1-iu{slow_index}"].status == "warning"
        published = json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["ius"]
        assert published[fine[0]]["status"] == "passing"  # the node kept publishing
    finally:
        server.close()


def test_one_iu_dripping_its_headers_is_cut_at_the_deadline():
    """A node with one IU scrapes it on the cycle's own thread (no executor, no abort): the fetcher itself
    must hold the deadline while reading the headers. Guards against: one cycle took the whole drip (4.2 s)."""
    server = DripServer(header_drip=True)
    try:
        cfg = config(1)
        slow = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=cfg.scrape_timeout_s)
        agent, store = agent_with([slow], cfg=cfg, serve_http=False)
        for t in range(3):
            started = time.monotonic()
            results = agent.cycle(1000.0 + t * 0.2)
            assert time.monotonic() - started < cfg.scrape_timeout_s + 0.2
            agent.publisher.step(1000.0 + t * 0.2, results)
        assert results["n1-iu0"].score is None and results["n1-iu0"].status == "warning"
        assert f"within {cfg.scrape_timeout_s:g} s" in results["n1-iu0"].reason
        assert json.loads(store.kv["clusterctl/eas/dc1/n1"][1])["ius"]["n1-iu0"]["status"] == "warning"
    finally:
        server.close()


def test_malformed_metrics_never_stop_the_agent(tally):
    rng = random.Random(1501)
    cfg = parse_config({"node": "n1", "rack": "r1", "ius": [
        {"id": "n1-iu0", "gpus": [0], "metrics_url": "http://127.0.0.1:1/a"},
        {"id": "n1-iu1", "gpus": [1], "metrics_url": "http://127.0.0.1:1/b"},
    ]})
    box = {"text": GOOD}

    class NoGpus:
        def read(self, indices):
            return []

        def close(self):
            pass

    pipelines = [IUPipeline(cfg, 0, VllmCollector(lambda: GOOD)), IUPipeline(cfg, 1, VllmCollector(lambda: box["text"]))]
    store = MemoryStore()
    agent = Agent(cfg, store=store, gpu_backend=NoGpus(), pipelines=pipelines, serve_http=False)
    n = 1500
    for t in range(n):
        box["text"] = hostile_scrape(rng)
        now = 1000.0 + t * 0.2
        results = agent.cycle(now)
        agent.publisher.step(now, results)
        for r in results.values():
            assert r.score is None or (math.isfinite(r.score) and r.score >= 0), (box["text"], r)
        # the healthy IU keeps its score (its constant counters make it "frozen" after 10 s: warning, scored)
        assert results["n1-iu0"].score is not None, results["n1-iu0"]
    body = strict_json(store.kv["clusterctl/eas/dc1/n1"][1])
    assert set(body["ius"]) == {"n1-iu0", "n1-iu1"}
    tally.inputs("vLLM scrapes (NaN/Inf/negative/garbage)", n)


def test_a_scrape_read_with_warnings_is_scored_and_its_warning_logged(caplog):
    from pathlib import Path

    swapped_nan = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm" / "v0_swapped_nan.txt").read_text()
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
