"""``clusterctl preflight -i INV [...]``: the run itself, when the ``preflight`` group gets no subcommand.

The group (:mod:`cli.commands.preflight`) takes :data:`RUN_OPTIONS` as its own options, so
``clusterctl preflight -i inventory/prod --limit rack_r12`` and ``clusterctl preflight parse`` live side
by side. The CLI is glue: the work is in :mod:`preflight.runner` and friends.

Exit codes: 0 every check passed (WARN allowed unless ``--strict``), 1 a check failed, 2 usage,
inventory or profile error (nothing contacted), 3 a host was unreachable or a check could not run, and
nothing failed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from cli import app
from cli.commands.preflight.history import STATE_DIR_HELP


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
        is_flag=False,
        flag_value="-",  # --json alone: stdout, as every other command's --json
        type=click.Path(dir_okay=False, path_type=str),
        help="Write results and summary as JSON to FILE (- or no FILE: stdout; the table then goes to stderr).",
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
    from cluster import load_cluster
    from cluster.ansible import vault
    from common.errors import UsageError
    from common.text import suggest
    from preflight import checks as registry
    from preflight import history, report
    from preflight.checks.base import RunOptions
    from preflight.profiles import profile_of, run_depth
    from preflight.progress import LiveProgress, PlainProgress
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
    profiles = {node.name: profile_of(node) for node in nodes}

    depth = run_depth(profiles, depth)  # without --depth: the profiles' default when they agree
    options = RunOptions(
        timeout=timeout, probe_timeout=min(timeout, 15.0), ib_matrix=ib_matrix, depth=depth, dcgm_level=dcgm_level
    )
    # With a document on stdout (--json - / --junit -) the people's report goes to stderr.
    console = app.current().report_console(document_on_stdout="-" in (json_file, junit_file))
    transport = RoutingTransport()
    try:
        err = app.current().err_console
        # a live line draws nothing where stderr is not a terminal (CI, `2> log`): lines there instead
        shown_as = LiveProgress if err.is_terminal else PlainProgress
        with shown_as(err, [node.name for node in nodes]) as progress:
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
            {"inventory": str(inventory), "inventory_path": str(Path(inventory).resolve()), "limit": limit,
             "checks": [c.name for c in selected]},
            outcome.started,
        )
        # the comparison command as it must be typed: the same state dir, where it is not the default
        where = f" --state-dir {shlex.quote(str(state_dir))}" if state_dir and state_dir != history.DEFAULT_STATE_DIR else ""
        saved_as = f"run {saved.id} ({saved.path}; clusterctl preflight diff previous {saved.id} -i {shlex.quote(str(inventory))}{where})"
    except OSError as exc:  # the verdicts stand; only the history entry is missing
        click.echo(f"warning: run not saved to history: {exc}", err=True)
    report.print_report(console, outcome, strict, show_pass=show_pass, saved=saved_as)
    return document["summary"]["exit_code"]
