"""``clusterctl preflight``: gate nodes before they take traffic.

Without a subcommand the group runs the checks (:mod:`.run`, whose options are the group's own);
``parse``, ``history`` and ``diff`` are one module each here, imported only when they run.
"""

from __future__ import annotations

import click

from cli.commands.preflight.run import RUN_OPTIONS, run_preflight_command
from cli.help import examples
from cli.lazy import Lazy, LazyGroup
from cli.options import vault_password_file_option

SUBCOMMANDS: dict[str, Lazy] = {
    "parse": Lazy("cli.commands.preflight.parse"),
    "history": Lazy("cli.commands.preflight.history"),
    "diff": Lazy("cli.commands.preflight.diff"),
}


@click.group(
    "preflight", cls=LazyGroup, lazy=SUBCOMMANDS, params=list(RUN_OPTIONS), invoke_without_command=True,
    no_args_is_help=False,
    epilog=examples(
        "clusterctl preflight -i inventory/prod --limit rack_r12",
        "clusterctl preflight -i inventory/prod --checks gpu_topology,gpu_health --show-pass",
        "clusterctl preflight -i inventory/prod --json - | jq .summary",
        "clusterctl preflight -i inventory/prod --junit pf.xml --release",
        "clusterctl preflight diff previous latest -i inventory/prod",
    ),
)
@vault_password_file_option
@click.pass_context
def command(ctx: click.Context, **options) -> None:
    """Gate nodes on topology, GPU health, IB, NCCL, C-states, DCQCN, NUMA pinning and time sync.

    Without a subcommand, runs the checks: clusterctl preflight -i INVENTORY [--limit PATTERN].

    Exit codes: 0 all passed (WARN allowed unless --strict), 1 a check failed, 2 usage/inventory/profile
    error, 3 a host unreachable or a check could not run (and none failed).
    """
    if ctx.invoked_subcommand is not None:
        return
    code = run_preflight_command(**options)
    if code:
        raise SystemExit(code)  # cli.main runs click with standalone_mode=False, which drops ctx.exit codes
