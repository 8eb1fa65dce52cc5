"""bench/preflight_fanout.py's table (no machines): it names the depth the sizes ran at, the new checks'
controller CPU per node and x floor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import preflight_fanout  # noqa: E402


def row(nodes, wall, controller, machines):
    return {"nodes": nodes, "racks": 1, "wall_s": wall, "peak_rss_kib": 70 * 1024, "cpu_self_s": controller,
            "cpu_children_s": 0.0, "cpu_machines_s": machines, "exit_code": 0,
            "verdicts": {"PASS": 17 * nodes, "FAIL": 0, "SKIP": 2 * nodes}, "load": "1.0 1.0 1.0"}


def test_the_table_names_the_depth_and_gives_controller_cpu_per_node_and_x_floor():
    text = preflight_fanout.table([row(1, 27.4, 1.9, 4.9), row(64, 403.5, 28.7, 742.3)], 64, 1.0, depth="full")
    header, columns, _, one, many = text.splitlines()
    assert "depth full" in header and "checks: all but numa_pinning,consul" in header
    assert "| per node |" in columns and "| x floor |" in columns
    assert "| 1.900 |" in one and "| 0.448 |" in many  # controller CPU-s per node


def test_every_result_that_is_not_pass_or_skip_is_kept_and_printed_under_the_table():
    """Healthy machines must give no FAIL: the bench keeps each one's node, check and code (the run's JSON
    goes with its temp dir), so a FAIL at scale can be traced to its cause."""
    run = {"results": [
        {"node": "r01n01", "iu": None, "check": "time_sync", "verdict": "PASS", "reason": "ok", "evidence": {"code": "OK"}},
        {"node": "r02n07", "iu": "r02n07-iu0", "check": "nvlink", "verdict": "FAIL", "reason": "2 links down",
         "evidence": {"code": "NVLINK_INACTIVE"}},
        {"node": "r03n01", "iu": None, "check": "dcgm_diag", "verdict": "ERROR", "reason": "timed out", "evidence": {}},
    ]}
    problems = preflight_fanout.problems_of(run)
    assert problems == ["FAIL r02n07 r02n07-iu0 nvlink NVLINK_INACTIVE: 2 links down",
                        "ERROR r03n01 - dcgm_diag -: timed out"]
    text = preflight_fanout.table([{**row(64, 403.5, 28.7, 742.3), "problems": problems}], 64, 1.0)
    assert text.splitlines()[-2:] == [f"64 nodes: {p}" for p in problems]
