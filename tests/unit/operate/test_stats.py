"""The SLO verdict: nearest-rank p99, failures as infinitely slow, too few samples never "met"."""

from __future__ import annotations

import math

import pytest

from operate import stats
from operate.loadgen import Outcome
from operate.scenario import parse_scenario

pytestmark = pytest.mark.unit

SCENARIO = parse_scenario({"name": "s", "classes": {
    "A": {"share": 0.5, "prompt_tokens": 100, "output_tokens": 10, "slo": {"ttft_p99_ms": 500, "e2e_p99_ms": 2000}},
    "B": {"share": 0.5, "prompt_tokens": 100, "output_tokens": 10, "slo": {"ttft_p99_ms": 1000}}}})


def ok(klass: str, ttft: float, e2e: float = 1.0, index: int = 0) -> Outcome:
    return Outcome(index, klass, 0.0, 0.0, 100, 10, ttft_s=ttft, e2e_s=e2e, itl_s=0.02, tokens=10)


def failed(klass: str, error: str) -> Outcome:
    return Outcome(0, klass, 0.0, 0.0, 100, 10, error=error)


def test_percentile_is_nearest_rank():
    values = [float(i) for i in range(1, 101)]
    assert stats.percentile(values, 99) == 99.0 and stats.percentile(values, 50) == 50.0
    assert stats.percentile([3.0], 99) == 3.0 and stats.percentile([], 99) is None
    assert stats.percentile([5.0, 1.0, 3.0], 50) == 3.0


def test_met_and_missed_per_slo():
    outcomes = [ok("A", 0.1 + i / 1000, e2e=1.5) for i in range(100)] + [ok("B", 0.9) for _ in range(99)]
    outcomes.append(ok("B", 1.2))  # the 100th of B: p99 is still 0.9
    verdicts = stats.verdicts(stats.class_stats(outcomes, SCENARIO, 10.0), SCENARIO)
    assert [(v.klass, v.metric, v.verdict) for v in verdicts] == [
        ("A", "ttft", "met"), ("A", "e2e", "met"), ("B", "ttft", "met")]
    assert stats.all_met(verdicts)
    outcomes += [ok("B", 1.2) for _ in range(3)]  # 4 of 103 over 1 s: p99 over the limit
    verdicts = stats.verdicts(stats.class_stats(outcomes, SCENARIO, 10.0), SCENARIO)
    assert verdicts[2].verdict == "not met" and verdicts[2].p99_s == 1.2 and not stats.all_met(verdicts)


def test_failures_count_as_infinitely_slow():
    outcomes = [ok("A", 0.1) for _ in range(97)] + [failed("A", "http_503"), failed("A", "cut_stream"),
                                                    failed("A", "timeout")]
    outcomes += [ok("B", 0.1) for _ in range(100)]
    by_class = stats.class_stats(outcomes, SCENARIO, 10.0)
    assert dict(by_class["A"].errors) == {"http_503": 1, "cut_stream": 1, "timeout": 1} and by_class["A"].ok == 97
    assert math.isinf(by_class["A"].latency["ttft"][99]) and by_class["A"].latency["ttft"][50] == 0.1
    verdicts = stats.verdicts(by_class, SCENARIO)
    assert verdicts[0].verdict == "not met" and verdicts[0].as_dict()["p99_s"] == "inf"
    one_failure = [ok("A", 0.1) for _ in range(199)] + [failed("A", "timeout")] + [ok("B", 0.1)] * 100
    assert stats.verdicts(stats.class_stats(one_failure, SCENARIO, 10.0), SCENARIO)[0].verdict == "met"  # 0.5%


def test_too_few_samples_is_not_met():
    outcomes = [ok("A", 0.1) for _ in range(stats.MIN_SAMPLES - 1)] + [ok("B", 0.1) for _ in range(100)]
    verdicts = stats.verdicts(stats.class_stats(outcomes, SCENARIO, 10.0), SCENARIO)
    assert verdicts[0].verdict == "too few" and not verdicts[0].met and not stats.all_met(verdicts)
    assert stats.verdicts(stats.class_stats([], SCENARIO, 1.0), SCENARIO)[2].verdict == "too few"
    assert not stats.all_met([])
