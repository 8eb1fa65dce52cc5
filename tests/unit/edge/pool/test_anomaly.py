"""edge/pool/anomaly.py: what the edges announced is judged as known work up to a bound, beyond it with the
score."""

from __future__ import annotations

import pytest

from edge.pool import AnomalyDetector, IUEntry
from edge.pool.anomaly import ANNOUNCED_EXCUSED_REQUESTS

pytestmark = pytest.mark.unit


def pool(announced_s: float, request_cost_s: float | None = 0.2, scraped: float = 0.2) -> list[IUEntry]:
    """Five IUs at ~0.2 s and one whose /scores body adds ``announced_s`` to a scraped ``scraped``."""
    def entry(k: int, score: float, **components) -> IUEntry:
        return IUEntry(f"n1-iu{k}", "n1", "r1", score, "passing", "", 10.0, 2.0, "passing",
                       components={"running": 1, "tokens_total": 1000.0, **components})
    cost = {} if request_cost_s is None else {"request_cost_s": request_cost_s}
    quiet = [entry(k, 0.2 + 0.01 * k, **cost) for k in range(5)]
    return [*quiet, entry(5, round(scraped + announced_s, 4), announced_s=announced_s, **cost)]


def test_announced_work_within_the_bound_is_not_an_outlier():
    """One long prompt's prefill announced (120,000 tokens at 10,000 tokens/s): known work."""
    assert 12.0 < ANNOUNCED_EXCUSED_REQUESTS * 0.2
    assert AnomalyDetector().observe(pool(12.0), 10.0)["n1-iu5"].flag is None


def test_announced_work_beyond_the_bound_is_judged_with_the_score():
    """A flood of announcements (the agent's own bound is 16 maximal prompts: ~210 s here) is seen."""
    verdict = AnomalyDetector().observe(pool(209.7), 10.0)["n1-iu5"]
    assert verdict.flag == "high_outlier" and verdict.weight == 0.0


def test_without_a_mean_request_cost_all_announced_work_is_excused():
    assert AnomalyDetector().observe(pool(209.7, request_cost_s=None), 10.0)["n1-iu5"].flag is None
