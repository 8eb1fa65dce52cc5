"""bench/provision_scale.py's tables: the apt cache comparison pairs the first runs of one size, and the
empty-cache run never stands in for the pre-seeded one in the main table or the targets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import provision_scale as bench  # noqa: E402

pytestmark = pytest.mark.unit


def m(run: str, wall: float, cache: str = "preseeded", fetched: float = 0.0, cpu: float = 8.0) -> bench.Measurement:
    return bench.Measurement(4, 4, run, wall, cpu, 5.0, 400.0, 0 if run == "rerun" else 60, 0, 0, cache, fetched)


def test_cache_table_pairs_first_runs_empty_and_preseeded():
    table = bench.cache_table([m("first", 100.0), m("rerun", 40.0), m("first", 160.0, "empty", 120.5)])
    assert "| 4 | 160.0 / 100.0 | 0.62 | 120.5 / 0.0 | 5.0 / 5.0 |" in table


def test_no_cache_table_without_both_variants():
    assert bench.cache_table([m("first", 100.0), m("rerun", 40.0)]) == ""


def test_the_empty_cache_run_is_not_the_main_tables_first_run():
    results = [m("first", 100.0), m("rerun", 40.0), m("first", 10.0, "empty")]
    assert "| 4 | 4 | 100.0 | 40.0 | 0.40 |" in bench.table(results)
    summary = "\n".join(bench.summary(results))
    assert "rerun / first = 0.40 (target <= 0.5: met)" in summary
    assert "controller CPU per host on the rerun = 2.00 CPU-s (target <= 1.0: NOT met)" in summary


@pytest.mark.parametrize("cpu, verdict", [(4.0, "met"), (4.4, "NOT met")])
def test_the_cpu_target_says_met_only_when_met(cpu, verdict):
    summary = "\n".join(bench.summary([m("first", 100.0), m("rerun", 40.0, cpu=cpu)]))
    assert f"(target <= 1.0: {verdict})" in summary


def test_a_number_just_over_a_limit_is_printed_with_the_digits_that_show_it():
    # 1.002 CPU-s per host printed as "1.00 CPU-s (target <= 1.0: NOT met)" read as a wrong verdict
    summary = "\n".join(bench.summary([m("first", 100.0), m("rerun", 50.1, cpu=4.008)]))
    assert "rerun / first = 0.501 (target <= 0.5: NOT met)" in summary
    assert "controller CPU per host on the rerun = 1.002 CPU-s (target <= 1.0: NOT met)" in summary
