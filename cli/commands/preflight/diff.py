"""``clusterctl preflight diff RUN1 RUN2``: the verdicts that changed between two saved runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli import app
from cli.commands.preflight.history import STATE_DIR_HELP
from common.errors import ClusterctlError, ExitCode


@click.command(
    "diff",
    epilog="""\b
Examples:
  clusterctl preflight diff previous latest -i inventory/prod
  clusterctl preflight diff 20261201T0742 latest --json

The state dir is shared by every inventory run from the same directory: with -i, latest and previous
are that inventory's runs; without it, latest/previous of two different inventories are refused (two
run ids compare them anyway, with a note).

Exit codes: 0 no regression, 1 a result got worse (e.g. PASS -> FAIL, or a new result that is not
PASS), 2 a run cannot be found or read, or latest/previous are of different inventories. Only the
nodes and checks both runs covered are compared.""",
)
@click.argument("run1")
@click.argument("run2")
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("-i", "--inventory", default=None, type=click.Path(path_type=Path),
              help="Compare this inventory's runs: latest and previous are its own.")
@click.option("--json", "as_json", is_flag=True, help="Print the changes as JSON.")
def command(run1: str, run2: str, state_dir: Path | None, inventory: Path | None, as_json: bool) -> None:
    """Show the verdicts that changed from RUN1 to RUN2: regressions first, then fixes.

    RUN1 and RUN2 are run ids, unique prefixes, latest/previous, or JSON files written by --json.
    """
    from rich.table import Table
    from rich.text import Text

    from common.text import plural
    from preflight import history
    from preflight.report import verdict_text

    state_dir = state_dir or history.DEFAULT_STATE_DIR
    old, new = history.load(state_dir, run1, inventory), history.load(state_dir, run2, inventory)
    if pair := history.different_inventories(old, new):
        if {run1, run2} & {"latest", "previous"} and inventory is None:
            raise ClusterctlError(
                f"{state_dir}: {run1} ({old.id}) and {run2} ({new.id}) are runs of different inventories "
                f"({pair[0]} vs {pair[1]}): pass -i INVENTORY to compare one inventory's runs, or two run ids "
                "to compare them anyway", ExitCode.USAGE)
        click.echo(f"note: comparing runs of different inventories ({pair[0]} vs {pair[1]})", err=True)
    result = history.diff(old, new)
    changes = result.changes
    if as_json:
        click.echo(
            json.dumps(
                {
                    "from": old.id,
                    "to": new.id,
                    "compared": {"nodes": result.nodes, "checks": result.checks},
                    "only_in_from": result.only_old,
                    "only_in_to": result.only_new,
                    "regressions": len(result.regressions),
                    "changes": [
                        {
                            "rack": c.key[0],
                            "node": c.key[1],
                            "check": c.key[2],
                            "iu": c.key[3],
                            "change": c.kind,
                            "before": c.before.to_json() if c.before else None,
                            "after": c.after.to_json() if c.after else None,
                        }
                        for c in changes
                    ],
                },
                indent=2,
            )
        )
    else:
        console = app.current().console
        if not result.same_scope:
            left_out = [
                f"{label} {', '.join(names)}"
                for side, scope in (("only in " + old.id, result.only_old), ("only in " + new.id, result.only_new))
                for label, names in ((f"{side}: {key}", v) for key, v in scope.items())
                if names
            ]
            console.print(
                Text(
                    f"the runs cover different nodes/checks; comparing the {plural(len(result.nodes), 'common node')}"
                    f" and {plural(len(result.checks), 'common check')} ({'; '.join(left_out)})"
                ),
                soft_wrap=True,
            )
        if not changes:
            console.print(Text(f"no verdict changed from {old.id} to {new.id}"))
        else:
            counts = ", ".join(
                plural(n, kind, kind if kind in ("new", "gone", "changed", "fixed") else None)
                for kind in history.KIND_ORDER
                if (n := sum(1 for c in changes if c.kind == kind))
            )
            table = Table(title=f"{old.id} -> {new.id}: {counts}", header_style="bold")
            for column in ("change", "node", "check", "iu", "before", "after", "reason now"):
                table.add_column(column, overflow="fold", no_wrap=column != "reason now")
            for c in changes:
                table.add_row(
                    Text(c.kind, style="bold red" if c.kind == "regression" else ""),
                    Text(c.key[1]),
                    Text(c.key[2]),
                    Text((c.key[3] or "").removeprefix(f"{c.key[1]}-")),
                    verdict_text(c.before.verdict) if c.before else Text("-"),
                    verdict_text(c.after.verdict) if c.after else Text("-"),
                    Text(c.after.reason if c.after else "(no longer reported)"),
                )
            console.print(table)
    if result.regressions:
        raise SystemExit(ExitCode.FAILED)  # like `git diff --exit-code`: scripts can gate on "nothing got worse"
