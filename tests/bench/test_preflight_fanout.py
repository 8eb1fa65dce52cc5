"""bench/preflight_fanout.py's table (no machines): it names the depth the sizes ran at, the new checks'
controller CPU per node and x floor."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
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
