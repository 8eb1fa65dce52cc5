"""``clusterctl preflight -i INV [...]`` (the run itself), ``preflight history`` and ``preflight diff``.

:func:`attach` turns the ``preflight`` group into one that runs the preflight when no subcommand is
given, so ``clusterctl preflight -i inventory/prod --limit rack_r12`` and ``clusterctl preflight parse``
live side by side. The CLI is glue: the work is in :mod:`preflight.runner` and friends.

Exit codes: 0 every check passed (WARN allowed unless ``--strict``), 1 a check failed, 2 usage,
inventory or profile error (nothing contacted), 3 a host was unreachable or a check could not run, and
nothing failed.
"""

from __future__ import annotations

from pathlib import Path

import click

from cli.options import vault_password_file_option

STATE_DIR_HELP = "Where runs are saved (default .state/preflight)."


def _csv(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


RUN_OPTIONS = [
    click.Option(
        ["-i", "--inventory"],
        default=None,
        type=click.Path(path_type=str),
        help="Ansible inventory (file or directory). Required to run the preflight.",
    ),
    click.Option(["-l", "--limit"], default=None, help="Ansible host pattern, e.g. rack_r12."),
    click.Option(["--checks"], default=None, help="Only these checks (comma separated)."),
    click.Option(["--skip"], default=None, help="Skip these checks (comma separated)."),
    click.Option(
        ["--parallel"],
        default=32,
        show_default=True,
        type=click.IntRange(1, 1024),
        help="Nodes checked at the same time.",
    ),
    click.Option(
        ["--timeout"],
        default=120.0,
        show_default=True,
        type=click.FloatRange(0.1),
        help="Seconds any one command may take.",
    ),
    click.Option(
        ["--ib-matrix"],
        default="ring",
        show_default=True,
        type=click.Choice(["ring", "full"]),
        help="ib_pairs: ring within each rack, or every ordered pair.",
    ),
    click.Option(
        ["--depth"],
        default=None,
        type=click.Choice(["quick", "standard", "full"]),
        help="quick: the on-call gate (minutes, DCGM level 1); standard; full: rack onboarding (DCGM level 3, "
        "long bandwidth runs). Default: each profile's depth.default; durations in the profile.",
    ),
    click.Option(
        ["--dcgm-level"],
        default=None,
        type=click.IntRange(1, 4),
        help="dcgm_diag: run dcgmi diag -r LEVEL instead of the depth's level.",
    ),
    click.Option(
        ["--json", "json_file"],
        default=None,
        type=click.Path(dir_okay=False, path_type=str),
        help="Write results and summary as JSON.",
    ),
    click.Option(
        ["--junit", "junit_file"],
        default=None,
        type=click.Path(dir_okay=False, path_type=str),
        help="Write results as JUnit XML.",
    ),
    click.Option(["--strict"], is_flag=True, help="Treat WARN as failure (exit 1)."),
    click.Option(
        ["--release"],
        is_flag=True,
        help="Take IUs out of Consul maintenance on nodes where every check passed.",
    ),
    click.Option(
        ["--state-dir"], default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
    ),
]


def run_preflight_command(
    inventory: str | None,
    limit: str | None,
    checks: str | None,
    skip: str | None,
    parallel: int,
    timeout: float,
    ib_matrix: str,
    json_file: str | None,
    junit_file: str | None,
    strict: bool,
    release: bool,
    state_dir: Path | None,
    vault_password_file: Path | None = None,
    depth: str | None = None,
    dcgm_level: int | None = None,
) -> int:
    from rich.console import Console

    from cli.errors import UsageError
    from cluster import load_cluster, vault
    from preflight import checks as registry
    from preflight import history, report
    from preflight.checks.base import RunOptions
    from preflight.profiles import profile_for
    from preflight.runner import run_preflight
    from preflight.transport import RoutingTransport

    if not inventory:
        raise UsageError("missing -i/--inventory (or a subcommand: clusterctl preflight --help)")
    try:
        selected = registry.select(_csv(checks), _csv(skip))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not selected:
        raise UsageError("--checks/--skip leave no check to run")
    for option, path in (("--json", json_file), ("--junit", junit_file)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{option} {path}: directory {Path(path).resolve().parent} does not exist")
    # Whatever is wrong with the inventory or the profiles is reported before any host is contacted.
    cluster = load_cluster(inventory, limit, vault.secrets_for(vault_password_file))
    nodes = list(cluster.nodes())
    if not nodes:
        raise UsageError(f"{inventory}: no hosts match --limit {limit!r}")
    profiles = {node.name: profile_for(node.name, node.vars) for node in nodes}

    # Without --depth every node runs its profile's default; when they agree the report names it.
    defaults = {p["depth"]["default"] for p in profiles.values()}
    depth = depth or (defaults.pop() if len(defaults) == 1 else None)
    options = RunOptions(
        timeout=timeout, probe_timeout=min(timeout, 15.0), ib_matrix=ib_matrix, depth=depth, dcgm_level=dcgm_level
    )
    console = Console()
    transport = RoutingTransport()
    try:
        with report.LiveProgress(Console(stderr=True)) as progress:
            outcome = run_preflight(
                cluster,
                selected,
                profiles,
                transport,
                options,
                parallel,
                progress,
                release=release,
                strict=strict,
            )
    finally:
        transport.close()
    report.print_report(console, outcome, strict)
    document = report.to_json(outcome, strict)
    if json_file:
        report.write_json(json_file, outcome, strict)
    if junit_file:
        report.write_junit(junit_file, outcome)
    try:
        saved = history.save(
            state_dir or history.DEFAULT_STATE_DIR,
            document,
            {"inventory": str(inventory), "limit": limit, "checks": [c.name for c in selected]},
            outcome.started,
        )
        console.print(f"saved as run {saved.id} ({saved.path})", style="dim")
    except OSError as exc:  # the verdicts above stand; only the history entry is missing
        click.echo(f"warning: run not saved to history: {exc}", err=True)
    return document["summary"]["exit_code"]


@click.command("history")
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def history_command(state_dir: Path | None, as_json: bool) -> None:
    """List saved preflight runs, oldest first."""
    import json

    from rich.console import Console
    from rich.table import Table

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
    table = Table(title=f"preflight runs in {state_dir}", header_style="bold")
    for column in ("run", "inventory", "limit", "nodes", "verdicts", "exit", "seconds"):
        table.add_column(column, no_wrap=column in ("run", "nodes", "exit", "seconds"))
    for row in rows:
        table.add_row(
            row["id"],
            str(row["inventory"]),
            str(row["limit"] or "-"),
            str(row["nodes"]),
            " ".join(f"{k} {v}" for k, v in row["verdicts"].items()),
            str(row["exit_code"]),
            str(row["duration_s"]),
        )
    Console().print(table)


@click.command("diff")
@click.argument("run1")
@click.argument("run2")
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print the changes as JSON.")
def diff_command(run1: str, run2: str, state_dir: Path | None, as_json: bool) -> None:
    """Show what changed from RUN1 to RUN2 (run ids, unique prefixes, latest/previous, or JSON files)."""
    import json

    from rich.console import Console
    from rich.table import Table

    from preflight import history
    from preflight.report import verdict_text

    state_dir = state_dir or history.DEFAULT_STATE_DIR
    old, new = history.load(state_dir, run1), history.load(state_dir, run2)
    changes = history.diff(old, new)
    if as_json:
        click.echo(
            json.dumps(
                [
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
                indent=2,
            )
        )
        return
    if not changes:
        click.echo(f"no changes from {old.id} to {new.id}")
        return
    table = Table(title=f"{old.id} -> {new.id}: {len(changes)} changes", header_style="bold")
    for column in ("rack", "node", "check", "iu", "before", "after", "reason now"):
        table.add_column(column, overflow="fold", no_wrap=column != "reason now")
    for c in changes:
        table.add_row(
            c.key[0],
            c.key[1],
            c.key[2],
            (c.key[3] or "").removeprefix(f"{c.key[1]}-"),
            verdict_text(c.before.verdict) if c.before else "-",
            verdict_text(c.after.verdict) if c.after else "-",
            (c.after or c.before).reason,
        )
    Console().print(table)


def attach(group: click.Group) -> click.Group:
    """Make ``group`` run the preflight when invoked without a subcommand; add ``history`` and ``diff``."""
    if getattr(group, "_preflight_run_attached", False):
        return group
    group._preflight_run_attached = True
    group.invoke_without_command = True
    group.no_args_is_help = False
    group.params.extend(RUN_OPTIONS)
    vault_password_file_option(group)  # click adds an option decorator's option to a command's params
    group.help = (group.help or "") + (
        "\n\nWithout a subcommand, runs the checks: clusterctl preflight -i INVENTORY [--limit PATTERN]."
        "\n\nExit codes: 0 all passed (WARN allowed unless --strict), 1 a check failed, 2 usage/inventory/"
        "profile error, 3 a host unreachable or a check could not run (and none failed)."
    )
    inner = group.callback

    @click.pass_context
    def callback(ctx: click.Context, **options) -> None:
        if ctx.invoked_subcommand is not None:
            if inner is not None:
                ctx.invoke(inner)
            return
        code = run_preflight_command(**options)
        if code:
            raise SystemExit(
                code
            )  # cli.main runs click with standalone_mode=False, which drops ctx.exit codes

    group.callback = callback
    group.add_command(history_command)
    group.add_command(diff_command)
    return group
