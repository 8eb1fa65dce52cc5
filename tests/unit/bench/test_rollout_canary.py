"""bench/rollout_canary.py's evidence: the moment the edges had counted what the controller's gates needed, read
from the watcher's readings against the counters as the failing step began."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.rollout_canary import evidence_at  # noqa: E402

pytestmark = pytest.mark.unit

PLAN = SimpleNamespace(stable="s", canary="c", min_requests=60)
EVENTS = [(10.0, "progressing", 0.2), (20.0, "aborted", 0.0)]  # the step at 20% began at t=10


def reading(t: float, stable: int, canary: int, units: dict | None = None) -> tuple:
    return (t, [0.2, 0.2], {"s": stable, "c": canary}, {}, units or {})


def test_the_evidence_is_the_first_reading_with_min_requests_on_each_side_since_the_step_began():
    readings = [reading(9.98, 500, 0), reading(10.02, 505, 1), reading(11.0, 560, 40), reading(12.0, 570, 61)]
    assert evidence_at(PLAN, readings, EVENTS, errors=False) == 12.0


def test_a_watcher_woken_late_after_the_step_began_still_counts_from_before_the_step():
    # the loaded host's watcher slept through the step's first 0.9 s: its first reading in the step already holds
    # 40 canary answers, which the controller (its base scraped as it wrote the step) counted
    readings = [reading(9.98, 500, 0), reading(10.9, 545, 40), reading(11.5, 570, 61)]
    assert evidence_at(PLAN, readings, EVENTS, errors=False) == 11.5


def test_per_unit_evidence_needs_two_units_a_side_each_with_a_quarter_of_min_requests():
    before = {("s", "a"): 100, ("s", "b"): 100, ("c", "x"): 0, ("c", "y"): 0}
    one_unit = {("s", "a"): 140, ("s", "b"): 140, ("c", "x"): 61, ("c", "y"): 3}
    both = {("s", "a"): 150, ("s", "b"): 150, ("c", "x"): 62, ("c", "y"): 16}
    readings = [reading(9.99, 200, 0, before), reading(10.8, 280, 64, one_unit), reading(11.2, 300, 78, both)]
    assert evidence_at(PLAN, readings, EVENTS, errors=False, per_unit=True) == 11.2
