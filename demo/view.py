"""What ``clusterctl demo`` draws (:mod:`demo.scenario` runs it): the step headings, step 5's preflight report
without what the demo says itself, step 6's live routing view sized to the terminal, and the ending.

Rendering only: every function takes plain data (the clients' summary, the edge's counters, score rows) and
returns a rich renderable or text, so each is drawn by the tests at 80/100/160 columns and piped.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from common.text import plural

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The closing lines of `clusterctl preflight`'s report (preflight/report.py print_report) that the demo
# says in its own words: the per-node releases (one summary line), where the run was saved (the demo's
# ending names the kept evidence) and the exit code's meaning (preflight exits 1 there by design).
PREFLIGHT_LINES_SAID_BY_THE_DEMO = ("released from maintenance on ", "every detail and the evidence: ", "exit code ")


def step_heading(title: str, width: int) -> Rule | Group:
    """A step's heading: the title inside a rule when it fits the width, else a plain rule over the title on
    its own (wrapped) lines; a rule cuts a longer title to "…" (an 80-column CI log lost half of two titles)."""
    heading = Text(title, style="bold")
    if len(title) + 6 <= width:  # rich's rule keeps "─ " and " ─" around the title
        return Rule(heading)
    return Group(Rule(), heading)


def preflight_report(text: str) -> str:
    """Step 5's preflight report as the demo shows it: preflight's own output without the lines the demo
    says itself (:data:`PREFLIGHT_LINES_SAID_BY_THE_DEMO`); the blank line before the exit code goes too."""
    kept = [line for line in text.splitlines()
            if not ANSI.sub("", line).startswith(PREFLIGHT_LINES_SAID_BY_THE_DEMO)]
    while kept and not ANSI.sub("", kept[-1]).strip():
        kept.pop()
    return "\n".join(kept) + "\n" if kept else ""


# -- step 6: the live routing view ------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def latency_lines(s: dict) -> str:
    """The clients' view of the edge: latencies over the last window, then the totals."""
    return (f"last {s['window_s']:.0f}s: {s['completed_window']} done, TTFT p50 {_ms(s['ttft_p50_s'])} "
            f"p95 {_ms(s['ttft_p95_s'])}, e2e p50 {_s(s['e2e_p50_s'])} p95 {_s(s['e2e_p95_s'])}\n"
            f"total {s['completed_total']} done, {s['inflight']} in flight, {s['errors']} errors, "
            f"{s['unroutable']} unroutable")


def turns_line(s: dict) -> str:
    """What the clients sent (:class:`demo.traffic.DemoPrompts`): how many requests continued a conversation,
    the prompts a unit's prefix cache can serve ("hit" in the scores table)."""
    turns = s.get("turns") or {}
    sent = turns.get("single", 0) + turns.get("next", 0)
    share = f" ({turns.get('next', 0) / sent:.0%})" if sent else ""
    return (f"prompts: {turns.get('next', 0)} of {sent} sent{share} were a conversation's next turn (its last "
            f"prompt and answer first), the others single turns of unique token ids")


def edge_line(counts: dict | str) -> str:
    """The edge's own /metrics (:func:`demo.traffic.edge_counters`) in an operator's words; a string is why
    they could not be read."""
    if isinstance(counts, str):
        return f"eas-edge /metrics unavailable: {counts}"
    edges = int(counts.get("edges", 1))
    picks = counts.get("picks", {})
    routed = sum(picks.get(mode, 0) for mode in ("p2c", "single", "fail_open"))
    # rejections and retries only when there are any: the line stays within 80 columns when all is well
    held = [f", {counts.get(key, 0):.0f} {key}" for key in ("rejected", "retried") if counts.get(key)]
    first = (f"{'eas-edge' if edges == 1 else f'{edges} edges'}: {routed:.0f} routed ({picks.get('fail_open', 0):.0f} fail-open), "
             f"{counts.get('inflight', 0):.0f} in flight, {counts.get('queued', 0):.0f} queued" + "".join(held))
    pushing = int(counts.get("agents_pushing", 0))  # an agent pushes to every edge: one stream each
    second = [f"{plural(pushing, 'agent')} pushing scores" if edges == 1 else
              f"{plural(pushing, 'agent stream')} pushing scores"]
    if counts.get("scores_ignored"):
        second.append(f"{counts['scores_ignored']:.0f} scores ignored")
    announced = counts.get("announced", {})
    if announced:  # only an edge with the announce channel on has any
        failed = int(counts.get("announce_batches", {}).get("failed", 0))
        second.append(f"{announced.get('sent', 0):.0f} requests announced "
                      f"({plural(failed, 'batch', 'batches')} failed)")
    if counts.get("unread"):
        second.append(f"/metrics of {plural(len(counts['unread']), 'edge')} unavailable")
    return first + "\n" + "; ".join(second)


def _attention(row: dict) -> bool:
    """A row an operator looks at first: flagged (not merely busy), not passing, or stale."""
    return (row["anomaly"] not in (None, "busy")) or row["health"] != "passing" or row["stale"]


def _lines(renderable: RenderableType, width: int) -> int:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    return len(console.render_lines(renderable, console.options.update(height=None), pad=False))


def routing_panels(summary: dict, edge: dict | str, score_rows: list[dict], left_s: float, width: int,
                   height: int | None = None) -> Group:
    """Step 6's live view: the clients' latencies and the edge's own counters first (the point of the step,
    never pushed off a short terminal), then the scores table cut to the rows that fit ``height`` lines,
    with ``+N more`` under it: rows that need attention (a flag, not passing, stale) are kept first."""
    from cli.views.scores import table

    panel = Panel(Text(latency_lines(summary) + "\n" + edge_line(edge)), title=f"edge ({max(0, left_s):.0f}s left)",
                  title_align="left")
    title = "IU scores (drain: seconds until free)"

    def view(shown: list[dict], hidden: int) -> Group:
        return Group(panel, table(shown, title, width, caption=f"+{hidden} more" if hidden else None))

    whole = view(score_rows, 0)
    if height is None or _lines(whole, width) <= height:
        return whole
    order = sorted(range(len(score_rows)), key=lambda i: (not _attention(score_rows[i]), i))
    for keep in range(len(score_rows) - 1, -1, -1):
        kept = sorted(order[:keep])
        candidate = view([score_rows[i] for i in kept], len(score_rows) - keep)
        if _lines(candidate, width) <= height:
            return candidate
    return candidate


# -- the ending ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ending:
    """What the demo showed and how it went: the three closing lines (and where its evidence was kept)."""

    faulty: str  # the node with the injected faults
    faults: str  # them, in words
    codes: tuple[str, ...]  # the evidence codes preflight FAILed it with
    released: int  # IUs released from maintenance
    summary: dict  # the clients' whole-run summary (demo.traffic.DemoEdge.summary)
    to_faulty: int  # requests the edge sent to the faulty node's IUs
    clusterctl: str  # how to type clusterctl here (its path when it is not on PATH)
    kept: str  # where the evidence was kept, and how to read it


def ending(e: Ending) -> Table:
    """The demo's last lines: what was shown, whether the numbers met their targets, what to type next."""
    s = e.summary
    misses = [(n, what) for n, what in ((s["errors"], "errors"), (s["unroutable"], "unroutable"),
                                       (e.to_faulty, f"sent to {e.faulty}")) if n]
    counted = f"{s['errors']} errors, {s['unroutable']} unroutable, {e.to_faulty} sent to {e.faulty}"
    verdict = ("met" if not misses else "NOT met (" + ", ".join(f"{n} {what}" for n, what in misses) + ")")
    lines = [
        ("shown", f"{e.faulty}'s injected faults ({e.faults}) caught by preflight ({', '.join(e.codes)}); its "
                  f"IUs stayed in maintenance while eas-edge routed {s['completed_total']} requests to the "
                  f"{plural(e.released, 'released IU')}"),
        ("numbers", f"{counted} (target 0 each): {verdict}. Latency has no target here (simulated engines "
                    "sharing this machine's CPUs); routing quality against its targets is bench/route_sim.py's "
                    "(bench/README.md)"),
        ("kept", e.kept),
        ("next", f"your own virtual cluster: {e.clusterctl} virtual create -i mycluster --faults none (README: "
                 f"\"Your own virtual cluster\"); a unit faulted under load, measured and undone: {e.clusterctl} drill "
                 f"--list (docs/drills.md); real hosts: copy inventory/sample to inventory/prod, then "
                 f"{e.clusterctl} inventory validate -i inventory/prod"),
    ]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, text in lines:
        grid.add_row(f"{label}:", Text(text))
    return grid
