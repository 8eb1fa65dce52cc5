"""``clusterctl preflight history``: the saved preflight runs, oldest first."""

from __future__ import annotations

from pathlib import Path

import click

from cli import app
from cli.help import examples

STATE_DIR_HELP = "Where runs are saved (default .state/preflight)."


@click.command("history", epilog=examples("clusterctl preflight history", "clusterctl preflight history --json --state-dir .state/preflight"))
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def command(state_dir: Path | None, as_json: bool) -> None:
    """List saved preflight runs, oldest first."""
    import json

    from rich.table import Table
    from rich.text import Text

    from preflight import history

    state_dir = state_dir or history.DEFAULT_STATE_DIR
    saved = history.runs(state_dir)
    rows = [
        {
            "id": r.id,
            "inventory": r.data.get("run", {}).get("inventory"),
            "limit": r.data.get("run", {}).get("limit"),
            "nodes": r.summary.get("nodes"),
            "verdicts": {k: v for k, v in (r.summary.get("verdicts") or {}).items() if v},
            "exit_code": r.summary.get("exit_code"),
            "duration_s": r.summary.get("duration_s"),
        }
        for r in saved
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no runs saved under {state_dir}")
        return
    table = Table(title=Text(f"preflight runs in {state_dir}"), header_style="bold")
    for column in ("run", "inventory", "limit", "nodes", "verdicts", "exit", "seconds"):
        table.add_column(column, no_wrap=column in ("run", "nodes", "exit", "seconds"))
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in (  # saved files are data, never markup
            row["id"],
            row["inventory"],
            row["limit"] or "-",
            row["nodes"],
            " ".join(f"{k} {v}" for k, v in row["verdicts"].items()),
            row["exit_code"],
            row["duration_s"],
        )))
    app.current().console.print(table)
