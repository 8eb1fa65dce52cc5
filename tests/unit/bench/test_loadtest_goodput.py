"""bench/loadtest_goodput.py's judgement (the pure parts; the bench itself runs for minutes): which requests
count toward goodput, and a target line that says "met" only when the edge's goodput is at least each
baseline's."""

from __future__ import annotations

import math

import pytest

from bench import loadtest_goodput as bench
from bench.results import verdict_of
from operate.loadgen import Outcome

pytestmark = pytest.mark.unit

LIMITS = {"A": {"ttft": 0.85}, "B": {"ttft": 2.2}}


def outcome(klass: str, ttft: float | None, error: str | None = None) -> Outcome:
    return Outcome(0, klass, 0.0, 0.0, 100, 10, ttft_s=ttft, e2e_s=None if ttft is None else ttft + 1.0,
                   error=error)


def test_a_request_counts_toward_goodput_only_answered_within_its_own_class_limit():
    assert bench.within_slo(outcome("A", 0.85), LIMITS)
    assert not bench.within_slo(outcome("A", 0.851), LIMITS)
    assert bench.within_slo(outcome("B", 2.0), LIMITS)  # B's limit, not A's
    assert not bench.within_slo(outcome("A", None, error="http_503"), LIMITS)
    assert not bench.within_slo(outcome("A", 0.1, error="cut_stream"), LIMITS)


def rows(edge: float, in_flight: float, haproxy: float, rate: float = 16.0) -> list[dict]:
    return [{"rate": rate, "router": r, "goodput": g}
            for r, g in zip(bench.ROUTERS, (edge, in_flight, haproxy), strict=True)]


@pytest.mark.parametrize(("edge", "in_flight", "haproxy", "expected"), [
    (15.0, 12.0, 11.0, "met"),
    (15.0, 15.0, 15.0, "met"),  # equal is at least as good
    (15.0, 15.2, 11.0, "not met"),  # behind one baseline is not met
    (14.99, 15.0, 15.0, "not met"),
])
def test_the_target_line_says_met_only_when_the_edge_is_at_least_each_baseline(edge, in_flight, haproxy, expected):
    line, ratios = bench.verdict(rows(edge, in_flight, haproxy), 16.0, 4)
    assert verdict_of(line) == expected
    assert ratios == {"edge least-in-flight": edge / in_flight, "haproxy leastconn": edge / haproxy}


def test_a_ratio_just_under_one_never_prints_as_one():
    line, _ = bench.verdict(rows(15.0, 15.0001, 15.0), 16.0, 4)
    assert "1.000x" not in line.split(",")[0] and verdict_of(line) == "not met"


def test_a_baseline_with_no_goodput_is_beaten():
    line, ratios = bench.verdict(rows(3.0, 0.0, 2.0), 16.0, 4)
    assert math.isinf(ratios["edge least-in-flight"]) and verdict_of(line) == "met"


def test_the_scenario_is_the_production_mix_with_short_answers():
    mix = bench.scenario()
    assert [(k.name, k.share, k.slo.limits()) for k in mix.classes] == [
        ("A", 0.65, {"ttft": 0.85}), ("B", 0.3, {"ttft": 2.2}), ("C", 0.05, {"ttft": 5.5})]
    assert all(k.output.mean == bench.OUTPUT_TOKENS["mean"] for k in mix.classes)
