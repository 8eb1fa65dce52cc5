"""The Consul write-load targets, checked on a short run of bench/consul_load.py's simulation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[3] / "bench" / "consul_load.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("consul_load_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_write_load_and_score_age_targets():
    result = load_bench().run(nodes=4, duration=150.0, seed=2)
    assert result["raft_per_node_s"] <= 1.0
    assert result["naive_per_node_s"] / result["raft_per_node_s"] >= 10.0
    assert result["age_p99"] <= 2.0  # one heartbeat
    assert result["reasons"].get("level", 0) > 0  # the load trace does move levels: not heartbeat-only
