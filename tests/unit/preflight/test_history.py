"""Saved runs (preflight/history.py): private files, saved, listed, loaded and diffed."""

from __future__ import annotations

import os
import stat

import pytest

from preflight import history, report
from preflight.result import Verdict
from tests.unit.preflight.test_report import sample_outcome

pytestmark = pytest.mark.unit


def test_history_files_are_private(tmp_path):
    """A saved run carries host output (reasons, evidence: stderr lines); like provision's events.jsonl
    it is 0600 in a 0700 directory whatever the umask."""
    old = os.umask(0o022)
    try:
        saved = history.save(tmp_path / "state" / "preflight", {"results": []}, {}, started=1_800_000_000)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(saved.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(saved.path.parent).st_mode) == 0o700


def test_history_saves_lists_loads_and_diffs(tmp_path):
    first, second = sample_outcome(), sample_outcome()
    a = history.save(tmp_path, report.to_json(first), {"inventory": "inv"}, started=1_800_000_000)
    doc = report.to_json(second)
    doc["results"] = [dict(r, verdict="PASS", reason="ok") if r["node"] == "b" else r for r in doc["results"]]
    b = history.save(tmp_path, doc, {"inventory": "inv"}, started=1_800_000_000)
    assert (a.id, b.id) == ("20270115T080000Z", "20270115T080000Z-1")
    assert [r.id for r in history.runs(tmp_path)] == [a.id, b.id]
    assert history.load(tmp_path, "latest").id == b.id and history.load(tmp_path, "previous").id == a.id
    [change] = history.diff(history.load(tmp_path, a.id), history.load(tmp_path, "latest")).changes
    assert (change.key[1], change.kind, change.before.verdict, change.after.verdict) == (
        "b",
        "fixed",
        Verdict.FAIL,
        Verdict.PASS,
    )
    with pytest.raises(Exception, match="2 runs matching '2027'"):
        history.load(tmp_path, "2027")
