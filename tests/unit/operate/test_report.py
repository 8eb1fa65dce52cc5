"""The one report writer: JSON and Markdown always, PNGs with matplotlib, for each kind of result."""

from __future__ import annotations

import json
import random

import pytest

from operate import calibrate, report
from operate.calibrate import Sample
from tests.unit.operate.test_loadtest import result

pytestmark = pytest.mark.unit


def test_a_calibration_is_written_as_json_markdown_and_a_plot(tmp_path):
    rng = random.Random(1)
    by_unit = {u: [Sample(u, w * k, w * k, w, 1000) for w in (rng.uniform(0, 0.5) for _ in range(30))]
               for u, k in (("u1", 1.0), ("u2", 1.1), ("u3", 0.2))}
    cal = calibrate.Calibration("http://127.0.0.1:9", 12600.0, calibrate.judge(by_unit), by_unit, 90, 0,
                                breaker=calibrate.BreakerCheck("u1", 40, 0))
    written, note = report.write(cal, tmp_path)
    assert note is None and sorted(p.name for p in written) == ["calibration.json", "calibration.md",
                                                                "calibration.png"]
    data = json.loads((tmp_path / "calibration.json").read_text())
    assert data["flagged"] == ["u3"] and data["breaker"]["passed"] and not data["passed"]
    assert "misleads" in (tmp_path / "calibration.md").read_text()
    assert (tmp_path / "calibration.png").read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_numbers_are_still_written(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_pyplot", lambda: None)
    written, note = report.write(result(1, 0.2), tmp_path)
    assert [p.name for p in written] == ["loadtest.json", "loadtest.md"] and "matplotlib" in note
    assert json.loads((tmp_path / "loadtest.json").read_text())["passed"] is True
