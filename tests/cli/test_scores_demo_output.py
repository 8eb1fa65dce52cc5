"""`clusterctl scores` and the demo's routing view at 80/100/160 columns and piped: every score term
(prefill_s included) shown, an anomaly flag says why, agent text is not markup, nothing cut to "…",
and at 100x30 the edge panel is on screen."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from cli.commands import scores
from sim import demo
from tests.cli import score_samples
from tests.cli.test_preflight_output import check_snapshot

WIDTHS = [80, 100, 160, None]
IDS = ["80", "100", "160", "piped"]


def render(renderable_for_width, width):
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    console.print(renderable_for_width(console.width))
    return out.getvalue()


def scores_table(width):
    return scores.table(score_samples.rows(), "EAS scores (127.0.0.1:8500, dc1)", width)


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_scores_table_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render(scores_table, width)
    check_snapshot(f"scores_{width or 'piped'}.txt", text)
    assert all(len(line) <= (width or 80) for line in text.splitlines())
    assert "…" not in text
    assert "prefill_s 1.95" in text  # the term the review found missing
    assert "high_outlier:" in text and "median" in text  # and why it is flagged
    assert "[/]" in text  # the agent's text as it is, not as markup


def test_cells_say_it_all():
    rows = score_samples.rows()
    outlier = rows[2]
    assert scores.terms_text(outlier["components"]) == "prefill_s 1.95 + step_s 0.0011"
    assert scores.flag_why(outlier, rows) == "high_outlier: 1.95 vs pool median 0.0013; gated (weight 0)"


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_demo_routing_view_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render(lambda w: demo.routing_panels(score_samples.SUMMARY, "edge /metrics: pick p2c 12", score_samples.rows(), 42.3, w), width)
    check_snapshot(f"demo_routing_{width or 'piped'}.txt", text)
    lines = text.splitlines()
    assert lines[0].startswith("╭─ edge (42s left)")  # the latencies first, with the time left
    assert all(len(line) <= (width or 80) for line in lines) and "…" not in text
    if width == 100:
        assert len(lines) <= 30, f"{len(lines)} lines: the view no longer fits a 100x30 terminal"


def test_terms_add_up_to_the_score():
    for row in score_samples.rows():
        if row["score"] is None:
            continue
        text = scores.terms_text(row["components"])
        total = sum(float(part.split()[1]) for part in text.split(" + ")) if text != "0" else 0.0
        assert abs(total - row["score"]) < 1e-3, (row["iu"], text)


def test_flag_reasons_for_every_flag():
    rows = score_samples.rows()
    frozen = dict(rows[0], anomaly="frozen", weight=0.3)
    ramp = dict(rows[0], anomaly="ramp")
    assert scores.flag_why(frozen, rows) == "frozen: no new tokens for 6s, 2 requests pending; weight 0.3"
    assert scores.flag_why(ramp, rows) == "ramp: new or back in rotation; weight rises to 1 in 10s"
