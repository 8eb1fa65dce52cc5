"""Output of a preflight run: live progress, the rack -> node -> check table, JSON and JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from preflight.result import CheckResult, Verdict
from preflight.runner import Progress as RunnerProgress
from preflight.runner import RunOutcome, exit_code

COLOURS = {
    Verdict.PASS: "green",
    Verdict.WARN: "yellow",
    Verdict.FAIL: "bold red",
    Verdict.ERROR: "magenta",
    Verdict.SKIP: "dim",
    Verdict.UNREACHABLE: "bold magenta",
}
BAD = (Verdict.FAIL, Verdict.ERROR, Verdict.UNREACHABLE)


class LiveProgress(RunnerProgress):
    """nodes done/total and failures so far, redrawn in place while the runner works."""

    def __init__(self, console: Console):
        self.console = console
        self.failures = 0
        self._bar = Progress(
            TextColumn("[bold]preflight[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("nodes"),
            TextColumn("{task.fields[failures]}"),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = None

    def __enter__(self) -> LiveProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.stop()

    def start(self, nodes: int) -> None:
        self._task = self._bar.add_task(
            "nodes", total=nodes, failures=self._failures_text(), phase="node checks"
        )

    def node_done(self, node: str, results: list[CheckResult]) -> None:
        self.failures += sum(1 for r in results if r.verdict in BAD)
        self._bar.update(self._task, advance=1, failures=self._failures_text())

    def phase(self, text: str) -> None:
        self._bar.update(self._task, phase=text)

    def node_step(self, node: str, check: str) -> None:
        # One line for the whole run: the latest node/check started, so a long dcgm_diag shows where it waits.
        if self._task is not None:
            self._bar.update(self._task, phase=f"{node}: {check}")

    def _failures_text(self) -> str:
        return f"[red]{self.failures} failures[/]" if self.failures else "[green]0 failures[/]"


def summary(outcome: RunOutcome, strict: bool = False) -> dict[str, Any]:
    counts = Counter(r.verdict.value for r in outcome.results)
    by_node: dict[str, list[CheckResult]] = {}
    for r in outcome.results:
        by_node.setdefault(r.node, []).append(r)
    failed = sorted(n for n, rs in by_node.items() if any(r.verdict is Verdict.FAIL for r in rs))
    unreachable = sorted(n for n, rs in by_node.items() if all(r.verdict is Verdict.UNREACHABLE for r in rs))
    errored = sorted(
        n
        for n, rs in by_node.items()
        if n not in failed
        and n not in unreachable
        and any(r.verdict in (Verdict.ERROR, Verdict.UNREACHABLE) for r in rs)
    )
    return {
        "verdicts": {v.value: counts.get(v.value, 0) for v in Verdict},
        "nodes": len(by_node),
        "nodes_passed": len(by_node) - len(failed) - len(unreachable) - len(errored),
        "nodes_failed": failed,
        "nodes_unreachable": unreachable,
        "nodes_error": errored,
        "checks": outcome.checks,
        "depth": depth_of(outcome),
        "strict": strict,
        "released": outcome.released,
        "started": datetime.fromtimestamp(outcome.started, UTC).isoformat(timespec="seconds"),
        "duration_s": round(outcome.duration, 2),
        "exit_code": exit_code(outcome.results, strict),
    }


def depth_of(outcome: RunOutcome) -> str:
    """The depth of the run; "per profile" when nodes ran different profile defaults."""
    return getattr(outcome.options, "depth", None) or "per profile"


def to_json(outcome: RunOutcome, strict: bool = False) -> dict[str, Any]:
    return {"results": [r.to_json() for r in outcome.results], "summary": summary(outcome, strict)}


def write_json(path: str | Path, outcome: RunOutcome, strict: bool = False) -> None:
    Path(path).write_text(json.dumps(to_json(outcome, strict), indent=2, default=str) + "\n")


def to_junit(outcome: RunOutcome) -> ET.Element:
    """One <testsuite> per rack, one <testcase> per result (classname rack.node, name check[iu])."""
    suites = ET.Element("testsuites", name="clusterctl preflight", time=f"{outcome.duration:.2f}")
    properties = ET.SubElement(suites, "properties")
    ET.SubElement(properties, "property", name="depth", value=depth_of(outcome))
    racks: dict[str, list[CheckResult]] = {}
    for r in outcome.results:
        racks.setdefault(r.rack, []).append(r)
    totals = Counter()
    for rack, results in racks.items():
        counts = Counter(r.verdict for r in results)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=f"rack {rack}",
            tests=str(len(results)),
            failures=str(counts[Verdict.FAIL]),
            errors=str(counts[Verdict.ERROR] + counts[Verdict.UNREACHABLE]),
            skipped=str(counts[Verdict.SKIP]),
        )
        totals.update(counts)
        for r in results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"{r.rack}.{r.node}",
                name=r.check + (f"[{r.iu}]" if r.iu else ""),
            )
            detail = json.dumps(r.evidence, default=str, indent=1)
            if r.verdict is Verdict.FAIL:
                ET.SubElement(case, "failure", message=r.reason, type=r.code).text = detail
            elif r.verdict in (Verdict.ERROR, Verdict.UNREACHABLE):
                ET.SubElement(case, "error", message=r.reason, type=r.verdict.value).text = detail
            elif r.verdict is Verdict.SKIP:
                ET.SubElement(case, "skipped", message=r.reason)
            else:
                ET.SubElement(case, "system-out").text = f"{r.verdict.value}: {r.reason}"
    suites.set("tests", str(len(outcome.results)))
    suites.set("failures", str(totals[Verdict.FAIL]))
    suites.set("errors", str(totals[Verdict.ERROR] + totals[Verdict.UNREACHABLE]))
    return suites


def write_junit(path: str | Path, outcome: RunOutcome) -> None:
    tree = ET.ElementTree(to_junit(outcome))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def verdict_text(verdict: Verdict) -> str:
    return f"[{COLOURS[verdict]}]{verdict.value}[/]"


def results_table(results: list[CheckResult], title: str = "preflight") -> Table:
    table = Table(title=title, show_lines=False, header_style="bold")
    for column in ("rack", "node", "check", "iu", "verdict", "reason"):
        table.add_column(column, overflow="fold", no_wrap=column != "reason")
    last_rack = last_node = None
    for r in results:
        new_node = (r.rack, r.node) != (last_rack, last_node)
        if new_node and last_node is not None:
            table.add_section()
        table.add_row(
            r.rack if r.rack != last_rack else "",
            r.node if new_node else "",
            r.check,
            (r.iu or "").removeprefix(f"{r.node}-"),
            verdict_text(r.verdict),
            r.reason,
        )
        last_rack, last_node = r.rack, r.node
    return table


def print_report(console: Console, outcome: RunOutcome, strict: bool = False) -> None:
    console.print(results_table(outcome.results, title=f"preflight (depth: {depth_of(outcome)})"))
    s = summary(outcome, strict)
    parts = [verdict_text(Verdict(v)) + f" {n}" for v, n in s["verdicts"].items() if n]
    console.print(
        f"[bold]{s['nodes']} nodes[/], {s['nodes_passed']} passed  |  "
        + "  ".join(parts)
        + f"  |  {s['duration_s']:g}s"
    )
    for label, key in (
        ("failed", "nodes_failed"),
        ("unreachable", "nodes_unreachable"),
        ("could not check", "nodes_error"),
    ):
        if s[key]:
            console.print(f"{label}: {', '.join(s[key])}")
    for node, ids in (s["released"] or {}).items():
        console.print(f"released from maintenance on {node}: {', '.join(ids) or 'nothing in maintenance'}")
    console.print(f"exit code {s['exit_code']}")
