"""The one lazy group mechanism: a group's subcommands are imported only when they run.

``clusterctl --help`` and ``clusterctl preflight --help`` therefore import no command's dependencies
(ansible, consul, rich live views), and one command's heavy imports never slow down another. Each
subcommand is a module exposing a click command named ``command``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import NamedTuple

import click

from cli.help import SuggestingGroup


class Lazy(NamedTuple):
    module: str  # imported when the subcommand runs (or its help is shown)
    # the line in the group's command list; None: the command's own short help (which imports it)
    help: str | None = None


class LazyGroup(SuggestingGroup):
    """A group whose subcommands are ``lazy`` (name -> :class:`Lazy`) plus any added with ``add_command``."""

    def __init__(self, *args, lazy: Mapping[str, Lazy] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Lazy] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.lazy) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in self.lazy:
            return None
        return importlib.import_module(self.lazy[cmd_name].module).command

    def summary_of(self, ctx: click.Context, name: str) -> str | None:
        entry = self.lazy.get(name)
        if entry is not None and entry.help is not None:
            return entry.help  # no import for the list
        return super().summary_of(ctx, name)
