"""What the demo draws (demo/view.py) at 80/100/160 columns and piped: step 6's live view fits the terminal
(edge panel first, the table cut with "+N more", rows needing attention kept), the edge's counters in an
operator's words, step 5's preflight report without what the demo says itself, and the ending."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from demo import scenario, traffic, view
from preflight import report
from tests.helpers import cli_samples as samples
from tests.helpers import score_samples
from tests.helpers.cli import check_snapshot, render_screen_at

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).resolve().parents[2] / "fixtures" / "snapshots" / "demo"
WIDTHS = [80, 100, 160, None]
IDS = ["80", "100", "160", "piped"]
HEIGHT = {80: 24, 100: 30, 160: 24, None: 25}  # piped: rich's own height when stdout is no terminal

METRICS = """\
# TYPE eas_edge_picks_total counter
eas_edge_picks_total{mode="p2c"} 280.0
eas_edge_picks_total{mode="single"} 2.0
eas_edge_picks_total{mode="fail_open"} 1.0
# TYPE eas_edge_inflight gauge
eas_edge_inflight{iu="r01n01-iu0"} 3.0
eas_edge_inflight{iu="r01n01-iu1"} 2.0
# TYPE eas_edge_queue_depth gauge
eas_edge_queue_depth 0.0
# TYPE eas_edge_push_connected gauge
eas_edge_push_connected 4.0
# TYPE eas_edge_announcements_total counter
eas_edge_announcements_total{result="sent"} 282.0
eas_edge_announcements_total{result="dropped"} 0.0
# TYPE eas_edge_announce_batches_total counter
eas_edge_announce_batches_total{result="sent"} 281.0
eas_edge_announce_batches_total{result="failed"} 1.0
eas_edge_announce_batches_total{result="dropped"} 0.0
"""


def sixteen_rows() -> list[dict]:
    """A 16-IU pool: the samples twice over (the second copy renamed), so the table never fits 24 rows."""
    rows = score_samples.rows()
    return rows + [dict(r, iu=r["iu"].replace("r0", "r1", 1)) for r in rows]


def panels(width: int, rows=None) -> object:
    """The view for a terminal of ``width`` columns and its height (piped: rich's width 80, so 24 rows)."""
    counts = traffic.counters_of(METRICS)
    return view.routing_panels(score_samples.SUMMARY, counts, rows or score_samples.rows(), 42.3, width,
                               HEIGHT[width])


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_demo_routing_view_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_screen_at(panels, width)
    check_snapshot(f"demo_routing_{width or 'piped'}.txt", text, SNAPSHOTS)
    lines = text.splitlines()
    assert lines[0].startswith("╭─ edge (42s left)")  # the latencies first, with the time left
    assert all(len(line) <= (width or 80) for line in lines) and "…" not in text
    assert len(lines) <= HEIGHT[width], f"{len(lines)} lines: the view no longer fits {width}x{HEIGHT[width]}"
    for word in ("high_outlier", "gated", "weight", "push_connected", "p2c"):  # nobody's internal words
        assert word not in text, word


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_a_pool_taller_than_the_terminal_is_cut_with_a_count_keeping_what_needs_attention(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_screen_at(lambda w: panels(w, sixteen_rows()), width)
    lines = text.splitlines()
    assert len(lines) <= HEIGHT[width]
    more = re.search(r"\+(\d+) more", text)
    assert more, text
    shown = re.findall(r"r\d\dn\d\d-iu\d", text)
    assert len(shown) + int(more.group(1)) == 16
    for iu in ("r02n02-iu1", "r02n01-iu1", "r02n01-iu0", "r01n02-iu1"):  # maintenance, warning, stuck, warming up
        assert iu in shown, (iu, text)
    assert shown == sorted(shown)  # in the pool's order


def test_the_edges_counters_in_an_operators_words():
    line = view.edge_line(traffic.counters_of(METRICS))
    assert line == ("eas-edge: 283 routed (1 fail-open), 5 in flight, 0 queued\n"
                    "4 agents pushing scores; 282 requests announced (1 batch failed)")
    # what tests/machines/test_demo.py reads from the demo's log (there the panel may wrap a phrase over a border)
    gap = r"[\s\u2502]+"
    assert re.findall(rf"(\d+){gap}requests{gap}announced", line) == ["282"]
    assert re.findall(rf"\((\d+){gap}batch(?:es)?{gap}failed", line) == ["1"]
    without_announce = "\n".join(x for x in METRICS.splitlines() if "announce" not in x) + "\n"
    busy = METRICS.replace("eas_edge_queue_depth 0.0", "eas_edge_queue_depth 7.0") + (
        "# TYPE eas_edge_rejected_total counter\neas_edge_rejected_total{reason=\"queue_full\"} 2.0\n")
    assert "5 in flight, 7 queued, 2 rejected\n4 agents" in view.edge_line(traffic.counters_of(busy))
    assert "announced" not in view.edge_line(traffic.counters_of(without_announce))
    assert view.edge_line("connection refused") == "eas-edge /metrics unavailable: connection refused"
    # two edges behind the balancer: their counters summed, each agent's stream to each edge counted once
    both = {**traffic.counters_of(METRICS, METRICS), "edges": 2, "unread": []}
    assert view.edge_line(both) == ("2 edges: 566 routed (2 fail-open), 10 in flight, 0 queued\n"
                                    "8 agent streams pushing scores; 564 requests announced (2 batches failed)")
    one_read = {**traffic.counters_of(METRICS), "edges": 1, "unread": ["http://127.0.1.11:9180: timed out"]}
    assert view.edge_line(one_read).endswith("; /metrics of 1 edge unavailable")


def test_step_5_shows_preflights_report_without_what_the_demo_says_itself():
    """The demo's one list of failures is preflight's own problems block; preflight's exit-code line, its
    per-node releases and the saved run's path (the demo says those in its own words) are left out."""
    outcome = samples.outcome()
    outcome.released = {"r01n01": ["r01n01-iu0", "r01n01-iu1"], "r02n01": ["r02n01-iu0"]}
    out = io.StringIO()
    report.print_report(Console(file=out, width=80, force_terminal=False, color_system=None), outcome,
                        saved="run 20270115T080000Z (.state/demo/x/preflight/20270115T080000Z.json; ...)")
    full = out.getvalue()
    assert "exit code 1" in full and "released from maintenance on r01n01" in full and "every detail" in full
    shown = view.preflight_report(full)
    assert "exit code" not in shown and "released from maintenance" not in shown and "every detail" not in shown
    assert shown.count("problems (") == 1 and "FAIL r01n02 iu0 gpu_topology NVLINK_MISSING" in shown
    assert shown == full[: full.index("released from maintenance")].rstrip("\n") + "\n"  # only the tail goes
    colored = "\x1b[1mexit code 1: a check failed\x1b[0m\n"
    assert view.preflight_report("table\n\n" + colored) == "table\n"


def ending(errors: int = 0) -> view.Ending:
    summary = dict(score_samples.SUMMARY, errors=errors)
    return view.Ending("r02n02", scenario.FAULTS_IN_WORDS, ("NVLINK_MISSING", "THROTTLE_ACTIVE"), 6, summary, 0,
                       ".venv/bin/clusterctl", "provisioning's events and the preflight run in .state/demo/x")


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_the_ending_says_what_was_shown_how_it_went_and_what_next(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_screen_at(lambda w: view.ending(ending()), width)
    check_snapshot(f"demo_ending_{width or 'piped'}.txt", text, SNAPSHOTS)
    assert all(len(line) <= (width or 80) for line in text.splitlines()) and "…" not in text
    labels = [line.split(":")[0] for line in text.splitlines() if line[:1] != " "]
    assert labels == ["shown", "numbers", "kept", "next"]  # the last thing on screen is what to type next
    flat = " ".join(text.split())
    assert "r02n02's injected faults (NVLink GPU2-GPU3 down" in flat and "NVLINK_MISSING, THROTTLE_ACTIVE" in flat
    assert "0 errors, 0 unroutable, 0 sent to r02n02 (target 0 each): met" in flat
    assert ".venv/bin/clusterctl virtual create -i mycluster" in flat
    assert ".venv/bin/clusterctl inventory validate -i inventory/prod" in flat
    bad = " ".join(render_screen_at(lambda w: view.ending(ending(errors=3)), width).split())
    assert "(target 0 each): NOT met (3 errors)" in bad


def test_every_step_title_fits_a_rule_at_80_columns():
    """A title too long for the rule is printed under it; at 80 columns every step's should be in it."""
    longest_batches = max((words for _, words in scenario.BATCHES.values()), key=len)
    worst = {1: {"nodes": "16 nodes", "racks": "8 racks"}, 2: {"batches": longest_batches},
             6: {"rate": 200.0, "duration": 3600.0}}
    for step, title in scenario.STEP_TITLES.items():
        text = title.format(**worst.get(step, {}))
        rendered = render_screen_at(lambda w, text=text: view.step_heading(text, w), 80)
        assert rendered.count("\n") == 1 and f"─ {text} ─" in rendered, rendered


def test_every_step_title_counts_its_place_among_all_the_steps():
    total = len(scenario.STEP_TITLES)
    assert [title.split(" ", 1)[0] for title in scenario.STEP_TITLES.values()] == [
        f"{step}/{total}" for step in range(1, total + 1)]


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_step_headings_are_never_cut(width, monkeypatch):
    """A rule cuts a title longer than the line to "…": at 80 columns (and piped, rich's 80) two of the demo's
    six step titles lost their ends in CI logs."""
    monkeypatch.delenv("COLUMNS", raising=False)
    title = "3/6 the IUs that provisioning started (vllm-iu@N: the stand-in vLLM, continuous batching)"
    text = render_screen_at(lambda w: view.step_heading(title, w), width)
    assert "…" not in text and " ".join(text.replace("─", " ").split()) == title
    assert all(len(line) <= (width or 80) for line in text.splitlines())
    short = render_screen_at(lambda w: view.step_heading("5/6 clusterctl preflight --release", w), width)
    assert short.count("\n") == 1 and "─ 5/6 clusterctl preflight --release ─" in short


def test_the_demo_ends_with_its_ending_and_keeps_only_the_evidence_it_names(tmp_path, monkeypatch):
    """After the steps (stood in for here): the temp dir is gone, the evidence dir stays under .state/demo of
    the working directory, and the last lines are the rule and the ending that names it."""
    monkeypatch.chdir(tmp_path)
    seen = {}

    def steps(self, nodes, racks, duration, rate):
        seen["workdir"], seen["evidence"] = self.workdir, self.evidence
        (self.evidence / "preflight.json").write_text("{}")
        return ending()

    monkeypatch.setattr(scenario.Demo, "run", steps)
    out = io.StringIO()
    scenario.run(Console(file=out, width=100, force_terminal=False, color_system=None), 2, 2, 5.0, None, False, 1)
    text = out.getvalue()
    assert not seen["workdir"].exists() and (tmp_path / seen["evidence"] / "preflight.json").is_file()
    assert seen["evidence"].parent == Path(".state/demo")  # relative: as typed, from where the demo ran
    lines = text.strip().splitlines()
    assert "demo finished in" in lines[0] and lines[1].startswith("shown:")
    flat = " ".join(text.split())
    assert f"preflight run in {seen['evidence']} (" in flat and "--keep keeps it" in flat
    assert "inventory/prod" in lines[-1]


def demo_pool() -> list[dict]:
    """The demo's own pool during step 6: 4 nodes x 2 IUs, r02n02's two in maintenance (preflight failed it),
    one IU busy prefilling a long prompt, one with a queue."""
    out = []
    for node in ("r01n01", "r01n02", "r02n01", "r02n02"):
        for i in (0, 1):
            iu = f"{node}-iu{i}"
            if node == "r02n02":
                out.append(score_samples.row(iu, 0.0088, health="maintenance",
                                             **score_samples.drain(step=0.0088, running=0)))
            elif iu == "r02n01-iu0":
                out.append(score_samples.row(iu, 1.798, anomaly="busy", weight=0.0,
                                             **score_samples.drain(prefill=1.789, step=0.0088)))
            elif iu == "r01n02-iu1":
                out.append(score_samples.row(iu, 0.5213, **score_samples.drain(queue=0.31, prefill=0.2,
                                                                               step=0.0113, waiting=1, running=4)))
            else:
                out.append(score_samples.row(iu, 0.0082, **score_samples.drain(step=0.0082)))
    return out


def test_the_demos_own_pool_fits_80x24_whole():
    text = render_screen_at(lambda w: panels(w, demo_pool()), 80)
    assert len(text.splitlines()) <= 23 and "more" not in text, text  # 24 rows, one for the cursor
    assert len(re.findall(r"r0\dn0\d-iu\d", text)) == 8
    busy = next(line for line in text.splitlines() if "r02n01-iu0" in line)
    assert busy.rstrip(" │").endswith("busy")  # its flag is the one word, not a paragraph


def test_the_whole_run_says_how_many_requests_continued_a_conversation():
    line = view.turns_line({**score_samples.SUMMARY, "turns": {"single": 170, "next": 70}})
    assert line.startswith("prompts: 70 of 240 sent (29%) were a conversation's next turn")
    assert view.turns_line(score_samples.SUMMARY).startswith("prompts: 0 of 0 sent were")
