"""A run's result (verdict, render, JSON) and the sweep's stopping rule and goodput, on made-up outcomes."""

from __future__ import annotations

import pytest

from operate import loadtest
from operate.loadgen import Outcome
from operate.report import render_text
from operate.scenario import parse_scenario

pytestmark = pytest.mark.unit

SCENARIO = parse_scenario({"name": "s", "classes": {
    "A": {"share": 0.9, "prompt_tokens": 100, "output_tokens": 10, "slo": {"ttft_p99_ms": 500}},
    "B": {"share": 0.1, "prompt_tokens": 100, "output_tokens": 10, "slo": {"ttft_p99_ms": 500}}}})


def result(rate: float, ttft_a: float, b_requests: int = 60, interrupted: bool = False) -> loadtest.Result:
    outcomes = [Outcome(i, "A", 0.0, 0.0001, 100, 10, ttft_s=ttft_a, e2e_s=1.0, itl_s=0.02, tokens=10)
                for i in range(100)]
    outcomes += [Outcome(i, "B", 0.0, 0.0001, 100, 10, ttft_s=0.1, e2e_s=1.0, itl_s=0.02, tokens=10)
                 for i in range(b_requests)]
    return loadtest.Result(SCENARIO, "http://127.0.0.1:9", rate, 10.0, outcomes, 10.0, len(outcomes), interrupted)


def test_a_result_renders_its_verdicts_and_passes_only_when_all_are_met():
    good, slow, short = result(1, 0.2), result(1, 0.7), result(1, 0.2, b_requests=5)
    assert good.passed and not good.missed
    assert not slow.passed and slow.missed and "not met" in render_text(slow.render())
    assert not short.passed and not short.missed and "too few" in render_text(short.render())
    assert not result(1, 0.2, interrupted=True).passed
    data = good.as_dict()
    assert data["passed"] and [v["verdict"] for v in data["slo"]] == ["met", "met"]
    assert "PASSED" in render_text(good.render()) and "(interrupted: partial results)" in render_text(
        result(1, 0.2, interrupted=True).render())


def test_the_sweep_stops_at_the_first_miss_and_goes_past_too_few(monkeypatch):
    runs = {1.0: result(1, 0.2, b_requests=5), 2.0: result(2, 0.2), 4.0: result(4, 0.7), 8.0: result(8, 0.2)}
    asked = []

    def fake_run(endpoint, scenario, rate, duration_s, **kwargs):
        asked.append(rate)
        return runs[rate]

    async def fake_probe(endpoint, api_key=None):
        return "m"

    monkeypatch.setattr(loadtest, "run", fake_run)
    monkeypatch.setattr(loadtest, "probe", fake_probe)
    sweep = loadtest.sweep("http://127.0.0.1:9", SCENARIO, [8.0, 1.0, 4.0, 2.0], 10.0)
    assert asked == [1.0, 2.0, 4.0] and sweep.stopped_early
    assert sweep.goodput == 2.0 and sweep.passed
    text = render_text(sweep.render())
    assert "goodput: 2 req/s" in text and "too few" in text
