"""The generator's plan: Poisson arrivals at the rate (seeded), the mix's shares, exact token-id prompts."""

from __future__ import annotations

import json
import statistics

import pytest

from operate.loadgen import TOKEN_POOL, Planned, TokenPool, plan, request_body
from operate.scenario import load_scenario

pytestmark = pytest.mark.unit


def test_arrivals_are_poisson_at_the_rate():
    planned = plan(load_scenario(), rate=20.0, duration_s=500.0, seed=7)
    n = len(planned)
    assert abs(n - 10000) < 4 * 100  # Poisson count: mean 10,000, sd 100
    gaps = [b.at - a.at for a, b in zip(planned, planned[1:], strict=False)]
    mean = statistics.fmean(gaps)
    assert abs(mean - 0.05) < 0.05 * 0.04
    assert abs(statistics.pstdev(gaps) / mean - 1.0) < 0.04  # exponential gaps: coefficient of variation 1
    # memoryless: the share of gaps above the mean is e^-1
    assert abs(sum(g > mean for g in gaps) / len(gaps) - 0.3679) < 0.02
    # counts per 1 s window: variance equals mean (index of dispersion 1), unlike a paced or bursty source
    counts = [0] * 500
    for p in planned:
        counts[int(p.at)] += 1
    assert abs(statistics.pvariance(counts) / statistics.fmean(counts) - 1.0) < 0.2
    assert all(0 < p.at < 500 for p in planned) and planned == sorted(planned, key=lambda p: p.at)


def test_the_plan_is_reproducible_and_follows_the_mix():
    a = plan(load_scenario(), 10.0, 300.0, seed=3)
    assert a == plan(load_scenario(), 10.0, 300.0, seed=3)
    assert a != plan(load_scenario(), 10.0, 300.0, seed=4)
    shares = {k: sum(1 for p in a if p.klass == k) / len(a) for k in "ABC"}
    assert abs(shares["A"] - 0.65) < 0.04 and abs(shares["B"] - 0.30) < 0.04 and abs(shares["C"] - 0.05) < 0.02
    assert plan(load_scenario(), 0.0, 10.0, seed=1) == [] and plan(load_scenario(), 5.0, 0.0, seed=1) == []


@pytest.mark.parametrize("tokens", [1, 327, 12842, TOKEN_POOL + 5])
def test_a_prompt_is_exactly_its_planned_token_ids(tokens):
    pool = TokenPool(seed=2)
    request = Planned(0, 0.0, "A", tokens, 16, offset=TOKEN_POOL - 3)  # wraps around the pool's end
    body = json.loads(request_body(pool, request, "m"))
    assert len(body["prompt"]) == tokens and all(isinstance(t, int) and 1000 <= t < 30000 for t in body["prompt"])
    assert body["max_tokens"] == 16 and body["stream"] is True and body["ignore_eos"] is True and body["model"] == "m"
    other = json.loads(request_body(pool, Planned(1, 0.0, "A", tokens, 16, offset=11), None))
    assert "model" not in other and other["prompt"][:8] != body["prompt"][:8]
