"""``clusterctl preflight history``: the saved preflight runs, oldest first."""

from __future__ import annotations

from pathlib import Path

import click

from cli import app
from cli.help import examples

STATE_DIR_HELP = "Where runs are saved (default .state/preflight, relative to the current directory)."


@click.command("history", epilog=examples("clusterctl preflight history", "clusterctl preflight history --json --state-dir .state/preflight"))
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("-i", "--inventory", default=None, type=click.Path(path_type=Path), help="Only this inventory's runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def command(state_dir: Path | None, inventory: Path | None, as_json: bool) -> None:
    """List saved preflight runs, oldest first, with the checks each covered."""
    import json

    from rich.table import Table
    from rich.text import Text

    from preflight import history
    from preflight.checks import BY_NAME

    state_dir = state_dir or history.DEFAULT_STATE_DIR
    saved = history.runs(state_dir, inventory)
    rows = [
        {
            "id": r.id,
            "inventory": r.data.get("run", {}).get("inventory"),
            "limit": r.data.get("run", {}).get("limit"),
            "checks": history.checks_covered(r, tuple(BY_NAME)),
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
    # .state/preflight is relative to where clusterctl runs: say which directory that is
    where = state_dir if state_dir.is_absolute() else f"{state_dir} (in {Path.cwd()})"
    if not rows:
        of = f" for {inventory}" if inventory is not None else ""
        click.echo(f"no runs saved{of} under {where}")
        return
    table = Table(title=Text(f"preflight runs in {where}"), header_style="bold")
    for column in ("run", "inventory", "limit", "checks", "nodes", "verdicts", "exit", "seconds"):
        table.add_column(column, no_wrap=column in ("run", "nodes", "exit", "seconds"),
                         overflow="fold")  # an inventory path is folded, never cut
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in (  # saved files are data, never markup
            row["id"],
            row["inventory"],
            row["limit"] or "-",
            row["checks"],
            row["nodes"],
            " ".join(f"{k} {v}" for k, v in row["verdicts"].items()),
            row["exit_code"],
            row["duration_s"],
        )))
    app.current().console.print(table)
