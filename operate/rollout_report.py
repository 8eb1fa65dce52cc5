"""How a rollout is shown: the status table (``clusterctl rollout status``), and its report files (JSON, Markdown,
and a PNG of the weight and the gate values over time when matplotlib is installed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.table import Table

from eas_wire.rollout import RolloutDoc
from operate.report import _pyplot, _save, render_text


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else "-"


def _hold(doc: RolloutDoc, now: float) -> str:
    if doc.step >= len(doc.steps) or doc.state not in ("progressing", "promoted"):
        return "-"
    left = doc.steps[doc.step][1] - (now - doc.step_started)
    return "over" if left <= 0 else f"{left:.0f} s left"


def status_table(doc: RolloutDoc, now: float | None = None, history: int = 12) -> Table:
    """The rollout at a glance, then its last ``history`` events (with their reasons)."""
    now = time.time() if now is None else now
    table = Table(title=f"rollout {doc.name}: {doc.state}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    steps = f" of {len(doc.steps)}" if doc.steps else ""
    for name, value in (("stable", doc.stable), ("canary", doc.canary),
                        ("canary weight", f"{doc.effective_weight * 100:g}%"),
                        ("step", f"{doc.step + 1}{steps} (since {_when(doc.step_started)}, hold {_hold(doc, now)})"),
                        ("reason", doc.reason or "-"), ("updated", _when(doc.updated))):
        table.add_row(name, value)
    events = Table(title="history", title_justify="left")
    for column in ("time (UTC)", "event", "weight", "reason"):
        events.add_column(column, overflow="fold")
    for event in doc.history[-history:]:
        events.add_row(_when(event.ts), event.event, f"{event.weight * 100:g}%", event.reason or "-")
    grid = Table.grid()
    grid.add_row(table)
    grid.add_row(events)
    return grid


def write(doc: RolloutDoc, evaluations: list, out_dir: str | Path) -> list[Path]:
    """``rollout.json`` (the document and every evaluation), ``rollout.md``, ``rollout.png`` (with matplotlib)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"ts": ts, "weight": weight, "gates": [r.to_json() for r in results]}
            for ts, weight, results in evaluations]
    (out / "rollout.json").write_text(json.dumps({"document": doc.to_json(), "evaluations": rows}, indent=2) + "\n")
    (out / "rollout.md").write_text(f"# Rollout {doc.name}\n\n```\n{render_text(status_table(doc))}```\n")
    written = [out / "rollout.json", out / "rollout.md"]
    plt = _pyplot()
    if plt is not None and evaluations:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        start = evaluations[0][0]
        xs = [ts - start for ts, _, _ in evaluations]
        top.step(xs, [w * 100 for _, w, _ in evaluations], where="post")
        top.set_ylabel("canary weight %")
        for metric in {r.metric for _, _, results in evaluations for r in results}:
            points = [(ts - start, r.value) for ts, _, results in evaluations for r in results
                      if r.metric == metric and r.value is not None]
            if points:
                bottom.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=metric)
        bottom.set_xlabel("seconds since the first evaluation")
        bottom.set_ylabel("gate value")
        bottom.legend(fontsize=8)
        written.append(_save(plt, fig, out / "rollout.png"))
    return written
