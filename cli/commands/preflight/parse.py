"""``clusterctl preflight parse KIND FILE [--json]``: read one saved tool output the way preflight does.

On-call pastes an output from a ticket into a file (or stdin with ``-``) and sees what preflight would
see: a table, or with ``--json`` exactly the object of ``docs/contracts/parse-json.md``. Unreadable
input exits 1 with one line naming the line of the file that could not be read.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.errors import ClusterctlError, ExitCode
from cli.help import examples
from preflight.parsers import PARSERS, ParseError, parse, paste_warnings, to_contract_json


@click.command("parse", epilog=examples("clusterctl preflight parse nccl all_reduce_perf.txt", "nvidia-smi topo -m | clusterctl preflight parse topo - --json", note="KIND is one of: " + ", ".join(sorted(PARSERS)) + "."))
@click.argument("kind", type=click.Choice(sorted(PARSERS)), metavar="KIND")
@click.argument("file", type=click.File("rb"))
@click.option("--json", "as_json", is_flag=True, help="Print the contract JSON instead of a table.")
def command(kind: str, file: Any, as_json: bool) -> None:
    """Parse FILE (or - for stdin) as output of KIND and print it."""
    # Bytes, decoded leniently: a paste with a stray Latin-1 byte or binary garbage must reach the
    # parser (and its one-line ParseError), not stop in a UnicodeDecodeError.
    text = file.read().decode("utf-8", errors="replace")
    try:
        result = parse(kind, text)
    except ParseError as exc:
        name = "<stdin>" if file.name == "<stdin>" else file.name
        raise ClusterctlError(f"{name}: cannot parse as {kind}: {_one_line(str(exc))}", ExitCode.FAILED) from exc
    data = to_contract_json(kind, result, paste_warnings(text))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    # Its own console: a parsed value such as ":warning:" or "[1]" is data, never an emoji or highlighted.
    console = Console(emoji=False, highlight=False)
    for table in render_tables(kind, data):
        console.print(table)


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))


def render_tables(kind: str, data: dict) -> list[Table]:
    """Tables for any contract object: scalars as key/value, lists of records as rows (nested lists of
    records flattened under their parent's scalars), and a dict of dicts (topo links) as a matrix."""
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
            tables.append(_records_table(f"{kind} {key}", _flatten(value)))
        elif isinstance(value, list):
            table = Table(title=f"{kind} {key}")
            table.add_column(key)
            for item in value or ["(none)"]:
                table.add_row(_cell(item))
            tables.append(table)
        elif isinstance(value, dict) and value and all(isinstance(row, dict) for row in value.values()):
            tables.append(_matrix_table(f"{kind} {key}", value))
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


def _records_table(title: str, records: list[dict]) -> Table:
    table = Table(title=title)
    columns = list(dict.fromkeys(key for record in records for key in record))
    for column in columns:
        table.add_column(column)
    for record in records:
        table.add_row(*(_cell(record.get(column)) for column in columns))
    return table


def _matrix_table(title: str, matrix: dict[str, dict[str, Any]]) -> Table:
    table = Table(title=title)
    columns = list(dict.fromkeys(col for row in matrix.values() for col in row))
    table.add_column("")
    for column in columns:
        table.add_column(column)
    for label, row in matrix.items():
        table.add_row(Text(label), *(_cell(row.get(column)) for column in columns))
    return table


def _cell(value: Any) -> Text:
    """Plain Text, so that values are never read as rich markup ("[1,0]") or emoji codes (":AB:" in a bus id)."""
    if value is None:
        return Text("-")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    return Text(str(value))
