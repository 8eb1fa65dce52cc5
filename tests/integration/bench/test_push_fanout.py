"""bench/push_fanout.py on a small run: both modes deliver every body to every edge, and the verdict line says
"met" only when the stream's agent cost is within the target ratio."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import push_fanout  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_both_modes_deliver_every_body_to_every_edge():
    _idle, rows = push_fanout.run([2], rate=20.0, window=1.5, settle=0.8)
    assert [(row["edges"], row["mode"]) for row in rows] == [(2, "poll"), (2, "stream")]
    for row in rows:
        served = 20.0 * row["wall_s"]
        assert row["errors"] == 0
        assert all(0.8 * served <= delivered <= 1.2 * served + 1 for delivered in row["delivered"]), row["delivered"]
        assert 0 <= push_fanout.percentile(row["ages"], 50) < 0.5


def row(edges: int, mode: str, agent_cpu_s: float) -> dict:
    return {"edges": edges, "mode": mode, "agent_cpu_s": agent_cpu_s, "agent_wall_s": 10.0, "wall_s": 10.0,
            "cpu_s": 0.1, "delivered": [110] * edges, "ages": [0.001], "errors": 0}


def test_the_verdict_is_met_only_within_the_ratio():
    met = push_fanout.report(0.005, [row(16, "poll", 0.73), row(16, "stream", 0.22)], 11.0)
    missed = push_fanout.report(0.005, [row(16, "poll", 0.73), row(16, "stream", 0.45)], 11.0)
    assert met[-1].endswith(": met") and "0.25x" in met[-1]
    assert missed[-1].endswith("NOT met") and "0.59x" in missed[-1]


def test_a_ratio_just_under_the_limit_is_not_printed_as_the_limit():
    lines = push_fanout.report(0.0, [row(16, "poll", 0.8), row(16, "stream", 0.3998)], 11.0)
    assert lines[-1].endswith(": met") and "0.4998x" in lines[-1]  # not "0.50x ... (target <= 0.5): met"
