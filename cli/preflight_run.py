"""``clusterctl preflight -i INV [...]`` (the run itself), ``preflight history`` and ``preflight diff``.

:func:`attach` turns the ``preflight`` group into one that runs the preflight when no subcommand is
given, so ``clusterctl preflight -i inventory/prod --limit rack_r12`` and ``clusterctl preflight parse``
live side by side. The CLI is glue: the work is in :mod:`preflight.runner` and friends.

Exit codes: 0 every check passed (WARN allowed unless ``--strict``), 1 a check failed, 2 usage,
inventory or profile error (nothing contacted), 3 a host was unreachable or a check could not run, and
nothing failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.help import examples
from cli.options import vault_password_file_option

STATE_DIR_HELP = "Where runs are saved (default .state/preflight)."


def _csv(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _check_names() -> list[str]:
    from preflight import checks as registry

    return [c.name for c in registry.CHECKS]


def _complete_checks(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of the last name in a comma-separated list (``gpu_health,ib<TAB>``)."""
    done, _, last = incomplete.rpartition(",")
    prefix = f"{done}," if done else ""
    return [prefix + name for name in _check_names() if name.startswith(last)]


RUN_OPTIONS = [
    click.Option(
        ["-i", "--inventory"],
        default=None,
        type=click.Path(path_type=str),
        help="Ansible inventory (file or directory). Required to run the preflight.",
    ),
    click.Option(["-l", "--limit"], default=None, help="Ansible host pattern, e.g. rack_r12."),
    click.Option(["--checks"], default=None, metavar="NAMES", shell_complete=_complete_checks,
                 help=f"Only these checks (comma separated): {', '.join(_check_names())}."),
    click.Option(["--skip"], default=None, metavar="NAMES", shell_complete=_complete_checks,
                 help="Skip these checks (comma separated; names as for --checks)."),
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
        help="Write results and summary as JSON to FILE (- for stdout; the table then goes to stderr).",
    ),
    click.Option(
        ["--junit", "junit_file"],
        default=None,
        type=click.Path(dir_okay=False, path_type=str),
        help="Write results as JUnit XML to FILE (- for stdout; the table then goes to stderr).",
    ),
    click.Option(
        ["--show-pass", "-v", "show_pass"],
        is_flag=True,
        help="List PASS and SKIP rows too (by default they are collapsed into one line).",
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
    show_pass: bool = False,
) -> int:
    from rich.console import Console

    from cli.errors import UsageError
    from cluster import load_cluster, vault
    from cluster.text import suggest
    from preflight import checks as registry
    from preflight import history, report
    from preflight.checks.base import RunOptions
    from preflight.profiles import profile_for
    from preflight.runner import run_preflight
    from preflight.transport import RoutingTransport

    if not inventory:
        raise UsageError("missing -i/--inventory (or a subcommand: clusterctl preflight --help)")
    known = [c.name for c in registry.CHECKS]
    for option, names in (("--checks", _csv(checks)), ("--skip", _csv(skip))):
        for name in names or []:
            if name not in known:
                raise UsageError(f"{option}: unknown check {name!r}{suggest(name, known)} "
                                 f"(known: {', '.join(known)})")
    selected = registry.select(_csv(checks), _csv(skip))
    if not selected:
        raise UsageError("--checks/--skip leave no check to run")
    if json_file == "-" and junit_file == "-":
        raise UsageError("--json - and --junit - cannot both go to stdout; give one a FILE")
    for option, path in (("--json", json_file), ("--junit", junit_file)):
        if path and path != "-" and not Path(path).resolve().parent.is_dir():
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
    # With a document on stdout (--json - / --junit -) the people's report goes to stderr.
    console = Console(stderr="-" in (json_file, junit_file))
    transport = RoutingTransport()
    try:
        with report.LiveProgress(Console(stderr=True), [node.name for node in nodes]) as progress:
            outcome = run_preflight(
                cluster,
                selected,
                profiles,
                transport,
                options,
                parallel,
                progress,
            )
            if release:
                from preflight.release import release_passed

                progress.phase("--release: IUs of the nodes that passed leave maintenance")
                release_passed(nodes, outcome, strict)
    finally:
        transport.close()
    # The result files first: whatever goes wrong while drawing the table, the verdicts are on disk.
    document = report.to_json(outcome, strict)
    if json_file == "-":
        click.echo(json.dumps(document, indent=2, default=str))
    elif json_file:
        report.write_json(json_file, outcome, strict)
    if junit_file == "-":
        click.echo(report.junit_text(outcome))
    elif junit_file:
        report.write_junit(junit_file, outcome)
    saved_as = None
    try:
        saved = history.save(
            state_dir or history.DEFAULT_STATE_DIR,
            document,
            {"inventory": str(inventory), "limit": limit, "checks": [c.name for c in selected]},
            outcome.started,
        )
        saved_as = f"run {saved.id} ({saved.path}; clusterctl preflight diff previous {saved.id})"
    except OSError as exc:  # the verdicts stand; only the history entry is missing
        click.echo(f"warning: run not saved to history: {exc}", err=True)
    report.print_report(console, outcome, strict, show_pass=show_pass, saved=saved_as)
    return document["summary"]["exit_code"]


@click.command("history", epilog=examples("clusterctl preflight history", "clusterctl preflight history --json --state-dir .state/preflight"))
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def history_command(state_dir: Path | None, as_json: bool) -> None:
    """List saved preflight runs, oldest first."""
    import json

    from rich.console import Console
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
    Console().print(table)


@click.command(
    "diff",
    epilog="""\b
Examples:
  clusterctl preflight diff previous latest
  clusterctl preflight diff 20261201T0742 latest --json

Exit codes: 0 no regression, 1 a result got worse (e.g. PASS -> FAIL, or a new result that is not
PASS), 2 a run cannot be found or read. Only the nodes and checks both runs covered are compared.""",
)
@click.argument("run1")
@click.argument("run2")
@click.option(
    "--state-dir", default=None, type=click.Path(file_okay=False, path_type=Path), help=STATE_DIR_HELP
)
@click.option("--json", "as_json", is_flag=True, help="Print the changes as JSON.")
def diff_command(run1: str, run2: str, state_dir: Path | None, as_json: bool) -> None:
    """Show the verdicts that changed from RUN1 to RUN2: regressions first, then fixes.

    RUN1 and RUN2 are run ids, unique prefixes, latest/previous, or JSON files written by --json.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from cluster.text import plural
    from preflight import history
    from preflight.report import verdict_text

    state_dir = state_dir or history.DEFAULT_STATE_DIR
    old, new = history.load(state_dir, run1), history.load(state_dir, run2)
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
        console = Console()
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
        raise SystemExit(1)  # like `git diff --exit-code`: scripts can gate on "nothing got worse"


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
    group.epilog = examples(
        "clusterctl preflight -i inventory/prod --limit rack_r12",
        "clusterctl preflight -i inventory/prod --checks gpu_topology,gpu_health --show-pass",
        "clusterctl preflight -i inventory/prod --json - | jq .summary",
        "clusterctl preflight -i inventory/prod --junit pf.xml --release",
        "clusterctl preflight diff previous latest",
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
