"""``clusterctl preflight``: gate nodes before they take traffic.

The group only registers subcommands; each lives in its own module (``cli/preflight_<name>.py``) and is
added to ``SUBCOMMANDS`` below, so the run itself, ``history`` and ``diff`` plug in the same way as
``parse`` without this module importing their dependencies.
"""

from __future__ import annotations

import importlib

import click

from cli.help import SuggestingGroup
from cli.preflight_run import attach

# subcommand name -> module exposing a click command named ``command``
SUBCOMMANDS: dict[str, str] = {
    "parse": "cli.preflight_parse",
}


class _LazySubcommands(SuggestingGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(SUBCOMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in SUBCOMMANDS:
            return None
        return importlib.import_module(SUBCOMMANDS[cmd_name]).command


@click.group("preflight", cls=_LazySubcommands)
def command() -> None:
    """Gate nodes on topology, GPU health, IB, NCCL, C-states, DCQCN, NUMA pinning and time sync."""


# Without a subcommand the group runs the preflight itself; adds `history` and `diff` (cli/preflight_run.py).
attach(command)
