"""Output of a preflight run: the on-call table, JSON and JUnit XML (the progress while it runs is
:mod:`preflight.progress`).

The table is for the person on call: failures first (FAIL, UNREACHABLE, ERROR, then WARN), PASS and SKIP
rows collapsed into one line per node unless ``show_pass``, a host whose checks all ended the same way
(unreachable, or every check "not run" after a timeout) in one row, the evidence code and the first few
details beside each reason. It closes with one greppable line per problem
(``FAIL <node> <iu> <check> <CODE>: <reason>``, like NHC's fault lines and pytest's short summary), the
counts and what the exit code means.

Everything a host said (reasons, details, codes) is shown as plain text (:class:`rich.text.Text`), never
as rich markup: a ``[/]`` in a command's stderr must not crash the report or restyle it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from common.errors import ExitCode
from common.text import plural
from preflight.result import CheckResult, Verdict
from preflight.runner import RunOutcome, exit_code

COLOURS = {
    Verdict.PASS: "green",
    Verdict.WARN: "yellow",
    Verdict.FAIL: "bold red",
    Verdict.ERROR: "magenta",
    Verdict.SKIP: "dim",
    Verdict.UNREACHABLE: "bold magenta",
}
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


def junit_text(outcome: RunOutcome) -> str:
    root = to_junit(outcome)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


def write_junit(path: str | Path, outcome: RunOutcome) -> None:
    Path(path).write_text(junit_text(outcome) + "\n", encoding="utf-8")


EXIT_MEANING = {
    ExitCode.OK: "every check passed",
    ExitCode.FAILED: "a check failed",
    ExitCode.USAGE: "usage, inventory or profile error",
    ExitCode.UNREACHABLE: "a host was unreachable or a check could not run (nothing failed)",
}
# the order problems are listed in: worst first
ORDER = {Verdict.FAIL: 0, Verdict.UNREACHABLE: 1, Verdict.ERROR: 2, Verdict.WARN: 3, Verdict.PASS: 4, Verdict.SKIP: 5}
TOP_DETAILS = 3  # details shown under a reason in the table; the rest are in --json and the saved run


def verdict_text(verdict: Verdict) -> Text:
    return Text(verdict.value, style=COLOURS[verdict])


def details(result: CheckResult) -> list[str]:
    """The individual problems behind a result's one-line reason (its evidence), worst first as the check
    listed them: ``evidence.problems`` (node checks) or each measurement's ``problems`` (ib_pairs)."""
    found: list[str] = []
    problems = result.evidence.get("problems")
    if isinstance(problems, list):
        found += [str(p) for p in problems if isinstance(p, str | int | float)]
    measured = result.evidence.get("found")
    if not found and isinstance(measured, list):
        for item in measured:
            if isinstance(item, dict) and isinstance(item.get("problems"), list):
                found += [str(p) for p in item["problems"]]
    return found


@dataclass(frozen=True)
class Row:
    """One table row: a result, or several results of one node that ended with the same verdict and reason."""

    results: tuple[CheckResult, ...]
    node_checks: frozenset[str] = frozenset()  # every check the node has a result for

    @property
    def first(self) -> CheckResult:
        return self.results[0]

    @property
    def checks(self) -> list[str]:
        return sorted({r.check for r in self.results})

    @property
    def check(self) -> str:
        """The check, or for a collapsed row: ``all 8 checks``, ``all but gpu_topology``, or the list."""
        if len(self.results) == 1:
            return self.first.check
        names = self.checks
        rest = sorted(self.node_checks - set(names))
        if not rest:
            return f"all {len(names)} checks"
        if len(rest) <= 2:
            return "all but " + ", ".join(rest)
        return ", ".join(names)

    @property
    def iu(self) -> str:
        ius = {r.iu for r in self.results}
        return _short_iu(self.first.node, self.first.iu) if len(ius) == 1 else "*"


def _short_iu(node: str, iu: str | None) -> str:
    return (iu or "").removeprefix(f"{node}-")


def problem_rows(results: list[CheckResult]) -> list[Row]:
    """Non-passing results as rows, worst verdict first, then rack/node/check order; a node's results with
    one verdict and one reason (an unreachable host, checks not run after a timeout) become one row."""
    bad = [r for r in results if r.verdict not in (Verdict.PASS, Verdict.SKIP)]
    node_checks: dict[str, set[str]] = {}
    for r in results:
        node_checks.setdefault(r.node, set()).add(r.check)
    groups: dict[tuple, list[CheckResult]] = {}
    for r in bad:
        groups.setdefault((r.node, r.verdict, r.reason), []).append(r)
    rows = []
    for members in groups.values():
        if len(members) > 1 and len({m.code for m in members}) == 1:
            rows.append(Row(tuple(members), frozenset(node_checks[members[0].node])))
        else:
            rows += [Row((m,)) for m in members]
    return sorted(rows, key=lambda row: (ORDER[row.first.verdict], row.first.rack, row.first.node,
                                         row.first.check, row.first.iu or ""))


def results_table(results: list[CheckResult], width: int, show_pass: bool = False,
                  title: str = "preflight") -> Table:
    """The on-call table. ``width`` (the console's) decides the layout: below 140 columns the rack and code
    columns fold into the reason cell so the reason keeps most of the line."""
    wide = width >= 140
    table = Table(title=title, header_style="bold", expand=False)
    columns = (["rack"] if wide else []) + ["node", "check", "iu", "verdict"] + (["code"] if wide else [])
    for column in columns:
        table.add_column(column, no_wrap=column in ("rack", "node", "iu", "verdict"), overflow="fold")
    table.add_column("reason", overflow="fold", ratio=1)
    rows = problem_rows(results)
    for row in rows:
        r = row.first
        reason = Text(r.reason)
        if not wide and r.code:
            reason = Text.assemble((r.code, "bold"), ": ", r.reason)
        extra = details(r)[1:] if len(row.results) == 1 else []
        for line in extra[:TOP_DETAILS]:
            reason.append("\n- " + line, style="dim")
        if len(extra) > TOP_DETAILS:
            reason.append(f"\n- (+{len(extra) - TOP_DETAILS} more in --json / the saved run)", style="dim")
        cells = ([Text(r.rack)] if wide else []) + [Text(r.node), Text(row.check), Text(row.iu),
                                                     verdict_text(r.verdict)]
        cells += ([Text(r.code)] if wide else []) + [reason]
        table.add_row(*cells)
    passing = [r for r in results if r.verdict in (Verdict.PASS, Verdict.SKIP)]
    if show_pass:
        for r in sorted(passing, key=lambda r: (r.rack, r.node, r.check, r.iu or "")):
            cells = ([Text(r.rack)] if wide else []) + [Text(r.node), Text(r.check), Text(_short_iu(r.node, r.iu)),
                                                         verdict_text(r.verdict)]
            table.add_row(*cells, *([Text(r.code)] if wide else []), Text(r.reason))
    return table


def hidden_line(results: list[CheckResult]) -> Text | None:
    """What the collapsed PASS/SKIP rows were: how many, and the nodes where every check passed."""
    passing = [r for r in results if r.verdict in (Verdict.PASS, Verdict.SKIP)]
    if not passing:
        return None
    clean = sorted({r.node for r in passing} - {r.node for r in results if r.verdict not in (Verdict.PASS, Verdict.SKIP)})
    return Text(
        f"{plural(len(passing), 'PASS/SKIP row')} not shown (--show-pass lists them)"
        + (f"; every check passed on {plural(len(clean), 'node')}: {_names(clean)}" if clean else ""),
        style="dim",
    )


def _names(names: list[str], limit: int = 12) -> str:
    return ", ".join(names) if len(names) <= limit else ", ".join(names[:limit]) + f", ... (+{len(names) - limit})"


def failure_lines(results: list[CheckResult], strict: bool = False) -> list[str]:
    """``FAIL <node> <iu> <check> <CODE>: <reason>``, one per problem row (``-`` for no IU, ``*`` for
    several), worst first: the lines to grep, alert on or paste into a ticket."""
    shown = (Verdict.FAIL, Verdict.UNREACHABLE, Verdict.ERROR) + ((Verdict.WARN,) if strict else ())
    lines = []
    for row in problem_rows(results):
        r = row.first
        if r.verdict not in shown:
            continue
        check = "*" if row.check.startswith("all ") and not row.check.startswith("all but") else ",".join(row.checks)
        reason = " ".join(r.reason.split())  # one line, whatever the host printed
        lines.append(f"{r.verdict.value} {r.node} {row.iu or '-'} {check} {r.code or '-'}: {reason}")
    return lines


def print_report(console: Console, outcome: RunOutcome, strict: bool = False, show_pass: bool = False,
                 saved: str | None = None) -> None:
    """Table, then the failures block, counts and the exit code's meaning. ``saved``: where the whole
    run (every detail and evidence) was written, named in the closing lines."""
    if show_pass or problem_rows(outcome.results):
        console.print(results_table(outcome.results, console.width, show_pass,
                                    title=f"preflight (depth: {depth_of(outcome)})"))
        if not show_pass and (hidden := hidden_line(outcome.results)):
            console.print(hidden)
    elif outcome.results:  # nothing to list: no empty table, just what passed
        nodes = sorted({r.node for r in outcome.results})
        # No table, so no title naming the depth: this line says which depth ran.
        console.print(Text(f"every check passed on {plural(len(nodes), 'node')}: {_names(nodes)} "
                           f"(depth: {depth_of(outcome)}; {plural(len(outcome.results), 'PASS/SKIP row')}; "
                           "--show-pass lists them)"), soft_wrap=True)  # one physical line, as the fault lines
    s = summary(outcome, strict)
    lines = failure_lines(outcome.results, strict)
    if lines:
        nodes = {line.split(" ", 2)[1] for line in lines}
        console.print()
        console.print(Text(f"problems ({len(lines)} on {plural(len(nodes), 'node')}):", style="bold"))
        for line in lines:
            # soft_wrap: one physical line each, never folded at the terminal width, so grep finds it whole
            console.print(Text(line), soft_wrap=True)
    console.print()
    nodes_part = [f"{plural(s['nodes'], 'node')}: {s['nodes_passed']} passed"]
    for label, key in (("failed", "nodes_failed"), ("unreachable", "nodes_unreachable"),
                       ("could not check", "nodes_error")):
        if s[key]:
            nodes_part.append(f"{len(s[key])} {label} ({_names(s[key])})")
    counts = Text("  ").join(
        Text.assemble(verdict_text(Verdict(v)), f" {n}") for v, n in s["verdicts"].items() if n
    )
    console.print(Text.assemble(Text(", ".join(nodes_part), style="bold"), "  |  ", counts,
                                f"  |  {s['duration_s']:g}s"))
    for node, ids in (s["released"] or {}).items():
        console.print(Text(f"released from maintenance on {node}: {', '.join(ids) or 'nothing in maintenance'}"))
    if saved:
        console.print(Text(f"every detail and the evidence: {saved}", style="dim"), soft_wrap=True)
    code, warned = s["exit_code"], s["verdicts"].get(Verdict.WARN.value, 0)
    if code == ExitCode.OK and warned:  # not "every check passed": a WARN did not pass, it is tolerated
        meaning = f"no check failed ({warned} WARN; --strict fails them)"
    else:
        meaning = EXIT_MEANING.get(code, "?") + (" (WARN counts as failure: --strict)"
                                                 if strict and code == ExitCode.FAILED else "")
    console.print(Text(f"exit code {code}: {meaning}"))
