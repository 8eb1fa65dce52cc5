"""The demo's routing view (sim/demo.py) at 80/100/160 columns and piped: latencies first, nothing cut to "…",
and at 100x30 the edge panel is on screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo import scenario as demo
from tests.cli import score_samples
from tests.cli.helpers import check_snapshot, render_at

SNAPSHOTS = Path(__file__).parent / "snapshots"
WIDTHS = [80, 100, 160, None]
IDS = ["80", "100", "160", "piped"]


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_demo_routing_view_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_at(lambda w: demo.routing_panels(score_samples.SUMMARY, "edge /metrics: pick p2c 12", score_samples.rows(), 42.3, w), width)
    check_snapshot(f"demo_routing_{width or 'piped'}.txt", text, SNAPSHOTS)
    lines = text.splitlines()
    assert lines[0].startswith("╭─ edge (42s left)")  # the latencies first, with the time left
    assert all(len(line) <= (width or 80) for line in lines) and "…" not in text
    if width == 100:
        assert len(lines) <= 30, f"{len(lines)} lines: the view no longer fits a 100x30 terminal"


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_step_headings_are_never_cut(width, monkeypatch):
    """A rule cuts a title longer than the line to "…": at 80 columns (and piped, rich's 80) two of the demo's
    six step titles lost their ends in CI logs."""
    monkeypatch.delenv("COLUMNS", raising=False)
    title = "3/6 the IUs that provisioning started (vllm-iu@N: the stand-in vLLM, continuous batching)"
    text = render_at(lambda w: demo.step_heading(title, w), width)
    assert "…" not in text and " ".join(text.replace("─", " ").split()) == title
    assert all(len(line) <= (width or 80) for line in text.splitlines())
    short = render_at(lambda w: demo.step_heading("5/6 clusterctl preflight --release", w), width)
    assert short.count("\n") == 1 and "─ 5/6 clusterctl preflight --release ─" in short
