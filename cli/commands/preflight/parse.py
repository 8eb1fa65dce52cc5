"""``clusterctl preflight parse KIND FILE [--json] [--profile P [--gpus N]]``: read one saved tool output the
way preflight does.

On-call pastes an output from a ticket into a file (or stdin with ``-``) and sees what preflight would
see: a table, or with ``--json`` exactly the object of ``docs/contracts/parse-json.md``. With ``--profile``
it also gets the verdict the check would give (:mod:`preflight.parse_verdict`, the check's own evaluate).
Unreadable input exits 1 with one line naming the line of the file that could not be read; a verdict
with a FAIL exits 1 too, as preflight does.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.help import examples
from cli.options import SuggestingChoice
from common.errors import ClusterctlError, ExitCode
from preflight.parse_verdict import JUDGED, judge
from preflight.parsers import PARSERS, ParseError, parse, parse_warnings, to_contract_json
from preflight.result import Verdict


@click.command("parse", epilog=examples(
    "clusterctl preflight parse nccl all_reduce_perf.txt",
    "clusterctl preflight parse nccl ticket.txt --profile h100-sxm --gpus 8",
    "nvidia-smi topo -m | clusterctl preflight parse topo - --json",
    note="KIND is one of: " + ", ".join(sorted(PARSERS)) + ". --profile judges: " + ", ".join(JUDGED) + "."))
@click.argument("kind", type=SuggestingChoice(sorted(PARSERS)), metavar="KIND")
@click.argument("file", type=click.File("rb"))
@click.option("--json", "as_json", is_flag=True, help="Print the contract JSON instead of a table.")
@click.option("--profile", metavar="PROFILE",
              help="Also give the check's verdict under this preflight profile (h100-sxm, a100-sxm, ...).")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs of the node (default: as many as the output shows).")
@click.option("--iu-size", type=click.IntRange(min=1), help="GPUs per IU for the verdict (default: the inventory's, 4).")
def command(kind: str, file: Any, as_json: bool, profile: str | None, gpus: int | None, iu_size: int | None) -> None:
    """Parse FILE (or - for stdin) as output of KIND and print it."""
    name = "<stdin>" if file.name == "<stdin>" else file.name
    if name == "<stdin>" and sys.stdin.isatty():
        click.echo(f"reading {kind} output from stdin (paste it, then Ctrl-D)", err=True)
    # Bytes, decoded leniently: a paste with a stray Latin-1 byte or binary garbage must reach the
    # parser (and its one-line ParseError), not stop in a UnicodeDecodeError.
    text = file.read().decode("utf-8", errors="replace")
    try:
        result = parse(kind, text)
    except ParseError as exc:
        if not text.strip():  # "line 0: ...: ''" said the same less plainly
            raise ClusterctlError(f"{name}: empty: no {kind} output to parse", ExitCode.FAILED) from exc
        raise ClusterctlError(f"{name}: cannot parse as {kind}: {_one_line(str(exc))}", ExitCode.FAILED) from exc
    warnings = parse_warnings(text, result)
    data = to_contract_json(kind, result, warnings)
    verdict = None
    if profile is not None:
        results, assumed = judge(kind, result, warnings, profile, gpus, iu_size)
        verdict = {"profile": profile, "assumed": assumed,
                   "results": [{"check": r.check, "iu": r.iu, "verdict": str(r.verdict), "code": r.code,
                                "reason": r.reason, "evidence": r.evidence} for r in results]}
    if as_json:
        click.echo(json.dumps(data if verdict is None else {**data, "verdict": verdict}, indent=2))
    else:
        # Its own console: a parsed value such as ":warning:" or "[1]" is data, never an emoji or highlighted.
        console = Console(emoji=False, highlight=False)
        for table in render_tables(kind, data, console.width):
            console.print(table)
        empty = [key for key, value in data.items() if value == []]
        if empty:  # one line, not a boxed "(none)" table each
            click.echo("no " + ", no ".join(empty))
        if verdict is not None:  # one line a result, never folded: what on-call greps and pastes back
            click.echo("\n".join(verdict_lines(verdict)))
    if verdict is not None and any(r["verdict"] == Verdict.FAIL for r in verdict["results"]):
        raise SystemExit(ExitCode.FAILED)


def verdict_lines(verdict: dict) -> list[str]:
    """``busbw 40.5 GB/s at 16 GiB < 460 (8 GPUs): FAIL (NCCL_BUSBW)``, one line a result (the IU first when
    it is about one), each further problem indented below, then what the verdict assumed."""
    out = [f"verdict under {verdict['profile']}:"]
    for result in verdict["results"]:
        where = f"{result['iu'].rsplit('-', 1)[-1]}: " if result["iu"] else ""
        out.append(f"  {where}{result['reason']}: {result['verdict']} ({result['code']})")
        out += [f"      {problem}" for problem in result["evidence"].get("problems", [])[1:]]
    out.append(f"  assumed: {verdict['assumed']}")
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))


def render_tables(kind: str, data: dict, width: int | None = None) -> list[Table]:
    """Tables for any contract object: scalars as key/value, lists of records as rows (nested lists of
    records flattened under their parent's scalars), other non-empty lists as one column, and a dict of
    dicts (topo links) as a matrix. A table
    of rows wider than ``width`` columns is split into column groups that fit, each repeating the first
    column, so that no header or value is cut to "…"."""
    tables: list[Table] = []
    scalars = {key: value for key, value in data.items() if not isinstance(value, list | dict)}
    if scalars:
        summary = Table(title=kind, show_header=False)
        summary.add_column("key", style="bold")
        summary.add_column("value")
        for key, value in scalars.items():
            summary.add_row(Text(key), _cell(value))
        tables.append(summary)
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            tables += _records_tables(f"{kind} {key}", _flatten(value), width)
        elif isinstance(value, list) and value:  # empty lists: one "no ..." line after the tables
            table = Table(title=f"{kind} {key}")
            table.add_column(key)
            for item in value:
                table.add_row(_cell(item))
            tables.append(table)
        elif isinstance(value, dict) and value and all(isinstance(row, dict) for row in value.values()):
            tables += _matrix_tables(f"{kind} {key}", value, width)
    return tables


def _flatten(records: list[dict]) -> list[dict]:
    rows = []
    for record in records:
        scalars = {k: v for k, v in record.items() if not isinstance(v, list)}
        nested = [v for v in record.values() if isinstance(v, list) and v and isinstance(v[0], dict)]
        if not nested:
            rows.append(scalars)
            continue
        for child in nested[0]:
            rows.append({**scalars, **child})
    return rows


def _records_tables(title: str, records: list[dict], width: int | None) -> list[Table]:
    columns = list(dict.fromkeys(key for record in records for key in record))
    cells = [[_cell(record.get(column)) for record in records] for column in columns]
    return _split_tables(title, [Text(c) for c in columns], cells, width)


def _matrix_tables(title: str, matrix: dict[str, dict[str, Any]], width: int | None) -> list[Table]:
    columns = list(dict.fromkeys(col for row in matrix.values() for col in row))
    cells = [[Text(label) for label in matrix]] + [[_cell(row.get(column)) for row in matrix.values()]
                                                   for column in columns]
    return _split_tables(title, [Text(""), *(Text(c) for c in columns)], cells, width)


def _split_tables(title: str, headers: list[Text], columns: list[list[Text]], width: int | None) -> list[Table]:
    """One table of ``headers``/``columns`` (cells column by column), or, when wider than ``width``, several
    that fit: the first column in each, the others in order. A single column too wide for the terminal
    still gets a table of its own and wraps there (rich folds a long cell rather than cutting it)."""

    def natural(index: int) -> int:  # the column's width with its padding and its border on the right
        return max(cell.cell_len for cell in (headers[index], *columns[index])) + 3

    groups = [list(range(1, len(headers)))]
    if width and sum(natural(i) for i in range(len(headers))) + 1 > width:
        budget = width - 1 - natural(0)
        groups, used = [[]], 0
        for index in range(1, len(headers)):
            if groups[-1] and used + natural(index) > budget:
                groups.append([])
                used = 0
            groups[-1].append(index)
            used += natural(index)
    tables = []
    for number, group in enumerate(groups):
        first = 1 if number == 0 else group[0] + 1  # the key column is column 1, repeated in every group
        label = title if len(groups) == 1 else f"{title} (columns {first}-{group[-1] + 1} of {len(headers)})"
        table = Table(title=label)
        for index in (0, *group):
            table.add_column(headers[index], overflow="fold")
        for row in range(len(columns[0])):
            table.add_row(*(columns[index][row] for index in (0, *group)))
        tables.append(table)
    return tables


def _cell(value: Any) -> Text:
    """Plain Text, so that values are never read as rich markup ("[1,0]") or emoji codes (":AB:" in a bus id)."""
    if value is None:
        return Text("-")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    return Text(str(value))
