"""bench/loadgen.py end to end at a low rate (its upstream in a subprocess on 127.0.0.77) and its verdict rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import loadgen  # noqa: E402

pytestmark = pytest.mark.integration


def test_a_short_run_records_rows_and_a_verdict(tmp_path, capsys):
    out = tmp_path / "loadgen.json"
    assert loadgen.main(["--rates", "10,20", "--duration", "1.5", "--results", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = result["numbers"]["rows"]
    assert [r["rate"] for r in rows] == [10.0, 20.0] and all(r["errors"] == 0 and r["requests"] > 0 for r in rows)
    assert all(r["cpu_ms_per_request"] > 0 for r in rows)
    assert result["verdict"] == "not met"  # 20 req/s is below the 100 req/s target whatever the lag
    assert printed.strip().splitlines()[-1] == result["summary"]


def test_the_highest_rate_held_needs_every_lower_rate_held():
    rows = [{"rate": r, "lag_p99_ms": lag, "errors": 0} for r, lag in ((25, 0.5), (50, 1.4), (100, 0.6))]
    assert loadgen.highest_held(rows)["rate"] == 25
    assert loadgen.highest_held([{"rate": 25, "lag_p99_ms": 2.0, "errors": 0}]) is None
    assert loadgen.highest_held([{"rate": 25, "lag_p99_ms": 0.1, "errors": 1}]) is None
